"""Fusers: ``list[Detections]`` (one per model, one image) → fused ``Detections``.

Every fuser satisfies one contract (tested over the registry): empty input gives empty output, the
output stays on the input device, boxes lie inside the image, scores in [0, 1], sorted by score, and the
caller's tensors are never modified.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from detens.detections import Detections
from detens.fusers._registry import FUSERS, check_weights
from detens.matching import check_per_model

# Importing the modules registers their fusers.
from detens.fusers import consensus, nms, subset, theta, wbf  # noqa: E402,F401  isort: skip

__all__ = ["FUSERS", "fuse", "list_fusers", "check_weights"]


def list_fusers() -> list[str]:
    return FUSERS.names()


def fuse(per_model: Sequence[Detections], method: str = "wbf", **params: Any) -> Detections:
    """Fuse the detections of several models on one image.

    Args:
        per_model (list[Detections]): one per model, same image, same device.
        method (str): a registered fuser (``detens.fusers.list_fusers()``).
        **params: the fuser's own parameters (``iou_thr``, ``weights``, ``head``, ...).

    Returns:
        Detections: fused boxes in the input's label space, clipped to the image, sorted by score.
    """
    fuser = FUSERS.get(method)
    check_per_model(per_model)
    return fuser(per_model, **params)
