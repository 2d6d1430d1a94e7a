"""The Θ fusion head of seed 000 ("Learnable Ensembling"), with the math written consistently.

Dimension legend: N models, C clusters (matched objects, possibly of several images), K classes with
their own Θ (per-class variant), 5 = ``x1, y1, x2, y2, p`` (normalized coordinates and score).

For one cluster with predictions Ŷ ∈ R^{N×5}, weights Θ ∈ R^N and target y ∈ R^5 (the matched GT box
and label 1, or label 0 and no box target for a false positive), the fused output is **A = ŶᵀΘ**
(the score A₅ is clamped to [0, 1] when used as a detection score), and

    J_reg  = ½ Σ_j w_j (A_j − y_j)²            w = (1,1,1,1,1) if matched, (0,0,0,0,1) if not
    J_cls  = − Σ_{i present} [ y₅ log qᵢ + (1 − y₅) log(1 − qᵢ) ]     qᵢ = clamp(θᵢpᵢ, ε, 1 − ε)
    J_cons = ½ (1 − Σᵢ θᵢ)²
    J      = λ_reg J_reg + λ_cls J_cls + λ_cons J_cons

with the analytic gradients

    ∇J_reg  = Ŷ W (ŶᵀΘ − y)                                  W = diag(w)
    ∇J_cls  = [ presentᵢ (θᵢpᵢ − y₅) / (θᵢ (1 − θᵢpᵢ)) ]ᵢ     zero where the clamp is active
    ∇J_cons = −(1 − Σᵢ θᵢ) · 1

(``∇J_cls`` is computed in the equivalent form ``pᵢ (qᵢ − y₅) / (qᵢ (1 − qᵢ))``, which needs no division
by θᵢ.) The gradient is zero where θᵢpᵢ lies outside the open interval (ε, 1 − ε), the bounds
themselves included (``torch.clamp``'s convention from torch 2.14; earlier versions pass it at the bounds).

**Normalized box variant** (``normalize_box=True``): A_box = Ŷ_boxᵀΘ / s with s = 1ᵀΘ (the score stays
A₅ = Ŷ₅ᵀΘ). Then ∂A_box,j/∂θᵢ = (Ŷᵢⱼ − A_box,j) / s, so

    ∇J_reg = (Ŷ_box − 1 A_boxᵀ) W_box (A_box − y_box) / s  +  Ŷ₅ w₅ (A₅ − y₅)

The fused box is then a convex combination of the models' boxes whatever ΣΘ is.

**Errata of seed 000** (DESIGN.md §2): the seed writes J_reg = ½Σᵢ(θᵢyᵢ − y)² but states the gradient
of ½‖ŶᵀΘ − y‖² (implemented here); writes J_cls without the minus sign but states the gradient of the
negative (binary cross-entropy, implemented here); and states ∇J_cons = Θ − 1, whereas the gradient of
½(1 − ΣΘ)² is −(1 − ΣΘ)·1 (implemented here). ``tests/test_theta_gradients.py`` checks all three.

Training averages J over all (non-ignored) clusters of all training images and, by default, follows the
seed's rule Θ ← Θ − α∇J (plain gradient descent, :func:`make_optimizer` ``"gd"``; ``"adam"`` is an
option), projecting θᵢ ≥ ε after each step so the logs stay finite.

**Per-class Θ** (``per_class=True``): one Θ_k ∈ R^N per class id in ``class_ids`` (the category ids seen
in training) next to the global Θ. A cluster of class k is fused with Θ_k; a cluster whose class is not
in ``class_ids`` (unseen in training) falls back to the global Θ. The training loss is

    J(Θ_class) + J(Θ_global) + shrinkage · Σ_k ‖Θ_k − Θ_global‖²

so the global Θ is the pooled fit over all clusters (what unseen classes get), and each Θ_k is pulled
toward it by an L2 penalty. Because each J is a *mean* over all clusters, class k's data weighs in
proportion to its share of clusters n_k / C, while the pull does not depend on n_k: rare classes stay
near the global Θ and frequent ones follow their own data. The two J terms use the analytic gradients;
the penalty's gradient (not part of the seed's J) is left to autograd.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx, once_differentiable

from detens.checks import check_real
from detens.detections import Detections
from detens.heads._features import class_positions
from detens.heads._io import (
    HeadFileError,
    check_class_ids,
    check_config_keys,
    check_int,
    check_match_iou,
    check_model_names,
    check_number,
    check_stored_class_ids,
    clusters_in_member_order,
    read_head_for,
    write_head_file,
)
from detens.heads._precision import without_autocast
from detens.heads._registry import HEADS
from detens.matching import Clusters
from detens.targets import Targets

__all__ = ["ThetaLossFunction", "theta_loss", "ThetaHead", "make_optimizer", "OPTIMIZERS"]

logger = logging.getLogger(__name__)

OPTIMIZERS = ("gd", "adam")


# ------------------------------------------------------------------------------------------ the objective
def _forward_parts(theta: Tensor, preds: Tensor, normalize_box: bool) -> tuple[Tensor, Tensor]:
    """A (Tensor[C, 5]) and s = 1ᵀΘ (Tensor[C])."""
    fused = torch.einsum("cn,cnk->ck", theta, preds)  # [C, 5]
    total = theta.sum(1)  # [C]
    if normalize_box:
        fused = torch.cat([fused[:, :4] / total[:, None], fused[:, 4:]], dim=1)
    return fused, total


def _cluster_objectives(
    theta: Tensor,
    preds: Tensor,
    present_f: Tensor,
    y: Tensor,
    w: Tensor,
    valid: Tensor,
    lambda_reg: float,
    lambda_cls: float,
    lambda_cons: float,
    eps: float,
    normalize_box: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """J of every cluster, 0 where it does not count, and the parts of it that the analytic gradient reuses.

    Args: as :class:`ThetaLossFunction`, all in theta's dtype (``present_f`` the presence as 0/1).

    Returns:
        per_cluster (Tensor[C]), A (Tensor[C, 5]), s = 1ᵀΘ (Tensor[C]), w ⊙ (A − y) (Tensor[C, 5]).
    """
    fused, total = _forward_parts(theta, preds, normalize_box)  # [C, 5], [C]
    weighted_resid = w * (fused - y)  # [C, 5]
    j_reg = 0.5 * (weighted_resid * (fused - y)).sum(1)  # [C]

    scores = preds[..., 4]  # [C, N]
    q = (theta * scores).clamp(eps, 1.0 - eps)  # [C, N]
    y5 = y[:, 4:5]  # [C, 1]
    j_cls = -(present_f * (y5 * q.log() + (1.0 - y5) * torch.log1p(-q))).sum(1)  # [C]

    gap = 1.0 - total  # [C]
    j_cons = 0.5 * gap * gap

    per_cluster = lambda_reg * j_reg + lambda_cls * j_cls + lambda_cons * j_cons  # [C]
    per_cluster = torch.where(valid, per_cluster, torch.zeros_like(per_cluster))
    return per_cluster, fused, total, weighted_resid


class ThetaLossFunction(torch.autograd.Function):
    """The scalar J of DESIGN.md §2, averaged over the non-ignored clusters, with the analytic gradient.

    ``ThetaLossFunction.apply(theta, preds, present, y, w, valid, lambda_reg, lambda_cls, lambda_cons,
    eps, normalize_box)``; prefer the validating wrapper :func:`theta_loss`.

    Args:
        theta (Tensor[C, N]): the weights used for each cluster (the global Θ expanded, or per-class
            rows gathered; autograd carries the gradient back through the expand/gather).
        preds (Tensor[C, N, 5]): Ŷ per cluster (cast to theta's dtype).
        present (Tensor[C, N] bool): which rows are real predictions (absent rows skip J_cls).
        y (Tensor[C, 5]): targets: GT box and label 1, or anything and label 0 (with w_box = 0).
        w (Tensor[C, 5]): regression weights per coordinate.
        valid (Tensor[C] bool): clusters that count; ignored ones (crowd matches) contribute nothing.
        lambda_reg, lambda_cls, lambda_cons (float): term weights.
        eps (float): the clamp of θᵢpᵢ to [ε, 1 − ε].
        normalize_box (bool): A_box = ŶᵀΘ / 1ᵀΘ.

    Returns:
        Tensor[]: J = Σ_valid J_c / max(1, #valid). Only ``theta`` receives a gradient.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        theta: Tensor,
        preds: Tensor,
        present: Tensor,
        y: Tensor,
        w: Tensor,
        valid: Tensor,
        lambda_reg: float,
        lambda_cls: float,
        lambda_cons: float,
        eps: float,
        normalize_box: bool,
    ) -> Tensor:
        dtype = theta.dtype
        preds, y, w = preds.to(dtype), y.to(dtype), w.to(dtype)
        present_f = present.to(dtype)
        per_cluster, fused, total, weighted_resid = _cluster_objectives(
            theta, preds, present_f, y, w, valid, lambda_reg, lambda_cls, lambda_cons, eps, normalize_box
        )
        count = valid.sum().clamp(min=1).to(dtype)
        ctx.save_for_backward(theta, preds, present_f, y, weighted_resid, fused, total, valid, count)
        ctx.constants = (lambda_reg, lambda_cls, lambda_cons, eps, normalize_box)
        return per_cluster.sum() / count

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        theta, preds, present_f, y, weighted_resid, fused, total, valid, count = ctx.saved_tensors
        lambda_reg, lambda_cls, lambda_cons, eps, normalize_box = ctx.constants

        if normalize_box:
            # (Ŷ_box − 1 A_boxᵀ) W_box r_box / s  +  Ŷ₅ w₅ r₅
            centered = preds[..., :4] - fused[:, None, :4]  # [C, N, 4]
            grad_reg = torch.einsum("cnk,ck->cn", centered, weighted_resid[:, :4]) / total[:, None]
            grad_reg = grad_reg + preds[..., 4] * weighted_resid[:, 4:5]
        else:
            grad_reg = torch.einsum("cnk,ck->cn", preds, weighted_resid)  # Ŷ W (ŶᵀΘ − y)

        scores = preds[..., 4]  # [C, N]
        scaled = theta * scores
        inside = (scaled > eps) & (scaled < 1.0 - eps)  # no gradient at the bounds either
        q = scaled.clamp(eps, 1.0 - eps)
        grad_cls = present_f * inside * scores * (q - y[:, 4:5]) / (q * (1.0 - q))  # [C, N]

        grad_cons = -(1.0 - total)[:, None].expand_as(theta)  # [C, N]

        grad = lambda_reg * grad_reg + lambda_cls * grad_cls + lambda_cons * grad_cons
        grad = torch.where(valid[:, None], grad, torch.zeros_like(grad))
        grad = grad * (grad_output / count)
        return (grad,) + (None,) * 10


def theta_loss(
    theta: Tensor,
    preds: Tensor,
    present: Tensor,
    y: Tensor,
    w: Tensor | None = None,
    valid: Tensor | None = None,
    *,
    lambda_reg: float = 1.0,
    lambda_cls: float = 1.0,
    lambda_cons: float = 1.0,
    eps: float = 1e-6,
    normalize_box: bool = False,
) -> Tensor:
    """J of DESIGN.md §2 averaged over the valid clusters, back-propagated with the analytic gradient.

    Args:
        theta (Tensor[C, N]): per-cluster weights (may require grad).
        preds (Tensor[C, N, 5]), present (Tensor[C, N] bool): the clusters.
        y (Tensor[C, 5]): targets (``Targets.y()``).
        w (Tensor[C, 5] | None): regression weights (``Targets.weights()``); by default
            ``(1,1,1,1,1)`` where ``y[:, 4] == 1`` and ``(0,0,0,0,1)`` elsewhere.
        valid (Tensor[C] bool | None): clusters that count (``~Targets.ignore``); default all.

    Returns:
        Tensor[]: the scalar J (0 when no cluster is valid, e.g. C = 0).
    """
    if theta.ndim != 2:
        raise ValueError(f"theta must have shape [C, N], got {list(theta.shape)}")
    num_clusters, num_models = theta.shape
    if preds.shape != (num_clusters, num_models, 5):
        raise ValueError(
            f"preds must have shape [C, N, 5] = [{num_clusters}, {num_models}, 5], got {list(preds.shape)}"
        )
    if present.shape != (num_clusters, num_models):
        raise ValueError(
            f"present must have shape [C, N] = [{num_clusters}, {num_models}], got {list(present.shape)}"
        )
    if y.shape != (num_clusters, 5):
        raise ValueError(f"y must have shape [C, 5] = [{num_clusters}, 5], got {list(y.shape)}")
    if preds.requires_grad or y.requires_grad or (w is not None and w.requires_grad):
        raise ValueError("theta_loss differentiates only with respect to theta; detach preds, y and w")
    if not theta.is_floating_point():
        raise TypeError(f"theta must be floating point, got {theta.dtype}")
    if not 0.0 < float(eps) < 0.5:
        raise ValueError(f"eps must be in (0, 0.5), got {eps}")
    if not bool(torch.isfinite(y).all()):
        raise ValueError(f"y must be finite, got {int((~torch.isfinite(y)).any(dim=1).sum())} rows with NaN or inf")
    if not bool(((y[:, 4] >= 0) & (y[:, 4] <= 1)).all()):
        raise ValueError("y[:, 4] (the score target) must be in [0, 1]")
    if w is None:
        w = (y[:, 4:5] == 1).to(theta.dtype).expand(-1, 5).clone()
        w[:, 4] = 1
    elif w.shape != (num_clusters, 5):
        raise ValueError(f"w must have shape [C, 5] = [{num_clusters}, 5], got {list(w.shape)}")
    if valid is None:
        valid = torch.ones(num_clusters, dtype=torch.bool, device=theta.device)
    elif valid.shape != (num_clusters,) or valid.dtype != torch.bool:
        raise ValueError(
            f"valid must be a bool Tensor[C] = [{num_clusters}], got {valid.dtype} {list(valid.shape)}"
        )
    device = theta.device
    return ThetaLossFunction.apply(
        theta,
        preds.to(device),
        present.to(device=device, dtype=torch.bool),
        y.to(device),
        w.to(device),
        valid.to(device),
        float(lambda_reg),
        float(lambda_cls),
        float(lambda_cons),
        float(eps),
        bool(normalize_box),
    )


# ----------------------------------------------------------------------------------------------- the head
_CONFIG_KEYS = (
    "per_class",
    "class_ids",
    "normalize_box",
    "eps",
    "lambda_reg",
    "lambda_cls",
    "lambda_cons",
    "shrinkage",
    "match_iou",
)


def _as_list(items: Clusters | Targets | Sequence[Any], kind: type, what: str) -> list[Any]:
    if isinstance(items, kind):
        return [items]
    if isinstance(items, Sequence) and all(isinstance(item, kind) for item in items):
        return list(items)
    raise TypeError(f"{what} must be {kind.__name__} or a list of them, got {type(items).__name__}")


@HEADS.register("theta")
class ThetaHead(nn.Module):
    """Learned linear fusion A = ŶᵀΘ (seed 000), global or per class. See the module docstring for the math.

    Args:
        model_names (list[str]): the ensemble's models, the order of the N axis of its parameters; clusters
            whose ``sources`` name the models are put into this order (else they are taken to be in it).
        per_class (bool): one Θ per class id in ``class_ids`` (unseen classes fall back to the global Θ).
        class_ids (list[int] | None): the category ids with their own Θ (the ids seen in training).
        num_classes (int | None): shorthand for ``class_ids = range(num_classes)``.
        normalize_box (bool): fuse boxes as ŶᵀΘ / 1ᵀΘ (the score stays ŶᵀΘ[4]).
        eps (float): the clamp of θᵢpᵢ in J_cls and the lower bound of θᵢ after each optimizer step.
        lambda_reg, lambda_cls, lambda_cons (float): weights of J_reg, J_cls, J_cons (the seed: all 1).
        shrinkage (float): strength of the L2 pull of each per-class Θ toward the global Θ.
        match_iou (float): the matching IoU the head was trained with; the ``theta`` fuser's default.

    Parameters: ``theta (Tensor[N])`` and, when ``per_class``, ``class_theta (Tensor[K, N])``, all
    initialized to 1/N (which fuses exactly like the ``mean`` fuser); buffer ``class_ids (Tensor[K])``.
    """

    type_name = "theta"
    #: the label space the head was trained in, {category id: name} (set by fit_head, saved with the head);
    #: None when unknown.
    label_space: dict[int, str] | None = None

    def __init__(
        self,
        model_names: Sequence[str],
        per_class: bool = False,
        class_ids: Sequence[int] | None = None,
        num_classes: int | None = None,
        normalize_box: bool = False,
        eps: float = 1e-6,
        lambda_reg: float = 1.0,
        lambda_cls: float = 1.0,
        lambda_cons: float = 1.0,
        shrinkage: float = 0.01,
        match_iou: float = 0.55,
    ) -> None:
        super().__init__()
        self.model_names = check_model_names(model_names)
        if not isinstance(per_class, bool) or not isinstance(normalize_box, bool):
            raise TypeError(
                f"per_class and normalize_box must be bool, got {per_class!r} and {normalize_box!r}"
            )
        self.per_class = per_class
        self.normalize_box = normalize_box
        self.eps = check_real(eps, "eps", 0.0, 0.5, low_open=True, high_open=True)
        self.lambda_reg = check_number(lambda_reg, "lambda_reg")
        self.lambda_cls = check_number(lambda_cls, "lambda_cls")
        self.lambda_cons = check_number(lambda_cons, "lambda_cons")
        self.shrinkage = check_number(shrinkage, "shrinkage")
        self.match_iou = check_match_iou(match_iou)

        if class_ids is not None and num_classes is not None:
            raise ValueError("give class_ids or num_classes, not both")
        if num_classes is not None:
            num_classes = check_int(num_classes, "num_classes", 0)
            class_ids = list(range(num_classes))
        if per_class and class_ids is None:
            raise ValueError(
                "per_class=True needs class_ids (the category ids seen in training) or num_classes"
            )
        if not per_class and class_ids is not None:
            raise ValueError("class_ids / num_classes apply only with per_class=True")
        ids = check_class_ids(class_ids)
        if len(set(ids)) != len(ids):
            raise ValueError(f"class_ids must be unique, got {ids!r}")
        ids = sorted(ids)

        num_models = len(self.model_names)
        self.theta = nn.Parameter(torch.full((num_models,), 1.0 / num_models))
        self.register_buffer("class_ids", torch.tensor(ids, dtype=torch.int64).reshape(-1))
        if per_class:
            self.class_theta = nn.Parameter(torch.full((len(ids), num_models), 1.0 / num_models))
        else:
            self.register_parameter("class_theta", None)

    # ---------------------------------------------------------------------------------------- properties
    @property
    def num_models(self) -> int:
        return len(self.model_names)

    def config(self) -> dict[str, Any]:
        """The constructor options (JSON-serializable), as saved with the head."""
        return {
            "per_class": self.per_class,
            "class_ids": self.class_ids.tolist() if self.per_class else None,
            "normalize_box": self.normalize_box,
            "eps": self.eps,
            "lambda_reg": self.lambda_reg,
            "lambda_cls": self.lambda_cls,
            "lambda_cons": self.lambda_cons,
            "shrinkage": self.shrinkage,
            "match_iou": self.match_iou,
        }

    def extra_repr(self) -> str:
        classes = f", classes={self.class_ids.numel()}" if self.per_class else ""
        return f"model_names={self.model_names}, per_class={self.per_class}{classes}, normalize_box={self.normalize_box}"

    def _check_clusters(self, clusters: Clusters) -> Clusters:
        return clusters_in_member_order(clusters, self.model_names, "Θ head")

    # ------------------------------------------------------------------------------------------ fusion
    def class_rows(self, labels: Tensor) -> Tensor:
        """Tensor[C] int64: the row of ``class_theta`` for each label, -1 for classes without their own Θ."""
        labels = labels.to(self.class_ids.device)
        if not self.per_class:
            return torch.full_like(labels, -1)
        return class_positions(self.class_ids, labels)

    def cluster_theta(self, labels: Tensor) -> Tensor:
        """Tensor[C, N]: the Θ used for each cluster (its class's Θ, else the global Θ), on the head's device."""
        num = labels.shape[0]
        global_theta = self.theta[None, :].expand(num, -1)
        if not self.per_class or self.class_ids.numel() == 0:
            return global_theta
        rows = self.class_rows(labels)
        own = self.class_theta[rows.clamp(min=0)]  # [C, N]
        return torch.where((rows >= 0)[:, None], own, global_theta)

    def _fused(self, theta: Tensor, preds: Tensor) -> tuple[Tensor, Tensor]:
        fused, _ = _forward_parts(theta, preds, self.normalize_box)  # [C, 5]
        return fused[:, :4], fused[:, 4].clamp(0.0, 1.0)

    def forward(self, clusters: Clusters) -> tuple[Tensor, Tensor]:
        """Fuse each cluster: A = ŶᵀΘ.

        Returns:
            boxes (Tensor[C, 4]): fused normalized boxes (ŶᵀΘ[:4], or divided by 1ᵀΘ with ``normalize_box``).
            scores (Tensor[C]): ŶᵀΘ[4] clamped to [0, 1].
        Both on the clusters' device, in the promoted dtype of Θ and the predictions.
        """
        clusters = self._check_clusters(clusters)
        dtype = torch.promote_types(self.theta.dtype, clusters.preds.dtype)
        theta = self.cluster_theta(clusters.labels).to(device=clusters.device, dtype=dtype)
        return self._fused(theta, clusters.preds.to(dtype))

    @torch.no_grad()
    def fuse(self, clusters: Clusters) -> Detections:
        """Fused pixel Detections (clipped to the image, sorted by score), source ``"fused:theta"``."""
        with without_autocast(self, clusters.device):
            boxes, scores = self(clusters)
        return clusters.to_detections(boxes, scores, source=f"fused:{self.type_name}")

    # ----------------------------------------------------------------------------------------- training
    def stack_batch(
        self, clusters: Clusters | Sequence[Clusters], targets: Targets | Sequence[Targets]
    ) -> tuple[Tensor, Tensor, Tensor, Targets]:
        """Concatenate the clusters and targets of several images into one batch for :meth:`loss_on_batch`.

        Returns:
            preds (Tensor[C, N, 5]), present (Tensor[C, N]), labels (Tensor[C]), Targets of C clusters.
        """
        clusters_list = _as_list(clusters, Clusters, "clusters")
        targets_list = _as_list(targets, Targets, "targets")
        if len(clusters_list) != len(targets_list):
            raise ValueError(
                f"got {len(clusters_list)} Clusters but {len(targets_list)} Targets; one per image"
            )
        clusters_list = [self._check_clusters(c) for c in clusters_list]
        for i, (c, t) in enumerate(zip(clusters_list, targets_list, strict=True)):
            if len(c) != len(t):
                raise ValueError(f"image {i}: {len(c)} clusters but {len(t)} targets")
        device = clusters_list[0].device if clusters_list else self.theta.device
        if not clusters_list:
            n = self.num_models
            empty = Clusters.empty(n, (1, 1), device)
            return empty.preds, empty.present, empty.labels, Targets.empty(device)
        preds = torch.cat([c.preds.to(device) for c in clusters_list])
        present = torch.cat([c.present.to(device) for c in clusters_list])
        labels = torch.cat([c.labels.to(device) for c in clusters_list])
        return preds, present, labels, Targets.cat([t.to(device) for t in targets_list])

    def _objective(self, theta: Tensor, preds: Tensor, present: Tensor, targets: Targets) -> Tensor:
        dtype = theta.dtype
        return theta_loss(
            theta,
            preds.to(dtype),
            present,
            targets.y(dtype),
            targets.weights(dtype),
            ~targets.ignore,
            lambda_reg=self.lambda_reg,
            lambda_cls=self.lambda_cls,
            lambda_cons=self.lambda_cons,
            eps=self.eps,
            normalize_box=self.normalize_box,
        )

    def _objective_thetas(self, preds: Tensor, labels: Tensor) -> list[Tensor]:
        """The Θ of each cluster whose J the objective sums (Tensor[C, N] each, on the predictions' device,
        in the promoted dtype): the cluster's own Θ and, with ``per_class``, the global Θ as well."""
        dtype = torch.promote_types(self.theta.dtype, preds.dtype)
        thetas = [self.cluster_theta(labels).to(device=preds.device, dtype=dtype)]
        if self.per_class:
            thetas.append(self.theta[None, :].expand(preds.shape[0], -1).to(device=preds.device, dtype=dtype))
        return thetas

    def shrinkage_pull(self) -> Tensor:
        """Tensor[]: the term of the objective that no cluster carries, shrinkage · Σ_k ‖Θ_k − Θ_global‖²
        with ``per_class`` (else 0)."""
        if not self.per_class:
            return torch.zeros((), device=self.theta.device, dtype=self.theta.dtype)
        return self.shrinkage * ((self.class_theta - self.theta[None, :]) ** 2).sum()

    def loss_on_batch(self, preds: Tensor, present: Tensor, labels: Tensor, targets: Targets) -> Tensor:
        """:meth:`loss` of a batch that :meth:`stack_batch` made.

        Args:
            preds (Tensor[C, N, 5]), present (Tensor[C, N]), labels (Tensor[C]), targets (Targets of C
                clusters): the stacked clusters and their targets.

        Returns:
            Tensor[]: the objective, as :meth:`loss` returns it.
        """
        thetas = self._objective_thetas(preds, labels)
        loss = self._objective(thetas[0], preds, present, targets)
        for theta in thetas[1:]:
            loss = loss + self._objective(theta, preds, present, targets)
        if self.per_class:
            loss = loss + self.shrinkage_pull().to(device=loss.device, dtype=loss.dtype)
        return loss

    @torch.no_grad()
    def objective_sum(self, preds: Tensor, present: Tensor, labels: Tensor, targets: Targets) -> tuple[Tensor, int]:
        """:meth:`loss_on_batch` of a batch before its mean over the clusters that count, without the
        shrinkage pull: over disjoint batches, the sum of these sums divided by the sum of the counts, plus
        :meth:`shrinkage_pull`, is :meth:`loss_on_batch` of them all stacked (to float rounding).

        Args:
            preds (Tensor[C, N, 5]), present (Tensor[C, N]), labels (Tensor[C]), targets (Targets of C
                clusters): a batch of :meth:`stack_batch`.

        Returns:
            (Tensor[], int): Σ over the clusters that count of J (of each Θ the objective sums), and the
            number of those clusters (crowd-ignored ones excluded).
        """
        valid = ~targets.ignore.to(preds.device)
        total = None
        for theta in self._objective_thetas(preds, labels):
            dtype = theta.dtype
            y, w = targets.y(dtype).to(preds.device), targets.weights(dtype).to(preds.device)
            per_cluster, *_ = _cluster_objectives(
                theta, preds.to(dtype), present.to(dtype), y, w, valid,
                self.lambda_reg, self.lambda_cls, self.lambda_cons, self.eps, self.normalize_box,
            )
            total = per_cluster.sum() if total is None else total + per_cluster.sum()
        return total, int(valid.sum())

    def loss(self, clusters: Clusters | Sequence[Clusters], targets: Targets | Sequence[Targets]) -> Tensor:
        """The training objective, a scalar whose backward uses the analytic gradients.

        Args:
            clusters (Clusters | list[Clusters]): the clusters of one image or of several.
            targets (Targets | list[Targets]): their targets (``assign_targets``), in the same order.

        Returns:
            Tensor[]: J of DESIGN.md §2 summed over all clusters of all images and divided by the number
            of clusters counted (crowd-ignored ones excluded). With ``per_class``:
            ``J(Θ_class) + J(Θ_global) + shrinkage · Σ_k ‖Θ_k − Θ_global‖²``.
        """
        return self.loss_on_batch(*self.stack_batch(clusters, targets))

    @torch.no_grad()
    def project_(self) -> None:
        """Keep every θᵢ ≥ ε (called after each optimizer step by :func:`make_optimizer`)."""
        self.theta.clamp_(min=self.eps)
        if self.class_theta is not None:
            self.class_theta.clamp_(min=self.eps)

    def fit(
        self,
        clusters: Clusters | Sequence[Clusters],
        targets: Targets | Sequence[Targets],
        steps: int = 300,
        lr: float = 0.1,
        optimizer: Literal["gd", "adam"] = "gd",
    ) -> list[float]:
        """Full-batch training for ``steps`` steps on fixed targets; returns J before each step."""
        steps = check_int(steps, "steps", 0)
        stacked = self.stack_batch(clusters, targets)
        opt = make_optimizer(self, optimizer, lr)
        history = []
        for step in range(steps):
            opt.zero_grad()
            loss = self.loss_on_batch(*stacked)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"the Θ objective became {float(loss.detach())} at step {step} ({optimizer}, lr={lr}); "
                    "lower the learning rate (or the shrinkage)"
                )
            loss.backward()
            opt.step()
            history.append(float(loss.detach()))
            if step % 100 == 0:
                logger.debug("theta fit step %d: J = %.6f", step, history[-1])
        return history

    # ----------------------------------------------------------------------------------------- files
    def save(self, path: str | Path) -> None:
        """Write the head as ``.json`` or ``.safetensors`` (by suffix), atomically; no pickle."""
        tensors = {"theta": self.theta.detach()}
        if self.per_class:
            tensors["class_theta"] = self.class_theta.detach()
        write_head_file(path, self.type_name, self.model_names, self.config(), tensors, self.label_space)

    @classmethod
    def load(cls, path: str | Path, model_names: Sequence[str] | None = None) -> ThetaHead:
        """Load a head saved by :meth:`save` (on the CPU, in the saved dtype).

        Args:
            path (str | Path): ``.json`` or ``.safetensors``.
            model_names (list[str] | None): the ensemble that will use the head; must be the saved names
                in any order (Θ's entries stay with their models: fusion matches members by name), else
                ``ValueError`` naming both.

        Raises:
            HeadFileError: a config key missing or unknown, ``class_ids`` out of order, or any field or
                tensor the head cannot be built from; the message names the file and the field.
        """
        stored = read_head_for(path, cls.type_name, model_names)
        where = repr(str(path))
        check_config_keys(stored.config, _CONFIG_KEYS, where, cls.type_name)
        check_stored_class_ids(stored.config["class_ids"], where)
        config = dict(stored.config)
        try:
            head = cls(stored.model_names, **config)
        except (TypeError, ValueError) as err:
            raise HeadFileError(f"{where}: invalid theta config: {err}") from err
        expected = {"theta": tuple(head.theta.shape)}
        if head.per_class:
            expected["class_theta"] = tuple(head.class_theta.shape)
        got = {name: tuple(t.shape) for name, t in stored.tensors.items()}
        if got != expected:
            raise HeadFileError(f"{where}: expected tensors {expected}, got {got}")
        dtype = stored.tensors["theta"].dtype
        if not dtype.is_floating_point:
            raise HeadFileError(f"{where}: theta must be floating point, got {dtype}")
        for name, weights in stored.tensors.items():
            # training keeps every θᵢ >= eps: a negative or all-zero row fuses to boxes of no meaning
            if weights.dtype != dtype or (weights < 0).any() or (weights.sum(-1) <= 0).any():
                raise HeadFileError(
                    f"{where}: {name} must hold {str(dtype).removeprefix('torch.')} weights >= 0 with a positive "
                    f"sum per row, got {str(weights.dtype).removeprefix('torch.')} {weights.tolist()}"
                )
        head = head.to(dtype)
        with torch.no_grad():
            head.theta.copy_(stored.tensors["theta"])
            if head.per_class:
                head.class_theta.copy_(stored.tensors["class_theta"])
        head.label_space = stored.label_space
        return head


def make_optimizer(
    head: nn.Module, name: Literal["gd", "adam"] = "gd", lr: float = 0.1, **kwargs: Any
) -> torch.optim.Optimizer:
    """An optimizer over the head's parameters that projects θᵢ ≥ ε after every step.

    Args:
        head (ThetaHead): the head to train.
        name (str): ``"gd"``: the seed's rule Θ ← Θ − α∇J (``torch.optim.SGD`` without momentum);
            ``"adam"``: ``torch.optim.Adam``.
        lr (float): the learning rate α.
        **kwargs: passed to the torch optimizer (e.g. ``betas`` for Adam).
    """
    lr = check_real(lr, "lr", 0.0, low_open=True)
    params = [p for p in head.parameters() if p.requires_grad]
    if name == "gd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(params, lr=lr, **kwargs)
    elif name == "adam":
        optimizer = torch.optim.Adam(params, lr=lr, **kwargs)
    else:
        raise ValueError(f"unknown optimizer {name!r}; valid names: {', '.join(OPTIMIZERS)}")
    project = getattr(head, "project_", None)
    if project is not None:
        optimizer.register_step_post_hook(lambda *_: project())
    return optimizer
