"""torchvision detection models (Faster R-CNN, RetinaNet, FCOS, SSD, SSDlite, Mask/Keypoint R-CNN boxes).

Preprocessing is what torchvision expects: RGB float ``[3, H, W]`` in ``[0, 1]``; the model's own
``GeneralizedRCNNTransform`` normalizes, resizes and maps the boxes back to the input image. COCO-trained
torchvision models predict COCO category ids (1..90) directly.

Weights: ``"DEFAULT"`` or a weights enum name (``"COCO_V1"``) downloads the pretrained weights through
torchvision when online; a path loads a state dict (``.pth``/``.pt`` from ``model.state_dict()``, a
training checkpoint holding it under ``"model"``/``"state_dict"``, or ``.safetensors``); ``None`` leaves
the model untrained (random initialization, for tests).

A model already built (an ``nn.Module`` of one of torchvision's detection classes, weights loaded by its
owner) is used as it is, not copied: the detector puts it in ``eval()`` mode (and on ``device`` when one is
given). Its score threshold, NMS threshold, maximum detections and input size stay its own: the detector
runs it with the detector's ``conf``, ``iou``, ``max_det`` and ``imgsz`` for the length of each of its calls
and puts the model's back after, so that several detectors of one model each run with their own options and
the model, called directly, behaves as it did.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detens.adapters._base import BaseDetector, check_detection_options, model_lock, type_name
from detens.adapters._labels import (
    apply_label_lookup,
    build_label_lookup,
    check_categories,
    is_background_class,
)
from detens.adapters.weights import resolve_weights, upstream_failure
from detens.checks import check_device, check_integer, did_you_mean, first_few
from detens.detections import Detections

__all__ = [
    "TorchvisionDetector",
    "list_torchvision_detectors",
    "load_state_dict_file",
    "is_torchvision_detection_model",
]

logger = logging.getLogger(__name__)


def list_torchvision_detectors() -> list[str]:
    """Names of torchvision's detection builders (``torchvision.models.list_models(module=detection)``)."""
    import torchvision.models.detection as detection
    from torchvision.models import list_models

    return list_models(module=detection)


def _check_arch(arch: str) -> None:
    valid = list_torchvision_detectors()
    if arch not in valid:
        raise ValueError(
            f"unknown torchvision detection architecture {arch!r}; valid: {', '.join(valid)}.{did_you_mean(arch, valid)}"
        )


def _builder_arguments(arch: str) -> list[str]:
    """The keyword arguments a user may give the builder ``arch``: its own, and those of the model class it
    builds and of that model's ``GeneralizedRCNNTransform``, where its ``**kwargs`` go (the transform takes
    any name and drops those it does not know). Arguments without a default are the builder's to give."""
    import inspect
    import typing

    from torchvision.models import get_model_builder
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    builder = get_model_builder(arch)
    model_class = typing.get_type_hints(builder).get("return")
    # the model class and its bases: a KeypointRCNN or MaskRCNN passes its **kwargs on to FasterRCNN
    functions = [builder, GeneralizedRCNNTransform.__init__] + [
        cls.__init__ for cls in getattr(model_class, "__mro__", ())
        if cls.__module__.startswith("torchvision.models.detection")
    ]
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = {
        p.name for function in functions for p in inspect.signature(function).parameters.values()
        if p.kind in named and p.default is not inspect.Parameter.empty
    }
    return sorted(names - {"weights", "num_classes"})  # the detector's own arguments


def _check_builder_arguments(arch: str, builder_kwargs: Mapping[str, Any], where: str) -> None:
    """Refuse a keyword argument the builder ``arch`` would pass on unread (a misspelled ``min_size``)."""
    valid = _builder_arguments(arch)
    unknown = [key for key in builder_kwargs if key not in valid]
    if not unknown:
        return
    raise TypeError(
        f"{where}: {', '.join(map(repr, unknown))} {'is no argument' if len(unknown) == 1 else 'are no arguments'} "
        f"of torchvision's {arch!r} (its builder, model and transform); valid: {', '.join(valid)}."
        + did_you_mean(unknown[0], valid)
    )


def _weights_categories(model: torch.nn.Module) -> list[str]:
    """The class names (index = label) of torchvision's pretrained weights for a model of ``model``'s class:
    a Keypoint R-CNN's are a background and person, every other detection model's COCO's 91 (one list,
    index = COCO category id)."""
    from torchvision.models.detection import (
        FasterRCNN_ResNet50_FPN_Weights,
        KeypointRCNN,
        KeypointRCNN_ResNet50_FPN_Weights,
    )

    weights = KeypointRCNN_ResNet50_FPN_Weights if isinstance(model, KeypointRCNN) else FasterRCNN_ResNet50_FPN_Weights
    return list(weights.DEFAULT.meta["categories"])


# The base classes of torchvision's detection models: (module under torchvision.models.detection, class).
_DETECTION_CLASSES = (
    ("generalized_rcnn", "GeneralizedRCNN"),  # Faster, Mask and Keypoint R-CNN
    ("retinanet", "RetinaNet"),
    ("fcos", "FCOS"),
    ("ssd", "SSD"),  # SSD and SSDlite
)


def is_torchvision_detection_model(obj: Any) -> bool:
    """Whether ``obj`` is a torchvision detection model, without importing torchvision's models.

    Such a model can only exist once its module is imported, so ``sys.modules`` decides.
    """
    for module_name, class_name in _DETECTION_CLASSES:
        module = sys.modules.get(f"torchvision.models.detection.{module_name}")
        if module is not None and isinstance(obj, getattr(module, class_name)):
            return True
    return False


def _module_num_classes(model: torch.nn.Module) -> int | None:
    """Classes (with background) of a torchvision detection model, read where each family keeps them."""
    predictor = getattr(getattr(model, "roi_heads", None), "box_predictor", None)
    if predictor is not None and hasattr(predictor, "cls_score"):  # R-CNNs
        return int(predictor.cls_score.out_features)
    head = getattr(getattr(model, "head", None), "classification_head", None)
    for attribute in ("num_classes", "num_columns"):  # RetinaNet and FCOS; SSD and SSDlite
        if isinstance(getattr(head, attribute, None), int):
            return int(getattr(head, attribute))
    return None


def _misfit(model: torch.nn.Module, state: dict[str, torch.Tensor], shown: int = 3) -> str:
    """How a state dict differs from a model's, in a line: torch's own message lists every key, which for
    a state dict of another architecture runs to tens of kilobytes."""
    expected = model.state_dict()

    def some(names: list[str]) -> str:
        return first_few(names, shown)

    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    resized = [
        f"{k} {list(state[k].shape)} (the model's: {list(expected[k].shape)})"
        for k in expected
        if k in state and hasattr(state[k], "shape") and state[k].shape != expected[k].shape
    ]
    parts = [f"{what}: {some(names)}" for what, names in (
        ("missing keys", missing), ("unexpected keys", unexpected), ("other shapes", resized)) if names]
    return "; ".join(parts) or "the state dict does not load"


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from ``.safetensors``, or from a torch file (plain, or under ``model``/``state_dict``)."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        # A damaged or foreign file raises pickle's, torch's or safetensors' own error, some without the
        # path (a truncated torch file is "[Errno 22] Invalid argument"): the file is the user's to replace
        detail = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
        raise ValueError(
            f"{str(path)!r} could not be read as a state dict ({type(err).__name__}: {detail}); save weights "
            "with torch.save(model.state_dict(), path) or safetensors' save_file"
        ) from err
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


def _postprocessor(model: torch.nn.Module) -> torch.nn.Module:
    """The module that keeps the score/NMS/max-detection settings and ``postprocess_detections``."""
    holder = getattr(model, "roi_heads", None)
    if holder is not None and hasattr(holder, "score_thresh"):  # Faster/Mask/Keypoint R-CNN
        return holder
    return model  # RetinaNet, FCOS, SSD, SSDlite


@contextlib.contextmanager
def _detector_settings(
    model: torch.nn.Module, conf: float, iou: float | None, imgsz: int | None
) -> Iterator[None]:
    """While it runs, ``model`` has a detector's score threshold ``conf``, NMS threshold ``iou`` and input size
    ``imgsz`` (None: the model's own), set where its architecture keeps them; its own are put back after.

    Several detectors may share one model object (the caller's, which it may still call itself), so none of
    them keeps its settings in the model beyond its own call; the caller holds the
    :func:`~detens.adapters._base.model_lock`.
    """
    holder = _postprocessor(model)
    settings: list[tuple[Any, str, Any]] = [(holder, "score_thresh", conf)]
    if iou is not None:
        settings.append((holder, "nms_thresh", iou))
    if imgsz is not None:
        settings += [(model.transform, "min_size", (imgsz,)), (model.transform, "max_size", imgsz)]
    own = [(obj, attribute, getattr(obj, attribute)) for obj, attribute, _ in settings]
    for obj, attribute, value in settings:
        setattr(obj, attribute, value)
    try:
        yield
    finally:
        for obj, attribute, value in own:
            setattr(obj, attribute, value)


@contextlib.contextmanager
def _label_space_before_max_det(model: torch.nn.Module, lookup: torch.Tensor, max_det: int) -> Iterator[None]:
    """While it runs, ``model`` keeps its best ``max_det`` boxes among the classes that ``lookup`` maps to a
    category; its own cut, after its NMS and before any lookup, would count the other classes' boxes too.

    For that time its ``postprocess_detections`` is asked for every box that its NMS keeps (by decreasing score)
    and returns the first ``max_det`` of mapped classes: mask and keypoint heads run on those boxes only. The
    model is changed for that time, so the caller holds its :func:`~detens.adapters._base.model_lock`.
    """
    holder = _postprocessor(model)
    own = holder.__dict__.get("postprocess_detections")  # an override on the instance, put back after
    postprocess, limit = holder.postprocess_detections, holder.detections_per_img

    def best_mapped(labels: torch.Tensor) -> torch.Tensor:  # [K] model labels -> indices of the kept boxes
        _, mapped = apply_label_lookup(lookup, labels)
        return torch.nonzero(mapped).flatten()[:max_det].to(labels.device)

    def postprocess_mapped(*args: Any, **kwargs: Any) -> Any:
        out = postprocess(*args, **kwargs)
        if isinstance(out, tuple):  # R-CNNs: per image lists of boxes, scores and labels
            keeps = [best_mapped(labels) for labels in out[2]]
            return tuple([x[keep] for x, keep in zip(xs, keeps, strict=True)] for xs in out)
        kept = []  # RetinaNet, FCOS, SSD: per image {"boxes", "scores", "labels"}
        for detections in out:
            keep = best_mapped(detections["labels"])
            kept.append({key: value[keep] for key, value in detections.items()})
        return kept

    holder.detections_per_img, holder.postprocess_detections = sys.maxsize, postprocess_mapped
    try:
        yield
    finally:
        holder.detections_per_img = limit
        if own is None:
            del holder.postprocess_detections
        else:
            holder.postprocess_detections = own


def _check_built_model(model: Any, weights: Any, builder_kwargs: dict[str, Any]) -> torch.nn.Module:
    """A model passed to :class:`TorchvisionDetector` instead of a builder name: checked, returned."""
    if not is_torchvision_detection_model(model):
        if isinstance(model, torch.nn.Module):
            from detens.adapters.ultralytics import is_ultralytics_model

            hint = "; an Ultralytics model goes to UltralyticsDetector" if is_ultralytics_model(model) else ""
            got = f"an nn.Module that is not a torchvision detection model: {type_name(model)}{hint}"
        else:
            got = type_name(model)
        raise TypeError(
            "TorchvisionDetector takes a torchvision detection builder name (str, e.g. "
            "'fasterrcnn_resnet50_fpn_v2') or a built torchvision detection model (Faster/Mask/Keypoint R-CNN, "
            f"RetinaNet, FCOS, SSD, SSDlite), got {got}"
        )
    if weights not in (None, "DEFAULT"):
        raise ValueError(
            f"weights={weights!r} is for a builder name; a built {type(model).__name__} keeps its own weights "
            "(load a state dict into it with model.load_state_dict(...) first)"
        )
    if builder_kwargs:
        raise TypeError(
            f"{sorted(builder_kwargs)} are torchvision builder arguments; a built {type(model).__name__} takes "
            "none (pass them to its builder)"
        )
    return model


class TorchvisionDetector(BaseDetector):
    """A torchvision detection model as a detens detector.

    Args:
        arch (str | nn.Module): a torchvision detection builder (``"fasterrcnn_resnet50_fpn_v2"``,
            ``"retinanet_resnet50_fpn"``, ``"fcos_resnet50_fpn"``, ``"ssdlite320_mobilenet_v3_large"``, ...; see
            :func:`list_torchvision_detectors`), or a model already built (Faster/Mask/Keypoint R-CNN,
            RetinaNet, FCOS, SSD, SSDlite; e.g. ``fasterrcnn_mobilenet_v3_large_320_fpn(weights=...)``).
        weights (str | Path | None): for a builder name: ``"DEFAULT"`` (or a weights enum name) for
            torchvision's pretrained weights (downloaded when online), a state-dict file (path, or a name
            relative to the weights folder), or None for an untrained model. A built model keeps its own
            weights: leave ``weights`` as it is (or None).
        conf (float): minimum score kept (the model's score threshold during the detector's calls).
        iou (float | None): the model's NMS IoU threshold during the detector's calls; None keeps the model's
            own (the architecture's default for a builder name).
        imgsz (int | None): resize so that the longer side is ``imgsz`` (R-CNN, RetinaNet, FCOS); None keeps the
            model's own (the architecture's default for a builder name: 800-1333 for R-CNNs). SSD models always
            use their fixed size.
        max_det (int): maximum boxes per image.
        device (str | None): ``"cpu"``, ``"cuda"``, ...; None: CUDA when available (a built model: the device
            it is on).
        name (str | None): display name; default ``arch`` (a built model: its class name, ``"FasterRCNN"``).
        categories (dict[int, str] | None): the dataset's ``{category_id: name}`` (or its COCO ``categories``
            list, or its whole COCO annotation dict); the model's COCO classes are mapped onto it by name.
            Default: labels are COCO category ids as predicted.
        class_map (dict | None): explicit ``{model label or class name: category_id}``; unlisted labels are
            dropped. A model of its own ``num_classes`` without one takes its labels 1 .. num_classes - 1 as
            the category ids of ``categories``, which it then needs (torchvision's convention: a COCO model
            predicts COCO's category ids).
        num_classes (int | None): classes of a custom-trained model (with background); default 91 (COCO; a
            Keypoint R-CNN's 2, background and person), or what a built model's classification layer has.
        batch (int): images per forward pass.
        weights_dir (str | Path | None): the default weights folder when ``$DETENS_WEIGHTS`` is unset.
        config_folder (str | Path | None): the folder of the ensemble YAML that names ``weights``: a relative
            path is looked for there instead of in the working directory (see
            :func:`~detens.adapters.weights.resolve_weights`'s ``beside``). None: a call from Python.
        **builder_kwargs: passed to the torchvision builder (``min_size``, ``trainable_backbone_layers``, ...);
            a name that neither the builder, its model class nor the model's transform takes is a ``TypeError``
            listing those they take.
    """

    def __init__(
        self,
        arch: str | torch.nn.Module,
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
        config_folder: str | Path | None = None,
        **builder_kwargs: Any,
    ) -> None:
        conf, iou, max_det = check_detection_options(conf, iou, max_det)
        categories = check_categories(categories)
        imgsz = None if imgsz is None else check_integer(imgsz, "imgsz", 32)
        num_classes = None if num_classes is None else check_integer(num_classes, "num_classes", 1)
        self.weights_source: str | None = None
        if isinstance(arch, str):
            _check_arch(arch)
            super().__init__(name if name is not None else arch, batch, categories)
            _check_builder_arguments(arch, builder_kwargs, self.name)
            self.arch = arch
            self.device = torch.device(
                check_device(device, f"{self.name}: device")
                if device is not None
                else ("cuda" if torch.cuda.is_available() else "cpu")
            )
            model = self._build(weights, num_classes, weights_dir, config_folder, builder_kwargs)
            from torchvision.models import get_model_weights

            class_names = list(get_model_weights(arch).DEFAULT.meta["categories"])  # index = category id
        else:
            model = _check_built_model(arch, weights, builder_kwargs)
            self.arch = type(model).__name__
            super().__init__(name if name is not None else self.arch, batch, categories)
            parameter = next(model.parameters(), None)
            self.device = torch.device(
                check_device(device, f"{self.name}: device")
                if device is not None
                else (parameter.device if parameter is not None else "cpu")
            )
            if num_classes is None:
                num_classes = _module_num_classes(model)
            class_names = _weights_categories(model)
        self.model = model.eval().to(self.device)
        # images go in as the model's own floating dtype (a half model on a GPU takes float16 images)
        self.input_dtype = next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)
        if self.input_dtype in (torch.float16, torch.bfloat16) and self.device.type == "cpu":
            raise ValueError(
                f"{self.name}: the model is in {str(self.input_dtype).removeprefix('torch.')}, which torchvision's "
                "detection ops (NMS, RoI pooling) do not run on the CPU: give device='cuda' for a GPU, or the model "
                "in float32 (model.float())"
            )
        # the model runs with these for the length of each call only: it may be shared, and it may be the caller's
        self.conf, self.iou, self.max_det = conf, iou, max_det
        fixed_size = getattr(self.model.transform, "fixed_size", None)
        if imgsz is not None and fixed_size:
            logger.warning(
                "%s: %s has a fixed input size %s; imgsz=%d is ignored", self.name, self.arch, fixed_size, imgsz
            )
            imgsz = None
        self.imgsz = imgsz
        custom = num_classes not in (None, len(class_names))
        model_names = class_names if not custom else [str(i) for i in range(num_classes)]
        self.model_names: dict[int, str] = dict(enumerate(model_names))
        if custom and class_map is None:
            class_map = self._labels_as_category_ids(num_classes, categories)
        self.lookup = build_label_lookup(
            model_names, default="identity", categories=categories, class_map=class_map, where=self.name
        )
        if categories is None and class_map is None:
            # the weights' classes that stand for no object are dropped from the label space
            self.lookup[[i for i, n in enumerate(model_names) if is_background_class(n)]] = -1

    def _labels_as_category_ids(self, num_classes: int, categories: Mapping[int, str] | None) -> dict[int, int]:
        """The class map of a model trained on its own classes and given no ``class_map``: its labels
        1 .. num_classes - 1 (0 is the background) as the category ids of ``categories``, torchvision's
        convention (its COCO models predict COCO's category ids).

        Raises:
            ValueError: no ``categories`` (the labels would be taken for COCO's classes), or ``categories``
                without one of the labels.
        """
        from detens.adapters._labels import id_ranges

        if categories is None:
            raise ValueError(
                f"{self.name}: the model has {num_classes} classes (background included), not the 91 of torchvision's "
                "COCO models, so its labels are no COCO category ids: give categories={category id: name} of the "
                "dataset it was trained on (in an ensemble YAML, its dataset:; its labels are taken as those ids), "
                "or a class_map={model label: category id}"
            )
        missing = [label for label in range(1, num_classes) if label not in categories]
        if missing:
            raise ValueError(
                f"{self.name}: the model's labels 1-{num_classes - 1} are taken as category ids of categories=, "
                f"which lacks {id_ranges(missing)}: give a class_map={{model label: category id}} where its labels "
                "are not its dataset's category ids"
            )
        return {label: label for label in range(1, num_classes)}

    def _build(
        self,
        weights: str | os.PathLike[str] | None,
        num_classes: int | None,
        weights_dir: str | Path | None,
        config_folder: str | Path | None,
        builder_kwargs: dict[str, Any],
    ) -> torch.nn.Module:
        """The model of the builder ``self.arch`` with ``weights``; sets ``weights_source``."""
        from torchvision.models import get_model, get_model_weights

        arch = self.arch
        weights_enum = get_model_weights(arch)
        kwargs = dict(builder_kwargs)
        if num_classes is not None:
            kwargs["num_classes"] = num_classes
        # without the model's weights no backbone is downloaded either, unless the caller's
        # weights_backbone asks for one
        unweighted = {"weights_backbone": None, **kwargs}
        if weights is None:
            logger.warning("%s: no weights given, the model is UNTRAINED (random initialization)", self.name)
            return get_model(arch, weights=None, **unweighted)
        resolved = resolve_weights(weights, "torchvision", weights_dir, config_folder)
        self.weights_source = resolved.value
        if resolved.local:
            model = get_model(arch, weights=None, **unweighted)
            state = load_state_dict_file(resolved.value)
            try:
                model.load_state_dict(state)
            except RuntimeError as err:
                raise ValueError(
                    f"{resolved.value!r} does not fit torchvision {arch!r}"
                    f"{f' with num_classes={num_classes}' if num_classes else ''}: {_misfit(model, state)}"
                ) from err
            return model
        try:
            return get_model(arch, weights=resolved.value, **kwargs)
        except (ValueError, KeyError) as err:  # unknown enum name
            raise ValueError(
                f"{resolved.value!r} is not a torchvision weights name for {arch!r} "
                f"(valid: DEFAULT, {', '.join(w.name for w in weights_enum)}) nor an existing file. "
                f"Looked at: {'; '.join(resolved.tried)}"
            ) from err
        except OSError as err:  # urllib.error.URLError and friends: offline
            raise upstream_failure(resolved, err, what=f"torchvision {arch}") from err

    @torch.inference_mode()
    def _predict(self, images: list[np.ndarray]) -> list[Detections]:
        tensors = []
        for image in images:
            rgb = np.ascontiguousarray(image[:, :, ::-1])
            tensors.append(
                torch.from_numpy(rgb).to(self.device).permute(2, 0, 1).float().div_(255.0).to(self.input_dtype)
            )  # [3, H, W]
        # the model runs with its settings and post-processing swapped for this detector's: one call of it at a time
        with model_lock(self.model), _detector_settings(self.model, self.conf, self.iou, self.imgsz):
            with _label_space_before_max_det(self.model, self.lookup, self.max_det):
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
