"""The CPU kernel of the ``wbf`` fuser: the reference's clustering loop, compiled with numba.

The loop is sequential by nature (each box joins the fused box it overlaps most, which moves that fused
box), so on the CPU it runs box by box as compiled code, with the arithmetic of the reference
(ensemble_boxes 1.0.9) and of the numpy formulation in :mod:`detens.fusers.wbf` step for step: IoU in
float64 on normalized boxes, the Σ score·box accumulated in float32, a float64 division rounded to
float32, and the guarded running mean for clusters whose Σ score is too small for float32. ``tests/
test_wbf.py`` checks both formulations against ensemble_boxes and against each other.

Dimension legend: K boxes (sorted by class, then in visiting order), M fused boxes.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["wbf_clusters"]

# Columns of a cluster row (the rows of detens.fusers.wbf's state, transposed).
_X1, _S1, _CONF, _AREA, _COUNT = 0, 4, 8, 9, 10
_WIDTH = 11


@numba.njit(cache=True, nogil=True)
def wbf_clusters(
    boxes: np.ndarray, weighted: np.ndarray, area: np.ndarray, score: np.ndarray, class_starts: np.ndarray,
    iou_thr: float, tiny_conf: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Cluster every class's boxes as the reference does.

    Args:
        boxes (ndarray[K, 4] float64): normalized boxes, sorted by class, each class in visiting order
            (descending weighted score).
        weighted (ndarray[K, 4] float64): score · box.
        area (ndarray[K] float64): each box's area.
        score (ndarray[K] float64): each box's weighted score.
        class_starts (ndarray[C + 1] int64): where each class begins (and K at the end).
        iou_thr (float): a box joins the fused box it overlaps most when that IoU is greater than this.
        tiny_conf (float): below this Σ score the fused box is the guarded running mean (float64).

    Returns:
        clusters (ndarray[M, 11] float64): fused box (4), Σ score·box (4), Σ score, area, members; the
            clusters of a class in creation order, classes in input order;
        cluster_of (ndarray[K] int64): each box's cluster.
    """
    num_boxes = boxes.shape[0]
    clusters = np.empty((num_boxes, _WIDTH), dtype=np.float64)  # at most one cluster per box
    cluster_of = np.empty(num_boxes, dtype=np.int64)
    count = 0
    for c in range(class_starts.shape[0] - 1):
        first = count  # this class's clusters are first .. count - 1
        for i in range(class_starts[c], class_starts[c + 1]):
            x1, y1, x2, y2 = boxes[i, 0], boxes[i, 1], boxes[i, 2], boxes[i, 3]
            best, best_iou = -1, -1.0
            for k in range(first, count):
                ex = min(clusters[k, 2], x2) - max(clusters[k, 0], x1)
                ey = min(clusters[k, 3], y2) - max(clusters[k, 1], y1)
                ex = max(ex, 0.0)
                ey = max(ey, 0.0)
                inter = ex * ey
                iou = inter / (clusters[k, _AREA] + area[i] - inter)
                if iou > best_iou:  # the first of equal IoUs, as argmax
                    best, best_iou = k, iou
            if best < 0 or best_iou <= iou_thr:
                k = count
                count += 1
                clusters[k, 0], clusters[k, 1], clusters[k, 2], clusters[k, 3] = x1, y1, x2, y2
                for j in range(4):
                    clusters[k, _S1 + j] = np.float32(weighted[i, j])
                clusters[k, _CONF] = score[i]
                clusters[k, _AREA] = area[i]
                clusters[k, _COUNT] = 1.0
            else:
                k = best
                conf = clusters[k, _CONF] + score[i]
                members = clusters[k, _COUNT] + 1.0
                if conf < tiny_conf:  # the reference's float32 arithmetic fails: a float64 running mean
                    ratio = score[i] / conf if conf > 0 else 1.0 / members
                for j in range(4):
                    total = np.float32(clusters[k, _S1 + j] + weighted[i, j])  # float32 accumulation
                    clusters[k, _S1 + j] = total
                    if conf >= tiny_conf:
                        clusters[k, _X1 + j] = np.float32(np.float64(total) / conf)
                    else:
                        old = clusters[k, _X1 + j]
                        clusters[k, _X1 + j] = np.float32(old + ratio * (boxes[i, j] - old))
                clusters[k, _CONF] = conf
                clusters[k, _COUNT] = members
                clusters[k, _AREA] = (clusters[k, 2] - clusters[k, 0]) * (clusters[k, 3] - clusters[k, 1])
            cluster_of[i] = k
    return clusters[:count], cluster_of
