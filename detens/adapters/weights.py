"""Where detector weights come from.

:func:`resolve_weights` looks, in this order:

1. at the value as a path (absolute, or relative to the working directory; ``~`` expanded; an ensemble
   YAML's relative weights are relative to the YAML's folder, ``beside``: it makes one that exists there
   absolute before it gets here, and refuses one found only from the working directory, which is not
   looked at for it);
2. at the value as a name relative to the weights folders, in this order: ``$DETENS_WEIGHTS`` (one
   folder, or several separated by ``os.pathsep``) when set; the folder the caller passes (``weights_dir``
   of an ensemble YAML); the first ``shared/models`` folder found walking up from the working directory
   (the repository's offline layout, ``../shared/models`` beside a clone); ``../shared/models`` beside the
   repository that holds this package (an editable install run from elsewhere);
3. at the value as an upstream name that Ultralytics or torchvision download when online
   (``yolo11n.pt``, ``yolo26n``, a model YAML such as ``yolov8n.yaml``, a URL; torchvision ``"DEFAULT"``
   or a weights enum name such as ``"COCO_V1"``): the name is returned unchanged for the upstream loader.

Anything else is a :class:`WeightsNotFoundError` that lists every place it looked.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from detens.io import home_expanded

__all__ = [
    "ENV_VAR",
    "WeightsNotFoundError",
    "ResolvedWeights",
    "repository_weights_dir",
    "shared_models_above",
    "weights_dirs",
    "resolve_weights",
    "resolve_model_weights",
    "WEIGHTS_TYPES",
    "is_upstream_name",
    "upstream_failure",
]

#: Environment variable naming the weights folder(s).
ENV_VAR = "DETENS_WEIGHTS"

Kind = Literal["ultralytics", "torchvision", "onnx", "any"]
#: The member types that load weights (resolved by :func:`resolve_weights`); saved predictions load none.
WEIGHTS_TYPES: tuple[Kind, ...] = ("ultralytics", "torchvision", "onnx")


class WeightsNotFoundError(FileNotFoundError):
    """Weights that are neither a file, nor in a weights folder, nor an upstream name (or failed to download)."""


@dataclass(frozen=True)
class ResolvedWeights:
    """The outcome of :func:`resolve_weights`.

    Args:
        value (str): a local path (as a string) or the upstream name, ready for the loader.
        local (bool): True for a file or folder found on disk, False for an upstream name.
        tried (tuple[str, ...]): the places looked at, for error messages.
    """

    value: str
    local: bool
    tried: tuple[str, ...] = field(default=(), compare=False)

    @property
    def path(self) -> Path | None:
        return Path(self.value) if self.local else None


def repository_weights_dir() -> Path:
    """``../shared/models`` next to the repository that holds this package (it may not exist)."""
    # detens/adapters/weights.py -> parents[2] is the repository root
    return Path(__file__).resolve().parents[2].parent / "shared" / "models"


def shared_models_above(start: str | Path | None = None) -> Path | None:
    """The first ``shared/models`` folder in ``start`` (default: the working directory) or one of its
    parents, or None."""
    here = Path(start if start is not None else Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "shared" / "models"
        if candidate.is_dir():
            return candidate
    return None


def weights_dirs(default: str | Path | None = None) -> list[Path]:
    """The folders that weight names are relative to, in search order (see the module docstring)."""
    env = os.environ.get(ENV_VAR, "").strip()
    dirs = [Path(home_expanded(p)) for p in env.split(os.pathsep) if p.strip()] if env else []
    if default is not None:
        dirs.append(Path(home_expanded(default)))
    for found in (shared_models_above(), repository_weights_dir()):
        if found is not None and found.is_dir():
            dirs.append(found)
    unique: list[Path] = []
    for folder in dirs:
        if folder.resolve() not in {u.resolve() for u in unique}:
            unique.append(folder)
    return unique


def _ultralytics_upstream(name: str) -> bool:
    if name.startswith(("http://", "https://")):
        return True
    if "/" in name or "\\" in name:
        return False
    if name.endswith((".yaml", ".yml")):  # model YAMLs ship inside the ultralytics package
        return True
    downloads = import_ultralytics("ultralytics.utils.downloads")
    return name in downloads.GITHUB_ASSETS_NAMES or name in downloads.GITHUB_ASSETS_STEMS


def import_ultralytics(module: str) -> ModuleType:
    """Ultralytics' ``module``, imported with ``YOLO_AUTOINSTALL`` defaulting to ``false``.

    Ultralytics reads the variable once, at its first import, and would otherwise pip-install a runtime
    it misses while a command runs (those detens uses are its dependencies): every import of Ultralytics
    by detens comes through here. A value the user set is kept, and so is an Ultralytics imported before.
    """
    os.environ.setdefault("YOLO_AUTOINSTALL", "false")
    return importlib.import_module(module)


def _torchvision_upstream(name: str) -> bool:
    # "DEFAULT", "COCO_V1", "FasterRCNN_ResNet50_FPN_Weights.COCO_V1": identifiers, never paths
    if name.startswith(("http://", "https://")):
        return False
    parts = name.split(".")
    return 1 <= len(parts) <= 2 and all(p.isidentifier() for p in parts) and parts[-1].upper() == parts[-1]


def is_upstream_name(name: str, kind: Kind) -> bool:
    """Whether ``name`` is something the upstream library downloads (or builds) itself."""
    if kind == "ultralytics":
        return _ultralytics_upstream(name)
    if kind == "torchvision":
        return _torchvision_upstream(name)
    if kind == "onnx":  # no upstream to download ONNX files from: they must be on disk
        return False
    return _ultralytics_upstream(name) or _torchvision_upstream(name)


def _env_note() -> str:
    env = os.environ.get(ENV_VAR, "").strip()
    return f"${ENV_VAR}={env!r}" if env else f"${ENV_VAR} unset"


def resolve_weights(
    weights: str | os.PathLike[str],
    kind: Kind = "any",
    weights_dir: str | Path | None = None,
    beside: str | Path | None = None,
) -> ResolvedWeights:
    """Find ``weights`` (see the module docstring for the order).

    Args:
        weights: a path, a name relative to a weights folder, or an upstream name.
        kind: whose upstream names are accepted: ``"ultralytics"``, ``"torchvision"``, ``"any"``, or
            ``"onnx"`` (none: the file must be on disk).
        weights_dir: a weights folder searched after ``$DETENS_WEIGHTS`` (``weights_dir`` of the YAML).
        beside: the folder of the config file that names ``weights``, where a relative path is looked
            for instead of the working directory; None: the working directory (a call from Python).

    Raises:
        WeightsNotFoundError: not found anywhere; the message lists where it looked.
    """
    if not isinstance(weights, (str, os.PathLike)):
        raise TypeError(f"weights must be a path or a name, got {type(weights).__name__}: {weights!r}")
    text = os.fspath(weights)
    if not text.strip():
        raise ValueError("weights must not be empty")
    tried: list[str] = []
    as_path = Path(home_expanded(text))
    if beside is None or as_path.is_absolute():
        paths = [(as_path, "as a path")]
    else:
        paths = [(Path(beside) / as_path, "as a path beside the config file")]
        if is_upstream_name(text, kind) and paths[0][0].resolve() != as_path.resolve():
            # where Ultralytics saves what it downloads, and reads it back from (torchvision keeps its
            # downloads in torch's hub cache, but a file of that name here is still taken)
            where = ", where Ultralytics saves a download" if kind in ("ultralytics", "any") else ""
            paths.append((as_path, f"in the working directory{where}"))
    for path, note in paths:
        tried.append(f"{path.resolve() if not path.is_absolute() else path} ({note})")
        if path.exists():
            return ResolvedWeights(str(path.absolute()), True, tuple(tried))
    if not as_path.is_absolute():
        dirs = weights_dirs(weights_dir)
        for folder in dirs:
            candidate = folder / as_path
            # absolute: a relative folder is the working directory's, which the reader may not know
            note = "weights folder" if folder.is_dir() else f"weights folder; {folder.resolve()} does not exist"
            tried.append(f"{candidate.resolve()} ({note})")
            if candidate.exists():
                return ResolvedWeights(str(candidate), True, tuple(tried))
        if not dirs:
            tried.append(
                f"no weights folder ({_env_note()}, no weights_dir, no shared/models above {Path.cwd()} "
                f"or beside the package)"
            )
    if is_upstream_name(text, kind):
        tried.append(f"{text!r} as an upstream name ({kind}; downloaded when online)")
        return ResolvedWeights(text, False, tuple(tried))
    upstream_hint = {
        "ultralytics": "an Ultralytics asset name such as 'yolo11n.pt'",
        "torchvision": "a torchvision weights name such as 'DEFAULT' or 'COCO_V1'",
        "onnx": "downloadable (ONNX weights must be on disk)",
        "any": "an Ultralytics asset name ('yolo11n.pt') or torchvision weights name ('DEFAULT')",
    }[kind]
    raise WeightsNotFoundError(
        f"weights {text!r} not found (looked at: "
        + "; ".join(tried)
        + f"), and it is not {upstream_hint}. Pass an existing path"
        + (" or a name" if kind == "onnx" else ", a name")
        + f" relative to ${ENV_VAR} ({_env_note()})"
        + ("." if kind == "onnx" else ", or an upstream name.")
    )


def resolve_model_weights(
    model: Any, weights_dir: str | Path | None = None, beside: str | Path | None = None, *, label: str | None = None
) -> ResolvedWeights | None:
    """Where the weights of a model config (a ``ModelConfig``) are, or None for a member that reads no
    weights: one of another type than :data:`WEIGHTS_TYPES` (saved predictions), or without ``weights``
    (a torchvision architecture left untrained). ``beside``: the folder of the YAML the model comes from
    (``EnsembleConfig.folder``), as :func:`resolve_weights` takes it. ``label``: the model in messages
    (``EnsembleConfig.member_label``, which leads with the YAML file); None: ``model 'yolov8n'``.

    Raises:
        WeightsNotFoundError: its weights are found nowhere (naming the model).
    """
    if model.type not in WEIGHTS_TYPES or not model.weights:
        return None
    try:
        return resolve_weights(model.weights, model.type, weights_dir, beside)
    except WeightsNotFoundError as err:
        raise WeightsNotFoundError(f"{model.label if label is None else label}: {err}") from None


def upstream_failure(
    resolved: ResolvedWeights, err: BaseException, what: str | None = None
) -> WeightsNotFoundError:
    """The error to raise when the upstream loader could not fetch ``resolved`` (e.g. offline).

    ``what`` names the model for the message (``"torchvision ssdlite320_mobilenet_v3_large"``).
    """
    name = f"{what} weights {resolved.value!r}" if what else f"weights {resolved.value!r}"
    return WeightsNotFoundError(
        f"{name} are not on disk and the upstream download failed ({type(err).__name__}: "
        f"{err}; looked at: " + "; ".join(resolved.tried) + f"). Put the file in a weights folder "
        f"({_env_note()}) or pass its path."
    )
