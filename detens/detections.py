"""``Detections``: the one currency between detens modules.

Dimension legend: K boxes in one image.

Boxes are always xyxy in absolute pixels (float32); conversions happen only at I/O edges
(COCO xywh, YOLO normalized cxcywh, the [0, 1] boxes of ensemble_boxes).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from detens.checks import check_device, torch_ready_array

__all__ = ["Detections", "MAX_LABEL", "MAX_IMAGE_SIDE", "check_boxes_inside", "BOX_SLACK", "check_xyxy", "compute_device"]

#: The largest class id: labels are category ids, written to JSON and offset per class in batched NMS, and
#: int32 is what every COCO tool and exporter can hold.
MAX_LABEL = 2**31 - 1
#: The largest image height or width, in pixels (int32, like the labels).
MAX_IMAGE_SIDE = 2**31 - 1


def _as_tensor(value: Any, name: str, dtype: torch.dtype | None, device: torch.device | None = None) -> Tensor:
    """``value`` as a tensor of ``dtype`` (None: its own dtype) on ``device`` (None: its own device)."""
    if isinstance(value, Tensor):
        tensor = value
        if tensor.is_meta:  # torch's own errors would come later, from a check or a copy, naming no field
            raise ValueError(
                f"Detections.{name} is on the meta device, which holds shapes but no values; pass a tensor on the "
                "CPU or a GPU"
            )
    elif isinstance(value, (np.ndarray, list, tuple)):
        try:
            tensor = torch.as_tensor(torch_ready_array(np.asarray(value)))
        except (TypeError, ValueError) as err:
            raise TypeError(f"Detections.{name} must be numeric, got {type(value).__name__}: {err}") from err
    else:
        raise TypeError(
            f"Detections.{name} must be a torch.Tensor, numpy array or list, got {type(value).__name__}"
        )
    if tensor.dtype == torch.bool or tensor.is_complex():
        held = "integer class ids" if name == "labels" else "real numbers"
        raise TypeError(f"Detections.{name} must hold {held} (an integer or floating-point dtype), got dtype {tensor.dtype}")
    converted = tensor.to(device=device if device is not None else tensor.device, dtype=dtype or tensor.dtype)
    if tensor.dtype == torch.float64 and converted.dtype == torch.float32:
        # a finite float64 beyond float32's range would become inf and be reported as a value never passed
        overflow = torch.isinf(converted).reshape(-1) & torch.isfinite(tensor).reshape(-1).to(converted.device)
        if bool(overflow.any()):
            i = int(overflow.nonzero()[0])
            at = ", ".join(str(int(k)) for k in np.unravel_index(i, tuple(tensor.shape)))
            raise ValueError(
                f"Detections.{name}[{at}] = {tensor.reshape(-1)[i].item():g} is beyond float32's range "
                f"(±{torch.finfo(torch.float32).max:.4g})"
            )
    return converted


def check_xyxy(boxes: Tensor, name: str, hint: str = "") -> None:
    """Raise ``ValueError`` naming the first box of ``boxes`` (Tensor[N, 4]) that is not finite or not xyxy
    (``x2 < x1`` or ``y2 < y1``) as ``{name}[i]``, with its values; ``hint`` ends the second message."""
    bad = ~torch.isfinite(boxes).all(dim=1)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"{name}[{i}] is not finite: {boxes[i].tolist()}")
    inverted = (boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])
    if inverted.any():
        i = int(inverted.nonzero()[0])
        raise ValueError(f"{name}[{i}] = {boxes[i].tolist()} has x2 < x1 or y2 < y1; boxes must be xyxy{hint}")


#: How far past the image's far edges a box may end, as a share of the side (plus a pixel for rounding),
#: before the image size it was given for is taken to be wrong. Torchvision's and Ultralytics' detectors
#: clip their boxes to the image, but others (DETR's post-processing, a raw decoder) leave them a little
#: past its edges; sides swapped overshoot by a quarter or more for a 4:3 or 16:9 image.
BOX_SLACK = 0.1


def check_boxes_inside(detections: Detections, given: str) -> None:
    """Raise where a box starts beyond the image (``x1 >= width`` or ``y1 >= height``), or ends past its far
    edge by more than :data:`BOX_SLACK` of the side and a pixel: detectors give boxes inside the image they
    ran on, or a little past its edges, so the size a caller gave (``given``, the argument's name) is not
    the image's, most often ``(width, height)`` passed for ``(height, width)``. Fusion would clip such boxes
    to the wrong size (to nothing, for a box that starts beyond it).

    Raises:
        ValueError: naming the first such box, the size and the order it must be in.
    """
    if not len(detections):
        return
    height, width = detections.image_size
    boxes = detections.boxes
    starts = (boxes[:, 0] >= width) | (boxes[:, 1] >= height)
    ends = (boxes[:, 2] > width * (1 + BOX_SLACK) + 1) | (boxes[:, 3] > height * (1 + BOX_SLACK) + 1)
    if not bool((starts | ends).any()):
        return
    k = int((starts | ends).nonzero()[0, 0])
    box = [round(float(v), 1) for v in boxes[k].tolist()]
    where = "starts beyond" if bool(starts[k]) else "ends past"
    raise ValueError(
        f"box {k} {box} {where} the {width}x{height} (width x height) image that {given}=({height}, {width}) "
        f"gives; {given} is (height, width) of the image the boxes were found on, e.g. image.shape[:2]"
        + ("" if bool(starts[k]) else "; boxes that do run past their image's edges are clipped to it first")
    )


def compute_device(device: torch.device) -> torch.device:
    """Where float64 work can run: the input device, or the CPU for backends without float64 (MPS)."""
    return device if device.type in ("cpu", "cuda") else torch.device("cpu")


def _is_device(device: Any) -> bool:
    """Whether ``device`` is of a type that names a device (a torch.device, a name, a CUDA index)."""
    return isinstance(device, (torch.device, str, numbers.Integral)) and not isinstance(device, (bool, np.bool_))


def _as_torch_device(device: Any) -> Any:
    """``device`` as torch takes it: a NumPy integer (a CUDA index) as a Python int, which torch wants."""
    return int(device) if isinstance(device, numbers.Integral) and not isinstance(device, (bool, np.bool_)) else device


def _raise_for_device(device: Any, what: str) -> None:
    """Called where torch failed to place a tensor on ``device``: a ``ValueError`` naming ``what`` when this
    machine lacks that device, since torch's own error ("Found no NVIDIA driver on your system", "Torch not
    compiled with CUDA enabled", an unknown device type) names neither the argument nor a way out."""
    check_device(f"cuda:{device}" if isinstance(device, numbers.Integral) else device, what)


def _is_whole(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, numbers.Integral) or (isinstance(value, numbers.Real) and float(value).is_integer())


def _validate_image_size(image_size: Any) -> tuple[int, int]:
    if isinstance(image_size, (Tensor, np.ndarray)):
        image_size = image_size.tolist()
    if not isinstance(image_size, (tuple, list)) or len(image_size) != 2:
        raise ValueError(f"Detections.image_size must be (height, width), got {image_size!r}")
    # sizes[i] of a [B, 2] size tensor unpacks into 0-d tensors: numbers like any other
    height, width = (side.item() if isinstance(side, (Tensor, np.ndarray)) and side.ndim == 0 else side for side in image_size)
    if not (_is_whole(height) and _is_whole(width)):
        raise TypeError(f"Detections.image_size must hold integers (height, width), got {image_size!r}")
    height, width = int(height), int(width)
    if not (0 < height <= MAX_IMAGE_SIDE and 0 < width <= MAX_IMAGE_SIDE):
        raise ValueError(
            f"Detections.image_size must be positive (height, width) of at most {MAX_IMAGE_SIDE} pixels, "
            f"got ({height}, {width})"
        )
    return height, width


def _check_source(source: Any) -> None:
    if source is not None and not isinstance(source, str):
        raise TypeError(f"Detections.source must be a string or None, got {type(source).__name__}: {source!r}")


def _check_labels(labels: Tensor) -> None:
    """Raise unless every label is a whole number in ``[0, MAX_LABEL]`` (one vectorized test).

    Integer labels are compared as they are: a round trip through float64 would silently change ids
    above 2**53, and a float label such as inf or 1e30 would become a negative int64.
    """
    if labels.is_floating_point():
        labels = labels.to(torch.float64)  # float32 cannot hold MAX_LABEL exactly
        bad = ~((labels >= 0) & (labels <= MAX_LABEL) & (labels == labels.round()))  # NaN is bad too
    else:
        # compared in int64: in int8 or int16 MAX_LABEL wraps to -1, and uint16..uint64 have no comparisons;
        # a uint64 above 2**63 - 1 wraps to a negative number, refused too
        wide = labels.to(torch.int64)
        bad = (wide < 0) | (wide > MAX_LABEL)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"Detections.labels[{i}] = {labels[i].item()} is not an integer class id in [0, {MAX_LABEL}]"
        )


@dataclass(eq=False)
class Detections:
    """Boxes found in one image by one detector (or fused from several).

    Args:
        boxes (Tensor[K, 4]): ``x1, y1, x2, y2`` in absolute pixels, ``x1 <= x2`` and ``y1 <= y2``, finite.
            Boxes may extend past the image border (detectors and test-time views produce them);
            :meth:`clip` bounds them and every fuser's output is clipped.
        scores (Tensor[K]): confidences in ``[0, 1]``.
        labels (Tensor[K]): int64 class ids in ONE label space (a dataset's category ids), in
            ``[0, MAX_LABEL]`` (int32); integer-valued floats are accepted, other floats are an error.
        image_size (tuple[int, int]): ``(height, width)`` of the image in pixels, each in ``[1, MAX_IMAGE_SIDE]``.
        source (str | None): where the detections came from (model name, ``"fused:wbf"``, ...).

    Empty (K = 0) is a normal case: ``boxes`` of shape [0, 4] (or any empty array), ``scores`` and
    ``labels`` of shape [0]. Anything outside these ranges raises ``ValueError`` (``TypeError`` for a wrong
    type) naming the field, the index and the value; nothing is silently clipped or converted.

    Numpy arrays and lists are accepted and converted (boxes and scores to float32, labels to int64);
    tensors keep their device, but for scores and labels on another device than the boxes, which move to
    the boxes' device. detens never writes into its inputs. An input already of that dtype (a
    float32 tensor or numpy array of boxes or scores, an int64 one of labels) is not copied: the Detections
    shares its memory, as ``torch.as_tensor`` does, so writing into one changes the other; pass a copy to
    keep them apart. Other inputs are converted into fresh tensors, numpy arrays in another byte order than
    the machine's (``dtype('>f4')``) and read-only ones (``np.frombuffer``) included: they hold the same values.
    """

    boxes: Tensor
    scores: Tensor
    labels: Tensor
    image_size: tuple[int, int]
    source: str | None = field(default=None)

    def __post_init__(self) -> None:
        boxes = _as_tensor(self.boxes, "boxes", torch.float32)
        device = boxes.device
        scores = _as_tensor(self.scores, "scores", torch.float32, device)
        labels = _as_tensor(self.labels, "labels", None, device)
        self.image_size = _validate_image_size(self.image_size)
        _check_source(self.source)

        if boxes.ndim == 1 and boxes.numel() == 0:
            boxes = boxes.reshape(0, 4)
        if boxes.ndim != 2 or boxes.shape[1] != 4:
            raise ValueError(f"Detections.boxes must have shape [K, 4], got {list(boxes.shape)}")
        num_boxes = boxes.shape[0]
        for name, tensor in (("scores", scores), ("labels", labels)):
            if tensor.shape != (num_boxes,):
                raise ValueError(
                    f"Detections.{name} must have shape [K] = [{num_boxes}] to match boxes, got {list(tensor.shape)}"
                )
        if num_boxes:
            check_xyxy(boxes, "Detections.boxes",
                       " (convert xywh or cxcywh boxes with torchvision.ops.box_convert first)")
            bad = ~torch.isfinite(scores) | (scores < 0) | (scores > 1)
            if bad.any():
                i = int(bad.nonzero()[0])
                raise ValueError(f"Detections.scores[{i}] = {float(scores[i])} is outside [0, 1]")
            _check_labels(labels)
        self.boxes = boxes
        self.scores = scores
        self.labels = labels.to(torch.int64)

    # ----------------------------------------------------------------------------------------- constructors
    @classmethod
    def empty(
        cls, image_size: tuple[int, int], source: str | None = None, device: torch.device | str | None = None
    ) -> Detections:
        """No detections: the normal answer for an image where nothing was found.

        Raises:
            TypeError: ``device`` is neither None nor a device. ValueError: ``image_size`` is not a valid
                ``(height, width)``, or ``device`` is no device of this machine.
        """
        if device is not None and not _is_device(device):
            raise TypeError(
                f"Detections.empty: device must be a device (torch.device, 'cuda:0', ...) or None, got {device!r}"
            )
        device = _as_torch_device(device)
        try:
            boxes = torch.zeros((0, 4), device=device)
        except (RuntimeError, AssertionError):
            _raise_for_device(device, "Detections.empty: device")
            raise
        if boxes.is_meta:  # torch places tensors there, without values
            _raise_for_device(device, "Detections.empty: device")
        return cls(
            boxes,
            torch.zeros((0,), device=device),
            torch.zeros((0,), dtype=torch.int64, device=device),
            image_size,
            source,
        )

    @classmethod
    def concat(cls, items: Iterable[Detections], source: str | None = None) -> Detections:
        """Stack detections of the SAME image (e.g. several models) into one, with ``source`` as its source.

        Raises:
            TypeError: ``items`` is no list of Detections. ValueError: no item, or items of different image
                sizes.
        """
        if isinstance(items, Detections) or not isinstance(items, Iterable):
            raise TypeError(f"Detections.concat takes a list of Detections, got {type(items).__name__}")
        items = list(items)  # a generator is read once, by the checks below and by the stacking alike
        for i, item in enumerate(items):
            if not isinstance(item, Detections):
                raise TypeError(f"Detections.concat: items[{i}] must be Detections, got {type(item).__name__}")
        if not items:
            raise ValueError("Detections.concat needs at least one Detections to know the image size")
        sizes = {d.image_size for d in items}
        if len(sizes) != 1:
            raise ValueError(f"Detections.concat got different image sizes {sorted(sizes)}; they must be one image")
        return cls(
            torch.cat([d.boxes for d in items]),
            torch.cat([d.scores for d in items]),
            torch.cat([d.labels for d in items]),
            items[0].image_size,
            source,
        )

    # ------------------------------------------------------------------------------------------- protocol
    def __len__(self) -> int:
        return int(self.boxes.shape[0])

    def __getitem__(self, index: int | slice | Tensor | np.ndarray | Sequence[int]) -> Detections:
        """Select boxes by int, slice, boolean mask [K] or integer indices; always returns Detections."""
        if isinstance(index, (np.ndarray, list, tuple)):
            try:
                array = torch_ready_array(np.asarray(index))
            except ValueError as err:  # a ragged list: numpy's message names no argument
                raise ValueError(f"a Detections index must be flat (one int or bool per box), got {index!r}") from err
            index = torch.as_tensor(array if array.size else array.astype(np.int64))
        if isinstance(index, Tensor) and index.ndim == 0 and not index.is_floating_point() and index.dtype != torch.bool:
            index = int(index)
        if isinstance(index, numbers.Integral) and not isinstance(index, (bool, np.bool_)):
            if not -len(self) <= index < len(self):
                raise IndexError(f"Detections index {int(index)} is out of range for {len(self)} boxes")
            index = int(index) % len(self)
            index = slice(index, index + 1)
        if isinstance(index, slice):
            if index.step is not None and index.step < 0:  # tensors have no negative strides: gather instead
                index = torch.tensor(range(len(self))[index], dtype=torch.int64)
        elif isinstance(index, Tensor):
            if index.is_floating_point() or index.is_complex():
                raise TypeError(f"Detections indices must be integers or a boolean mask, got dtype {index.dtype}")
            if index.ndim != 1:
                raise IndexError(f"Detections indices must be one-dimensional, got shape {list(index.shape)}")
            if index.dtype == torch.bool and index.shape != (len(self),):
                raise IndexError(f"boolean mask must have shape [{len(self)}], got {list(index.shape)}")
            if index.dtype != torch.bool:
                index = index.long()  # torch reads uint8 indices as a mask
            index = index.to(self.boxes.device)
        else:
            raise TypeError(
                f"Detections indices are an int, a slice, a boolean mask or integer indices, got {type(index).__name__}"
            )
        return self._derived(self.boxes[index], self.scores[index], self.labels[index])

    def __repr__(self) -> str:
        return (
            f"Detections(num_boxes={len(self)}, image_size={self.image_size}, source={self.source!r}, "
            f"device={self.device})"
        )

    @property
    def device(self) -> torch.device:
        """The device of the tensors."""
        return self.boxes.device

    @property
    def height(self) -> int:
        """The image's height in pixels."""
        return self.image_size[0]

    @property
    def width(self) -> int:
        """The image's width in pixels."""
        return self.image_size[1]

    def to(self, device: torch.device | str) -> Detections:
        """The same detections on ``device`` (boxes and scores stay float32, labels int64).

        Raises:
            TypeError: ``device`` is no device (a dtype, a float): boxes and scores stay float32.
            ValueError: ``device`` is not a device name, or one this machine lacks (``"cuda"`` without a GPU).
        """
        if not _is_device(device):
            raise TypeError(
                f"Detections.to takes a device (torch.device, 'cuda:0', ...), got {device!r}: boxes and scores "
                "are always float32 and labels int64"
            )
        device = _as_torch_device(device)
        try:
            boxes = self.boxes.to(device)
        except (RuntimeError, AssertionError):
            _raise_for_device(device, "Detections.to: device")
            raise
        if boxes.is_meta:  # torch places tensors there, without values
            _raise_for_device(device, "Detections.to: device")
        return self._derived(boxes, self.scores.to(device), self.labels.to(device))

    def with_source(self, source: str | None) -> Detections:
        """The same detections (sharing their tensors) with ``source`` as their source.

        Raises:
            TypeError: ``source`` is neither a string nor None.
        """
        _check_source(source)
        renamed = self._derived(self.boxes, self.scores, self.labels)
        renamed.source = source
        return renamed

    def _derived(self, boxes: Tensor, scores: Tensor, labels: Tensor) -> Detections:
        """Detections of tensors derived from this one's (a subset, a device move, clipped boxes).

        They are valid by construction, so validation is skipped: it would cost more than the operation
        on the small per-image inputs that fusion handles.
        """
        derived = object.__new__(Detections)
        derived.boxes, derived.scores, derived.labels = boxes, scores, labels
        derived.image_size, derived.source = self.image_size, self.source
        return derived

    def clip(self) -> Detections:
        """Boxes clipped to the image; boxes left with zero area are kept (filter with ``area() > 0``)."""
        height, width = self.image_size
        # out of place, so that boxes that require grad stay differentiable
        boxes = torch.minimum(self.boxes.clamp(min=0), self.boxes.new_tensor([width, height, width, height]))
        return self._derived(boxes, self.scores, self.labels)

    def area(self) -> Tensor:
        """Tensor[K]: box areas in square pixels."""
        return (self.boxes[:, 2] - self.boxes[:, 0]) * (self.boxes[:, 3] - self.boxes[:, 1])

    def sort_by_score(self) -> Detections:
        """The detections sorted by score, highest first; equal scores keep their order (a stable sort)."""
        order = torch.argsort(self.scores, descending=True, stable=True)
        return self[order]

    def normalized_boxes(self) -> Tensor:
        """Tensor[K, 4]: boxes divided by (width, height, width, height)."""
        height, width = self.image_size
        scale = self.boxes.new_tensor([width, height, width, height])
        return self.boxes / scale

    # ---------------------------------------------------------------------------------------- supervision
    def to_supervision(self, class_names: Mapping[int, str] | None = None) -> Any:
        """A ``supervision.Detections`` of these boxes: ``xyxy``, ``confidence``, ``class_id`` = ``labels``.

        ``class_names`` (``{label: name}``, or a list whose positions are the labels) fills
        ``data["class_name"]``. Needs ``detens[supervision]``;
        see :func:`detens.interop.supervision.to_supervision`.
        """
        from detens.interop.supervision import to_supervision

        return to_supervision(self, class_names)

    @classmethod
    def from_supervision(
        cls, sv_detections: Any, image_size: tuple[int, int], source: str | None = None
    ) -> Detections:
        """Detections of a ``supervision.Detections`` (``class_id`` become the labels) of an image of
        ``image_size`` ``(height, width)``, which supervision does not record.

        See :func:`detens.interop.supervision.from_supervision`.
        """
        from detens.interop.supervision import from_supervision

        return from_supervision(sv_detections, image_size, source)

    def numpy(self) -> dict[str, np.ndarray]:
        """``{"boxes": [K, 4] float32, "scores": [K] float32, "labels": [K] int64}``: numpy arrays on the
        CPU (detached; on the CPU they share memory with the tensors)."""
        return {
            "boxes": self.boxes.detach().cpu().numpy(),
            "scores": self.scores.detach().cpu().numpy(),
            "labels": self.labels.detach().cpu().numpy(),
        }
