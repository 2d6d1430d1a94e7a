"""The calibration head: per-model isotonic maps from detection score to expected IoU, applied before fusing.

After MoCaE ("Mixture of Calibrated Experts", Oksuz et al., TMLR 2024). Detectors trained differently
score on different scales, so a fuser that compares or averages their scores favours the over-confident
ones. MoCaE first maps each detector's score s to an estimate of the IoU of the box with the object it
hits, fitted on training images, and fuses the calibrated detections.

Dimension legend: N models, K detections (of one model, on one image or on all training images), B knots
of one curve, R curves of one model (its global curve and its per-class ones), T knots of all curves.

**Target.** For a detection of class c, u = the IoU of its box with the best ground-truth box of class c
that is not a crowd region (0 when there is none). ``target="iou"`` fits u (MoCaE), ``target="tp50"`` the
indicator u ≥ 0.5. A detection with u < 0.5 that lies in a crowd region of its class (at least half of
its area inside it) is left out of the fit: COCO counts it neither as a true nor as a false positive.

**Curve.** Per model, the isotonic (non-decreasing) least-squares fit of the targets on the scores,
computed by pool-adjacent-violators (:func:`isotonic_fit`). It is stored as knots: one per pooled block,
at the block's mean score and mean target. The map applied at prediction time is the piecewise-LINEAR
interpolation between the knots, constant beyond the first and last knot; a step function would give
every score of a block the same value, and ties between different scores cost ranking in AP. Then

    calibrated(s) = (1 − ε) · f(s) + ε · s            ε = ``tie_break`` (default 10⁻⁴)

which stays in [0, 1] and is strictly increasing in s, so even in the flat parts the original order is
kept. ε is that large because scores are float32: a score step of 0.001 (COCO result files keep three
decimals) then still moves the output by 10⁻⁷, more than float32's resolution anywhere in [0, 1].

**Per-class curves** (``per_class=True``), shrunk toward the model's curve f at fit time. For class c
with n_c training detections (sᵢ, tᵢ) of the model, f_c is the weighted isotonic fit of

    the class's own points (sᵢ, tᵢ), weight 1 each,   and   f's knots (x_b, y_b), weight shrinkage · w_b / Σ w

where w_b is the number of the model's training detections that knot b's block pooled: the model's
curve enters as ``shrinkage`` pseudo-detections spread over the scores as the model's own are. A rare
class follows the model's curve and a frequent one its own data (``shrinkage`` = 0: its data alone), and
at scores the class was never seen with, the curve is the model's rather than the class's last value
(a class seen only at low scores in training must not cap its high scores at that level). A class with
no training detection of the model has no curve of its own and uses f.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor, nn
from torchvision.ops import box_iou

from detens.checks import check_distinct_integers
from detens.detections import Detections, compute_device
from detens.fusers import FUSERS, fuse
from detens.heads._features import class_positions
from detens.heads._io import (
    HeadFileError,
    check_class_ids,
    check_config_keys,
    check_model_names,
    check_number,
    ground_truth_label_space,
    in_member_order,
    member_order,
    read_head_for,
    write_head_file,
)
from detens.heads._registry import HEADS
from detens.matching import check_per_model

if TYPE_CHECKING:
    from detens.predictions import EnsemblePredictions

__all__ = [
    "CalibrationHead", "check_calibration_data", "fit_calibration", "isotonic_fit", "isotonic_blocks", "isotonic_predict",
    "TARGETS",
]

logger = logging.getLogger(__name__)

TARGETS = ("iou", "tp50")
_GLOBAL = -1  # the class id under which a model's global curve is stored
_CONFIG_KEYS = ("per_class", "shrinkage", "target", "tie_break", "fuser", "fuser_params")


# ------------------------------------------------------------------------------------------- isotonic fit
def _as_float64(values: Any, name: str) -> np.ndarray:
    if isinstance(values, Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {list(array.shape)}")
    if not np.isfinite(array).all():
        i = int(np.flatnonzero(~np.isfinite(array))[0])
        raise ValueError(f"{name}[{i}] = {array[i]} is not finite")
    return array


def isotonic_fit(x: Any, y: Any, weights: Any = None) -> tuple[Tensor, Tensor]:
    """Weighted least-squares isotonic regression of y on x by pool-adjacent-violators.

    Finds the non-decreasing g minimizing Σᵢ wᵢ (yᵢ − g(xᵢ))². Points with equal x are pooled first (one
    x, one value). The solution is constant on blocks of consecutive x values; each block becomes a knot.

    Args:
        x (Tensor[K] | array): inputs (scores).
        y (Tensor[K] | array): targets.
        weights (Tensor[K] | array | None): non-negative point weights (None: all 1); points of weight 0
            are ignored.

    Returns:
        knots_x (Tensor[B] float64): each block's weighted mean x, increasing.
        knots_y (Tensor[B] float64): each block's weighted mean y, strictly increasing (blocks of equal
            means are pooled: the fitted values do not change, and the interpolation has no flat part).
    """
    knots_x, knots_y, _ = isotonic_blocks(x, y, weights)
    return knots_x, knots_y


def isotonic_blocks(x: Any, y: Any, weights: Any = None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`isotonic_fit`'s knots and, third, ``knots_w (Tensor[B] float64)``: each block's total weight."""
    xs, ys = _as_float64(x, "x"), _as_float64(y, "y")
    if xs.shape != ys.shape:
        raise ValueError(f"x and y must have the same length, got {xs.size} and {ys.size}")
    if weights is None:
        ws = np.ones_like(xs)
    else:
        ws = _as_float64(weights, "weights")
        if ws.shape != xs.shape:
            raise ValueError(f"weights must hold one value per point ({xs.size}), got {ws.size}")
        if (ws < 0).any():
            i = int(np.flatnonzero(ws < 0)[0])
            raise ValueError(f"weights[{i}] = {ws[i]} is negative")
    positive = ws > 0
    if not positive.any():
        raise ValueError(f"isotonic_fit needs at least one point of positive weight, got {xs.size} points")
    xs, ys, ws = xs[positive], ys[positive], ws[positive]
    unique_x, inverse = np.unique(xs, return_inverse=True)  # sorted
    sum_w = np.bincount(inverse, weights=ws)
    sum_wy = np.bincount(inverse, weights=ws * ys)
    sum_wx = sum_w * unique_x
    means = (sum_wy / sum_w).tolist()
    sum_w_list, sum_wy_list, sum_wx_list = sum_w.tolist(), sum_wy.tolist(), sum_wx.tolist()

    # The stack of blocks: running sums (w, w·y, w·x) and mean y. A new point pools with the blocks
    # before it while their mean is not below its mean.
    block_w: list[float] = []
    block_wy: list[float] = []
    block_wx: list[float] = []
    block_mean: list[float] = []
    for w, wy, wx, mean in zip(sum_w_list, sum_wy_list, sum_wx_list, means, strict=True):
        while block_mean and block_mean[-1] >= mean:
            w += block_w.pop()
            wy += block_wy.pop()
            wx += block_wx.pop()
            block_mean.pop()
            mean = wy / w
        block_w.append(w)
        block_wy.append(wy)
        block_wx.append(wx)
        block_mean.append(mean)
    total = np.asarray(block_w)
    knots_x = np.asarray(block_wx) / total
    knots_y = np.asarray(block_mean)
    return torch.from_numpy(knots_x), torch.from_numpy(knots_y), torch.from_numpy(total)


# ------------------------------------------------------------------------------------ the curves, packed
@dataclass
class _Packed:
    """The R curves of one model in one searchable array: curve r's knots have x shifted by 2r.

    Knot x values lie in [0, 1] (they are mean scores), so the shifted curves never overlap and one
    ``searchsorted`` finds every query's segment in its own curve.

    Attributes:
        x, y (Tensor[T] float64): the shifted knots; starts, ends (Tensor[R] int64): each curve's range.
        class_ids (Tensor[R - 1] int64): the classes of curves 1..R-1, sorted (curve 0 is the global one).
    """

    x: Tensor
    y: Tensor
    starts: Tensor
    ends: Tensor
    class_ids: Tensor

    def to(self, device: torch.device) -> _Packed:
        return _Packed(*(t.to(device) for t in (self.x, self.y, self.starts, self.ends, self.class_ids)))


def _pack(curves: Mapping[int, tuple[Tensor, Tensor]]) -> _Packed:
    ids = sorted(c for c in curves if c != _GLOBAL)
    ordered = [curves[_GLOBAL]] + [curves[c] for c in ids]
    lengths = torch.tensor([len(x) for x, _ in ordered], dtype=torch.int64)
    ends = torch.cumsum(lengths, 0)
    return _Packed(
        torch.cat([x + 2.0 * r for r, (x, _) in enumerate(ordered)]),
        torch.cat([y for _, y in ordered]),
        ends - lengths,
        ends,
        torch.tensor(ids, dtype=torch.int64),
    )


def _interpolate(packed: _Packed, curve: Tensor, s: Tensor) -> Tensor:
    """Tensor[K] float64: curve ``curve[k]`` (Tensor[K] int64) interpolated at ``s[k]`` (Tensor[K] float64)."""
    if s.numel() == 0:
        return s.clone()
    query = s + 2.0 * curve.to(s.dtype)
    start, end = packed.starts[curve], packed.ends[curve]  # [K]
    pos = torch.searchsorted(packed.x, query)  # first knot >= query
    hi = torch.minimum(torch.maximum(torch.minimum(pos, end - 1), start + 1), end - 1)  # = start for 1-knot curves
    lo = torch.maximum(hi - 1, start)
    x_lo, x_hi, y_lo, y_hi = packed.x[lo], packed.x[hi], packed.y[lo], packed.y[hi]
    span = x_hi - x_lo
    # Beyond the end knots t is clamped: the curve is constant there. One knot (or equal x): its y.
    safe_span = torch.where(span > 0, span, torch.ones_like(span))
    t = torch.where(span > 0, (query - x_lo) / safe_span, torch.zeros_like(span))
    return y_lo + t.clamp(0.0, 1.0) * (y_hi - y_lo)


def isotonic_predict(knots_x: Tensor, knots_y: Tensor, x: Tensor, tie_break: float = 0.0) -> Tensor:
    """The calibration map of one curve: piecewise-linear between the knots, constant beyond them.

    Args:
        knots_x, knots_y (Tensor[B]): a curve from :func:`isotonic_fit` (x in [0, 1], non-decreasing).
        x (Tensor[K]): scores in [0, 1].
        tie_break (float): ε of ``(1 − ε) · f(x) + ε · x`` (strictly increasing when ε > 0).

    Returns:
        Tensor[K] float64 on x's device, or on the CPU for a device without float64 (MPS).
    """
    _check_curve(torch.as_tensor(knots_x), torch.as_tensor(knots_y), "the curve")
    x = torch.as_tensor(x)
    s = x.to(device=compute_device(x.device), dtype=torch.float64)
    packed = _pack({_GLOBAL: (torch.as_tensor(knots_x).double(), torch.as_tensor(knots_y).double())})
    packed = packed.to(s.device)
    value = _interpolate(packed, torch.zeros(s.shape, dtype=torch.int64, device=s.device), s)
    return (1.0 - tie_break) * value + tie_break * s


def _check_curve(x: Tensor, y: Tensor, what: str) -> tuple[Tensor, Tensor]:
    """A valid curve as float64 CPU tensors: 1-D, equal lengths >= 1, finite, x in [0, 1] non-decreasing,
    y in [0, 1] non-decreasing."""
    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        raise TypeError(f"{what}: knots must be tensors, got {type(x).__name__} and {type(y).__name__}")
    if x.ndim != 1 or y.shape != x.shape or x.numel() == 0:
        raise ValueError(f"{what}: knots_x and knots_y must be Tensor[B] of one length B >= 1, got "
                         f"{list(x.shape)} and {list(y.shape)}")
    x, y = x.detach().to("cpu", torch.float64), y.detach().to("cpu", torch.float64)
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        raise ValueError(f"{what}: knots hold NaN or inf")
    if (x < 0).any() or (x > 1).any() or (y < 0).any() or (y > 1).any():
        raise ValueError(f"{what}: knots must lie in [0, 1] (scores and IoUs), got x in "
                         f"[{float(x.min())}, {float(x.max())}], y in [{float(y.min())}, {float(y.max())}]")
    if (x[1:] < x[:-1]).any() or (y[1:] < y[:-1]).any():
        raise ValueError(f"{what}: knots must be non-decreasing in x and in y")
    return x, y


def _check_target(target: Any) -> None:
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")


def _identity_curve() -> tuple[Tensor, Tensor]:
    return torch.tensor([0.0, 1.0], dtype=torch.float64), torch.tensor([0.0, 1.0], dtype=torch.float64)


def _check_fuser(fuser: Any, fuser_params: Any, model_names: list[str]) -> tuple[str, dict[str, Any]]:
    if not isinstance(fuser, str):
        raise TypeError(f"fuser must be the name of a registered fuser, got {type(fuser).__name__}")
    FUSERS.get(fuser)  # unknown names list the valid ones
    params = {} if fuser_params is None else fuser_params
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise TypeError(f"fuser_params must be a dict of keyword arguments, got {fuser_params!r}")
    params = dict(params)
    for reserved in ("calibration", "method"):
        if reserved in params:
            raise ValueError(
                f"fuser_params must not hold {reserved!r}: the head calibrates, then fuses with {fuser!r}"
            )
    try:
        json.dumps(params, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"fuser_params must be JSON-serializable (they are saved with the head), got {params!r}: "
                         f"{err}") from None
    # Every fuser checks its options before any work: a run on empty detections finds a wrong or unknown
    # one now, when the head is built or loaded, not at the first image.
    empty = [Detections.empty((1, 1), name) for name in model_names]
    try:
        fuse(empty, fuser, **params)
    except TypeError as err:
        raise TypeError(f"fuser_params {params!r} do not fit the {fuser!r} fuser: {err}") from None
    except ValueError as err:
        raise ValueError(f"fuser_params {params!r} do not fit the {fuser!r} fuser: {err}") from None
    return fuser, params


# -------------------------------------------------------------------------------------------- the head
@HEADS.register("calibration")
class CalibrationHead(nn.Module):
    """Per-model (and optionally per-class) score calibration, then a fixed fuser. See the module docstring.

    Build it with :func:`fit_calibration`; constructed by hand without curves, every map is the identity.

    Args:
        model_names (list[str]): the ensemble's models. Members are matched by name (each Detections'
            ``source``); the order is the fallback for detections without a model name.
        curves (dict[str, tuple[Tensor[B], Tensor[B]]] | None): per model name, its global curve
            ``(knots_x, knots_y)``; None: the identity for every model. Must name every model.
        class_curves (dict[str, dict[int, tuple[Tensor[B], Tensor[B]]]] | None): per model name, the
            curves of classes with their own (already shrunk toward the model's curve).
        per_class, shrinkage, target: how the curves were fitted (kept with the head, for the record).
        tie_break (float): ε in [0, 1) of ``(1 − ε) · f(s) + ε · s``.
        fuser (str): the fuser of :meth:`fuse_detections` (a registered name, default ``"wbf"``).
        fuser_params (dict | None): its parameters (JSON-serializable; saved with the head).

    Attributes:
        match_iou (float | None): the fuser's ``iou_thr`` when ``fuser_params`` sets one, else None.
    """

    type_name = "calibration"
    #: the label space the head was trained in, {category id: name} (set by fit_head and fit_calibration,
    #: kept by with_fuser, saved with the head); None when unknown.
    label_space: dict[int, str] | None = None

    def __init__(
        self,
        model_names: Sequence[str],
        curves: Mapping[str, tuple[Tensor, Tensor]] | None = None,
        class_curves: Mapping[str, Mapping[int, tuple[Tensor, Tensor]]] | None = None,
        per_class: bool = False,
        shrinkage: float = 50.0,
        target: Literal["iou", "tp50"] = "iou",
        tie_break: float = 1e-4,
        fuser: str = "wbf",
        fuser_params: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.model_names = check_model_names(model_names)
        if not isinstance(per_class, bool):
            raise TypeError(f"per_class must be bool, got {per_class!r}")
        _check_target(target)
        self.per_class = per_class
        self.shrinkage = check_number(shrinkage, "shrinkage")
        self.target = target
        self.tie_break = check_number(tie_break, "tie_break")
        if self.tie_break >= 1.0:
            raise ValueError(f"tie_break must be in [0, 1), got {tie_break!r}")
        self.fuser, self.fuser_params = _check_fuser(fuser, fuser_params, self.model_names)

        curves = {} if curves is None else dict(curves)
        class_curves = {} if class_curves is None else dict(class_curves)
        for what, given in (("curves", curves), ("class_curves", class_curves)):
            unknown = [name for name in given if name not in self.model_names]
            if unknown:
                raise ValueError(f"{what} name models {unknown} that are not in model_names {self.model_names}")
        if curves and set(curves) != set(self.model_names):
            missing = [name for name in self.model_names if name not in curves]
            raise ValueError(f"curves must hold one curve per model; missing {missing} of {self.model_names}")
        if class_curves and not per_class:
            raise ValueError("class_curves apply only with per_class=True")
        # Per model: class id -> (knots_x, knots_y) float64 on the CPU; _GLOBAL holds the model's curve.
        self._curves: list[dict[int, tuple[Tensor, Tensor]]] = []
        for name in self.model_names:
            own = {_GLOBAL: _check_curve(*curves[name], f"curve of {name!r}") if curves else _identity_curve()}
            for class_id, knots in class_curves.get(name, {}).items():
                (class_id,) = check_class_ids([class_id])
                own[class_id] = _check_curve(*knots, f"curve of {name!r} class {class_id}")
            self._curves.append(own)
        self._packed = [_pack(c) for c in self._curves]
        self._on_device: dict[tuple[int, torch.device], _Packed] = {}

    # ---------------------------------------------------------------------------------------- properties
    @property
    def num_models(self) -> int:
        return len(self.model_names)

    @property
    def match_iou(self) -> float | None:
        value = self.fuser_params.get("iou_thr")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def config(self) -> dict[str, Any]:
        """The constructor options other than the curves (JSON-serializable), as saved with the head."""
        return {
            "per_class": self.per_class,
            "shrinkage": self.shrinkage,
            "target": self.target,
            "tie_break": self.tie_break,
            "fuser": self.fuser,
            "fuser_params": dict(self.fuser_params),
        }

    def curve(self, model_name: str, class_id: int | None = None) -> tuple[Tensor, Tensor]:
        """``(knots_x, knots_y)`` (Tensor[B] float64) of a model, or of one of its classes (the model's
        curve when the class has none)."""
        curves = self._curves[self._index(model_name)]
        return curves.get(_GLOBAL if class_id is None else int(class_id), curves[_GLOBAL])

    def class_ids(self, model_name: str) -> list[int]:
        """The classes with a curve of their own for ``model_name``, sorted."""
        return sorted(c for c in self._curves[self._index(model_name)] if c != _GLOBAL)

    def _index(self, model_name: str) -> int:
        if model_name not in self.model_names:
            raise ValueError(f"unknown model {model_name!r}; this head calibrates {self.model_names}")
        return self.model_names.index(model_name)

    def extra_repr(self) -> str:
        classes = sum(len(c) - 1 for c in self._curves)
        return (
            f"model_names={self.model_names}, class_curves={classes}, target={self.target!r}, "
            f"fuser={self.fuser!r}"
        )

    # --------------------------------------------------------------------------------------- calibration
    def member_indices(self, per_model: Sequence[Detections]) -> list[int]:
        """The head's model index of each Detections, by ``source`` name (any order, any subset) or, when
        the sources name no model, by position (:func:`~detens.heads._io.member_order`)."""
        return member_order([d.source for d in per_model], self.model_names, "calibration head")

    def _packed_on(self, index: int, device: torch.device) -> _Packed:
        key = (index, device)
        if key not in self._on_device:
            self._on_device[key] = self._packed[index].to(device)
        return self._on_device[key]

    def calibrate_scores(self, model_name: str, scores: Tensor, labels: Tensor | None = None) -> Tensor:
        """Calibrated scores of one model's detections.

        Args:
            model_name (str): the model.
            scores (Tensor[K]): its scores in [0, 1].
            labels (Tensor[K] | None): their classes (None, or a class without a curve: the model's curve).

        Returns:
            Tensor[K] in [0, 1], float32, on the scores' device.

        Raises:
            TypeError: ``scores`` or ``labels`` not a tensor. ValueError: a ``model_name`` the head lacks
                (naming its models), not one score per detection, or a score outside [0, 1] (a curve maps
                probabilities: one beyond them would be clamped unseen).
        """
        index = self._index(model_name)
        if not isinstance(scores, Tensor) or (labels is not None and not isinstance(labels, Tensor)):
            given = type(scores if not isinstance(scores, Tensor) else labels).__name__
            raise TypeError(f"scores and labels must be tensors (Tensor[K]), got {given}")
        if scores.ndim != 1 or (labels is not None and labels.shape != scores.shape):
            raise ValueError(f"scores must be Tensor[K] and labels None or Tensor[K], got shapes {list(scores.shape)} "
                             f"and {None if labels is None else list(labels.shape)}")
        outside = ~((scores >= 0) & (scores <= 1))  # NaN too
        if bool(outside.any()):
            i = int(outside.nonzero()[0])
            raise ValueError(f"scores[{i}] = {scores[i].item()} of {model_name!r} is not a score in [0, 1]")
        return self._calibrate(index, scores, labels)

    def _calibrate(self, index: int, scores: Tensor, labels: Tensor | None) -> Tensor:
        device = compute_device(scores.device)
        packed = self._packed_on(index, device)
        s = scores.to(device=device, dtype=torch.float64)
        if labels is None or packed.class_ids.numel() == 0:
            curve = torch.zeros(s.shape, dtype=torch.int64, device=device)
        else:
            curve = class_positions(packed.class_ids, labels.to(device)) + 1  # 0: the global curve
        value = _interpolate(packed, curve, s)
        value = (1.0 - self.tie_break) * value + self.tie_break * s
        return value.clamp(0.0, 1.0).to(device=scores.device, dtype=torch.float32)

    @torch.no_grad()
    def calibrate(self, per_model: Sequence[Detections]) -> list[Detections]:
        """New Detections with calibrated scores (boxes, labels, image size and source unchanged).

        Args:
            per_model (list[Detections]): the models' detections of one image, matched to the head's models
                by name (see :meth:`member_indices`); a class without a curve of its own uses the model's.

        Returns:
            list[Detections]: in the input's order, on the input's device.
        """
        check_per_model(per_model)
        indices = self.member_indices(per_model)
        return [
            Detections(
                det.boxes, self._calibrate(i, det.scores, det.labels), det.labels, det.image_size, det.source
            )
            for i, det in zip(indices, per_model, strict=True)
        ]

    def forward(self, per_model: Sequence[Detections]) -> list[Detections]:
        """:meth:`calibrate`."""
        return self.calibrate(per_model)

    def fuse_detections(self, per_model: Sequence[Detections], **params: Any) -> Detections:
        """Calibrate, then fuse with the head's fuser: ``fuse(calibrate(per_model), fuser, **fuser_params)``.

        Args:
            per_model (list[Detections]): the models' detections of one image.
            **params: override the saved ``fuser_params`` for this call.
        """
        # per-model fuser parameters (weights) are in the head's model order: so are the detections
        ordered = in_member_order(per_model, self.model_names, "calibration head")
        return fuse(self.calibrate(ordered), self.fuser, **{**self.fuser_params, **params})

    def with_fuser(self, fuser: str, fuser_params: Mapping[str, Any] | None = None) -> CalibrationHead:
        """The same curves (and label space) followed by another fuser (the curves do not depend on the fuser:
        no refit)."""
        curves = {name: own[_GLOBAL] for name, own in zip(self.model_names, self._curves, strict=True)}
        class_curves = {
            name: {c: knots for c, knots in own.items() if c != _GLOBAL}
            for name, own in zip(self.model_names, self._curves, strict=True)
        }
        head = CalibrationHead(
            self.model_names,
            curves,
            {name: own for name, own in class_curves.items() if own},
            **{**self.config(), "fuser": fuser, "fuser_params": fuser_params},
        )
        head.label_space = self.label_space
        return head

    # ----------------------------------------------------------------------------------------- files
    def _tensors(self) -> dict[str, Tensor]:
        xs, ys, rows = [], [], []
        for m, curves in enumerate(self._curves):
            for class_id in [_GLOBAL] + sorted(c for c in curves if c != _GLOBAL):
                x, y = curves[class_id]
                xs.append(x)
                ys.append(y)
                rows.append([m, class_id, x.numel()])
        return {
            "knots_x": torch.cat(xs),
            "knots_y": torch.cat(ys),
            "curves": torch.tensor(rows, dtype=torch.int64).reshape(-1, 3),
        }

    def save(self, path: str | Path) -> None:
        """Write the head as ``.json`` or ``.safetensors`` (by suffix), atomically; no pickle.

        Tensors: ``knots_x``, ``knots_y`` (Tensor[T] float64): all curves' knots, one curve after the
        other; ``curves`` (Tensor[R, 3] int64): one row per curve, (model index, class id or -1 for the
        model's curve, number of knots).
        """
        write_head_file(path, self.type_name, self.model_names, self.config(), self._tensors(), self.label_space)

    @classmethod
    def load(cls, path: str | Path, model_names: Sequence[str] | None = None) -> CalibrationHead:
        """Load a head saved by :meth:`save` (on the CPU).

        Args:
            path (str | Path): ``.json`` or ``.safetensors``.
            model_names (list[str] | None): the ensemble that will use the head. Curves belong to models by
                name, so the saved models in another order are accepted (the head takes that order, which
                the positional fallback of :meth:`member_indices` uses); other models are a ``ValueError``
                naming both lists.
        """
        stored = read_head_for(path, cls.type_name, None)
        names = stored.model_names
        if model_names is not None:
            names = check_model_names(model_names)
            if sorted(names) != sorted(stored.model_names):
                read_head_for(path, cls.type_name, names)  # raises, naming both lists
        head = cls.from_parts(stored.model_names, stored.config, stored.tensors, repr(str(path)), order=names)
        head.label_space = stored.label_space
        return head

    def parts(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """``(config, tensors)`` as :meth:`save` writes them (for heads that hold this one)."""
        return self.config(), self._tensors()

    @classmethod
    def from_parts(
        cls,
        model_names: Sequence[str],
        config: dict[str, Any],
        tensors: dict[str, Tensor],
        where: str,
        order: Sequence[str] | None = None,
    ) -> CalibrationHead:
        """A head from a file's parts (:meth:`parts`), every field checked; ``where`` names the file in errors.
        ``model_names`` are the file's (the curve rows index them); ``order``: the same names in the order
        the head takes (default: the file's)."""
        stored_names = list(model_names)
        check_config_keys(config, _CONFIG_KEYS, where, cls.type_name)
        expected = {"knots_x", "knots_y", "curves"}
        if set(tensors) != expected:
            raise HeadFileError(f"{where}: expected tensors {sorted(expected)}, got {sorted(tensors)}")
        knots_x, knots_y, rows = (tensors[k] for k in ("knots_x", "knots_y", "curves"))
        if rows.dtype != torch.int64 or rows.ndim != 2 or rows.shape[1] != 3:
            raise HeadFileError(
                f"{where}: 'curves' must be int64 Tensor[R, 3], got {rows.dtype} {list(rows.shape)}"
            )
        if knots_x.ndim != 1 or knots_y.shape != knots_x.shape or not knots_x.is_floating_point():
            raise HeadFileError(f"{where}: knots_x and knots_y must be float Tensor[T] of one length")
        lengths = rows[:, 2]
        if (lengths < 1).any() or int(lengths.sum()) != knots_x.numel():
            raise HeadFileError(f"{where}: the curves' knot counts {lengths.tolist()} do not add up to the "
                                f"{knots_x.numel()} knots")
        curves: dict[str, tuple[Tensor, Tensor]] = {}
        class_curves: dict[str, dict[int, tuple[Tensor, Tensor]]] = {}
        offset = 0
        for m, class_id, length in rows.tolist():
            if not 0 <= m < len(stored_names) or class_id < _GLOBAL:
                raise HeadFileError(
                    f"{where}: invalid curve row {[m, class_id, length]} for {len(stored_names)} models"
                )
            knots = (knots_x[offset : offset + length], knots_y[offset : offset + length])
            offset += length
            name = stored_names[m]
            own = class_curves.setdefault(name, {})
            if (class_id == _GLOBAL and name in curves) or class_id in own:
                raise HeadFileError(f"{where}: two curves for model {name!r} class {class_id}")
            if class_id == _GLOBAL:
                curves[name] = knots
            else:
                own[class_id] = knots
        if order is not None:
            config = _member_params_in_order(config, stored_names, list(order))
        try:
            return cls(
                stored_names if order is None else order, curves, {k: v for k, v in class_curves.items() if v},
                **config,
            )
        except (TypeError, ValueError) as err:
            raise HeadFileError(f"{where}: invalid calibration head: {err}") from err


def _member_params_in_order(config: dict[str, Any], stored: list[str], order: list[str]) -> dict[str, Any]:
    """``config`` with the fuser's per-model ``weights`` (saved in the ``stored`` model order) in ``order``:
    a weight belongs to its model's name, not to a position."""
    params = config.get("fuser_params")
    weights = params.get("weights") if isinstance(params, dict) else None
    if not isinstance(weights, list) or len(weights) != len(stored) or sorted(order) != sorted(stored):
        return config  # nothing per model (or a malformed file, which the constructor reports)
    by_name = dict(zip(stored, weights, strict=True))
    return {**config, "fuser_params": {**params, "weights": [by_name[name] for name in order]}}


# ------------------------------------------------------------------------------------------------ fitting
def _targets(
    det: Detections, gt_boxes: Tensor, gt_labels: Tensor, iscrowd: Tensor
) -> tuple[Tensor, Tensor]:
    """IoU with the best non-crowd GT box of the same class (0 if none) (Tensor[K] float64), and which
    detections count (Tensor[K] bool): not those that COCO would ignore in a crowd region."""
    num = len(det)
    best = torch.zeros(num, dtype=torch.float64)
    counted = torch.ones(num, dtype=torch.bool)
    if num == 0 or gt_boxes.shape[0] == 0:
        return best, counted
    boxes = det.boxes.detach().to("cpu", torch.float64)
    labels = det.labels.to("cpu")
    gt = gt_boxes.to(torch.float64)
    same = labels[:, None] == gt_labels[None, :]  # [K, G]
    iou = box_iou(boxes, gt)  # [K, G]
    normal = same & ~iscrowd[None, :]
    if normal.any():
        best = torch.where(normal, iou, torch.zeros_like(iou)).amax(1)
    crowd = same & iscrowd[None, :]
    if crowd.any():
        # COCO matches detections to crowd regions by the fraction of the detection inside them.
        top_left = torch.maximum(boxes[:, None, :2], gt[None, :, :2])
        bottom_right = torch.minimum(boxes[:, None, 2:], gt[None, :, 2:])
        inter = (bottom_right - top_left).clamp(min=0).prod(2)  # [K, G]
        area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).clamp(min=1e-12)
        inside = torch.where(crowd, inter / area[:, None], torch.zeros_like(inter)).amax(1)
        counted = ~((best < 0.5) & (inside >= 0.5))
    return best, counted


def fit_calibration(
    predictions: EnsemblePredictions,
    image_ids: Sequence[int],
    per_class: bool = False,
    shrinkage: float = 50.0,
    target: Literal["iou", "tp50"] = "iou",
    fuser: str = "wbf",
    fuser_params: Mapping[str, Any] | None = None,
    tie_break: float = 1e-4,
) -> CalibrationHead:
    """Fit each model's calibration curve (and per-class curves) on training images (see the module docstring).

    Args:
        predictions (EnsemblePredictions): the models' predictions and the ground truth.
        image_ids (list[int]): the training images (at least 2, distinct, in the ground truth). Images
            without annotations count: their detections are false positives (target 0).
        per_class (bool): fit per-class curves too, shrunk toward the model's curve.
        shrinkage (float): the weight of the model's curve in each class curve, in detections (module docstring); 0: none.
        target (str): ``"iou"`` (MoCaE) or ``"tp50"`` (1 where the IoU is at least 0.5).
        fuser (str), fuser_params (dict | None): the fusion after calibration
            (:meth:`CalibrationHead.fuse_detections`).
        tie_break (float): ε of ``(1 − ε) · f(s) + ε · s``.

    Returns:
        CalibrationHead: for ``predictions.model_names``; its ``label_space`` is the ground truth's named
        categories, saved with it (as :func:`detens.heads.fit_head` records them).

    Raises:
        ValueError: fewer than 2 images; a model without any detection on them; a model none of whose
            detections overlaps a ground-truth box of its class, or with ``target="tp50"`` none reaches IoU
            0.5 with one (no positive target: its curve would be 0).
    """
    if not isinstance(per_class, bool):
        raise TypeError(f"per_class must be bool, got {per_class!r}")
    _check_target(target)
    shrinkage = check_number(shrinkage, "shrinkage")
    fuser, fuser_params = _check_fuser(fuser, fuser_params, list(predictions.model_names))
    ids = check_distinct_integers(image_ids, "image_ids")
    if len(ids) < 2:
        raise ValueError(
            f"fit_calibration needs at least 2 images, got {len(ids)}: one image says too little about a "
            "detector's scores to fit its calibration"
        )
    names = predictions.model_names
    curves: dict[str, tuple[Tensor, Tensor]] = {}
    class_curves: dict[str, dict[int, tuple[Tensor, Tensor]]] = {}
    for name, (s, t, c, ignored) in zip(names, _training_points(predictions, ids, target), strict=True):
        knots_x, knots_y, knots_w = isotonic_blocks(s, t)
        curves[name] = (knots_x, knots_y)
        if per_class:
            pseudo_w = shrinkage * knots_w / knots_w.sum()  # the model's curve as prior pseudo-detections
            own = {}
            for class_id in torch.unique(c).tolist():
                mask = c == class_id
                own[int(class_id)] = isotonic_fit(
                    torch.cat([s[mask], knots_x]), torch.cat([t[mask], knots_y]),
                    torch.cat([torch.ones(int(mask.sum()), dtype=torch.float64), pseudo_w]),
                )
            class_curves[name] = own
        logger.info(
            "calibration of %s: %d detections (%d ignored in crowd regions), %d knots%s", name, s.numel(),
            ignored, curves[name][0].numel(), f", {len(class_curves[name])} class curves" if per_class else "",
        )
    head = CalibrationHead(
        names,
        curves,
        class_curves if per_class else None,
        per_class=per_class,
        shrinkage=shrinkage,
        target=target,
        tie_break=tie_break,
        fuser=fuser,
        fuser_params=fuser_params,
    )
    head.label_space = ground_truth_label_space(predictions.gt)
    return head


def _training_points(
    predictions: EnsemblePredictions, ids: list[int], target: str
) -> list[tuple[Tensor, Tensor, Tensor, int]]:
    """Per model, what its curve is fitted on: the scores, targets (by ``target``) and labels (Tensor[K]
    each) of its detections on the images ``ids`` that count, and how many were left out in crowd regions.

    Raises:
        ValueError: a model without the data a curve needs (see :func:`fit_calibration`), named.
    """
    gt = predictions.gt
    gt.check_has_images(ids)

    names = predictions.model_names
    scores: list[list[Tensor]] = [[] for _ in names]
    targets: list[list[Tensor]] = [[] for _ in names]
    labels: list[list[Tensor]] = [[] for _ in names]
    ignored = [0] * len(names)
    for image_id in ids:
        gt_boxes, gt_labels, iscrowd = gt.targets(image_id)
        for m, det in enumerate(predictions.per_model(image_id)):
            if len(det) == 0:
                continue
            iou, counted = _targets(det, gt_boxes, gt_labels, iscrowd)
            ignored[m] += int((~counted).sum())
            scores[m].append(det.scores.detach().to("cpu", torch.float64)[counted])
            targets[m].append(iou[counted])
            labels[m].append(det.labels.to("cpu")[counted])

    points = []
    for m, name in enumerate(names):
        if not scores[m] or sum(t.numel() for t in scores[m]) == 0:
            raise ValueError(
                f"model {name!r} has no detection on the {len(ids)} training images; a calibration curve "
                "needs its scores (check its predictions, or leave it out of the ensemble)"
            )
        s, u, c = torch.cat(scores[m]), torch.cat(targets[m]), torch.cat(labels[m])
        if not bool((u > 0).any()):
            raise ValueError(
                f"model {name!r}: none of its {s.numel()} detections on the {len(ids)} training images overlaps "
                "a ground-truth box of its class, so its calibrated score would be 0 everywhere (are its class "
                "ids in the dataset's label space?)"
            )
        t = (u >= 0.5).to(torch.float64) if target == "tp50" else u
        if not bool((t > 0).any()):
            raise ValueError(
                f"model {name!r}: none of its {s.numel()} detections on the {len(ids)} training images reaches "
                "IoU 0.5 with a ground-truth box of its class, so its tp50 calibrated score would be 0 "
                "everywhere (target 'iou' still learns from the overlaps it has)"
            )
        points.append((s, t, c, ignored[m]))
    return points


def check_calibration_data(
    predictions: EnsemblePredictions, image_ids: Sequence[int], target: Literal["iou", "tp50"] = "iou"
) -> None:
    """Raise the ``ValueError`` that :func:`fit_calibration` would raise on ``image_ids`` for want of a
    model's data (no detection there, none that overlaps a ground-truth box of its class, or with
    ``"tp50"`` none that reaches IoU 0.5), without fitting the curves: a run that fits calibrations later
    (a cross-validation) refuses such a member before any other work."""
    _check_target(target)
    _training_points(predictions, check_distinct_integers(image_ids, "image_ids"), target)
