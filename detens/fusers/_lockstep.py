"""Infrastructure for the sequential fusers (WBF, soft-NMS): independent groups processed in lockstep.

Dimension legend: K boxes, G groups, T boxes in the largest group.

WBF and soft-NMS visit the boxes of one class one at a time, and each visit depends on the previous
ones. But a box can only interact with boxes (or fused boxes) it overlaps. So the boxes of each class
are split into spatially separated groups (:func:`disjoint_groups`), and the groups advance in
lockstep (:func:`lockstep_layout`): step t handles the t-th box of EVERY group at once, with padded
per-group state tensors. The number of Python iterations is the size of the largest group (the boxes
piled on one object), not the number of boxes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["disjoint_groups", "lockstep_layout", "LockstepLayout"]

_MAX_SPLIT_ROUNDS = 8


def _split_axis(lo: Tensor, hi: Tensor, group: Tensor, margin: float) -> tuple[Tensor, int]:
    """Split each group along one axis where the intervals ``[lo, hi]`` leave a gap wider than ``margin``.

    Args:
        lo, hi (Tensor[K]): interval ends in [0, 1] (float64).
        group (Tensor[K] int64): current group ids.

    Returns:
        new group ids (Tensor[K] int64, consecutive from 0), number of groups.
    """
    offset = group.to(lo.dtype) * 4.0  # keeps the groups apart in one sort and one running max
    order = torch.argsort(offset + lo)
    g, start, end = group[order], (offset + lo)[order], (offset + hi)[order]
    reach = torch.cummax(end, 0).values  # [K] running max of interval ends
    cut = torch.ones_like(g, dtype=torch.bool)
    cut[1:] = (g[1:] != g[:-1]) | (start[1:] > reach[:-1] + margin)
    sorted_ids = torch.cumsum(cut, 0) - 1
    new = torch.empty_like(sorted_ids)
    new[order] = sorted_ids
    return new, int(sorted_ids[-1]) + 1


def disjoint_groups(boxes: Tensor, labels: Tensor, margin: float) -> Tensor:
    """Partition boxes into groups that cannot interact: one label each, spatially separated.

    Groups come from alternating x and y sweeps (a guillotine partition): two groups of the same label
    are separated by a gap wider than ``margin`` along x or y, so the bounding hull of one group (and
    anything inside it, such as a weighted average of its boxes, up to ``margin``) has zero
    intersection with every box of the other. Merging more than necessary is always safe; the split is
    exact, not a heuristic.

    Args:
        boxes (Tensor[K, 4]): normalized xyxy boxes in [0, 1] (float64), K > 0.
        labels (Tensor[K]): class ids.
        margin (float): the smallest gap that separates two groups.

    Returns:
        Tensor[K] int64: group ids in ``[0, G)``.
    """
    group = torch.unique(labels, return_inverse=True)[1]
    num_groups = int(group.max()) + 1
    unchanged = 0
    for round_ in range(_MAX_SPLIT_ROUNDS):
        axis = round_ % 2
        group, new_num = _split_axis(boxes[:, axis], boxes[:, axis + 2], group, margin)
        unchanged = unchanged + 1 if new_num == num_groups else 0
        num_groups = new_num
        if unchanged == 2 or num_groups == boxes.shape[0]:
            break
    return group


@dataclass
class LockstepLayout:
    """Where each box sits in the lockstep: group (row) and step (col).

    Groups are ordered by size, largest first, so at step t the groups that still have a box form the
    prefix ``[:active[t]]``, and the boxes of step t are ``step_order[offsets[t] : offsets[t + 1]]``,
    one per row in row order.

    Args:
        row (Tensor[K] int64): the box's group (row), in size order.
        col (Tensor[K] int64): the box's position in its group's processing order (its step).
        step_order (Tensor[K] int64): box indices sorted by (step, row).
        active (list[int]): ``active[t]`` = number of groups with more than t boxes, for t < T.
        offsets (list[int]): ``offsets[t]`` = number of boxes handled before step t (length T + 1).
        num_groups (int): G.
        width (int): T.
    """

    row: Tensor
    col: Tensor
    step_order: Tensor
    active: list[int]
    offsets: list[int]
    num_groups: int
    width: int


def lockstep_layout(group: Tensor) -> LockstepLayout:
    """Padded layout for boxes given in processing order (each group's boxes in the order they are visited).

    Args:
        group (Tensor[K] int64): group ids in ``[0, G)``, every id used.
    """
    num_groups = int(group.max()) + 1
    sizes = torch.bincount(group, minlength=num_groups)  # [G]
    by_size = torch.argsort(sizes, descending=True, stable=True)  # row -> group
    row_of_group = torch.empty_like(by_size)
    row_of_group[by_size] = torch.arange(num_groups, device=group.device)
    row = row_of_group[group]  # [K]
    sorted_sizes = sizes[by_size]  # [G] descending
    starts = torch.cumsum(sorted_sizes, 0) - sorted_sizes  # [G]
    perm = torch.argsort(row, stable=True)  # keeps the processing order within a row
    col = torch.empty_like(row)
    col[perm] = torch.arange(row.numel(), device=group.device) - starts[row[perm]]
    width = int(sorted_sizes[0])
    # active[t] = #groups with size > t
    ends = torch.bincount(sorted_sizes, minlength=width + 1)[:width]  # groups of each size
    active = [int(a) for a in (num_groups - torch.cumsum(ends, 0)).tolist()]
    offsets = [0]
    for a in active:
        offsets.append(offsets[-1] + a)
    step_order = torch.argsort(col * num_groups + row)  # keys are unique
    return LockstepLayout(row, col, step_order, active, offsets, num_groups, width)
