"""Fusers: ``list[Detections]`` (one per model, one image) → fused ``Detections``.

Every fuser satisfies one contract (tested over the registry): empty input gives empty output, the
output stays on the input device, boxes lie inside the image, scores in [0, 1], sorted by score, and the
caller's tensors are never modified.

``fuse(per_model, method, calibration=head)`` first calibrates each model's scores with a
:class:`~detens.heads.calibration.CalibrationHead` (MoCaE: per-model isotonic maps from score to the
expected IoU with the ground truth, so that the models' scores become comparable), then fuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from detens.detections import Detections, _validate_image_size
from detens.fusers._registry import FUSERS, check_weights
from detens.matching import check_per_model

# Importing the modules registers their fusers.
from detens.fusers import consensus, nms, refine, subset, theta, wbf  # noqa: E402,F401  isort: skip

__all__ = ["FUSERS", "fuse", "list_fusers", "check_weights"]


def list_fusers() -> list[str]:
    return FUSERS.names()


def fuse(
    per_model: Sequence[Detections],
    method: str = "wbf",
    calibration: Any = None,
    image_size: tuple[int, int] | None = None,
    **params: Any,
) -> Detections:
    """Fuse the detections of several models on one image.

    Args:
        per_model (list[Detections]): one per model, same image, same device. ``supervision.Detections``
            are accepted too (see :mod:`detens.interop.supervision`; their ``class_id`` are the labels),
            with ``image_size``.
        method (str): a registered fuser (``detens.fusers.list_fusers()``).
        calibration (CalibrationHead | str | Path | None): when given, each model's scores are first
            replaced by its calibrated ones (``head.calibrate(per_model)``: members matched by their
            ``source`` name, else by position), then the calibrated detections are fused by ``method``.
            A path is loaded with :func:`detens.heads.load_head` once per file version. The head's own
            ``fuser`` is not used here: ``method`` and ``params`` decide the fusion.
        image_size (tuple[int, int] | None): ``(height, width)`` of the image; required when ``per_model``
            holds ``supervision.Detections`` (they do not record it), else checked against the Detections'.
        **params: the fuser's own parameters (``iou_thr``, ``weights``, ``head``, ...).

    Returns:
        Detections: fused boxes in the input's label space, clipped to the image, sorted by score; a
        ``supervision.Detections`` when every input was one.
    """
    fuser = FUSERS.get(method)
    as_supervision = False
    if isinstance(per_model, Sequence) and not isinstance(per_model, Detections):
        from detens.interop.supervision import from_supervision_per_model

        per_model, as_supervision = from_supervision_per_model(per_model, image_size)
    check_per_model(per_model)
    if image_size is not None and per_model[0].image_size != _validate_image_size(image_size):
        raise ValueError(
            f"image_size={tuple(image_size)} but the Detections are of a {per_model[0].image_size} image"
        )
    if calibration is not None:
        per_model = _resolve_calibration(calibration).calibrate(per_model)
    fused = fuser(per_model, **params)
    return fused.to_supervision() if as_supervision else fused


def _resolve_calibration(calibration: Any) -> Any:
    if isinstance(calibration, (str, Path)):
        calibration = theta.load_cached_head(calibration)
    if not callable(getattr(calibration, "calibrate", None)):
        raise TypeError(
            "calibration must be a CalibrationHead (detens.heads.calibration.fit_calibration makes one) or the "
            f"path of a saved one, got {type(calibration).__name__}"
        )
    return calibration
