"""Fusers: ``list[Detections]`` (one per model, one image) → fused ``Detections``.

Every fuser satisfies one contract (tested over the registry): empty input gives empty output, the
output stays on the input device, boxes lie inside the image, scores in [0, 1], sorted by score, and the
caller's tensors are never modified.

``fuse(per_model, method, calibration=head)`` first calibrates each model's scores with a
:class:`~detens.heads.calibration.CalibrationHead` (MoCaE: per-model isotonic maps from score to the
expected IoU with the ground truth, so that the models' scores become comparable), then fuses.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from detens.checks import check_max_det, check_name_list
from detens.detections import Detections, _validate_image_size
from detens.fusers._registry import FUSERS, check_weights
from detens.matching import check_per_model
from detens.registry import unknown_name_error

# Importing the modules registers their fusers.
from detens.fusers import consensus, nms, refine, subset, theta, wbf  # noqa: E402,F401  isort: skip
from detens.fusers.theta import head_methods  # noqa: E402  isort: skip

__all__ = [
    "FUSERS", "fuse", "list_fusers", "list_methods", "check_method", "check_weights", "head_methods", "resolve_method",
    "check_members_named", "check_parameter_names", "highest_scoring",
]


def list_fusers() -> list[str]:
    """The registered fusers' names, sorted: the fixed methods of ``fuse(method=...)`` (``theta`` runs a
    trained head); :func:`list_methods` adds the head types."""
    return FUSERS.names()


def list_methods() -> list[str]:
    """Every name ``fuse(method=...)`` accepts: the fusers and the head types."""
    from detens.heads import list_heads

    return sorted(set(FUSERS.names()) | set(list_heads()))


def check_method(method: str) -> None:
    """Raise unless ``method`` is a fuser or a head type: the error lists every name and the nearest one."""
    if method not in list_methods():
        raise unknown_name_error("fusion method", method, list_methods())


def default_method(method: str | None, head: Any, params: dict[str, Any] | None = None) -> str:
    """``method`` as given; None: ``"theta"``, the fuser of every head type, when a head is given (``head``,
    else ``params["head"]``; as the CLI's ``--head`` implies its method), else ``"wbf"``."""
    if method is not None:
        return method
    if head is None and params is not None:
        head = params.get("head")
    return "theta" if head is not None else "wbf"


def resolve_method(method: str, params: dict[str, Any]) -> str:
    """The fuser that runs ``method``: itself when it is a fuser; ``theta`` for a head type, whose
    ``params["head"]`` (a head or its file, loaded here into ``params``) must be of that type."""
    if not isinstance(method, str):
        raise TypeError(f"method must be a string, got {type(method).__name__}: {method!r}")
    if method in FUSERS:
        return method
    check_method(method)
    head = params.get("head")
    if head is None:
        raise ValueError(f"method {method!r} is a head type: pass head= (a trained {method} head or its file)")
    if isinstance(head, (str, Path)):
        head = params["head"] = theta.load_cached_head(head)
    runs_as = head_methods(head)
    if method not in runs_as:
        kind = runs_as[-1] if runs_as else type(head).__name__  # a calibrated deep head runs as "deep"
        also = "" if kind == "theta" else " (or 'theta', which runs any head)"
        raise ValueError(f"method {method!r} was given a {kind!r} head; use method={kind!r}{also}")
    return "theta"


def fuse(
    per_model: Sequence[Detections],
    method: str | None = None,
    calibration: Any = None,
    image_size: tuple[int, int] | None = None,
    label_space: Mapping[int, str] | None = None,
    max_det: int | None = None,
    model_names: Sequence[str] | None = None,
    **params: Any,
) -> Detections:
    """Fuse the detections of several models on one image.

    Args:
        per_model (list[Detections]): one per model, same image, same device. ``supervision.Detections``
            are accepted too (see :mod:`detens.interop.supervision`; their ``class_id`` are the labels),
            with ``image_size``.
        method (str | None): a registered fuser (``detens.fusers.list_fusers()``), or a head type
            (``detens.heads.list_heads()``: ``deep``, ``superlearner``, ...), which needs ``head=`` of that
            type and fuses through the ``theta`` fuser (matching, then the head). None: ``"wbf"``, or
            ``"theta"`` (which runs any head) when ``head=`` is given.
        calibration (CalibrationHead | str | Path | None): when given, each model's scores are first
            replaced by its calibrated ones (``head.calibrate(per_model)``: members matched by their
            ``source`` name, else by position), then the calibrated detections are fused by ``method``.
            A path is loaded with :func:`detens.heads.load_head` once per file version. The head's own
            ``fuser`` is not used here: ``method`` and ``params`` decide the fusion.
        image_size (tuple[int, int] | None): ``(height, width)`` of the image; required when ``per_model``
            holds ``supervision.Detections`` (they do not record it), else checked against the Detections'.
        label_space (Mapping[int, str] | None): the category names of the detections' labels,
            ``{id: name}``; when given, a label it does not define is refused, and so is a head (``head=``,
            or ``calibration``) whose per-class parameters were trained on other classes (see
            :func:`detens.heads.check_head_label_space`): one with parameters for an id that ``label_space``
            lacks, or whose recorded label space names one of its ids otherwise. Without it,
            ``supervision.Detections`` that carry their class names (``data["class_name"]``) have those names
            compared (their ids are only the classes of this image: none is refused for being absent). A
            head without per-class parameters is accepted in any label space.
        max_det (int | None): keep the ``max_det`` highest-scoring fused boxes (as Ultralytics' ``max_det``
            and torchvision's ``detections_per_img`` cap a detector's output; ties keep the fuser's order);
            None keeps every box. Fusion gives more boxes than any member: each object that only one model
            finds is one.
        model_names (list[str] | None): the name of each model of ``per_model``, in order: given to the
            Detections without a ``source`` (``supervision.Detections`` carry none), checked against the
            others'. A head (``head=``, ``calibration``) matches its models by these names; a head of
            several models given ``supervision.Detections`` needs them (in the head's order, each model's
            weights would silently go to another model's boxes). Plain Detections without a ``source``
            are taken in the head's order.
        **params: the fuser's own parameters (``iou_thr``, ``weights``, ``head``, ...).

    Returns:
        Detections: fused boxes in the input's label space, clipped to the image, sorted by score; a
        ``supervision.Detections`` when every input was one.

    Raises:
        ValueError: among others, an unknown ``method`` (listing the valid names), a head type without
            ``head=``, a parameter out of its range, an empty ``per_model``, Detections of different images,
            and a head trained on other classes than ``label_space``'s, naming the ids.
        TypeError: ``per_model`` is no list of Detections, a parameter the method does not take (listing
            those it takes), or a parameter of the wrong type.
    """
    given_head = params.get("head")  # for messages: a path that resolve_method may load
    method = default_method(method, given_head)
    fuser = FUSERS.get(resolve_method(method, params))
    check_parameter_names(
        method, fuser, params, own=("calibration", "image_size", "label_space", "max_det", "model_names")
    )
    max_det = check_max_det(max_det)
    if label_space is not None:
        if not isinstance(label_space, Mapping):
            raise TypeError(f"label_space must map category ids to names ({{id: name}}), got {type(label_space).__name__}")
        from detens.heads._io import check_label_space

        label_space = check_label_space(label_space, "label_space")
    as_supervision, class_names = False, None
    if isinstance(per_model, Sequence) and not isinstance(per_model, Detections):
        from detens.interop.supervision import class_names_of, from_supervision_per_model

        class_names = class_names_of(per_model)
        per_model, as_supervision = from_supervision_per_model(per_model, image_size)
    check_per_model(per_model)
    _warn_if_normalized(per_model)
    if label_space is not None:
        _check_labels_in(per_model, label_space)
    if model_names is not None:
        per_model = _named(per_model, model_names)
    elif as_supervision:
        check_members_named({"head": params.get("head"), "calibration": calibration}, "supervision.Detections")
    if image_size is not None and per_model[0].image_size != _validate_image_size(image_size):
        raise ValueError(
            f"image_size={tuple(image_size)} but the Detections are of a {per_model[0].image_size} image"
        )
    if calibration is not None:
        given, calibration = calibration, _resolve_calibration(calibration)
        _check_head_label_space(calibration, given, "calibration", label_space, class_names)
        per_model = calibration.calibrate(per_model)
    if params.get("head") is not None and (label_space is not None or class_names is not None):
        if isinstance(params["head"], (str, Path)):  # loaded as the fuser would load it: once per file version
            params["head"] = theta.load_cached_head(params["head"])
        _check_head_label_space(params["head"], given_head, "head", label_space, class_names)
    fused = highest_scoring(fuser(per_model, **params), max_det)
    return fused.to_supervision(class_names) if as_supervision else fused


# Below this side, boxes within a pixel of the corner may be real ones.
_NORMALIZED_MIN_SIDE = 32


def _warn_if_normalized(per_model: Sequence[Detections]) -> None:
    """Warn when every box of every model lies within [0, 1], not all at 0, on an image of at least
    ``_NORMALIZED_MIN_SIDE`` pixels a side: boxes normalized by the image size, taken as pixels, would all
    fuse into the image's top-left pixel (IoUs of such boxes are still IoUs, so nothing else fails)."""
    height, width = per_model[0].image_size
    if min(height, width) < _NORMALIZED_MIN_SIDE:
        return
    largest = 0.0
    for d in per_model:  # on every fuse call: pixel boxes end the check at the first model with a box
        if len(d):
            largest = max(largest, float(d.boxes.detach().max()))
            if largest > 1.0:
                return
    if largest:  # boxes all at 0 are degenerate, not normalized
        warnings.warn(
            f"every box lies within [0, 1] (the largest coordinate is {largest:g}) on a {height}x{width} image: "
            "detens takes boxes in absolute pixels (xyxy); scale normalized boxes by the image's width and height",
            UserWarning,
            stacklevel=3,
        )


def _check_labels_in(per_model: Sequence[Detections], label_space: Mapping[int, str]) -> None:
    """Refuse a label that ``label_space`` does not define: the detections are of another label space
    (Ultralytics' class indices, COCO's ids under a dataset of one's own), whose ids a head's per-class
    parameters would take for other classes.

    Raises:
        ValueError: naming the model, a few such labels and the label space's ids.
    """
    from detens.adapters._labels import id_ranges

    known = torch.tensor(sorted(label_space), dtype=torch.int64)
    for n, detections in enumerate(per_model):
        labels = detections.labels.unique().cpu()
        foreign = labels[~torch.isin(labels, known)].tolist()
        if foreign:
            raise ValueError(
                f"per_model[{n}] has labels {id_ranges(foreign)}, which label_space does not define (its ids: "
                f"{id_ranges(sorted(label_space))}); label_space names the classes of the detections' labels: map "
                "them onto its ids first, or give the label space they are in"
            )


def check_members_named(heads: Mapping[str, Any], inputs: str, num_models: int | None = None) -> None:
    """Refuse a head of several models for ``inputs`` that carry no model name (Ultralytics ``Results``,
    torchvision's dicts, ``supervision.Detections``) given without ``model_names``: taken in the head's own
    order (a trained head's is often sorted), each model's weights would go to another model's boxes, a
    silently wrong result.

    Args:
        heads: by argument name (``head``, ``calibration``), a head, its path or shipped name, or None.
        inputs (str): what the models' outputs are, for the message.
        num_models (int | None): the number of models given, when known: another number than the head's
            is left to the fuser, whose message names both counts.

    Raises:
        ValueError: naming the head's models and ``model_names``.
    """
    for key, head in heads.items():
        if isinstance(head, (str, Path)):  # loaded as the fuser will load it: once per file version
            head = theta.load_cached_head(head)
        head_models = getattr(head, "model_names", None)
        if head_models is not None and len(head_models) > 1 and num_models in (None, len(head_models)):
            raise ValueError(
                f"the {key} is for models {list(head_models)}, and {inputs} carry no model name: pass "
                "model_names=[...], the name of each model in the order you pass their outputs, so that each "
                "model's weights go to its own boxes"
            )


def _named(per_model: list[Detections], model_names: Sequence[str]) -> list[Detections]:
    """``per_model`` with ``model_names[n]`` as the source of the n-th Detections.

    Raises:
        TypeError: ``model_names`` is a string. ValueError: another count, or a Detections whose source names
            another model.
    """
    model_names = check_name_list(model_names)
    if len(model_names) != len(per_model):
        raise ValueError(f"model_names names {len(model_names)} models but per_model holds {len(per_model)}")
    named = []
    for n, (detections, name) in enumerate(zip(per_model, model_names, strict=True)):
        if detections.source and detections.source != name:
            raise ValueError(f"per_model[{n}] comes from {detections.source!r}, but model_names[{n}] is {name!r}")
        named.append(detections if detections.source == name else detections.with_source(name))
    return named


def highest_scoring(detections: Detections, max_det: int | None) -> Detections:
    """The ``max_det`` highest-scoring boxes of ``detections``, sorted by score (ties in their order); None:
    ``detections`` as they are."""
    if max_det is None:
        return detections
    return detections[torch.argsort(detections.scores, descending=True, stable=True)[:max_det]]


@functools.cache
def _parameter_names(fuser: Any) -> tuple[str, ...] | None:
    """The keyword parameters of ``fuser`` after its detections; None when it takes any (``**kwargs``) or
    has no signature to read."""
    try:
        signature = inspect.signature(fuser)
    except (TypeError, ValueError):
        return None
    parameters = list(signature.parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return tuple(p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL)


def check_parameter_names(method: str, fuser: Any, params: dict[str, Any], own: Sequence[str] = ()) -> None:
    """Raise TypeError naming ``method`` (not the function behind it) and what it takes when ``params``
    holds a name that neither ``fuser`` nor the caller (``own``: :func:`fuse`'s ``calibration``, ...) takes.
    A fuser without a signature to read, or taking ``**kwargs``, checks its parameters itself."""
    names = _parameter_names(fuser)
    if names is None:
        return
    unknown = sorted(set(params) - set(names) - set(own))
    if unknown == ["head"]:  # most often a head given with the default method
        raise TypeError(
            f"fusion method {method!r} takes no head; pass method='theta' (which runs any head) or the head's "
            "type (method='deep', ...)"
        )
    if unknown:
        raise TypeError(f"fusion method {method!r} takes no parameter {unknown}; its parameters: {[*names, *own]}")


def _check_head_label_space(
    head: Any, given: Any, what: str, label_space: dict[int, str] | None, class_names: dict[int, str] | None
) -> None:
    """Refuse ``head`` (``given`` as a head or its path, to the argument ``what``) in ``label_space``, or,
    without it, under the class names the supervision inputs carry (those of one image's classes), if any.
    Tens of microseconds: checked on every call, against milliseconds of fusion."""
    if label_space is None and class_names is None:
        return
    from detens.heads import check_head_label_space

    if isinstance(given, (str, Path)):
        named = f"{what} {str(given)!r}"
    else:
        named = "the head" if what == "head" else f"the {what} head"
    if label_space is not None:
        check_head_label_space(head, label_space, named, "label_space")
    else:
        check_head_label_space(head, class_names, named, "the detections' class names", complete=False)


def _resolve_calibration(calibration: Any) -> Any:
    if isinstance(calibration, (str, Path)):
        calibration = theta.load_cached_head(calibration)
    if not callable(getattr(calibration, "calibrate", None)):
        raise TypeError(
            "calibration must be a CalibrationHead (detens.heads.calibration.fit_calibration makes one) or the "
            f"path of a saved one, got {type(calibration).__name__}"
        )
    return calibration
