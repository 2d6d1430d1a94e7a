"""Export detections as YOLO text labels: one line ``class cx cy w h conf`` per box, normalized to [0, 1].

YOLO class numbers are positions in an ordered list of category ids (``category_ids``): for COCO, index
0..79 of :data:`detens.labels.COCO_CATEGORY_IDS` (person = 0), as in Ultralytics' ``coco.yaml``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from detens.detections import Detections
from detens.io import atomic_write_text
from detens.labels import COCO_CATEGORY_IDS

__all__ = ["yolo_lines", "save_yolo_txt"]


def yolo_lines(
    det: Detections, category_ids: Sequence[int] | None = None, conf: float = 0.0, decimals: int = 6
) -> list[str]:
    """YOLO label lines of ``det`` (boxes clipped to the image), best score first.

    Args:
        det (Detections): boxes in pixels, labels in the label space.
        category_ids (list[int] | None): the category id of each YOLO class number; default COCO's 80.
        conf (float): keep boxes scored at least ``conf``.
        decimals (int): digits after the point.

    Raises:
        ValueError: a label that is not in ``category_ids``.
    """
    ids = list(COCO_CATEGORY_IDS if category_ids is None else category_ids)
    index = {int(c): i for i, c in enumerate(ids)}
    det = det.clip().sort_by_score()
    det = det[det.scores >= conf]
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
            raise ValueError(f"label {label} is not in the label space's category ids ({ids[:10]}...)")
        lines.append(
            f"{index[label]} {cx[i]:.{decimals}f} {cy[i]:.{decimals}f} {w[i]:.{decimals}f} {h[i]:.{decimals}f} {score:.{decimals}f}"
        )
    return lines


def save_yolo_txt(
    path: str | Path, det: Detections, category_ids: Sequence[int] | None = None, conf: float = 0.0
) -> Path:
    """Write :func:`yolo_lines` to ``path`` atomically (an empty file when nothing is kept); returns the path."""
    lines = yolo_lines(det, category_ids, conf)
    path = Path(path)
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return path
