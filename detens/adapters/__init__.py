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
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detens.adapters._base import BaseDetector, Detector, ImageInput, detect_loaded, type_name
from detens.adapters.weights import WeightsNotFoundError, resolve_weights, weights_dirs
from detens.registry import Registry

if TYPE_CHECKING:
    # the adapters as type checkers and editors see them; at run time __getattr__ imports each on first use
    from detens.adapters.augmented import AugmentedDetector, View
    from detens.adapters.onnx import OnnxDetector
    from detens.adapters.precomputed import PrecomputedDetector
    from detens.adapters.torchvision import TorchvisionDetector
    from detens.adapters.ultralytics import UltralyticsDetector
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
    "warn_of_class_map_slips",
]

logger = logging.getLogger(__name__)

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


def warn_of_class_map_slips(
    config: EnsembleConfig | str | Path | Mapping[str, Any],
    categories: Mapping[int, str] | None = None,
    class_names: Mapping[int, Mapping[int, str]] | None = None,
) -> None:
    """Warn of the members' ``class_map`` entries that most often are slips, which no check can refuse
    since each id is one of the label space's (:func:`check_class_maps` checks that first):

    - a class mapped onto a category of another name: in COCO's label space (a config without
      ``dataset``) any other name, as a dataset's own ids would be written as COCO's classes ("car"
      onto a dataset's 2 is COCO's "bicycle"); in a dataset's, where renaming is what a class_map is
      for, the name of another class of the model ("person" onto the id the dataset names "dog");
    - a class that members map onto different ids (a class_map copied and edited in one member only):
      their boxes of one class would be fused and scored as different classes;
    - a category of the dataset that no member maps a class onto, when every member has a class_map (a
      member matched to the dataset by name warns of its own).

    Classes are compared by name (case, ``_`` and known aliases ignored): a class_map key that names a
    class is that class; an index key is the class of that index in the model's ``class_names``, and is
    left out where those are not known (a model not loaded yet). A ``precomputed`` member's keys are
    saved category ids, no classes of a model.

    Args:
        config: the ensemble config (an :class:`EnsembleConfig`, a YAML path or a dict).
        categories (Mapping[int, str] | None): the label space (the ``dataset``'s categories, as
            :func:`dataset_categories` gives them); None: COCO's.
        class_names (Mapping[int, Mapping[int, str]] | None): the class names by index of each loaded
            model, by its position in ``config.models``.
    """
    config = _as_config(config)
    mapped = [_mapped_classes(model, (class_names or {}).get(i)) for i, model in enumerate(config.models)]
    _warn_of_classes_mapped_onto_other_names(config, categories, mapped, class_names or {})
    _warn_of_classes_mapped_apart(config, mapped)
    if categories is not None:
        _warn_of_categories_no_class_map_gives(config, categories)


def _mapped_classes(model: ModelConfig, class_names: Mapping[int, str] | None) -> list[tuple[str, int]]:
    """``(class name, category id)`` of each entry of ``model.class_map`` whose class is known by name
    (:func:`warn_of_class_map_slips`)."""
    class_map = model.class_map
    if class_map is None or model.type == "precomputed":
        return []
    items = class_map.items() if isinstance(class_map, Mapping) else enumerate(class_map)
    mapped = []
    for key, category in items:
        if isinstance(key, str) and not key.lstrip("-").isdigit():
            mapped.append((key, int(category)))
        elif class_names is not None and int(key) in class_names:
            mapped.append((str(class_names[int(key)]), int(category)))
    return mapped


def _warn_of_classes_mapped_onto_other_names(
    config: EnsembleConfig,
    categories: Mapping[int, str] | None,
    mapped: list[list[tuple[str, int]]],
    class_names: Mapping[int, Mapping[int, str]],
) -> None:
    """The first point of :func:`warn_of_class_map_slips`, one warning per member."""
    from detens.adapters._labels import normalize_class_name
    from detens.labels import COCO_ID_TO_NAME

    names = COCO_ID_TO_NAME if categories is None else categories
    for i, (model, pairs) in enumerate(zip(config.models, mapped, strict=True)):
        # the model's classes: all of them once it is loaded, before that those its class_map names
        own = {normalize_class_name(n) for n in (class_names[i].values() if i in class_names else dict(pairs))}
        onto = {(normalize_class_name(n), c) for n, c in pairs}
        renamed = []
        for name, category in pairs:
            theirs = normalize_class_name(names[category]) if category in names else None
            if theirs is None or theirs == normalize_class_name(name):
                continue
            # a class of the model that is mapped onto the id named after it too is merged there on purpose
            if categories is None or (theirs in own and (theirs, category) not in onto):
                renamed.append((name, category))
        if not renamed:
            continue
        shown = ", ".join(f"{name!r} onto {c} ({names[c]!r} in {'COCO' if categories is None else 'the dataset'})"
                          for name, c in renamed[:5])
        if categories is None:
            logger.warning(
                "%s: its class_map maps %s, and the config gives no dataset, so the label space is COCO's and "
                "those are the names written; if the ids are a dataset's own, give its annotation file as "
                "dataset:", model.label, shown,
            )
        else:
            logger.warning(
                "%s: its class_map maps %s: the dataset names those ids after other classes of the model, so its "
                "boxes of one class would be written as another; map each class onto the id of its own",
                model.label, shown,
            )


def _warn_of_classes_mapped_apart(config: EnsembleConfig, mapped: list[list[tuple[str, int]]]) -> None:
    """The second point of :func:`warn_of_class_map_slips`, one warning for the ensemble."""
    from detens.adapters._labels import normalize_class_name
    from detens.checks import first_few

    members_of: dict[str, dict[int, list[str]]] = {}  # class -> {category id: the members mapping it there}
    spelled: dict[str, str] = {}
    for model, pairs in zip(config.models, mapped, strict=True):
        for name, category in pairs:
            members = members_of.setdefault(normalize_class_name(name), {}).setdefault(category, [])
            spelled.setdefault(normalize_class_name(name), name)
            if model.shown_as not in members:
                members.append(model.shown_as)
    apart = [(spelled[key], onto) for key, onto in members_of.items() if len(onto) > 1]
    if apart:
        logger.warning(
            "the members' class_maps map a class onto different ids: %s; their boxes of one class would be fused "
            "and scored as different classes: map it onto one id in every member",
            first_few(apart, 5, "; ", show=lambda entry: f"{entry[0]!r} onto " + " and ".join(
                f"{c} ({', '.join(members)})" for c, members in entry[1].items())),
        )


def _warn_of_categories_no_class_map_gives(config: EnsembleConfig, categories: Mapping[int, str]) -> None:
    """The third point of :func:`warn_of_class_map_slips`, in the words of a member matched by name."""
    from detens.checks import first_few

    if any(model.class_map is None for model in config.models):
        return
    given = {
        int(c) for model in config.models
        for c in (model.class_map.values() if isinstance(model.class_map, Mapping) else model.class_map)
    }
    unseen = [name for c, name in categories.items() if int(c) not in given]
    if unseen:
        logger.warning(
            "no member's class_map maps a class onto the categories [%s] of the label space, so no member gives "
            "them a box; if a model has them, map them in its class_map", first_few(unseen, 10, show=repr),
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
        WeightsNotFoundError: its weights are not on disk and not an upstream name, or their download
            failed, its message led in the same way.
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
    except (TypeError, ValueError, WeightsNotFoundError) as err:
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
    class_names: dict[int, Mapping[int, str]] = {}
    for i, model in enumerate(config.models):
        member = built.get(i) if built else None
        if member is None:
            member = build_detector(model, config, categories)
        names = getattr(getattr(member, "detector", member), "model_names", None)  # a view's: its detector's
        if isinstance(names, Mapping):
            class_names[i] = names
        members.extend(member.members if hasattr(member, "members") else [member])  # type: ignore[union-attr]
    names = [m.name for m in members]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"ensemble members must have different names, got {duplicates} twice; set 'name' in the config"
        )
    # once the members are built: a name no model has is refused there, not warned of
    warn_of_class_map_slips(config, categories, class_names)
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
