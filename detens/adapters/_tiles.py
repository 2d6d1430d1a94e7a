"""Tiled test-time views: the windows that cut an image into overlapping tiles, and the merge of the tiles' boxes.

A detector that resizes every input to a fixed size (YOLO's ``imgsz``) sees a tile's objects larger than
the whole image's: small objects become findable. Each tile's boxes are mapped back to the image; a box
that touches a tile edge lying inside the image is a cut-off piece of a larger object (the neighbouring
tile, or the untiled members of the ensemble, see the whole object) and is dropped; the rest are merged
by class-wise NMS, as the detector's own post-processing treats one image.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["tile_windows", "cut_by_inner_edges", "merge_tiles", "EDGE_MARGIN"]

#: A box within this many pixels of an inner tile edge counts as cut by it (boxes come back with
#: sub-pixel noise from the detector's resize; 2 px is below any object COCO scores).
EDGE_MARGIN = 2.0


def _spans(length: int, count: int, overlap: float) -> list[tuple[int, int]]:
    """``count`` intervals of one size covering ``[0, length)``, neighbours sharing ``overlap`` of it."""
    if count == 1:
        return [(0, length)]
    size = min(length, math.ceil(length / (count - (count - 1) * overlap)))
    starts = [round(i * (length - size) / (count - 1)) for i in range(count)]
    return [(start, start + size) for start in starts]


def tile_windows(
    image_size: tuple[int, int], rows: int, cols: int, overlap: float
) -> list[tuple[int, int, int, int]]:
    """The tiles of an image, row by row.

    Args:
        image_size (tuple[int, int]): ``(height, width)``.
        rows (int), cols (int): tiles down and across (``>= 1``).
        overlap (float): the fraction of a tile's height (width) that it shares with the tile below (beside)
            it, in ``[0, 1)``.

    Returns:
        list[tuple[int, int, int, int]]: ``rows * cols`` windows ``(x1, y1, x2, y2)`` in pixels (``x2``, ``y2``
        exclusive), all of one size, the first at the top-left corner and the last at the bottom-right one.
    """
    height, width = image_size
    return [
        (x1, y1, x2, y2) for y1, y2 in _spans(height, rows, overlap) for x1, x2 in _spans(width, cols, overlap)
    ]


def cut_by_inner_edges(
    boxes: Tensor, window: tuple[int, int, int, int], image_size: tuple[int, int], margin: float = EDGE_MARGIN
) -> Tensor:
    """Which boxes found in ``window`` touch one of its edges that lies inside the image.

    Args:
        boxes (Tensor[K, 4]): xyxy boxes in image pixels, found in the tile ``window``.
        window (tuple[int, int, int, int]): the tile ``(x1, y1, x2, y2)``.
        image_size (tuple[int, int]): ``(height, width)`` of the image.
        margin (float): how close to an edge (pixels) counts as touching it.

    Returns:
        Tensor[K] (bool): True for a box cut by an inner edge. An edge on the image border cuts nothing.
    """
    height, width = image_size
    x1, y1, x2, y2 = window
    cut = torch.zeros(boxes.shape[0], dtype=torch.bool, device=boxes.device)
    if x1 > 0:
        cut |= boxes[:, 0] <= x1 + margin
    if y1 > 0:
        cut |= boxes[:, 1] <= y1 + margin
    if x2 < width:
        cut |= boxes[:, 2] >= x2 - margin
    if y2 < height:
        cut |= boxes[:, 3] >= y2 - margin
    return cut


def merge_tiles(
    boxes: Tensor, scores: Tensor, labels: Tensor, iou_thr: float, max_det: int | None
) -> Tensor:
    """Class-wise NMS of the boxes of all tiles of one image.

    Args:
        boxes (Tensor[K, 4]): xyxy boxes in image pixels.
        scores (Tensor[K]): their scores.
        labels (Tensor[K]): their labels (any integers).
        iou_thr (float): boxes of one label overlapping a higher-scored one by more than this are dropped.
        max_det (int | None): at most this many boxes kept (the highest scored); None: no limit.

    Returns:
        Tensor[M] (int64): indices of the kept boxes, by decreasing score.
    """
    from torchvision.ops import batched_nms  # torchvision's import pulls in its model zoo: only when tiling

    # class ranks, not ids, as NMS's per-class offsets: large ids would leave too few bits for the boxes
    ranks = torch.unique(labels, return_inverse=True)[1]
    keep = batched_nms(boxes.to(torch.float64), scores.to(torch.float64), ranks, iou_thr)
    return keep if max_det is None else keep[:max_det]
