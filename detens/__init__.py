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


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'detens' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
