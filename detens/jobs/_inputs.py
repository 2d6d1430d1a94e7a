"""Checks of a command's input files shared by ``detens fuse`` and ``detens cache``: the saved predictions of
``precomputed`` members (checked before any detector loads) and the digests that make a resumed run
refuse input files rewritten at the same path; the lines that name the images unreadable or read with a
warning at the end of a run; and the comma-separated lists of names that several commands take (``--models``,
``--methods``), read alike by each."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from detens.adapters.onnx_external_data import external_data_files
from detens.adapters.precomputed import image_map_beside
from detens.adapters.weights import ResolvedWeights, resolve_model_weights
from detens.ensemble_config import HEAD_PARAMS, EnsembleConfig, ModelConfig

#: The images read with a warning that the end of a run names (its summary lists them all).
WARNINGS_SHOWN = 10


def unreadable_lines(unreadable: dict[str, str]) -> list[str]:
    """The lines that name each image of ``unreadable`` (``{file name: why it could not be read}``) at the
    end of a run."""
    return [f"unreadable: {name}: {why}" for name, why in unreadable.items()]


def read_warning_lines(read_warnings: dict[str, list[str]], listed_in: str) -> list[str]:
    """The lines that name the first :data:`WARNINGS_SHOWN` images of ``read_warnings`` (``{file name:
    warnings}``: a JPEG decoded in part, an orientation tag not applied, ...), and how many more the summary
    file ``listed_in`` lists."""
    warned = list(read_warnings.items())
    lines = [f"read with a warning: {name}: {text}" for name, texts in warned[:WARNINGS_SHOWN] for text in texts]
    if len(warned) > WARNINGS_SHOWN:
        lines.append(f"read with a warning: {len(warned) - WARNINGS_SHOWN} more images, listed in {listed_in}")
    return lines


def comma_separated(flag: str, text: str, noun: str, expected: str, valid: Sequence[str] = ()) -> list[str]:
    """The names that ``text``, the value of ``flag``, separates by commas, each without the spaces around
    it (``--models "a, b"``: ``a`` and ``b``); an empty one between commas (``a,,b``, a trailing comma) is
    passed over. ``noun`` and ``expected`` say in a message what the names are and what to give, ``valid``
    the names there are to give (none: not listed).

    Raises:
        ValueError: ``text`` names nothing (empty, or only commas and spaces): leaving the flag out is how a
            command takes its default, so an empty value is a mistake (a shell variable that was not set).
    """
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        listed = f"; valid names: {', '.join(valid)}" if valid else ""
        raise ValueError(f"{flag} {text!r} names no {noun}; give {expected} separated by commas{listed}")
    return names


def model_names(text: str | None, folder: str | Path) -> list[str] | None:
    """The models of the prediction folder ``folder`` that ``--models`` of ``detens train`` and ``detens
    evaluate`` names (:func:`comma_separated`, whose error lists the folder's models); None, every model
    of the folder, where the flag is left out."""
    if text is None:
        return None
    from detens.predictions import folder_models  # torch and the COCO tools, which not every command needs

    return comma_separated("--models", text, "model", "model names", valid=folder_models(folder))


def _sha256_of_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _listing_digest(root: Path, files: Iterable[Path]) -> str:
    """One sha256 (16 hex digits) over ``files``, in sorted order, each with its name relative to ``root``
    (``../`` where it lies outside)."""
    named = sorted((Path(os.path.relpath(p, root)).as_posix(), p) for p in files)
    listing = "".join(f"{relative}\0{_sha256_of_file(p)}\n" for relative, p in named)
    return hashlib.sha256(listing.encode("utf-8")).hexdigest()[:16]


def _onnx_external_files(model: Path) -> list[Path]:
    """The external-data files of an ONNX model, each checked to be a file (onnxruntime reads them at load)."""
    files = external_data_files(model)
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{model} keeps tensors in {', '.join(str(f) for f in missing)}, which "
            f"{'is not a file' if len(missing) == 1 else 'are not files'}: keep an ONNX model's external-data "
            "files beside it, as it names them"
        )
    return files


def path_digest(path: str | Path) -> str:
    """The sha256 (16 hex digits) of a file, or of a folder (an OpenVINO export): one digest over its files
    in sorted order, each with its name relative to the folder, so that a renamed, added or removed file
    counts as a change and the folder's place does not. An ONNX model (``.onnx``) whose tensors lie in
    external-data files counts with them: one digest over the model and those files, named relative to
    the model's folder (a model that holds all its tensors: the sha256 of its file).

    Raises:
        FileNotFoundError: ``path`` is neither a file nor a folder, or an ONNX model's external-data file
            is missing.
        ValueError: a ``.onnx`` file that is not an ONNX model.
    """
    path = Path(path)
    if path.is_file():
        external = _onnx_external_files(path) if path.suffix.lower() == ".onnx" else []
        return _listing_digest(path.parent, [path, *external]) if external else _sha256_of_file(path)[:16]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is neither a file nor a folder: no digest of its content")
    return _listing_digest(path, (p for p in path.rglob("*") if p.is_file()))


def file_digests(files: Iterable[str | None]) -> dict[str, str]:
    """``{file: sha256}`` of the given files that exist (None and missing names are passed over)."""
    # a name that is not a file: a shipped head by name, the package's own file
    return {str(name): path_digest(name) for name in files if name is not None and Path(name).is_file()}


def saved_prediction_files(model: ModelConfig, dataset: str | None = None) -> list[str]:
    """The files a ``precomputed`` member reads: its results file and the file that maps its images' names
    to their ids (its ``images``, else the ``images.json`` of the run that wrote the results,
    :func:`~detens.adapters.precomputed.image_map_beside`, else the ensemble's ``dataset``), as the config
    names them. Rewritten in place, the map would send earlier boxes to other images: its content counts as
    the results' does.
    ``detens cache`` passes no ``dataset``: its dataset is the ground truth, whose ids and file names it
    checks itself (an annotation fixed in place must not block a resume).
    """
    files = [model.results] if model.results is not None else []
    if isinstance(model.images, (str, os.PathLike)):
        files.append(str(model.images))
    elif model.images is None and model.results is not None:
        beside = image_map_beside(model.results)
        if beside is not None:
            files.append(str(beside))
        elif dataset is not None:
            files.append(str(dataset))
    return [str(name) for name in files]


def input_fingerprints(config: EnsembleConfig) -> dict[str, str]:
    """``{file: sha256}`` of the files whose content decides the results beside the config itself: the
    head and the head files among the fusion's parameters (a ``calibration``), the saved predictions of
    ``precomputed`` members and their image maps (:func:`saved_prediction_files`) and the members' weights
    on disk, keyed as the config names them (each is often rewritten in place: a re-exported model saved
    over the old one).

    Raises:
        WeightsNotFoundError: a member's weights are found nowhere (naming the member).
    """
    saved = [
        name for m in config.models if m.type == "precomputed" for name in saved_prediction_files(m, config.dataset)
    ]
    params = config.fusion.params
    heads = [config.fusion.head, *(v for k, v in params.items() if k in HEAD_PARAMS and isinstance(v, str))]
    fingerprints = file_digests([*heads, *saved])
    digests: dict[str, str] = {}
    for model in config.models:
        weights = resolve_model_weights(model, config.weights_dir, config.folder, label=config.member_label(model))
        fingerprints.update(weights_inputs(model, weights, digests))
    return fingerprints


def weights_inputs(
    model: ModelConfig, weights: ResolvedWeights | None, digests: dict[str, str]
) -> dict[str, str]:
    """``{weights as the config gives them: digest of the file or folder they resolve to}`` (``weights``,
    see :func:`~detens.adapters.weights.resolve_model_weights`), or nothing for a member that reads no
    weights or downloads them (an upstream name: no file yet).

    Keyed by the configured name, not the resolved path, so that shards run where the weights lie
    elsewhere still merge. ``digests`` (resolved path -> digest) is this run's: the views of a model, and
    models sharing a file, hash it once.
    """
    if weights is None or not weights.local:
        return {}
    if weights.value not in digests:
        digests[weights.value] = path_digest(weights.value)
    return {str(model.weights): digests[weights.value]}


def check_inputs_unchanged(out: Path, previous: Any, fingerprints: dict[str, str]) -> None:
    """Refuse to resume when an input file (a head, saved predictions, their image map) changed at the same
    path since the earlier run, whose record ``previous`` holds their digests under ``inputs`` (a file it
    holds no digest of, recorded by an earlier version, is taken as it is now)."""
    earlier = previous.get("inputs") if isinstance(previous, dict) else None
    if not isinstance(earlier, dict):
        return
    changed = sorted(name for name, digest in fingerprints.items() if earlier.get(name) not in (None, digest))
    if changed:
        raise ValueError(
            f"{', '.join(changed)} changed since the earlier run in {out}, whose results came from the old "
            "content; use another --out, or --overwrite to discard them"
        )


def saved_prediction_members(config: EnsembleConfig, categories: dict[int, str] | None) -> dict[int, Any]:
    """The ``precomputed`` members of ``config``, built, by their index in ``config.models``: they read only
    their files, so they are checked on the driver whatever the engine (``categories``: the dataset's, or
    None for COCO, as :func:`~detens.adapters.build_ensemble` passes them)."""
    from detens.adapters import build_detector

    return {
        i: build_detector(model, config, categories)
        for i, model in enumerate(config.models)
        if model.type == "precomputed"
    }


def check_saved_predictions(
    members: list[Any],
    paths: list[Path],
    category_ids: list[int] | None = None,
    label_space: str = "the label space",
) -> None:
    """Check the saved predictions of the ``precomputed`` members among ``members`` before the first image
    is fused (else the run would stop in the middle, or write ids it cannot name).

    Args:
        members (list): the ensemble's members; those without saved predictions are passed over.
        paths (list[Path]): the images the run will fuse; each must be among every member's saved images.
        category_ids (list[int] | None): the category ids the run writes; every saved result's category
            must be one of them. None: not checked.
        label_space (str): whose ids ``category_ids`` are, for the message.

    Raises:
        ValueError: naming the member and the first missing image, or the results file, the result, its
            category id and the valid ids.
    """
    for member in members:
        lookup = getattr(member, "image_record", None)
        if lookup is None:
            continue
        check_categories = getattr(member, "check_categories", None)
        if category_ids is not None and check_categories is not None:
            check_categories(category_ids, label_space)
        missing = []
        for path in paths:
            try:
                lookup(path)
            except KeyError as err:
                missing.append(err.args[0] if err.args else str(path))
        if missing:
            # the member's own message begins with what this one says: the first image's part of it is kept
            first = str(missing[0]).removeprefix(f"{member.name}: no saved predictions for ")
            raise ValueError(
                f"{len(missing)} of the {len(paths)} images have no saved predictions in member "
                f"{member.name!r}: {first}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
