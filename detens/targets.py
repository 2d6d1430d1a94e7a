"""Ground truth → per-cluster training targets for the fusion heads.

Dimension legend: C clusters (matched objects of one image), G ground-truth boxes of that image.

A cluster is matched to a ground-truth box of its class at IoU ≥ ``iou_thr`` (0.5), one-to-one, greedily
in descending fused score, as COCO evaluation matches detections (``COCOeval.evaluateImg``):

1. each cluster, in score order, takes the still-unmatched non-crowd GT box of its class with the
   highest IoU ≥ ``iou_thr`` (ties: the highest GT index, as COCO's ``>=`` scan picks the last), the IoU
   computed in float64 pixels as COCO does (normalized coordinates would round an IoU of exactly 0.5
   below it);
2. a cluster that finds none but overlaps a *crowd* GT box (``iscrowd=1``) of its class with
   ``intersection / area(cluster box) ≥ iou_thr`` (COCO's crowd IoU) is **ignored**: COCO neither
   rewards nor penalizes it, so it contributes no loss. Crowd boxes can absorb any number of clusters;
3. every other cluster is unmatched (a false positive): label 0 and no box target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import box_iou

from detens.checks import check_real, first_few, torch_ready_array
from detens.detections import check_xyxy, compute_device
from detens.matching import Clusters

__all__ = ["Targets", "assign_targets"]


@dataclass(eq=False)
class Targets:
    """Per-cluster targets of one image (or of several, concatenated with :meth:`cat`).

    Args:
        boxes (Tensor[C, 4]): the matched GT box, normalized xyxy (divided by width/height); zeros when
            the cluster is not matched. NaN or inf is a ``ValueError``.
        matched (Tensor[C] bool): the cluster found a GT box (target label 1); otherwise label 0.
        ignore (Tensor[C] bool): the cluster matched only a crowd GT box and contributes no loss.
        gt_index (Tensor[C] int64 | None): index of the matched GT box, -1 when not matched
            (filled with -1 when None).
    """

    boxes: Tensor
    matched: Tensor
    ignore: Tensor
    gt_index: Tensor | None = None

    def __post_init__(self) -> None:
        if self.boxes.ndim != 2 or self.boxes.shape[1] != 4:
            raise ValueError(f"Targets.boxes must have shape [C, 4], got {list(self.boxes.shape)}")
        num = self.boxes.shape[0]
        device = self.boxes.device
        if self.gt_index is None:
            self.gt_index = torch.full((num,), -1, dtype=torch.int64, device=device)
        for name in ("matched", "ignore", "gt_index"):
            tensor = getattr(self, name)
            if not isinstance(tensor, Tensor) or tensor.shape != (num,):
                shape = list(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
                raise ValueError(f"Targets.{name} must have shape [C] = [{num}] to match boxes, got {shape}")
        if self.matched.dtype != torch.bool or self.ignore.dtype != torch.bool:
            raise TypeError(
                f"Targets.matched and Targets.ignore must be bool, got {self.matched.dtype} and {self.ignore.dtype}"
            )
        # one test (one device sync) for both mistakes; a NaN or inf box would make every loss on it NaN
        if bool((self.matched & self.ignore).any() | ~torch.isfinite(self.boxes).all()):
            if (self.matched & self.ignore).any():
                i = int((self.matched & self.ignore).nonzero()[0])
                raise ValueError(f"Targets: cluster {i} is both matched and ignored")
            i = int((~torch.isfinite(self.boxes)).any(1).nonzero()[0])
            raise ValueError(f"Targets.boxes must be finite, got {self.boxes[i].tolist()} for cluster {i}")

    def __len__(self) -> int:
        return int(self.boxes.shape[0])

    @property
    def device(self) -> torch.device:
        """The device of the tensors."""
        return self.boxes.device

    def __getitem__(self, index: Tensor | slice) -> Targets:
        return Targets(self.boxes[index], self.matched[index], self.ignore[index], self.gt_index[index])

    def to(self, device: torch.device | str) -> Targets:
        """The same targets with every tensor on ``device``."""
        return Targets(
            self.boxes.to(device), self.matched.to(device), self.ignore.to(device), self.gt_index.to(device)
        )

    @classmethod
    def empty(cls, device: torch.device | str | None = None) -> Targets:
        """The targets of no cluster (C = 0), on ``device`` (None: the default device)."""
        return cls(
            torch.zeros((0, 4), device=device),
            torch.zeros((0,), dtype=torch.bool, device=device),
            torch.zeros((0,), dtype=torch.bool, device=device),
        )

    @classmethod
    def cat(cls, items: Sequence[Targets]) -> Targets:
        """Concatenate the targets of several images (in the same order as their clusters)."""
        if not items:
            return cls.empty()
        return cls(
            torch.cat([t.boxes for t in items]),
            torch.cat([t.matched for t in items]),
            torch.cat([t.ignore for t in items]),
            torch.cat([t.gt_index for t in items]),
        )

    def y(self, dtype: torch.dtype | None = None) -> Tensor:
        """Tensor[C, 5]: the target ``y`` of DESIGN.md §2: GT box (zeros if unmatched) and label 1 / 0."""
        dtype = dtype or self.boxes.dtype
        return torch.cat([self.boxes.to(dtype), self.matched.to(dtype)[:, None]], dim=1)

    def weights(self, dtype: torch.dtype | None = None) -> Tensor:
        """Tensor[C, 5]: the regression weights ``w``: ``(1,1,1,1,1)`` if matched, ``(0,0,0,0,1)`` if not."""
        dtype = dtype or self.boxes.dtype
        w = self.matched.to(dtype)[:, None].expand(-1, 5).clone()
        w[:, 4] = 1
        return w


def _whole(value: Any, name: str, device: torch.device) -> Tensor:
    """``value`` (ids or flags, one per box) as a flat int64 tensor; a fractional value is an error, not
    truncated, and so is a value of more than one dimension, not flattened."""
    tensor = _as_tensor(value, torch.float64, device, name) if not _is_integer(value) else None
    if tensor is not None:
        tensor = _one_dimensional(tensor, name)
        fractional = tensor != tensor.round()
        if bool(fractional.any()) or not bool(torch.isfinite(tensor).all()):
            i = int((fractional | ~torch.isfinite(tensor)).nonzero()[0])
            raise ValueError(f"{name}[{i}] = {tensor[i].item()} is not a whole number")
    return _one_dimensional(_as_tensor(value, torch.int64, device, name), name)


def _one_dimensional(tensor: Tensor, name: str) -> Tensor:
    if tensor.ndim > 1:
        raise ValueError(f"{name} must have shape [G], one value per box, got {list(tensor.shape)}")
    return tensor.reshape(-1)


def _is_integer(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return not dtype.is_floating_point
    if dtype is not None:
        return np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.bool_)
    return False


def _as_tensor(value: Any, dtype: torch.dtype, device: torch.device, name: str = "value") -> Tensor:
    if not isinstance(value, Tensor):
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{name} must hold numbers, got {array.dtype} values: {first_few(array.ravel().tolist())}")
        # a big-endian or reversed array (dtype('>f4'), a[::-1]) holds the same numbers, but torch refuses it as it is
        value = torch.as_tensor(torch_ready_array(array))
    return value.detach().to(device=device, dtype=dtype)


def assign_targets(
    clusters: Clusters,
    fused_boxes: Tensor,
    fused_scores: Tensor,
    gt_boxes: Tensor,
    gt_labels: Tensor,
    iou_thr: float = 0.5,
    gt_iscrowd: Tensor | None = None,
) -> Targets:
    """Match the clusters of one image to its ground truth (COCO-style, see the module docstring).

    Args:
        clusters (Clusters): C clusters; their ``labels`` are in the same label space as ``gt_labels``.
        fused_boxes (Tensor[C, 4]): the fused boxes, normalized xyxy (what a head returns).
        fused_scores (Tensor[C]): the fused scores; they fix the greedy order.
        gt_boxes (Tensor[G, 4]): ground-truth boxes, xyxy in absolute pixels.
        gt_labels (Tensor[G]): their class ids.
        iou_thr (float): minimum IoU for a match, in (0, 1].
        gt_iscrowd (Tensor[G] bool | None): COCO ``iscrowd`` flags; crowd boxes only make clusters ignored.

    Returns:
        Targets with ``boxes`` normalized by ``clusters.image_size``, on the clusters' device.

    Raises:
        TypeError: ``clusters`` not Clusters, or an input that holds no numbers.
        ValueError: an input of the wrong shape (naming it and the shape it needs), fused boxes or scores that
            are not finite, a negative ``gt_labels`` entry, ``gt_iscrowd`` flags other than 0/1, ``iou_thr``
            outside (0, 1].
    """
    iou_thr = check_real(iou_thr, "iou_thr", 0.0, 1.0, low_open=True)
    if not isinstance(clusters, Clusters):
        raise TypeError(f"clusters must be Clusters (detens.match's output), got {type(clusters).__name__}")
    device = clusters.device
    num_clusters = len(clusters)
    dtype = (
        fused_boxes.dtype
        if isinstance(fused_boxes, Tensor) and fused_boxes.is_floating_point()
        else torch.float32
    )
    fused_boxes = _as_tensor(fused_boxes, dtype, device, "fused_boxes")
    fused_scores = _as_tensor(fused_scores, dtype, device, "fused_scores")
    if fused_boxes.shape != (num_clusters, 4):
        raise ValueError(
            f"fused_boxes must have shape [C, 4] = [{num_clusters}, 4], got {list(fused_boxes.shape)}"
        )
    if fused_scores.shape != (num_clusters,):
        raise ValueError(
            f"fused_scores must have shape [C] = [{num_clusters}], got {list(fused_scores.shape)}"
        )
    if not (bool(torch.isfinite(fused_boxes).all()) and bool(torch.isfinite(fused_scores).all())):
        raise ValueError("fused_boxes and fused_scores must be finite (a head that diverged?)")
    gt_boxes = _as_tensor(gt_boxes, dtype, device, "gt_boxes")
    if gt_boxes.numel() == 0:
        gt_boxes = gt_boxes.reshape(0, 4)
    if gt_boxes.ndim != 2 or gt_boxes.shape[1] != 4:
        raise ValueError(f"gt_boxes must have shape [G, 4], got {list(gt_boxes.shape)}")
    num_gt = gt_boxes.shape[0]
    gt_labels = _whole(gt_labels, "gt_labels", device)
    if gt_labels.shape != (num_gt,):
        raise ValueError(
            f"gt_labels must have shape [G] = [{num_gt}] to match gt_boxes, got {list(gt_labels.shape)}"
        )
    if bool((gt_labels < 0).any()):
        i = int((gt_labels < 0).nonzero()[0])
        raise ValueError(f"gt_labels[{i}] = {int(gt_labels[i])} is negative: class ids are >= 0")
    if gt_iscrowd is None:
        crowd = torch.zeros(num_gt, dtype=torch.bool, device=device)
    else:
        flags = _whole(gt_iscrowd, "gt_iscrowd", device)
        if bool(((flags != 0) & (flags != 1)).any()):
            raise ValueError(f"gt_iscrowd must hold 0/1 flags, got {flags.unique().tolist()}")
        crowd = flags.bool()
        if crowd.shape != (num_gt,):
            raise ValueError(f"gt_iscrowd must have shape [G] = [{num_gt}], got {list(crowd.shape)}")
    check_xyxy(gt_boxes, "gt_boxes")

    height, width = clusters.image_size
    size = gt_boxes.new_tensor([width, height, width, height])
    gt_norm = gt_boxes / size  # [G, 4]
    work = compute_device(device)  # COCO's IoUs in float64, where float64 runs (not on MPS)
    fused_pixels = fused_boxes.detach().to(work, torch.float64) * size.to(work, torch.float64)  # [C, 4]
    gt_pixels = gt_boxes.to(work, torch.float64)
    matched = torch.zeros(num_clusters, dtype=torch.bool, device=device)
    ignore = torch.zeros(num_clusters, dtype=torch.bool, device=device)
    gt_index = torch.full((num_clusters,), -1, dtype=torch.int64, device=device)
    if num_clusters == 0 or num_gt == 0:
        return Targets(torch.zeros((num_clusters, 4), dtype=dtype, device=device), matched, ignore, gt_index)

    same_class = clusters.labels[:, None] == gt_labels[None, :]  # [C, G]
    iou = box_iou(fused_pixels, gt_pixels)  # [C, G] float64 on ``work``
    candidate = same_class & ~crowd[None, :] & (iou >= iou_thr).to(device)  # [C, G]

    # Greedy one-to-one assignment in score order: sequential by nature, so it runs on the (few) clusters
    # with at least one candidate, over numpy rows of the precomputed IoU matrix.
    order = torch.argsort(fused_scores, descending=True, stable=True)
    order = order[candidate[order].any(1)].cpu().numpy()
    cand_np = candidate.cpu().numpy()
    iou_np = np.where(cand_np, iou.detach().cpu().numpy(), -np.inf)  # [C, G]
    taken = np.zeros(num_gt, dtype=bool)
    assigned = np.full(num_clusters, -1, dtype=np.int64)
    for c in order:
        row = np.where(taken, -np.inf, iou_np[c])
        g = num_gt - 1 - int(row[::-1].argmax())  # the last of equal IoUs
        if row[g] > -np.inf:
            assigned[c] = g
            taken[g] = True
    gt_index = torch.from_numpy(assigned).to(device)
    matched = gt_index >= 0
    boxes = torch.where(matched[:, None], gt_norm[gt_index.clamp(min=0)], torch.zeros_like(fused_boxes))

    if crowd.any():
        lt = torch.maximum(fused_pixels[:, None, :2], gt_pixels[None, :, :2])  # [C, G, 2]
        rb = torch.minimum(fused_pixels[:, None, 2:], gt_pixels[None, :, 2:])
        inter = (rb - lt).clamp(min=0).prod(-1)  # [C, G]
        area = (fused_pixels[:, 2:] - fused_pixels[:, :2]).clamp(min=0).prod(-1)  # [C]
        crowd_iou = inter / area[:, None].clamp(min=torch.finfo(torch.float64).tiny)
        ignore = ~matched & (same_class & crowd[None, :] & (crowd_iou >= iou_thr).to(device)).any(1)
    return Targets(boxes, matched, ignore, gt_index)
