"""Test-time augmentation: each view of the image (flipped, rescaled, ...) is one ensemble member.

Views are built with albumentations and applied to the image; the boxes a detector finds in the view
are mapped back to the original image exactly (the inverse of the view's geometry), so the views'
detections can be fused like those of different models.

View specifications (strings, as in ensemble YAMLs), combined with ``+``:

- ``identity``: the image as is;
- ``hflip`` / ``vflip``: mirrored left-right / upside down;
- ``scale=F`` (``F > 0``): resized by ``F``; for ``F < 1`` the result is padded back to the original
  size (bottom/right, gray 114), so a detector that resizes every input to a fixed size (YOLO's
  ``imgsz``) sees the objects ``F`` times smaller, as in Ultralytics' own TTA. ``F > 1`` enlarges the
  image (useful for detectors whose input size follows the image, e.g. torchvision with ``imgsz`` unset).

Example: ``["identity", "hflip", "scale=0.83", "hflip+scale=0.67"]``.
"""

from __future__ import annotations

import inspect
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import torch
from torch import Tensor

from detens.adapters._base import BaseDetector, Detector, ImageInput, as_image_list, detect_loaded, load_image
from detens.detections import Detections

__all__ = ["View", "AugmentedView", "AugmentedDetector"]

_PAD_VALUE = 114


def _albumentations() -> Any:
    # albumentations checks PyPI for a newer version on import unless told not to: never in detens.
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    import albumentations

    return albumentations


@dataclass(frozen=True)
class View:
    """One test-time view: optional flips, then a rescale (with padding back to size when shrinking).

    Args:
        hflip (bool): mirror left-right.
        vflip (bool): mirror upside down.
        scale (float): resize factor (``> 0``).
    """

    hflip: bool = False
    vflip: bool = False
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not (
            isinstance(self.scale, (int, float)) and math.isfinite(self.scale) and 0.05 <= self.scale <= 20
        ):
            raise ValueError(f"view scale must be a number in [0.05, 20], got {self.scale!r}")

    @classmethod
    def parse(cls, spec: str | View | Mapping[str, Any]) -> View:
        """A view from ``"hflip+scale=0.83"``, a mapping ``{"hflip": true, "scale": 0.83}``, or a View."""
        if isinstance(spec, View):
            return spec
        if isinstance(spec, Mapping):
            unknown = set(spec) - {"hflip", "vflip", "scale"}
            if unknown:
                raise ValueError(f"unknown view option(s) {sorted(unknown)}; valid: hflip, vflip, scale")
            return cls(
                bool(spec.get("hflip", False)), bool(spec.get("vflip", False)), float(spec.get("scale", 1.0))
            )
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(
                f"a view must be a non-empty string such as 'hflip' or 'scale=0.83', got {spec!r}"
            )
        hflip = vflip = False
        scale = 1.0
        for part in spec.replace(" ", "").lower().split("+"):
            if part in ("identity", "none", "original"):
                continue
            if part == "hflip":
                hflip = True
            elif part == "vflip":
                vflip = True
            elif match := re.fullmatch(r"scale[=:]([0-9]*\.?[0-9]+)", part):
                scale = float(match.group(1))
            else:
                raise ValueError(
                    f"unknown view {part!r} in {spec!r}; valid: identity, hflip, vflip, scale=F (e.g. scale=0.83), "
                    "combined with '+'"
                )
        return cls(hflip, vflip, scale)

    @property
    def is_identity(self) -> bool:
        return not self.hflip and not self.vflip and self.scale == 1.0

    @property
    def name(self) -> str:
        parts = [p for p, on in (("hflip", self.hflip), ("vflip", self.vflip)) if on]
        if self.scale != 1.0:
            parts.append(f"scale={self.scale:g}")
        return "+".join(parts) or "identity"

    def resized_size(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """``(height, width)`` of the image after the rescale, before any padding."""
        height, width = image_size
        return max(1, round(height * self.scale)), max(1, round(width * self.scale))

    def transform(self, image_size: tuple[int, int]) -> Any:
        """The albumentations ``Compose`` of this view for an image of ``image_size`` = ``(height, width)``."""
        A = _albumentations()
        steps = []
        if self.hflip:
            steps.append(A.HorizontalFlip(p=1.0))
        if self.vflip:
            steps.append(A.VerticalFlip(p=1.0))
        if self.scale != 1.0:
            new_h, new_w = self.resized_size(image_size)
            steps.append(A.Resize(height=new_h, width=new_w, interpolation=cv2.INTER_LINEAR, p=1.0))
            if self.scale < 1.0:
                fill_key = (
                    "fill" if "fill" in inspect.signature(A.PadIfNeeded.__init__).parameters else "value"
                )
                steps.append(
                    A.PadIfNeeded(
                        min_height=image_size[0],
                        min_width=image_size[1],
                        position="top_left",
                        border_mode=cv2.BORDER_CONSTANT,
                        p=1.0,
                        **{fill_key: _PAD_VALUE},
                    )
                )
        return A.Compose(steps)

    def apply(self, image: np.ndarray) -> np.ndarray:
        """The view of a BGR image."""
        if self.is_identity:
            return image
        return self.transform(image.shape[:2])(image=image)["image"]

    def invert_boxes(self, boxes: Tensor, image_size: tuple[int, int]) -> Tensor:
        """Boxes found in the view (Tensor[K, 4] xyxy pixels) → boxes in the original image of ``image_size``."""
        height, width = image_size
        out = boxes.to(torch.float32).clone()
        if self.scale != 1.0:
            new_h, new_w = self.resized_size(image_size)
            out[:, 0::2] *= width / new_w
            out[:, 1::2] *= height / new_h
        if self.hflip:
            out[:, [0, 2]] = width - out[:, [2, 0]]
        if self.vflip:
            out[:, [1, 3]] = height - out[:, [3, 1]]
        return out


class AugmentedView(BaseDetector):
    """A detector run on one view of each image, its boxes mapped back to the original image (clipped).

    Args:
        detector: the detector (any callable ``detector(images) -> list[Detections]`` with a ``name``).
        view (str | View): the view (see :class:`View`).
        name (str | None): display name; default ``"<detector name>|<view>"``.
    """

    def __init__(self, detector: Detector, view: str | View, name: str | None = None) -> None:
        from detens.adapters.precomputed import PrecomputedDetector

        if isinstance(detector, PrecomputedDetector):
            raise TypeError(f"{detector.name}: saved predictions cannot be re-run on augmented images")
        self.view = View.parse(view)
        self.detector = detector
        super().__init__(
            name or f"{detector.name}|{self.view.name}",
            getattr(detector, "batch", 1),
            getattr(detector, "categories", None),
        )

    def _predict(self, images: list[np.ndarray]) -> list[Detections]:
        views = [self.view.apply(image) for image in images]
        dets = detect_loaded(self.detector, views)
        out = []
        for det, image in zip(dets, images, strict=True):
            size = tuple(image.shape[:2])
            boxes = self.view.invert_boxes(det.boxes.cpu(), size)  # type: ignore[arg-type]
            out.append(Detections(boxes, det.scores.cpu(), det.labels.cpu(), size, self.name).clip())  # type: ignore[arg-type]
        return out


class AugmentedDetector:
    """Test-time augmentation of one detector: one ensemble member per view.

    Args:
        detector: the detector to augment.
        views: the views (strings such as ``"identity"``, ``"hflip"``, ``"scale=0.83"``, or :class:`View`).
            ``identity`` is the detector itself (its name unchanged).

    ``members`` holds one detector per view (for an ensemble). Calling it returns, for each image, the
    list of the views' ``Detections`` (ready for ``detens.fuse``); images are read once.
    """

    def __init__(self, detector: Detector, views: Sequence[str | View] = ("identity", "hflip")) -> None:
        if isinstance(views, (str, View)):
            views = [views]
        parsed = [View.parse(v) for v in views]
        if not parsed:
            raise ValueError("AugmentedDetector needs at least one view")
        names = [v.name for v in parsed]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"views repeat {duplicates}: each view must be different")
        self.detector = detector
        self.views = parsed
        self.name = f"{detector.name}+tta"
        self.members: list[Detector] = [
            detector if v.is_identity else AugmentedView(detector, v) for v in parsed
        ]

    def __iter__(self) -> Iterator[Detector]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def __call__(self, images: ImageInput | Sequence[ImageInput]) -> list[list[Detections]]:
        items = as_image_list(images)
        arrays = [load_image(image, i) for i, image in enumerate(items)]
        paths = [image if isinstance(image, (str, os.PathLike)) else None for image in items]
        per_view = [detect_loaded(member, arrays, paths) for member in self.members]  # [V][I]
        return [list(dets) for dets in zip(*per_view, strict=True)]

    def __repr__(self) -> str:
        return f"AugmentedDetector(detector={self.detector.name!r}, views={[v.name for v in self.views]})"
