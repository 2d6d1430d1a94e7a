"""The CPU kernel of :func:`detens.match`: the same greedy rounds, compiled with numba.

On the CPU, the tensor formulation of the rounds spends its time in per-operation overhead (tens of
small ops per round, tens of rounds on crowded images). The rounds are a loop over a class's boxes in
score order, which compiled code runs directly: the result is the same, and the work per box is a
handful of IoUs, with the seeds that can overlap it (filed by x1 in cells as wide as the widest box).
``tests/test_matching.py`` checks both formulations against the same slow pure-Python reference.

Classes never mix, so each class is matched on its own, in a contiguous segment of the input.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["cluster_segments"]


@numba.njit(cache=True, nogil=True, inline="always")
def _iou(boxes: np.ndarray, i: int, j: int) -> float:
    # The same arithmetic as torchvision's NMS kernel: inter / (area_i + area_j - inter).
    iw = min(boxes[i, 2], boxes[j, 2]) - max(boxes[i, 0], boxes[j, 0])
    ih = min(boxes[i, 3], boxes[j, 3]) - max(boxes[i, 1], boxes[j, 1])
    if iw <= 0 or ih <= 0:
        return boxes.dtype.type(0.0)
    inter = iw * ih
    area_i = (boxes[i, 2] - boxes[i, 0]) * (boxes[i, 3] - boxes[i, 1])
    area_j = (boxes[j, 2] - boxes[j, 0]) * (boxes[j, 3] - boxes[j, 1])
    return inter / (area_i + area_j - inter)


@numba.njit(cache=True, nogil=True, inline="always")
def _cell(x: float, num_cells: int) -> int:
    # cells of width 1 / num_cells over [0, 1]; anything left of 0 is in the first
    return min(max(int(x * num_cells), 0), num_cells - 1)


@numba.njit(cache=True, nogil=True, inline="always")
def _cell_range(boxes: np.ndarray, i: int, num_cells: int) -> tuple[int, int]:
    # The cells of the x1s that overlap box i: from one cell width left of its x1 (cells are at least as
    # wide as any box; one cell more absorbs the rounding of the widths) to its x2.
    return max(_cell(boxes[i, 0] - 1.0 / num_cells, num_cells) - 1, 0), _cell(boxes[i, 2], num_cells)


@numba.njit(cache=True, nogil=True)
def cluster_segments(
    boxes: np.ndarray, models: np.ndarray, segment_starts: np.ndarray, iou_thr: float, num_models: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy class-wise matching rounds over boxes grouped by class.

    Args:
        boxes (ndarray[K, 4] float64): normalized boxes of positive area, sorted by class, then by
            priority (descending score; ties by model, then box index).
        models (ndarray[K] int64): the model of each box.
        segment_starts (ndarray[G + 1] int64): boxes ``segment_starts[g]:segment_starts[g + 1]`` are one class.
        iou_thr (float): boxes overlapping by IoU > ``iou_thr`` describe one object.
        num_models (int): N.

    Returns:
        cluster_of (ndarray[K] int64): the cluster each box ends in (a box that lost its (cluster, model)
            slot to a better box of its model waits for a later round, so every box ends in one).
        seed (ndarray[C] int64): the position of each cluster's seed box.
        round_of (ndarray[C] int64): the round in which each cluster was seeded.
    """
    num_boxes = boxes.shape[0]
    cluster_of = np.full(num_boxes, -1, np.int64)
    seed = np.empty(num_boxes, np.int64)
    round_of = np.empty(num_boxes, np.int64)
    pending = np.empty(num_boxes, np.int64)
    leftover = np.empty(num_boxes, np.int64)
    round_seeds = np.empty(num_boxes, np.int64)
    seed_slot = np.empty(num_boxes, np.int64)  # per pending box: its seed's rank in the round
    seed_next = np.empty(num_boxes, np.int64)  # per seed: the seed filed before it in its cell, or -1
    cell_first = np.empty(num_boxes, np.int64)  # per cell: its last filed seed, or -1 (num_cells <= num_pending)
    taken = np.empty(num_boxes * num_models, np.bool_)
    num_clusters = 0
    for group in range(segment_starts.shape[0] - 1):
        begin, end = segment_starts[group], segment_starts[group + 1]
        num_pending = end - begin
        for t in range(num_pending):
            pending[t] = begin + t
        round_index = 0
        while num_pending > 0:
            # Only a seed that overlaps a box can suppress it or take it (IoU > iou_thr >= 0), and such a
            # seed's x1 lies within the widest box's width left of the box's: the seeds are filed in cells of
            # x1 at least that wide, and a box compares itself with the seeds of its cells only, where
            # comparing it with every seed of the class took n² on a crowded image (17.8 s for one class of
            # 100,000 boxes, 0.8 s now). A cell as wide as the image holds every seed, as before.
            widest = 0.0
            for t in range(num_pending):
                widest = max(widest, boxes[pending[t], 2] - boxes[pending[t], 0])
            num_cells = num_pending if widest * num_pending <= 1.0 else max(1, int(1.0 / widest))
            cell_first[:num_cells] = -1
            # 1. Greedy NMS over the pending boxes: the survivors seed this round's clusters.
            num_seeds = 0
            for t in range(num_pending):
                box = pending[t]
                suppressed = False
                low, high = _cell_range(boxes, box, num_cells)
                for cell in range(low, high + 1):
                    q = cell_first[cell]
                    while q >= 0 and not suppressed:
                        suppressed = _iou(boxes, round_seeds[q], box) > iou_thr
                        q = seed_next[q]
                    if suppressed:
                        break
                if suppressed:
                    seed_slot[t] = -1
                else:
                    seed_slot[t] = num_seeds
                    round_seeds[num_seeds] = box
                    cell = _cell(boxes[box, 0], num_cells)
                    seed_next[num_seeds] = cell_first[cell]
                    cell_first[cell] = num_seeds
                    num_seeds += 1
            # 2. Every other box joins the seed it overlaps most (ties: the higher-scored seed).
            for t in range(num_pending):
                if seed_slot[t] >= 0:
                    continue
                box = pending[t]
                best, best_iou = 0, -1.0
                low, high = _cell_range(boxes, box, num_cells)
                for cell in range(low, high + 1):
                    q = cell_first[cell]
                    while q >= 0:
                        value = _iou(boxes, round_seeds[q], box)
                        if value > best_iou or (value == best_iou and q < best):
                            best, best_iou = q, value
                        q = seed_next[q]
                seed_slot[t] = best
            # 3. Each model keeps its best box per cluster (boxes come in score order); the rest wait.
            taken[: num_seeds * num_models] = False
            num_left = 0
            for t in range(num_pending):
                box = pending[t]
                slot = seed_slot[t] * num_models + models[box]
                if taken[slot]:
                    leftover[num_left] = box
                    num_left += 1
                else:
                    taken[slot] = True
                    cluster_of[box] = num_clusters + seed_slot[t]
            for q in range(num_seeds):
                seed[num_clusters + q] = round_seeds[q]
                round_of[num_clusters + q] = round_index
            num_clusters += num_seeds
            pending[:num_left] = leftover[:num_left]
            num_pending = num_left
            round_index += 1
    return cluster_of, seed[:num_clusters].copy(), round_of[:num_clusters].copy()
