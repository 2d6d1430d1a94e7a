"""The ``theta`` fuser: cross-model matching, then a learned fusion head (by default the Θ head)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from detens.detections import Detections
from detens.fusers._registry import FUSERS
from detens.matching import match

__all__ = ["theta_fusion", "load_cached_head", "head_methods"]

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int, size: int) -> Any:
    """A saved head, loaded once per (path, modification time, size): fusing image by image stays fast."""
    from detens.heads import load_head

    return load_head(path)


def load_cached_head(path: str | Path) -> Any:
    """:func:`detens.heads.load_head`, cached per (path, modification time, size): a rewritten file is reloaded.
    A shipped head's name is its file."""
    from detens.heads._io import find_head_file

    resolved = find_head_file(path).resolve()
    stat = resolved.stat()
    return _load_cached(str(resolved), stat.st_mtime_ns, stat.st_size)


def _resolve_head(head: Any, num_models: int, sources: Sequence[str | None] = ()) -> Any:
    if head is None:
        raise ValueError(
            "theta fusion needs head=: a trained head (detens.ThetaHead, or any head of detens.heads) or the path "
            "of a saved one (`detens train` or detens.fit_head writes it); an untrained ThetaHead(model_names) "
            "fuses like 'mean'"
        )
    if isinstance(head, (str, Path)):
        head = load_cached_head(head)
    if not callable(getattr(head, "fuse", None)) and not callable(getattr(head, "fuse_detections", None)):
        raise TypeError(
            f"head must be a fusion head with .fuse(clusters) (e.g. detens.ThetaHead) or "
            f".fuse_detections(per_model) (a CalibrationHead), or the path of a saved one, got {type(head).__name__}"
        )
    head_models = getattr(head, "num_models", None)
    if head_models != num_models:
        names = getattr(head, "model_names", None)
        which = ""
        if names is not None and sources and all(s is not None for s in sources):
            # named members: say which, not only how many, so a dropped or renamed detector is found at once
            missing = [n for n in names if n not in sources]
            extra = [s for s in sources if s not in names]
            parts = [f"missing: {missing}"] if missing else []
            parts += [f"not the head's: {extra}"] if extra else []
            which = f" ({'; '.join(parts)})" if parts else ""
        raise ValueError(
            f"the head was trained for {head_models} models {names} but {num_models} models' detections were given"
            f"{which}; pass one Detections per model (named by their source, or in the head's model order)"
        )
    return head


def head_methods(head: Any) -> list[str]:
    """The methods that run ``head``: its type, then the type of each head it wraps (its ``wrapped_head``:
    the scored head of a ``calibrated`` one, the members of a ``bagged`` one), the innermost last. A
    calibrated ``deep`` head, a bag of ``deep`` heads, or a calibrated bag of them runs as ``deep``, and its
    boxes say ``fused:deep``."""
    methods: list[str] = []
    while head is not None and getattr(head, "type_name", None):
        methods.append(head.type_name)
        head = getattr(head, "wrapped_head", None)
    return methods


@FUSERS.register("theta")
def theta_fusion(per_model: Sequence[Detections], head: Any = None, iou_thr: float | None = None) -> Detections:
    """Match the models' boxes into clusters, then fuse each cluster with a learned head.

    Args:
        per_model (list[Detections]): one per model of the head: in any order when each names its model in
            ``source`` (the adapters and saved predictions do), else in the head's model order.
        head (ThetaHead | str | Path | None): a head (any registered head type with ``.fuse(clusters)``
            and ``num_models``), the path of a saved one (``.json`` / ``.safetensors``, loaded with
            :func:`detens.heads.load_head`), or a shipped head's name (``"coco_yolo3_deep"``). Required: an untrained ``ThetaHead(model_names)`` fuses like
            ``mean``. A head with ``.fuse_detections(per_model)`` (the ``calibration`` head) is given the
            models' detections instead of clusters and fuses them with its own fuser.
        iou_thr (float | None): the matching IoU threshold (see :func:`detens.match`), in [0, 1); ``None``: the one the
            head was trained with (its ``match_iou``), else 0.55. For a ``fuse_detections`` head, passed
            to its fuser as ``iou_thr`` when given.

    Returns:
        Detections: fused boxes, source ``"fused:theta"`` (or ``"fused:<head type>"`` for another head; the wrapped
            head's type for a ``calibrated`` one).
    """
    head = _resolve_head(head, len(per_model), [getattr(d, "source", None) for d in per_model])
    model_names = getattr(head, "model_names", None)
    if model_names is not None:
        from detens.heads._io import in_member_order

        # heads weigh their members by name: put the detections into the head's model order
        per_model = in_member_order(per_model, model_names)
    if callable(getattr(head, "fuse_detections", None)):
        # A head that acts on the models' own detections (calibration) fuses with its own fuser: no matching here.
        fused = head.fuse_detections(per_model, **({} if iou_thr is None else {"iou_thr": iou_thr}))
        return fused.with_source(f"fused:{(head_methods(head) or ['theta'])[-1]}")
    if iou_thr is None:
        iou_thr = getattr(head, "match_iou", 0.55)
    clusters = match(per_model, iou_thr=iou_thr)
    fused = head.fuse(clusters)
    return fused.with_source(f"fused:{(head_methods(head) or ['theta'])[-1]}")
