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

__all__ = ["EnsemblePredictions", "NOT_RESULTS", "join_predictions"]

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


def join_predictions(
    evaluated: EnsemblePredictions, extra: EnsemblePredictions
) -> tuple[EnsemblePredictions, list[int]]:
    """One set of predictions holding the images of both, for fitting on ``extra`` besides ``evaluated``.

    ``extra`` must have the same categories (the label space) and every model of ``evaluated``; its
    members are matched by name, so its files may list them in any order. Image ids of ``extra`` that
    collide with ``evaluated``'s are moved past the largest id, and annotation ids are renumbered when
    the two files share any, so the joined ground truth stays valid COCO (pycocotools indexes
    annotations by id: a shared id would silently drop one of them).

    Returns:
        (EnsemblePredictions, list[int]): the joined predictions (models in ``evaluated``'s order, the
        ground truth of both) and the joined ids of ``extra``'s annotated images.
    """
    from detens.coco import CocoGroundTruth

    ours, theirs = evaluated.gt.category_ids, extra.gt.category_ids
    if ours != theirs:
        only_extra, only_ours = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
        raise ValueError(
            f"the extra fitting data has other categories than the evaluated data: category ids only in the extra "
            f"data {only_extra[:10]}, only in the evaluated data {only_ours[:10]}; fit and score in one label space"
        )
    missing = [m for m in evaluated.model_names if m not in extra.model_names]
    if missing:
        raise ValueError(
            f"the extra fitting data has no predictions of {missing}; it has {extra.model_names}, the evaluated "
            f"data {evaluated.model_names}"
        )
    extra = extra.select(evaluated.model_names)
    taken = set(evaluated.gt.image_ids)
    shift = max(taken, default=0) + 1 if taken & set(extra.gt.image_ids) else 0
    new_id = {i: i + shift for i in extra.gt.image_ids}

    dataset = dict(evaluated.gt.dataset)
    dataset["images"] = list(evaluated.gt.dataset["images"]) + [
        {**image, "id": new_id[int(image["id"])]} for image in extra.gt.dataset["images"]
    ]
    extra_annotations = [{**a, "image_id": new_id[int(a["image_id"])]} for a in extra.gt.dataset["annotations"]]
    annotations = list(evaluated.gt.dataset["annotations"]) + extra_annotations
    if len({int(a["id"]) for a in annotations}) < len(annotations):
        annotations = [{**a, "id": i + 1} for i, a in enumerate(annotations)]
    dataset["annotations"] = annotations

    joined = EnsemblePredictions.__new__(EnsemblePredictions)
    joined.model_names = list(evaluated.model_names)
    joined.gt = CocoGroundTruth(dataset, evaluated.gt.images_dir)
    joined._by_image = [
        {**ours_by_image, **{new_id[i]: arrays for i, arrays in theirs_by_image.items()}}
        for ours_by_image, theirs_by_image in zip(evaluated._by_image, extra._by_image, strict=True)
    ]
    return joined, [new_id[i] for i in extra.gt.annotated_image_ids]
