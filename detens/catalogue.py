"""The built-in names the command line's help pages list, known without importing what they name.

The registries hold the objects (:data:`detens.fusers.FUSERS`, :data:`detens.heads.HEADS`,
:data:`detens.heads.TRAINERS`, :data:`detens.evaluation.METHODS`), and reading them imports torch and
torchvision: seconds before ``detens <command> --help`` could print a line. These tuples name what the
registries register (the tests keep each equal to its registry), and the defaults the jobs take and the
help pages show are defined here once. This module imports only the standard library.
"""

from __future__ import annotations

__all__ = [
    "ASSETS_SOURCE", "COCO_BACKENDS", "DEFAULT_BENCH_SIZES", "DEFAULT_ENSEMBLE", "DEFAULT_EVALUATION_METHODS",
    "EVALUATION_METHODS", "FUSERS", "FUSION_METHODS", "HEAD_TYPES", "MAX_BENCH_BOXES", "MAX_K", "TRAINED_HEAD_TYPES",
]

#: the fusers of :data:`detens.fusers.FUSERS`
FUSERS: tuple[str, ...] = ("mean", "nms", "random_k", "refine", "soft_nms", "theta", "vote", "wbf")
#: the head types of :data:`detens.heads.HEADS`, the ``type`` of a saved head file
HEAD_TYPES: tuple[str, ...] = ("bagged", "calibrated", "calibration", "deep", "selection", "superlearner", "theta")
#: every name ``detens.fuse(method=...)`` and ``detens fuse --method`` accept: the fusers and the head types
FUSION_METHODS: tuple[str, ...] = tuple(sorted(set(FUSERS) | set(HEAD_TYPES)))
#: the head types ``detens train --head`` fits (:data:`detens.heads.TRAINERS`)
TRAINED_HEAD_TYPES: tuple[str, ...] = ("calibration", "deep", "selection", "superlearner", "theta", "theta_seed")
#: the largest k of the evaluation methods ``selection_k<k>`` and ``random_k<k>``
MAX_K = 8
#: the methods of :data:`detens.evaluation.METHODS` (``single:`` and ``head:`` take a model name or a head file)
EVALUATION_METHODS: tuple[str, ...] = tuple(
    sorted(
        {"head:", "mean", "nms", "oracle", "single:", "soft_nms", "vote", "wbf", "wbf_tuned", *TRAINED_HEAD_TYPES}
        | {f"{kind}_k{k}" for kind in ("random", "selection") for k in range(1, MAX_K + 1)}
    )
)
#: the COCO evaluators ``detens evaluate --backend`` can score with
COCO_BACKENDS: tuple[str, ...] = ("pycocotools", "faster", "hotcoco")

#: the shipped ensemble ``detens fuse`` and ``detens cache`` run without ``--config``
DEFAULT_ENSEMBLE = "coco_yolo3"
#: the ``--source`` that stands for the sample images bundled with Ultralytics
ASSETS_SOURCE = "ultralytics-assets"
#: the methods ``detens evaluate`` compares without ``--methods``
DEFAULT_EVALUATION_METHODS = "single,nms,soft_nms,wbf,wbf_tuned,vote,mean,theta"
#: the sizes ``detens bench`` times without ``--sizes``: NxK, N models of K boxes each
DEFAULT_BENCH_SIZES: tuple[str, ...] = ("3x100", "3x300", "5x1000", "5x3000")
#: the most boxes (N x K) an image of ``detens bench``'s sizes may hold: some hundred times what an
#: ensemble of detectors gives one image, and what the machine's memory holds
MAX_BENCH_BOXES = 1_000_000
