"""Ensemble YAML configs (``configs/ensembles/*.yaml``) mirrored by dataclasses.

Unknown keys are rejected with the nearest valid key suggested (:mod:`detens.config`). Top-level
``conf``, ``iou``, ``imgsz``, ``max_det``, ``device`` and ``batch`` are defaults for every model; a model's
own value wins. See ``configs/ensembles/coco_yolo3.yaml`` for every key with its meaning.
"""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

from detens.checks import check_integer, check_real
from detens.config import from_dict, read_yaml_file, save_yaml_config
from detens.io import home_expanded
from detens.packaged import find_packaged

logger = logging.getLogger(__name__)

__all__ = [
    "ModelConfig",
    "FusionConfig",
    "OutputConfig",
    "EnsembleConfig",
    "load_ensemble_config",
    "ensemble_config_from_dict",
    "save_ensemble_config",
    "apply_overrides",
    "with_absolute_paths",
    "with_real_paths",
    "check_member_name",
    "NOT_READ_BY_TYPE",
    "HEAD_PARAMS",
    "ENSEMBLE_PATH_KEYS",
    "MODEL_PATH_KEYS",
]

# keys each adapter type uses besides the common ones
_TYPE_KEYS = {
    "ultralytics": {"weights", "half"},
    "torchvision": {"weights", "arch"},
    "precomputed": {"results", "images"},
    "onnx": {
        "weights",
        "decoder",
        "input_size",
        "letterbox",
        "pad_value",
        "bgr_to_rgb",
        "mean",
        "std",
        "providers",
    },
}
_ONNX_KEYS = ("decoder", "input_size", "letterbox", "pad_value", "bgr_to_rgb", "mean", "std", "providers")
_TYPE_ONLY_KEYS = {"weights", "arch", "results", "images", "half", *_ONNX_KEYS}


def _check_number_kinds(config: Any, label: str, reals: tuple[str, ...], integers: tuple[str, ...]) -> None:
    """Each of ``config``'s fields ``reals`` a number and ``integers`` an integer (or None), as Python
    numbers (NumPy ones converted), before their ranges are checked: a config made in Python is not
    type-checked as a YAML file is, and a string would fail in a comparison that names nothing."""
    prefix = f"{label}: " if label else ""
    for keys, check in ((reals, check_real), (integers, check_integer)):
        for key in keys:
            value = getattr(config, key)
            if value is not None:
                setattr(config, key, check(value, f"{prefix}{key}"))


def check_member_name(name: str, where: str = "member name") -> str:
    """``name`` if it can be the stem of the member's files (``detens fuse``'s ``per_model/<name>.json``,
    ``detens cache``'s ``<name>.json`` and ``partial/<name>/``) without reaching another folder or being
    hidden. TTA names such as ``yolo11n|hflip`` or ``yolo26n|scale=0.83`` are fine.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``name`` is empty, contains ``/``, ``\\``, ``,`` (which separates the names given to
            ``--models``) or a control character (NUL included), or starts with ``.`` (``..``, a hidden file).
    """
    if not isinstance(name, str):
        raise TypeError(f"{where} must be a string, got {type(name).__name__}: {name!r}")
    unsafe = not name or name.startswith(".") or any(c in "/\\," or ord(c) < 32 or ord(c) == 127 for c in name)
    if unsafe:
        raise ValueError(
            f"{where} {name!r} cannot name the member's files or be chosen by --models: it must be non-empty, "
            "without '/', '\\', ',' or control characters, and not start with '.'"
        )
    return name


@dataclass
class ModelConfig:
    """One ensemble member (with ``tta``: one member per view)."""

    type: str = "ultralytics"
    weights: str | None = None
    name: str | None = None
    arch: str | None = None
    results: str | None = None
    images: str | None = None
    conf: float | None = None
    iou: float | None = None
    imgsz: int | None = None
    max_det: int | None = None
    device: str | None = None
    batch: int | None = None
    half: bool | None = None
    tta: list[str] = field(default_factory=list)
    weight: float = 1.0
    class_map: dict[int | str, int] | list[int] | None = None
    decoder: str | None = None
    input_size: list[int] | None = None
    letterbox: Literal["top_left", "center"] | None = None
    pad_value: float | None = None
    bgr_to_rgb: bool | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    providers: list[str] | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def shown_as(self) -> str:
        """What names the model in messages: its name, else its weights, results, architecture or type."""
        return self.name or self.weights or self.results or self.arch or self.type

    @property
    def label(self) -> str:
        """The model for messages: ``model 'yolov8n'`` (:attr:`shown_as`)."""
        return f"model {self.shown_as!r}"

    def __post_init__(self) -> None:
        from detens.adapters import ADAPTERS

        ADAPTERS.get(self.type)  # unknown type: error listing the valid ones
        label = self.label
        if self.name is not None:
            check_member_name(self.name, "model name")
        used = _TYPE_KEYS.get(self.type)
        if used is not None:
            for key in sorted(_TYPE_ONLY_KEYS - used):
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"{label}: {key!r} is not used by type {self.type!r} (it uses {', '.join(sorted(used))})"
                    )
        if self.type == "ultralytics" and not self.weights:
            raise ValueError(
                f"{label}: type 'ultralytics' needs 'weights' (a path, a name in the weights folder, or yolo11n.pt)"
            )
        if self.type == "torchvision" and not self.arch:
            raise ValueError(f"{label}: type 'torchvision' needs 'arch' (e.g. fasterrcnn_resnet50_fpn_v2)")
        if self.type == "onnx":
            from detens.adapters.onnx_decoders import DECODERS

            if not self.weights or not self.decoder:
                raise ValueError(
                    f"{label}: type 'onnx' needs 'weights' (an .onnx file) and 'decoder' "
                    f"(one of {', '.join(DECODERS.names())})"
                )
            DECODERS.get(self.decoder)  # unknown decoder: error listing the valid ones
            if self.imgsz is not None:
                raise ValueError(
                    f"{label}: type 'onnx' runs at its 'input_size' [height, width]; remove 'imgsz'"
                )
            if self.input_size is not None and (len(self.input_size) != 2 or min(self.input_size) < 1):
                raise ValueError(f"{label}: input_size must be [height, width], got {self.input_size}")
            for key in ("mean", "std"):
                value = getattr(self, key)
                if value is not None and len(value) != 3:
                    raise ValueError(f"{label}: {key} must have 3 values (one per channel), got {value}")
        if self.type == "precomputed":
            if not self.results:
                raise ValueError(f"{label}: type 'precomputed' needs 'results' (a COCO results JSON file)")
            if self.tta:
                raise ValueError(f"{label}: saved predictions cannot be augmented; remove 'tta'")
            if isinstance(self.class_map, list):
                raise ValueError(
                    f"{label}: type 'precomputed' needs class_map as {{saved category_id: category_id}}"
                )
            if self.class_map:  # at load: the label-space check would come first and blame a name key's id
                from detens.adapters._labels import check_category_id_map

                check_category_id_map(self.class_map, label)
        if self.class_map is not None and not self.class_map:
            # a map drops the classes it does not list: an empty one would drop every box of the member
            raise ValueError(f"{label}: class_map is empty, so every box would be dropped; leave class_map out")
        if isinstance(self.class_map, dict):
            # 1 and '1' (a JSON-style key) are the same class: one of the two ids would be silently lost
            seen: dict[int, int | str] = {}
            for key in self.class_map:
                if isinstance(key, int) or key.lstrip("-").isdigit():
                    if int(key) < 0:  # what the YAML alone shows wrong is refused before the model loads
                        raise ValueError(
                            f"{label}: class_map key {key!r} is a negative class index; a model's classes are "
                            "numbered from 0"
                        )
                    if int(key) in seen:
                        raise ValueError(
                            f"{label}: class_map gives class {int(key)} twice, as {seen[int(key)]!r} and {key!r}"
                        )
                    seen[int(key)] = key
        self.weight = check_real(self.weight, f"{label}: weight")
        _check_number_kinds(self, label, reals=("conf", "iou"), integers=("imgsz", "max_det", "batch"))
        if self.conf is not None and not 0.0 <= self.conf <= 1.0:
            raise ValueError(f"{label}: conf must be in [0, 1], got {self.conf}")
        if self.iou is not None and not 0.0 < self.iou <= 1.0:
            raise ValueError(f"{label}: iou must be in (0, 1], got {self.iou}")
        if self.weight < 0:
            raise ValueError(f"{label}: weight must be >= 0, got {self.weight}")
        # a member's own value replaces the ensemble's, so it is held to the same bounds
        for key, low in (("imgsz", 32), ("max_det", 1), ("batch", 1)):
            value = getattr(self, key)
            if value is not None and value < low:
                raise ValueError(f"{label}: {key} must be >= {low}, got {value}")
        if self.tta:
            from detens.adapters.augmented import parse_views

            parse_views(self.tta)


@dataclass
class FusionConfig:
    method: str = "wbf"
    params: dict[str, Any] = field(default_factory=dict)
    head: str | None = None

    def __post_init__(self) -> None:
        if self.head is not None and not self.head.strip():
            raise ValueError(
                f"fusion.head must be a head file or a shipped head's name, got {self.head!r}; leave it out for none"
            )


@dataclass
class OutputConfig:
    vis: bool = True
    labels: bool = True
    vis_conf: float = 0.25
    labels_conf: float = 0.25
    save_per_model: bool = False

    def __post_init__(self) -> None:
        for key in ("vis_conf", "labels_conf"):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"output.{key} must be in [0, 1], got {value}")


@dataclass
class EnsembleConfig:
    name: str = "ensemble"
    weights_dir: str | None = None
    dataset: str | None = None
    conf: float = 0.001
    iou: float = 0.7
    imgsz: int = 640
    max_det: int = 300
    device: str | None = None
    batch: int = 1
    models: list[ModelConfig] = field(default_factory=list)
    fusion: FusionConfig = field(default_factory=FusionConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    #: the folder of the YAML the config was read from, where its relative paths lie; None for a config
    #: built in Python. Not a setting: no YAML key, and not written with the config.
    folder: ClassVar[Path | None] = None
    #: the YAML file the config was read from, named in messages about its members; None for a config
    #: built in Python. Not a setting either.
    source: ClassVar[Path | None] = None

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("an ensemble config needs at least one entry under 'models'")
        # an empty path is the working directory (or the YAML's folder), not "none", which null says
        for key, what in (("weights_dir", "a folder"), ("dataset", "a COCO annotation file")):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise ValueError(f"{key} must be {what}, got {value!r}; leave it out (null) for none")
        _check_number_kinds(self, "", reals=("conf", "iou"), integers=("imgsz", "max_det", "batch"))
        if not 0.0 <= self.conf <= 1.0:
            raise ValueError(f"conf must be in [0, 1], got {self.conf}")
        if not 0.0 < self.iou <= 1.0:
            raise ValueError(f"iou must be in (0, 1], got {self.iou}")
        for key, low in (("imgsz", 32), ("max_det", 1), ("batch", 1)):
            value = getattr(self, key)
            if value < low:
                raise ValueError(f"{key} must be >= {low}, got {value}")
        names = [m.name for m in self.models if m.name]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model names must be unique, got {duplicates} more than once")

    def member_label(self, model: ModelConfig) -> str:
        """``model`` for messages, after the file the config was read from, as a refusal of the file names
        it: ``configs/x.yaml: model 'yolov8n'`` (``model 'yolov8n'`` for a config built in Python)."""
        return model.label if self.source is None else f"{self.source}: {model.label}"

    def setting(self, model: ModelConfig, key: str) -> Any:
        """A model's value of ``key`` (``conf``, ``iou``, ``imgsz``, ``max_det``, ``device``, ``batch``), else the default."""
        value = getattr(model, key)
        return getattr(self, key) if value is None else value


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """A deep copy of ``data`` with dotted-key overrides (``{"fusion.method": "nms"}``); None values are skipped."""
    data = copy.deepcopy(data)
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise ValueError(f"override {dotted!r}: {key!r} is not a mapping")
            node = child
        node[last] = value
    return data


def ensemble_config_from_dict(data: dict[str, Any], where: str = "ensemble config") -> EnsembleConfig:
    return from_dict(EnsembleConfig, data, where)


# Settings that a member type reads from the model alone: the ensemble-wide defaults (iou 0.7, imgsz 640)
# are Ultralytics' and would override a torchvision architecture's own, so a value given for every model
# (a --iou or --imgsz flag) is written onto these members instead.
_OWN_VALUE_ONLY = {"torchvision": ("iou", "imgsz")}
#: model type -> the common settings its members never read (an ONNX member runs at its input_size; saved
#: predictions were made earlier): a value given for every model is reported for these members rather
#: than passed over, and ``detens cache`` does not record it among their settings.
NOT_READ_BY_TYPE: dict[str, tuple[str, ...]] = {"onnx": ("imgsz",), "precomputed": ("iou", "imgsz", "device", "batch")}
_NOT_READ_WHY = {"onnx": "it runs at its input_size", "precomputed": "its predictions were made earlier"}


def load_ensemble_config(
    path: str | Path,
    overrides: dict[str, Any] | None = None,
    per_model: dict[str, Any] | None = None,
) -> EnsembleConfig:
    """Read an ensemble YAML (a path, or the name of a shipped config such as ``coco_yolo3``);
    ``overrides`` (dotted keys, e.g. from CLI flags) win over the file.

    ``per_model`` holds settings given for the whole ensemble that also replace each model's own value
    (``{"conf": 0.25}`` from a ``--conf`` flag); ``None`` values are ignored.

    Every relative path the file gives is relative to the file's folder, wherever the command runs:
    ``dataset``, ``weights_dir``, ``fusion.head``, the head files of ``fusion.params`` (``calibration``),
    and each model's ``weights``, ``results`` and ``images``. A value that is no file there keeps its
    other meaning: a shipped head's name (``coco_yolo3_deep``) for a head, a name in the weights folders
    or an upstream name (``yolo11n.pt``) for ``weights``. Such paths are made absolute (as written when
    the working directory is the file's folder). ``overrides`` are not: a command line's paths are the
    working directory's, as are those of a config built in Python.

    Raises:
        ValueError: a relative path that is not beside the file but is in the working directory (which
            earlier versions looked at first, and alone for a ``calibration`` head), naming both places;
            weights found there too under that name in a weights folder, an upstream name, and
            ``fusion.head`` (which ``--head`` may replace) are not refused.
    """
    path = find_packaged(path, "ensembles")
    data = read_yaml_file(path, "ensemble config")
    data = {} if data is None else data  # an empty file; not `or {}`, which would take [] or 0 for one
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    _paths_beside(data, path)
    per_model = {k: v for k, v in (per_model or {}).items() if v is not None}
    given = {key: value for key, value in {**(overrides or {}), **per_model}.items() if value is not None}
    file_data = data
    data = apply_overrides(data, given)  # a copy
    _check_weights_not_only_here(data, path)
    for model in data.get("models") or []:
        if isinstance(model, dict):
            kind = model.get("type", "ultralytics")
            for key, value in per_model.items():
                model.pop(key, None)
                if key in _OWN_VALUE_ONLY.get(kind, ()):
                    model[key] = value
                elif key in NOT_READ_BY_TYPE.get(kind, ()):
                    logger.warning(
                        "%s %s, given for every model, is not used by %r (type %r: %s)",
                        key, value, model.get("name") or model.get("weights") or model.get("results"), kind,
                        _NOT_READ_WHY[kind],
                    )
    try:
        config = ensemble_config_from_dict(data, where=str(path))
    except (TypeError, ValueError) as err:
        if given and not _file_refuses_alike(file_data, path, err):
            # the file alone is fine (or wrong elsewhere): the mistake came with the values given over it
            ensemble_config_from_dict(data, where=f"{path} (with {', '.join(f'{k}={v}' for k, v in given.items())})")
        raise
    config.folder = path.absolute().parent
    config.source = path
    return config


def _file_refuses_alike(data: dict[str, Any], path: Path, refusal: Exception) -> bool:
    """Whether the file's own ``data``, without the values given over it, is refused as the merged config
    was (``refusal``)."""
    try:
        ensemble_config_from_dict(data, where=str(path))
    except (TypeError, ValueError) as err:
        return str(err) == str(refusal)
    return False


#: ``fusion.params`` that the fusers take as head files: ``detens.fuse``'s ``calibration`` and theta's ``head``.
HEAD_PARAMS = ("calibration", "head")
#: The keys of an ensemble config that name a file or folder, beside ``fusion.head`` and :data:`HEAD_PARAMS`:
#: those a YAML gives relative to its folder (:func:`load_ensemble_config`), that :func:`with_absolute_paths`
#: and :func:`with_real_paths` rewrite.
ENSEMBLE_PATH_KEYS = ("dataset", "weights_dir")
#: A member's keys that name a file or folder, as :data:`ENSEMBLE_PATH_KEYS`; ``weights`` may also be a name
#: in a weights folder or one to download, which a YAML leaves as written where no such file is beside it.
MODEL_PATH_KEYS = ("weights", "results", "images")


def _paths_beside(data: dict[str, Any], source: Path) -> None:
    """Every relative path the YAML at ``source`` gives, made relative to the YAML's folder (see
    :func:`load_ensemble_config`), in place."""
    folder = source.parent
    fusion = data.get("fusion")
    if isinstance(fusion, dict):
        if isinstance(fusion.get("head"), str) and fusion["head"].strip():
            fusion["head"] = _head_beside(fusion["head"], folder)
        params = fusion.get("params")
        if isinstance(params, dict):
            for key in HEAD_PARAMS:
                if key in params:
                    params[key] = _head_param_beside(params[key], folder, f"fusion.params.{key}", source)
    for key in ENSEMBLE_PATH_KEYS:
        if key in data:
            data[key] = _file_beside(data[key], folder, key, source)
    for n, model in enumerate(data.get("models") or []):
        if not isinstance(model, dict):
            continue
        for key in MODEL_PATH_KEYS:
            if key == "weights" and key in model:
                model[key] = _weights_beside(model[key], folder)
            elif key in model:
                model[key] = _file_beside(model[key], folder, f"models[{n}].{key}", source)


def _relative(value: Any, folder: Path) -> tuple[Path, Path] | None:
    """``(beside the YAML, from the working directory)`` for a relative path; None for anything else (an
    absolute path, ``~/...``, an empty value, a value that is not a string: each left as it is)."""
    if not isinstance(value, str) or not value.strip():
        return None
    given = Path(home_expanded(value))
    return None if given.is_absolute() else (folder / given, given)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


def _beside_as_written(beside: Path, here: Path, value: str) -> str:
    """An existing path beside the YAML: ``value`` as written when the working directory finds the same
    file (the YAML's folder is the working directory), so that the outputs of earlier runs, which record the
    value, still resume; else its absolute path."""
    return value if _same_file(beside, here) else str(beside.resolve())


def _only_here_error(source: Path, where: str, value: str, beside: Path, here: Path, fix: str = "") -> ValueError:
    """``fix``: one more way out than a path relative to the YAML or an absolute one (the YAML may be a
    shipped config, which its user does not edit)."""
    # here.absolute(), not resolve(): the path as the working directory shows it, not a link's target
    return ValueError(
        f"{source}: {where} {value!r} is relative to the YAML's folder, where there is no {beside.resolve()}; the "
        f"{'folder' if here.is_dir() else 'file'} {here.absolute()} in the working directory is not looked at (a "
        "YAML means the same files wherever the command runs): give its path relative to the YAML, or an "
        f"absolute path{fix}"
    )


def _file_beside(value: Any, folder: Path, where: str, source: Path) -> Any:
    """A file or folder the YAML names (``dataset``, ``results``, ...), relative to the YAML's folder."""
    relative = _relative(value, folder)
    if relative is None:
        return value
    beside, here = relative
    if beside.exists():
        return _beside_as_written(beside, here, value)
    if here.exists():
        raise _only_here_error(source, where, value, beside, here)
    return str(beside.resolve())  # not found: named so when it is read


def _weights_beside(value: Any, folder: Path) -> Any:
    """A model's ``weights``: a path beside the YAML, else a name in the weights folders or an upstream
    name, left as it is for :func:`~detens.adapters.weights.resolve_model_weights` (which
    :func:`_check_weights_not_only_here` guards)."""
    relative = _relative(value, folder)
    if relative is None or not relative[0].exists():
        return value
    return _beside_as_written(*relative, value)


def _check_weights_not_only_here(data: dict[str, Any], source: Path) -> None:
    """Refuse relative weights that are not beside the YAML but are in the working directory, where
    :func:`~detens.adapters.weights.resolve_weights` looks first, unless they mean the same there: the file
    a weights folder (``weights_dir`` as the flags leave it) holds under that name, or an upstream name
    that Ultralytics downloaded into the working directory."""
    from detens.adapters.weights import WEIGHTS_TYPES, is_upstream_name, weights_dirs

    folders = None
    for n, model in enumerate(data.get("models") or []):
        value = model.get("weights") if isinstance(model, dict) else None
        relative = _relative(value, source.parent)
        if relative is None or relative[0].exists() or not relative[1].exists():
            continue
        kind = model.get("type", "ultralytics")
        if is_upstream_name(value, kind if kind in WEIGHTS_TYPES else "any"):
            continue
        if folders is None:
            weights_dir = data.get("weights_dir")
            folders = weights_dirs(weights_dir if isinstance(weights_dir, str) else None)
        if not any(_same_file(folder / relative[1], relative[1]) for folder in folders):
            raise _only_here_error(
                source, f"models[{n}].weights", value, *relative,
                fix="; or, for a name relative to a weights folder, pass the folder that holds it (--weights-dir, "
                "$DETENS_WEIGHTS)",
            )


def _head_param_beside(value: Any, folder: Path, where: str, source: Path) -> Any:
    """A head file among ``fusion.params`` (``calibration``), found as ``fusion.head`` is; one that is only
    in the working directory, where earlier versions looked for it alone, is refused (no flag replaces it,
    unlike ``fusion.head``, which ``--head`` does)."""
    relative = _relative(value, folder)
    if relative is None:
        return value
    beside, here = relative
    if beside.is_file():
        return _beside_as_written(beside, here, value)
    found = _head_beside(value, folder)
    if not Path(found).is_file() and here.exists():
        raise _only_here_error(source, where, value, beside, here)
    return found


def _head_beside(value: str, folder: Path) -> str:
    """A YAML's ``fusion.head``: the file beside the YAML, else the shipped head of that name (as
    ``--head`` takes one), as an absolute path."""
    try:
        return str(find_packaged(value, "heads", folder).resolve())
    except FileNotFoundError:
        # not refused here: a --method or --head flag may replace it; loading it names what is missing
        return str((folder / home_expanded(value)).resolve())


def _absolute(value: str | None) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return value
    path = Path(home_expanded(value))
    return str(path.absolute()) if not path.is_absolute() and path.exists() else value


def with_real_paths(data: Any) -> Any:
    """A parsed ensemble config (the mapping :func:`save_ensemble_config` writes) with each file or folder
    it names that exists written as its real path (``..`` and links resolved), for comparing two configs:
    the same files named from another working directory, or through a link, are the same config."""
    if not isinstance(data, dict):
        return data

    def real(value: Any) -> Any:
        return os.path.realpath(value) if isinstance(value, str) and value.strip() and os.path.exists(value) else value

    data = {**data, **{key: real(data[key]) for key in ENSEMBLE_PATH_KEYS if key in data}}
    if isinstance(data.get("models"), list):
        data["models"] = [
            {**model, **{key: real(model[key]) for key in MODEL_PATH_KEYS if key in model}}
            if isinstance(model, dict) else model
            for model in data["models"]
        ]
    fusion = data.get("fusion")
    if isinstance(fusion, dict):
        fusion = data["fusion"] = {**fusion, **({"head": real(fusion["head"])} if "head" in fusion else {})}
        if isinstance(fusion.get("params"), dict):
            fusion["params"] = {k: real(v) if k in HEAD_PARAMS else v for k, v in fusion["params"].items()}
    return data


def with_absolute_paths(config: EnsembleConfig | ModelConfig) -> EnsembleConfig | ModelConfig:
    """The config with every relative file it names that exists from the working directory made
    absolute (:data:`ENSEMBLE_PATH_KEYS`, each member's :data:`MODEL_PATH_KEYS`, the head, the head files of
    ``fusion.params``); other values (a download name such as ``yolo11n.pt``) as they are. For workers whose
    working directory is not this process's (Ray actors on a cluster started elsewhere)."""
    if isinstance(config, ModelConfig):
        return replace(config, **{key: _absolute(getattr(config, key)) for key in MODEL_PATH_KEYS})
    params = {k: _absolute(v) if k in HEAD_PARAMS else v for k, v in config.fusion.params.items()}
    absolute = replace(
        config,
        **{key: _absolute(getattr(config, key)) for key in ENSEMBLE_PATH_KEYS},
        models=[with_absolute_paths(model) for model in config.models],
        fusion=replace(config.fusion, head=_absolute(config.fusion.head), params=params),
    )
    absolute.source = config.source  # a worker's refusal of a member still names the file
    return absolute


def save_ensemble_config(config: EnsembleConfig, path: str | Path) -> None:
    """Write the config as YAML (atomically), its relative files that exist from the working directory made
    absolute (:func:`with_absolute_paths`): read back, a YAML's relative paths are its own folder's, so the
    saved file (``detens fuse``'s ``config.yaml``, ``detens cache``'s) loads as the same config from
    anywhere."""
    save_yaml_config(with_absolute_paths(config), path)
