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
- ``tiles=RxC``: the image cut into ``R`` rows and ``C`` columns of overlapping tiles, each run alone, so
  that a fixed-size detector sees the objects larger (small objects); ``overlap=F`` (default 0.4) is the
  fraction of a tile that its neighbour shares. The other parts of the view apply to each tile. Boxes cut
  by a tile edge inside the image are dropped and the rest merged by class-wise NMS
  (:mod:`detens.adapters._tiles`): large objects are left to the untiled members.

Example: ``["identity", "hflip", "scale=0.83", "hflip+scale=0.67", "tiles=2x2"]``.
"""

from __future__ import annotations

import inspect
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
from detens.adapters._tiles import cut_by_inner_edges, merge_tiles, tile_windows
from detens.checks import check_flag, check_integer, check_real
from detens.detections import Detections

__all__ = ["View", "AugmentedView", "AugmentedDetector", "parse_views"]

_PAD_VALUE = 114
_MAX_TILES = 8
_OPTIONS = ("hflip", "vflip", "scale", "tiles", "overlap")
#: The default share of a tile that its neighbour covers: 2x2 tiles of 0.625 the image's height and width.
DEFAULT_OVERLAP = 0.4


def _parse_tiles(text: str, spec: str) -> tuple[int, int]:
    """``"2x3"`` → ``(2, 3)`` (rows, cols)."""
    match = re.fullmatch(r"([0-9]+)x([0-9]+)", text.strip().lower())
    if match is None:
        raise ValueError(f"view tiles must be written ROWSxCOLS (e.g. tiles=2x2), got {text!r} in {spec!r}")
    return int(match.group(1)), int(match.group(2))


def _albumentations() -> Any:
    # albumentations checks PyPI for a newer version on import unless told not to: never in detens.
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    import albumentations

    return albumentations


def _exact(value: float) -> str:
    """The shortest decimal that reads back as ``value``, without an exponent (``0.83``, ``2``,
    ``0.8333333``): a view's name must parse back to the same view, and member names are built from it."""
    return np.format_float_positional(value, trim="-")


@dataclass(frozen=True)
class View:
    """One test-time view: optional flips, then a rescale (with padding back to size when shrinking), of
    the whole image or of each of its tiles.

    Args:
        hflip (bool): mirror left-right.
        vflip (bool): mirror upside down.
        scale (float): resize factor (``> 0``).
        tiles (tuple[int, int]): ``(rows, cols)`` of tiles, each in ``[1, 8]``; ``(1, 1)``: the whole image.
        overlap (float): the fraction of a tile shared with its neighbour, in ``[0, 0.9]``; tiled views only.
    """

    hflip: bool = False
    vflip: bool = False
    scale: float = 1.0
    tiles: tuple[int, int] = (1, 1)
    overlap: float = DEFAULT_OVERLAP

    def __post_init__(self) -> None:
        # bools and strings are refused, not read: {"hflip": "false"} would otherwise mirror the image
        object.__setattr__(self, "hflip", check_flag(self.hflip, "view hflip"))
        object.__setattr__(self, "vflip", check_flag(self.vflip, "view vflip"))
        object.__setattr__(self, "scale", check_real(self.scale, "view scale", 0.05, 20))
        object.__setattr__(self, "overlap", check_real(self.overlap, "view overlap", 0.0, 0.9))
        if not isinstance(self.tiles, (tuple, list)):
            raise TypeError(
                f"view tiles must be (rows, cols), each an integer in [1, {_MAX_TILES}], "
                f"got {type(self.tiles).__name__}: {self.tiles!r}"
            )
        if len(self.tiles) != 2:
            raise ValueError(f"view tiles must be (rows, cols), each an integer in [1, {_MAX_TILES}], got {self.tiles!r}")
        rows, cols = self.tiles
        rows = check_integer(rows, "view tiles rows", 1, _MAX_TILES)
        cols = check_integer(cols, "view tiles cols", 1, _MAX_TILES)
        object.__setattr__(self, "tiles", (rows, cols))
        if not self.tiled and self.overlap != DEFAULT_OVERLAP:
            raise ValueError(f"view overlap={self.overlap:g} needs tiles (e.g. 'tiles=2x2+overlap={self.overlap:g}')")

    @classmethod
    def parse(cls, spec: str | View | Mapping[str, Any]) -> View:
        """A view from ``"hflip+scale=0.83"``, ``"tiles=2x2+overlap=0.25"``, a mapping ``{"hflip": true,
        "scale": 0.83, "tiles": [2, 2]}``, or a View."""
        if isinstance(spec, View):
            return spec
        if isinstance(spec, Mapping):
            unknown = set(spec) - set(_OPTIONS)
            if unknown:
                raise ValueError(f"unknown view option(s) {sorted(unknown)}; valid: {', '.join(_OPTIONS)}")
            tiles = spec.get("tiles", (1, 1))
            if isinstance(tiles, str):
                tiles = _parse_tiles(tiles, str(dict(spec)))
            return cls(
                spec.get("hflip", False),
                spec.get("vflip", False),
                spec.get("scale", 1.0),
                tiles,
                spec.get("overlap", DEFAULT_OVERLAP),
            )
        if not isinstance(spec, str):
            raise TypeError(
                "a view must be a string such as 'hflip' or 'scale=0.83', a mapping or a View, got "
                f"{type(spec).__name__}: {spec!r}"
            )
        if not spec.strip():
            raise ValueError(f"a view must be a non-empty string such as 'hflip' or 'scale=0.83', got {spec!r}")
        hflip = vflip = False
        scale, tiles, overlap = 1.0, (1, 1), DEFAULT_OVERLAP
        given: set[str] = set()
        for part in spec.replace(" ", "").lower().split("+"):
            if part in ("identity", "none", "original"):
                continue
            option = re.split("[=:]", part, maxsplit=1)[0]
            if option in given:
                # 'scale=0.5+scale=0.8' would take the last value, 'hflip+hflip' flip once: a typo either way
                raise ValueError(f"view {spec!r} gives {option} twice; give each of {', '.join(_OPTIONS)} once")
            given.add(option)
            if part == "hflip":
                hflip = True
            elif part == "vflip":
                vflip = True
            elif match := re.fullmatch(r"scale[=:]([0-9]*\.?[0-9]+)", part):
                scale = float(match.group(1))
            elif match := re.fullmatch(r"tiles[=:](.*)", part):
                tiles = _parse_tiles(match.group(1), spec)
            elif match := re.fullmatch(r"overlap[=:]([0-9]*\.?[0-9]+)", part):
                overlap = float(match.group(1))
            else:
                raise ValueError(
                    f"unknown view {part!r} in {spec!r}; valid: identity, hflip, vflip, scale=F (e.g. scale=0.83), "
                    "tiles=RxC (e.g. tiles=2x2), overlap=F, combined with '+'"
                )
        return cls(hflip, vflip, scale, tiles, overlap)

    @property
    def tiled(self) -> bool:
        return self.tiles != (1, 1)

    @property
    def is_identity(self) -> bool:
        return not self.hflip and not self.vflip and self.scale == 1.0 and not self.tiled

    @property
    def name(self) -> str:
        parts = [p for p, on in (("hflip", self.hflip), ("vflip", self.vflip)) if on]
        if self.scale != 1.0:
            parts.append(f"scale={_exact(self.scale)}")
        if self.tiled:
            parts.append(f"tiles={self.tiles[0]}x{self.tiles[1]}")
            if self.overlap != DEFAULT_OVERLAP:
                parts.append(f"overlap={_exact(self.overlap)}")
        return "+".join(parts) or "identity"

    @property
    def per_tile(self) -> View:
        """What is done to each tile: this view without its tiling."""
        return View(self.hflip, self.vflip, self.scale)

    def windows(self, image_size: tuple[int, int]) -> list[tuple[int, int, int, int]]:
        """The tiles ``(x1, y1, x2, y2)`` of an image of ``image_size`` (the whole image when untiled)."""
        return tile_windows(image_size, *self.tiles, self.overlap)

    def _untiled(self, what: str) -> None:
        if self.tiled:
            raise ValueError(f"view {self.name!r} is tiled: {what} each of its windows() with its per_tile view")

    def resized_size(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """``(height, width)`` of the image after the rescale, before any padding."""
        height, width = image_size
        return max(1, round(height * self.scale)), max(1, round(width * self.scale))

    def transform(self, image_size: tuple[int, int]) -> Any:
        """The albumentations ``Compose`` of this view for an image of ``image_size`` = ``(height, width)``."""
        self._untiled("transform")
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
        self._untiled("apply")
        if self.is_identity:
            return image
        return self.transform(image.shape[:2])(image=image)["image"]

    def invert_boxes(self, boxes: Tensor, image_size: tuple[int, int]) -> Tensor:
        """Boxes found in the view (Tensor[K, 4] xyxy pixels) → boxes in the original image of ``image_size``."""
        self._untiled("invert boxes of")
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
        merge_iou (float): tiled views: the IoU of the class-wise NMS that merges the tiles' boxes (the
            detector's own NMS IoU, as an ensemble YAML's ``iou`` gives it).
        max_det (int | None): tiled views: at most this many merged boxes per image; None: no limit.
    """

    def __init__(
        self,
        detector: Detector,
        view: str | View,
        name: str | None = None,
        merge_iou: float = 0.7,
        max_det: int | None = 300,
    ) -> None:
        from detens.adapters.precomputed import PrecomputedDetector

        if isinstance(detector, PrecomputedDetector):
            raise TypeError(f"{detector.name}: saved predictions cannot be re-run on augmented images")
        check_real(merge_iou, "merge_iou", 0.0, 1.0, low_open=True)
        if max_det is not None:
            check_integer(max_det, "max_det", 1)
        self.view = View.parse(view)
        self.detector = detector
        self.merge_iou, self.max_det = float(merge_iou), max_det
        super().__init__(
            name if name is not None else f"{detector.name}|{self.view.name}",
            getattr(detector, "batch", 1),
            getattr(detector, "categories", None),
        )

    def _predict(self, images: list[np.ndarray]) -> list[Detections]:
        per_tile = self.view.per_tile
        windows = [self.view.windows(tuple(image.shape[:2])) for image in images]  # type: ignore[arg-type]
        crops = [
            per_tile.apply(np.ascontiguousarray(image[y1:y2, x1:x2]))
            for image, image_windows in zip(images, windows, strict=True)
            for x1, y1, x2, y2 in image_windows
        ]
        found = iter(detect_loaded(self.detector, crops))
        return [
            self._assemble(image, image_windows, per_tile, found)
            for image, image_windows in zip(images, windows, strict=True)
        ]

    def _assemble(
        self, image: np.ndarray, windows: list[tuple[int, int, int, int]], per_tile: View, found: Iterator[Detections]
    ) -> Detections:
        """One image's Detections from those of its windows (the next ``len(windows)`` of ``found``, each
        seen through ``per_tile``)."""
        size = tuple(image.shape[:2])
        boxes, scores, labels = [], [], []
        for window in windows:
            det = next(found)
            x1, y1, x2, y2 = window
            # on the detector's own device: the identity view is the detector itself, and fuse needs one device
            tile_boxes = per_tile.invert_boxes(det.boxes, (y2 - y1, x2 - x1))
            tile_boxes += torch.tensor([x1, y1, x1, y1], dtype=tile_boxes.dtype, device=tile_boxes.device)
            keep = ~cut_by_inner_edges(tile_boxes, window, size)  # type: ignore[arg-type]
            boxes.append(tile_boxes[keep])
            scores.append(det.scores[keep])
            labels.append(det.labels[keep])
        merged = Detections(torch.cat(boxes), torch.cat(scores), torch.cat(labels), size, self.name)  # type: ignore[arg-type]
        if self.view.tiled:
            merged = merged[merge_tiles(merged.boxes, merged.scores, merged.labels, self.merge_iou, self.max_det)]
        return merged.clip()


def parse_views(views: Sequence[str | View]) -> list[View]:
    """Each of ``views`` parsed (:meth:`View.parse`), every one different: two spellings of one view
    (``hflip``, ``HFLIP``) would run the same member twice under one name.

    Raises:
        ValueError: a view that does not parse, or one given twice (naming it).
    """
    parsed = [View.parse(v) for v in views]
    names = [v.name for v in parsed]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"views repeat {duplicates}: each view must be different")
    return parsed


class AugmentedDetector:
    """Test-time augmentation of one detector: one ensemble member per view.

    Args:
        detector: the detector to augment.
        views: the views (strings such as ``"identity"``, ``"hflip"``, ``"scale=0.83"``, ``"tiles=2x2"``, or
            :class:`View`; one view alone is taken as a list of one). ``identity`` is the detector itself (its
            name unchanged).
        merge_iou (float), max_det (int | None): how tiled views merge their tiles' boxes (:class:`AugmentedView`).

    ``members`` holds one detector per view (for an ensemble). Calling it returns, for each image, the
    list of the views' ``Detections`` (ready for ``detens.fuse``); images are read once.

    Raises:
        TypeError: ``detector`` is no detector, or one of saved predictions given a view other than
            ``identity`` (saved predictions cannot see augmented images); ``views`` is neither a view nor a
            list of them.
        ValueError: no view, a view that is none of the forms above (listing them), or one given twice.
    """

    def __init__(
        self,
        detector: Detector,
        views: Sequence[str | View] = ("identity", "hflip"),
        merge_iou: float = 0.7,
        max_det: int | None = 300,
    ) -> None:
        if not callable(detector) or not isinstance(getattr(detector, "name", None), str):
            raise TypeError(f"detector must be a detector (callable, with a name), got {type(detector).__name__}")
        if isinstance(views, (str, View)):
            views = [views]
        if not isinstance(views, Sequence):
            raise TypeError(f"views must be a list of views ('hflip', 'scale=0.83', ...), got {type(views).__name__}")
        parsed = parse_views(views)
        if not parsed:
            raise ValueError("AugmentedDetector needs at least one view")
        self.detector = detector
        self.views = parsed
        self.name = f"{detector.name}+tta"
        self.members: list[Detector] = [
            detector if v.is_identity else AugmentedView(detector, v, merge_iou=merge_iou, max_det=max_det)
            for v in parsed
        ]

    def __iter__(self) -> Iterator[Detector]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def __call__(self, images: ImageInput | Sequence[ImageInput]) -> list[list[Detections]]:
        """Every view on ``images``, each image read once.

        Args:
            images: image paths or BGR ``uint8`` arrays ``[H, W, 3]`` (one path or array is accepted too).

        Returns:
            list[list[Detections]]: per image, one Detections per view (in the order of ``members``), in the
            image's own pixels.
        """
        items = as_image_list(images)
        arrays = [load_image(image, i) for i, image in enumerate(items)]
        paths = [image if isinstance(image, (str, os.PathLike)) else None for image in items]
        per_view = [detect_loaded(member, arrays, paths) for member in self.members]  # [V][I]
        return [list(dets) for dets in zip(*per_view, strict=True)]

    def __repr__(self) -> str:
        return f"AugmentedDetector(detector={self.detector.name!r}, views={[v.name for v in self.views]})"
