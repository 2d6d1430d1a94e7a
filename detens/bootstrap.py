"""How much of a difference in mAP is the sample of images: a paired bootstrap over the scored images.

Dimension legend: B resamples, I scored images.

On a few hundred images two good fusion methods differ by a few tenths of a point, and another sample of
images of the same size would rank them differently some of the time. The paired bootstrap measures it:
draw I images with replacement from the I scored images, B times (fixed by a seed); score every method's
predictions on the SAME draws (an image drawn twice counts twice: its ground truth and its predictions
are copied under a new image id); the spread of a method's mAP over the draws is its sampling error, and
the spread of the difference between two methods on the same draws is the error of their comparison
(much smaller than either alone, since both see the same hard and easy images).

The mean of a method's mAP over the draws is not its mAP: COCO averages AP over the categories with
ground truth, and a draw that misses every image of a rare category averages over the others (on the
204 official images, YOLO26n's 0.4244 averages about 0.445 over draws). The spreads and the paired
differences are what the draws measure.

Every drawn image is scored, an image without annotations too (a negative image: its boxes are false
positives), as :func:`~detens.coco.evaluate_coco` scores the ``image_ids`` it is given. A draw that holds
no ground truth that COCO counts (only negative images, or crowd regions only) has no AP to measure: its
mAP is NaN for every method, :func:`bootstrap_map` warns how many draws are such, and
:func:`summarize_bootstrap` leaves them out (and says how many draws it summarized). Drawing again until
a draw has ground truth would favour the annotated images; scoring such a draw as COCO's -1 would pull
the mean and the interval down.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from detens.checks import check_integer, check_integers, check_seed
from detens.coco import (
    CocoGroundTruth,
    evaluate_coco,
    fastest_backend,
    group_results_by_image,
    validate_coco_results,
)

__all__ = ["resample_image_ids", "resampled_dataset", "bootstrap_map", "summarize_bootstrap"]

logger = logging.getLogger(__name__)


def resample_image_ids(image_ids: Sequence[int], resamples: int, seed: int = 0) -> np.ndarray:
    """``np.ndarray[B, I]`` int64: B draws of I image ids with replacement, fixed by ``seed`` and the SET of ids."""
    ids = np.array(sorted(set(check_integers(image_ids, "image_ids"))), dtype=np.int64)
    if ids.size == 0:
        raise ValueError("the bootstrap needs at least one scored image")
    resamples = check_integer(resamples, "resamples", 1)
    rng = np.random.default_rng(check_seed(seed))
    return ids[rng.integers(0, ids.size, size=(resamples, ids.size))]


def _rows_by_image(results: Sequence[Mapping[str, Any]]) -> dict[int, np.ndarray]:
    """COCO results as per-image float arrays ``[K, 7]`` of ``[image_id, x, y, w, h, score, category_id]``."""
    return {
        image_id: np.array([[r["image_id"], *r["bbox"], r["score"], r["category_id"]] for r in entries],
                           dtype=np.float64)
        for image_id, entries in group_results_by_image(results).items()
    }


def _resampled_truth(truth: CocoGroundTruth, sample: Sequence[int]) -> dict[str, Any]:
    """The COCO annotation dict of one draw: the k-th drawn image becomes image id k + 1."""
    images, annotations = [], []
    for new_id, image_id in enumerate(sample, start=1):
        images.append({**truth.image(int(image_id)), "id": new_id})
        for ann in truth.annotations(int(image_id)):
            annotations.append({**ann, "id": len(annotations) + 1, "image_id": new_id})
    return {"images": images, "annotations": annotations, "categories": truth.dataset["categories"]}


def _resampled_rows(rows: Mapping[int, np.ndarray], sample: Sequence[int]) -> np.ndarray:
    """``np.ndarray[K, 7]``: the predictions of one draw under the ids of :func:`_resampled_truth`."""
    arrays = []
    for new_id, image_id in enumerate(sample, start=1):
        found = rows.get(int(image_id))
        if found is not None:
            copy = found.copy()
            copy[:, 0] = new_id
            arrays.append(copy)
    return np.concatenate(arrays) if arrays else np.zeros((0, 7))


def resampled_dataset(
    truth: CocoGroundTruth, rows: Mapping[int, np.ndarray], sample: Sequence[int]
) -> tuple[dict[str, Any], np.ndarray]:
    """The ground truth and predictions of one draw: the k-th drawn image becomes image id k + 1.

    Args:
        truth (CocoGroundTruth): the scored images' ground truth.
        rows (dict[int, np.ndarray]): per image id, its predictions as ``[K, 7]`` arrays (see
            :func:`detens.coco.detections_to_array`).
        sample (list[int]): the drawn image ids (repeats allowed).

    Returns:
        (dict, np.ndarray[K, 7]): a COCO annotation dict and the predictions under the new ids.
    """
    return _resampled_truth(truth, sample), _resampled_rows(rows, sample)


def bootstrap_map(
    truth: CocoGroundTruth,
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    image_ids: Sequence[int] | None = None,
    resamples: int = 1000,
    seed: int = 0,
    backend: str | None = None,
) -> dict[str, np.ndarray]:
    """Every method's COCO mAP on the same B draws of the scored images.

    Args:
        truth (CocoGroundTruth): the ground truth.
        results (dict[str, list[dict]]): per method, its COCO results on the scored images.
        image_ids (list[int] | None): the scored images (default: those with ground truth); every drawn
            image is scored, one without annotations too.
        resamples (int): B, >= 1. seed (int): fixes the draws, in ``[0, 2**63 - 1]``.
        backend (str | None): COCO evaluator (default: the fastest installed one).

    Returns:
        dict[str, np.ndarray[B]]: per method, its mAP on each draw; NaN for every method on a draw with no
        ground truth to measure (module docstring).

    Raises:
        TypeError: ``resamples`` or ``seed`` is no integer (a bool, a float).
        ValueError: an image id not in ``truth``, no image to draw, ``resamples`` or ``seed`` out of range, or
            a method's malformed results.
    """
    scored = truth.annotated_image_ids if image_ids is None else list(image_ids)
    draws = resample_image_ids(scored, resamples, seed)
    truth.check_has_images(sorted({int(i) for i in scored}))
    backend = backend or fastest_backend()
    rows = {name: _rows_by_image(validate_coco_results(list(r), f"the results of {name!r}"))
            for name, r in results.items()}
    maps = {name: np.zeros(len(draws)) for name in results}
    for b, sample in enumerate(draws.tolist()):
        # one ground truth per draw, shared by every method: the evaluators index it once
        drawn = CocoGroundTruth(_resampled_truth(truth, sample))
        drawn_ids = range(1, len(sample) + 1)
        for name in results:
            score = evaluate_coco(drawn, _resampled_rows(rows[name], sample), image_ids=drawn_ids,
                                  backend=backend)["map"]
            # COCO's -1: no category has ground truth that counts in this draw
            maps[name][b] = np.nan if score < 0 else score
    unmeasured = int(np.logical_or.reduce([np.isnan(values) for values in maps.values()]).sum()) if maps else 0
    if unmeasured:
        logger.warning(
            "bootstrap_map: %d of %d draws hold no ground truth that COCO counts (only images without "
            "annotations, or crowd regions only); their mAP is NaN, and summarize_bootstrap leaves them out",
            unmeasured, len(draws),
        )
    return maps


def summarize_bootstrap(maps: Mapping[str, np.ndarray], against: str) -> dict[str, dict[str, Any]]:
    """Per method: the mean, standard deviation and 95 % interval (2.5th and 97.5th percentiles) of its mAP
    over the draws, and the same of its difference to ``against`` on the same draws, with the share of draws
    where it is above ``against``; ``draws``, how many draws these are.

    A draw that is NaN for any method (:func:`bootstrap_map`'s draw with no ground truth to measure) is
    left out for every method, so that every figure is over the same draws.

    Raises:
        ValueError: ``against`` is not a method, or no draw has a mAP for every method.
    """
    if against not in maps:
        raise ValueError(f"the bootstrap compares with {against!r}, which is not among the methods {sorted(maps)}")
    arrays = {name: np.asarray(values, dtype=np.float64) for name, values in maps.items()}
    measured = np.logical_and.reduce([~np.isnan(values) for values in arrays.values()])
    if not measured.any():
        raise ValueError(
            f"none of the {measured.size} draws has a mAP for every method: no draw held ground truth that COCO "
            "counts; score images with annotations"
        )
    maps = {name: values[measured] for name, values in arrays.items()}

    def spread(values: np.ndarray) -> dict[str, Any]:
        return {
            "mean": float(values.mean()),
            "sd": float(values.std(ddof=1)) if values.size > 1 else 0.0,
            "ci95": [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))],
        }

    summary = {}
    for name, values in maps.items():
        difference = values - maps[against]
        summary[name] = {"map": spread(values),
                         "difference": {**spread(difference), "above": float((difference > 0).mean())},
                         "draws": int(values.size)}
    return summary
