"""Cross-model matching: boxes of N models → per-object N×5 prediction matrices.

Dimension legend: N models, K boxes of all models together, C clusters (matched objects),
S cluster seeds in one round.

The matching is greedy and class-aware, in rounds:

1. the boxes not yet placed are NMS-ed per class (greedy NMS, as ``torchvision.ops.batched_nms``); the
   kept boxes seed new clusters, in descending score order;
2. every other box joins the same-class seed it overlaps most (NMS guarantees such a seed with
   IoU > ``iou_thr`` exists);
3. in each cluster each model keeps its best-scoring box; a model's other boxes there are left for the
   next round, where they seed or join new clusters.

So a cluster holds at most one box per model: ensemble_boxes lets one model put several boxes in one
cluster, which its own author calls a bug (its PR #25, issues #40/#43).

Two formulations of the rounds give the same clusters: tensor operations (``batched_nms`` seeds, a
sparse search for each box's best seed) that run on any device, and on the CPU a compiled loop per class
(``detens._match_kernel``), which avoids the per-operation overhead that dominates small tensor ops
there (5 models × 1000 boxes: ~10 ms instead of ~60 ms).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torchvision.ops import batched_nms, nms

from detens.checks import check_choice, check_iou_thr
from detens.detections import Detections, compute_device

__all__ = ["Clusters", "MATCH_BACKENDS", "match", "check_per_model", "impute_absent_boxes", "weighted_mean_box"]

# Upper bound on the box pairs whose IoUs are computed at once (range_pairs_in_blocks), to bound memory.
_IOU_BLOCK_ELEMENTS = 1 << 22
# Below this many boxes one offset NMS call is faster than torchvision's per-class loop (measured on CPU).
_ONE_CALL_NMS_BOXES = 2000


@dataclass(eq=False)
class Clusters:
    """Matched objects of one image.

    Args:
        preds (Tensor[C, N, 5]): rows ``x1, y1, x2, y2, p`` with coordinates divided by the image
            width/height. A model absent from a cluster has ``p = 0`` and its box imputed with the mean
            of the present rows, so a linear fusion ŶᵀΘ stays a box.
        present (Tensor[C, N] bool): whether model n has a box in cluster c.
        labels (Tensor[C] int64): the class of each cluster.
        source_index (Tensor[C, N] int64): index of the box in ``per_model[n]``, or -1 when absent.
        image_size (tuple[int, int]): ``(height, width)``.
        sources (tuple[str | None, ...] | None): the ``source`` of each model's Detections (:func:`match`
            records them), by which a head puts the models into its own order; None when unknown, and
            then the models are taken to be in the head's order.
    """

    preds: Tensor
    present: Tensor
    labels: Tensor
    source_index: Tensor
    image_size: tuple[int, int]
    sources: tuple[str | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.sources is not None:
            self.sources = tuple(self.sources)
            if len(self.sources) != self.preds.shape[1]:
                raise ValueError(
                    f"Clusters.sources names {len(self.sources)} models but the clusters hold {self.preds.shape[1]}"
                )

    def __len__(self) -> int:
        return int(self.preds.shape[0])

    @property
    def num_models(self) -> int:
        """N, the number of models."""
        return int(self.preds.shape[1])

    @property
    def device(self) -> torch.device:
        """The device of the tensors."""
        return self.preds.device

    def __getitem__(self, index: Tensor | slice) -> Clusters:
        """Select clusters by boolean mask [C], integer indices or slice."""
        return Clusters(
            self.preds[index], self.present[index], self.labels[index], self.source_index[index], self.image_size,
            self.sources,
        )

    def to(self, device: torch.device | str) -> Clusters:
        """The same clusters with every tensor on ``device``."""
        return Clusters(
            self.preds.to(device),
            self.present.to(device),
            self.labels.to(device),
            self.source_index.to(device),
            self.image_size,
            self.sources,
        )

    def select_models(self, columns: Sequence[int]) -> Clusters:
        """The same clusters with model ``columns[j]`` as model j (a reordering, or a subset, of the models)."""
        index = torch.as_tensor(list(columns), dtype=torch.int64, device=self.preds.device)
        return Clusters(
            self.preds[:, index],
            self.present[:, index],
            self.labels,
            self.source_index[:, index],
            self.image_size,
            None if self.sources is None else tuple(self.sources[j] for j in columns),
        )

    def scale(self) -> Tensor:
        """Tensor[4]: (width, height, width, height), the factor from normalized to pixel boxes."""
        height, width = self.image_size
        return self.preds.new_tensor([width, height, width, height])

    def to_detections(self, boxes: Tensor, scores: Tensor, source: str | None = None) -> Detections:
        """Fused normalized ``boxes (Tensor[C, 4])`` and ``scores (Tensor[C])`` → pixel Detections.

        Boxes are clipped to the image, scores to [0, 1], and the result sorted by score.

        Raises:
            ValueError: ``boxes`` or ``scores`` not of one row per cluster (the clusters give the labels).
        """
        num_clusters = len(self)
        if boxes.shape != (num_clusters, 4):
            raise ValueError(f"boxes must have shape [C, 4] = [{num_clusters}, 4], got {list(boxes.shape)}")
        if scores.shape != (num_clusters,):
            raise ValueError(f"scores must have shape [C] = [{num_clusters}], got {list(scores.shape)}")
        pixel = boxes.detach() * self.scale()
        # A fused box is a combination of valid boxes, but make the ordering robust to rounding.
        x1 = torch.minimum(pixel[:, 0], pixel[:, 2])
        x2 = torch.maximum(pixel[:, 0], pixel[:, 2])
        y1 = torch.minimum(pixel[:, 1], pixel[:, 3])
        y2 = torch.maximum(pixel[:, 1], pixel[:, 3])
        pixel = torch.stack([x1, y1, x2, y2], dim=1)
        fused = Detections(pixel, scores.detach().clamp(0, 1), self.labels, self.image_size, source).clip()
        return fused.sort_by_score()

    @classmethod
    def empty(
        cls,
        num_models: int,
        image_size: tuple[int, int],
        device: torch.device | None = None,
        sources: Sequence[str | None] | None = None,
    ) -> Clusters:
        """No clusters (C = 0) of ``num_models`` models, for an image where no model found anything.

        Args:
            num_models (int): N. image_size (tuple[int, int]): ``(height, width)``.
            device (torch.device | None): where the tensors go (None: the default device).
            sources (list[str | None] | None): as for the constructor.
        """
        return cls(
            torch.zeros((0, num_models, 5), device=device),
            torch.zeros((0, num_models), dtype=torch.bool, device=device),
            torch.zeros((0,), dtype=torch.int64, device=device),
            torch.zeros((0, num_models), dtype=torch.int64, device=device),
            image_size,
            None if sources is None else tuple(sources),
        )


def _other_format_hint(value: Any) -> str:
    """Where the outputs of another library go instead of Detections ("" when ``value`` is none of them)."""
    if type(value).__name__ == "Results" and type(value).__module__.startswith("ultralytics"):
        return (": fuse Ultralytics Results with detens.fuse_results (one list of Results per model), or convert "
                "one with detens.convert.results_to_detections")
    if isinstance(value, Mapping) and "boxes" in value:
        return (": fuse torchvision output dicts with detens.TorchvisionFusion, or convert one with "
                "detens.convert.torchvision_to_detections(output, image_size)")
    return ""


def check_per_model(per_model: Sequence[Detections], what: str = "per_model") -> None:
    """Raise a clear error unless ``per_model`` is a non-empty list of Detections of one image, one device."""
    if isinstance(per_model, Detections) or not isinstance(per_model, Sequence):
        raise TypeError(f"{what} must be a list with one Detections per model, got {type(per_model).__name__}")
    if len(per_model) == 0:
        raise ValueError(f"{what} is empty: pass one Detections per model (a model with no boxes is Detections.empty)")
    for i, det in enumerate(per_model):
        if not isinstance(det, Detections):
            raise TypeError(f"{what}[{i}] must be Detections, got {type(det).__name__}{_other_format_hint(det)}")
    sizes = [d.image_size for d in per_model]
    if len(set(sizes)) != 1:
        raise ValueError(f"{what}: models disagree on the image size {sizes}; they must describe one image")
    devices = [d.device for d in per_model]
    if len(set(devices)) != 1:
        raise ValueError(f"{what}: Detections are on different devices {devices}; move them to one device")


def _class_nms(boxes: Tensor, scores: Tensor, labels: Tensor, iou_thr: float) -> Tensor:
    """Class-wise NMS of normalized boxes; the same result as ``batched_nms``.

    Up to ``_ONE_CALL_NMS_BOXES`` boxes one ``nms`` call on class-offset boxes (coordinates lie in [0, 1],
    so an offset of 2 per class keeps classes apart) beats ``batched_nms``'s per-class loop, which it
    takes above 1000 boxes on the CPU; larger sets keep the loop, whose pairwise work is smaller.
    ``labels`` must be class ranks (``0 .. classes - 1``), so that the offsets stay small.
    """
    if boxes.shape[0] > _ONE_CALL_NMS_BOXES:
        return batched_nms(boxes, scores, labels, iou_thr)
    offset = labels.to(boxes.dtype)[:, None] * 2
    return nms(boxes + offset, scores, iou_thr)


def range_pairs_in_blocks(lo: Tensor, hi: Tensor) -> Iterator[tuple[int, int, Tensor, Tensor]]:
    """The pairs (query q, position p) with ``lo[q] <= p < hi[q]``, in blocks of consecutive queries that
    hold at most ``_IOU_BLOCK_ELEMENTS`` pairs together (a query with more is a block of its own), so that
    what is computed per pair never takes memory in proportion to all the pairs at once.

    Args:
        lo, hi (Tensor[Q] int64): each query's range of positions in a sorted sequence (empty where
            ``hi <= lo``).

    Yields:
        begin, end (int): the block's queries ``[begin, end)``; pair_query (Tensor[P] int64): the query of
        each pair, query by query; pair_position (Tensor[P] int64): its position, increasing within a query.
    """
    device = lo.device
    pairs_per_query = (hi - lo).clamp(min=0)  # [Q]
    ends = torch.cumsum(pairs_per_query, 0)
    num_queries, begin = lo.numel(), 0
    while begin < num_queries:
        offset = int(ends[begin - 1]) if begin else 0
        end = int(torch.searchsorted(ends, offset + _IOU_BLOCK_ELEMENTS, right=True))
        end = min(max(end, begin + 1), num_queries)
        counts = pairs_per_query[begin:end]  # [q]
        pair_query = torch.repeat_interleave(torch.arange(begin, end, device=device), counts)  # [P]
        first_pair = torch.cumsum(counts, 0) - counts  # [q]
        rank = torch.arange(pair_query.numel(), device=device) - first_pair.repeat_interleave(counts)  # [P]
        yield begin, end, pair_query, lo[pair_query] + rank
        begin = end


def _grouped_best_seed(
    boxes: Tensor, labels: Tensor, seed_boxes: Tensor, seed_labels: Tensor, iou_thr: float
) -> Tensor:
    """For each box the same-class seed of highest IoU (ties: the lowest seed index).

    Every box has a same-class seed with IoU > ``iou_thr`` (NMS suppressed it, or it is a seed), so the
    best seed is among those. Such a seed overlaps the box along x by more than ``iou_thr`` times either
    width: its width is below ``w / iou_thr`` and its x1 lies in ``(x1 + t·w − w/t, x2 − t·w)`` for the
    box's x1, x2, w and t = ``iou_thr``. A sweep keeps the candidate pairs few: seeds sorted by
    (class, x1), each box's candidates are one contiguous range found by binary search.
    Coordinates must be normalized to [0, 1].

    Args:
        boxes (Tensor[K, 4]), labels (Tensor[K]): boxes to place.
        seed_boxes (Tensor[S, 4]), seed_labels (Tensor[S]).
        iou_thr (float): the NMS threshold that made the seeds.

    Returns:
        Tensor[K] int64: index into the seeds.
    """
    num_boxes, num_seeds = boxes.shape[0], seed_boxes.shape[0]
    device = boxes.device
    classes, seed_group = torch.unique(seed_labels, return_inverse=True)  # [G], [S]
    box_group = torch.searchsorted(classes, labels)  # [K]; every box's class has a seed
    # Keys (class rank · 4 + x1) never mix classes since every x lies in [0, 1].
    seed_key = seed_group.to(seed_boxes.dtype) * 4 + seed_boxes[:, 0]  # [S]
    sorted_key, seed_order = torch.sort(seed_key, stable=True)  # [S]
    widest = torch.zeros(classes.numel(), dtype=seed_boxes.dtype, device=device)
    widest = widest.scatter_reduce(0, seed_group, seed_boxes[:, 2] - seed_boxes[:, 0], reduce="amax")  # [G]
    width = boxes[:, 2] - boxes[:, 0]  # [K]
    reach = widest[box_group]  # [K] how far left a seed's x1 can be and still overlap
    if iou_thr > 0:
        reach = torch.minimum(reach, width / iou_thr - iou_thr * width)
    slack = 1e-5  # rounding never drops the true best seed
    base = box_group.to(boxes.dtype) * 4  # [K]
    lo = torch.searchsorted(sorted_key, base + boxes[:, 0] - reach - slack, right=False)  # [K]
    hi = torch.searchsorted(sorted_key, base + boxes[:, 2] - iou_thr * width + slack, right=True)  # [K]

    best = torch.empty(num_boxes, dtype=torch.int64, device=device)
    for begin, end, pair_box, position in range_pairs_in_blocks(lo, hi):
        pair_seed = seed_order[position]  # [P]
        a, b = boxes[pair_box], seed_boxes[pair_seed]  # [P, 4]
        wh = (torch.minimum(a[:, 2:], b[:, 2:]) - torch.maximum(a[:, :2], b[:, :2])).clamp(min=0)
        inter = wh[:, 0] * wh[:, 1]
        area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
        area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
        iou = inter / (area_a + area_b - inter)  # [P]
        iou = iou.masked_fill(seed_labels[pair_seed] != labels[pair_box], -1.0)
        local = pair_box - begin
        best_iou = torch.full((end - begin,), -1.0, dtype=iou.dtype, device=device)
        best_iou = best_iou.scatter_reduce(0, local, iou, reduce="amax")
        candidate = torch.where(iou == best_iou[local], pair_seed, num_seeds)
        chosen = torch.full((end - begin,), num_seeds, dtype=torch.int64, device=device)
        best[begin:end] = chosen.scatter_reduce(0, local, candidate, reduce="amin")
    return best


MATCH_BACKENDS = ("auto", "compiled", "tensor")


def match(per_model: Sequence[Detections], iou_thr: float = 0.55, *, backend: str = "auto") -> Clusters:
    """Match the boxes of N models into clusters of at most one box per model.

    Args:
        per_model (list[Detections]): one Detections per model, all of the same image and device.
            A model with no boxes is a normal case; so is every model being empty (C = 0).
        iou_thr (float): boxes of one class overlapping by IoU > ``iou_thr`` describe one object; in [0, 1).
        backend (str): ``"compiled"`` runs the rounds as a compiled loop (numba, CPU: the fast path there),
            ``"tensor"`` as tensor operations on the detections' device (the path for GPUs), ``"auto"``
            the first on the CPU and the second elsewhere. Both give the same clusters.

    Returns:
        Clusters: ``preds (Tensor[C, N, 5])``, ``present (Tensor[C, N])``, ``labels (Tensor[C])``,
        ``source_index (Tensor[C, N])``, clusters ordered by matching round, then by seed score, and
        ``sources``, each Detections' ``source`` (by which a head places the models).

    Equal scores (frequent with quantized detectors) are ordered by model, then box index. Boxes are
    clipped to the image first; boxes of zero area after clipping (entirely outside the image, or
    degenerate) match nothing and are dropped, as ``source_index`` shows.

    Raises:
        TypeError: ``per_model`` is no list of Detections.
        ValueError: an empty ``per_model``, Detections of different image sizes or devices, ``iou_thr``
            outside [0, 1), an unknown ``backend``.
    """
    check_per_model(per_model)
    iou_thr = check_iou_thr(iou_thr)
    check_choice(backend, "backend", MATCH_BACKENDS)
    num_models = len(per_model)
    image_size = per_model[0].image_size
    device = per_model[0].device
    sources = tuple(d.source for d in per_model)

    clipped = [d.clip() for d in per_model]
    boxes = torch.cat([d.normalized_boxes() for d in clipped])  # [K, 4]
    scores = torch.cat([d.scores for d in clipped])  # [K]
    labels = torch.cat([d.labels for d in clipped])  # [K]
    model_id = torch.cat(
        [torch.full((len(d),), i, dtype=torch.int64, device=device) for i, d in enumerate(clipped)]
    )  # [K]
    box_id = torch.cat([torch.arange(len(d), device=device) for d in clipped])  # [K]

    has_area = ((boxes[:, 2] - boxes[:, 0]) > 0) & ((boxes[:, 3] - boxes[:, 1]) > 0)
    placeable = has_area.nonzero().squeeze(1)  # [K'] indices into the concatenation
    # One strict order for both paths: descending score, equal scores by model, then box index
    # (quantized INT8 detectors emit many equal scores).
    by_priority = placeable[torch.argsort(scores[placeable], descending=True, stable=True)]  # [K']
    # IoUs in float64: the class offsets of the tensor path's NMS are exact there, so both paths compare
    # the very same IoU values with the threshold.
    # The rounds are discrete (and partly numpy): they see detached copies. ``preds`` below is filled from
    # the inputs themselves, so a head's output stays differentiable with respect to the input boxes.
    work = compute_device(device)  # the rounds' float64 IoUs run where float64 does (not on MPS)
    boxes64 = boxes.detach().to(work, torch.float64)
    if backend == "compiled" or (backend == "auto" and work.type == "cpu"):
        rounds = _compiled_rounds
    else:
        rounds = _tensor_rounds
    chosen, cluster_of, cluster_labels = (
        t.to(device)
        for t in rounds(boxes64, labels.to(work), model_id.to(work), num_models, by_priority.to(work), iou_thr)
    )
    num_clusters = cluster_labels.numel()
    if num_clusters == 0:
        return Clusters.empty(num_models, image_size, device, sources)

    chosen_model = model_id[chosen]
    preds = torch.zeros((num_clusters, num_models, 5), device=device)
    preds[cluster_of, chosen_model, :4] = boxes[chosen]
    preds[cluster_of, chosen_model, 4] = scores[chosen]
    present = torch.zeros((num_clusters, num_models), dtype=torch.bool, device=device)
    present[cluster_of, chosen_model] = True
    source_index = torch.full((num_clusters, num_models), -1, dtype=torch.int64, device=device)
    source_index[cluster_of, chosen_model] = box_id[chosen]

    impute_absent_boxes(preds, present)
    return Clusters(preds, present, cluster_labels, source_index, image_size, sources)


def _compiled_rounds(
    boxes: Tensor, labels: Tensor, model_id: Tensor, num_models: int, by_priority: Tensor, iou_thr: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The rounds as one compiled loop per class (``detens._match_kernel``), on CPU copies of the inputs.

    Args:
        boxes (Tensor[K, 4] float64): normalized boxes; labels (Tensor[K]); model_id (Tensor[K]) in
            ``[0, num_models)``.
        by_priority (Tensor[K'] int64): the boxes to match (positive area), indices into the above, best
            first (descending score, ties by model, then box index).
        iou_thr (float): the matching threshold.

    Returns:
        chosen (Tensor[K'] int64): indices into the K boxes; cluster_of (Tensor[K'] int64): their
        clusters; labels (Tensor[C] int64): the class of each cluster. Clusters are ordered by round,
        then by their seed's priority.
    """
    from detens._match_kernel import cluster_segments

    device = boxes.device
    boxes, labels, model_id, by_priority = (t.cpu() for t in (boxes, labels, model_id, by_priority))
    order = by_priority[torch.argsort(labels[by_priority], stable=True)]  # [K'] class-major, then priority
    _, class_counts = torch.unique_consecutive(labels[order], return_counts=True)
    segment_starts = torch.zeros(class_counts.numel() + 1, dtype=torch.int64)
    torch.cumsum(class_counts, 0, out=segment_starts[1:])
    cluster_of, seed, round_of = (
        torch.from_numpy(a)
        for a in cluster_segments(
            boxes[order].contiguous().numpy(),
            model_id[order].numpy(),
            segment_starts.numpy(),
            float(iou_thr),
            num_models,
        )
    )
    # Renumber clusters by (round, the seed's priority): one unique key per cluster.
    num_placeable = by_priority.numel()
    rank = torch.empty(boxes.shape[0], dtype=torch.int64)
    rank[by_priority] = torch.arange(num_placeable)
    seed_box = order[seed]  # [C] indices into the concatenation
    cluster_order = torch.argsort(round_of * num_placeable + rank[seed_box])  # [C]
    new_id = torch.empty_like(cluster_order)
    new_id[cluster_order] = torch.arange(cluster_order.numel())
    return order.to(device), new_id[cluster_of].to(device), labels[seed_box[cluster_order]].to(device)


def _tensor_rounds(
    boxes: Tensor, labels: Tensor, model_id: Tensor, num_models: int, by_priority: Tensor, iou_thr: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The rounds as tensor operations on the inputs' device; the same contract as ``_compiled_rounds``."""
    device = boxes.device
    # The NMS below keeps classes apart by offsetting boxes by their class: ranks keep the offsets small
    # (a large class id would leave float64 too few bits for the coordinates).
    classes, labels = torch.unique(labels, return_inverse=True)
    # NMS sorts by score: a strictly decreasing stand-in score makes it follow the priority order.
    priority_score = torch.zeros(boxes.shape[0], dtype=boxes.dtype, device=device)
    priority_score[by_priority] = torch.arange(by_priority.numel(), 0, -1, dtype=boxes.dtype, device=device)
    pending = by_priority  # always kept in priority order
    cluster_of_parts: list[Tensor] = []  # per round: cluster id of each chosen box
    chosen_parts: list[Tensor] = []  # per round: indices of the chosen boxes
    seed_label_parts: list[Tensor] = [labels[:0]]
    num_clusters = 0
    while pending.numel():
        p_boxes, p_labels = boxes[pending], labels[pending]
        seeds = _class_nms(p_boxes, priority_score[pending], p_labels, iou_thr)  # [S] positions in pending
        seed_of = torch.empty_like(p_labels)  # [K'] in [0, S)
        seed_of[seeds] = torch.arange(seeds.numel(), device=device)
        joiners = torch.ones_like(p_labels, dtype=torch.bool)
        joiners[seeds] = False
        if joiners.any():
            seed_of[joiners] = _grouped_best_seed(
                p_boxes[joiners], p_labels[joiners], p_boxes[seeds], p_labels[seeds], iou_thr
            )

        # In each (cluster, model) keep the first box in priority order: a stable sort by key.
        key = seed_of * num_models + model_id[pending]
        by_key = torch.argsort(key, stable=True)
        sorted_key = key[by_key]
        first = torch.ones_like(sorted_key, dtype=torch.bool)
        first[1:] = sorted_key[1:] != sorted_key[:-1]
        winners = by_key[first]

        chosen_parts.append(pending[winners])
        cluster_of_parts.append(seed_of[winners] + num_clusters)
        seed_label_parts.append(p_labels[seeds])
        num_clusters += seeds.numel()
        left = torch.zeros_like(first)
        left[by_key[~first]] = True
        pending = pending[left]  # keeps the priority order
    if not chosen_parts:
        return by_priority, by_priority, classes[:0]
    return torch.cat(chosen_parts), torch.cat(cluster_of_parts), classes[torch.cat(seed_label_parts)]


def weighted_mean_box(boxes: Tensor, weights: Tensor, members: Tensor) -> Tensor:
    """Tensor[C, 4]: Σᵢ wᵢ boxᵢ / Σᵢ wᵢ over the members i of each cluster; finite and inside their hull.

    Args:
        boxes (Tensor[C, N, 4]): one box per model.
        weights (Tensor[C, N]): non-negative weights (a selection, scores, model weights; may carry grad).
        members (Tensor[C, N] bool): the rows that take part.

    A cluster whose members all weigh 0 gets their plain mean; one without members gets 0. The weights
    are divided by their cluster's largest first: tiny weights (1e-45 in float32) would otherwise
    underflow ``w · box`` and the total to 0. The result is clamped to the members' range, which it can
    only leave by rounding.
    """
    members_f = members.to(boxes.dtype)
    weights = weights * members_f  # [C, N]
    top = weights.amax(1, keepdim=True)  # [C, 1]
    positive = top > 0
    weights = torch.where(positive, weights / torch.where(positive, top, torch.ones_like(top)), members_f)
    mean = (boxes * weights[..., None]).sum(1) / weights.sum(1, keepdim=True).clamp(min=1)  # [C, 4]
    outside = ~members[..., None]
    low = boxes.masked_fill(outside, float("inf")).amin(1)  # [C, 4]
    high = boxes.masked_fill(outside, float("-inf")).amax(1)
    has = members.any(1, keepdim=True)
    return torch.where(has, torch.minimum(torch.maximum(mean, low), high), mean)


def impute_absent_boxes(preds: Tensor, present: Tensor) -> None:
    """In place: rows of absent models get the mean box of the present rows and score 0.

    Args:
        preds (Tensor[C, N, 5]), present (Tensor[C, N] bool): every cluster has at least one present row.
    """
    mean_box = weighted_mean_box(preds[..., :4], present.to(preds.dtype), present)  # [C, 4]
    absent = ~present
    preds[..., :4] = torch.where(absent[..., None], mean_box[:, None, :], preds[..., :4])
    preds[..., 4] = preds[..., 4].masked_fill(absent, 0.0)
