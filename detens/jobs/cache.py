"""The job of ``detens cache``: cache each ensemble member's detections on a COCO-format dataset, or merge
the shards of earlier runs (the command's help page, :mod:`detens.cli.cache`, says what is written and what
is refused)."""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import gc
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

from detens.adapters import (
    build_detector,
    check_class_maps,
    dataset_categories,
    detect_loaded,
    label_space_name,
    view_names,
    warn_of_class_map_slips,
)
from detens.adapters._labels import describe_label_space_difference, label_space_differences
from detens.adapters.weights import ResolvedWeights, resolve_model_weights
from detens.catalogue import DEFAULT_ENSEMBLE
from detens.checks import did_you_mean, first_few
from detens.coco import (
    CocoGroundTruth,
    check_one_id_per_file,
    detections_to_coco,
    load_coco_gt,
    save_coco_results,
    validate_coco_results,
)
from detens.config import parse_yaml
from detens.ensemble_config import (
    MODEL_PATH_KEYS,
    NOT_READ_BY_TYPE,
    EnsembleConfig,
    ModelConfig,
    check_member_name,
    load_ensemble_config,
    save_ensemble_config,
)
from detens.io import (
    LOCK_NAME,
    HeldLock,
    atomic_write_json,
    atomic_write_text,
    check_not_special_file,
    check_replaceable,
    check_writable_folder,
    lock_descriptor,
    lock_holder_text,
    output_lock,
    read_json_file,
    remove_stale_temporaries,
    run_folder,
)
from detens.jobs._engine import EngineOptions, ray_options
from detens.jobs._inputs import (
    check_inputs_unchanged,
    check_saved_predictions,
    comma_separated,
    file_digests,
    read_warning_lines,
    saved_prediction_files,
    unreadable_lines,
    weights_inputs,
)
from detens.jobs._interrupts import is_interruption, raise_interruption
from detens.jobs._options import (
    UsageError,
    command_line_flag,
    existing_folder,
    file_or_shipped_name,
    flag,
    folder,
    input_path,
    integer,
    number,
    text,
)
from detens.jobs._options import path as file_path  # ``path`` is a local name of the code below
from detens.jobs._records import (
    DamagedRecord,
    check_milliseconds,
    check_read_warnings,
    checked_results,
    is_duration,
    read_record,
    warn_of_damaged_record,
)
from detens.jobs._software import software_versions
from detens.labels import COCO_ID_TO_NAME
from detens.predictions import CACHE_PARTIAL, CACHE_SUMMARY, finished_image_records
from detens.sources import ImageReadError, read_image

__all__ = ["CacheOptions", "MergeError", "run"]

logger = logging.getLogger("detens.cache")

PARTIAL = CACHE_PARTIAL
SHARDS = "shards"
SUMMARY = CACHE_SUMMARY
SETTINGS = "_settings.json"
#: How a member's results kept without their :data:`SETTINGS` differ from a run's settings, in messages
UNRECORDED = f"unknown: its {SETTINGS} is missing"
SHARD_FORMAT = "detens.cache.shard/1"
# A shard's annotation file, recorded in OUT/shards as the shard claims its first member: the shards of one
# split run at once, and one started on another file than the others must be refused as it starts, not at
# the merge. Hidden: no member name starts with a dot, so it is never taken for a member's shard file.
ANNOTATIONS = ".annotations"
_SHARD_FILE = re.compile(r"^(?P<member>.+)\.shard-(?P<index>\d+)-of-(?P<count>\d+)\.json$")
# ModelConfig keys that change a member's detections (device and batch do not; name and weight neither).
_RESULT_KEYS = ("type", "weights", "arch", "results", "images", "half", "class_map", "options")
_SETTING_KEYS = ("conf", "iou", "imgsz", "max_det")
# onnx-only keys, recorded only when set so that the settings of other members (and old caches) stay as they were
_ONNX_KEYS = ("decoder", "input_size", "letterbox", "pad_value", "bgr_to_rgb", "mean", "std")
# Recorded by earlier versions and no longer compared: the weights folder only says where the files were
# found, and their digests (``inputs``) say whether they are the same files, wherever they lie.
_NOT_COMPARED = ("weights_dir",)
# Member names whose files would be taken for the command's own: ``<member>.json`` would be the summary.
# Compared ignoring case, as on case-insensitive file systems.
RESERVED_NAMES = ("cache_summary",)


@dataclasses.dataclass(kw_only=True)
class CacheOptions(EngineOptions):
    """The options of ``detens cache`` (and of ``detens cache merge``).

    Attributes:
        action (str | None): ``merge``: join the shards in ``OUT/shards`` into ``<member>.json`` (as ``merge``).
        config (str): a shipped ensemble name or an ensemble YAML.
        images (Path | None): the folder holding the images (the ground truth's ``file_name`` is relative to
            it); a detection run needs it.
        gt (Path | None): the COCO annotation file: the images' ids, file names and categories; a detection run
            needs it, a merge checks the shards against it.
        out (Path): the output folder (created; a re-run resumes).
        models (str | None): comma-separated member names or globs to cache (None: every member).
        shard (str | None): ``i/n``: process only the images at positions ``i, i+n, ...`` (``0 <= i < n``).
        merge (bool): join the shards in ``OUT/shards`` into ``<member>.json``.
        conf (float | None): minimum detection score of every model (overrides ``conf``).
        iou (float | None): NMS IoU of every model (overrides ``iou``).
        max_det (int | None): maximum detections per image of every model (overrides ``max_det``).
        imgsz (int | None): inference size of every model (overrides ``imgsz``).
        device (str | None): device of every model: ``cpu``, ``cuda``, ``cuda:0`` ... (overrides ``device``).
        batch (int | None): images per detector call (overrides ``batch``).
        weights_dir (str | None): the folder that weights names are relative to (overrides ``weights_dir``).
        max_images (int | None): stop after this many new images per model (as if interrupted; run again to
            go on).
        overwrite (bool): discard the selected members' earlier results (in this shard) instead of resuming.
    """

    job = "cache"

    action: str | None = text(choices=("merge",))
    config: str = input_path(DEFAULT_ENSEMBLE)
    images: Path | None = folder()
    gt: Path | None = file_path()
    out: Path = folder(required=True)
    models: str | None = text()
    shard: str | None = text()
    merge: bool = flag()
    conf: float | None = number()
    iou: float | None = number()
    max_det: int | None = integer()
    imgsz: int | None = integer()
    device: str | None = text()
    batch: int | None = integer()
    weights_dir: str | None = existing_folder()
    max_images: int | None = integer()
    overwrite: bool = flag()


# Options of a detection run, which merging the shards of earlier runs has no use for.
_RUN_ONLY = (
    "images", "conf", "iou", "max_det", "imgsz", "device", "batch", "weights_dir", "max_images", "overwrite",
    "ray_address", "gpus_per_actor",
)


def check_args(options: CacheOptions) -> tuple[bool, tuple[int, int] | None, Any]:
    """Option combinations the parser cannot express (a :class:`UsageError` names the problem).

    Returns:
        tuple: whether the run merges (``merge``, or the action ``merge``), this run's shard (``shard``
        read; None for a merge or without it), and the :class:`~detens.engines.ray_cache.RayOptions` of
        ``engine="ray"`` (None for the local engine).
    """
    merging = options.merge or options.action == "merge"
    shard = None
    if merging:
        if options.shard is not None:  # an empty one too, as the options of a detection run below
            raise UsageError("--merge joins all shards; do not give --shard")
        given = [
            name for name in _RUN_ONLY if getattr(options, name) is not None and getattr(options, name) is not False
        ]
        run_only = [command_line_flag(name) for name in given]
        run_only += ["--config"] if options.config != DEFAULT_ENSEMBLE else []
        run_only += ["--engine"] if options.engine != "local" else []
        run_only += ["--actors"] if options.actors is not None else []
        if run_only:
            raise UsageError(
                f"merge joins the shards already written in OUT/shards (it takes --out, --models, --gt); "
                f"{', '.join(run_only)} would not be used"
            )
    else:
        if options.images is None or options.gt is None:
            raise UsageError("--images and --gt are required (except with merge)")
        shard = parse_shard(options.shard)
    if options.max_images is not None and options.max_images < 0:
        raise UsageError(f"--max-images must be >= 0, got {options.max_images}")
    return merging, shard, ray_options(options)


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None:
        raise UsageError(f"--shard must look like i/n (e.g. 0/4), got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 0 <= index < count:
        raise UsageError(f"--shard i/n needs n >= 1 and 0 <= i < n, got {index}/{count}")
    return index, count


def shard_tag(shard: tuple[int, int]) -> str:
    return f"shard-{shard[0]}-of-{shard[1]}"


def annotations_path(out: Path, shard: tuple[int, int]) -> Path:
    """Where shard ``shard`` records the annotation file it was made on (see :data:`ANNOTATIONS`)."""
    return out / SHARDS / f"{ANNOTATIONS}.{shard_tag(shard)}.json"


def member_output(name: str, shard: tuple[int, int] | None) -> str:
    """The member's results file, relative to ``--out``: ``<name>.json``, or its shard's file."""
    return f"{SHARDS}/{name}.{shard_tag(shard)}.json" if shard else f"{name}.json"


# ------------------------------------------------------------------------------------------------ config
def resolve_config(options: CacheOptions) -> EnsembleConfig:
    """The config file with the flags applied (a flag given for every model also replaces each model's own value)."""
    per_model = {
        "conf": options.conf,
        "iou": options.iou,
        "max_det": options.max_det,
        "imgsz": options.imgsz,
        "device": options.device,
        "batch": options.batch,
    }
    config = load_ensemble_config(file_or_shipped_name("--config", options.config),
                                  {"weights_dir": options.weights_dir}, per_model)
    if config.dataset is None:  # the label space is the ground truth's
        config.dataset = str(Path(options.gt).absolute())
    return config


# ----------------------------------------------------------------------------------------------- members
@dataclass
class Entry:
    """One ``models`` entry of the config: its members' names, built (loaded) only when needed."""

    model: ModelConfig
    names: list[str]
    built: Any = None  # the detector, or an AugmentedDetector
    selected: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        base = self.names[0].split("|")[0]
        return base if len(self.names) == 1 else f"{base} ({len(self.selected)} views)"

    def members(self) -> dict[str, Any]:
        built = self.built
        members = list(built.members) if hasattr(built, "members") else [built]
        names = [m.name for m in members]
        if names != self.names:
            raise RuntimeError(f"the built members {names} differ from the expected {self.names}")
        return dict(zip(names, members, strict=True))


def plan_entries(config: EnsembleConfig, categories: dict[int, str] | None) -> list[Entry]:
    """The config's entries with their member names (an entry without ``name`` is loaded to learn it, then
    released: one model in memory at a time; it is loaded again when its turn comes).

    A ``name`` of the config was checked when the config was built; a name taken from the weights (or
    results) file is checked here, as the config's names are (:func:`check_member_name`). Names that
    would write the command's own files (:data:`RESERVED_NAMES`) are refused.
    """
    for model in config.models:  # the config's own names, before any model loads
        if model.name:
            check_not_reserved(view_names(model.name, model))
    entries = []
    for model in config.models:
        if model.name:
            entries.append(Entry(model, view_names(model.name, model)))
        else:
            built = build_detector(model, config, categories)
            base = check_member_name(built.detector.name if hasattr(built, "members") else built.name)
            entries.append(Entry(model, check_not_reserved(view_names(base, model))))
            del built
            release_memory()
    names = [n for e in entries for n in e.names]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"members must have different names, got {duplicates} twice; set 'name' in the config"
        )
    return entries


def model_patterns(text: str | None, members: Sequence[str]) -> list[str]:
    """The names or globs of ``--models`` (None: every member, ``*``) among ``members``.

    Raises:
        ValueError: ``text`` names nothing (empty, or only commas and spaces; the message lists ``members``):
            leaving the flag out selects every member, an empty value is a mistake (a shell variable that
            was not set).
    """
    if text is None:
        return ["*"]
    return comma_separated("--models", text, "member", "names or globs", valid=members)


def check_not_reserved(names: list[str]) -> list[str]:
    """``names`` if none of them is a name whose results file would be the command's own file.

    Raises:
        ValueError: naming the first reserved member name.
    """
    for name in names:
        if name.casefold() in RESERVED_NAMES:
            raise ValueError(
                f"member name {name!r} is reserved: its results file {name}.json would be the summary {SUMMARY} "
                "of detens cache (and its shard file the shard's summary); set another 'name' in the config"
            )
    return names


def select_members(entries: list[Entry], patterns: str | None) -> None:
    """Mark the members matching ``--models`` (names or globs); every pattern must match one."""
    names = [n for e in entries for n in e.names]
    wanted = model_patterns(patterns, names)
    for pattern in wanted:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            raise ValueError(
                f"--models {pattern!r} matches no member; the members are {', '.join(names)}."
                + did_you_mean(pattern, names)
            )
    for entry in entries:
        entry.selected = [n for n in entry.names if any(fnmatch.fnmatchcase(n, p) for p in wanted)]


def member_settings(
    config: EnsembleConfig,
    entry: Entry,
    name: str,
    categories: dict[int, str] | None,
    weights: ResolvedWeights | None,
    digests: dict[str, str],
) -> dict[str, Any]:
    """What determines a member's detections (resuming with other settings is refused); ``weights``: where
    the entry's weights are (None: it reads none), ``digests``: the weights digests of this run (see
    :func:`weights_inputs`)."""
    model = entry.model
    settings: dict[str, Any] = {key: getattr(model, key) for key in _RESULT_KEYS}
    # a setting the member never reads cannot change its detections (and must not refuse a resume)
    unread = NOT_READ_BY_TYPE.get(model.type, ())
    settings.update({key: config.setting(model, key) for key in _SETTING_KEYS if key not in unread})
    if isinstance(model.class_map, list):
        settings["class_map"] = list(model.class_map)
    else:
        settings["class_map"] = {str(k): v for k, v in (model.class_map or {}).items()} or None
    settings.update({key: getattr(model, key) for key in _ONNX_KEYS if getattr(model, key) is not None})
    settings["view"] = model.tta[entry.names.index(name)] if model.tta else None
    # the label space, not the annotation file's path (a copy of the file elsewhere is the same dataset)
    label_space = json.dumps(sorted((categories or {}).items())).encode("utf-8")
    settings["categories"] = hashlib.sha256(label_space).hexdigest()[:16] if categories else "coco80"
    if model.type == "precomputed":  # saved predictions are often rewritten in place: their content counts
        settings["inputs"] = file_digests(saved_prediction_files(model))
    weights_digest = weights_inputs(model, weights, digests)
    if weights_digest:  # a re-exported model is often saved over the old one: its content counts too
        settings["inputs"] = weights_digest
    # JSON round trip: the form it is compared in after being saved
    return json.loads(json.dumps(settings, sort_keys=True))


def check_weights_unchanged(
    out: Path, member: str, previous: Any, settings: dict[str, Any], weights: ResolvedWeights
) -> None:
    """Refuse to resume a member whose weights are not the file its earlier run in ``out`` used (recorded in
    ``previous``, its saved settings): the same name may now find another file (rewritten in place, or
    found through another ``$DETENS_WEIGHTS`` or ``--weights-dir``), or no file at all (an upstream name,
    which would be downloaded). ``settings``: this run's, ``weights``: where its weights are now."""
    earlier = previous.get("inputs") if isinstance(previous, dict) else None
    if not isinstance(earlier, dict):
        return
    name = str(settings.get("weights"))
    if name not in earlier:  # other weights than the earlier run's: refused as changed settings
        return
    now = (settings.get("inputs") or {}).get(name)
    if now is None and not weights.local:
        raise ValueError(
            f"the weights {name!r} of {member!r} are no longer found on disk: the earlier run in {out} used a "
            f"file of that name (sha256 {earlier[name]}), and the name now finds no file, so it would be "
            f"downloaded, maybe as another file (looked at: {'; '.join(weights.tried)}); let $DETENS_WEIGHTS "
            "or --weights-dir name the folder that holds the earlier file, use another --out, or --overwrite "
            "to discard the results made with it"
        )
    if now is not None and now != earlier[name]:
        raise ValueError(
            f"the weights {name!r} of {member!r} are not the file the earlier run in {out} used: they are now "
            f"{weights.value} (sha256 {now}), the earlier run's file had sha256 {earlier[name]}; use that "
            "file again, another --out, or --overwrite to discard the results made with it"
        )


def check_saved_members(
    entries: list[Entry], data: Dataset, config: EnsembleConfig, categories: dict[int, str] | None
) -> None:
    """Build the selected ``precomputed`` members and check their saved predictions before any model
    loads, as ``detens fuse`` does: an image missing from them would stop the run in the middle, and a
    category id outside the label space would be cached without a word.

    Raises:
        ValueError: naming the member and the first missing image, or the results file, the result, its
            category id and the valid ids.
    """
    saved = [entry for entry in entries if entry.selected and entry.model.type == "precomputed"]
    for entry in saved:
        if entry.built is None:  # built once: the run uses it
            entry.built = build_detector(entry.model, config, categories)
    check_saved_predictions(
        [getattr(entry.built, "detector", entry.built) for entry in saved],  # a view's: its detector
        [data.path(i) for i in data.ids],
        sorted(categories or COCO_ID_TO_NAME),
        label_space_name(config),
    )


# ----------------------------------------------------------------------------------------------- dataset
@dataclass
class Dataset:
    gt: CocoGroundTruth
    ids: list[int]  # the ids this run covers (a shard's), sorted
    all_ids: list[int]
    fingerprint: str
    gt_path: Path  # as given: messages and records name it so

    def path(self, image_id: int) -> Path:
        return self.gt.image_path(image_id)


def gt_fingerprint(gt: CocoGroundTruth) -> str:
    """A hash of the ground truth's ``(id, file_name)`` pairs: shards of different datasets do not merge."""
    pairs = [[i, gt.file_name(i)] for i in gt.image_ids]
    return hashlib.sha256(json.dumps(pairs).encode("utf-8")).hexdigest()[:16]


def recorded_categories(gt: CocoGroundTruth) -> list[dict[str, Any]]:
    """The ground truth's categories as the cache's summary records them (COCO's ``[{"id", "name"}]``):
    ``train`` and ``evaluate`` refuse ground truth whose ids name other classes."""
    return [{"id": c, "name": name} for c, name in sorted(gt.category_names.items())]


def check_dataset_label_space(config: EnsembleConfig, categories: dict[int, str] | None, data: Dataset) -> None:
    """Refuse a ``--gt`` in another label space than the config's ``dataset``: the members' labels are
    mapped onto the dataset's ids, while the summary records ``--gt``'s categories, as which ``train`` and
    ``evaluate`` score them (a dataset's 0 = pedestrian scored as a ``--gt``'s 0 = vehicle gives a wrong
    mAP, unsaid). Names are compared as class maps compare them (case ignored, ``_`` read as a space).

    Raises:
        ValueError: naming both files and the first ids that differ.
    """
    dataset = COCO_ID_TO_NAME if categories is None else categories
    differences = label_space_differences(dataset, data.gt.category_names)
    if not differences:
        return

    shown = first_few(differences, 3, "; ", show=lambda d: describe_label_space_difference(d, "in the dataset", "in --gt"))
    raise ValueError(
        f"--gt {data.gt_path} is in another label space than the config's dataset {config.dataset}: category id "
        f"{shown}; the members' labels are mapped onto the dataset's ids and "
        "would be recorded and scored as --gt's classes: give --gt an annotation file of the dataset's categories, "
        "or set the config's dataset: to --gt's (leave it out to map onto --gt's categories)"
    )


def load_dataset(gt_path: Path, images: Path, shard: tuple[int, int] | None) -> Dataset:
    gt = load_coco_gt(gt_path, images_dir=images)
    if not images.is_dir():
        raise NotADirectoryError(f"--images {images} is not a folder")
    all_ids = gt.image_ids
    if not all_ids:
        raise ValueError(f"{gt_path} has no images")
    # each record's predictions would be scored against its own share of the file's objects
    check_one_id_per_file(((image_id, gt.file_name(image_id)) for image_id in all_ids), gt_path)
    if not any(gt.image_path(i).is_file() for i in all_ids):
        raise FileNotFoundError(
            f"none of the {len(all_ids)} images of {gt_path} is under {images} "
            f"(e.g. {gt.image_path(all_ids[0])}); check --images"
        )
    ids = all_ids if shard is None else all_ids[shard[0] :: shard[1]]
    return Dataset(gt, ids, all_ids, gt_fingerprint(gt), gt_path)


def annotation_text(gt: Any, images: Any) -> str:
    """An annotation file as messages name it: its path as its run was given it, and its image count."""
    return f"{gt} ({images} images)" if gt else f"an annotation file of {images} images (its path not recorded)"


def shards_text(indices: Sequence[int], count: int) -> str:
    return ("shard " if len(indices) == 1 else "shards ") + ", ".join(f"{i}/{count}" for i in indices)


def check_shard_annotations(out: Path, shard: tuple[int, int], data: Dataset, overwrite: bool = False) -> None:
    """Refuse shard ``shard`` on ``data`` where another shard of its split in ``out`` recorded another annotation
    file (:func:`record_shard_annotations`): their shard files would not merge, and the mistake would show only
    once every shard has run. With ``overwrite`` (the split moves to a new file, shard by shard), only warn that
    those shards must run again. Reads only.

    Raises:
        ValueError: naming both files and the shards made on the other one.
    """
    index, count = shard
    others: dict[str, list[int]] = {}
    files: dict[str, str] = {}
    for other in range(count):
        try:
            record = read_json_file(annotations_path(out, (other, count)), "shard's record of its annotation file")
        except (OSError, ValueError):
            continue  # not started, or by a version that did not record it: the merge compares its file
        fingerprint = record.get("gt_fingerprint") if isinstance(record, dict) else None
        if other == index or fingerprint in (None, data.fingerprint):
            continue
        others.setdefault(fingerprint, []).append(other)
        files.setdefault(fingerprint, annotation_text(record.get("gt"), record.get("images")))
    if not others:
        return
    made = "; ".join(f"{shards_text(indices, count)}, made on {files[f]}" for f, indices in others.items())
    this = annotation_text(data.gt_path, len(data.all_ids))
    if overwrite:
        logger.warning("%s holds %s: run %s again with --gt %s before the merge", out / SHARDS, made,
                       "it" if sum(map(len, others.values())) == 1 else "them", data.gt_path)
        return
    raise ValueError(
        f"{out / SHARDS} holds {made}; this shard's --gt {this} is another file, and the shards of a split merge "
        "only when made on the same one: give the --gt of the others, use another --out, or --overwrite to start "
        "this shard over on this file (the others then run again on it too)"
    )


def record_shard_annotations(out: Path, shard: tuple[int, int], data: Dataset, overwrite: bool = False) -> None:
    """Record the annotation file of shard ``shard`` in ``out``, checked again against the other shards' (a shard
    may have started since this one first checked them; with ``overwrite`` it has been said already). Called
    holding :func:`brief_lock`.

    Raises:
        ValueError: as :func:`check_shard_annotations`.
    """
    if not overwrite:
        check_shard_annotations(out, shard, data)
    atomic_write_json(annotations_path(out, shard),
                      {"gt": str(data.gt_path), "gt_fingerprint": data.fingerprint, "images": len(data.all_ids)})


# ----------------------------------------------------------------------------------------------- partial
def partial_dir(out: Path, member: str) -> Path:
    return out / PARTIAL / member


def partial_path(out: Path, member: str, image_id: int) -> Path:
    return partial_dir(out, member) / f"{image_id}.json"


def read_partial(
    out: Path, member: str, image_id: int, file_name: str, report: bool = False
) -> dict[str, Any] | None:
    """A finished image's record, or None: none there, a record of another file name (made on another
    ``--gt`` that numbers its images otherwise), or a damaged one, which ``report`` names in a warning with
    what is wrong (the image is then detected again, and its record written anew).

    A record is damaged when it cannot be read as JSON (cut short by a full disk, edited by hand), is not
    of the form :func:`save_finished_image` writes, or holds results that are no COCO results of its
    image (a box of NaN or of 3 numbers, a score beyond [0, 1], another image's id): taken as it is, it
    would go into the member's results file, which ``train`` and ``evaluate`` then refuse as a whole.
    """
    path = partial_path(out, member, image_id)
    try:
        record = read_record(path)
        if record is None or (record.get("file_name") != file_name and record.get("image_id") == image_id):
            return None
        if record.get("image_id") != image_id:
            raise DamagedRecord(f"image_id is {record.get('image_id')!r}, not the {image_id} of its name")
        check_milliseconds(record.get("ms", 0.0), "ms")
        check_read_warnings(record.get("read_warnings", []))
        results = checked_results(record.get("results"), "results")
        if others := sorted({r["image_id"] for r in results} - {image_id}):
            raise DamagedRecord(f"results of other images {first_few(others)}")
    except DamagedRecord as damage:
        if report:
            warn_of_damaged_record(logger, path, damage, "the image is detected again")
        return None
    return {**record, "results": results}


def check_settings(
    out: Path,
    member: str,
    settings: dict[str, Any],
    overwrite: bool,
    weights: ResolvedWeights | None,
    shard: tuple[int, int] | None = None,
) -> str | None:
    """Refuse to resume a member's partial results made with other settings, or with other input files
    (weights, saved predictions; reads only: a refused run changes nothing). ``weights``: where the
    member's weights are now (None: it reads none); ``shard``: this run's (its own lock is no other run).

    Settings recorded with no result (by a run that failed before the member's first one, such as on its
    class map) keep nothing from being lost: this run records its own over them, unless another shard
    runs on ``out``, which may be about to write results of those settings.

    Results without recorded settings (their file removed, or the folder rebuilt by a run that went on
    writing after its ``--out`` was deleted) were made with settings nothing records: refused as results of
    other settings are, and all discarded by ``overwrite``.

    Returns:
        str | None: how the settings recorded in ``out`` for ``member`` differ from ``settings``
        (``"conf: 0.001 -> 0.4"``, or :data:`UNRECORDED` for results without settings), which ``overwrite``
        discards all the results of (those of other shards and other images included: the member's settings
        are recorded once for all its partial results); None when none are recorded (and no result is kept)
        or they are the same.
    """
    saved_path = partial_dir(out, member) / SETTINGS
    if not saved_path.is_file():
        if not _holds_results(out, member):
            return None  # a member not started, or a folder left empty: a fresh start
        if not overwrite:
            raise other_settings_error(out, member, UNRECORDED, shard)
        return UNRECORDED
    saved = _read_settings(saved_path)
    if not overwrite and not _holds_results(out, member) and not running_shards(out, shard):
        return settings_difference(saved, settings)
    if not overwrite and weights is not None:  # by the configured name, which may find another file
        check_weights_unchanged(out, member, saved, settings, weights)
    elif not overwrite:  # saved predictions, by their path
        check_inputs_unchanged(out, saved, settings.get("inputs") or {})
    details = settings_difference(saved, settings)
    if details is not None and not overwrite:
        raise other_settings_error(out, member, details, shard)
    return details


def _holds_results(out: Path, member: str) -> bool:
    """Whether ``out`` keeps any finished image of ``member`` (its records stay after the cache completes)."""
    return any(finished_image_records(partial_dir(out, member)))


def recorded_difference(out: Path, member: str, settings: dict[str, Any]) -> str | None:
    """How the settings recorded in ``out`` for ``member`` differ from ``settings`` (:data:`UNRECORDED`: it
    keeps results without settings); None where they agree, or none are recorded and no result is kept."""
    saved_path = partial_dir(out, member) / SETTINGS
    if not saved_path.is_file():
        return UNRECORDED if _holds_results(out, member) else None
    return settings_difference(_read_settings(saved_path), settings)


def _read_settings(path: Path) -> Any:
    try:
        return read_json_file(path, "member's settings")
    except (OSError, ValueError):
        return None  # unreadable: other settings than any run's


def settings_difference(saved: Any, settings: dict[str, Any]) -> str | None:
    """How the recorded settings ``saved`` differ from a run's ``settings`` (``"conf: 0.001 -> 0.4"``), or
    None where they agree."""
    if isinstance(saved, dict) and "inputs" not in saved:
        # recorded before the digests were (of saved predictions, of weights): paths only. Such a cache
        # resumes on the files as they are now, whose digests are recorded from then on.
        settings = {k: v for k, v in settings.items() if k != "inputs"}
    if isinstance(saved, dict):  # caches of earlier versions recorded settings their members never read
        unread = NOT_READ_BY_TYPE.get(str(settings.get("type")), ())
        saved = {k: v for k, v in _compared_settings(saved).items() if k not in unread}
    if _by_content(saved) == _by_content(settings):
        return None
    earlier_inputs = saved.get("inputs") if isinstance(saved, dict) else None
    if isinstance(earlier_inputs, dict) and isinstance(settings.get("inputs"), dict):
        # a file whose digest an earlier version did not record (the image map of saved predictions) is
        # recorded from now on, as for a cache without digests; a recorded file that changed is refused above
        settings = {**settings, "inputs": {k: v for k, v in settings["inputs"].items() if k in earlier_inputs}}
    if saved == settings:
        return None
    saved = saved if isinstance(saved, dict) else {}
    changed = sorted(k for k in set(settings) | set(saved) if saved.get(k) != settings.get(k))
    shown = {k: f"{k}: {saved.get(k)!r} -> {settings.get(k)!r}" for k in changed}
    before, after = saved.get("inputs"), settings.get("inputs") or {}
    if "inputs" in changed and isinstance(before, dict) and isinstance(after, dict):
        if set(changed) & set(MODEL_PATH_KEYS) and all(before.get(name) == digest for name, digest in after.items()):
            # only files no longer read: another file is named instead, as its key says
            del shown["inputs"]
        else:  # file by file: a whole dict's repr read as if the new files had no digest
            files = [f"{name!r} (sha256 {before[name]}) no longer read" for name in sorted(before) if name not in after]
            files += [f"{name!r} sha256 {before.get(name)} -> {digest}" for name, digest in sorted(after.items())
                      if before.get(name) != digest]
            shown["inputs"] = f"inputs: {'; '.join(files)}"
    return ", ".join(shown.values())


def other_settings_error(
    out: Path, member: str, details: str, shard: tuple[int, int] | None, overwrite: bool = False
) -> ValueError:
    """The refusal of a run whose settings for ``member`` are not those recorded in ``out`` (``details``,
    recorded -> this run's), naming a shard that runs on ``out``. ``overwrite``: the run has ``--overwrite``
    and found other settings recorded only as it claimed the member, by a shard that started meanwhile."""
    held = f"{partial_dir(out, member)} holds results of {member!r} made with other settings ({details})"
    running = running_shards(out, shard)
    if overwrite:  # the advice to add --overwrite would be the one it followed
        held = f"{held}, recorded by another shard since this run started"
        again = "run this command again (its --overwrite then discards them)"
        if running:
            return ValueError(f"{held}; {_running_text(running[0])}: wait for it to end and {again}, "
                              "or use another --out")
        return ValueError(f"{held}: {again}, or use another --out")
    if running:
        return ValueError(f"{held}; {_running_text(running[0])}: use another --out, or wait for it to end (then "
                          "--overwrite discards them)")
    return ValueError(f"{held}; use another --out, or --overwrite to discard them")


def _running_text(holder: str) -> str:
    # Which settings a running shard writes is recorded nowhere: one that resumed or claimed the member writes
    # more results with the recorded settings, one with --overwrite that has not yet claimed it (its first
    # result) writes results of its own settings in their place, and one may run other members only.
    return (f"{holder} runs on the same --out, and may be writing more of them (or, with --overwrite, results "
            "of its own settings)")


def check_none_running(out: Path, member: str, details: str, shard: tuple[int, int] | None) -> None:
    """Refuse to discard ``member``'s results made with other settings (``details``) while another shard
    runs on ``out``: it may be writing more of them (it would go on writing them among this run's).

    Raises:
        ValueError: naming the shard.
    """
    running = running_shards(out, shard)
    if running:
        raise ValueError(
            f"--overwrite would discard every result of {member!r} in {out}, made with other settings "
            f"({details}), while {_running_text(running[0])}: wait for it to end, or use another --out"
        )


def replace_results(out: Path, run: MemberRun, output: Path, ids: list[int], shard: tuple[int, int] | None) -> None:
    """Record the member's settings; with ``--overwrite``, first remove its earlier results: ``output``
    and the partial results of ``ids``, or all of them when they were made with other settings (a later
    run on other images or shards would otherwise take them for results of these settings).

    Called holding :func:`brief_lock`: the settings recorded are compared again, since another shard may
    have recorded its own after this run checked them (with ``--overwrite``, a member records its settings
    only once its model has given a result), and results made with other settings are not discarded while
    another shard writes them.

    Raises:
        ValueError: either, naming the settings that differ and the shard.
    """
    folder = partial_dir(out, run.name)
    details = recorded_difference(out, run.name, run.settings)
    if details is not None and run.stale is None:  # recorded by a shard that started after this run checked
        raise other_settings_error(out, run.name, details, shard, overwrite=run.overwrite)
    if details is not None:
        check_none_running(out, run.name, details, shard)
    if run.overwrite:
        output.unlink(missing_ok=True)
        if details is not None:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            for image_id in ids:
                partial_path(out, run.name, image_id).unlink(missing_ok=True)
    atomic_write_json(folder / SETTINGS, run.settings, indent=2)
    run.claimed = True


# ----------------------------------------------------------------------------------------------- running
@dataclass
class MemberRun:
    name: str
    settings: dict[str, Any]
    todo: list[int]
    resumed: int
    overwrite: bool = False
    # with overwrite: how the settings of the earlier partial results differ (discarded by overwrite, all
    # of them), None where they agree; None for a run without overwrite
    stale: str | None = None
    claimed: bool = False  # its earlier results made way for this run's (see replace_results)
    weights: ResolvedWeights | None = None  # where its weights are (None: it reads none)
    processed: int = 0
    unreadable: dict[int, str] = field(default_factory=dict)


def save_finished_image(
    out: Path,
    lock: HeldLock,
    run: MemberRun,
    data: Dataset,
    image_id: int,
    results: list[dict[str, Any]],
    ms: float,
    read_warnings: Sequence[str] = (),
) -> None:
    """Write the partial record of one image that ``run``'s member has detected (atomically: with it, the
    image is done). ``read_warnings``: what reading the image warned of (:func:`~detens.sources.read_image`'s
    ``notes``), kept for the summary. It first checks that ``out`` is still the folder the run locked
    (:meth:`~detens.io.HeldLock.check`)."""
    lock.check()
    record: dict[str, Any] = {
        "image_id": image_id,
        "file_name": data.gt.file_name(image_id),
        "results": results,
        "ms": round(ms, 3),
    }
    if read_warnings:
        record["read_warnings"] = list(read_warnings)
    atomic_write_json(partial_path(out, run.name, image_id), record)
    run.unreadable.pop(image_id, None)  # unreadable on an earlier run, read now
    run.processed += 1


def run_entry(
    entry: Entry,
    runs: list[MemberRun],
    data: Dataset,
    out: Path,
    lock: HeldLock,
    config: EnsembleConfig,
    categories: dict[int, str] | None,
    max_images: int | None,
    quiet: bool,
    timing: dict[str, float],
    claim: Callable[[MemberRun], None] = lambda run: None,
) -> None:
    """Run one model (its selected views) over the images some member still needs.

    ``timing`` (``load_s``, ``read_s``, ``wall_s``) is filled in as the run goes, so that a run stopped
    part-way still records what it took. ``claim(run)`` is called once per member before its first result
    is written (and at the end for a member that got none): with ``--overwrite`` it removes the member's
    earlier results, which a run that fails to load or run the model before then thus leaves in place.
    ``lock``: the run's, checked before each result is written (see :func:`save_finished_image`).
    """
    needed_all = sorted({i for run in runs for i in run.todo})
    needed = needed_all if max_images is None else needed_all[:max_images]
    if not needed:
        for run in runs:
            claim(run)
        return
    start = time.perf_counter()
    try:
        if entry.built is None:
            entry.built = build_detector(entry.model, config, categories)
        members = entry.members()
    finally:
        timing["load_s"] = timing["wall_s"] = time.perf_counter() - start
    pending = {run.name: set(run.todo) for run in runs}
    batch = config.setting(entry.model, "batch")
    bar = tqdm(
        total=len(data.ids),
        initial=len(data.ids) - len(needed_all),
        unit="img",
        desc=entry.label,
        disable=quiet,
        dynamic_ncols=True,
    )
    try:
        for begin in range(0, len(needed), batch):
            chunk = needed[begin : begin + batch]
            arrays, ids, paths = [], [], []
            warned: dict[int, list[str]] = {}
            t = time.perf_counter()
            for image_id in chunk:
                path = data.path(image_id)
                try:
                    arrays.append(read_image(path, data.gt.image_size(image_id), warned.setdefault(image_id, [])))
                    ids.append(image_id)
                    paths.append(path)
                except ImageReadError as err:
                    logger.warning("skipped: %s", err)
                    for run in runs:
                        if image_id in pending[run.name]:
                            run.unreadable[image_id] = str(err)
            timing["read_s"] += time.perf_counter() - t
            for run in runs:
                picked = [k for k, image_id in enumerate(ids) if image_id in pending[run.name]]
                if not picked:
                    continue
                t = time.perf_counter()
                dets = detect_loaded(
                    members[run.name], [arrays[k] for k in picked], [paths[k] for k in picked]
                )
                ms = (time.perf_counter() - t) * 1000 / len(picked)
                claim(run)
                for k, det in zip(picked, dets, strict=True):
                    results = detections_to_coco(det, ids[k])
                    save_finished_image(out, lock, run, data, ids[k], results, ms, warned[ids[k]])
            bar.update(len(chunk))
        for run in runs:
            claim(run)
    finally:
        bar.close()
        timing["wall_s"] = time.perf_counter() - start


def run_entry_ray(
    entry: Entry,
    runs: list[MemberRun],
    data: Dataset,
    out: Path,
    lock: HeldLock,
    config: EnsembleConfig,
    categories: dict[int, str] | None,
    max_images: int | None,
    quiet: bool,
    options: Any,
    timing: dict[str, float],
    claim: Callable[[MemberRun], None] = lambda run: None,
) -> None:
    """:func:`run_entry` on Ray: the same partial records, written here as the actors' rows arrive, the
    same ``timing`` filled in as it goes, and the same ``claim`` before a member's first one. ``load_s``
    is the slowest actor's model load (the actors load in parallel)."""
    from detens.engines.ray_cache import detect_on_ray

    needed_all = sorted({i for run in runs for i in run.todo})
    needed = set(needed_all if max_images is None else needed_all[:max_images])
    if not needed:
        for run in runs:
            claim(run)
        return
    by_name = {run.name: run for run in runs}
    todo = {run.name: [i for i in run.todo if i in needed] for run in runs}
    start = time.perf_counter()
    bar = tqdm(
        total=len(data.ids) * len(runs),
        initial=(len(data.ids) - len(needed_all)) * len(runs),
        unit="img",
        desc=f"{entry.label} (ray)",
        disable=quiet,
        dynamic_ncols=True,
    )
    try:
        rows = detect_on_ray(
            entry.model, config, categories, todo, lambda i: str(data.path(i)),
            config.setting(entry.model, "batch"), options, size_of=data.gt.image_size,
        )
        for row in rows:
            run, image_id = by_name[row["member"]], row["image_id"]
            timing["load_s"] = max(timing["load_s"], row["load_s"])
            if row["error"]:
                logger.warning("skipped: %s", row["error"])
                run.unreadable[image_id] = row["error"]
            else:
                claim(run)
                save_finished_image(out, lock, run, data, image_id, row["results"], row["ms"], row["read_warnings"])
            bar.update(1)
        for run in runs:
            claim(run)
    finally:
        bar.close()
        timing["wall_s"] = time.perf_counter() - start


def release(entry: Entry) -> None:
    """Free a model before the next one is loaded."""
    entry.built = None
    release_memory()


def release_memory() -> None:
    """Give back the memory of the models no longer referenced (GPU memory too)."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


def collect(
    out: Path, member: str, data: Dataset
) -> tuple[list[int], list[dict[str, Any]], float, dict[str, list[str]]]:
    """The finished images of ``data.ids``, their results (by image id), the summed detection ms, and what
    reading them warned of, ``{file name: warnings}``."""
    done, results, ms, warned = [], [], 0.0, {}
    for image_id in data.ids:
        record = read_partial(out, member, image_id, data.gt.file_name(image_id))
        if record is None:
            continue
        done.append(image_id)
        results.extend(record["results"])
        ms += float(record.get("ms", 0.0))
        if record.get("read_warnings"):
            warned[record["file_name"]] = list(record["read_warnings"])
    return done, results, ms, warned


def finish_member(
    out: Path, run: MemberRun, data: Dataset, shard: tuple[int, int] | None, timing: dict[str, float],
    write_output: bool = True,
) -> dict[str, Any]:
    """Assemble the member's output when all its images are done (or unreadable); returns its summary.
    ``write_output=False``: its output is not written (the write just failed), and the member is summarized
    as not finished, whatever images are done."""
    done, results, ms, warned = collect(out, run.name, data)
    finished = set(done)
    left = [i for i in data.ids if i not in finished and i not in run.unreadable]
    complete = not left and write_output
    output = None
    if complete:
        output = member_output(run.name, shard)
        if shard is None:
            save_coco_results(results, out / output)
        else:
            shard_record = {
                "format": SHARD_FORMAT,
                "member": run.name,
                "shard": list(shard),
                "gt_fingerprint": data.fingerprint,
                "gt": str(data.gt_path),
                "dataset_image_ids": data.all_ids,
                "categories": recorded_categories(data.gt),
                "image_ids": done,
                "unreadable": [
                    {"image_id": i, "file_name": data.gt.file_name(i), "error": e}
                    for i, e in sorted(run.unreadable.items())
                ],
                "read_warnings": warned,
                "settings": run.settings,
                "seconds": round(ms / 1000, 3),
                "results": results,
            }
            atomic_write_json(out / output, shard_record)
    return {
        "status": "complete" if complete else "incomplete",
        "output": output,
        "images": len(done),
        "boxes": len(results),
        "unreadable": {data.gt.file_name(i): e for i, e in sorted(run.unreadable.items())},
        # read all the same: a JPEG decoded only in part, a TIFF of several pages, an orientation not applied
        "read_warnings": warned,
        "images_left": len(left),
        "seconds": round(ms / 1000, 3),
        "ms_per_image": round(ms / len(done), 2) if done else None,
        "processed_this_run": run.processed,
        "resumed": run.resumed,
        "wall_s_this_run": round(timing["wall_s"], 3),
        "load_s_this_run": round(timing["load_s"], 3),
        "settings": run.settings,
    }


def earlier_unreadable(path: Path, member: str, data: Dataset) -> dict[int, str]:
    """The images of ``data.ids`` that the summary at ``path`` (an earlier run's, of the same dataset) lists
    as unreadable for ``member``: ``{image_id: error}``.

    They stay listed until a run reads them: a run that does not get to them (``--max-images``, an
    interrupt) would otherwise drop them from the summary while ``<member>.json`` still lacks them, and
    ``detens evaluate`` would score them as images where every model found nothing.
    """
    try:
        previous = read_json_file(path, "cache summary")
    except (OSError, ValueError):
        return {}
    if not isinstance(previous, dict) or previous.get("gt_fingerprint") != data.fingerprint:
        return {}
    members = previous.get("models")
    entry = members.get(member) if isinstance(members, dict) else None
    files = entry.get("unreadable") if isinstance(entry, dict) else None
    if not isinstance(files, dict):
        return {}
    return {i: str(files[data.gt.file_name(i)]) for i in data.ids if data.gt.file_name(i) in files}


def check_no_results_lost(out: Path, member: str, data: Dataset, summary_path: Path, gt_path: Path) -> None:
    """Refuse a run that would drop, for good, results of the member's finished ``<member>.json`` made for
    another image set (the summary's dataset fingerprint differs): images the new ground truth does not list
    are left out of the file it writes, and an image whose record ``.partial/`` no longer holds could not be
    put back. Dropped images whose records are still there are only said (a run with the earlier ground
    truth rebuilds the file from them). Reads only.

    Raises:
        ValueError: naming the file, how many results would be lost, and the ways out.
    """
    try:
        previous = read_json_file(summary_path, "cache summary")
    except (OSError, ValueError):
        return
    if not isinstance(previous, dict) or previous.get("gt_fingerprint") in (None, data.fingerprint):
        return
    output = out / member_output(member, None)
    try:
        results = read_json_file(output, "member's results")
    except (OSError, ValueError):
        return
    if not isinstance(results, list):  # a number, a text, an object: no result in it to lose, as in an unreadable file
        return
    listed = set(data.all_ids)
    # only a whole-number id names an image whose results could be lost (a list as id would stop the set)
    dropped = sorted({r["image_id"] for r in results
                      if isinstance(r, dict) and type(r.get("image_id")) is int and r["image_id"] not in listed})
    lost = [i for i in dropped if not partial_path(out, member, i).is_file()]
    if lost:
        raise ValueError(
            f"{output} holds results of {len(lost)} images that --gt {gt_path} does not list and whose records "
            f"{PARTIAL}/ no longer keeps (image ids {first_few(lost, 5)}): this run would drop them for good. "
            "Use another --out, or --overwrite to replace them"
        )
    if dropped:
        logger.warning(
            "%s: %d images of the earlier ground truth (%s) are not in --gt %s and are left out of the file "
            "this run writes; their records stay in %s/, and a run with that ground truth puts them back",
            output, len(dropped), previous.get("gt"), gt_path, PARTIAL,
        )


def write_summary(path: Path, header: dict[str, Any], members: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Update the summary file: this run's members replace their earlier entries, the others stay."""
    try:
        previous = read_json_file(path, "cache summary")
    except (OSError, ValueError):
        previous = {}
    models = dict(previous.get("models") or {}) if isinstance(previous, dict) else {}
    if isinstance(previous, dict) and previous.get("gt_fingerprint") != header.get("gt_fingerprint"):
        models = {}  # another dataset: earlier entries do not describe these outputs
    models.update(members)
    unreadable: dict[str, str] = {}
    read_warnings: dict[str, list[str]] = {}  # each member reads the image: the same warnings, listed once
    for entry in models.values():
        unreadable.update(entry.get("unreadable") or {})
        read_warnings.update(entry.get("read_warnings") or {})
    summary = {
        **header, "models": models, "unreadable": dict(sorted(unreadable.items())),
        "read_warnings": dict(sorted(read_warnings.items())),
    }
    atomic_write_json(path, summary, indent=2)
    return summary


def cache(options: CacheOptions, shard: tuple[int, int] | None, ray: Any, lock: HeldLock) -> int:
    """A detection run: ``shard`` the run's shard (None: every image), ``ray`` the
    :class:`~detens.engines.ray_cache.RayOptions` of ``engine="ray"`` (None: the local engine), both as
    :func:`check_args` reads them from ``options``; ``lock`` the run's on ``options.out`` (:func:`cache_lock`),
    checked before each write: the folder may be moved or deleted while the run goes on."""
    config = resolve_config(options)
    data = load_dataset(options.gt, options.images, shard)
    out: Path = options.out
    out.mkdir(parents=True, exist_ok=True)
    tag = f".{shard_tag(shard)}" if shard else ""
    config_path = out / (f"{SHARDS}/config{tag}.yaml" if shard else "config.yaml")

    summary_path = out / (f"{SHARDS}/cache_summary{tag}.json" if shard else SUMMARY)
    # read back for its other members' entries, before any work: reading a pipe would wait for ever
    check_not_special_file(summary_path, "cache summary")
    categories = dataset_categories(config)
    check_dataset_label_space(config, categories, data)
    check_class_maps(config, categories)
    warn_of_class_map_slips(config, categories)
    entries = plan_entries(config, categories)
    select_members(entries, options.models)
    # written once the members have run: a file there that may not be replaced is refused before any model loads
    selected = [name for entry in entries for name in entry.selected]
    for path in (summary_path, config_path, *(out / member_output(name, shard) for name in selected)):
        check_replaceable(path, "the output", "another --out")
    check_saved_members(entries, data, config, categories)
    plans: list[tuple[Entry, list[MemberRun]]] = []
    digests: dict[str, str] = {}
    for entry in entries:
        if not entry.selected:  # its weights need not be found
            continue
        weights = resolve_model_weights(
            entry.model, config.weights_dir, config.folder, label=config.member_label(entry.model))
        runs = []
        for name in entry.selected:
            settings = member_settings(config, entry, name, categories, weights, digests)
            if options.overwrite:
                todo = list(data.ids)
            else:
                todo = [i for i in data.ids if read_partial(out, name, i, data.gt.file_name(i), report=True) is None]
            earlier = {} if options.overwrite else earlier_unreadable(summary_path, name, data)
            unreadable = {i: earlier[i] for i in todo if i in earlier}
            runs.append(
                MemberRun(
                    name, settings, todo, len(data.ids) - len(todo), options.overwrite, unreadable=unreadable,
                    weights=weights,
                )
            )
        plans.append((entry, runs))
    config_saved = False

    def claim_held(run: MemberRun) -> None:
        """Let ``run`` write into ``out`` (holding :func:`brief_lock`); only now does ``--overwrite`` remove
        the member's earlier results."""
        nonlocal config_saved
        if run.claimed:
            return
        if not config_saved and shard is not None:
            record_shard_annotations(out, shard, data, options.overwrite)
        replace_results(out, run, out / member_output(run.name, shard), data.ids, shard)
        if not config_saved:
            save_ensemble_config(config, config_path)
            config_saved = True

    def claim(run: MemberRun) -> None:
        if not run.claimed:
            lock.check()
            with brief_lock(out):
                claim_held(run)

    # Compared and recorded holding the lock, so that a shard starting at the same time finds these
    # settings or records its own first. After the checks of every member: a refused run changes nothing.
    # --overwrite waits for each member's first result, so that a run failing before it (a bad --device, a
    # missing file) loses nothing.
    with brief_lock(out):
        if shard is not None:
            check_shard_annotations(out, shard, data, options.overwrite)
        for _, runs in plans:
            for run in runs:
                if not options.overwrite and shard is None:
                    check_no_results_lost(out, run.name, data, summary_path, options.gt)
                run.stale = check_settings(out, run.name, run.settings, options.overwrite, run.weights, shard)
                if run.stale is not None:
                    check_none_running(out, run.name, run.stale, shard)
        for _, runs in plans:
            for run in runs:
                if not options.overwrite:
                    claim_held(run)

    members: dict[str, dict[str, Any]] = {}
    header = {
        "ensemble": config.name,
        "gt": str(options.gt),
        "gt_fingerprint": data.fingerprint,
        "images_dir": str(options.images),
        "images": len(data.ids),
        "image_ids": data.all_ids,  # the dataset's: evaluate refuses ground truth with images beyond them
        "categories": recorded_categories(data.gt),  # and ground truth whose ids name other classes
        "shard": f"{shard[0]}/{shard[1]}" if shard else None,
        "config": config_path.relative_to(out).as_posix(),
        "stopped_by": None,
        "software": software_versions(),  # this run's: a resumed member's earlier images may come from others
    }

    timing = {"load_s": 0.0, "read_s": 0.0, "wall_s": 0.0}  # of the model running now
    unwritten: str | None = None  # the member whose output was being written when the run stopped (a full disk)

    def summarize_stopped_run(reason: str) -> dict[str, Any] | None:
        """The summary of a run that stopped early, with every member it wrote for (the ones it stopped
        in with the time their model ran); None (nothing written) when it stopped before writing anything.
        The member whose output failed to be written is summarized as not finished, without trying again:
        the same error would lose the summary of every member."""
        if not config_saved or not lock.held():  # a folder whose lock went is no longer this run's to write in
            return None
        for _, runs in plans:
            for run in runs:
                if run.name not in members and run.claimed:
                    members[run.name] = finish_member(out, run, data, shard, timing, write_output=run.name != unwritten)
        return write_summary(summary_path, {**header, "stopped_by": reason}, members)

    session = None
    stack = contextlib.ExitStack()
    if ray is not None and plans:
        from detens.engines.ray_cache import ray_session

        session = stack.enter_context(ray_session(ray, quiet=options.quiet, address_name="--ray-address"))
    try:
        for k, (entry, runs) in enumerate(plans):
            timing.update(load_s=0.0, read_s=0.0, wall_s=0.0)
            if session is None:
                run_entry(
                    entry, runs, data, out, lock, config, categories, options.max_images, options.quiet, timing, claim
                )
            else:
                run_entry_ray(
                    entry, runs, data, out, lock, config, categories, options.max_images, options.quiet, ray, timing,
                    claim,
                )
            if k + 1 < len(plans):
                release(entry)  # before the next model is loaded
            for run in runs:
                lock.check()
                unwritten = run.name
                members[run.name] = finish_member(out, run, data, shard, timing)
                unwritten = None
    except BaseException as err:
        if is_interruption(err):
            logger.warning("interrupted: the finished images are saved; %s to resume", options.run_again)
            summary = summarize_stopped_run("interrupt")
            if summary is not None and not options.quiet:
                print_summary(out, summary, list(members), summary_path, options)
            raise_interruption(err)  # saved: the caller stops now (a script's loop too), the command with status 130
        # the finished members' unreadable images must stay listed, or evaluate would score them as empty
        try:
            from detens.engines.ray_cache import strip_ansi  # Ray colours the text of its errors

            summarize_stopped_run(strip_ansi(f"error: {type(err).__name__}: {err}"))
        except Exception as summary_err:  # the run's own error is the one to report
            logger.warning("could not record the stopped run in %s: %s", summary_path, summary_err)
        raise
    finally:
        stack.close()
    if options.max_images is not None and any(m["status"] != "complete" for m in members.values()):
        header = {**header, "stopped_by": "max_images"}
    lock.check()
    summary = write_summary(summary_path, header, members)
    if not options.quiet:
        print_summary(out, summary, list(members), summary_path, options)
    if summary["unreadable"] and not any(m["images"] for m in summary["models"].values()):
        # the summary says which files failed and why; a script must not take an empty cache for a finished one
        raise ValueError(
            f"no image could be read ({len(summary['unreadable'])} unreadable, listed in {summary_path})"
        )
    return 0


def print_summary(
    out: Path, summary: dict[str, Any], names: list[str], summary_path: Path, options: CacheOptions
) -> None:
    """Print the members' table of ``summary``, and what is left to do in the words of the caller of the
    run's ``options`` (a command, or a Python call)."""
    shard = f" shard {summary['shard']}" if summary.get("shard") else ""
    lines = [f"{summary['ensemble']}{shard}: {summary['images']} images"]
    width = max([len(n) for n in names] + [6])
    lines.append(f"  {'member':<{width}}  {'images':>7}  {'boxes':>8}  {'det s':>8}  {'img/s':>7}  status")
    for name in names:
        m = summary["models"][name]
        rate = f"{m['images'] / m['seconds']:.1f}" if m["seconds"] else "-"
        notes = [f"{m['images_left']} left"] if m["images_left"] else []
        if m.get("resumed"):  # a merge counts none: its summary has no run's counts
            notes.append(f"{m['processed_this_run']} this run, {m['resumed']} resumed")
        status = m["status"] + (f" ({'; '.join(notes)})" if notes else "")
        lines.append(
            f"  {name:<{width}}  {m['images']:>7}  {m['boxes']:>8}  {m['seconds']:>8.1f}  {rate:>7}  {status}"
        )
    lines += unreadable_lines(summary["unreadable"])
    lines += read_warning_lines(summary["read_warnings"], summary_path.name)
    if any(summary["models"][n]["status"] != "complete" for n in names):
        lines.append(f"not finished: {options.run_again} to resume")
    if summary.get("shard"):  # a shard's files are no member's results until every shard is joined
        lines.append(f"results in {out / SHARDS}/, summary {summary_path}")
        if options.command_line is None:
            merge = f"detens.cache(out={str(out)!r}, gt={summary['gt']!r}, merge=True)"
        else:
            merge = shlex.join(["detens", "cache", "merge", "--out", str(out), "--gt", str(summary["gt"])])
        lines.append(f"once every shard is done, join them: {merge}")
    else:
        lines.append(f"results in {out}/, summary {summary_path}")
    print("\n".join(lines))


# ------------------------------------------------------------------------------------------------- locks
# A run holds its lock in --out until it ends: an unsharded run and a merge LOCK_NAME, shard i/n its own
# (the shards of one split write apart, so they may run at once; the same shard twice may not). Every run
# also checks, holding BRIEF_LOCK, that no run of the other kind holds --out: a shard and an unsharded run
# (or a merge) would write one member's partial results, settings and outputs with no check on each other.
# BRIEF_LOCK is held only for moments: while a run takes its lock and looks at the others', and while it
# compares and records the members' settings, so that two runs starting at once cannot both find no
# settings recorded and each record its own.
BRIEF_LOCK = ".detens.cache.lock"
_SHARD_LOCK = re.compile(r"^\.detens\.shard-(?P<index>\d+)-of-(?P<count>\d+)\.lock$")


def shard_lock_name(shard: tuple[int, int]) -> str:
    return f".detens.{shard_tag(shard)}.lock"


@contextlib.contextmanager
def cache_lock(out: Path, shard: tuple[int, int] | None, merging: bool) -> Iterator[HeldLock]:
    """Hold ``out`` for one ``detens cache`` run (see :data:`BRIEF_LOCK`): shard ``shard``, or, for None, an
    unsharded run or (``merging``) a merge.

    Yields:
        HeldLock: the run's own lock, which a long run checks before it writes (:meth:`HeldLock.check`).

    Raises:
        ValueError: a run holds the same lock, or a run of the other kind holds ``out``, naming it.
    """
    with run_folder(out) as usable, contextlib.ExitStack() as held:
        if not usable:
            yield HeldLock(out / (LOCK_NAME if shard is None else shard_lock_name(shard)), None)
            return
        with brief_lock(out):
            if shard is None:
                lock = held.enter_context(output_lock(out, "detens cache merge" if merging else "detens cache"))
                for path in sorted(out.glob(".detens.shard-*.lock")):
                    _refuse_if_held(path, out)
            else:
                lock = held.enter_context(output_lock(out, f"detens cache --shard {shard[0]}/{shard[1]}",
                                                      shard_lock_name(shard)))
                _refuse_if_held(out / LOCK_NAME, out)
        # once the gate is open again: other runs need not wait for the look through the folders
        remove_stale_temporaries(out, (PARTIAL, SHARDS))
        yield lock


@contextlib.contextmanager
def brief_lock(out: Path) -> Iterator[None]:
    """Hold ``out/``:data:`BRIEF_LOCK`, waiting for it (its holders keep it for moments). Removed on release
    while still held: a process waiting on the old file sees it is gone and locks the new one. Where the
    platform or the file system has no locks, nothing is held, as :func:`~detens.io.output_lock` does."""
    fd = lock_descriptor(out / BRIEF_LOCK, wait=True)
    try:
        yield
    finally:
        if fd is not None:
            (out / BRIEF_LOCK).unlink(missing_ok=True)
            os.close(fd)


def lock_holder(path: Path) -> str | None:
    """Who holds the run lock at ``path`` (``detens cache --shard 0/2 (pid 12 on host, started ...)``), or
    None when no process holds it (a lock file left by a killed run holds nothing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # held
    except OSError:  # pragma: no cover - a file system without locks: no run can be told apart
        return None
    else:
        return None
    finally:
        os.close(fd)
    if (text := lock_holder_text(path)) is not None:
        return text
    match = _SHARD_LOCK.match(path.name)
    return f"detens cache --shard {match['index']}/{match['count']}" if match else "another detens cache run"


def _refuse_if_held(path: Path, out: Path) -> None:
    holder = lock_holder(path)
    if holder is not None:
        raise ValueError(
            f"{out} is in use by {holder}; a shard cannot run on the same --out as an unsharded run or a merge "
            "(both would write the same members' results): wait for it to end, or use another --out"
        )


def running_shards(out: Path, shard: tuple[int, int] | None) -> list[str]:
    """The shards other than ``shard`` that run on ``out`` now, as :func:`lock_holder` names them."""
    own = shard_lock_name(shard) if shard is not None else None
    paths = sorted(p for p in out.glob(".detens.shard-*.lock") if p.name != own)
    return [holder for holder in map(lock_holder, paths) if holder is not None]


# ------------------------------------------------------------------------------------------------- merge
class MergeError(ValueError):
    """The shards cannot be joined; the message says what is missing or inconsistent."""


def _shard_file_damage(record: dict[str, Any]) -> str | None:
    """What is wrong with the shard file ``record`` (of :data:`SHARD_FORMAT`), as :func:`finish_member` writes
    one: a key it lacks or a value not of its kind; None when nothing is."""
    def ids(value: Any) -> bool:
        return isinstance(value, list) and all(type(i) is int for i in value)

    def text(value: Any) -> bool:
        return isinstance(value, str)

    kinds = {
        "shard": (lambda v: ids(v) and len(v) == 2, "[index, count]"),
        "gt_fingerprint": (text, "a string"),
        "settings": (lambda v: isinstance(v, dict), "an object"),
        "dataset_image_ids": (ids, "a list of image ids"),
        "image_ids": (ids, "a list of image ids"),
        "unreadable": (lambda v: isinstance(v, list) and all(
            isinstance(u, dict) and type(u.get("image_id")) is int and text(u.get("file_name")) and text(u.get("error"))
            for u in v), 'a list of {"image_id", "file_name", "error"}'),
        "seconds": (is_duration, "a number of seconds >= 0"),
        "results": (lambda v: isinstance(v, list), "a list of COCO results"),
    }
    for key, (valid, expected) in kinds.items():
        if key not in record:
            return f"it lacks {key!r} ({expected})"
        if not valid(value := record[key]):
            return f"{key} must be {expected}, got {f'[{first_few(value, show=repr)}]' if isinstance(value, list) else repr(value)}"
    read_warnings = record.get("read_warnings") or {}  # none in the shard files of earlier versions
    if not isinstance(read_warnings, dict) or not all(
        isinstance(w, list) and all(text(line) for line in w) for w in read_warnings.values()
    ):
        return f"read_warnings must map file names to lists of messages, got {read_warnings!r}"
    try:
        validate_coco_results(record["results"], "results")
    except (TypeError, ValueError) as err:
        return str(err)
    return None


def merge_member(
    member: str,
    files: dict[int, Path],
    count: int,
    gt: CocoGroundTruth | None,
    gt_path: Path | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """Join one member's shards 0..count-1, checked against ``gt`` (read from ``gt_path``) where given; raises
    MergeError naming missing shards or images. A shard without its file that finished some of its images in
    ``out`` (given) is named incomplete, not missing."""
    missing_shards = [i for i in range(count) if i not in files]
    records = {}
    for index, path in sorted(files.items()):
        try:
            record = read_json_file(path, "shard file")
        except (OSError, ValueError) as err:
            raise MergeError(f"{member}: cannot read {path}: {err}") from err
        if not isinstance(record, dict) or record.get("format") != SHARD_FORMAT:
            raise MergeError(f"{member}: {path} is not a shard file of `detens cache --shard`")
        if (damaged := _shard_file_damage(record)) is not None:
            raise MergeError(f"{member}: {path} is a damaged shard file of `detens cache --shard`: {damaged}; run "
                             f"--shard {index}/{count} again")
        if record.get("member") != member or record.get("shard") != [index, count]:
            raise MergeError(
                f"{member}: {path} holds member {record.get('member')!r} shard {record.get('shard')}, "
                f"not shard {index}/{count} of {member!r} (renamed?)"
            )
        records[index] = record
    any_record = next(iter(records.values()), None)
    if any_record is None:
        raise MergeError(f"{member}: no shard files")
    by_file: dict[str, list[int]] = {}
    for index, record in records.items():
        by_file.setdefault(record["gt_fingerprint"], []).append(index)
    if len(by_file) != 1:
        made = "; ".join(f"{shards_text(ids, count)} on {_annotation_of(records[ids[0]])}" for ids in by_file.values())
        raise MergeError(
            f"{member}: the shards were made on different annotation files ({made}); re-run the odd ones with the "
            "--gt of the others"
        )
    if gt is not None and gt_fingerprint(gt) not in by_file:
        raise MergeError(
            f"{member}: the shards were made on {_annotation_of(any_record)}, not on --gt "
            f"{annotation_text(gt_path, len(gt.image_ids))}; merge with that --gt, or re-run the shards with this one"
        )
    recorded = {index: _compared_settings(record["settings"]) for index, record in records.items()}
    compared = _common_inputs(recorded)
    groups: dict[str, list[int]] = {}
    for index, settings in compared.items():
        groups.setdefault(json.dumps(settings, sort_keys=True), []).append(index)
    if len(groups) != 1:
        firsts = [compared[indices[0]] for indices in groups.values()]
        keys = sorted({k for one in firsts for k in one if any(one.get(k) != other.get(k) for other in firsts)})
        split = "; ".join(
            f"{key}: " + ", ".join(f"{compared[ids[0]].get(key)!r} in shards {ids}" for ids in groups.values())
            for key in keys
        )
        raise MergeError(
            f"{member}: the shards were made with different settings ({split}); re-run the odd ones with --overwrite"
        )
    all_ids = [int(i) for i in any_record["dataset_image_ids"]]
    problems = []
    if missing_shards:
        for index in missing_shards:
            expected = all_ids[index::count]
            left = [i for i in expected if out is None or not partial_path(out, member, i).is_file()]
            if len(left) < len(expected):  # a run of it stopped (killed, interrupted) before its file was written
                state = (f"{len(left)} of its {len(expected)} images left: {first_few(left)}" if left
                         else "every image done, its shard file not written")
                problems.append(
                    f"shard {index}/{count} is incomplete ({state}); run --shard {index}/{count} again to finish it"
                )
                continue
            problems.append(
                f"shard {index}/{count} is missing ({len(expected)} images: {first_few(expected)}); "
                f"run --shard {index}/{count}"
            )
    covered: dict[int, int] = {}
    for index, record in records.items():
        for image_id in [*record["image_ids"], *(int(u["image_id"]) for u in record["unreadable"])]:
            if image_id in covered:
                problems.append(f"image {image_id} is in shards {covered[image_id]} and {index}")
            covered[image_id] = index
    uncovered = [
        i for position, i in enumerate(all_ids) if i not in covered and position % count not in missing_shards
    ]
    if uncovered:
        problems.append(f"images in no shard: {first_few(uncovered)}")
    unknown = sorted(set(covered) - set(all_ids))
    if unknown:
        problems.append(f"shards hold images not in the annotation file: {first_few(unknown)}")
    if problems:
        raise MergeError(f"{member}: " + "; ".join(problems))
    results = [r for index in sorted(records) for r in records[index]["results"]]
    results.sort(key=lambda r: int(r["image_id"]))  # stable: each image keeps its detector order
    unreadable = {
        u["file_name"]: u["error"] for index in sorted(records) for u in records[index]["unreadable"]
    }
    read_warnings = {  # none in the shard files of earlier versions
        name: warnings for index in sorted(records) for name, warnings in (records[index].get("read_warnings") or {}).items()
    }
    return {
        "results": results,
        "read_warnings": read_warnings,
        "images": sum(len(r["image_ids"]) for r in records.values()),
        "shards": count,
        "unreadable": unreadable,
        "seconds": round(sum(float(r["seconds"]) for r in records.values()), 3),
        "settings": _all_inputs(recorded),
        "fingerprint": any_record["gt_fingerprint"],
        "annotation": _annotation_of(any_record),
        "all_ids": all_ids,
        "categories": any_record.get("categories"),  # None from shards of earlier versions
    }


def _annotation_of(record: dict[str, Any]) -> str:
    """The annotation file a shard file ``record`` was made on, as messages name it (its path is not recorded
    in the files of earlier versions)."""
    return annotation_text(record.get("gt"), len(record.get("dataset_image_ids") or []))


def _common_inputs(settings: dict[int, Any]) -> dict[int, Any]:
    """Shards' settings as they are compared: an ``inputs`` digest is compared only where two shards
    recorded different contents for the file. Shards of an earlier version, which recorded fewer digests
    (or none), merge with newer ones, as a resume of such a cache does."""
    seen: dict[str, set[str]] = {}
    for one in settings.values():
        inputs = one.get("inputs") if isinstance(one, dict) else None
        if isinstance(inputs, dict):
            for name, digest in inputs.items():
                seen.setdefault(name, set()).add(json.dumps(digest))
    split = {name for name, digests in seen.items() if len(digests) > 1}
    compared = {}
    for index, one in settings.items():
        if isinstance(one, dict) and "inputs" in one:
            inputs = one["inputs"] if isinstance(one["inputs"], dict) else {}
            one = {k: v for k, v in one.items() if k != "inputs"}
            kept = {name: digest for name, digest in inputs.items() if name in split}
            if kept:
                one["inputs"] = kept
        compared[index] = one
    return compared


def _all_inputs(settings: dict[int, Any]) -> Any:
    """The merged member's settings (the shards agree on all but the files some did not record): the first
    shard's, with the digest of every file any shard recorded, so later runs compare them all."""
    first = settings[min(settings)]
    if not isinstance(first, dict):
        return first
    inputs: dict[str, str] = {}
    for index in sorted(settings, reverse=True):
        one = settings[index]
        if isinstance(one, dict) and isinstance(one.get("inputs"), dict):
            inputs.update(one["inputs"])
    return {**first, "inputs": inputs} if inputs else first


def _by_content(settings: Any) -> Any:
    """A member's settings with each file they name and hold the digest of (``inputs``) as that digest, and
    the digests without the paths they are keyed by: the same files, named from another working directory
    (a path relative to the YAML is written as given from its folder, as an absolute path elsewhere) or
    through a link, are the same settings."""
    if not isinstance(settings, dict) or not isinstance(settings.get("inputs"), dict):
        return settings
    inputs = settings["inputs"]
    named = {key: {"sha256": inputs[settings[key]]} for key in MODEL_PATH_KEYS
             if isinstance(settings.get(key), str) and settings[key] in inputs}
    return {**settings, **named, "inputs": sorted(map(str, inputs.values()))}


def _compared_settings(settings: Any) -> Any:
    """A member's recorded settings without those no longer compared (recorded by earlier versions)."""
    if not isinstance(settings, dict):
        return settings
    return {k: v for k, v in settings.items() if k not in _NOT_COMPARED}


def merge(options: CacheOptions) -> int:
    out: Path = options.out
    check_not_special_file(out / SUMMARY, "cache summary")  # read back for its other members' entries
    folder = out / SHARDS
    found: dict[str, dict[int, dict[int, Path]]] = {}  # member → count → index → file
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        match = _SHARD_FILE.match(path.name)
        if match is None or match.group("member") == "cache_summary" or path.name.startswith("."):
            continue  # a shard's summary, or its record of its annotation file (ANNOTATIONS)
        member, index, count = match.group("member"), int(match.group("index")), int(match.group("count"))
        found.setdefault(member, {}).setdefault(count, {})[index] = path
    if not found:
        raise FileNotFoundError(f"no shard files (<member>.shard-<i>-of-<n>.json) in {folder}")
    if options.models is not None:
        wanted = model_patterns(options.models, sorted(found))
        found = {m: v for m, v in found.items() if any(fnmatch.fnmatchcase(m, p) for p in wanted)}
        if not found:
            raise ValueError(f"--models {options.models!r} matches no member with shards in {folder}")
    gt = load_coco_gt(options.gt) if options.gt is not None else None
    merged, errors = {}, []
    for member, by_count in sorted(found.items()):
        if len(by_count) > 1:
            errors.append(
                f"{member}: shards of different splits ({', '.join(f'n={n}' for n in sorted(by_count))}) in {folder}; "
                "keep one split"
            )
            continue
        count, files = next(iter(by_count.items()))
        try:
            merged[member] = merge_member(member, files, count, gt, options.gt, out)
        except MergeError as err:
            errors.append(str(err))
    by_file: dict[str, list[str]] = {}
    for member, m in merged.items():
        by_file.setdefault(m["fingerprint"], []).append(member)
    if len(by_file) > 1:  # one summary describes every member's images: they must be one file's
        made = "; ".join(f"{', '.join(names)} on {merged[names[0]]['annotation']}" for names in by_file.values())
        errors.append(
            f"the members were made on different annotation files ({made}); re-run the odd ones' shards with the "
            "--gt of the others, or merge each group into its own --out (--models)"
        )
    if errors:
        raise MergeError(f"cannot merge the shards in {folder}: " + " | ".join(errors))
    members = {}
    for member, m in merged.items():
        save_coco_results(m["results"], out / f"{member}.json")
        members[member] = {
            "status": "complete",
            "output": f"{member}.json",
            "images": m["images"],
            "boxes": len(m["results"]),
            "unreadable": dict(sorted(m["unreadable"].items())),
            "read_warnings": dict(sorted(m["read_warnings"].items())),
            "images_left": 0,
            "seconds": m["seconds"],
            "ms_per_image": round(1000 * m["seconds"] / m["images"], 2) if m["images"] else None,
            "shards": m["shards"],
            "settings": m["settings"],
        }
    first = next(iter(merged.values()))
    configs = sorted(folder.glob("config.shard-*.yaml"))
    if configs:  # the shards' configs differ at most in device and batch
        atomic_write_text(out / "config.yaml", configs[0].read_text(encoding="utf-8"))
    header = {
        "ensemble": _ensemble_name(configs),
        "gt": str(options.gt) if options.gt is not None else None,
        "gt_fingerprint": first["fingerprint"],
        "images_dir": None,
        "images": len(first["all_ids"]),
        "image_ids": first["all_ids"],
        "categories": first["categories"],
        "shard": None,
        "config": "config.yaml" if configs else None,
        "merged_from": f"{SHARDS}/",
        "software": software_versions(),  # the merging run's; each shard's own are in its summary
    }
    summary = write_summary(out / SUMMARY, header, members)
    if not options.quiet:
        print_summary(out, summary, list(members), out / SUMMARY, options)
    return 0


def _ensemble_name(configs: list[Path]) -> str:
    for path in configs:
        try:
            return str((parse_yaml(path.read_text(encoding="utf-8")) or {}).get("name", "ensemble"))
        except (OSError, yaml.YAMLError):
            continue
    return "ensemble"




# ------------------------------------------------------------------------------------------------- main
def run(options: CacheOptions) -> int:
    """Cache the members' detections, or merge the shards of earlier runs; returns 0 when done.

    Raises:
        KeyboardInterrupt: a Ctrl-C, once the finished images and the summary of the stopped run are saved
            (the same run again resumes).
        UsageError: options that do not go together (see :func:`check_args`).
        ValueError: among others, a run that could read none of its images (after its summary, which lists
            them, is written); a run whose lock file went while it wrote (its folder moved or deleted), before
            it writes again.
    """
    merging, shard, ray = check_args(options)
    check_writable_folder(options.out, "--out")
    with cache_lock(options.out, shard, merging) as lock:
        if merging:
            return merge(options)
        return cache(options, shard, ray, lock)
