"""Orders of boxes and clusters that do not depend on the order in which the models were passed."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["lexicographic_order"]


def lexicographic_order(keys: Sequence[Tensor]) -> Tensor:
    """Tensor[K]: the indices that sort K rows by ``keys[0]``, ties by ``keys[1]``, and so on.

    Args:
        keys (list[Tensor[K]]): the sort keys, most significant first, on one device.
    """
    order = torch.arange(keys[0].numel(), device=keys[0].device)
    for key in reversed(keys):  # stable sorts from the least significant key
        order = order[torch.argsort(key[order], stable=True)]
    return order
