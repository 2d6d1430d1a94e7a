"""Saved predictions as an ensemble member: any detector a user already ran can join an ensemble.

The predictions are COCO results (``[{"image_id", "category_id", "bbox": [x, y, w, h], "score"}, ...]``,
``category_id`` in the dataset's label space). Images are matched to ``image_id`` by file name, through

- a COCO annotation file (or dict / :class:`~detens.coco.CocoGroundTruth`) whose ``images`` list gives
  ``id``, ``file_name``, ``height`` and ``width``;
- a ``{file_name: image_id}`` mapping;
- or nothing, when the images are known without help: the ``predictions.json`` that ``detens fuse``
  writes (a COCO results list) has ``images.json`` (a COCO dataset without annotations) beside it, which
  is read; a dict ``{"images": [...], "results": [...]}`` carries its own.

A path matches a ``file_name`` when it ends with it (``.../val2017/000000000139.jpg`` matches
``000000000139.jpg`` and ``val2017/000000000139.jpg``); integers are taken as image ids.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detens.adapters._base import BaseDetector, ImageInput, as_image_list
from detens.adapters._labels import (
    check_categories,
    check_category_id_map,
    check_class_map_categories,
    id_ranges,
)
from detens.checks import check_integer, check_max_det, check_real
from detens.coco import (
    coco_to_detections,
    files_under_several_ids,
    group_results_by_image,
    validate_coco_results,
)
from detens.detections import Detections
from detens.io import read_json_file
from detens.sources import read_image

__all__ = ["PrecomputedDetector", "UnknownImageError", "image_map_beside"]

logger = logging.getLogger(__name__)


def image_map_beside(results: str | os.PathLike[str]) -> Path | None:
    """The ``images.json`` that names the images of a results file written by ``detens fuse``: the one beside
    it (``predictions.json``), or the run's for a member's ``per_model/<name>.json`` (``--save-per-model``);
    None where there is none."""
    path = Path(results)
    for folder in (path.parent, *([path.parent.parent] if path.parent.name == "per_model" else [])):
        if (folder / "images.json").is_file():
            return folder / "images.json"
    return None


class UnknownImageError(KeyError, ValueError):
    """An image the saved predictions do not know, or name ambiguously: a ``KeyError``, as a lookup's miss
    is, and a ``ValueError``, as every other mistake in what a detector is given is."""

    def __str__(self) -> str:  # KeyError's own would show the message in quotes
        return str(self.args[0]) if self.args else ""


class PrecomputedDetector(BaseDetector):
    """Replays saved COCO results.

    Args:
        results: a COCO results JSON file, the list of result dicts, or a dict with ``results`` and
            ``images``.
        images: how to find an image's id: a COCO annotation file/dict/``CocoGroundTruth``, or a
            ``{file_name: image_id}`` mapping; None: the ``images`` of a dict ``results``, else the
            ``images.json`` beside a results file (``detens fuse`` writes one beside ``predictions.json``),
            else ``default_images``.
        default_images: the images to match against when neither ``images`` nor the results name theirs
            (an ensemble's dataset): the results' own images come first, as their ids are ids of those.
        name (str | None): display name; default: the results file's stem (``"precomputed"`` for results
            given as a list or dict).
        conf (float): keep the results scored ``conf`` or more. The adapters that run a model keep the scores
            above ``conf``, as Ultralytics' and torchvision's own post-processing do, but saved scores are
            rounded (``detens cache`` and ``detens fuse`` write 5 decimals): a score just above ``conf`` is saved
            as ``conf`` itself, so that read back at the ``conf`` it was saved with, a member keeps every box it
            kept when it ran.
        max_det (int | None): keep at most this many results per image (the best scored).
        class_map (dict[int, int] | None): ``{saved category_id: category id}``; unlisted ids are dropped.
            Default: the saved ``category_id`` is the label.
        categories (dict[int, str] | None): names of the label space, for drawing (``{category_id: name}``,
            a COCO ``categories`` list or a COCO annotation dict); when given, every id of ``class_map`` must
            be one of them.

    Calling it with image paths (or image ids) returns their saved detections; an image without results
    gets an empty ``Detections``; an image the map does not know is an error. :meth:`check_categories`
    checks the saved category ids against a label space before any image is asked for. ``where`` names
    the results in messages: the file, or ``"results"``.
    """

    def __init__(
        self,
        results: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any],
        images: Any = None,
        *,
        default_images: Any = None,
        name: str | None = None,
        conf: float = 0.0,
        max_det: int | None = None,
        class_map: Mapping[int, int] | None = None,
        categories: Mapping[int, str] | None = None,
    ) -> None:
        categories = check_categories(categories)
        where = "results"
        default_name = "precomputed"
        embedded_images = None
        if isinstance(results, (str, os.PathLike)):
            path = Path(results)
            where, default_name = str(path), path.stem
            results = read_json_file(path, "COCO results file")
            if images is None:
                embedded_images = image_map_beside(path)
        if isinstance(results, Mapping):
            if "results" not in results:
                raise ValueError(
                    f"{where}: a dict of predictions must hold 'results' (COCO result dicts) and 'images'; "
                    f"got keys {sorted(results)}"
                )
            embedded_images = results.get("images", embedded_images)
            results = results["results"]
        clean = validate_coco_results(results, where)
        super().__init__(name if name is not None else default_name, 1, categories)
        self.conf = check_real(conf, f"{self.name}: conf", 0.0, 1.0)
        self.max_det = check_max_det(max_det, f"{self.name}: max_det")
        self.class_map = None if class_map is None else check_category_id_map(class_map, self.name)
        if self.class_map is not None and categories is not None:
            check_class_map_categories(self.class_map, categories, self.name)
        self.where = where
        if not clean:  # as for a cached member: most often a tool that failed, not a model that sees nothing
            logger.warning("%s holds no detection: member %s gives none on any image; check the tool that wrote it",
                           where, self.name)
        # the first result of each saved category id, so that an id outside a label space can be named
        self._first_result: dict[int, tuple[int, int]] = {}
        for i, entry in enumerate(clean):
            self._first_result.setdefault(entry["category_id"], (i, entry["image_id"]))
        self._by_image = group_results_by_image(clean)
        chosen = next((i for i in (images, embedded_images, default_images) if i is not None), None)
        self._records = self._image_records(chosen, where)
        unknown = sorted(set(self._by_image) - set(self._records))
        if unknown and len(unknown) == len(self._by_image):
            raise ValueError(
                f"{where}: none of the results' {len(unknown)} image ids ({unknown[:5]}) is among the "
                f"{len(self._records)} images they are matched against (ids {sorted(self._records)[:5]} ...); "
                "the results and the images must come from one dataset"
            )
        if unknown:
            logger.warning("%s: %d of the results' image ids are not among the %d images (e.g. %s); their "
                           "boxes are never used", where, len(unknown), len(self._records), unknown[:5])
        self._by_file = {rec["file_name"]: rec for rec in self._records.values() if rec.get("file_name")}
        self._by_base: dict[str, list[dict[str, Any]]] = {}
        for rec in self._by_file.values():
            self._by_base.setdefault(Path(rec["file_name"]).name, []).append(rec)

    @staticmethod
    def _image_records(images: Any, where: str) -> dict[int, dict[str, Any]]:
        if images is None:
            raise ValueError(
                f"{where}: COCO results do not name their images; give the member its images (the `images` "
                "key of a precomputed member in an ensemble YAML, images= in Python): a COCO annotation file, "
                "or a {file_name: image_id} mapping"
            )
        source = str(images) if isinstance(images, (str, os.PathLike)) else "images"
        if isinstance(images, (str, os.PathLike)):
            images = read_json_file(Path(images), "COCO annotation file")
        dataset = getattr(images, "dataset", None)  # CocoGroundTruth or pycocotools COCO
        if dataset is not None:
            images = dataset
        if isinstance(images, Mapping) and "images" in images:
            images = images["images"]
        records: dict[int, dict[str, Any]] = {}

        def add(image_id: Any, record: dict[str, Any], name: str) -> None:
            # an id read as another (1.5 as 1, "1" as 1), or given to two files, would send one image's
            # saved boxes to another, or leave an image without them
            image_id = check_integer(image_id, name)
            if image_id in records:
                raise ValueError(
                    f"{source}: image id {image_id} is given to both {records[image_id].get('file_name')!r} and "
                    f"{record.get('file_name')!r}; each image needs an id of its own"
                )
            records[image_id] = {**record, "id": image_id}

        if isinstance(images, Mapping):  # {file_name: image_id}
            for file_name, image_id in images.items():
                add(image_id, {"file_name": str(file_name)},
                    f"the image id of {str(file_name)!r} in {source} ({{file_name: image_id}})")
        elif isinstance(images, Sequence) and not isinstance(images, str):
            for i, rec in enumerate(images):
                if not isinstance(rec, Mapping) or "id" not in rec:
                    raise ValueError(
                        f"images[{i}] must be a COCO image record with 'id' and 'file_name', got {rec!r}"
                    )
                add(rec["id"], dict(rec), f"images[{i}].id" if source == "images" else f"{source}: images[{i}].id")
        else:
            raise TypeError(
                f"images must be a COCO annotation file/dict or a {{file_name: image_id}} mapping, got "
                f"{type(images).__name__}"
            )
        # a file under two ids: its saved boxes would be found under one of them only
        named = ((image_id, rec["file_name"]) for image_id, rec in records.items() if isinstance(rec.get("file_name"), str))
        if shared := files_under_several_ids(named):
            file_name, (first, second, *_) = next(iter(shared.items()))
            raise ValueError(
                f"{source}: {file_name!r} is listed under both image id {first} and {second}; each image file needs "
                "one record"
            )
        return records

    # --------------------------------------------------------------------------------------------- labels
    def check_categories(self, category_ids: Iterable[int], label_space: str = "the label space") -> None:
        """Check that every saved result's category (through ``class_map``) is one of ``category_ids``.

        Saved ids that ``class_map`` leaves out are not checked: the map drops them on purpose.

        Args:
            category_ids (Iterable[int]): the category ids the results may carry.
            label_space (str): whose ids they are, for the message (``"the dataset instances.json"``).

        Raises:
            ValueError: naming the results (:attr:`where`), the first result with an id outside the label
                space, that ``category_id``, the other such ids and the valid ids.
        """
        valid = {int(c) for c in category_ids}
        wrong = []  # (first result index, image id, saved id, id after class_map)
        for saved, (index, image_id) in self._first_result.items():
            label = saved if self.class_map is None else self.class_map.get(saved)
            if label is not None and label not in valid:
                wrong.append((index, image_id, saved, label))
        if not wrong:
            return
        wrong.sort()
        index, image_id, saved, label = wrong[0]
        what = f"category_id {saved}" + ("" if label == saved else f" (mapped to {label} by its class_map)")
        others = ""
        if len(wrong) > 1:
            others = f"; neither are the saved ids {[w[2] for w in wrong[1:6]]}" + (" ..." if len(wrong) > 6 else "")
        if self.class_map is None:
            fix = "give the member a class_map {saved id: category id}"
        else:
            fix = "correct its class_map"
        raise ValueError(
            f"{self.where} (member {self.name!r}): result {index} (image_id {image_id}) has {what}, which is not "
            f"one of the {len(valid)} category ids of {label_space}: {id_ranges(sorted(valid))}{others}; {fix}, "
            "or use results in that label space"
        )

    # --------------------------------------------------------------------------------------------- lookup
    def image_record(self, image: ImageInput | int) -> dict[str, Any]:
        """The image record (``id``, ``file_name``, maybe ``height``/``width``) of a path or an image id."""
        if isinstance(image, (int, np.integer)) and not isinstance(image, bool):
            record = self._records.get(int(image))
            if record is None:
                raise UnknownImageError(
                    f"{self.name}: image id {int(image)} is not among the {len(self._records)} known images"
                )
            return record
        if not isinstance(image, (str, os.PathLike)):
            raise TypeError(
                f"{self.name}: saved predictions are found by image file name; pass image paths or ids, "
                f"not {type(image).__name__}"
            )
        path = Path(image)
        parts = path.as_posix().split("/")
        for start in range(len(parts)):  # the longest file_name that the path ends with
            record = self._by_file.get("/".join(parts[start:]))
            if record is not None:
                return record
        candidates = self._by_base.get(path.name, [])
        if len(candidates) == 1:
            return candidates[0]
        if len(candidates) > 1:
            raise UnknownImageError(
                f"{self.name}: {str(path)!r} is ambiguous: several images are named {path.name!r} "
                f"({[c['file_name'] for c in candidates[:5]]}); pass a path that ends with one of them"
            )
        examples = list(self._by_file)[:3]
        raise UnknownImageError(
            f"{self.name}: no saved predictions for {str(path)!r}: not among the {len(self._by_file)} known images (e.g. {examples})"
        )

    def _detections(self, record: dict[str, Any], image_size: tuple[int, int]) -> Detections:
        det = coco_to_detections(self._by_image.get(int(record["id"]), []), image_size, source=self.name)
        if len(det) and self.class_map is not None:
            mapped = torch.tensor(
                [self.class_map.get(int(c), -1) for c in det.labels.tolist()], dtype=torch.int64
            )
            keep = mapped >= 0
            det = Detections(det.boxes[keep], det.scores[keep], mapped[keep], image_size, self.name)
        if len(det) and self.conf > 0:
            det = det[det.scores >= self.conf]  # not >: a saved score equal to conf is one above it, rounded
        det = det.sort_by_score()
        if self.max_det is not None and len(det) > self.max_det:
            det = det[: self.max_det]
        return det

    @staticmethod
    def _record_size(record: Mapping[str, Any]) -> tuple[int, int] | None:
        if "height" in record and "width" in record:
            return int(record["height"]), int(record["width"])
        return None

    # --------------------------------------------------------------------------------------------- calls
    def __call__(self, images: ImageInput | int | Sequence[ImageInput | int]) -> list[Detections]:
        """The saved detections of ``images``: paths, or image ids (one is accepted too).

        Returns:
            list[Detections]: one per image, in order; empty for an image without results.

        Raises:
            UnknownImageError: an image the image map does not know (a ``KeyError`` and a ``ValueError``).
        """
        items = [images] if isinstance(images, (int, np.integer)) else as_image_list(images)  # type: ignore[arg-type]
        out = []
        for item in items:
            record = self.image_record(item)
            size = self._record_size(record)
            if size is None:
                if isinstance(item, (int, np.integer)):
                    raise ValueError(
                        f"{self.name}: image {record['id']} has no height/width; pass its path instead"
                    )
                size = read_image(item).shape[:2]  # type: ignore[arg-type]
            out.append(self._detections(record, size))
        return out

    def predict_arrays(
        self, images: Sequence[np.ndarray], paths: Sequence[str | os.PathLike | None] | None = None
    ) -> list[Detections]:
        """Detections of already-read images; ``paths`` name them (required: predictions are found by name)."""
        if paths is None or len(paths) != len(images) or any(p is None for p in paths):
            raise ValueError(
                f"{self.name}: saved predictions are found by image file name; pass the images' paths"
            )
        out = []
        for image, path in zip(images, paths, strict=True):
            record = self.image_record(path)  # type: ignore[arg-type]
            size = tuple(image.shape[:2])
            saved = self._record_size(record)
            if saved is not None and saved != size:
                raise ValueError(
                    f"{self.name}: {str(path)!r} is {size[0]}x{size[1]} (h x w) but its saved predictions are for "
                    f"{saved[0]}x{saved[1]}; the predictions belong to another image"
                )
            out.append(self._detections(record, size))  # type: ignore[arg-type]
        return out
