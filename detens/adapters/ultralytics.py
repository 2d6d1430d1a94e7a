"""Ultralytics detectors: anything ``ultralytics.YOLO(path, task="detect")`` loads.

``.pt`` checkpoints, ONNX files, OpenVINO folders, TFLite files, ... including NMS-free end-to-end heads
(YOLO26, YOLOv10) and exports with NMS in the graph: Ultralytics reads the export's metadata (image size,
class names, ``end2end``, ``nms``) and post-processes accordingly. Fixed-size exports always run at their
own image size, whatever ``imgsz`` says (a warning names the member when they differ).

Offline use: weights found on disk never touch the network. ``YOLO_AUTOINSTALL`` defaults to ``false`` in
this process when detens imports Ultralytics (the runtimes Ultralytics would pip-install at run time,
``ai-edge-litert`` and ``openvino``, are detens dependencies); set the variable yourself to override.
Upstream names (``yolo11n.pt``) are passed to Ultralytics, which downloads them when online.

A model already loaded (an ``ultralytics.YOLO``) is used as it is, not copied: the detector calls its
``predict`` with the detector's own arguments.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detens.adapters._base import (
    BaseDetector,
    check_detection_options,
    model_lock,
    require_nms_iou,
    type_name,
)
from detens.adapters._labels import apply_label_lookup, build_label_lookup, check_categories
from detens.adapters._signal_stack import install_lasting_signal_stack, is_openvino_export
from detens.adapters.weights import ResolvedWeights, import_ultralytics, resolve_weights, upstream_failure
from detens.checks import check_device, check_integer
from detens.detections import Detections

__all__ = ["UltralyticsDetector", "load_yolo", "is_ultralytics_model"]

logger = logging.getLogger(__name__)

_EXPORT_SUFFIXES = (
    "_openvino_model",
    "_saved_model",
    "_ncnn_model",
    "_paddle_model",
    "_mnn_model",
    "_web_model",
)


def _display_name(weights: str) -> str:
    path = Path(weights.rstrip("/\\"))
    name = path.name if path.suffix == "" else path.stem
    for suffix in _EXPORT_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name or "ultralytics"


# Tasks whose Results carry axis-aligned ``boxes`` (classify has none, obb has rotated ones).
_BOX_TASKS = ("detect", "segment", "pose")


def is_ultralytics_model(obj: Any) -> bool:
    """Whether ``obj`` is a loaded Ultralytics model (``YOLO``, ``RTDETR``, ...), without importing ultralytics.

    An Ultralytics model can only exist once its module is imported, so ``sys.modules`` decides.
    """
    module = sys.modules.get("ultralytics.engine.model")
    return module is not None and isinstance(obj, module.Model)


def _loaded_model(model: Any) -> tuple[Any, ResolvedWeights]:
    """Check a loaded Ultralytics model; returns it and where its weights came from (for its name)."""
    if not is_ultralytics_model(model):
        from detens.adapters.torchvision import is_torchvision_detection_model

        hint = (
            "; a torchvision detection model goes to TorchvisionDetector"
            if is_torchvision_detection_model(model)
            else ""
        )
        raise TypeError(
            "UltralyticsDetector takes weights as a path (str or os.PathLike) or a loaded ultralytics.YOLO "
            f"model, got {type_name(model)}{hint}"
        )
    if model.task not in _BOX_TASKS:
        raise ValueError(
            f"UltralyticsDetector needs a model whose results have boxes (task {' / '.join(_BOX_TASKS)}), "
            f"got a {model.task!r} model; load a detection model with YOLO(path, task='detect')"
        )
    source = str(model.ckpt_path or model.model_name or "ultralytics")
    return model, ResolvedWeights(source, local=Path(source).exists())


def check_ultralytics_device(device: str, name: str = "device") -> None:
    """Refuse, before a model is loaded, a ``device`` this machine lacks: a torch device string (``cpu``,
    ``cuda:1``) or Ultralytics' own CUDA indices (``"0"``, ``"0,1"``), which are passed on as written.

    Raises:
        ValueError: no such device here (Ultralytics would say so only at the first prediction).
    """
    indices = str(device).split(",")
    if all(index.strip().isdigit() for index in indices):
        for index in indices:
            check_device(f"cuda:{int(index)}", f"{name} {device!r}, a CUDA index,")
    else:
        check_device(device, name)


def load_yolo(resolved: ResolvedWeights) -> Any:
    """``ultralytics.YOLO(resolved.value, task="detect")``; download failures become WeightsNotFoundError, a
    local file Ultralytics cannot read a ValueError naming it."""
    yolo = import_ultralytics("ultralytics").YOLO
    try:
        return yolo(resolved.value, task="detect")
    except (ConnectionError, OSError) as err:
        if not resolved.local:
            raise upstream_failure(resolved, err) from err
        raise
    except Exception as err:
        if resolved.local:
            raise unreadable_weights(resolved, err) from err
        raise


def unreadable_weights(resolved: ResolvedWeights, err: Exception) -> ValueError:
    """A local file that Ultralytics cannot read (truncated, not a checkpoint, a damaged export) is the
    user's to replace: a ValueError naming it, as the ONNX adapter's, so the CLI reports one line."""
    detail = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return ValueError(f"ultralytics could not load {resolved.value!r}: {type(err).__name__}: {detail}")


class UltralyticsDetector(BaseDetector):
    """An Ultralytics YOLO model as a detens detector.

    Args:
        weights (str | Path | YOLO): a ``.pt``/``.onnx``/``.tflite`` file or an export folder (OpenVINO, ...), a
            name relative to the weights folder (``$DETENS_WEIGHTS``, see :mod:`detens.adapters.weights`), an
            upstream name (``"yolo11n.pt"``) that Ultralytics downloads when online, or a model already loaded
            (``ultralytics.YOLO(...)``, a ``detect``, ``segment`` or ``pose`` model).
        conf (float): minimum score kept.
        iou (float): NMS IoU threshold (unused by NMS-free heads and exports with NMS in the graph).
        imgsz (int): inference size (the longer side, letterboxed); fixed-size exports use their own (with a warning).
        max_det (int): maximum boxes per image.
        device (str | None): ``"cpu"``, ``"cuda:0"``, ...; None lets Ultralytics choose.
        name (str | None): display name; default from the weights file (``"yolov8n_int8"``; for a loaded
            model, from the file it was loaded from).
        categories (dict[int, str] | None): the dataset's ``{category_id: name}`` (or its COCO ``categories``
            list, or its whole COCO annotation dict); model classes are mapped onto it by name. Default: the
            model's 80 classes in COCO order → COCO category ids.
        class_map (dict | None): explicit ``{class index or name: category_id}``; unlisted classes are dropped.
        batch (int): images per ``predict`` call.
        half (bool): FP16 inference (GPU ``.pt`` models).
        agnostic_nms (bool): class-agnostic NMS.
        weights_dir (str | Path | None): the default weights folder when ``$DETENS_WEIGHTS`` is unset.
        config_folder (str | Path | None): the folder of the ensemble YAML that names ``weights``: a relative
            path is looked for there instead of in the working directory (see
            :func:`~detens.adapters.weights.resolve_weights`'s ``beside``). None: a call from Python.

    Calling it returns one :class:`Detections` per image (CPU tensors, labels in the label space).
    """

    def __init__(
        self,
        weights: str | os.PathLike[str] | Any,
        conf: float = 0.001,
        iou: float = 0.7,
        imgsz: int = 640,
        max_det: int = 300,
        device: str | None = None,
        *,
        name: str | None = None,
        categories: Mapping[int, str] | None = None,
        class_map: Mapping[int | str, int] | None = None,
        batch: int = 1,
        half: bool = False,
        agnostic_nms: bool = False,
        weights_dir: str | Path | None = None,
        config_folder: str | Path | None = None,
    ) -> None:
        conf, iou, max_det = check_detection_options(conf, iou, max_det)
        iou = require_nms_iou(iou, "Ultralytics' NMS")
        categories = check_categories(categories)
        imgsz = check_integer(imgsz, "imgsz", 32)
        if isinstance(weights, (str, os.PathLike)):
            self.resolved = resolve_weights(weights, "ultralytics", weights_dir, config_folder)
            model = None
        else:
            model, self.resolved = _loaded_model(weights)
        super().__init__(name if name is not None else _display_name(self.resolved.value), batch, categories)
        if device is not None:
            check_ultralytics_device(device, f"{self.name}: device")
        # OpenVINO compiles the model at the first prediction, in the calling thread (see _signal_stack)
        self.openvino = self.resolved.local and is_openvino_export(self.resolved.value)
        if self.openvino:
            install_lasting_signal_stack()
        self.model = model if model is not None else load_yolo(self.resolved)
        if self.resolved.value.endswith((".yaml", ".yml")):
            logger.warning("%s: built from %s, the model is UNTRAINED", self.name, self.resolved.value)
        self.predict_args: dict[str, Any] = {
            "conf": float(conf),
            "iou": float(iou),
            "imgsz": imgsz,
            "max_det": max_det,
            "classes": None,  # all; said each time, for a loaded model that another detector also calls
            "agnostic_nms": agnostic_nms,
            "verbose": False,
            "save": False,
        }
        if half:
            self.predict_args["half"] = True
        if device is not None:
            self.predict_args["device"] = device
        self.model_names: dict[int, str] = self._class_names()
        self._report_fixed_size(imgsz)
        self.lookup = build_label_lookup(
            self.model_names, default="coco80", categories=categories, class_map=class_map, where=self.name
        )
        self.max_det = max_det
        kept = torch.nonzero(self.lookup >= 0).flatten().tolist()
        if len(kept) < len(self.lookup):
            # Ultralytics drops the other classes before its NMS and its max_det cut, so that they take no place
            # among the max_det boxes; older releases cut an end-to-end model's rows (300) to max_det first, so
            # it is asked for 300 at least and the cut is ours (_predict), after the lookup
            self.predict_args["classes"] = kept
            self.predict_args["max_det"] = max(max_det, 300)
        logger.debug(
            "%s: %s (%d classes), %s",
            self.name,
            self.resolved.value,
            len(self.model_names),
            self.predict_args,
        )

    def _class_names(self) -> dict[int, str]:
        inner = getattr(self.model, "model", None)
        if isinstance(inner, torch.nn.Module) and hasattr(inner, "names"):  # .pt / YAML: already loaded
            return dict(self.model.names)
        # Exports: ``YOLO.names`` would load the file a second time in a throwaway predictor; a first
        # (warm-up) prediction sets up the real predictor once, with our arguments, and gives the names.
        # It is also where an export is first read, so a damaged one fails here.
        try:
            self._run_model([np.zeros((64, 64, 3), dtype=np.uint8)])
        except Exception as err:
            predictor = getattr(self.model, "predictor", None)
            if self.resolved.local and getattr(predictor, "model", None) is None:  # the file was never read
                raise unreadable_weights(self.resolved, err) from err
            raise
        return dict(self.model.predictor.model.names)

    def _report_fixed_size(self, imgsz: int) -> None:
        """Warn when an export of a fixed input size (set up by the warm-up prediction) will not run at
        ``imgsz``: Ultralytics replaces the argument with the export's size without a word."""
        used = getattr(getattr(getattr(self.model, "predictor", None), "args", None), "imgsz", None)
        if used is None:  # .pt / YAML models: no predictor yet, and they run at any size
            return
        height, width = (used, used) if isinstance(used, int) else used
        if max(height, width) != imgsz:
            logger.warning(
                "%s: a fixed-size export, it runs at %dx%d (height x width); imgsz %d is not used",
                self.name, height, width, imgsz,
            )

    def _run_model(self, images: list[np.ndarray]) -> list[Any]:
        """The model's ``Results`` of ``images``, one call at a time per model (:func:`model_lock`): ``predict``
        makes the model's predictor on its first call and hands it each call's options while another call may be
        running, so calls from several threads could meet a predictor not set up yet, or run with the options
        of another detector that shares the loaded model. Ultralytics runs one prediction of a predictor at a
        time in any case."""
        with model_lock(self.model):
            return self.model.predict(images, **self.predict_args)

    def _predict(self, images: list[np.ndarray]) -> list[Detections]:
        if self.openvino:  # another thread than the one that loaded the model may run it
            install_lasting_signal_stack()
        results = self._run_model(images)
        out = []
        for result, image in zip(results, images, strict=True):
            boxes = result.boxes
            xyxy = boxes.xyxy.detach().to("cpu", torch.float32)  # [K, 4]
            scores = boxes.conf.detach().to("cpu", torch.float32).clamp(0.0, 1.0)  # [K]
            labels, keep = apply_label_lookup(self.lookup, boxes.cls.detach())
            keep = torch.nonzero(keep).flatten()[: self.max_det]  # by decreasing score, as Ultralytics gives them
            out.append(Detections(xyxy[keep], scores[keep], labels[keep], image.shape[:2], self.name))
        return out

    def __repr__(self) -> str:
        return f"UltralyticsDetector(name={self.name!r}, weights={self.resolved.value!r})"
