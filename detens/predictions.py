"""Saved per-model predictions on a COCO-format dataset: the input of training and evaluation.

A prediction folder holds one COCO results file per model, ``<model name>.json``, as written by
``tools/cache.py``. Dimension legend: N models.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from detens.coco import CocoGroundTruth, coco_to_detections, load_coco_results
from detens.detections import Detections

__all__ = ["EnsemblePredictions"]


class EnsemblePredictions:
    """Predictions of N models on the images of one ground truth, grouped by image.

    Args:
        model_names (list[str]): the ensemble's members, in the order every ``per_model`` list uses.
        results (list[list[dict]]): COCO result dicts of each model.
        gt (CocoGroundTruth): the dataset; gives image sizes and the valid image ids.
    """

    def __init__(self, model_names: Sequence[str], results: Sequence[Sequence[dict]], gt: CocoGroundTruth) -> None:
        if len(model_names) != len(results):
            raise ValueError(f"{len(model_names)} model names but {len(results)} result lists")
        if len(set(model_names)) != len(model_names):
            raise ValueError(f"model names must be unique, got {list(model_names)}")
        self.model_names = list(model_names)
        self.gt = gt
        known = set(gt.image_ids)
        self._by_image: list[dict[int, list[dict]]] = []
        for name, model_results in zip(self.model_names, results):
            grouped: dict[int, list[dict]] = defaultdict(list)
            for r in model_results:
                grouped[int(r["image_id"])].append(r)
            unknown = sorted(set(grouped) - known)
            if unknown:
                raise ValueError(
                    f"predictions of {name!r} refer to {len(unknown)} image ids that are not in the ground truth, "
                    f"e.g. {unknown[:5]}; cache predictions on the same annotation file"
                )
            self._by_image.append(dict(grouped))

    @classmethod
    def from_folder(
        cls, folder: str | Path, gt: CocoGroundTruth, models: Sequence[str] | None = None
    ) -> EnsemblePredictions:
        """Load ``folder/<name>.json`` for each model (all ``*.json`` files, sorted by name, by default)."""
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"prediction folder not found: {folder}")
        available = sorted(p.stem for p in folder.glob("*.json"))
        if models is None:
            models = available
        missing = [m for m in models if m not in available]
        if missing:
            raise FileNotFoundError(
                f"no predictions for {missing} in {folder}; available: {', '.join(available) or 'none'}"
            )
        if not models:
            raise ValueError(f"{folder} holds no <model>.json prediction files")
        return cls(models, [load_coco_results(folder / f"{m}.json") for m in models], gt)

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
        return [
            coco_to_detections(by_image.get(image_id, []), image_size, source=name)
            for name, by_image in zip(self.model_names, self._by_image)
        ]

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
