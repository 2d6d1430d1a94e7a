"""The detector protocol and the base class every adapter builds on.

A detector is a callable ``detector(images) -> list[Detections]`` with a ``name`` (its display name):
``images`` is a list of image paths or BGR ``uint8`` numpy arrays (one path or array is accepted too),
and the answer holds one :class:`~detens.detections.Detections` per image, in order, with labels in the
label space of the dataset (COCO category ids by default) and tensors on the CPU.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from detens.adapters._labels import category_names
from detens.checks import check_integer, check_real
from detens.detections import Detections
from detens.sources import as_bgr, read_image

__all__ = [
    "ImageInput",
    "Detector",
    "BaseDetector",
    "as_image_list",
    "load_image",
    "detect_loaded",
    "check_detection_options",
    "type_name",
    "model_lock",
]

ImageInput = str | os.PathLike | np.ndarray


@runtime_checkable
class Detector(Protocol):
    """What an ensemble member is: ``detector(images) -> list[Detections]`` and a display ``name``."""

    name: str

    def __call__(self, images: Sequence[ImageInput]) -> list[Detections]: ...


def as_image_list(images: ImageInput | Sequence[ImageInput]) -> list[ImageInput]:
    """One image (path or array) or a sequence of them → a list."""
    if isinstance(images, (str, os.PathLike, np.ndarray)):
        return [images]
    if not isinstance(images, Sequence):
        raise TypeError(f"images must be a list of paths or BGR numpy arrays, got {type(images).__name__}")
    return list(images)


def load_image(image: ImageInput, index: int = 0) -> np.ndarray:
    """A path is read with OpenCV (:func:`detens.sources.read_image`); an array is checked (BGR uint8)."""
    if isinstance(image, (str, os.PathLike)):
        return read_image(Path(image))
    return as_bgr(image, where=f"images[{index}]")


class BaseDetector:
    """Reads the images, splits them into batches of ``batch``, and calls :meth:`_predict` on BGR arrays.

    Subclasses set ``name``, ``categories`` (``{category_id: name}`` of the label space, for drawing)
    and implement ``_predict(images: list[np.ndarray]) -> list[Detections]``.
    """

    name: str = "detector"
    batch: int = 1
    categories: dict[int, str]

    def __init__(self, name: str, batch: int = 1, categories: dict[int, str] | None = None) -> None:
        if not isinstance(name, str):
            raise TypeError(f"detector name must be a str, got {type(name).__name__}: {name!r}")
        if not name:
            raise ValueError("detector name must not be empty")
        self.name = name
        self.batch = check_integer(batch, "batch", 1)
        self.categories = category_names(categories)

    def __call__(self, images: ImageInput | Sequence[ImageInput]) -> list[Detections]:
        """Detect on ``images``, in batches of ``batch``.

        Args:
            images: image paths or BGR ``uint8`` arrays ``[H, W, 3]`` (one path or array is accepted too).

        Returns:
            list[Detections]: one per image, in order, in the image's own pixels.

        Raises:
            TypeError: ``images`` or an entry of it neither a path nor an array.
            ImageReadError: a file that cannot be read as an image (naming it and why).
        """
        items = as_image_list(images)
        out: list[Detections] = []
        for start in range(0, len(items), self.batch):
            chunk = items[start : start + self.batch]
            arrays = [load_image(image, start + i) for i, image in enumerate(chunk)]
            paths = [image if isinstance(image, (str, os.PathLike)) else None for image in chunk]
            out.extend(self.predict_arrays(arrays, paths))
        return out

    def predict_arrays(
        self, images: Sequence[np.ndarray], paths: Sequence[str | os.PathLike | None] | None = None
    ) -> list[Detections]:
        """Detections of images already read (BGR uint8 ``[H, W, 3]``), in batches of ``batch``.

        ``paths`` (optional) name the images; detectors that find results by file name need them.
        """
        out: list[Detections] = []
        for start in range(0, len(images), self.batch):
            chunk = list(images[start : start + self.batch])
            dets = self._predict(chunk)
            if len(dets) != len(chunk):
                raise RuntimeError(f"{self.name}: got {len(dets)} results for {len(chunk)} images")
            out.extend(dets)
        return out

    def _predict(self, images: list[np.ndarray]) -> list[Detections]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def detect_loaded(
    detector: Detector, images: Sequence[np.ndarray], paths: Sequence[Any] | None = None
) -> list[Detections]:
    """Run any detector on already-read images (``predict_arrays`` when it has one, else ``detector(images)``).

    ``paths`` (optional) name the images, for detectors that replay saved predictions by file name.
    """
    predict_arrays = getattr(detector, "predict_arrays", None)
    if predict_arrays is not None:
        dets = predict_arrays(images, paths)
    else:
        dets = list(detector(list(images)))
    if len(dets) != len(images):
        raise RuntimeError(
            f"{getattr(detector, 'name', detector)!r} returned {len(dets)} results for {len(images)} images"
        )
    return dets


def check_detection_options(conf: float, iou: float | None, max_det: int) -> tuple[float, float | None, int]:
    """The options every model-running adapter shares, as Python numbers (NumPy ones converted: the
    detector libraries' own checks want a real ``int``): ``conf`` in [0, 1], ``iou`` in (0, 1] (None: the
    model's own), ``max_det`` a positive integer; a value of another kind is a ``TypeError`` and one out of
    range a ``ValueError``, naming the option."""
    conf = check_real(conf, "conf", 0.0, 1.0)
    if iou is not None:
        iou = check_real(iou, "iou", 0.0, 1.0, low_open=True)
    return conf, iou, check_integer(max_det, "max_det", 1)


def require_nms_iou(iou: float | None, nms: str) -> float:
    """``iou`` as :func:`check_detection_options` returns it, for an adapter whose model has no IoU threshold
    of its own to fall back on (``nms`` names the NMS that runs with it): None is a ``TypeError`` naming the
    option, where passed on it would fail inside the library with a message that names none."""
    if iou is None:
        raise TypeError(f"iou must be a number in (0, 1], the IoU threshold of {nms}, got None")
    return iou


def type_name(obj: Any) -> str:
    """``obj``'s type for error messages: ``int``, ``torchvision.models.resnet.ResNet``."""
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


#: one lock per loaded model object, by its id (a model need not be hashable), for as long as the model lives
_MODEL_LOCKS: dict[int, threading.Lock] = {}
_MODEL_LOCKS_GUARD = threading.Lock()


def model_lock(model: Any) -> threading.Lock:
    """The lock of a loaded ``model``, the same for every detector that calls that model object.

    Held around the part of a prediction that changes the model's own state for the length of a call
    (Ultralytics' predictor takes each call's options into the model; the torchvision adapter swaps the
    model's thresholds, input size and post-processing in and out): several threads calling one detector,
    or detectors that share one model, would otherwise run with one another's settings. Reading images and
    making Detections stay outside it, so threads overlap there and in other members.
    """
    key = id(model)
    with _MODEL_LOCKS_GUARD:
        lock = _MODEL_LOCKS.get(key)
        if lock is None:
            lock = _MODEL_LOCKS[key] = threading.Lock()
            # gone with the model, whose id another object may take then; dict.pop needs no guard, which
            # the collection that runs this may interrupt a holder of
            weakref.finalize(model, _MODEL_LOCKS.pop, key, None)
        return lock
