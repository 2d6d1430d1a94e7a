"""detens: object-detection ensembling with learned fusion weights.

Public API (imported lazily, so ``import detens`` stays light and never imports ultralytics):

- ``Detections``: boxes (xyxy pixels), scores, labels, image size — the one currency
  (``to_supervision`` / ``from_supervision`` with ``detens[supervision]``).
- ``match``, ``Clusters``: cross-model matching into per-object N×5 prediction matrices.
- ``ThetaHead``, ``assign_targets``: the learned Θ fusion head (seed paper, corrected math).
- ``fuse``, ``list_fusers``, ``list_methods``: every fusion method behind one call (``list_methods``: the
  fusers and the head types, every name ``fuse(method=...)`` takes).
- ``evaluate_coco``: COCO mAP with labelled keys.
- ``Ensemble``, ``fuse_results``, ``TorchvisionFusion``: drop-in use inside existing pipelines.
- ``SelectionHead``, ``DeepEnsembleHead``, ``SuperLearnerHead``, ``CalibrationHead``, ``BaggedHead``: the
  learned heads beyond Θ; ``fit_head`` fits any of them (and Θ) on saved predictions.
- ``detection_calibration``: expected calibration error and reliability bins of COCO results.
- ``UltralyticsDetector``, ``TorchvisionDetector``, ``PrecomputedDetector``, ``AugmentedDetector``,
  ``build_ensemble``, ``list_images``: bring your detectors and images.
- ``cache``, ``fuse_images``: the ``detens cache`` / ``detens fuse`` jobs as calls (``engine="ray"`` too).
"""

# private aliases: a plain ``import importlib`` would be listed as ``detens.importlib``
import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

_EXPORTS = {
    "Detections": "detens.detections",
    "Clusters": "detens.matching",
    "match": "detens.matching",
    "fuse": "detens.fusers",
    "list_fusers": "detens.fusers",
    "list_methods": "detens.fusers",
    "ThetaHead": "detens.heads.theta",
    "assign_targets": "detens.targets",
    "Targets": "detens.targets",
    "evaluate_coco": "detens.coco",
    "load_coco_results": "detens.coco",
    "save_coco_results": "detens.coco",
    "load_coco_gt": "detens.coco",
    "CocoGroundTruth": "detens.coco",
    "EnsemblePredictions": "detens.predictions",
    "Ensemble": "detens.pipeline",
    "fuse_results": "detens.pipeline",
    "TorchvisionFusion": "detens.pipeline",
    "load_head": "detens.heads",
    "SelectionHead": "detens.heads.selection",
    "DeepEnsembleHead": "detens.heads.deep",
    "SuperLearnerHead": "detens.heads.superlearner",
    "CalibrationHead": "detens.heads.calibration",
    "BaggedHead": "detens.heads.bagged",
    "fit_head": "detens.heads",
    "detection_calibration": "detens.calibration_metrics",
    "UltralyticsDetector": "detens.adapters",
    "TorchvisionDetector": "detens.adapters",
    "PrecomputedDetector": "detens.adapters",
    "AugmentedDetector": "detens.adapters",
    "build_ensemble": "detens.adapters",
    "list_images": "detens.sources",
    "cache": "detens.jobs.calls",
    "fuse_images": "detens.jobs.calls",
}

__all__ = sorted(_EXPORTS)

if _typing.TYPE_CHECKING:
    # the names as type checkers and editors see them; at run time __getattr__ imports each on first use
    from detens.adapters import (  # noqa: F401
        AugmentedDetector,
        PrecomputedDetector,
        TorchvisionDetector,
        UltralyticsDetector,
        build_ensemble,
    )
    from detens.calibration_metrics import detection_calibration  # noqa: F401
    from detens.coco import (  # noqa: F401
        CocoGroundTruth,
        evaluate_coco,
        load_coco_gt,
        load_coco_results,
        save_coco_results,
    )
    from detens.detections import Detections  # noqa: F401
    from detens.fusers import fuse, list_fusers, list_methods  # noqa: F401
    from detens.heads import fit_head, load_head  # noqa: F401
    from detens.heads.bagged import BaggedHead  # noqa: F401
    from detens.heads.calibration import CalibrationHead  # noqa: F401
    from detens.heads.deep import DeepEnsembleHead  # noqa: F401
    from detens.heads.selection import SelectionHead  # noqa: F401
    from detens.heads.superlearner import SuperLearnerHead  # noqa: F401
    from detens.heads.theta import ThetaHead  # noqa: F401
    from detens.jobs.calls import cache, fuse_images  # noqa: F401
    from detens.matching import Clusters, match  # noqa: F401
    from detens.pipeline import Ensemble, TorchvisionFusion, fuse_results  # noqa: F401
    from detens.predictions import EnsemblePredictions  # noqa: F401
    from detens.sources import list_images  # noqa: F401
    from detens.targets import Targets, assign_targets  # noqa: F401


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'detens' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
