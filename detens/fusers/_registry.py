from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from detens.registry import Registry

FUSERS: Registry = Registry("fusion method")


def check_weights(weights: Sequence[float] | Tensor | None, num_models: int, device: torch.device) -> Tensor:
    """Per-model weights as a fresh float32 Tensor[N] (ones when None); wrong length or sign is an error.

    The caller's list or tensor is never modified.
    """
    if weights is None:
        return torch.ones(num_models, device=device)
    tensor = torch.as_tensor(weights, dtype=torch.float32).detach().clone().to(device)
    if tensor.ndim != 1 or tensor.numel() != num_models:
        raise ValueError(f"weights must hold one number per model ({num_models}), got {list(tensor.shape)}: {weights!r}")
    if not torch.isfinite(tensor).all() or (tensor < 0).any() or tensor.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero, got {weights!r}")
    return tensor
