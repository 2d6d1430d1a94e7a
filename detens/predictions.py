"""Saved per-model predictions on a COCO-format dataset: the input of training and evaluation.

A prediction folder holds one COCO results file per model, ``<model name>.json``, as written by
``tools/cache.py``. Dimension legend: N models.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from detens.coco import CocoGroundTruth, coco_to_detections, load_coco_results
from detens.detections import Detections

__all__ = ["EnsemblePredictions", "NOT_RESULTS"]

#: JSON files of a prediction folder that are not a model's results (``tools/cache.py``'s summary).
NOT_RESULTS: frozenset[str] = frozenset({"cache_summary.json"})


class EnsemblePredictions:
    """Predictions of N models on the images of one ground truth, grouped by image.

    Args:
        model_names (list[str]): the ensemble's members, in the order every ``per_model`` list uses.
        results (list[list[dict]]): COCO result dicts of each model.
        gt (CocoGroundTruth): the dataset; gives image sizes and the valid image ids.
        validated (bool): the results come from :func:`~detens.coco.load_coco_results` (schema checked).
    """

    def __init__(
        self,
        model_names: Sequence[str],
        results: Sequence[Sequence[dict]],
        gt: CocoGroundTruth,
        validated: bool = False,
    ) -> None:
        if len(model_names) != len(results):
            raise ValueError(f"{len(model_names)} model names but {len(results)} result lists")
        if len(set(model_names)) != len(model_names):
            raise ValueError(f"model names must be unique, got {list(model_names)}")
        self.model_names = list(model_names)
        self.gt = gt
        known = set(gt.image_ids)
        # Per model: image id → (boxes Tensor[K, 4] xyxy, scores Tensor[K], labels Tensor[K]), converted
        # once: far smaller than the result dicts, and per_model() then costs one validation.
        self._by_image: list[dict[int, tuple[Tensor, Tensor, Tensor]]] = []
        for name, model_results in zip(self.model_names, results, strict=True):
            grouped: dict[int, list[dict]] = defaultdict(list)
            for r in model_results:
                grouped[int(r["image_id"])].append(r)
            unknown = sorted(set(grouped) - known)
            if unknown:
                raise ValueError(
                    f"predictions of {name!r} refer to {len(unknown)} image ids that are not in the ground truth, "
                    f"e.g. {unknown[:5]}; cache predictions on the same annotation file"
                )
            by_image = {}
            for image_id, image_results in grouped.items():
                det = coco_to_detections(image_results, gt.image_size(image_id), source=name, validate=validated)
                by_image[image_id] = (det.boxes, det.scores, det.labels)
            self._by_image.append(by_image)

    @classmethod
    def from_folder(
        cls, folder: str | Path, gt: CocoGroundTruth, models: Sequence[str] | None = None
    ) -> EnsemblePredictions:
        """Load ``folder/<name>.json`` for each model (all ``*.json`` files, sorted by name, by default)."""
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"prediction folder not found: {folder}")
        # cache_summary.json is tools/cache.py's report, not a model's results
        available = sorted(p.stem for p in folder.glob("*.json") if p.name not in NOT_RESULTS)
        if models is None:
            models = available
        missing = [m for m in models if m not in available]
        if missing:
            raise FileNotFoundError(
                f"no predictions for {missing} in {folder}; available: {', '.join(available) or 'none'}"
            )
        if not models:
            raise ValueError(f"{folder} holds no <model>.json prediction files")
        return cls(models, [load_coco_results(folder / f"{m}.json") for m in models], gt, validated=True)

    @property
    def num_models(self) -> int:
        return len(self.model_names)

    @property
    def image_ids(self) -> list[int]:
        """Images of the ground truth (every one is evaluated, with or without predictions)."""
        return list(self.gt.image_ids)

    def per_model(self, image_id: int) -> list[Detections]:
        """One Detections per model for ``image_id`` (empty where a model found nothing)."""
        image_size = self.gt.image_size(image_id)
        per_model = []
        for name, by_image in zip(self.model_names, self._by_image, strict=True):
            arrays = by_image.get(image_id)
            per_model.append(
                Detections.empty(image_size, name) if arrays is None else Detections(*arrays, image_size, name)
            )
        return per_model

    def select(self, models: Sequence[str]) -> EnsemblePredictions:
        """The same predictions restricted to (and ordered as) ``models``."""
        unknown = [m for m in models if m not in self.model_names]
        if unknown:
            raise ValueError(f"unknown models {unknown}; this ensemble has {self.model_names}")
        subset = EnsemblePredictions.__new__(EnsemblePredictions)
        subset.model_names = list(models)
        subset.gt = self.gt
        subset._by_image = [self._by_image[self.model_names.index(m)] for m in models]
        return subset
