"""The versions of the software that produced a run's files, recorded beside them.

Detector runtimes change their outputs between releases by amounts too small to see in a member's own mAP
and large enough to move a learned head fitted on them (a head's training is as sensitive to its inputs as
to its seed), so a cache or an evaluation that cannot say what made it cannot be compared with a later one.
"""

from __future__ import annotations

import platform
from importlib import metadata

__all__ = ["RECORDED_PACKAGES", "software_versions"]

#: The distributions whose versions are recorded, those installed: detens, the tensor and image stack,
#: the detector runtimes and the COCO scorers.
RECORDED_PACKAGES = (
    "detens",
    "torch",
    "torchvision",
    "numpy",
    "opencv-python",
    "opencv-python-headless",
    "ultralytics",
    "ai-edge-litert",
    "openvino",
    "onnxruntime",
    "pycocotools",
    "faster-coco-eval",
    "hotcoco",
    "ray",
)


def software_versions() -> dict[str, str]:
    """``{"python": version, distribution: version}`` for each of :data:`RECORDED_PACKAGES` that is
    installed (the others are left out)."""
    versions = {"python": platform.python_version()}
    for name in RECORDED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions
