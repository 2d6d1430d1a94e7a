"""Shared machinery of the network heads (selection, deep ensemble, Super Learner).

Dimension legend: C clusters, N models, F selected features, E class-embedding width, H hidden width.

A network head owns

- ``model_names`` (the N models; clusters are put into this order by their ``sources``);
- the feature columns it reads (names from :func:`detens.heads._features.feature_names`, chosen by group),
  standardized with the training set's mean and standard deviation (buffers ``feature_mean``,
  ``feature_std``, set by :meth:`NetHead.fit_normalization`);
- an optional learned class embedding (``class_embed`` > 0) over the category ids seen in training
  (buffer ``class_ids``; unseen ids share row 0, which is zero and never trained: no training cluster has
  an unseen class, so anything else in it would be initialization noise);
- its networks (built by the subclass with :func:`make_mlp`).

Saving writes the constructor options as ``config`` and every parameter and buffer as a named tensor
(:mod:`detens.heads._io`: JSON or safetensors, never pickle); loading rebuilds the head from the config
and loads the tensors strictly (names and shapes must match).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torchvision.ops import generalized_box_iou_loss

from detens.detections import Detections
from detens.heads._features import (
    VISIBILITY_GROUPS,
    class_positions,
    cluster_features,
    feature_names,
    has_tiled_members,
    member_visibility,
)
from detens.heads._io import (
    HeadFileError,
    check_class_ids,
    check_config_keys,
    check_int,
    check_match_iou,
    check_model_names,
    check_sizes,
    check_stored_class_ids,
    clusters_in_member_order,
    read_head_for,
    write_head_file,
)
from detens.heads._precision import without_autocast
from detens.matching import Clusters
from detens.targets import Targets

__all__ = [
    "NetHead", "make_mlp", "ACTIVATIONS", "FEATURE_GROUPS", "BASE_FEATURE_GROUPS", "as_list", "check_score_targets",
]

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "silu": nn.SiLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}


def _groups() -> tuple[str, ...]:
    seen: list[str] = []
    for name in feature_names(2):
        group = name.split("[")[0]
        if group not in seen:
            seen.append(group)
    return tuple(seen)


#: Feature groups a head can read (a group is one feature, or its N per-model / P pairwise columns).
FEATURE_GROUPS: tuple[str, ...] = _groups()
#: The groups every ensemble has (visibility only tells tiled members apart).
BASE_FEATURE_GROUPS: tuple[str, ...] = tuple(g for g in FEATURE_GROUPS if g not in VISIBILITY_GROUPS)


def make_mlp(
    in_features: int, hidden: int, depth: int, out_features: int, activation: str = "relu", zero_last: bool = False
) -> nn.Sequential:
    """``depth`` layers z^l = σ(V^l z^{l−1} + b^l) of width ``hidden``, then a linear output layer.

    ``zero_last`` initializes the output layer to zero, so the network starts as the constant 0.
    """
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), ACTIVATIONS[activation]()]
        width = hidden
    out = nn.Linear(width, out_features)
    if zero_last:
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)
    layers.append(out)
    return nn.Sequential(*layers)


def as_list(items: Any, kind: type, what: str) -> list[Any]:
    if isinstance(items, kind):
        return [items]
    if isinstance(items, Sequence) and not isinstance(items, (str, bytes)) and all(isinstance(i, kind) for i in items):
        return list(items)
    raise TypeError(f"{what} must be {kind.__name__} or a list of them, got {type(items).__name__}")


#: the constructor options of every network head, saved in its ``config`` (subclasses add ``extra_config``).
BASE_CONFIG = ("features", "class_ids", "class_embed", "hidden", "depth", "activation", "match_iou")
#: config options that size the networks (checked against what a file stores before anything is built).
SIZE_CONFIG = ("class_embed", "hidden", "depth", "members")


class NetHead(nn.Module):
    """Base of the network heads; see the module docstring.

    Args:
        model_names (list[str]): the ensemble's models, the order of the N axis of its parameters; clusters
            whose ``sources`` name the models are put into this order (else they are taken to be in it).
        features (list[str] | None): feature groups to read (:data:`FEATURE_GROUPS`); None: the
            subclass's ``default_features`` (all groups but visibility when that is None), with the
            visibility groups when a member is a tiled view and the subclass's
            ``visibility_by_default`` is true.
        class_ids (list[int] | None): category ids with their own embedding row (those seen in training).
        class_embed (int): width E of the class embedding; 0 disables it.
        hidden (int): width H of the hidden layers. depth (int): number of hidden layers.
        activation (str): σ of the hidden layers, one of :data:`ACTIVATIONS`.
        match_iou (float): the matching IoU the head was trained with; the ``theta`` fuser's default.
    """

    type_name: ClassVar[str] = ""
    default_features: ClassVar[tuple[str, ...] | None] = None
    #: whether ``features=None`` adds the visibility groups when a member is a tiled view.
    visibility_by_default: ClassVar[bool] = True
    #: constructor options of the subclass (besides the base ones), saved in ``config``.
    extra_config: ClassVar[tuple[str, ...]] = ()
    #: the label space the head was trained in, {category id: name} (set by fit_head, saved with the head);
    #: None when unknown.
    label_space: dict[int, str] | None = None

    def __init__(
        self,
        model_names: Sequence[str],
        features: Sequence[str] | None = None,
        class_ids: Sequence[int] | None = None,
        class_embed: int = 0,
        hidden: int = 64,
        depth: int = 2,
        activation: str = "relu",
        match_iou: float = 0.55,
    ) -> None:
        super().__init__()
        self.model_names = check_model_names(model_names)
        self.match_iou = check_match_iou(match_iou)
        if features is None:
            features = self.default_features if self.default_features is not None else BASE_FEATURE_GROUPS
            if self.visibility_by_default and has_tiled_members(self.model_names):
                features = (*features, *VISIBILITY_GROUPS)
        if isinstance(features, str) or not isinstance(features, Sequence) or not features:
            raise ValueError(f"features must be a non-empty list of feature groups, got {features!r}")
        unknown = [f for f in features if f not in FEATURE_GROUPS]
        if unknown:
            raise ValueError(f"features: unknown feature groups {unknown}; valid groups: {', '.join(FEATURE_GROUPS)}")
        self.features = [g for g in FEATURE_GROUPS if g in set(features)]
        all_names = feature_names(self.num_models)
        columns = [i for i, name in enumerate(all_names) if name.split("[")[0] in set(self.features)]
        if not columns:
            raise ValueError(f"features {list(features)} select no column for {self.num_models} models")
        self.register_buffer("feature_columns", torch.tensor(columns, dtype=torch.int64), persistent=False)
        self.register_buffer("feature_mean", torch.zeros(len(columns)))
        self.register_buffer("feature_std", torch.ones(len(columns)))

        ids = sorted(set(check_class_ids(class_ids)))
        self.register_buffer("class_ids", torch.tensor(ids, dtype=torch.int64).reshape(-1))
        self.class_embed = check_int(class_embed, "class_embed", 0)
        self.hidden = check_int(hidden, "hidden", 1)
        self.depth = check_int(depth, "depth", 0)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        # padding_idx: row 0 (every class unseen in training) starts at zero and gets no gradient, so an
        # unseen class's scores depend on what was learned, not on the random draw of a row nothing trains
        self.embedding = nn.Embedding(len(ids) + 1, self.class_embed, padding_idx=0) if self.class_embed else None

    # ----------------------------------------------------------------------------------- properties
    @property
    def num_models(self) -> int:
        return len(self.model_names)

    @property
    def reads_visibility(self) -> bool:
        return any(group in VISIBILITY_GROUPS for group in self.features)

    @property
    def in_features(self) -> int:
        """Width of the networks' input: F standardized features plus the class embedding."""
        return int(self.feature_columns.numel()) + self.class_embed

    def config(self) -> dict[str, Any]:
        """The constructor options (JSON-serializable), as saved with the head."""
        config = {key: getattr(self, key) for key in (*BASE_CONFIG, *self.extra_config)}
        config["features"] = list(self.features)
        config["class_ids"] = self.class_ids.tolist()
        return config

    def extra_repr(self) -> str:
        return f"model_names={self.model_names}, features={len(self.features)} groups"

    def check_clusters(self, clusters: Clusters, reorder: bool = False) -> Clusters:
        """``clusters`` checked to be of this head's models, put into its model order when ``reorder``
        (else another order is a ``ValueError``)."""
        return clusters_in_member_order(clusters, self.model_names, f"{self.type_name} head", reorder)

    # ------------------------------------------------------------------------------------- features
    def features_of(self, clusters: Clusters) -> Tensor:
        """Tensor[C, F]: the raw (unstandardized) feature columns this head reads, for one image."""
        self.check_clusters(clusters)
        dtype = self.feature_mean.dtype
        visible = member_visibility(self.model_names, clusters) if self.reads_visibility else None
        all_features = cluster_features(clusters, dtype=dtype, visible=visible)
        return all_features[:, self.feature_columns.to(all_features.device)]

    @torch.no_grad()
    def fit_normalization(self, features: Tensor) -> None:
        """Set the standardization from training features (Tensor[C, F], e.g. of all training clusters)."""
        if features.ndim != 2 or features.shape[1] != self.feature_columns.numel():
            raise ValueError(
                f"features must have shape [C, {self.feature_columns.numel()}], got {list(features.shape)}"
            )
        if features.shape[0] == 0:
            return
        features = features.to(self.feature_mean)
        self.feature_mean.copy_(features.mean(0))
        std = features.std(0) if features.shape[0] > 1 else torch.ones_like(self.feature_std)
        self.feature_std.copy_(torch.nan_to_num(std, nan=1.0).clamp(min=1e-6))

    def class_rows(self, labels: Tensor) -> Tensor:
        """Tensor[C] int64: the embedding row of each label (0, the zero row, for ids not seen in training)."""
        return class_positions(self.class_ids, labels) + 1

    def inputs(self, features: Tensor, labels: Tensor) -> Tensor:
        """Tensor[C, F + E]: standardized features and the class embedding, in the head's dtype."""
        x = (features.to(self.feature_mean) - self.feature_mean) / self.feature_std
        if self.embedding is not None:
            x = torch.cat([x, self.embedding(self.class_rows(labels.to(x.device)))], dim=1)
        return x

    # --------------------------------------------------------------------------------------- fusion
    def fuse_features(self, clusters: Clusters, features: Tensor) -> tuple[Tensor, Tensor]:
        """(boxes (Tensor[C, 4]), scores (Tensor[C])) from precomputed :meth:`features_of` output."""
        raise NotImplementedError

    def forward(self, clusters: Clusters) -> tuple[Tensor, Tensor]:
        """Fuse each cluster of one image.

        Returns:
            boxes (Tensor[C, 4]): fused normalized xyxy boxes. scores (Tensor[C]): fused scores in [0, 1].
            On the head's device, in the head's dtype.
        """
        clusters = self.check_clusters(clusters, reorder=True).to(self.feature_mean.device)
        return self.fuse_features(clusters, self.features_of(clusters))

    @torch.no_grad()
    def fuse(self, clusters: Clusters) -> Detections:
        """Fused pixel Detections (clipped to the image, sorted by score), on the clusters' device."""
        return fuse_with(self, clusters)

    # ------------------------------------------------------------------------------------- training
    def loss_features(
        self, clusters: Clusters, features: Tensor, targets: Targets, score_targets: Tensor | None = None
    ) -> Tensor:
        """Tensor[C]: the per-cluster training loss (0 for ignored clusters); see the subclass."""
        raise NotImplementedError

    def loss(
        self,
        clusters: Clusters | Sequence[Clusters],
        targets: Targets | Sequence[Targets],
        score_targets: Tensor | Sequence[Tensor] | None = None,
    ) -> Tensor:
        """The training loss, averaged over the non-ignored clusters of all the given images.

        Args:
            clusters (Clusters | list[Clusters]): the clusters of one image or several.
            targets (Targets | list[Targets]): their targets (``assign_targets``), in the same order.
            score_targets (Tensor[C] | list[Tensor[C]] | None): soft targets in [0, 1] for the fused
                score (e.g. the IoU-threshold fraction of :func:`detens.heads._fit.score_targets`);
                default ``targets.matched``. One outside [0, 1], or NaN, is a ``ValueError``.

        Returns:
            Tensor[]: the mean loss (0 when no cluster counts, e.g. C = 0).
        """
        clusters_list = as_list(clusters, Clusters, "clusters")
        targets_list = as_list(targets, Targets, "targets")
        if len(clusters_list) != len(targets_list):
            raise ValueError(f"got {len(clusters_list)} Clusters but {len(targets_list)} Targets; one per image")
        if score_targets is None:
            soft_list: list[Tensor | None] = [None] * len(clusters_list)
        else:
            soft_list = as_list(score_targets, Tensor, "score_targets")
            if len(soft_list) != len(clusters_list):
                raise ValueError(f"got {len(soft_list)} score_targets for {len(clusters_list)} images")
        device = self.feature_mean.device
        total = self.feature_mean.new_zeros(())
        count = 0
        for i, (c, t, soft) in enumerate(zip(clusters_list, targets_list, soft_list, strict=True)):
            if len(c) != len(t) or (soft is not None and soft.shape != (len(c),)):
                raise ValueError(f"image {i}: {len(c)} clusters but {len(t)} targets / score targets")
            c, t = c.to(device), t.to(device)
            per_cluster = self.loss_features(c, self.features_of(c), t, None if soft is None else soft.to(device))
            total = total + per_cluster.sum()
            count += int((~t.ignore).sum())
        return total / max(count, 1)

    # ---------------------------------------------------------------------------------------- files
    def parts(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """``(config, tensors)`` as :meth:`save` writes them (for heads that hold this one)."""
        return self.config(), {name: t.detach() for name, t in self.state_dict().items()}

    def save(self, path: str | Path) -> None:
        """Write the head as ``.json`` or ``.safetensors`` (by suffix), atomically; no pickle."""
        write_head_file(path, self.type_name, self.model_names, *self.parts(), self.label_space)

    @classmethod
    def load(cls, path: str | Path, model_names: Sequence[str] | None = None) -> NetHead:
        """Load a head saved by :meth:`save` (on the CPU, in the saved dtype).

        The class embedding's row of unseen classes is set to zero, as training keeps it: a file written
        before that rule holds an untrained random row there (its seen classes fuse as they did).

        Args:
            path (str | Path): ``.json`` or ``.safetensors``.
            model_names (list[str] | None): the ensemble that will use the head; must be the saved names
                in any order (fusion matches members by name), else ``ValueError`` naming both.

        Raises:
            HeadFileError: a config key missing or unknown, ``class_ids`` out of order, or any field or
                tensor the head cannot be built from; the message names the file and the field.
        """
        stored = read_head_for(path, cls.type_name, model_names)
        head = cls.from_parts(stored.model_names, stored.config, stored.tensors, repr(str(path)))
        head.label_space = stored.label_space
        return head

    @classmethod
    def from_parts(cls, model_names: list[str], config: dict[str, Any], tensors: dict[str, Tensor], where: str) -> NetHead:
        """A head from a file's parts: its config (every key present, none unknown, class ids sorted) and its
        tensors (checked against the shapes that config builds); ``where`` names the file in errors."""
        check_config_keys(config, (*BASE_CONFIG, *cls.extra_config), where, cls.type_name)
        if not isinstance(config["features"], list):
            # the constructor reads None as its default groups, which need not be the ones trained with,
            # and a default of the same width would pass every tensor shape check
            raise HeadFileError(
                f"{where}: config features must be the list of feature groups the head was trained with, "
                f"got {config['features']!r}"
            )
        check_stored_class_ids(config["class_ids"], where)
        check_sizes(config, tensors, SIZE_CONFIG, where)
        try:
            with torch.device("meta"):  # shapes only: the real head is built once they match the file
                shell = cls(model_names, **config)
        except (TypeError, ValueError) as err:
            raise HeadFileError(f"{where}: invalid {cls.type_name} config: {err}") from err
        shell_state = shell.state_dict()
        expected = {name: tuple(t.shape) for name, t in shell_state.items()}
        got = {name: tuple(t.shape) for name, t in tensors.items()}
        if got != expected:
            raise HeadFileError(f"{where}: expected tensors {expected}, got {got}")
        dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
        if len(dtypes) > 1:
            raise HeadFileError(f"{where}: mixed floating dtypes {sorted(map(str, dtypes))}")
        wrong = sorted(n for n, t in tensors.items() if t.is_floating_point() != shell_state[n].is_floating_point())
        if wrong:
            raise HeadFileError(f"{where}: tensors {wrong} have the wrong kind of dtype (integer vs floating point)")
        if not bool((tensors["feature_std"] > 0).all()):
            raise HeadFileError(f"{where}: feature_std must be > 0 (features are divided by it)")
        head = cls(model_names, **config)
        if not torch.equal(tensors["class_ids"], head.class_ids):
            raise HeadFileError(
                f"{where}: tensor class_ids {tensors['class_ids'].tolist()} differs from the config's class_ids "
                f"{head.class_ids.tolist()}"
            )
        if dtypes:
            head = head.to(dtypes.pop())
        head.load_state_dict(tensors, strict=True)
        if head.embedding is not None:
            # Files written before the unseen row was kept at zero hold its untrained random draw there;
            # the seen classes' rows are untouched.
            with torch.no_grad():
                head.embedding.weight[0].zero_()
        return head


def fuse_with(head: nn.Module, clusters: Clusters) -> Detections:
    """``head(clusters)`` in eval mode as pixel Detections (clipped, sorted by score) on the clusters' device."""
    was_training = head.training
    head.eval()
    try:
        with without_autocast(head, clusters.device):
            boxes, scores = head(clusters)
    finally:
        head.train(was_training)
    device = clusters.device
    return clusters.to_detections(boxes.to(device, clusters.preds.dtype), scores.to(device, clusters.preds.dtype),
                                  source=f"fused:{head.type_name}")


_CLAMP = 1e-6  # keeps log(q) finite in the score loss


def check_score_targets(soft: Tensor) -> None:
    """Raise ``ValueError`` unless every soft score target (Tensor[C]) lies in [0, 1]: binary cross-entropy
    of a target outside it has no minimum (the loss falls below zero without end) and a NaN one makes the
    loss NaN, so either would train the head on nonsense instead of failing."""
    inside = (soft >= 0) & (soft <= 1)  # False for NaN too: one test finds both
    if not bool(inside.all()):
        i = int((~inside).nonzero()[0])
        raise ValueError(
            f"score_targets must lie in [0, 1], got {float(soft[i])} for cluster {i} "
            f"({int((~inside).sum())} of {soft.numel()} outside)"
        )


def score_and_box_loss(
    boxes: Tensor,
    scores: Tensor,
    targets: Targets,
    score_targets: Tensor | None,
    lambda_cls: float,
    lambda_box: float,
) -> Tensor:
    """Tensor[C]: ``lambda_cls`` · BCE(fused score, target) + ``lambda_box`` · GIoU loss (matched clusters
    only); 0 where ignored. ``score_targets`` (Tensor[C] in [0, 1], else ``ValueError``) replaces the 1/0
    matched flags when given.

    Args:
        boxes (Tensor[C, 4]) normalized xyxy, scores (Tensor[C]) in [0, 1]: the fused objects.
    """
    if score_targets is not None:
        check_score_targets(score_targets)
    soft = targets.matched.to(scores.dtype) if score_targets is None else score_targets.to(scores.dtype)
    q = scores.clamp(_CLAMP, 1 - _CLAMP)
    per_cluster = -lambda_cls * (soft * torch.log(q) + (1 - soft) * torch.log1p(-q))
    if lambda_box > 0 and bool(targets.matched.any()):
        matched = targets.matched
        box_loss = generalized_box_iou_loss(boxes[matched], targets.boxes[matched].to(boxes.dtype), reduction="none")
        per_cluster = per_cluster.index_add(0, matched.nonzero().squeeze(1), lambda_box * box_loss)
    return torch.where(targets.ignore, torch.zeros_like(per_cluster), per_cluster)
