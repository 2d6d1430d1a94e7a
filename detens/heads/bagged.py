"""The bagged head: several network heads of one type, each fitted on its own bootstrap sample of the
training images with its own seed, whose fused boxes and scores are averaged.

Dimension legend: C clusters, B member heads.

Averaging B fits whose training images and initializations differ lowers the variance that fitting a
network on a few hundred images leaves in each one (Breiman's bagging). Every member must fuse the same
models, in the same order, at the same matching IoU, so their clusters are the same and their outputs
can be averaged object by object:

    box = (1/B) Σ_b box_b,    score = (1/B) Σ_b score_b

The saved file holds every member's config and tensors (``member<b>.<tensor>``); nothing is pickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from detens.detections import Detections
from detens.heads._io import (
    HeadFileError,
    check_config_keys,
    clusters_in_member_order,
    read_head_for,
    write_head_file,
)
from detens.heads._net import NetHead, fuse_with
from detens.heads._registry import HEADS
from detens.matching import Clusters

__all__ = ["BaggedHead"]

_CONFIG_KEYS = ("member_type", "members")


@HEADS.register("bagged")
class BaggedHead(nn.Module):
    """The average of network heads of one type (see the module docstring).

    Args:
        members (list[NetHead]): at least one head; all of one type, for the same models in the same
            order, with the same matching IoU.
    """

    type_name = "bagged"
    #: the label space the head was trained in, {category id: name} (set by fit_head, saved with the head);
    #: None when unknown.
    label_space: dict[int, str] | None = None

    def __init__(self, members: Sequence[NetHead]) -> None:
        super().__init__()
        members = list(members)
        if not members:
            raise ValueError("a bagged head needs at least one member head")
        first = members[0]
        for b, member in enumerate(members):
            if not isinstance(member, NetHead):
                raise TypeError(f"member {b} must be a network head (deep, selection, superlearner), got "
                                f"{type(member).__name__}")
            if member.type_name != first.type_name:
                raise ValueError(f"member {b} is a {member.type_name!r} head, member 0 a {first.type_name!r} head")
            if member.model_names != first.model_names:
                raise ValueError(f"member {b} fuses models {member.model_names}, member 0 {first.model_names}")
            if member.match_iou != first.match_iou:
                raise ValueError(f"member {b} matches at IoU {member.match_iou}, member 0 at {first.match_iou}")
        self.members = nn.ModuleList(members)
        self.member_type = first.type_name
        self.model_names = list(first.model_names)
        self.match_iou = first.match_iou

    @property
    def num_models(self) -> int:
        return len(self.model_names)

    @property
    def wrapped_head(self) -> nn.Module:
        """A member, all of one type: the bag runs as that type (see :func:`~detens.fusers.head_methods`)."""
        return self.members[0]

    def extra_repr(self) -> str:
        return f"member_type={self.member_type!r}, members={len(self.members)}, models={self.model_names}"

    def forward(self, clusters: Clusters) -> tuple[Tensor, Tensor]:
        """``(boxes (Tensor[C, 4]) normalized, scores (Tensor[C]))``: the members' outputs averaged."""
        clusters = clusters_in_member_order(clusters, self.model_names, "bagged head")
        outputs = [member(clusters) for member in self.members]
        boxes = torch.stack([b for b, _ in outputs]).mean(0)
        scores = torch.stack([s for _, s in outputs]).mean(0)
        return boxes, scores

    def fuse(self, clusters: Clusters) -> Detections:
        """Fused pixel Detections (clipped to the image, sorted by score), on the clusters' device."""
        return fuse_with(self, clusters)

    def parts(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """``(config, tensors)`` as :meth:`save` writes them: every member's config, and its tensors
        prefixed ``member<b>.``."""
        tensors = {
            f"member{b}.{name}": t.detach()
            for b, member in enumerate(self.members)
            for name, t in member.state_dict().items()
        }
        return {"member_type": self.member_type, "members": [member.config() for member in self.members]}, tensors

    def save(self, path: str | Path) -> None:
        """Write every member's config and tensors as ``.json`` or ``.safetensors``, atomically; no pickle."""
        write_head_file(path, self.type_name, self.model_names, *self.parts(), self.label_space)

    @classmethod
    def load(cls, path: str | Path, model_names: Sequence[str] | None = None) -> BaggedHead:
        """Load a head saved by :meth:`save` (on the CPU); ``model_names`` as for every head
        (:func:`detens.heads.load_head`)."""
        stored = read_head_for(path, cls.type_name, model_names)
        head = cls.from_parts(stored.model_names, stored.config, stored.tensors, repr(str(path)))
        head.label_space = stored.label_space
        return head

    @classmethod
    def from_parts(
        cls, model_names: list[str], config: dict[str, Any], tensors: dict[str, Tensor], where: str
    ) -> BaggedHead:
        """A head from a file's parts (:meth:`parts`), every field checked; ``where`` names the file in errors."""
        check_config_keys(config, _CONFIG_KEYS, where, cls.type_name)
        member_type, configs = config["member_type"], config["members"]
        member_cls = HEADS.get(member_type) if isinstance(member_type, str) and member_type in HEADS else None
        if member_cls is None or not issubclass(member_cls, NetHead):
            raise HeadFileError(f"{where}: member_type must name a network head type, got {member_type!r}")
        if not isinstance(configs, list) or not configs or not all(isinstance(c, dict) for c in configs):
            raise HeadFileError(f"{where}: members must be a non-empty list of member configs")
        prefixes = [f"member{b}." for b in range(len(configs))]
        stray = sorted(n for n in tensors if not any(n.startswith(p) for p in prefixes))
        if stray:
            raise HeadFileError(f"{where}: tensors {stray[:5]} belong to no member of the {len(configs)}")
        members = [
            member_cls.from_parts(
                model_names, member_config,
                {n[len(prefix):]: t for n, t in tensors.items() if n.startswith(prefix)},
                f"{where} member {b}",
            )
            for b, (prefix, member_config) in enumerate(zip(prefixes, configs, strict=True))
        ]
        try:
            return cls(members)
        except (TypeError, ValueError) as err:
            raise HeadFileError(f"{where}: {err}") from err
