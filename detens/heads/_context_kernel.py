"""The CPU kernel of the heads' in-image context features (:mod:`detens.heads._features`).

The tensor formulation compares every cluster with every other one: a dense C×C IoU and a dozen C×C
masks, most of whose entries are pairs of boxes that do not even overlap. On the CPU that is most of the
time a network head takes to fuse an image. Compiled code visits only the pairs that overlap (a sweep
over the boxes sorted by their left edge) and the pairs of one class, with the same arithmetic, so it
gives the same terms to the bit; only a sum of three or more scores depends on the order of its
additions, and the caller takes those from torch (it has the pairs). ``tests/test_heads_beyond.py``
checks both formulations against the same slow pure-Python reference, and against each other to the bit.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["context_terms"]


@numba.njit(cache=True, nogil=True)
def context_terms(
    boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, overlap_thr: float, colocated_thr: float,
    confident_thr: float,
) -> tuple[np.ndarray, ...]:
    """The pairwise terms of the context features of one image's clusters.

    Args:
        boxes (ndarray[C, 4]): the clusters' mean boxes, xyxy, float32 or float64.
        scores (ndarray[C]): their mean scores, the boxes' dtype.
        labels (ndarray[C] int64): their classes.
        overlap_thr, colocated_thr, confident_thr (float): "overlapping" same-class IoU, "the same place"
            other-class IoU, "confident" score (each compared strictly, in the boxes' dtype).

    Returns:
        ``dup_iou``: the largest IoU with a same-class cluster ranked before this one (0 if none);
        ``dup_at``: that cluster (the lowest index among equal IoUs; -1 if none); ``overlaps``: the other
        same-class clusters overlapping by more than ``overlap_thr``; ``rank``: the same-class clusters
        ranked before this one; ``best``: the best same-class score (this one's included); ``other_iou``:
        the largest IoU with an other-class cluster ranked before this one; ``other_best`` and
        ``other_mass``: the best and the sum of the scores of the other-class clusters overlapping by more
        than ``colocated_thr`` (summed in the boxes' dtype, in no particular order); ``class_confident``:
        the same-class clusters (this one included) scoring more than ``confident_thr``; ``colocated``
        (ndarray[P, 2] int64): the P pairs (cluster, other-class cluster at its place) summed into
        ``other_mass``. "Ranked before": a higher score, or an equal score and a lower index.
    """
    num = boxes.shape[0]
    dtype = boxes.dtype.type
    overlap_thr, colocated_thr, confident_thr = dtype(overlap_thr), dtype(colocated_thr), dtype(confident_thr)
    dup_iou = np.zeros(num, boxes.dtype)
    dup_at = np.full(num, -1, np.int64)
    overlaps = np.zeros(num, np.int64)
    rank = np.zeros(num, np.int64)
    best = scores.copy()
    other_iou = np.zeros(num, boxes.dtype)
    other_best = np.zeros(num, boxes.dtype)
    other_mass = np.zeros(num, boxes.dtype)
    colocated = np.empty((max(num, 1), 2), np.int64)
    num_colocated = 0
    class_confident = np.zeros(num, np.int64)

    # Every overlapping pair has one box whose left edge lies inside the other's span: sweep by left edge.
    by_left = np.argsort(boxes[:, 0], kind="mergesort")
    for a in range(num):
        i = by_left[a]
        for b in range(a + 1, num):
            j = by_left[b]
            if boxes[j, 0] >= boxes[i, 2]:
                break
            # torchvision's box_iou arithmetic in the boxes' dtype; no overlap (or no area) gives no term.
            iw = min(boxes[i, 2], boxes[j, 2]) - max(boxes[i, 0], boxes[j, 0])
            ih = min(boxes[i, 3], boxes[j, 3]) - max(boxes[i, 1], boxes[j, 1])
            if iw <= 0 or ih <= 0:
                continue
            inter = iw * ih
            area_i = (boxes[i, 2] - boxes[i, 0]) * (boxes[i, 3] - boxes[i, 1])
            area_j = (boxes[j, 2] - boxes[j, 0]) * (boxes[j, 3] - boxes[j, 1])
            iou = inter / (area_i + area_j - inter)
            for this, that in ((i, j), (j, i)):
                # "Ranked before": a higher score, or the same score and a lower index.
                before = scores[that] > scores[this] or (scores[that] == scores[this] and that < this)
                if labels[this] == labels[that]:
                    if iou > overlap_thr:
                        overlaps[this] += 1
                    if before and (iou > dup_iou[this] or (iou == dup_iou[this] and that < dup_at[this])):
                        dup_iou[this] = iou
                        dup_at[this] = that
                else:
                    if before and iou > other_iou[this]:
                        other_iou[this] = iou
                    if iou > colocated_thr:
                        other_best[this] = max(other_best[this], scores[that])
                        other_mass[this] += scores[that]
                        if num_colocated == colocated.shape[0]:
                            colocated = np.concatenate((colocated, np.empty_like(colocated)))
                        colocated[num_colocated, 0] = this
                        colocated[num_colocated, 1] = that
                        num_colocated += 1

    by_class = np.argsort(labels, kind="mergesort")
    start = 0
    while start < num:
        stop = start
        while stop < num and labels[by_class[stop]] == labels[by_class[start]]:
            stop += 1
        confident = 0
        top = scores[by_class[start]]
        for a in range(start, stop):
            i = by_class[a]
            confident += scores[i] > confident_thr
            top = max(top, scores[i])
        # The class by descending score, equal scores by index (by_class keeps the indices in order and the
        # sort is stable): a cluster's position is the number ranked before it, in n log n where comparing
        # every pair took n² (6.7 s for one class of 30,000 clusters).
        by_score = np.argsort(-scores[by_class[start:stop]], kind="mergesort")
        for position in range(stop - start):
            rank[by_class[start + by_score[position]]] = position
        for a in range(start, stop):
            best[by_class[a]] = top
            class_confident[by_class[a]] = confident
        start = stop
    return (
        dup_iou, dup_at, overlaps, rank, best, other_iou, other_best, other_mass, class_confident,
        colocated[:num_colocated].copy(),
    )
