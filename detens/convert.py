"""Lossless conversions between ``Detections`` and the objects of other pipelines.

Dimension legend: K boxes in one image.

- Ultralytics ``Results`` ↔ ``Detections``: ``Results.boxes.data`` is ``[K, 6]`` rows
  ``x1, y1, x2, y2, conf, cls`` in original-image pixels, the same boxes detens uses. The class index
  ``cls`` maps to a detens label through ``category_ids`` (index → label); ``None`` keeps the index.
- torchvision detection output dicts ``{"boxes": Tensor[K, 4], "scores": Tensor[K], "labels": Tensor[K]}``
  ↔ ``Detections``: torchvision's labels are already category ids (1..90 for COCO models), kept as they
  are; the image size must be given, as torchvision's outputs do not carry it.

Nothing is rounded: a round trip gives back the same boxes, scores, labels and image size (float32
boxes and scores; class indices are small integers, exact in float32). Ultralytics is imported only
when a ``Results`` is built.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from detens.checks import check_whole, torch_ready_array
from detens.detections import MAX_LABEL, Detections, check_boxes_inside
from detens.labels import COCO_CATEGORY_IDS, COCO_NAMES

if TYPE_CHECKING:
    from ultralytics.engine.results import Results

__all__ = [
    "ClassMap",
    "results_to_detections",
    "detections_to_results",
    "torchvision_to_detections",
    "detections_to_torchvision",
    "coco_category_ids_for",
    "invert_category_ids",
]

#: Class index → detens label, as a sequence (``table[index]``) or a mapping.
ClassMap = Sequence[int] | Mapping[int, int]


def coco_category_ids_for(names: Mapping[int, str] | Sequence[str]) -> tuple[int, ...] | None:
    """COCO category ids of an Ultralytics model's classes, if its names are COCO's 80 in COCO order.

    Returns:
        ``COCO_CATEGORY_IDS`` (index → category id) for a COCO-trained model, else ``None``.
    """
    if isinstance(names, Mapping):
        if sorted(names) != list(range(len(names))):
            return None
        names = [names[i] for i in range(len(names))]
    return COCO_CATEGORY_IDS if tuple(names) == COCO_NAMES else None


def _class_pairs(category_ids: ClassMap) -> list[tuple[int, int]]:
    """``(class index, label)`` of each entry of ``category_ids``, checked as ``Detections`` checks labels:
    whole numbers (``3`` or ``3.0``), labels in ``[0, MAX_LABEL]``, class indices >= 0.

    Raises:
        TypeError: ``category_ids`` is no sequence or mapping, or an entry is no number (a bool, a string).
        ValueError: naming the entry: a fraction (``1.5`` is not the id 1), or a value out of range.
    """
    if isinstance(category_ids, Mapping):
        return [
            (check_whole(index, "category_ids key", 0),
             check_whole(label, f"category_ids[{index!r}]", 0, MAX_LABEL))
            for index, label in category_ids.items()
        ]
    if isinstance(category_ids, (str, bytes)) or not isinstance(category_ids, Iterable):
        raise TypeError(
            "category_ids must be a list of category ids (one per class index) or a {class index: id} dict, "
            f"got {type(category_ids).__name__}: {category_ids!r}"
        )
    return [
        (index, check_whole(label, f"category_ids[{index}]", 0, MAX_LABEL)) for index, label in enumerate(category_ids)
    ]


def _map_classes(classes: Tensor, category_ids: ClassMap | None, what: str) -> Tensor:
    """Class indices (Tensor[K] int64) → labels through ``category_ids``."""
    if category_ids is None:
        return classes
    pairs = sorted(_class_pairs(category_ids))
    if not pairs:
        found = torch.zeros_like(classes, dtype=torch.bool)
    else:
        # searched, not looked up in a table indexed by class: a class index of 10**12 needs no table that long
        indices = torch.tensor([i for i, _ in pairs], dtype=torch.int64, device=classes.device)  # [M] ascending
        labels = torch.tensor([label for _, label in pairs], dtype=torch.int64, device=classes.device)  # [M]
        position = torch.searchsorted(indices, classes).clamp(max=len(pairs) - 1)  # [K]
        found = indices[position] == classes
    if not bool(found.all()):
        bad = sorted(set(classes[~found].tolist()))
        raise ValueError(f"{what}: class indices {bad} have no entry in category_ids ({len(pairs)} entries)")
    return labels[position] if pairs else classes


def invert_category_ids(category_ids: ClassMap) -> dict[int, int]:
    """``{label: class index}`` of a class index → label map (a mapping, or a sequence indexed by class).

    Raises:
        TypeError, ValueError: an entry that is no whole number in range (see :func:`results_to_detections`).
        ValueError: two classes map to one label.
    """
    inverse: dict[int, int] = {}
    for index, label in _class_pairs(category_ids):
        if label in inverse:
            raise ValueError(f"category_ids maps classes {inverse[label]} and {index} to one label {label}")
        inverse[label] = index
    return inverse


# ------------------------------------------------------------------------------------ Ultralytics Results
def results_to_detections(
    result: Results, category_ids: ClassMap | None = None, source: str | None = None
) -> Detections:
    """An Ultralytics detection ``Results`` (one image) → ``Detections``, on the same device.

    Args:
        result (Results): from ``model(...)`` / ``model.predict(...)``; ``result.boxes`` must be set.
        category_ids (Sequence[int] | Mapping[int, int] | None): the label of each class index, e.g.
            ``COCO_CATEGORY_IDS`` (see :func:`coco_category_ids_for`); ``None`` keeps the class indices.
            Ids are whole numbers (``3`` or ``3.0``, as ``Detections`` takes labels) in ``[0, MAX_LABEL]``;
            ``1.5`` is an error, not the id 1.
        source (str | None): stored in ``Detections.source`` (e.g. the model name).

    Returns:
        Detections with ``image_size = result.orig_shape``. Track ids, if any, are not carried.
    """
    boxes = getattr(result, "boxes", None)
    if boxes is None:
        if not hasattr(result, "orig_shape"):  # no Results at all
            raise TypeError(f"results_to_detections needs an Ultralytics Results, got {type(result).__name__}")
        kind = "OBB" if getattr(result, "obb", None) is not None else "non-detection"
        raise TypeError(f"results_to_detections needs a detection Results with .boxes; got a {kind} Results")
    data = boxes.data
    data = torch.as_tensor(torch_ready_array(data)) if isinstance(data, np.ndarray) else data  # after Results.numpy()
    if data.ndim != 2 or data.shape[1] not in (6, 7):
        raise ValueError(f"Results.boxes.data must have shape [K, 6] or [K, 7], got {list(data.shape)}")
    classes = data[:, -1]
    bad = ~torch.isfinite(classes) | (classes != classes.round()) | (classes < 0)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"results_to_detections: box {i} has class index {classes[i].item()}; class indices are integers >= 0"
        )
    classes = classes.to(torch.int64)
    labels = _map_classes(classes, category_ids, "results_to_detections")
    height, width = (int(v) for v in result.orig_shape)
    return Detections(data[:, :4], data[:, -2], labels, (height, width), source)


def detections_to_results(
    det: Detections, template: Results, category_ids: ClassMap | None = None, dtype: torch.dtype | None = None
) -> Results:
    """``Detections`` → an Ultralytics ``Results`` with the image, path, class names and speed of ``template``.

    Args:
        det (Detections): of the image of ``template`` (same size).
        template (Results): any Results of that image (e.g. one model's); it is not modified.
        category_ids (Sequence[int] | Mapping[int, int] | None): the same index → label map used by
            :func:`results_to_detections`; labels are mapped back to class indices. ``None``: labels are
            the class indices.
        dtype (torch.dtype | None): a floating dtype of ``.boxes.data`` (a half-precision model's
            ``torch.float16``); None: that of ``det.boxes``.

    Returns:
        Results: ``.boxes.data`` ``[K, 6]`` on ``det``'s device; ``.plot()``, ``.save_txt()``, ``.to_json()``
        work as on any Ultralytics Results.

    Raises:
        ValueError: a label without a class index, a class index the dtype cannot hold exactly (Results hold
            class indices as floating-point numbers) or missing from the template's class names, or another
            image size than the template's.
    """
    from detens.adapters.weights import import_ultralytics

    Results = import_ultralytics("ultralytics.engine.results").Results
    if not isinstance(det, Detections):
        raise TypeError(f"det must be Detections, got {type(det).__name__}")
    orig_shape = tuple(int(v) for v in template.orig_shape)
    if det.image_size != orig_shape:
        raise ValueError(
            f"Detections of an image of size {det.image_size} cannot go into a Results of size {orig_shape}"
        )
    labels = det.labels
    if category_ids is not None:
        inverse = invert_category_ids(category_ids)
        unknown = sorted(set(labels.tolist()) - set(inverse))
        if unknown:
            raise ValueError(f"labels {unknown} have no class index in category_ids")
        keys = torch.tensor(sorted(inverse), dtype=torch.int64, device=labels.device)
        values = torch.tensor([inverse[k] for k in sorted(inverse)], dtype=torch.int64, device=labels.device)
        labels = values[torch.searchsorted(keys, labels)]
    names = template.names
    if len(labels) and names is not None:
        unknown = sorted(set(labels.tolist()) - {int(k) for k in names})
        if unknown:
            raise ValueError(
                f"class indices {unknown} are not in the Results' class names ({len(names)} classes)"
            )
    dtype = det.boxes.dtype if dtype is None else dtype
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    whole = round(2 / torch.finfo(dtype).eps)  # dtype holds every whole number up to this one exactly
    if len(labels) and int(labels.max()) > whole:
        raise ValueError(
            f"class index {int(labels.max())} is above {whole}: Ultralytics' Results hold class indices as "
            f"{str(dtype).removeprefix('torch.')} numbers, which cannot store it exactly"
        )
    data = torch.cat([det.boxes, det.scores[:, None], labels[:, None].to(det.boxes.dtype)], dim=1).to(dtype)
    speed = dict(template.speed) if isinstance(template.speed, Mapping) else None
    return Results(orig_img=template.orig_img, path=template.path, names=names, boxes=data, speed=speed)


# ------------------------------------------------------------------------------------ torchvision dicts
def torchvision_to_detections(
    output: Mapping[str, Tensor],
    image_size: tuple[int, int] | Sequence[int] | Tensor,
    source: str | None = None,
) -> Detections:
    """A torchvision detection output dict (one image) → ``Detections``, on the same device.

    Args:
        output (dict): ``boxes (Tensor[K, 4])`` xyxy pixels of the original image, ``scores (Tensor[K])``,
            ``labels (Tensor[K])``; other keys (``masks``, ``keypoints``) are ignored.
        image_size: ``(height, width)`` of the original image, e.g. ``image.shape[-2:]``, or the image
            itself (a tensor ``[C, H, W]`` or a numpy ``[H, W, C]``).
        source (str | None): stored in ``Detections.source``.

    Raises:
        ValueError: a box starts beyond the image or ends well past it (``image_size`` given as ``(width, height)``?).
    """
    if not isinstance(output, Mapping):
        raise TypeError(
            f"a torchvision output must be a dict with boxes/scores/labels, got {type(output).__name__}"
        )
    missing = [k for k in ("boxes", "scores", "labels") if k not in output]
    if missing:
        raise ValueError(f"torchvision output lacks {missing}; got keys {sorted(output)}")
    detections = Detections(
        output["boxes"], output["scores"], output["labels"], _as_image_size(image_size, "image_size"), source
    )
    check_boxes_inside(detections, "image_size")
    return detections


def detections_to_torchvision(det: Detections, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """``Detections`` → ``{"boxes": Tensor[K, 4], "scores": Tensor[K], "labels": Tensor[K] int64}``.

    Args:
        dtype: floating dtype of boxes and scores (float32 when ``None``). The device is ``det``'s.
    """
    if not isinstance(det, Detections):
        raise TypeError(f"det must be Detections, got {type(det).__name__}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype such as torch.float16 or None, got {dtype!r}")
    boxes, scores = det.boxes, det.scores
    if dtype is not None:
        boxes, scores = boxes.to(dtype), scores.to(dtype)
    return {"boxes": boxes, "scores": scores, "labels": det.labels}


def _as_image_size(value: Any, what: str) -> tuple[int, int]:
    """``(h, w)``, ``torch.Size``, a 1-D tensor of 2, an image tensor ``[..., H, W]`` or a numpy image
    ``[H, W]`` / ``[H, W, C]`` (OpenCV's layout) → ``(h, w)``; ``what`` names the argument in errors."""
    if isinstance(value, Tensor) and value.ndim >= 2:
        if value.ndim >= 3 and value.shape[-1] in (1, 3, 4) and value.shape[-3] not in (1, 3, 4):
            # torch.from_numpy of an OpenCV image: its last two sides are (W, C), not (H, W)
            raise ValueError(
                f"{what}: an image tensor must be [..., C, H, W] (torchvision's layout), got shape "
                f"{list(value.shape)}, which looks like [H, W, C]; permute it, or pass (height, width)"
            )
        height, width = value.shape[-2:]
        return int(height), int(width)
    if isinstance(value, np.ndarray) and value.ndim >= 2:
        if value.ndim == 2 or (value.ndim == 3 and value.shape[2] in (1, 3, 4)):
            return int(value.shape[0]), int(value.shape[1])
        raise ValueError(
            f"{what}: a numpy image must be [H, W] or [H, W, C] with 1, 3 or 4 channels, got shape {list(value.shape)}"
        )
    if isinstance(value, (Tensor, np.ndarray)):
        value = value.tolist()
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        shown = repr(value) if len(repr(value)) <= 80 else f"{type(value).__name__} {repr(value)[:60]}..."
        hint = "; for an image's shape pass image.shape[-2:], or the image tensor itself" if (
            isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 3) else ""
        raise ValueError(f"{what} must be (height, width) or an image tensor [C, H, W], got {shown}{hint}")
    return value[0], value[1]  # checked, not truncated, by Detections
