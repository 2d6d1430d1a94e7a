"""Detector adapters: bring Ultralytics, torchvision, ONNX or saved predictions into an ensemble.

A detector is a callable ``detector(images) -> list[Detections]`` with a display ``name`` (see
:class:`Detector`). Adapters, one module each (their heavy imports stay inside them, so importing
``detens.adapters`` imports neither ultralytics, torchvision's models nor onnxruntime):

- :class:`~detens.adapters.ultralytics.UltralyticsDetector` — anything ``ultralytics.YOLO`` loads;
- :class:`~detens.adapters.torchvision.TorchvisionDetector` — torchvision detection builders;
- :class:`~detens.adapters.onnx.OnnxDetector` — ONNX exports run by onnxruntime, decoded by a family
  decoder (:data:`~detens.adapters.onnx_decoders.DECODERS`: YOLOX, NanoDet, Ultralytics);
- :class:`~detens.adapters.precomputed.PrecomputedDetector` — saved COCO results;
- :class:`~detens.adapters.augmented.AugmentedDetector` — test-time views of any detector.

:func:`as_detector` wraps a model already loaded (an ``ultralytics.YOLO``, a torchvision detection
``nn.Module``) in its adapter, which is how :class:`~detens.pipeline.Ensemble` takes such models.

:data:`ADAPTERS` maps the ``type`` of an ensemble YAML entry to a builder; :func:`build_ensemble` turns
a whole config into its members.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detens.adapters._base import BaseDetector, Detector, ImageInput, detect_loaded, type_name
from detens.adapters.weights import WeightsNotFoundError, resolve_weights, weights_dirs
from detens.registry import Registry

if TYPE_CHECKING:
    from detens.adapters.augmented import AugmentedDetector
    from detens.ensemble_config import EnsembleConfig, ModelConfig

__all__ = [
    "ADAPTERS",
    "Detector",
    "BaseDetector",
    "ImageInput",
    "UltralyticsDetector",
    "TorchvisionDetector",
    "OnnxDetector",
    "PrecomputedDetector",
    "AugmentedDetector",
    "View",
    "WeightsNotFoundError",
    "resolve_weights",
    "weights_dirs",
    "detect_loaded",
    "as_detector",
    "build_detector",
    "build_ensemble",
    "member_weights",
    "dataset_categories",
    "label_space_name",
    "check_class_maps",
]

_LAZY = {
    "UltralyticsDetector": "detens.adapters.ultralytics",
    "TorchvisionDetector": "detens.adapters.torchvision",
    "OnnxDetector": "detens.adapters.onnx",
    "PrecomputedDetector": "detens.adapters.precomputed",
    "AugmentedDetector": "detens.adapters.augmented",
    "View": "detens.adapters.augmented",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'detens.adapters' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def as_detector(member: Any, where: str = "detector") -> Detector:
    """An ensemble member as a detector: a loaded model wrapped in its adapter, a detector as it is.

    Args:
        member: an ``ultralytics.YOLO`` (→ :class:`~detens.adapters.ultralytics.UltralyticsDetector`), a
            torchvision detection model (→ :class:`~detens.adapters.torchvision.TorchvisionDetector`), both
            with the adapter's defaults and a name derived from the model; or a detector (a callable
            ``detector(images) -> list[Detections]`` with a ``.name``), returned unchanged. Wrap a model
            yourself to choose its name or options (``UltralyticsDetector(model, name="v8", conf=0.05)``).
        where: what ``member`` is, for messages (``"detectors[2]"``).

    Raises:
        TypeError: anything else.
    """
    # Ultralytics models are nn.Modules and callables too: they are recognized first.
    from detens.adapters.torchvision import is_torchvision_detection_model
    from detens.adapters.ultralytics import is_ultralytics_model

    if is_ultralytics_model(member):
        from detens.adapters.ultralytics import UltralyticsDetector

        return UltralyticsDetector(member)
    if is_torchvision_detection_model(member):
        from detens.adapters.torchvision import TorchvisionDetector

        return TorchvisionDetector(member)
    if not callable(member):
        raise TypeError(
            f"{where} must be a detector (a callable detector(images) -> list[Detections] with a .name), an "
            f"ultralytics.YOLO or a torchvision detection model, got {type_name(member)}"
        )
    return member


#: ``type`` in an ensemble YAML → ``builder(model_config, ensemble_config, categories) -> Detector``.
ADAPTERS: Registry[Callable[..., Detector]] = Registry("adapter type")


def _model_runner_options(
    model: ModelConfig, ensemble: EnsembleConfig, categories: Mapping[int, str] | None
) -> dict[str, Any]:
    """The keyword arguments the detectors that run a network (ultralytics, torchvision, onnx) share."""
    return {
        "conf": ensemble.setting(model, "conf"),
        "max_det": ensemble.setting(model, "max_det"),
        "device": ensemble.setting(model, "device"),
        "name": model.name,
        "categories": categories,
        "class_map": model.class_map,
        "batch": ensemble.setting(model, "batch"),
        "weights_dir": ensemble.weights_dir,
        "config_folder": ensemble.folder,
    }


def _construct(detector: type, model: ModelConfig, *args: Any, **kwargs: Any) -> Detector:
    """``detector(*args, **kwargs, **model.options)``, once the member's ``options`` are checked: each must be
    an argument of ``detector`` that the config does not already set (a model or ensemble setting).
    :func:`build_detector` names the member in the refusals."""
    import inspect

    signature = inspect.signature(detector)
    taken = set(signature.bind_partial(*args, **kwargs).arguments)
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    free = sorted(name for name, p in signature.parameters.items() if p.kind in named and name not in taken)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    for key in model.options:
        if key in taken:
            raise ValueError(
                f"options.{key} is set by the config itself; give {key} as a key of the model (or of the ensemble), "
                "not under options"
            )
        if key not in free and not takes_any:
            raise ValueError(
                f"options.{key} is not an argument of {detector.__name__}; the arguments options may give it: "
                f"{', '.join(free) or 'none'}"
            )
    return detector(*args, **kwargs, **model.options)


@ADAPTERS.register("ultralytics")
def _build_ultralytics(
    model: ModelConfig, ensemble: EnsembleConfig, categories: Mapping[int, str] | None
) -> Detector:
    from detens.adapters.ultralytics import UltralyticsDetector

    return _construct(
        UltralyticsDetector,
        model,
        model.weights,
        iou=ensemble.setting(model, "iou"),
        imgsz=ensemble.setting(model, "imgsz"),
        half=bool(model.half),
        **_model_runner_options(model, ensemble, categories),
    )


@ADAPTERS.register("torchvision")
def _build_torchvision(
    model: ModelConfig, ensemble: EnsembleConfig, categories: Mapping[int, str] | None
) -> Detector:
    from detens.adapters.torchvision import TorchvisionDetector

    return _construct(
        TorchvisionDetector,
        model,
        model.arch,
        weights=model.weights if model.weights is not None else "DEFAULT",
        iou=model.iou,  # None keeps the architecture's own NMS threshold
        imgsz=model.imgsz,  # None keeps the architecture's own input size
        **_model_runner_options(model, ensemble, categories),
    )


@ADAPTERS.register("onnx")
def _build_onnx(
    model: ModelConfig, ensemble: EnsembleConfig, categories: Mapping[int, str] | None
) -> Detector:
    from detens.adapters.onnx import OnnxDetector

    return _construct(
        OnnxDetector,
        model,
        model.weights,
        model.decoder,
        input_size=model.input_size,  # None: the model's own input shape
        letterbox=model.letterbox,  # None (and below): the decoder family's own preprocessing
        pad_value=model.pad_value,
        bgr_to_rgb=model.bgr_to_rgb,
        mean=model.mean,
        std=model.std,
        iou=ensemble.setting(model, "iou"),
        providers=model.providers,
        **_model_runner_options(model, ensemble, categories),
    )


@ADAPTERS.register("precomputed")
def _build_precomputed(
    model: ModelConfig, ensemble: EnsembleConfig, categories: Mapping[int, str] | None
) -> Detector:
    from detens.adapters.precomputed import PrecomputedDetector

    return _construct(
        PrecomputedDetector,
        model,
        model.results,
        model.images,
        default_images=ensemble.dataset,
        name=model.name,
        conf=ensemble.setting(model, "conf"),
        max_det=ensemble.setting(model, "max_det"),
        class_map=model.class_map,  # type: ignore[arg-type]
        categories=categories,
    )


def dataset_categories(config: EnsembleConfig) -> dict[int, str] | None:
    """The label space's ``{category_id: name}`` from ``config.dataset``; None means COCO's 80 classes."""
    if config.dataset is None:
        return None
    from detens.coco import load_coco_gt

    return load_coco_gt(config.dataset).category_names


def label_space_name(config: EnsembleConfig) -> str:
    """Whose category ids a config's members give, for messages."""
    return f"the dataset {config.dataset}" if config.dataset else "COCO (the config names no dataset)"


def check_class_maps(
    config: EnsembleConfig | str | Path | Mapping[str, Any], categories: Mapping[int, str] | None = None
) -> None:
    """Check every member's ``class_map`` against the config's label space before any model loads: each
    category id it gives must be one of ``categories`` (the ``dataset``'s, as :func:`dataset_categories`
    gives them; None: COCO's 80).

    Raises:
        TypeError: a category id that is not an integer.
        ValueError: a category id outside the label space, naming the model, the ``class_map`` key, the id
            and the valid ids.
    """
    from detens.adapters._labels import check_class_map_categories
    from detens.labels import COCO_CATEGORY_IDS

    config = _as_config(config)
    ids = list(categories) if categories is not None else list(COCO_CATEGORY_IDS)
    for model in config.models:
        if model.class_map is not None:
            check_class_map_categories(model.class_map, ids, config.member_label(model), label_space_name(config))


def _warn_of_names_mapped_onto_other_coco_classes(config: EnsembleConfig) -> None:
    """Warn of a ``class_map`` that maps a class name onto a COCO category of another name in a config
    without a ``dataset``, whose label space is then COCO's: most often the dataset was left out, and its
    ids would be written as COCO's classes ("car" onto a dataset's 2 becomes COCO's "bicycle")."""
    import logging

    from detens.adapters._labels import normalize_class_name
    from detens.labels import COCO_ID_TO_NAME

    for model in config.models:
        if not isinstance(model.class_map, Mapping):
            continue
        renamed = [(name, c) for name, c in model.class_map.items()
                   if isinstance(name, str) and isinstance(c, int) and c in COCO_ID_TO_NAME
                   and normalize_class_name(name) != normalize_class_name(COCO_ID_TO_NAME[c])]
        if renamed:
            logging.getLogger("detens.adapters").warning(
                "%s: its class_map maps %s, and the config gives no dataset, so the label space is COCO's and "
                "those are the names written; if the ids are a dataset's own, give its annotation file as "
                "dataset:", model.label,
                ", ".join(f"{name!r} onto {c} ({COCO_ID_TO_NAME[c]!r} in COCO)" for name, c in renamed[:5]),
            )


def _as_config(config: EnsembleConfig | str | Path | Mapping[str, Any]) -> EnsembleConfig:
    from detens.ensemble_config import EnsembleConfig, ensemble_config_from_dict, load_ensemble_config

    if isinstance(config, EnsembleConfig):
        return config
    if isinstance(config, (str, Path)):
        return load_ensemble_config(config)
    if isinstance(config, Mapping):
        return ensemble_config_from_dict(dict(config))
    raise TypeError(f"config must be an EnsembleConfig, a YAML path or a dict, got {type(config).__name__}")


def build_detector(
    model: ModelConfig | Mapping[str, Any],
    ensemble: EnsembleConfig | None = None,
    categories: Mapping[int, str] | None = None,
) -> Detector | AugmentedDetector:
    """Build one YAML ``models`` entry: a detector, or an :class:`AugmentedDetector` when it has ``tta`` views.

    Args:
        model: the entry (a :class:`ModelConfig` or its dict).
        ensemble: supplies the defaults (``conf``, ``imgsz``, ``weights_dir``, ...); None: the defaults of
            :class:`EnsembleConfig`.
        categories: the label space's ``{category_id: name}``; None: COCO.

    Raises:
        TypeError, ValueError: the adapter's refusal of an option (its own type, a subclass such as
            :class:`~detens.adapters.precomputed.UnknownImageError` included), its message led by the member
            (``model 'yolox_nano'``) and the YAML file the ensemble was read from, as a refusal of the file's
            values is.
    """
    from detens.config import from_dict
    from detens.ensemble_config import EnsembleConfig, ModelConfig

    if not isinstance(model, (ModelConfig, Mapping)):
        raise TypeError(f"model must be a ModelConfig or a mapping (a YAML models entry), got {type(model).__name__}")
    if not isinstance(model, ModelConfig):
        model = from_dict(ModelConfig, dict(model), "model")
    if ensemble is None:
        ensemble = EnsembleConfig(models=[model])
    builder = ADAPTERS.get(model.type)
    try:
        detector = builder(model, ensemble, categories)
        if model.tta:
            from detens.adapters.augmented import AugmentedDetector

            return AugmentedDetector(
                detector,
                model.tta,
                merge_iou=ensemble.setting(model, "iou"),
                max_det=ensemble.setting(model, "max_det"),
            )
        return detector
    except (TypeError, ValueError) as err:
        # an adapter names the option it refuses, not which of the ensemble's members has it (some lead with
        # their own name, which the label repeats). The error itself is kept, its type and traceback with it,
        # for the callers that catch it.
        message = str(err).removeprefix(f"{model.shown_as}: ")
        err.args = (f"{ensemble.member_label(model)}: {message}",)
        raise


def build_ensemble(
    config: EnsembleConfig | str | Path | Mapping[str, Any], built: Mapping[int, Detector] | None = None
) -> list[Detector]:
    """All members of an ensemble config, in order (a model with ``tta`` views gives one member per view).

    Args:
        config: an :class:`EnsembleConfig`, a YAML path or a dict.
        built (dict[int, Detector] | None): members built earlier from ``config.models[i]`` (by ``i``),
            used as they are: a caller that already read a model's files does not read them again.

    Raises:
        ValueError: two members with the same name (set ``name`` in the YAML), a ``class_map`` id outside
            the label space (the ``dataset``'s categories, or COCO's 80; see :func:`check_class_maps`).
    """
    config = _as_config(config)
    stray = sorted(set(built or {}) - set(range(len(config.models))))
    if stray:
        raise ValueError(f"built names models {stray}, but the config has models 0..{len(config.models) - 1}")
    categories = dataset_categories(config)
    check_class_maps(config, categories)
    members: list[Detector] = []
    for i, model in enumerate(config.models):
        member = built.get(i) if built else None
        if member is None:
            member = build_detector(model, config, categories)
        members.extend(member.members if hasattr(member, "members") else [member])  # type: ignore[union-attr]
    names = [m.name for m in members]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"ensemble members must have different names, got {duplicates} twice; set 'name' in the config"
        )
    if categories is None:  # once the members are built: a name no model has is refused there, not warned of
        _warn_of_names_mapped_onto_other_coco_classes(config)
    return members


def view_names(base: str, model: ModelConfig) -> list[str]:
    """The member names of one ``models`` entry named ``base`` (as :class:`AugmentedDetector` names its views)."""
    if not model.tta:
        return [base]
    from detens.adapters.augmented import View

    names = []
    for spec in model.tta:
        view = View.parse(spec)
        names.append(base if view.is_identity else f"{base}|{view.name}")
    return names


def declared_member_names(config: EnsembleConfig | str | Path | Mapping[str, Any]) -> list[str] | None:
    """The members' names as :func:`build_ensemble` will name them, without loading any model; None when
    an entry has no ``name`` (its name comes from its weights once loaded)."""
    config = _as_config(config)
    if any(not model.name for model in config.models):
        return None
    return [name for model in config.models for name in view_names(model.name, model)]  # type: ignore[arg-type]


def member_weights(config: EnsembleConfig) -> list[float]:
    """The fusion weight of each member of :func:`build_ensemble` (a model's ``weight`` for each of its views)."""
    config = _as_config(config)
    return [model.weight for model in config.models for _ in (model.tta or [None])]
