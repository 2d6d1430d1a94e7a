"""Per-cluster features shared by the network heads (selection, deep ensemble, Super Learner).

Dimension legend: C clusters of one image, N models, F features, P = N(N−1)/2 model pairs.

Everything here is computed from one image's :class:`~detens.matching.Clusters` alone (no ground truth),
so the heads see the same features at training and at fusion time:

- per model n (N blocks): presence, score pᵢ, log(pᵢ + 10⁻³), the box's offsets from the mean present box
  (in units of the mean box's width/height), and the IoU of the box with that mean box;
- cluster-level: the fraction of models present, the mean score over all N models (what ``mean`` fusion
  scores), the max and the spread of the present scores, the mean box's log width, log height, log
  aspect ratio, centre;
- agreement: the IoU of every pair of present models (0 where one of them is absent);
- context within the image (the "duplicate" signals a rescoring head needs): the largest IoU with a
  same-class cluster of higher mean score, that cluster's score margin, the number of overlapping
  same-class clusters, the cluster's rank by mean score within its class, its score relative to the best
  same-class score, the largest IoU with a higher-scoring cluster of *another* class, and how the score
  compares with those of other-class clusters at the same place (IoU > 0.7): the best one's share
  s_other / (s_other + s), and this cluster's share of the total s / (s + Σ s_other); and how crowded
  the image is: log(1 + the number of clusters, and of same-class clusters, with mean score > 0.25);
- visibility, for ensembles with tiled test-time views (``name|tiles=2x2``; see
  :mod:`detens.adapters.augmented`), whose members drop every box a tile edge cuts and so are absent from
  large objects by construction: per model whether it could have seen the cluster's mean box whole (1 for
  untiled members), the fraction of those models that are present, and their mean score. The columns
  come last, so that heads saved without them read the same columns as before.

The class enters the networks separately (a learned embedding over the class ids seen in training).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from detens.detections import compute_device
from detens.matching import Clusters, weighted_mean_box

__all__ = [
    "feature_names", "num_features", "cluster_features", "present_mean_box", "present_median_box", "pairwise_iou",
    "class_positions", "member_visibility", "has_tiled_members", "VISIBILITY_GROUPS",
]

_PER_MODEL = ("present", "score", "log_score", "dx1", "dy1", "dx2", "dy2", "iou_mean")
_CLUSTER = ("frac_present", "mean_score", "max_score", "score_spread", "log_w", "log_h", "log_aspect", "cx", "cy")
_CONTEXT = (
    "dup_iou",
    "dup_margin",
    "log_overlaps",
    "log_class_rank",
    "rel_class_score",
    "other_class_iou",
    "other_class_score",
    "other_class_mass",
    "log_image_confident",
    "log_class_confident",
)
#: The feature groups of visibility (read by default only when some member is a tiled view).
VISIBILITY_GROUPS = ("visible", "frac_visible_present", "mean_visible_score")
# A cluster "confidently" found: mean score above this (for the image-level crowd counts).
_CONFIDENT = 0.25
# Same-class clusters overlapping by more than this count as overlapping; other-class ones overlapping by
# more than the second are at the same place.
_OVERLAP_IOU = 0.3
_COLOCATED_IOU = 0.7
# The dense C×C context terms are computed in row blocks of about this many squared pairs.
_BLOCK = 2048


def feature_names(num_models: int) -> list[str]:
    """The names of the F feature columns, in order."""
    names = [f"{name}[{n}]" for n in range(num_models) for name in _PER_MODEL]
    names += list(_CLUSTER)
    names += [f"iou[{i},{j}]" for i in range(num_models) for j in range(i + 1, num_models)]
    names += list(_CONTEXT)
    names += [f"visible[{n}]" for n in range(num_models)] + list(VISIBILITY_GROUPS[1:])
    return names


def num_features(num_models: int) -> int:
    return len(feature_names(num_models))


def present_mean_box(preds: Tensor, present: Tensor) -> Tensor:
    """Tensor[C, 4]: the mean box of the present rows of ``preds (Tensor[C, N, 5])``."""
    return weighted_mean_box(preds[..., :4], present.to(preds.dtype), present)


def present_median_box(preds: Tensor, present: Tensor) -> Tensor:
    """Tensor[C, 4]: each side's median over the present rows of ``preds (Tensor[C, N, 5])`` (the mean of
    the middle two for an even count); every cluster has at least one present row."""
    sides = torch.where(present[..., None], preds[..., :4], torch.full_like(preds[..., :4], float("inf")))
    ordered = sides.sort(dim=1).values  # [C, N, 4]: the present values first
    count = present.sum(1).clamp(min=1)  # [C]
    lower = ((count - 1) // 2)[:, None, None].expand(-1, 1, 4)
    upper = (count // 2)[:, None, None].expand(-1, 1, 4)
    return (0.5 * (ordered.gather(1, lower) + ordered.gather(1, upper))).squeeze(1)


def _paired_iou(a: Tensor, b: Tensor) -> Tensor:
    """IoU of matching rows: a, b (Tensor[..., 4]) → Tensor[...]."""
    lt = torch.maximum(a[..., :2], b[..., :2])
    rb = torch.minimum(a[..., 2:], b[..., 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[..., 2:] - a[..., :2]).clamp(min=0).prod(-1)
    area_b = (b[..., 2:] - b[..., :2]).clamp(min=0).prod(-1)
    union = area_a + area_b - inter
    return inter / union.clamp(min=torch.finfo(a.dtype).tiny)


def pairwise_iou(preds: Tensor, present: Tensor) -> Tensor:
    """Tensor[C, P]: IoU of every model pair (i < j) in each cluster, 0 where either is absent."""
    num_models = preds.shape[1]
    i, j = torch.triu_indices(num_models, num_models, offset=1, device=preds.device)
    iou = _paired_iou(preds[:, i, :4], preds[:, j, :4])  # [C, P]
    return iou * (present[:, i] & present[:, j]).to(preds.dtype)


def _context(boxes: Tensor, scores: Tensor, labels: Tensor) -> Tensor:
    """Tensor[C, 10]: the within-image context features of the module docstring.

    On the CPU the pairwise terms come from a compiled loop over the overlapping pairs
    (:mod:`detens.heads._context_kernel`), elsewhere from dense C×C tensors: the same terms either way.
    """
    num = boxes.shape[0]
    if num == 0:
        return boxes.new_zeros((0, len(_CONTEXT)))
    terms = (_compiled_context_terms if boxes.device.type == "cpu" else _dense_context_terms)(boxes, scores, labels)
    dup_iou, dup_at, overlaps, rank, best, other_iou, other_best, other_mass, class_confident = terms
    margin = torch.where(dup_iou > 0, scores[dup_at.clamp(min=0)] - scores, torch.zeros_like(dup_iou))
    image_confident = (scores > _CONFIDENT).sum().to(boxes.dtype).expand(num)
    return torch.stack(
        [
            dup_iou,
            margin,
            torch.log1p(overlaps.to(boxes.dtype)),
            torch.log1p(rank.to(boxes.dtype)),
            scores / best.clamp(min=1e-6),
            other_iou,
            other_best / (other_best + scores).clamp(min=1e-6),
            scores / (other_mass + scores).clamp(min=1e-6),
            torch.log1p(image_confident),
            torch.log1p(class_confident.to(boxes.dtype)),
        ],
        dim=1,
    )


def _compiled_context_terms(boxes: Tensor, scores: Tensor, labels: Tensor) -> tuple[Tensor, ...]:
    """:func:`detens.heads._context_kernel.context_terms` of CPU tensors, floating terms in the boxes' dtype.

    A sum of three or more scores depends on the order of the additions in its last bit, and a network
    head's fit on these features can turn on that bit. So where three or more other-class clusters share
    a cluster's place, their scores are summed by torch over a row of zeros, as the tensor formulation
    sums them.
    """
    from detens.heads._context_kernel import context_terms

    work = boxes.dtype if boxes.dtype in (torch.float32, torch.float64) else torch.float32
    *terms, colocated = (
        torch.from_numpy(term)
        for term in context_terms(
            boxes.detach().to(work).contiguous().numpy(),
            scores.detach().to(work).contiguous().numpy(),
            labels.to(torch.int64).contiguous().numpy(),
            _OVERLAP_IOU,
            _COLOCATED_IOU,
            _CONFIDENT,
        )
    )
    dup_iou, dup_at, overlaps, rank, best, other_iou, other_best, other_mass, class_confident = (
        term.to(boxes.dtype) if term.is_floating_point() else term for term in terms
    )
    num = boxes.shape[0]
    crowded = torch.bincount(colocated[:, 0], minlength=num) >= 3  # [C]
    pairs = colocated[crowded[colocated[:, 0]]]  # [P', 2]
    if len(pairs):
        rows = torch.nonzero(crowded).flatten()
        row_of = torch.full((num,), -1, dtype=torch.int64)
        row_of[rows] = torch.arange(len(rows))
        pair_rows = row_of[pairs[:, 0]]  # [P']
        step = max(1, _BLOCK * _BLOCK // num)
        for begin in range(0, len(rows), step):
            in_chunk = (pair_rows >= begin) & (pair_rows < begin + step)
            other_scores = scores.detach().new_zeros((min(step, len(rows) - begin), num))
            other_scores[pair_rows[in_chunk] - begin, pairs[in_chunk, 1]] = scores.detach()[pairs[in_chunk, 1]]
            other_mass[rows[begin : begin + step]] = other_scores.sum(1)
    return dup_iou, dup_at, overlaps, rank, best, other_iou, other_best, other_mass, class_confident


def _dense_context_terms(boxes: Tensor, scores: Tensor, labels: Tensor) -> tuple[Tensor, ...]:
    """The terms of :func:`detens.heads._context_kernel.context_terms` from dense C×C tensors, in row blocks
    of about ``_BLOCK``² pairs (at least one row): the formulation for GPUs."""
    num = boxes.shape[0]
    index = torch.arange(num, device=boxes.device)
    confident = scores > _CONFIDENT  # [C]
    # Blocks of a fixed number of rows grew with the image: 2048 rows × 50,000 clusters took 4.9 GB.
    step = max(1, _BLOCK * _BLOCK // num)
    blocks = []
    for begin in range(0, num, step):
        rows = slice(begin, begin + step)
        iou = _paired_iou(boxes[rows, None, :], boxes[None, :, :])  # [b, C]; 0 where a box has no area
        same = labels[rows, None] == labels[None, :]  # [b, C]
        itself = index[rows, None] == index[None, :]  # [b, C]
        higher = (scores[None, :] > scores[rows, None]) | (
            (scores[None, :] == scores[rows, None]) & (index[None, :] < index[rows, None])
        )  # [b, C]: ranked before this cluster (ties: lower index)
        dup = torch.where(same & higher, iou, torch.zeros_like(iou))
        dup_iou = dup.max(1).values
        at_max = (dup == dup_iou[:, None]) & (dup_iou[:, None] > 0)
        dup_at = torch.where(at_max, index[None, :], num).min(1).values
        colocated = ~same & (iou > _COLOCATED_IOU)  # [b, C]: the same place, another class
        other_scores = torch.where(colocated, scores[None, :], torch.zeros_like(iou))
        blocks.append(
            (
                dup_iou,
                torch.where(dup_iou > 0, dup_at, -1),
                (same & ~itself & (iou > _OVERLAP_IOU)).sum(1),
                (same & higher).sum(1),
                torch.where(same, scores[None, :], torch.zeros_like(iou)).max(1).values,
                torch.where(~same & higher, iou, torch.zeros_like(iou)).max(1).values,
                other_scores.max(1).values,
                other_scores.sum(1),
                (same & confident[None, :]).sum(1),
            )
        )
    return tuple(torch.cat(parts) for parts in zip(*blocks, strict=True))


def cluster_features(clusters: Clusters, dtype: torch.dtype | None = None, visible: Tensor | None = None) -> Tensor:
    """The F features of every cluster of ONE image (see the module docstring).

    Args:
        clusters (Clusters): ``preds (Tensor[C, N, 5])``, ``present (Tensor[C, N])``, ``labels (Tensor[C])``.
        dtype (torch.dtype | None): output dtype (default: the predictions' floating dtype).
        visible (Tensor[C, N] | None): whether each model could have seen each cluster whole
            (:func:`member_visibility`); None: every model could.

    Returns:
        Tensor[C, F] on the clusters' device, F = :func:`num_features` (N). C = 0 gives ``[0, F]``.
    """
    dtype = dtype or (clusters.preds.dtype if clusters.preds.is_floating_point() else torch.float32)
    preds = clusters.preds.to(dtype)
    present = clusters.present
    num, num_models = present.shape
    pres = present.to(dtype)  # [C, N]
    scores = preds[..., 4] * pres  # [C, N]
    mean_box = present_mean_box(preds, present)  # [C, 4]
    size = (mean_box[:, 2:] - mean_box[:, :2]).clamp(min=1e-6)  # [C, 2] width, height
    scale = torch.cat([size, size], 1)  # [C, 4]
    offsets = (preds[..., :4] - mean_box[:, None, :]) / scale[:, None, :] * pres[..., None]  # [C, N, 4]
    iou_mean = _paired_iou(preds[..., :4], mean_box[:, None, :].expand(-1, num_models, -1)) * pres  # [C, N]
    per_model = torch.cat(
        [pres[..., None], scores[..., None], torch.log(scores + 1e-3)[..., None], offsets, iou_mean[..., None]], dim=2
    )  # [C, N, 8]

    count = pres.sum(1).clamp(min=1)  # [C]
    mean_score = scores.sum(1) / num_models
    max_score = scores.max(1).values if num_models else scores.new_zeros(num)
    present_mean = scores.sum(1) / count
    spread = torch.sqrt((((scores - present_mean[:, None]) ** 2) * pres).sum(1) / count)
    log_size = torch.log(size)
    center = (mean_box[:, :2] + mean_box[:, 2:]) / 2
    cluster = torch.stack(
        [
            count / num_models,
            mean_score,
            max_score,
            spread,
            log_size[:, 0],
            log_size[:, 1],
            log_size[:, 0] - log_size[:, 1],
            center[:, 0],
            center[:, 1],
        ],
        dim=1,
    )  # [C, 9]
    agreement = pairwise_iou(preds, present)  # [C, P]
    context = _context(mean_box, mean_score, clusters.labels.to(preds.device))  # [C, 10]
    seen = pres.new_ones(num, num_models) if visible is None else visible.to(pres)  # [C, N]
    seen_count = seen.sum(1).clamp(min=1)
    visibility = torch.cat(
        [seen, ((pres * seen).sum(1) / seen_count)[:, None], ((scores * seen).sum(1) / seen_count)[:, None]], dim=1
    )  # [C, N + 2]
    return torch.cat(
        [per_model.reshape(num, num_models * len(_PER_MODEL)), cluster, agreement, context, visibility], dim=1
    )


@functools.lru_cache(maxsize=1024)
def _tiled_view(name: str) -> Any:
    """The tiled test-time view a member name ends with (``"yolo26n|tiles=2x2"``), else None (cached: the
    heads ask for every image they fuse)."""
    if "|" not in name or "tiles" not in name.rsplit("|", 1)[1]:
        return None
    from detens.adapters.augmented import View

    try:
        view = View.parse(name.rsplit("|", 1)[1])
    except ValueError:  # a display name that only looks like a view
        return None
    return view if view.tiled else None


def has_tiled_members(model_names: Sequence[str]) -> bool:
    """Whether any member is a tiled view (its name ends with ``|tiles=RxC...``)."""
    return any(_tiled_view(name) is not None for name in model_names)


def member_visibility(model_names: Sequence[str], clusters: Clusters) -> Tensor:
    """Tensor[C, N] bool: whether model n could have seen cluster c's mean box whole.

    An untiled member sees everything. A tiled member (:func:`has_tiled_members`) sees a box that lies in
    one of its tiles and touches none of that tile's inner edges, the boxes it keeps
    (:func:`detens.adapters._tiles.cut_by_inner_edges`).
    """
    from detens.adapters._tiles import cut_by_inner_edges

    height, width = clusters.image_size
    num = len(clusters)
    work = compute_device(clusters.device)  # pixels in float64, where float64 runs (not on MPS)
    scale = torch.tensor([width, height, width, height], dtype=torch.float64, device=work)
    boxes = present_mean_box(clusters.preds.to(work, torch.float64), clusters.present.to(work)) * scale  # [C, 4]
    columns = []
    for name in model_names:
        view = _tiled_view(name)
        if view is None:
            columns.append(torch.ones(num, dtype=torch.bool, device=clusters.device))
            continue
        seen = torch.zeros(num, dtype=torch.bool, device=clusters.device)
        for window in view.windows((height, width)):
            x1, y1, x2, y2 = window
            inside = (boxes[:, 0] >= x1) & (boxes[:, 1] >= y1) & (boxes[:, 2] <= x2) & (boxes[:, 3] <= y2)
            seen |= (inside & ~cut_by_inner_edges(boxes, window, (height, width))).to(clusters.device)
        columns.append(seen)
    return torch.stack(columns, 1) if columns else torch.zeros(num, 0, dtype=torch.bool, device=clusters.device)


def class_positions(class_ids: Tensor, labels: Tensor) -> Tensor:
    """Tensor[C] int64: the position of each label in the sorted ``class_ids (Tensor[K])``, -1 where absent."""
    ids = class_ids.to(labels.device)
    if ids.numel() == 0:
        return torch.full_like(labels, -1, dtype=torch.int64)
    pos = torch.searchsorted(ids, labels).clamp(max=ids.numel() - 1)
    return torch.where(ids[pos] == labels, pos, torch.full_like(pos, -1))
