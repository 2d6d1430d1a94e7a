from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from detens.checks import check_real, torch_ready_array
from detens.registry import Registry

FUSERS: Registry = Registry("fusion method")


def check_weights(
    weights: Sequence[float] | Tensor | np.ndarray | None,
    num_models: int,
    device: torch.device,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """Per-model weights as a fresh Tensor[N] of ``dtype``, divided by the largest (ones when None);
    anything else is an error.

    Weights are a list, tuple, array (either byte order) or 1-D tensor of one finite number >= 0 per model,
    not all 0.
    Only their ratios matter, so any finite weights are fine, however large (``[1e308, 1e308]`` is
    ``[1, 1]``); scaling the largest to 1 keeps the ratios in the fusers' float32 sums, where weights
    beyond about 3e38 would overflow and weights below about 1e-38 lose precision or underflow to 0.
    The caller's list or tensor is never modified.

    Raises:
        TypeError: not a sequence of numbers (a string, a dict, None or bool entries, ...).
        ValueError: another length, a negative, NaN or inf entry, or all 0.
    """
    if weights is None:
        return torch.ones(num_models, dtype=dtype, device=device)
    if isinstance(weights, (Tensor, np.ndarray)):
        native = torch_ready_array(weights) if isinstance(weights, np.ndarray) else weights
        try:
            values = torch.as_tensor(native).detach()
        except TypeError:
            values = None  # an object array
        if values is None or values.dtype == torch.bool or values.is_complex():
            raise TypeError(f"weights must hold real numbers, got a {type(weights).__name__} of {weights.dtype}")
        if values.ndim != 1:
            raise ValueError(f"weights must hold one number per model ({num_models}), got shape {list(values.shape)}")
        checked = values.to("cpu", torch.float64).tolist()
    elif isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise TypeError(
            f"weights must be a list with one number per model ({num_models}), got {type(weights).__name__}: {weights!r}"
        )
    else:
        checked = list(weights)
    if len(checked) != num_models:
        raise ValueError(f"weights must hold one number per model ({num_models}), got {len(checked)}: {weights!r}")
    # one number per model: a few scalar checks, not per box
    checked = [check_real(w, f"weights[{i}]", 0.0) for i, w in enumerate(checked)]
    largest = max(checked)
    if largest == 0:
        raise ValueError(f"weights must not all be 0, got {weights!r}")
    # divided before anything adds them up: finite weights near the float64 limit have a finite ratio
    relative = torch.tensor(checked, dtype=torch.float64) / largest
    return relative.to(device=device, dtype=dtype)
