"""Fusion heads: learned maps from a cluster's N×5 prediction matrix to one fused box and score.

Every head type is an ``nn.Module`` registered in :data:`HEADS` under the ``type`` it writes into its
saved file, is fitted through :data:`TRAINERS` (one entry for all: :func:`fit_head`, see
:mod:`detens.heads._fit`), and offers

- ``head(clusters) -> (boxes (Tensor[C, 4]) normalized, scores (Tensor[C]))``;
- ``head.fuse(clusters) -> Detections`` (pixels, clipped, sorted by score);
- ``head.num_models`` and ``head.model_names``;
- ``head.save(path)`` and the classmethod ``load(path, model_names=None)`` (``.json`` or ``.safetensors``).

:func:`load_head` reads any saved head and returns an instance of the right type.
Head types: ``"theta"`` (:class:`~detens.heads.theta.ThetaHead`), ``"selection"`` (e2e-CEL,
:class:`~detens.heads.selection.SelectionHead`), ``"deep"`` (:class:`~detens.heads.deep.DeepEnsembleHead`),
``"superlearner"`` (:class:`~detens.heads.superlearner.SuperLearnerHead`), ``"calibration"`` (MoCaE,
:class:`~detens.heads.calibration.CalibrationHead`, fitted by :func:`fit_calibration`), ``"bagged"`` (the
average of bootstrap fits of one network head type, :class:`~detens.heads.bagged.BaggedHead`),
``"calibrated"`` (calibration curves, then a network head fitted on the calibrated scores,
:class:`~detens.heads.calibrated.CalibratedHead`); more register themselves as they are added.

The calibration head acts before matching: ``head.calibrate(per_model)`` maps each model's scores,
``head.fuse_detections(per_model)`` then fuses with a fixed fuser (``detens.fuse(per_model, method,
calibration=head)`` does the same with any fuser). The calibrated head also fuses through
``fuse_detections(per_model)``: its calibration, then its network head.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from detens.heads._io import HeadFileError, find_head_file, read_head_file
from detens.heads._registry import HEADS

# Importing the modules registers their head types.
from detens.heads import theta  # noqa: E402,F401  isort: skip
from detens.heads import bagged, calibrated, calibration, deep, selection, superlearner  # noqa: E402,F401  isort: skip
from detens.heads.calibrated import CalibratedHead  # noqa: E402  isort: skip
from detens.heads.calibration import CalibrationHead, fit_calibration  # noqa: E402  isort: skip
from detens.heads._fit import (  # noqa: E402  isort: skip
    CalibrationTrainConfig,
    DeepTrainConfig,
    HeadTrainConfig,
    SelectionTrainConfig,
    SuperLearnerTrainConfig,
    ThetaTrainConfig,
    TRAINERS,
    TrainHistory,
    build_samples,
    config_for,
    fit_head,
    load_train_config,
    theta_seed_config,
    train_config_from,
)

__all__ = [
    "HEADS",
    "TRAINERS",
    "CalibratedHead",
    "CalibrationHead",
    "CalibrationTrainConfig",
    "DeepTrainConfig",
    "HeadFileError",
    "HeadTrainConfig",
    "SelectionTrainConfig",
    "SuperLearnerTrainConfig",
    "ThetaTrainConfig",
    "TrainHistory",
    "build_samples",
    "config_for",
    "fit_calibration",
    "fit_head",
    "head_class_ids",
    "check_head_label_space",
    "list_heads",
    "load_head",
    "load_train_config",
    "theta_seed_config",
    "train_config_from",
]


def list_heads() -> list[str]:
    return HEADS.names()


def head_class_ids(head: Any) -> list[int]:
    """The category ids ``head`` holds parameters of its own for, sorted: per-class Θ rows, class embedding
    rows, per-class calibration curves, also inside a calibrated or bagged head. ``[]`` for a head that
    treats every class alike.

    Training gives such rows only to the ids its (class-mapped) predictions had, so every one of them is a
    category of the label space the head was trained on: an id outside another label space shows the head
    belongs to a different one, whose ids mean other classes.
    """
    import torch

    ids: set[int] = set()
    for module in head.modules() if isinstance(head, torch.nn.Module) else ():
        if isinstance(module, CalibrationHead):
            ids.update(c for name in module.model_names for c in module.class_ids(name))
        elif isinstance(getattr(module, "class_ids", None), torch.Tensor):
            ids.update(int(c) for c in module.class_ids.tolist())
    return sorted(ids)


def check_head_label_space(head: Any, category_ids: Iterable[int], what: str, label_space: str) -> None:
    """Refuse ``head`` when it holds per-class parameters (:func:`head_class_ids`) for an id outside
    ``category_ids``: it was trained on another label space, whose ids mean other classes.

    Raises:
        ValueError: naming the head (``what``), the foreign ids and the label space.
    """
    from detens.adapters._labels import id_ranges

    ids = set(category_ids)
    foreign = [c for c in head_class_ids(head) if c not in ids]
    if foreign:
        raise ValueError(
            f"{what} has per-class parameters for category ids {id_ranges(foreign)}, which are not among the "
            f"{len(ids)} category ids of {label_space}: {id_ranges(sorted(ids))}; it was trained on another "
            "label space: train one on this dataset (detens cache, detens train)"
        )


def load_head(path: str | Path, model_names: Sequence[str] | None = None) -> Any:
    """Load a saved head of any registered type.

    Args:
        path (str | Path): a ``.json`` or ``.safetensors`` file written by ``head.save``, or the name of a
            shipped head (``"coco_yolo3_deep"``, see :func:`detens.packaged.packaged_names`).
        model_names (list[str] | None): when given, the ensemble the head will fuse; a head trained
            for other models raises ``ValueError`` naming both lists (another order is fine: fusion
            matches members by their ``source`` names).

    Returns:
        the head (an ``nn.Module`` on the CPU).
    """
    path = find_head_file(path)  # a shipped name: its file, which the head type reads again
    header = read_head_file(path)
    try:
        cls = HEADS.get(header.type)
    except ValueError as err:
        raise HeadFileError(f"{str(path)!r}: {err}") from None
    return cls.load(path, model_names=model_names)
