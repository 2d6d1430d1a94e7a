"""Draw detections on an image with OpenCV (no fonts to download, no matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np
import torch

from detens.checks import check_integer, check_real
from detens.detections import Detections, check_xyxy
from detens.labels import COCO_ID_TO_NAME, label_names

__all__ = ["draw_detections", "draw_ground_truth", "class_color"]

# A fixed palette (BGR), so a class keeps its color across images and runs.
_PALETTE = (
    (56, 56, 255), (151, 157, 255), (31, 112, 255), (29, 178, 255), (49, 210, 207), (10, 249, 72),
    (23, 204, 146), (134, 219, 61), (52, 147, 26), (187, 212, 0), (168, 153, 44), (255, 194, 0),
    (147, 69, 52), (255, 115, 100), (236, 24, 0), (255, 56, 132), (133, 0, 82), (255, 56, 203),
    (200, 149, 255), (199, 55, 255),
)  # fmt: skip


def class_color(label: int) -> tuple[int, int, int]:
    """The BGR color of a class id."""
    return _PALETTE[int(label) % len(_PALETTE)]


def check_image(image_bgr: Any) -> None:
    """Refuse what OpenCV cannot draw on: anything but a uint8 array ``[H, W, 3]``."""
    if not isinstance(image_bgr, np.ndarray) or image_bgr.ndim != 3 or image_bgr.shape[2] != 3:
        raise ValueError(
            f"image_bgr must be a BGR array [H, W, 3], got {getattr(image_bgr, 'shape', type(image_bgr))}"
        )
    if image_bgr.dtype != np.uint8:
        raise TypeError(f"image_bgr must be a uint8 BGR array [H, W, 3], got dtype {image_bgr.dtype}")


def check_boxes(boxes: Any, name: str = "boxes") -> np.ndarray:
    """``boxes`` as float64 ``[G, 4]`` xyxy pixels, refused unless it is that: a NaN box would be cast to
    INT_MIN and drawn along a range of billions of pixels, a flat list of 8 numbers read as two boxes.

    Raises:
        TypeError: not numbers.
        ValueError: not ``[G, 4]`` (an empty list is no box), a value not finite, or ``x2 < x1`` or
            ``y2 < y1``, naming ``name``, the box and its values.
    """
    try:
        array = np.asarray(boxes, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an array [G, 4] of xyxy numbers, got {type(boxes).__name__}") from None
    if array.size == 0 and array.ndim == 1:
        return array.reshape(0, 4)
    if array.ndim != 2 or array.shape[1] != 4:
        raise ValueError(f"{name} must have shape [G, 4] (x1, y1, x2, y2 per box), got {list(array.shape)}")
    check_xyxy(torch.from_numpy(array), name)
    return array


def _line_width(line_width: Any, height: int, width: int) -> int:
    """``line_width`` (an integer >= 1), or by default one that scales with the image size."""
    if line_width is None:
        return max(1, round((height + width) / 2 * 0.003))
    return check_integer(line_width, "line_width", 1)


def draw_detections(
    image_bgr: np.ndarray,
    det: Detections,
    names: Mapping[int, str] | Sequence[str] | None = None,
    conf: float = 0.0,
    line_width: int | None = None,
) -> np.ndarray:
    """A copy of ``image_bgr`` with the boxes of ``det`` drawn, each labelled ``"<class name> <score>"``.

    Args:
        image_bgr (np.ndarray[H, W, 3] uint8): the image (not modified).
        det (Detections): boxes in the image's pixels.
        names (dict[int, str] | list[str] | None): ``{label: class name}``, or a list whose positions are
            the labels (as :func:`detens.interop.supervision.to_supervision` takes them); default the COCO
            names; unknown labels are written as numbers.
        conf (float): draw only boxes scored at least ``conf``, in [0, 1].
        line_width (int | None): box line width in pixels, >= 1; default scales with the image size.

    Returns:
        np.ndarray[H, W, 3] uint8: the drawn image.

    Raises:
        TypeError: an image that is not a uint8 array, ``det`` not ``Detections`` (whose boxes are checked
            finite xyxy), ``names`` neither a mapping nor a list, or a ``conf`` or ``line_width`` that is
            not a number.
        ValueError: an image not ``[H, W, 3]`` or of another size than ``det``'s, ``conf`` outside [0, 1]
            (NaN included), ``line_width`` < 1.
    """
    check_image(image_bgr)
    if not isinstance(det, Detections):
        raise TypeError(f"det must be Detections, got {type(det).__name__}")
    if tuple(image_bgr.shape[:2]) != tuple(det.image_size):
        raise ValueError(
            f"image is {image_bgr.shape[0]}x{image_bgr.shape[1]} but the detections are for {det.image_size}"
        )
    names = COCO_ID_TO_NAME if names is None else label_names(names, "names")
    conf = check_real(conf, "conf", 0.0, 1.0)
    canvas = np.ascontiguousarray(image_bgr.copy())
    height, width = canvas.shape[:2]
    lw = _line_width(line_width, height, width)
    font_scale = max(0.35, lw / 3)
    font_thickness = max(1, lw - 1)
    if len(det) == 0:
        return canvas
    det = det.clip()
    keep = det.scores >= conf
    order = det.scores[keep].argsort()  # draw the best last (on top)
    boxes = det.boxes[keep][order].round().to(int).tolist()
    scores = det.scores[keep][order].tolist()
    labels = det.labels[keep][order].tolist()
    for (x1, y1, x2, y2), score, label in zip(boxes, scores, labels, strict=True):
        color = class_color(label)
        cv2.rectangle(canvas, (x1, y1), (x2, y2), color, lw)
        text = f"{names.get(label, str(label))} {score:.2f}"
        (tw, th), baseline = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, font_scale, font_thickness)
        outside = y1 - th - baseline - 3 >= 0  # label above the box when it fits
        ty1 = y1 - th - baseline - 3 if outside else y1
        ty2 = y1 if outside else y1 + th + baseline + 3
        tx2 = min(width - 1, x1 + tw + 2)
        cv2.rectangle(canvas, (x1, ty1), (tx2, ty2), color, -1)
        brightness = 0.114 * color[0] + 0.587 * color[1] + 0.299 * color[2]
        text_color = (0, 0, 0) if brightness > 150 else (255, 255, 255)
        cv2.putText(
            canvas, text, (x1 + 1, ty2 - baseline - 1), cv2.FONT_HERSHEY_SIMPLEX, font_scale, text_color,
            font_thickness, cv2.LINE_AA,
        )  # fmt: skip
    return canvas


def draw_ground_truth(
    image_bgr: np.ndarray, boxes: np.ndarray, line_width: int | None = None, dash: int | None = None
) -> np.ndarray:
    """A copy of ``image_bgr`` with ground-truth boxes drawn dashed, white on a black outline, unlabelled,
    so they read apart from the class-colored, labelled boxes of :func:`draw_detections` on any image.

    Args:
        image_bgr (np.ndarray[H, W, 3] uint8): the image (not modified).
        boxes (np.ndarray[G, 4]): xyxy pixels.
        line_width (int | None): >= 1; default scales with the image size, like :func:`draw_detections`.
        dash (int | None): length of a dash in pixels, >= 1; default 4 line widths.

    Returns:
        np.ndarray[H, W, 3] uint8: the drawn image.

    Raises:
        TypeError: an image that is not a uint8 array, or boxes that are not numbers.
        ValueError: an image not ``[H, W, 3]``; ``boxes`` not ``[G, 4]``, not finite or not xyxy (naming the
            box); ``line_width`` or ``dash`` < 1.
    """
    check_image(image_bgr)
    boxes = check_boxes(boxes, "boxes")
    canvas = np.ascontiguousarray(image_bgr.copy())
    height, width = canvas.shape[:2]
    lw = _line_width(line_width, height, width)
    step = 4 * lw if dash is None else check_integer(dash, "dash", 1)
    clipped = np.clip(boxes, 0, [width - 1, height - 1, width - 1, height - 1]).round().astype(int)
    for x1, y1, x2, y2 in clipped.tolist():
        segments = []
        for a, b, fixed, horizontal in ((x1, x2, y1, True), (x1, x2, y2, True), (y1, y2, x1, False), (y1, y2, x2, False)):
            for start in range(a, b + 1, 2 * step):  # a dash, then a gap of the same length
                end = min(start + step, b)
                segments.append(((start, fixed), (end, fixed)) if horizontal else ((fixed, start), (fixed, end)))
        for color, thickness in (((0, 0, 0), lw + 2), ((255, 255, 255), lw)):  # outline first, then the dash
            for p1, p2 in segments:
                cv2.line(canvas, p1, p2, color, thickness, cv2.LINE_8)
    return canvas
