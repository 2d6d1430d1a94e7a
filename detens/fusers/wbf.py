"""Weighted boxes fusion: a faithful, vectorized port of ``ensemble_boxes.weighted_boxes_fusion`` (1.0.9).

Dimension legend: N models, K boxes of all models together, G box groups, T boxes in the largest group,
M fused boxes.

The reference algorithm, per class: boxes are visited by descending weighted score; each joins the
fused box it overlaps most if that IoU exceeds ``iou_thr``, otherwise it starts a new one; a fused
box is the score-weighted mean of its members' coordinates. Its confidence is then rescaled
(``conf_type``). This port reproduces the reference's numerics (float64 IoU on normalized boxes,
float32 accumulation of the weighted coordinates, float32 rounding of fused rows), so its output
agrees with ensemble_boxes to float32 precision. Boxes of equal score are visited latest-first and
fused boxes of equal score listed latest-first, as numpy's ``argsort()[::-1]`` does on small arrays
(on larger ones numpy's order of ties is unspecified, so there the two may visit tied boxes in another
order, which can change the clusters themselves: on real detectors' 5-decimal scores, a few fused boxes
of one image in ten differ).

No input at all, or every box filtered out, gives empty Detections, as the reference's WBF does (its NMS
and Soft-NMS crash when every model is empty; ours return empty Detections too).

What differs, on purpose (DESIGN.md §6):

- boxes are in pixels (normalized internally: IoU does not depend on the scale);
- wrong-length or negative weights and unknown ``conf_type`` raise ``ValueError`` (the reference
  silently resets the weights, or prints and exits);
- a cluster whose members all have weighted score 0 gets their plain mean box (the reference divides by 0
  and returns NaN coordinates), and a cluster whose weighted scores sum below 2**-60 is fused in float64
  (where score·box underflows float32, the reference returns a box at the origin): a fused box is always
  finite and inside the hull of its members;
- scores are clipped to [0, 1], the range of ``Detections.scores``. Above 1 happens with
  ``allows_overflow=True`` or with unequal weights when one model puts several boxes into one cluster;
  the order (by the unclipped score) is the reference's;
- the caller's tensors and lists are never modified.

Speed: the classes, and within a class the spatially separated groups of boxes, are independent, so
they advance in lockstep (see ``_lockstep.py``): one vectorized step handles the next box of every
group, and the last few groups, which hold the long tails, finish box by box. The loop is sequential
by nature, so it runs in numpy on the CPU, whatever the input device; the result is returned on the
input device. The compiled loop (the default) compares each box with every fused box of its class, so
the time grows with the square of a class's boxes on a crowded image: one model's 100,000 boxes spread
evenly over a 100,000 px square image take 9.5 s in three classes, 40 s in one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from detens.checks import check_choice, check_flag, check_iou_thr, check_real
from detens.detections import Detections
from detens.fusers._lockstep import LockstepLayout, disjoint_groups, lockstep_layout
from detens.fusers._registry import FUSERS, check_weights
from detens.matching import check_per_model

__all__ = ["wbf_fusion", "CONF_TYPES"]

logger = logging.getLogger(__name__)

ConfType = Literal["avg", "max", "box_and_model_avg", "absent_model_aware_avg"]
CONF_TYPES: tuple[str, ...] = ("avg", "max", "box_and_model_avg", "absent_model_aware_avg")
WBF_BACKENDS: tuple[str, ...] = ("auto", "compiled", "vectorized")

# Rows of the per-cluster state tensor [_STATE, G, T] (one contiguous [G, T] plane per quantity): only
# what the matching of later boxes depends on. Counts, weights and members are gathered after the loop.
_BOX = slice(0, 4)  # fused box used for matching (float64; float32-rounded once a second box joined)
_SUM = slice(4, 8)  # Σ score·box, accumulated in float32 like the reference (held in float64)
_CONF, _AREA, _COUNT = 8, 9, 10  # Σ score, area of the fused box, number of members
_STATE = 11
# Rows of the per-box step data [_STEP, K] (packed by step): what a step needs of a box.
_S_BOX = slice(0, 4)
_S_WEIGHTED = slice(4, 8)  # score·box
_S_AREA, _S_SCORE = 8, 9
_STEP = 10
# With fewer groups than this left, the lockstep hands each remaining group to a per-box loop: a lockstep
# step costs about as much as four per-box steps.
_ALONE_BELOW = 4
# Unused cluster slots hold this box: outside [0, 1], zero area, so its IoU with any box is exactly 0.
_NO_BOX = 2.0
# A cluster whose Σ score is below this is fused in float64: score·box underflows float32 below ~2**-100
# (normalized coordinates are 0 or >= 2**-26), and above this the underflowed part is negligible.
_TINY_CONF = 2.0**-60


def _empty_state(num_groups: int, slots: int) -> np.ndarray:
    state = np.zeros((_STATE, num_groups, slots), dtype=np.float64)
    state[_BOX] = _NO_BOX
    return state


def _guarded_mean(
    mean: np.ndarray, old: np.ndarray, box: np.ndarray, score: np.ndarray, conf: np.ndarray, count: np.ndarray
) -> np.ndarray:
    """The fused box after ``box`` joined, also where the reference's float32 arithmetic cannot give it.

    ``mean`` (the reference's Σ score·box / Σ score) is kept where Σ score >= ``_TINY_CONF``. Below, the
    weighted scores are 0 or so small that score·box underflows float32 (the reference returns a box at
    the origin, or NaN): the running mean is updated in float64 as ``old + r · (box − old)`` with
    r = score / Σ score, or r = 1 / members when every member scores 0 (their plain mean). Either way the
    fused box stays finite, inside its members' hull, and independent of the order of equally scored members.

    Args:
        mean, old, box (ndarray[4, A]): the reference's new fused box, the cluster's fused box before, the box.
        score, conf, count (ndarray[A]): the box's weighted score, the cluster's Σ score and member count.
    """
    keep = conf >= _TINY_CONF
    if keep.all():
        return mean
    ratio = np.where(conf > 0, score / np.where(conf > 0, conf, 1.0), 1.0 / count)  # [A] in [0, 1]
    running = (old + ratio * (box - old)).astype(np.float32)
    return np.where(keep, mean, running)


@np.errstate(divide="ignore", invalid="ignore")  # a cluster scoring 0 divides by 0: see _guarded_mean
def _cluster(
    packed: np.ndarray, layout: LockstepLayout, iou_thr: float, guard: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The reference's clustering loop: all groups in lockstep, then the last few groups one at a time.

    Runs in numpy on the CPU: it is a sequence of tiny dependent steps, where numpy's per-call overhead
    is a fraction of torch's and no device would help.

    Args:
        packed (ndarray[_STEP, K]): the boxes' step data, packed by step (``layout.step_order``).
        iou_thr (float): the matching threshold.
        guard (bool): whether some boxes have a weighted score below ``_TINY_CONF`` (0 included): then
            the reference's arithmetic can fail and :func:`_guarded_mean` checks each new fused box.

    Returns:
        clusters (ndarray[_STATE, M]): the fused boxes, grouped by row, in creation order within a row;
        cluster_of (ndarray[K] int64): the cluster of each box, in packed order.
    """
    num_groups, steps = layout.num_groups, layout.width
    capacity = min(steps, 16)  # cluster slots per group; grows as needed
    state = _empty_state(num_groups, capacity)  # [_STATE, G, capacity]
    slot = np.empty(packed.shape[1], dtype=np.int64)  # the cluster slot of each box, in its group
    num_clusters = np.zeros(num_groups, dtype=np.int64)  # [G]
    rows = np.arange(num_groups)
    width_used = 0  # most clusters in one active group so far: the slots worth comparing with
    alone: dict[int, np.ndarray] = {}  # row -> its clusters, for the rows finished one at a time
    for t, active in enumerate(layout.active):
        if active < _ALONE_BELOW:
            # Few groups left, each with a long tail: per-box steps on one group are far cheaper.
            offsets = np.asarray(layout.offsets[t:-1])
            for g in range(active):
                remaining = int(np.searchsorted(-np.asarray(layout.active[t:]), -g, side="left"))
                columns = offsets[:remaining] + g
                clusters, slot[columns] = _cluster_alone(
                    packed[:, columns], state[:, g, : num_clusters[g]], iou_thr, guard
                )
                alone[g] = clusters
                num_clusters[g] = clusters.shape[1]
            break
        begin = layout.offsets[t]
        data = packed[:, begin : begin + active]  # [_STEP, A]
        box = data[_S_BOX]  # [4, A]
        r = rows[:active]
        if t == 0:
            new = np.ones(active, dtype=bool)
            target = np.zeros(active, dtype=np.int64)
        else:
            # IoU with every slot, computed exactly as the reference does (empty slots give 0).
            fused = state[:, :active, :width_used]  # [_STATE, A, c]
            top_left = np.maximum(fused[0:2], box[0:2, :, None])  # [2, A, c]
            extent = np.minimum(fused[2:4], box[2:4, :, None])
            extent -= top_left
            np.maximum(extent, 0.0, out=extent)
            inter = extent[0] * extent[1]  # [A, c]
            iou = inter / (fused[_AREA] + data[_S_AREA, :, None] - inter)
            best = iou.argmax(1)  # [A] first index among equal IoUs
            new = iou[r, best] <= iou_thr
            target = np.where(new, num_clusters[:active], best)
        num_clusters[:active] += new
        width_used = int(num_clusters[:active].max())
        slot[begin : begin + active] = target
        if width_used > capacity:
            grown = min(steps, 2 * capacity)
            state = np.concatenate([state, _empty_state(num_groups, grown - capacity)], axis=2)
            capacity = grown

        old = state[:, r, target]  # [_STATE, A]
        weighted_sum = (old[_SUM] + data[_S_WEIGHTED]).astype(np.float32)  # the reference's float32 sum
        conf = old[_CONF] + data[_S_SCORE]
        count = old[_COUNT] + 1
        mean = (weighted_sum / conf).astype(np.float32)  # float64 division (conf is float64), rounded
        if guard:
            mean = _guarded_mean(mean, old[_BOX], box, data[_S_SCORE], conf, count)
        fused_box = np.where(new, box, mean)  # [4, A] float64
        size = fused_box[2:4] - fused_box[0:2]
        state[:, r, target] = np.concatenate(
            [fused_box, weighted_sum, conf[None], (size[0] * size[1])[None], count[None]]
        )

    # Number the clusters row by row: cluster id = start of its row + slot.
    start = np.cumsum(num_clusters) - num_clusters  # [G]
    in_state = np.arange(capacity)[None, :] < np.where(np.isin(rows, list(alone)), 0, num_clusters)[:, None]
    clusters = np.empty((_STATE, int(num_clusters.sum())))
    clusters[:, (start[:, None] + np.arange(capacity)[None, :])[in_state]] = state[:, in_state]
    for g, own in alone.items():
        clusters[:, start[g] : start[g] + own.shape[1]] = own
    row_of = layout.row[layout.step_order].numpy()  # [K] row of each packed box
    return clusters, start[row_of] + slot


def _cluster_alone(
    data: np.ndarray, clusters: np.ndarray, iou_thr: float, guard: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The reference's loop for ONE group: box by box, vectorized over the group's clusters only.

    Args:
        data (ndarray[_STEP, n]): the group's remaining boxes in visiting order.
        clusters (ndarray[_STATE, c]): the group's clusters so far.
        guard (bool): as for :func:`_cluster`.

    Returns:
        clusters (ndarray[_STATE, c']), slot (ndarray[n] int64): each box's cluster.
    """
    count, num_boxes = clusters.shape[1], data.shape[1]
    own = _empty_state(1, count + num_boxes)[:, 0]  # [_STATE, capacity]: at most one new cluster per box
    own[:, :count] = clusters
    lows = np.ascontiguousarray(data[0:2].T)[:, :, None]  # [n, 2, 1]
    highs = np.ascontiguousarray(data[2:4].T)[:, :, None]
    slots = np.empty(num_boxes, dtype=np.int64)
    for i, (x1, y1, x2, y2, wx1, wy1, wx2, wy2, area, score) in enumerate(data.T.tolist()):
        k = -1
        if count:
            fused = own[:, :count]  # [_STATE, c]
            extent = np.minimum(fused[2:4], highs[i])  # [2, c] IoU as the reference computes it
            extent -= np.maximum(fused[0:2], lows[i])
            np.maximum(extent, 0.0, out=extent)
            inter = extent[0] * extent[1]
            iou = inter / (fused[_AREA] + area - inter)
            k = int(iou.argmax())  # first index among equal IoUs
            if iou[k] <= iou_thr:
                k = -1
        if k < 0:  # a new cluster: the box itself; Σ score·box = float32(0 + score·box)
            k, count = count, count + 1
            own[:, k] = (x1, y1, x2, y2, *np.array((wx1, wy1, wx2, wy2), np.float32).tolist(), score, area, 1)
        else:
            old = own[:, k].tolist()
            # float32 accumulation, then a float64 division rounded to float32, as the reference
            sums = np.array((old[4] + wx1, old[5] + wy1, old[6] + wx2, old[7] + wy2), np.float32)
            conf = old[_CONF] + score
            members = old[_COUNT] + 1
            if guard:
                with np.errstate(divide="ignore", invalid="ignore"):
                    mean = (sums / np.float64(conf)).astype(np.float32)[:, None]
                box = _guarded_mean(mean, np.array(old[0:4])[:, None], np.array((x1, y1, x2, y2))[:, None],
                                    np.array([score]), np.array([conf]), np.array([members]))[:, 0].tolist()
            else:
                box = (sums / np.float64(conf)).astype(np.float32).tolist()
            own[:, k] = (*box, *sums.tolist(), conf, (box[2] - box[0]) * (box[3] - box[1]), members)
        slots[i] = k
    return own[:, :count], slots


def _cluster_vectorized(
    boxes: Tensor, labels: Tensor, wscore: Tensor, area: Tensor, iou_thr: float
) -> tuple[Tensor, Tensor]:
    """The clustering loop in numpy, spatially separated groups of boxes in lockstep (see :func:`_cluster`).

    Args:
        boxes (Tensor[K, 4] float64): normalized, in visiting order (by class, then descending score).
        labels, wscore, area (Tensor[K]): classes, weighted scores and areas of the boxes.

    Returns:
        clusters (Tensor[M, _STATE] float64), cluster (Tensor[K] int64): the fused boxes' state and each
        box's cluster.
    """
    # A fused box stays within its members' hull up to float32 rounding of its weighted mean: ~K ulps.
    margin = (boxes.shape[0] + 4) * 2.0**-22
    layout = lockstep_layout(disjoint_groups(boxes, labels, margin))
    # Step data, packed by step: the boxes of step t are the columns offsets[t] : offsets[t + 1].
    per_box = torch.cat([boxes, wscore[:, None] * boxes, area[:, None], wscore[:, None]], dim=1)  # [K, _STEP]
    packed = per_box[layout.step_order].T.contiguous()  # [_STEP, K]
    guard = bool((wscore < _TINY_CONF).any())
    clusters, cluster_packed = _cluster(packed.numpy(), layout, iou_thr, guard)
    cluster = torch.empty(boxes.shape[0], dtype=torch.int64)
    cluster[layout.step_order] = torch.from_numpy(cluster_packed)  # [K] each box's cluster, visiting order
    return torch.from_numpy(clusters).T, cluster


@FUSERS.register("wbf")
def wbf_fusion(
    per_model: Sequence[Detections],
    weights: Sequence[float] | Tensor | None = None,
    iou_thr: float = 0.55,
    skip_box_thr: float = 0.0,
    conf_type: ConfType = "avg",
    allows_overflow: bool = False,
    backend: str = "auto",
) -> Detections:
    """Weighted boxes fusion of several models' detections on one image.

    Args:
        per_model (list[Detections]): one per model (N), same image and device; empty ones are fine.
        weights (Sequence[float] | Tensor[N] | None): per-model weights, multiplied into the scores
            (default: all 1); only their ratios matter (they are divided by the largest).
        iou_thr (float): a box joins a fused box of its class when their IoU is greater than this; in [0, 1).
        skip_box_thr (float): boxes scoring below this (before weighting) are ignored; in [0, 1], as scores are.
        conf_type (str): the fused confidence, as in ensemble_boxes: ``"avg"`` (mean weighted score,
            times min(N, boxes)/Σweights), ``"max"`` (max weighted score / max weight),
            ``"box_and_model_avg"``, ``"absent_model_aware_avg"``.
        allows_overflow (bool): with ``"avg"``, scale by the number of boxes even beyond N.
        backend (str): how the clustering loop runs: ``"compiled"`` (numba, box by box; the fast path),
            ``"vectorized"`` (numpy, groups in lockstep) or ``"auto"`` (compiled). Both give the same
            result; the loop is sequential, so it runs on the CPU whatever the input device.

    Returns:
        Detections: fused boxes (M), source ``"fused:wbf"``, on the input device, clipped to the image,
        sorted by score (descending).
    """
    check_per_model(per_model)
    iou_thr = check_iou_thr(iou_thr)
    skip_box_thr = check_real(skip_box_thr, "skip_box_thr", 0.0, 1.0)
    check_choice(conf_type, "conf_type", CONF_TYPES)
    allows_overflow = check_flag(allows_overflow, "allows_overflow")
    check_choice(backend, "backend", WBF_BACKENDS)
    num_models = len(per_model)
    image_size = per_model[0].image_size
    height, width = image_size
    device = per_model[0].device
    cpu = torch.device("cpu")  # the clustering is sequential: see _cluster
    weight = check_weights(weights, num_models, cpu)  # [N] float64, as the reference computes

    # --- prefilter: skip low scores, clip to the image, drop zero-area boxes (as the reference) ----------
    scale = torch.tensor([width, height, width, height], dtype=torch.float64)
    # The clustering runs in numpy: inputs that require grad are read as plain data.
    boxes = (torch.cat([d.boxes for d in per_model]).detach().to(cpu, torch.float64) / scale).clamp(0.0, 1.0)  # [K, 4]
    scores = torch.cat([d.scores for d in per_model]).detach().to(cpu, torch.float64)  # [K]
    labels = torch.cat([d.labels for d in per_model]).to(cpu)  # [K]
    model = torch.cat(
        [torch.full((len(d),), i, dtype=torch.int64) for i, d in enumerate(per_model)]
    )  # [K]
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    kept = ((scores >= skip_box_thr) & (area != 0)).nonzero().squeeze(1)
    if kept.numel() == 0:
        return Detections.empty(image_size, source="fused:wbf", device=device)
    boxes, labels, model, area = boxes[kept], labels[kept], model[kept], area[kept]
    box_weight = weight[model]  # [K]
    wscore = scores[kept] * box_weight  # [K]
    num_boxes = kept.numel()

    # Classes are reported in the order they first appear (the reference's dict order).
    classes, class_of = torch.unique(labels, return_inverse=True)  # [U], [K]
    first_seen = torch.full((classes.numel(),), num_boxes, dtype=torch.int64)
    first_seen.scatter_reduce_(0, class_of, torch.arange(num_boxes), "amin")
    class_rank = torch.argsort(torch.argsort(first_seen))  # [U]

    # Visiting order within a class: descending score, ties latest-first (numpy's argsort()[::-1]).
    order = torch.arange(num_boxes - 1, -1, -1)
    order = order[torch.argsort(wscore[order], descending=True, stable=True)]
    order = order[torch.argsort(labels[order], stable=True)]
    boxes, labels, model, area = boxes[order], labels[order], model[order], area[order]
    box_weight, wscore, class_of = box_weight[order], wscore[order], class_of[order]

    if backend == "vectorized":
        clusters, cluster = _cluster_vectorized(boxes, labels, wscore, area, float(iou_thr))
    else:
        from detens._wbf_kernel import wbf_clusters

        class_starts = torch.cat([torch.tensor([0]), (labels[1:] != labels[:-1]).nonzero().squeeze(1) + 1,
                                  torch.tensor([num_boxes])])  # boxes are sorted by class
        found, cluster_of = wbf_clusters(
            boxes.numpy(), (wscore[:, None] * boxes).numpy(), area.numpy(), wscore.numpy(),
            class_starts.numpy(), float(iou_thr), _TINY_CONF,
        )
        clusters, cluster = torch.from_numpy(found), torch.from_numpy(cluster_of)  # [M, _STATE], [K]
    num_fused = clusters.shape[0]

    # --- per-cluster totals and the rescaled confidence ----------------------------------------------
    count = torch.bincount(cluster, minlength=num_fused).to(torch.float64)  # [M]
    conf = clusters[:, _CONF]
    # Sums run in visiting order, as the reference adds its members (scatter_add is sequential on CPU).
    weight_sum = torch.zeros(num_fused, dtype=torch.float64).scatter_add_(0, cluster, box_weight)
    creator = torch.full((num_fused,), num_boxes, dtype=torch.int64)
    creator.scatter_reduce_(0, cluster, torch.arange(num_boxes), "amin")  # [M] first box
    present = torch.zeros((num_fused, num_models), dtype=torch.bool)
    present[cluster, model] = True
    cluster_class = class_of[creator]  # [M] index into classes

    single = count == 1  # a single-box cluster keeps the raw row; fused rows are float32 in the reference
    if conf_type == "max":
        best_score = torch.zeros(num_fused, dtype=torch.float64)
        best_score.scatter_reduce_(0, cluster, wscore, "amax")
        base = torch.where(single, conf, best_score.float().double())
    else:
        base = torch.where(single, conf, (conf / count).float().double())
    weight_sum = torch.where(single, weight_sum, weight_sum.float().double())
    total = weight.sum()
    if conf_type == "box_and_model_avg":
        fused_score = base * count / weight_sum
        fused_score = fused_score * (present.to(torch.float64) * weight).sum(1) / total
    elif conf_type == "absent_model_aware_avg":
        absent_weight = ((~present).to(torch.float64) * weight).sum(1)
        fused_score = base * count / (weight_sum + absent_weight)
    elif conf_type == "max":
        fused_score = base / weight.max()
    elif not allows_overflow:
        fused_score = base * count.clamp(max=num_models) / total
    else:
        fused_score = base * count / total
    fused_score = torch.nan_to_num(fused_score, nan=0.0)  # 0/0 when every member has weight 0

    # Reference order: classes by first appearance, clusters by creation, then argsort(score)[::-1].
    creation = class_rank[cluster_class] * num_boxes + creator
    by_creation = torch.argsort(creation)
    by_score = by_creation[torch.argsort(fused_score[by_creation], stable=True).flip(0)]

    out_scores = fused_score[by_score]
    if bool((out_scores > 1).any()):
        logger.debug("wbf: %d fused scores above 1 clipped to 1", int((out_scores > 1).sum()))
    out_boxes = (clusters[by_score, _BOX] * scale).float()  # [M, 4]
    # A weighted mean of valid boxes is valid, but keep x1 <= x2 robust to rounding of tiny boxes.
    out_boxes = torch.cat(
        [torch.minimum(out_boxes[:, :2], out_boxes[:, 2:]), torch.maximum(out_boxes[:, :2], out_boxes[:, 2:])], 1
    )
    fused = Detections(
        out_boxes.to(device),
        out_scores.clamp(0.0, 1.0).float().to(device),
        classes[cluster_class[by_score]].to(device),
        image_size,
        "fused:wbf",
    )
    return fused.clip()
