"""torchvision detection models (Faster R-CNN, RetinaNet, FCOS, SSD, SSDlite, Mask/Keypoint R-CNN boxes).

Preprocessing is what torchvision expects: RGB float ``[3, H, W]`` in ``[0, 1]``; the model's own
``GeneralizedRCNNTransform`` normalizes, resizes and maps the boxes back to the input image. COCO-trained
torchvision models predict COCO category ids (1..90) directly.

Weights: ``"DEFAULT"`` or a weights enum name (``"COCO_V1"``) downloads the pretrained weights through
torchvision when online; a path loads a state dict (``.pth``/``.pt`` from ``model.state_dict()``, a
training checkpoint holding it under ``"model"``/``"state_dict"``, or ``.safetensors``); ``None`` leaves
the model untrained (random initialization, for tests).
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detens.adapters._base import BaseDetector, check_detection_options
from detens.adapters._labels import apply_label_lookup, build_label_lookup
from detens.adapters.weights import resolve_weights, upstream_failure
from detens.detections import Detections

__all__ = ["TorchvisionDetector", "list_torchvision_detectors", "load_state_dict_file"]

logger = logging.getLogger(__name__)


def list_torchvision_detectors() -> list[str]:
    """Names of torchvision's detection builders (``torchvision.models.list_models(module=detection)``)."""
    import torchvision.models.detection as detection
    from torchvision.models import list_models

    return list_models(module=detection)


def _check_arch(arch: str) -> None:
    valid = list_torchvision_detectors()
    if arch not in valid:
        close = difflib.get_close_matches(arch, valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown torchvision detection architecture {arch!r}; valid: {', '.join(valid)}.{hint}"
        )


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from ``.safetensors``, or from a torch file (plain, or under ``model``/``state_dict``)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, Mapping):
        for key in ("model", "state_dict", "model_state_dict"):
            if key in obj and isinstance(obj[key], Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(
            f"{str(path)!r} does not hold a state dict (a mapping of tensors); save weights with "
            "torch.save(model.state_dict(), path)"
        )
    return dict(obj)


def _set_thresholds(model: torch.nn.Module, conf: float, iou: float | None, max_det: int) -> None:
    """Set the score/NMS/max-detection settings where this architecture keeps them."""
    holder = getattr(model, "roi_heads", None)
    if holder is not None and hasattr(holder, "score_thresh"):  # Faster/Mask/Keypoint R-CNN
        targets = [holder]
    else:  # RetinaNet, FCOS, SSD, SSDlite
        targets = [model]
    for obj in targets:
        obj.score_thresh = conf
        if iou is not None:
            obj.nms_thresh = iou
        obj.detections_per_img = max_det


class TorchvisionDetector(BaseDetector):
    """A torchvision detection model as a detens detector.

    Args:
        arch (str): a torchvision detection builder (``"fasterrcnn_resnet50_fpn_v2"``, ``"retinanet_resnet50_fpn"``,
            ``"fcos_resnet50_fpn"``, ``"ssdlite320_mobilenet_v3_large"``, ...; see :func:`list_torchvision_detectors`).
        weights (str | Path | None): ``"DEFAULT"`` (or a weights enum name) for torchvision's pretrained
            weights (downloaded when online), a state-dict file (path, or a name relative to the weights
            folder), or None for an untrained model.
        conf (float): minimum score kept (set as the model's own score threshold).
        iou (float | None): the model's NMS IoU threshold; None keeps the architecture's default.
        imgsz (int | None): resize so that the longer side is ``imgsz`` (R-CNN, RetinaNet, FCOS); None keeps the
            architecture's default (800-1333 for R-CNNs). SSD models always use their fixed size.
        max_det (int): maximum boxes per image.
        device (str | None): ``"cpu"``, ``"cuda"``, ...; None: CUDA when available.
        name (str | None): display name; default ``arch``.
        categories (dict[int, str] | None): the dataset's ``{category_id: name}``; the model's COCO classes are
            mapped onto it by name. Default: labels are COCO category ids as predicted.
        class_map (dict | None): explicit ``{model label or class name: category_id}`` (e.g. for a model trained
            with its own ``num_classes``); unlisted labels are dropped.
        num_classes (int | None): classes of a custom-trained model (with background); default 91 (COCO).
        batch (int): images per forward pass.
        weights_dir (str | Path | None): the default weights folder when ``$DETENS_WEIGHTS`` is unset.
        **builder_kwargs: passed to the torchvision builder (``min_size``, ``trainable_backbone_layers``, ...).
    """

    def __init__(
        self,
        arch: str,
        weights: str | os.PathLike[str] | None = "DEFAULT",
        conf: float = 0.001,
        iou: float | None = None,
        imgsz: int | None = None,
        max_det: int = 300,
        device: str | None = None,
        *,
        name: str | None = None,
        categories: Mapping[int, str] | None = None,
        class_map: Mapping[int | str, int] | None = None,
        num_classes: int | None = None,
        batch: int = 1,
        weights_dir: str | Path | None = None,
        **builder_kwargs: Any,
    ) -> None:
        check_detection_options(conf, iou, max_det)
        if imgsz is not None and (isinstance(imgsz, bool) or not isinstance(imgsz, int) or imgsz < 32):
            raise ValueError(f"imgsz must be an integer >= 32 or None, got {imgsz!r}")
        _check_arch(arch)
        super().__init__(name or arch, batch, categories)
        from torchvision.models import get_model, get_model_weights

        self.arch = arch
        self.device = torch.device(
            device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        )
        weights_enum = get_model_weights(arch)
        coco_names = list(weights_enum.DEFAULT.meta["categories"])  # index = COCO category id
        kwargs = dict(builder_kwargs)
        if num_classes is not None:
            kwargs["num_classes"] = num_classes
        self.weights_source: str | None = None
        if weights is None:
            logger.warning("%s: no weights given, the model is UNTRAINED (random initialization)", self.name)
            model = get_model(arch, weights=None, weights_backbone=None, **kwargs)
        else:
            resolved = resolve_weights(weights, "torchvision", weights_dir)
            self.weights_source = resolved.value
            if resolved.local:
                model = get_model(arch, weights=None, weights_backbone=None, **kwargs)
                state = load_state_dict_file(resolved.value)
                try:
                    model.load_state_dict(state)
                except RuntimeError as err:
                    raise ValueError(
                        f"{resolved.value!r} does not fit torchvision {arch!r}"
                        f"{f' with num_classes={num_classes}' if num_classes else ''}: {err}"
                    ) from err
            else:
                try:
                    model = get_model(arch, weights=resolved.value, **kwargs)
                except (ValueError, KeyError) as err:  # unknown enum name
                    raise ValueError(
                        f"{resolved.value!r} is not a torchvision weights name for {arch!r} "
                        f"(valid: DEFAULT, {', '.join(w.name for w in weights_enum)}) nor an existing file. "
                        f"Looked at: {'; '.join(resolved.tried)}"
                    ) from err
                except OSError as err:  # urllib.error.URLError and friends: offline
                    raise upstream_failure(resolved, err, what=f"torchvision {arch}") from err
        self.model = model.eval().to(self.device)
        _set_thresholds(self.model, float(conf), None if iou is None else float(iou), max_det)
        transform = getattr(self.model, "transform", None)
        if imgsz is not None and transform is not None:
            if getattr(transform, "fixed_size", None):
                logger.warning(
                    "%s: %s has a fixed input size %s; imgsz=%d is ignored",
                    self.name,
                    arch,
                    transform.fixed_size,
                    imgsz,
                )
            else:
                transform.min_size = (imgsz,)
                transform.max_size = imgsz
        model_names = (
            coco_names if num_classes in (None, len(coco_names)) else [str(i) for i in range(num_classes)]
        )
        self.lookup = build_label_lookup(
            model_names, default="identity", categories=categories, class_map=class_map, where=self.name
        )
        if categories is None and class_map is None:
            self.lookup[[i for i, n in enumerate(model_names) if n in ("__background__", "N/A")]] = -1

    @torch.inference_mode()
    def _predict(self, images: list[np.ndarray]) -> list[Detections]:
        tensors = []
        for image in images:
            rgb = np.ascontiguousarray(image[:, :, ::-1])
            tensors.append(
                torch.from_numpy(rgb).to(self.device).permute(2, 0, 1).float().div_(255.0)
            )  # [3, H, W]
        outputs = self.model(tensors)
        out = []
        for output, image in zip(outputs, images, strict=True):
            boxes = output["boxes"].detach().to("cpu", torch.float32)  # [K, 4]
            scores = output["scores"].detach().to("cpu", torch.float32).clamp(0.0, 1.0)  # [K]
            labels, keep = apply_label_lookup(self.lookup, output["labels"].detach())
            out.append(Detections(boxes[keep], scores[keep], labels[keep], image.shape[:2], self.name))
        return out

    def __repr__(self) -> str:
        return f"TorchvisionDetector(name={self.name!r}, arch={self.arch!r}, weights={self.weights_source!r})"
