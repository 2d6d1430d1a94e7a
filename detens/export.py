"""Export detections as YOLO text labels: one line ``class cx cy w h conf`` per box, normalized to [0, 1].

YOLO class numbers are positions in an ordered list of category ids (``category_ids``): for COCO, index
0..79 of :data:`detens.labels.COCO_CATEGORY_IDS` (person = 0), as in Ultralytics' ``coco.yaml``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from detens.checks import check_integer, check_real
from detens.convert import invert_category_ids
from detens.detections import Detections
from detens.io import atomic_write_text, check_file_path
from detens.labels import COCO_CATEGORY_IDS

__all__ = ["yolo_lines", "save_yolo_txt"]


def yolo_lines(
    det: Detections, category_ids: Sequence[int] | None = None, conf: float = 0.0, decimals: int = 6
) -> list[str]:
    """YOLO label lines of ``det`` (boxes clipped to the image), best score first. A box with no area
    inside the image has no line: a zero width or height is not a label.

    Args:
        det (Detections): boxes in pixels, labels in the label space.
        category_ids (list[int] | None): the category id of each YOLO class number, each once; default
            COCO's 80. Ids are whole numbers (``3`` or ``3.0``, as :mod:`detens.convert` takes them) in
            ``[0, MAX_LABEL]``; ``1.5`` is an error, not the id 1.
        conf (float): keep boxes scored at least ``conf``, in [0, 1].
        decimals (int): digits after the point, >= 0.

    Raises:
        TypeError: ``det`` is not ``Detections``, ``conf`` or ``decimals`` is not a number, ``category_ids``
            not a list of numbers (an entry a string or a bool).
        ValueError: ``conf`` outside [0, 1] (NaN included), negative ``decimals``, a category id that is no
            whole number or out of range (naming its entry), a category id given twice (its label would
            have two class numbers), or a label that is not in ``category_ids``.
    """
    if not isinstance(det, Detections):
        raise TypeError(f"det must be Detections, got {type(det).__name__}")
    index = _yolo_class_numbers(category_ids)
    conf = check_real(conf, "conf", 0.0, 1.0)
    decimals = check_integer(decimals, "decimals", 0)
    det = det.clip().sort_by_score()
    det = det[(det.scores >= conf) & (det.area() > 0)]
    if len(det) == 0:
        return []
    height, width = det.image_size
    boxes = det.boxes.double()
    cx = ((boxes[:, 0] + boxes[:, 2]) / 2 / width).tolist()
    cy = ((boxes[:, 1] + boxes[:, 3]) / 2 / height).tolist()
    w = ((boxes[:, 2] - boxes[:, 0]) / width).tolist()
    h = ((boxes[:, 3] - boxes[:, 1]) / height).tolist()
    lines = []
    for i, (label, score) in enumerate(zip(det.labels.tolist(), det.scores.tolist(), strict=True)):
        if label not in index:
            raise ValueError(f"label {label} is not in the label space's category ids ({list(index)[:10]}...)")
        lines.append(
            f"{index[label]} {cx[i]:.{decimals}f} {cy[i]:.{decimals}f} {w[i]:.{decimals}f} {h[i]:.{decimals}f} {score:.{decimals}f}"
        )
    return lines


def _yolo_class_numbers(category_ids: Sequence[int] | None) -> dict[int, int]:
    """``{category id: YOLO class number}`` of ``category_ids`` (None: COCO's 80).

    Raises:
        TypeError: not a list of numbers, or an entry that is no number.
        ValueError: an entry that is no whole number in ``[0, MAX_LABEL]``, or a category id given twice.
    """
    if category_ids is None:
        return invert_category_ids(COCO_CATEGORY_IDS)
    # a string is not iterated ("1690" is not the ids 1, 6, 9 and 0); a mapping is no list: YOLO class
    # numbers are the positions 0..n-1, which a mapping's keys could skip
    if isinstance(category_ids, (str, bytes, Mapping)) or not isinstance(category_ids, Iterable):
        raise TypeError(
            f"category_ids must be a list of integers, got {type(category_ids).__name__}: {category_ids!r}"
        )
    if getattr(category_ids, "ndim", 1) != 1:
        raise ValueError(f"category_ids must be a flat list of integers, got shape {list(category_ids.shape)}")
    # each entry as convert checks it (and Detections its labels): 3 or 3.0, never 1.5 read as 1
    return invert_category_ids(category_ids)


def save_yolo_txt(
    path: str | Path, det: Detections, category_ids: Sequence[int] | None = None, conf: float = 0.0
) -> Path:
    """Write :func:`yolo_lines` to ``path`` atomically (an empty file when nothing is kept); returns the path."""
    path = check_file_path(path)
    lines = yolo_lines(det, category_ids, conf)
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return path
