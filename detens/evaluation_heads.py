"""Evaluation methods of issue 6: the network heads and the e2e-CEL baselines, for the CV harness.

Registers into :data:`detens.evaluation.METHODS` (importing this module is enough):

- ``deep``: the deep ensemble rescoring head (seed 002), trained on the training folds;
- ``superlearner``: the Super Learner (per-object softmax combination weights);
- ``selection``: the e2e-CEL selection head with its config's k; ``selection_k1`` ... ``selection_k8``:
  the same with k fixed (the k sweep; k ≥ N is the ``mean`` fuser with extra steps);
- ``random_k1`` ... ``random_k8``: the random k-subset baseline (fuser ``random_k``, seed 0), not learned;
- ``oracle``: per matched object, the single model row closest to its ground-truth box (scores as
  ``mean``); it READS THE GROUND TRUTH of the image it fuses, so it is the ceiling of any per-object
  model selection, never a method.

The heads train with their code defaults (``configs/train/<kind>.yaml`` mirrors them); every key can be
overridden through the method's options, e.g. ``{"deep": {"epochs": 20}}`` or ``{"deep": {"config": cfg}}``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torchvision.ops import box_iou

from detens.detections import Detections
from detens.evaluation import METHODS, EvalMethod, EvaluationData, FixedFusion
from detens.fusers import fuse
from detens.fusers.consensus import average_clusters
from detens.matching import Clusters, match
from detens.targets import assign_targets

__all__ = ["HeadMethod", "OracleMethod", "oracle_fusion", "selection_methods", "MAX_K"]

logger = logging.getLogger(__name__)

#: ``selection_k<k>`` and ``random_k<k>`` are registered for k = 1 ... MAX_K.
MAX_K = 8


def default_config(kind: str, **overrides: Any):
    """The training config of ``kind``: the code defaults (``configs/train/<kind>.yaml`` mirrors them) with
    ``overrides``."""
    from detens.training_heads import config_for

    return config_for(kind, **overrides)


class HeadMethod(EvalMethod):
    """A network head (``"deep"``, ``"selection"``, ``"superlearner"``) trained on the training folds
    with :func:`detens.training_heads.fit_head`, fusing through the ``theta`` fuser (any head).

    Args:
        model_names (list[str]): the ensemble.
        kind (str): the head kind.
        config (HeadTrainConfig | None): the training config (default: :func:`default_config`).
        **overrides: config fields to change (applied on top of ``config``).
    """

    learned = True

    def __init__(self, model_names: Sequence[str], kind: str, config: Any = None, **overrides: Any) -> None:
        self.model_names = list(model_names)
        self.kind = kind
        if config is None:
            config = default_config(kind, **overrides)
        elif overrides:
            config = replace(config, **overrides)
        self.config = config
        self.fitted_config = config
        self.head = None
        self.seconds = 0.0
        self.final_loss: float | None = None

    def fit(self, data: EvaluationData, train_ids: Sequence[int]) -> None:
        from detens.training_heads import fit_head

        self.head, history, self.fitted_config = fit_head(self.kind, data.predictions, train_ids, self.config)
        self.seconds += history.seconds
        self.final_loss = history.loss[-1] if history.loss else None

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        if self.head is None:
            raise RuntimeError(f"{self.kind}: predict before fit")
        return fuse(data.per_model(image_id), "theta", head=self.head, iou_thr=self.fitted_config.match_iou)

    def describe(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "match_iou": self.fitted_config.match_iou,
            "epochs": self.fitted_config.epochs,
            "score_target": self.fitted_config.score_target,
            "final_loss": self.final_loss,
            "train_seconds": round(self.seconds, 2),
        }
        if self.kind == "selection":
            out["k"] = self.fitted_config.k
        return out


def oracle_fusion(
    clusters: Clusters,
    gt_boxes: torch.Tensor,
    gt_labels: torch.Tensor,
    gt_iscrowd: torch.Tensor | None = None,
    iou_thr: float = 0.5,
) -> Detections:
    """The selection ceiling: each matched cluster takes the present model row closest to its GT box.

    Clusters are matched to the ground truth as the ``mean`` fuser's output would be (COCO-style, greedy
    by score, IoU ≥ ``iou_thr``); a matched cluster's box becomes the present row of highest IoU with its
    GT box, an unmatched one keeps the mean box. Scores are the ``mean`` fuser's.

    Args:
        clusters (Clusters): one image's clusters. gt_boxes (Tensor[G, 4]) pixels, gt_labels (Tensor[G]),
            gt_iscrowd (Tensor[G] bool | None).
    """
    weights = torch.ones(clusters.num_models, device=clusters.device)
    boxes, scores = average_clusters(clusters, weights)
    if len(clusters):
        targets = assign_targets(clusters, boxes, scores, gt_boxes, gt_labels, iou_thr=iou_thr, gt_iscrowd=gt_iscrowd)
        if bool(targets.matched.any()):
            index = targets.matched.nonzero().squeeze(1)
            rows = clusters.preds[index, :, :4]  # [M, N, 4]
            gt = targets.boxes[index].to(rows.dtype)  # [M, 4]
            iou = torch.stack([box_iou(rows[:, n], gt).diagonal() for n in range(clusters.num_models)], 1)  # [M, N]
            iou = iou.masked_fill(~clusters.present[index], -1.0)
            best = iou.argmax(1)
            boxes = boxes.clone()
            boxes[index] = rows[torch.arange(index.numel(), device=rows.device), best]
    return clusters.to_detections(boxes, scores, source="fused:oracle")


class OracleMethod(EvalMethod):
    """:func:`oracle_fusion` on every image (reads that image's ground truth: a ceiling, not a method)."""

    learned = False

    def __init__(self, model_names: Sequence[str], iou_thr: float = 0.55, target_iou: float = 0.5) -> None:
        self.iou_thr = iou_thr
        self.target_iou = target_iou

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        per_model = data.per_model(image_id)
        clusters = match(per_model, iou_thr=self.iou_thr)
        gt_boxes, gt_labels, gt_iscrowd = (t.to(clusters.device) for t in data.gt.targets(image_id))
        return oracle_fusion(clusters, gt_boxes, gt_labels, gt_iscrowd, self.target_iou)

    def describe(self) -> dict[str, Any]:
        return {"iou_thr": self.iou_thr, "target_iou": self.target_iou, "uses_ground_truth": True}


def selection_methods(num_models: int) -> list[str]:
    """``["selection_k1", ..., "selection_k<N>"]``: the k sweep of an N-model ensemble."""
    return [f"selection_k{k}" for k in range(1, min(num_models, MAX_K) + 1)]


def _head_factory(kind: str, **fixed: Any):
    def factory(model_names: Sequence[str], config: Any = None, **overrides: Any) -> HeadMethod:
        return HeadMethod(model_names, kind, config, **{**overrides, **fixed})

    return factory


def _random_factory(k: int):
    def factory(model_names: Sequence[str], **params: Any) -> FixedFusion:
        return FixedFusion("random_k", **{"k": k, "seed": 0, **params})

    return factory


for _kind in ("deep", "superlearner", "selection"):
    METHODS.register(_kind)(_head_factory(_kind))
for _k in range(1, MAX_K + 1):
    METHODS.register(f"selection_k{_k}")(_head_factory("selection", k=_k))
    METHODS.register(f"random_k{_k}")(_random_factory(_k))
METHODS.register("oracle")(OracleMethod)
