"""``supervision.Detections`` ↔ detens ``Detections`` (``pip install 'detens[supervision]'``).

Dimension legend: K boxes in one image, N models.

Field by field:

- ``xyxy`` (``ndarray[K, 4]``) ↔ ``boxes``: xyxy in absolute pixels on both sides (float32 in detens).
- ``confidence`` (``ndarray[K]``) ↔ ``scores``, in ``[0, 1]``.
- ``class_id`` (``ndarray[K]`` int) ↔ ``labels``, copied as they are: detens labels are class ids of ONE
  label space, which for detens' adapters is the dataset's category ids (COCO ids 1..90 by default), NOT
  a detector's own class indices. ``supervision.Detections.from_ultralytics`` gives Ultralytics' class
  indices (0..79 for COCO models): fine for fusing such detections with each other, but not with the
  output of detens' adapters or with a head trained on COCO category ids (map the ids first).
- ``data["class_name"]`` ← the names of the labels, when ``to_supervision`` is given ``class_names``.
- The image size ``(height, width)``, which supervision does not carry, must be given to
  ``from_supervision``; ``mask``, ``tracker_id``, ``data`` and ``metadata`` are not carried over.

supervision is imported only inside these functions, so ``import detens`` works without it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from detens.detections import Detections, check_boxes_inside
from detens.labels import label_names

if TYPE_CHECKING:
    import supervision as sv

__all__ = [
    "to_supervision", "from_supervision", "is_supervision_detections", "from_supervision_per_model", "class_names_of",
]


def _import_supervision() -> Any:
    from detens.extras import import_extra

    return import_extra(
        "supervision", "supervision interop needs the supervision package: pip install 'detens[supervision]'"
    )


def is_supervision_detections(obj: Any) -> bool:
    """Whether ``obj`` is a ``supervision.Detections``, without importing supervision.

    One can only exist once supervision is imported, so ``sys.modules`` decides.
    """
    module = sys.modules.get("supervision")
    return module is not None and isinstance(obj, module.Detections)


def to_supervision(detections: Detections, class_names: Mapping[int, str] | None = None) -> sv.Detections:
    """A ``supervision.Detections`` of the same boxes, scores and labels (as ``class_id``), on the CPU.

    Args:
        detections (Detections): K boxes of one image.
        class_names (dict[int, str] | None): ``{label: name}`` (e.g. a detector's ``categories``); when given,
            ``data["class_name"]`` holds each box's name, which supervision's annotators display.

    Returns:
        supervision.Detections: ``xyxy`` float32 ``[K, 4]``, ``confidence`` float32 ``[K]``, ``class_id``
        int64 ``[K]``; fresh arrays, so changing them does not change ``detections``.

    Raises:
        TypeError: ``detections`` is not a detens Detections.
        ValueError: a label missing from ``class_names``.
    """
    sv = _import_supervision()
    if not isinstance(detections, Detections):
        raise TypeError(f"to_supervision takes a detens Detections, got {type(detections).__name__}")
    arrays = {key: value.copy() for key, value in detections.numpy().items()}
    data: dict[str, np.ndarray] = {}
    if class_names is not None:
        names = label_names(class_names, "class_names")
        missing = sorted({int(label) for label in arrays["labels"]} - set(names))
        if missing:
            raise ValueError(
                f"class_names has no name for labels {missing}; it must name every label "
                f"(it has {len(class_names)} entries)"
            )
        data["class_name"] = np.array([names[int(label)] for label in arrays["labels"]], dtype=str)
    return sv.Detections(
        xyxy=arrays["boxes"], confidence=arrays["scores"], class_id=arrays["labels"], data=data
    )


def from_supervision(
    sv_detections: sv.Detections, image_size: tuple[int, int], source: str | None = None
) -> Detections:
    """A detens Detections of a ``supervision.Detections``' boxes, confidences and class ids.

    Args:
        sv_detections (supervision.Detections): K boxes of one image, with ``confidence`` and ``class_id``
            (either may be None only when K = 0).
        image_size (tuple[int, int]): ``(height, width)`` of the image (``frame.shape[:2]``); supervision
            does not record it.
        source (str | None): the model's name, stored as ``Detections.source``.

    Returns:
        Detections: CPU tensors, float32 boxes and scores, int64 labels = ``class_id``; validated as any
        Detections (scores outside ``[0, 1]`` or negative class ids are errors).

    Raises:
        TypeError: ``sv_detections`` is not a ``supervision.Detections``.
        ValueError: no ``confidence`` or no ``class_id`` for a non-empty one; an invalid image size, or one
            that a box starts beyond, or ends well past (``(width, height)`` given for ``(height, width)``?).
    """
    if not is_supervision_detections(sv_detections):
        raise TypeError(
            f"from_supervision takes a supervision.Detections, got {type(sv_detections).__name__}"
        )
    num_boxes = len(sv_detections)
    fields = {"confidence": sv_detections.confidence, "class_id": sv_detections.class_id}
    for field_name, value in fields.items():
        if value is None:
            if num_boxes:
                raise ValueError(
                    f"supervision.Detections.{field_name} is None for {num_boxes} boxes; detens needs a "
                    f"{'score' if field_name == 'confidence' else 'class id'} per box"
                )
            fields[field_name] = np.zeros((0,))
    detections = Detections(
        np.array(sv_detections.xyxy, dtype=np.float32).reshape(-1, 4),
        np.array(fields["confidence"], dtype=np.float32),
        np.array(fields["class_id"]),
        image_size,
        source,
    )
    check_boxes_inside(detections, "image_size")
    return detections


def from_supervision_per_model(
    per_model: Sequence[Any], image_size: tuple[int, int] | None, what: str = "per_model"
) -> tuple[list[Any], bool]:
    """``per_model`` with each ``supervision.Detections`` converted (the other items left for the caller to
    check), and whether every item was one.

    Raises:
        ValueError: a ``supervision.Detections`` but no ``image_size``.
    """
    items = list(per_model)
    found = [i for i, item in enumerate(items) if is_supervision_detections(item)]
    if not found:
        return items, False
    if image_size is None:
        raise ValueError(
            f"{what}[{found[0]}] is a supervision.Detections, which does not record the image size; pass "
            "image_size=(height, width), e.g. frame.shape[:2]"
        )
    for i in found:
        try:
            items[i] = from_supervision(items[i], image_size)
        except (TypeError, ValueError) as err:
            raise type(err)(f"{what}[{i}] (a supervision.Detections: {_FIELDS}): {err}") from err
    return items, len(found) == len(items)


# detens' names of supervision's fields, which the messages of Detections use
_FIELDS = "its xyxy are the boxes, confidence the scores, class_id the labels"


def class_names_of(per_model: Sequence[Any], what: str = "per_model") -> dict[int, str] | None:
    """The ``{class_id: name}`` that the ``supervision.Detections`` in ``per_model`` carry in
    ``data["class_name"]``, so fused boxes keep their names; None unless every one with boxes carries them.

    Raises:
        ValueError: two inputs name one class id differently, or give one class name two ids (detections of
            different label spaces: Ultralytics' class indices, where person is 0, beside COCO's category ids,
            where it is 1, would fuse each object twice, once per id).
    """
    names: dict[int, str] = {}
    where: dict[int, int] = {}
    ids_of: dict[str, int] = {}  # a class name -> the first id given to it
    for i, item in enumerate(per_model):
        if not is_supervision_detections(item) or len(item) == 0:
            continue
        if "class_name" not in (item.data or {}) or item.class_id is None:
            return None
        pairs = zip(np.asarray(item.class_id).tolist(), np.asarray(item.data["class_name"]).tolist(), strict=True)
        for class_id, name in pairs:
            class_id, name = int(class_id), str(name)
            if names.setdefault(class_id, name) != name:
                raise ValueError(
                    f"class_id {class_id} is {names[class_id]!r} in {what}[{where[class_id]}] and "
                    f"{name!r} in {what}[{i}]: fuse detections of one label space (map the ids first)"
                )
            where.setdefault(class_id, i)
            first = ids_of.setdefault(name, class_id)
            if first != class_id:
                raise ValueError(
                    f"class {name!r} is class_id {first} in {what}[{where[first]}] and {class_id} in {what}[{i}]: "
                    "fuse detections of one label space (map the ids first: Ultralytics' class indices, where "
                    "person is 0, are not COCO's category ids, where it is 1)"
                )
    return names or None
