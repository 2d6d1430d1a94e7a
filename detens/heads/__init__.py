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

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from detens.heads._io import HeadFileError, find_head_file, read_head_file
from detens.heads._registry import HEADS

logger = logging.getLogger(__name__)

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
    check_fit_data,
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
    "check_fit_data",
    "config_for",
    "fit_calibration",
    "fit_head",
    "head_class_ids",
    "check_head_label_space",
    "warn_of_class_agnostic_head_label_space",
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


def check_head_label_space(
    head: Any, categories: Mapping[int, str] | Iterable[int], what: str, label_space: str, *, complete: bool = True
) -> None:
    """Refuse ``head`` in the label space ``categories`` when its per-class parameters
    (:func:`head_class_ids`) would fuse other classes than the ones they were trained for:

    - an id of them outside ``categories``: the head was trained on another label space (not checked when
      ``complete`` is False: ``categories`` names only some classes of the label space, such as those that
      one image's detections carry);
    - an id of them that the head's recorded label space (``head.label_space``, which
      :func:`fit_head` records from the ground truth and the head file keeps) names otherwise than
      ``categories`` (a ``{id: name}`` mapping) does: the same ids mean other classes (a custom dataset's
      1, 5, 9 = cat, dog, bird used on COCO, where they are person, airplane, boat). Names are compared as
      the class maps compare them (case ignored, ``_`` and ``-`` read as spaces and runs of spaces as
      one, known aliases such as motorbike/motorcycle taken as one name); an id either side leaves unnamed
      is not compared.

    Nothing is compared by name when ``categories`` gives ids only, or the head records no label space
    (a file written before heads recorded one): its ids alone are checked, as before. A head without
    per-class parameters treats every class alike, so it is accepted in any label space, whatever it
    records: nothing of it belongs to a class.

    Cheap enough to run per image (tens of microseconds for a head with parameters for 80 classes).

    Raises:
        ValueError: naming the head (``what``), a few offending ids (with both names) and the label space.
    """
    from detens.adapters._labels import describe_label_space_difference, id_ranges, renamed_ids
    from detens.checks import first_few
    from detens.heads._io import head_label_space, named_categories

    own = head_class_ids(head)
    if not own:
        return
    recorded = head_label_space(head)
    if isinstance(categories, Mapping) and recorded is not None:
        theirs, ours = named_categories(categories), named_categories(recorded)
        renamed = renamed_ids(own, ours, theirs)
        if renamed:
            shown = first_few(renamed, 5, show=lambda r: describe_label_space_difference(r, "in the head", "there"))
            raise ValueError(
                f"{what} was trained on a label space whose category ids name other classes than in "
                f"{label_space}: {shown}; its per-class parameters would fuse the wrong classes: if the "
                "detections number the same classes otherwise (Ultralytics class indices 0-79 for COCO's "
                "category ids), map their labels to the head's ids first; else train one on this dataset "
                "(detens cache, detens train)"
            )
    if not complete:
        return
    ids = set(categories)
    foreign = [c for c in own if c not in ids]
    if foreign:
        raise ValueError(
            f"{what} has per-class parameters for category ids {id_ranges(foreign)}, which are not among the "
            f"{len(ids)} category ids of {label_space}: {id_ranges(sorted(ids))}; it was trained on another "
            "label space: train one on this dataset (detens cache, detens train)"
        )


def warn_of_class_agnostic_head_label_space(head: Any, categories: Mapping[int, str], what: str, label_space: str) -> None:
    """Warn where ``head`` has no per-class parameters (:func:`head_class_ids`) but records a label space
    whose ids ``categories`` lacks or names otherwise: it treats every class alike, so it is accepted in
    any label space (:func:`check_head_label_space`), yet a head fitted on a custom dataset's pedestrian,
    vehicle and dog used on COCO's 80 classes may not be what was meant. Meant to be called once per run
    (a command's check of its heads), not per image.

    Args:
        head: a loaded head (or calibration).
        categories (dict[int, str]): the run's label space, ``{category id: name}``.
        what (str): the head, for the message (``"head 'deep.json'"``).
        label_space (str): whose ``categories`` they are, for the message.
    """
    from detens.adapters._labels import describe_label_space_difference, label_space_differences
    from detens.checks import first_few
    from detens.heads._io import head_label_space

    recorded = head_label_space(head)
    if recorded is None or head_class_ids(head):  # per-class ids are check_head_label_space's to judge
        return
    # the run's ids that the head never saw are no sign of another label space: it may be fitted on a subset
    differing = [d for d in label_space_differences(recorded, categories) if d[1] is not None]
    if not differing:
        return
    shown = first_few(differing, 5, show=lambda d: describe_label_space_difference(d, "in the head", "there"))
    listed = first_few(sorted(categories.items()), 5, show=lambda c: f"{c[0]} {c[1]!r}")
    logger.warning(
        "%s was fitted on another label space than %s, whose categories are %s: %s; it has no per-class "
        "parameters, so it applies as it is, every class alike: fine if it was meant to carry over to these "
        "classes, else fit one on this label space (detens cache, detens train)",
        what, label_space, listed or "none", shown,
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

    Raises:
        FileNotFoundError: neither a file nor a shipped head's name (listing the shipped ones).
        ValueError: a suffix other than ``.json`` or ``.safetensors``; a head of other models than
            ``model_names``.
        HeadFileError: a file that is no valid head (naming the file and the field).
    """
    path = find_head_file(path)  # a shipped name: its file, which the head type reads again
    header = read_head_file(path)
    try:
        cls = HEADS.get(header.type)
    except ValueError as err:
        raise HeadFileError(f"{str(path)!r}: {err}") from None
    return cls.load(path, model_names=model_names)
