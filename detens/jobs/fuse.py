"""The job of ``detens fuse``: run an ensemble on images and fuse its detections into ``--out``, resuming an
unfinished run (the command's help page, :mod:`detens.cli.fuse`, says what is written and what is refused)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from tqdm import tqdm

from detens.adapters import (
    build_ensemble,
    check_class_maps,
    dataset_categories,
    declared_member_names,
    label_space_name,
)
from detens.catalogue import ASSETS_SOURCE, DEFAULT_ENSEMBLE
from detens.checks import first_few
from detens.coco import check_one_id_per_file, load_coco_gt
from detens.config import config_differences, dump_yaml, parse_yaml, read_yaml_file
from detens.engines.fusing import (
    FuseSettings,
    detect_batch,
    fuse_image,
    fusion_params,
    time_first_call,
    weights_of,
)
from detens.ensemble_config import (
    EnsembleConfig,
    FusionConfig,
    check_member_name,
    load_ensemble_config,
    save_ensemble_config,
    with_absolute_paths,
    with_real_paths,
)
from detens.fusers import check_method, head_methods
from detens.heads._io import find_head_file
from detens.io import (
    HeldLock,
    atomic_json_list,
    atomic_write_bytes,
    atomic_write_json,
    check_not_special_file,
    check_replaceable,
    check_writable_folder,
    json_list_items,
    name_within_limit,
    output_lock,
    output_stems,
    path_as_written,
    read_json_file,
)
from detens.jobs._engine import EngineOptions, ray_options
from detens.jobs._inputs import (
    check_inputs_unchanged,
    check_saved_predictions,
    input_fingerprints,
    read_warning_lines,
    saved_prediction_members,
    unreadable_lines,
)
from detens.jobs._interrupts import RESUME_ADVICE, ctrl_c_held, is_interruption, raise_interruption
from detens.jobs._options import (
    existing_folder,
    file_or_shipped_name,
    flag,
    folder,
    input_path,
    integer,
    number,
    text,
)
from detens.jobs._records import (
    DamagedRecord,
    check_milliseconds,
    check_read_warnings,
    checked_results,
    read_record,
    warn_of_damaged_record,
)
from detens.labels import COCO_CATEGORY_IDS, COCO_ID_TO_NAME
from detens.sources import ImageReadError, list_images, read_image

__all__ = [
    "FuseOptions", "OUTPUT_NAMES", "RUN_RECORD", "check_heads_label_space",
    "check_output_folder", "check_resume", "image_ids", "method_label", "plan_image_ids", "process_image",
    "resolve_config", "resolve_source", "run", "write_image", "write_outputs",
]

logger = logging.getLogger("detens.fuse")

# The unfinished run's own record, beside partial/ rather than in it: any name there is the record of
# the image of that name (partial/<name>.json) or a folder of images, as a file given directly keeps its
# name whatever its extension. Removed with partial/ when the run completes.
RUN_RECORD = "unfinished_run.json"
# Where earlier versions kept it, which an image named _run shares: still read, when it is no image's.
EARLIER_RUN_RECORD = "partial/_run.json"
# The name of a folder in partial/ that could be a record's: it gets a "_" more (see partial_path).
_RECORD_LIKE = re.compile(r".*\.json_*", re.IGNORECASE | re.DOTALL)
# Outputs that --overwrite removes (never anything else in --out).
OUTPUT_NAMES = (
    "partial", RUN_RECORD, "labels", "vis", "per_model", "predictions.json", "images.json", "summary.json",
    "config.yaml",
)
# Where --overwrite keeps the earlier outputs until the new run has its first result, with the list of
# what it moved there (SET_ASIDE); renamed to REPLACED_REMOVING before it is deleted, so that a run killed
# while deleting it leaves no half of it that the next run would take for earlier outputs to restore.
REPLACED = ".replaced"
SET_ASIDE = "_set_aside.json"
REPLACED_REMOVING = ".replaced.removing"
# partial/ is built here and renamed into place, and renamed here before it is deleted: a run killed
# half-way through either leaves a whole partial/ or none, never one that lacks finished images.
UNPACKING = ".partial.unpacking"
REMOVING = ".partial.removing"
# What fuse_image appends to an image's output stem: labels/<stem>.txt, vis/<stem>.jpg.
STEM_SUFFIXES = (".txt", ".jpg")
# Folders of a run's own work beside its outputs (never read as input, searched for stale temporaries).
WORK_FOLDERS = (REPLACED, REPLACED_REMOVING, UNPACKING, REMOVING)


@dataclasses.dataclass(kw_only=True)
class FuseOptions(EngineOptions):
    """The options of ``detens fuse``; those that say so replace the config's value when given.

    Attributes:
        config (str): a shipped ensemble name or an ensemble YAML.
        source (str): an image, a folder (recursive), a glob, or ``ultralytics-assets`` (Ultralytics' sample
            images).
        out (Path): the output folder (created; a rerun resumes).
        method (str | None): a fusion method or head type (overrides ``fusion.method``).
        head (str | None): a trained head file, or a shipped head's name; implies its type (overrides
            ``fusion.head``).
        save_per_model (bool): also save each member's own predictions.
        conf (float | None): minimum detection score of every model (overrides ``conf``).
        imgsz (int | None): inference size of every model (overrides ``imgsz``).
        device (str | None): device of every model: ``cpu``, ``cuda``, ``cuda:0`` ... (overrides ``device``).
        batch (int | None): images per detector call (overrides ``batch``).
        weights_dir (str | None): the folder that weights names are relative to (overrides ``weights_dir``).
        vis_conf (float | None): minimum score of drawn boxes (overrides ``output.vis_conf``).
        no_vis (bool): do not write ``vis/``.
        no_labels (bool): do not write ``labels/``.
        overwrite (bool): discard earlier results in ``out`` instead of resuming.
    """

    job = "fuse"
    call = "fuse_images"

    config: str = input_path(DEFAULT_ENSEMBLE)
    source: str = input_path(required=True)
    out: Path = folder(required=True)
    method: str | None = text()
    head: str | None = input_path()
    save_per_model: bool = flag()
    conf: float | None = number()
    imgsz: int | None = integer()
    device: str | None = text()
    batch: int | None = integer()
    weights_dir: str | None = existing_folder()
    vis_conf: float | None = number()
    no_vis: bool = flag()
    no_labels: bool = flag()
    overwrite: bool = flag()


# ------------------------------------------------------------------------------------------------ config
def resolve_config(options: FuseOptions) -> EnsembleConfig:
    """The config file with the flags applied (a flag given for every model also replaces each model's
    own value). ``--head`` without ``--method`` runs the head's own type; ``--method`` without ``--head``
    drops the config's head unless the method is the config's own or ``theta`` (which runs any head)."""
    # an empty --head (an unset shell variable) is refused, not taken for the config's own head
    given = file_or_shipped_name("--head", options.head)
    head = str(find_head_file(given).resolve()) if given is not None else None
    per_model = {
        "conf": options.conf, "imgsz": options.imgsz, "device": options.device, "batch": options.batch
    }
    overrides: dict[str, Any] = {
        "weights_dir": options.weights_dir,
        "fusion.method": options.method,
        "fusion.head": head,
        "output.save_per_model": True if options.save_per_model else None,
        "output.vis": False if options.no_vis else None,
        "output.labels": False if options.no_labels else None,
        "output.vis_conf": options.vis_conf,
    }
    if options.method is not None:  # before anything is said of it
        check_method(options.method)
    config = load_ensemble_config(file_or_shipped_name("--config", options.config), overrides, per_model)
    if head is None and options.method is not None and config.fusion.head is not None:
        if options.method not in (_method_in_file(config), "theta"):
            # The YAML's head belongs to the YAML's method; another --method does not use it.
            logger.info("--method %s: not using the config's head %s", options.method, config.fusion.head)
            config.fusion.head = None
    if head is None and config.fusion.head is not None:
        try:
            find_head_file(config.fusion.head)
        except FileNotFoundError as err:  # said of the YAML: its user finds the key to change
            raise FileNotFoundError(f"{options.config}: fusion.head: {err}{_only_here(config)}") from None
    if head is not None and options.method is None:
        from detens.fusers.theta import load_cached_head

        # the method that runs it, as the config names it: a calibrated deep head runs as deep
        config.fusion.method = head_methods(load_cached_head(head))[-1]
    return config


def _method_in_file(config: EnsembleConfig) -> Any:
    """The ``fusion.method`` that ``config``'s YAML gives, which ``--method`` replaced in ``config`` (the
    default method where the YAML gives none). Only the key is read: loading the YAML again without the flags
    would refuse what they make whole, such as relative weights that only ``--weights-dir`` finds."""
    fusion = read_yaml_file(config.source, "ensemble config").get("fusion") or {}
    return fusion.get("method", FusionConfig.method)


def _only_here(config: EnsembleConfig) -> str:
    """What to add when the YAML's missing ``fusion.head``, as written, names a file in the working directory
    (where earlier versions looked): a YAML's relative paths are its folder's wherever the command runs."""
    if config.folder is None or config.fusion.head is None:
        return ""
    written = Path(os.path.relpath(config.fusion.head, Path(config.folder).resolve()))
    if not written.is_file():
        return ""
    return (f"; the file {written.absolute()} in the working directory is not looked at (a YAML means the same "
            "files wherever the command runs): give its path relative to the YAML, or an absolute path, or --head")


def check_heads_label_space(
    config: EnsembleConfig, params: dict[str, Any], categories: dict[int, str] | None
) -> None:
    """Refuse a head (or ``calibration``) with per-class parameters for a category id the run's label space
    lacks or names otherwise than the label space the head records: it was trained on another label space,
    whose ids mean other classes (a COCO head's 5, airplane, would fuse a dataset's 5, vehicle, with
    airplane's weights). See :func:`detens.heads.check_head_label_space`. One without per-class parameters
    is accepted, with a warning where the label space it records differs
    (:func:`detens.heads.warn_of_class_agnostic_head_label_space`).

    Raises:
        ValueError: naming the head, the offending ids and the label space.
    """
    from detens.heads import check_head_label_space, load_head, warn_of_class_agnostic_head_label_space

    names = categories if categories is not None else COCO_ID_TO_NAME
    for key, where in (("head", config.fusion.head), ("calibration", params.get("calibration"))):
        head = params.get(key)
        if isinstance(head, (str, Path)):
            head = load_head(head)
        if head is not None:
            check_head_label_space(head, names, f"{key} {str(where)!r}", label_space_name(config))
            warn_of_class_agnostic_head_label_space(head, names, f"{key} {str(where)!r}", label_space_name(config))


def method_label(config: EnsembleConfig, params: dict[str, Any]) -> str:
    """What ran: the fuser, or the head's type for a head (the wrapped head's for a calibrated one)."""
    head = params.get("head")
    return (head_methods(head) or [config.fusion.method])[-1] if head is not None else config.fusion.method


# ------------------------------------------------------------------------------------------------ images
def resolve_source(source: str) -> tuple[list[Path], Path]:
    """The images and the folder their output names are relative to."""
    if source == ASSETS_SOURCE and not Path(source).exists():
        import importlib.util

        spec = importlib.util.find_spec("ultralytics")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("--source ultralytics-assets needs the ultralytics package")
        source = str(Path(next(iter(spec.submodule_search_locations))) / "assets")
    path = path_as_written(source)
    images = list_images(source)
    if path.is_dir():
        root = path
    elif images:
        root = Path(os.path.commonpath([str(p.parent.absolute()) for p in images]))
    else:
        root = path.parent
    return images, root


def relative_name(path: Path, root: Path) -> str:
    try:
        return path.absolute().relative_to(root.absolute()).as_posix()
    except ValueError:
        return path.name


# ----------------------------------------------------------------------------------------------- partial
def partial_path(out: Path, name: str) -> Path:
    """Where the partial record of the image ``name`` goes: ``partial/<name>.json``, with a ``_`` appended to
    each folder of ``name`` whose own name ends as a record's does (``.json``, then any ``_``): the record of
    ``x.png`` and the folder ``x.png.json/`` of other images would otherwise share a path. A name that the
    added ``.json`` (or ``_``) makes longer than a file system takes is cut short, ending in ``~`` and a
    digest of the whole (:func:`~detens.io.name_within_limit`); the record names its image itself
    (``file_name``), which is how a run finds its images' records (:func:`finished_records`)."""
    return _record_path(out / "partial", name)


def _record_path(folder: Path, name: str) -> Path:
    *parents, last = name.split("/")
    # an appended "_" is undone by no other folder's: one that already ends in ".json_" gets one more too
    parents = [name_within_limit(part, "_") if _RECORD_LIKE.fullmatch(part) else part for part in parents]
    return folder.joinpath(*parents, name_within_limit(last, ".json"))


def _partial_paths(out: Path, name: str) -> tuple[Path, ...]:
    """:func:`partial_path`, then ``partial/<name>.json``, where earlier versions put every record (read still:
    a run they left unfinished resumes)."""
    return tuple(dict.fromkeys((partial_path(out, name), out / "partial" / f"{name}.json")))


def read_partial(out: Path, name: str, checked: bool = False) -> dict[str, Any] | None:
    """The partial record of the image ``name``: the first of :func:`_partial_paths` that holds a sound record
    of it (:func:`checked_record`); None where none does. ``checked``: the record was found sound as the run
    started (:func:`finished_records`), and is read back without checking its boxes once more, which would
    cost as much as reading it again several times over."""
    for path in _partial_paths(out, name):
        with contextlib.suppress(DamagedRecord):  # named as the run started (finished_records)
            record = _read_own_record(path, out) if checked else checked_record(path, out)
            if record is not None and record["file_name"] == name:
                return record
    return None


def _read_own_record(path: Path, out: Path) -> dict[str, Any] | None:
    """The record at ``path`` with the file name of the image whose record that path is; None where there
    is none (:func:`checked_record` without its checks of the record's content)."""
    record = read_record(path)
    if record is not None and _recorded_image(record, path, out) is None:
        raise DamagedRecord(f"file_name is {record.get('file_name')!r}, not the image whose record is at this path")
    return record


def checked_record(path: Path, out: Path) -> dict[str, Any] | None:
    """The partial record at ``path`` in ``out``, as :func:`~detens.engines.fusing.fuse_image` (or
    :func:`unpack_finished_run`) wrote it; None where there is none.

    Raises:
        DamagedRecord: it cannot be read as JSON, is not of that form (a key missing or of another type, the
            record of another image than the one whose record ``path`` is), or holds boxes that are no COCO
            results (a NaN box, a box of 3 numbers, a score beyond [0, 1]), saying which.
    """
    record = _read_own_record(path, out)
    if record is not None:
        check_record_content(record)
    return record


def check_record_content(record: dict[str, Any]) -> None:
    """Raise :class:`DamagedRecord` unless ``record`` holds what a partial record holds (see
    :func:`checked_record`), its file name aside."""
    for key in ("height", "width"):
        if key not in record:
            raise DamagedRecord(f"{key} is missing")
        if type(record[key]) is not int or record[key] < 1:
            raise DamagedRecord(f"{key} must be the image's {key} in pixels, got {record[key]!r}")
    if "image_id" in record and type(record["image_id"]) is not int:
        raise DamagedRecord(f"image_id must be a whole number, got {record['image_id']!r}")
    if "output_stem" in record and not _stays_in_its_folder(record["output_stem"]):
        # its files go to labels/<stem>.txt and vis/<stem>.jpg: a stem that leaves those folders writes elsewhere
        raise DamagedRecord(f"output_stem must be a path within the output folders, got {record['output_stem']!r}")
    _check_boxes(record.get("fused"), "fused")
    per_model = record.get("per_model", {})
    if not isinstance(per_model, dict):
        raise DamagedRecord(f"per_model must map each member to its results, got {type(per_model).__name__}")
    for member, found in per_model.items():
        _check_boxes(found, f"per_model[{member!r}]")
    times = record.get("times_ms", {})
    if not isinstance(times, dict):
        raise DamagedRecord(f"times_ms must map each stage to its milliseconds, got {type(times).__name__}")
    for stage, ms in times.items():
        check_milliseconds(ms, f"times_ms[{stage!r}]")
    check_read_warnings(record.get("read_warnings", []))


def _stays_in_its_folder(stem: Any) -> bool:
    path = PurePosixPath(stem) if isinstance(stem, str) and stem else None
    return path is not None and not path.is_absolute() and ".." not in path.parts


def _check_boxes(results: Any, where: str) -> None:
    """Raise :class:`DamagedRecord` unless ``results`` are COCO results without their ``image_id`` (a record
    holds one image's, whose id the run gives it when it writes them)."""
    if not isinstance(results, list):
        raise DamagedRecord(f"{where} must be a list of results, got {type(results).__name__}")
    checked_results([{**r, "image_id": 0} if isinstance(r, dict) else r for r in results], where)


def check_resume(out: Path, config: EnsembleConfig, overwrite: bool) -> None:
    """Refuse to mix results of another config into ``out`` (``--overwrite`` removes ours instead);
    reads only, so a refused or failing run leaves the folder as it was."""
    if overwrite:
        return
    saved = out / "config.yaml"
    if saved.is_file() and (has_unfinished_run(out) or (out / "predictions.json").is_file()):
        previous = read_yaml_file(saved, "saved run config")
        # read back as `previous` was: as save_ensemble_config writes it, or, for a folder of an earlier
        # version, which wrote the paths as the config gave them, so
        current = [parse_yaml(dump_yaml(_config_dict(c))) for c in (with_absolute_paths(config), config)]
        if with_real_paths(previous) not in [with_real_paths(c) for c in current]:
            changed = config_differences(previous, current[0])
            raise ValueError(
                f"{out} holds results of a different config ({first_few(changed, 5, '; ') or 'see ' + str(saved)}); "
                "use another --out, or --overwrite to discard them"
            )


def has_unfinished_run(out: Path) -> bool:
    """Whether ``out`` holds what an unfinished run writes before its summary: its run record (before
    its first result) or its finished images."""
    return (out / RUN_RECORD).is_file() or (out / "partial").is_dir()


def is_run_folder(out: Path) -> bool:
    """Whether ``out`` holds a detens fuse run: its config and its results, finished or not, or the run
    record alone (written before the config, a run killed between the two left it so)."""
    if (out / RUN_RECORD).is_file():
        return True
    return (out / "config.yaml").is_file() and ((out / "summary.json").is_file() or has_unfinished_run(out))


def check_output_folder(out: Path) -> None:
    """Refuse an ``out`` whose ``labels/``, ``vis/``, ... no detens run wrote: a run would write over them
    (and ``--overwrite`` delete them); and an earlier run's output file that may not be replaced
    (:func:`~detens.io.check_replaceable`), which the run would find only when it sets the file aside
    (``--overwrite``) or writes it, once every image is fused. An ``out`` that is a file is refused earlier,
    by ``--out``'s type (:func:`~detens.jobs._options.check_folder`)."""
    if not out.is_dir():
        return
    if not is_run_folder(out):
        foreign = [name for name in OUTPUT_NAMES if (out / name).exists()]
        if foreign:
            raise ValueError(
                f"--out {out} already holds {', '.join(foreign)}, which no detens fuse run wrote there (it has no "
                f"{RUN_RECORD}, nor config.yaml with summary.json or partial/); choose another --out"
            )
    for name in OUTPUT_NAMES:
        check_replaceable(out / name, "the output", "another --out")


def _remove(target: Path) -> None:
    if target.is_dir():
        shutil.rmtree(target)
    elif target.exists():
        target.unlink()


def clear_outputs(out: Path) -> None:
    """Remove what a run writes into ``out`` (never anything else)."""
    for item in (*OUTPUT_NAMES, REPLACED, REPLACED_REMOVING):
        _remove(out / item)


def set_aside_outputs(out: Path) -> None:
    """``--overwrite``: move the earlier run's outputs into ``out/REPLACED`` (renames: instant, nothing
    lost), from where :func:`restore_outputs` puts them back if the new run fails before its first result.

    The list of what moves is written first (``REPLACED/SET_ASIDE``): a restore cut short and resumed
    needs it to tell the earlier outputs in ``out`` (not moved yet, or back already) from the new run's.
    """
    items = [item for item in OUTPUT_NAMES if (out / item).exists()]
    if not items:
        return
    aside = out / REPLACED
    aside.mkdir()  # an earlier run's was restored or removed first, under the lock (recover_replaced)
    atomic_write_json(aside / SET_ASIDE, {"moved": items, "restoring": False})
    for item in items:
        (out / item).rename(aside / item)


def restore_outputs(out: Path) -> None:
    """Undo :func:`set_aside_outputs`: what the failed run wrote goes, the earlier outputs come back.

    Killed at any step, it is run again (by :func:`recover_replaced`) and ends as if it had not been: the
    decision to restore is recorded before anything moves, and an output goes only while the earlier
    one that replaces it is still aside, or when the earlier run had none of that name.
    """
    aside = out / REPLACED
    if not aside.is_dir():
        return
    state = _read_json(aside / SET_ASIDE)
    if isinstance(state, dict) and isinstance(state.get("moved"), list):
        moved = [item for item in state["moved"] if item in OUTPUT_NAMES]
    else:
        # a version that kept no list (it moved everything before writing anything), or a run killed
        # between creating the folder and writing the list (it moved nothing, and wrote nothing)
        moved = [item for item in OUTPUT_NAMES if (aside / item).exists()]
        if not moved:
            discard_replaced(out)
            return
        if "config.yaml" not in moved:
            # that version moved in OUTPUT_NAMES' order, config.yaml (every run folder's) last: killed
            # before it, it had written nothing, and what is in out is the earlier outputs it had not moved
            moved = list(OUTPUT_NAMES)
    if not (isinstance(state, dict) and state.get("restoring") is True):
        atomic_write_json(aside / SET_ASIDE, {"moved": moved, "restoring": True})
    for item in OUTPUT_NAMES:
        if item not in moved:
            _remove(out / item)  # the failed run's: the earlier run had none
        elif (aside / item).exists():
            _remove(out / item)  # the failed run's: the earlier one is still aside
            (aside / item).rename(out / item)
    discard_replaced(out)


def discard_replaced(out: Path) -> None:
    """Delete ``out/REPLACED``: renamed out of the way first, as one step, then deleted."""
    if (out / REPLACED).is_dir():
        _discard_removing(out)
        removing = out / REPLACED_REMOVING
        if removing.exists():
            # what an earlier deletion left (a file held open on a network mount) keeps the name: this one
            # goes inside it, where nothing reads it either, rather than failing every run from now on
            removing = removing / f"{REPLACED}-{time.time_ns()}"
        (out / REPLACED).rename(removing)
    _discard_removing(out)


def _discard_removing(out: Path) -> None:
    # what cannot be deleted (permissions) is left for the next run: nothing reads it
    if (out / REPLACED_REMOVING).exists():
        shutil.rmtree(out / REPLACED_REMOVING, ignore_errors=True)


def has_finished_image(out: Path) -> bool:
    """Whether ``out/partial/`` holds the record of a finished image."""
    folder = out / "partial"
    return folder.is_dir() and any(
        path != out / EARLIER_RUN_RECORD or is_image_record(path, out) for path in folder.rglob("*.json")
    )


def is_image_record(path: Path, out: Path) -> bool:
    """Whether ``path`` holds the partial record of an image, at that image's own path (an earlier
    version's run record at ``partial/_run.json`` names no image)."""
    return _recorded_image(_read_json(path), path, out) is not None


def _recorded_image(record: Any, path: Path, out: Path) -> str | None:
    """The name of the image whose partial record ``record`` (read from ``path``) is, at that image's own
    path; None for anything else."""
    name = record.get("file_name") if isinstance(record, dict) else None
    return name if isinstance(name, str) and path in _partial_paths(out, name) else None


def earlier_run_record(out: Path) -> Any:
    """The record of the run that left ``out``: an unfinished run's (:data:`RUN_RECORD`, or that of an
    earlier version in ``partial/``, unless an image's record has replaced it there), else the summary of
    a complete or interrupted one; None when there is none."""
    record = _read_json(out / RUN_RECORD)
    if not record:
        earlier = _read_json(out / EARLIER_RUN_RECORD)
        record = None if _recorded_image(earlier, out / EARLIER_RUN_RECORD, out) is not None else earlier
    return record or _read_json(out / "summary.json")


def recover_replaced(out: Path) -> None:
    """Finish, before anything else, what an ``--overwrite`` run that was killed (``kill -9``, a crash)
    left in ``out/REPLACED``, as it would have done itself had it failed: with no finished image yet, the
    earlier outputs come back (:func:`restore_outputs`); with one, the new run stands and they go. A
    restore cut short goes on. The caller holds the output lock, so the run that left them has ended."""
    _discard_removing(out)  # its deletion was cut short: it was decided
    aside = out / REPLACED
    if not aside.is_dir():
        return
    state = _read_json(aside / SET_ASIDE)
    restoring = isinstance(state, dict) and state.get("restoring") is True
    # killed before partial/ (moved first) was: the finished images in out are the earlier run's
    moved = state.get("moved") if isinstance(state, dict) else None
    earlier_in_place = isinstance(moved, list) and "partial" in moved and not (aside / "partial").exists()
    if not restoring and not earlier_in_place and has_finished_image(out):
        discard_replaced(out)
        logger.info("%s: removed the earlier outputs in %s/, which a killed run with --overwrite had "
                    "replaced (it has finished images, which stand)", out, REPLACED)
    else:
        restore_outputs(out)
        logger.warning("%s: a run with --overwrite was killed before its first result: the earlier outputs "
                       "it had set aside in %s/ are back", out, REPLACED)


#: The keys of a partial record that hold its boxes, which :func:`write_outputs` reads from the file.
_RESULT_KEYS = ("fused", "per_model")


def finished_records(out: Path, listed: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """The partial record of every finished image in ``out``, by file name (images of earlier runs on
    other sources included), without its boxes (:data:`_RESULT_KEYS`): a run holds these while it runs, and
    a folder's worth of boxes would take gigabytes.

    A damaged record (:func:`checked_record`) is named in a warning with what is wrong, and left out: its
    image is fused again where it is one of ``listed`` (the run's images), and is otherwise missing from
    the outputs, as the warning says."""
    records = {}
    folder = out / "partial"
    listed_paths = {path for name in listed for path in _partial_paths(out, name)}
    for path in sorted(folder.rglob("*.json")) if folder.is_dir() else []:
        if not path.is_file():  # a folder of images (an earlier version's partial/<folder>.json/)
            continue
        if path == out / EARLIER_RUN_RECORD and not is_image_record(path, out):
            continue  # an earlier version's run record, which names no image
        try:
            record = checked_record(path, out)
        except DamagedRecord as damage:
            then = ("the image is fused again" if path in listed_paths else
                    "its image, not in --source, is left out of the outputs: fuse it again from a --source that has it")
            warn_of_damaged_record(logger, path, damage, then)
            continue
        if record is not None:
            records[record["file_name"]] = {k: v for k, v in record.items() if k not in _RESULT_KEYS}
    return records


def unpack_finished_run(out: Path) -> int:
    """A complete run has no ``partial/``: write its images back as partial records from
    ``images.json``, ``predictions.json`` (and ``per_model/``), so that a rerun adds new images only.
    Returns the number of images unpacked. The records go to a staging folder, renamed into place once every
    file is read and every record checked: a refused run leaves no ``partial/``.

    Raises:
        ValueError: naming the file and what is wrong with it: one of ``images.json`` and ``predictions.json``
            is there without the other, or one of these or of ``per_model/`` cannot be read (cut short, not
            JSON, ...) or is not as a run writes it (an image without its id, file name or size, a result without
            a whole-number ``image_id``, or of an image ``images.json`` does not list, an image whose record
            would be damaged: :func:`check_record_content`). Taken as absent, or as damaged records, the run's
            images that ``--source`` does not give would be gone from the outputs the rerun writes.
    """
    if (out / "partial").is_dir():
        return 0
    staging = out / UNPACKING
    _remove(staging)  # what a run killed while unpacking left
    if not any((out / name).exists() for name in ("images.json", "predictions.json")):
        return 0
    images = _listed_images(out)
    listed = {image["id"] for image in images}
    # the results are read an image at a time from their text, as write_outputs wrote them: as objects all
    # at once, a large run's boxes would take gigabytes
    results = _results_by_image(out, out / "predictions.json", listed)
    per_model = {path.stem: _results_by_image(out, path, listed) for path in sorted((out / "per_model").glob("*.json"))}
    summary = _read_json(out / "summary.json")
    read_warnings = (summary.get("read_warnings") or {}) if isinstance(summary, dict) else {}
    for image in images:
        image_id = image["id"]
        record: dict[str, Any] = {
            "file_name": image["file_name"],
            "height": image["height"],
            "width": image["width"],
            "fused": results.of(image_id),
            "image_id": image_id,  # kept, as its stem: the files of the image carry them
        }
        if "output_stem" in image:
            record["output_stem"] = image["output_stem"]
        if per_model:
            record["per_model"] = {m: found.of(image_id) for m, found in per_model.items()}
        if read_warnings.get(image["file_name"]):
            record["read_warnings"] = read_warnings[image["file_name"]]
        try:
            check_record_content(record)
        except DamagedRecord as damage:
            _remove(staging)
            raise _unpacking_refused(
                out, f"images.json, predictions.json, per_model/ and summary.json give the image "
                     f"{image['file_name']!r} a record that is not as a run writes it ({damage})") from None
        atomic_write_json(_record_path(staging, image["file_name"]), record)
    if staging.is_dir():
        staging.rename(out / "partial")
    return len(images)


def _unpacking_refused(out: Path, problem: str) -> ValueError:
    """The error of a complete run in ``out`` whose files cannot be unpacked; ``problem`` names the file."""
    return ValueError(
        f"cannot build on the complete run in {out}: {problem}; taken as absent, the outputs this run writes "
        "would lose that run's images that --source does not give. Restore the file, or use another --out, or "
        "--overwrite to discard that run's outputs"
    )


def _listed_images(out: Path) -> list[dict[str, Any]]:
    """The entries of the complete run's ``images.json`` in ``out``, each checked to hold what a record takes.

    Raises:
        ValueError: see :func:`unpack_finished_run`.
    """
    path = out / "images.json"
    try:
        content = read_json_file(path, "image list")
    except (OSError, ValueError) as err:
        raise _unpacking_refused(out, str(err)) from None
    images = content.get("images") if isinstance(content, dict) else None
    if not isinstance(images, list):
        raise _unpacking_refused(out, f"{path} is no object with a list of images")
    for i, image in enumerate(images):
        missing = [key for key in ("id", "file_name", "height", "width") if not isinstance(image, dict) or key not in image]
        if missing:
            raise _unpacking_refused(out, f"{path}: image {i} lacks {', '.join(map(repr, missing))}")
        if type(image["id"]) is not int or not isinstance(image["file_name"], str):
            raise _unpacking_refused(
                out, f"{path}: image {i} must have a whole-number id and a file name, got {image['id']!r} and "
                     f"{image['file_name']!r}")
    return images


class _ResultsText:
    """A COCO results file held as its text, each image's results read from it when asked for."""

    def __init__(self, text: str, runs: dict[int, list[tuple[int, int]]]) -> None:
        self.text, self.runs = text, runs  # image id -> the spans of its results' consecutive runs

    def of(self, image_id: int) -> list[dict[str, Any]]:
        """The results of ``image_id``, in the file's order, without their ``image_id``."""
        items = ", ".join(self.text[start:end] for start, end in self.runs.get(image_id, []))
        return [{k: v for k, v in r.items() if k != "image_id"} for r in json.loads(f"[{items}]")]


def _results_by_image(out: Path, path: Path, listed: Collection[int]) -> _ResultsText:
    """The results file ``path`` of the complete run in ``out`` with where each image's results stand in it;
    each result names one of the images ``listed`` by its id.

    Raises:
        ValueError: see :func:`unpack_finished_run`.
    """
    runs: dict[int, list[tuple[int, int]]] = defaultdict(list)
    unlisted = None
    try:
        check_not_special_file(path, "run file")
        text = path.read_text(encoding="utf-8")
        previous = None
        for i, (result, start, end) in enumerate(json_list_items(text)):
            image_id = result.get("image_id") if isinstance(result, dict) else None
            if type(image_id) is not int or image_id not in listed:
                unlisted = f"result {i} names no image of images.json by its image_id: {result!r}"[:300]
                break
            if image_id == previous:  # the run of this image's results goes on
                runs[image_id][-1] = (runs[image_id][-1][0], end)
            else:
                runs[image_id].append((start, end))
            previous = image_id
    except FileNotFoundError:
        raise _unpacking_refused(out, f"{path} is missing") from None
    except (OSError, UnicodeDecodeError) as err:
        raise _unpacking_refused(out, f"{path} cannot be read ({err})") from None
    except ValueError as err:
        raise _unpacking_refused(out, f"{path} cannot be read as a JSON list ({err})") from None
    if unlisted is not None:
        raise _unpacking_refused(out, f"{path}: {unlisted}")
    return _ResultsText(text, runs)


def discard_partial(out: Path) -> None:
    """Delete ``out/partial/``: renamed out of the way first, as one step, then deleted."""
    _remove(out / REMOVING)
    if (out / "partial").is_dir():
        (out / "partial").rename(out / REMOVING)
    shutil.rmtree(out / REMOVING, ignore_errors=True)


def _config_dict(config: EnsembleConfig) -> dict[str, Any]:
    from detens.config import to_dict

    return to_dict(config)


# ---------------------------------------------------------------------------------------------- outputs
def image_ids(names: list[str], dataset: str | None, fixed: dict[str, int] | None = None) -> dict[str, int]:
    """Image ids, each image its own: ``fixed`` (an earlier run's) are kept; with a ``dataset``, an image
    the dataset has gets its id (see :func:`dataset_ids`); every other image gets a new id after every id
    in use (the dataset's and ``fixed``'s), in file order: 1..N without a dataset or an earlier run.

    Raises:
        ValueError: an image whose dataset id would be ambiguous (see :func:`dataset_ids`).
    """
    ids = {n: fixed[n] for n in names if fixed and n in fixed}
    in_use = set(ids.values())
    if dataset is not None:
        files = dataset_files(dataset)
        ids.update(dataset_ids([n for n in names if n not in ids], files, in_use, dataset))
        in_use |= set(files.values())
    next_id = max(in_use | set(ids.values()), default=0) + 1
    new = [name for name in names if name not in ids]
    for name in new:
        ids[name], next_id = next_id, next_id + 1
    if dataset is not None and new:
        # One line for all: fusing new images under a dataset's label space is the usual deployment, and
        # a line per image buried a folder's run in warnings.
        shown = first_few(new, 5)
        ids_given = f"the new image id {ids[new[0]]}" if len(new) == 1 else f"new image ids {ids[new[0]]}-{ids[new[-1]]}"
        logger.warning("%d image%s not in %s get%s %s: %s", len(new), "s" if len(new) > 1 else "", dataset,
                       "" if len(new) > 1 else "s", ids_given, shown)
    return {n: ids[n] for n in names}


def plan_image_ids(
    out: Path, names: list[str], dataset: str | None, earlier: dict[str, dict[str, Any]], previous: Any
) -> dict[str, int]:
    """The id of every image of the run (:func:`image_ids` over ``names``, in their order), given before any
    image is fused and saved in the run record, so that an image's id depends on neither the order in which
    images finish (Ray's actors) nor an interruption: a resumed run gives the ids an uninterrupted one
    gives. An image that turns out unreadable leaves its id unused.

    Kept: the ids of a complete earlier run's images (``earlier``'s) and those an unfinished run planned
    (``previous``, its run record). An unfinished run of an earlier version planned none, and wrote its
    finished images with ids in the order they finished in, unreadable images skipped: those that differ
    from the ids planned now are renumbered, with a warning (the images' results are unchanged).

    Raises:
        ValueError: an image whose dataset id would be ambiguous (see :func:`dataset_ids`).
    """
    planned = previous.get("image_ids") if isinstance(previous, dict) else None
    fixed = {}
    if isinstance(planned, dict):
        listed = set(names)
        fixed = {n: i for n, i in planned.items() if n in listed and type(i) is int}
    fixed.update(earlier_ids(earlier))
    ids = image_ids(names, dataset, fixed)
    published = published_ids(out)
    renumbered = [f"{n} {published[n]} -> {ids[n]}" for n in names
                  if n in earlier and published.get(n, ids[n]) != ids[n]]
    if renumbered:
        logger.warning(
            "%s: renumbered %d image%s that an unfinished run of an earlier version wrote to images.json, numbered "
            "as they finished and with no id for an unreadable image; the ids follow the source's order now, as "
            "in an uninterrupted run: %s",
            out, len(renumbered), "s" if len(renumbered) > 1 else "", first_few(renumbered, 5),
        )
    return ids


def earlier_ids(records: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The ids that the images of a complete earlier run were written with (they keep them)."""
    return {n: int(r["image_id"]) for n, r in records.items() if "image_id" in r}


def published_ids(out: Path) -> dict[str, int]:
    """``{file_name: image id}`` of the images that an unfinished run wrote to ``out/images.json`` (a complete
    one's, once :func:`unpack_finished_run` has put them back in ``partial/``)."""
    images = _read_json(out / "images.json") if (out / "partial").is_dir() else None
    if not isinstance(images, dict) or not isinstance(images.get("images"), list):
        return {}
    return {im["file_name"]: int(im["id"]) for im in images["images"]
            if isinstance(im, dict) and isinstance(im.get("file_name"), str) and isinstance(im.get("id"), int)}


def dataset_images(dataset: str) -> dict[int, tuple[str, int, int]]:
    """``{image id: (file_name, height, width)}`` of the dataset's images, read once per version of its file:
    a run plans its images' ids from them as it starts and compares their sizes as it ends."""
    stat = os.stat(dataset)
    return _read_dataset_images(os.path.abspath(dataset), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _read_dataset_images(path: str, mtime_ns: int, size: int) -> dict[int, tuple[str, int, int]]:
    return {int(im["id"]): (str(im["file_name"]), int(im["height"]), int(im["width"]))
            for im in load_coco_gt(path).dataset["images"]}


def dataset_files(dataset: str) -> dict[str, int]:
    """``{file_name: image id}`` of the dataset's images.

    Raises:
        ValueError: the dataset lists a file under more than one id: which id its results take cannot be told.
    """
    images = dataset_images(dataset)
    check_one_id_per_file(((image_id, file_name) for image_id, (file_name, _, _) in images.items()), dataset)
    return {file_name: image_id for image_id, (file_name, _, _) in images.items()}


def dataset_ids(names: list[str], files: dict[str, int], taken: set[int], dataset: str) -> dict[str, int]:
    """The dataset's id of each of ``names`` it has: the image whose ``file_name`` is the name (its path
    relative to ``--source``), else the one image whose ``file_name`` has the name's base name. An id in
    ``taken`` (an earlier run's) or matched by path is not given again: that image is another file.

    Raises:
        ValueError: a name matched only by its base name, which several of ``names`` share (``train/a.jpg``
            and ``val/a.jpg``) or several of the dataset's free images have: which file is which dataset
            image cannot be told, and one id given to two files would merge their results.
    """
    by_path = {n: files[n] for n in names if files.get(n) is not None and files[n] not in taken}
    claimed = taken | set(by_path.values())
    free_by_base: dict[str, list[str]] = defaultdict(list)
    for file_name, image_id in files.items():
        if image_id not in claimed:
            free_by_base[PurePosixPath(file_name).name].append(file_name)
    claimants: dict[str, list[str]] = defaultdict(list)
    for name in names:
        base = PurePosixPath(name).name
        if name not in files and free_by_base.get(base):
            claimants[base].append(name)
    by_base = {}
    for base, sources in claimants.items():
        if len(sources) > 1 or len(free_by_base[base]) > 1:
            raise ValueError(
                f"cannot tell which file is which image of the dataset {dataset}: "
                f"{', '.join(map(repr, sources))} (relative to --source) and its "
                f"{', '.join(map(repr, free_by_base[base]))} match only by the base name {base!r}; run --source on "
                "the folder the dataset's file_name values are relative to, or fuse these images into separate --out"
            )
        by_base[sources[0]] = files[free_by_base[base][0]]
    return {**by_path, **by_base}


def warn_of_sizes_unlike_the_dataset(images: list[dict[str, Any]], dataset: str) -> None:
    """Warn of fused images (``images.json``'s entries) of the dataset whose files are not the size the
    dataset gives them: their boxes are in the files' pixels, and scored against the dataset's annotations
    they would be in the wrong places (a resized copy, a photo turned upright)."""
    annotated = dataset_images(dataset)
    unlike = []
    for image in images:
        _, height, width = annotated.get(image["id"], (None, image["height"], image["width"]))
        if (height, width) != (image["height"], image["width"]):
            unlike.append(f"{image['file_name']} is {image['width']}x{image['height']}, the dataset says {width}x{height}")
    if unlike:
        logger.warning(
            "%d of the fused images are not the size %s gives them (width x height: %s): their boxes are in the "
            "files' pixels, not in the dataset's annotations' coordinates", len(unlike), dataset,
            first_few(unlike, 5, "; "),
        )


def write_outputs(
    out: Path,
    config: EnsembleConfig,
    names: list[str],
    ids: dict[str, int],
    stems: dict[str, str],
    member_names: list[str],
    categories: dict[int, str],
    unreadable: dict[str, str],
    run: dict[str, Any],
    sound: Collection[str] = (),
) -> dict[str, Any]:
    """Assemble predictions.json, images.json, per_model/*.json and summary.json from the partial
    records of ``names`` (the run's images, with their ``ids``: :func:`plan_image_ids`, and the ``stems``
    of their files: :func:`output_stems`), images in the order of their ids; a complete run then removes
    ``partial/``. ``sound``: the images whose records :func:`finished_records` checked as the run started."""
    # Each image's record is read once and its boxes streamed to the files: a folder's worth of boxes is
    # never in memory at once (about a kilobyte a box, as dicts and as the JSON text).
    done: list[str] = []
    images = []
    stage_ms: dict[str, float] = defaultdict(float)
    stage_count: dict[str, int] = defaultdict(int)
    boxes_total = boxes_shown = 0
    read_warnings: dict[str, list[str]] = {}
    with contextlib.ExitStack() as files:
        results = files.enter_context(atomic_json_list(out / "predictions.json"))
        per_model: dict[str, Callable[[Sequence[Any]], None]] = {}

        def member_results(member: str) -> Callable[[Sequence[Any]], None]:
            if member not in per_model:
                per_model[member] = files.enter_context(atomic_json_list(out / "per_model" / f"{member}.json"))
            return per_model[member]

        for member in member_names if config.output.save_per_model else ():
            member_results(member)  # a member with no box still gets its file
        for name in sorted(names, key=ids.__getitem__):
            record, image_id = read_partial(out, name, checked=name in sound), ids[name]
            if record is None:
                continue
            done.append(name)
            images.append(
                {"id": image_id, "file_name": name, "height": record["height"], "width": record["width"],
                 "output_stem": stems[name]}
            )
            results([{**r, "image_id": image_id} for r in record["fused"]])
            boxes_total += len(record["fused"])
            boxes_shown += sum(r["score"] >= config.output.vis_conf for r in record["fused"])
            for member, found in (record.get("per_model") or {}).items() if config.output.save_per_model else ():
                member_results(member)([{**r, "image_id": image_id} for r in found])
            for stage, ms in record.get("times_ms", {}).items():
                stage_ms[stage] += ms
                stage_count[stage] += 1
            if record.get("read_warnings"):
                read_warnings[name] = record["read_warnings"]
        if config.dataset is not None:
            warn_of_sizes_unlike_the_dataset(images, config.dataset)
        ms_per_image = {k: round(v / stage_count[k], 2) for k, v in stage_ms.items()}
        if not ms_per_image and done:  # records rebuilt from a finished run's files carry no timings: keep its own
            earlier = _read_json(out / "summary.json")
            ms_per_image = (earlier.get("ms_per_image") or {}) if isinstance(earlier, dict) else {}
        complete = len(done) + len(unreadable) == len(names) and not run["interrupted"]
        info = {
            "description": f"detens fused detections: ensemble {config.name!r}, method {run['method']!r}",
            "models": member_names,
            "method": run["method"],
            "head": config.fusion.head,
            "complete": complete,
        }
        # the image list is moved into place first (the results files follow as the block ends):
        # predictions.json never names an image that images.json lacks
        atomic_write_json(
            out / "images.json",
            {
                "info": info,
                "images": images,
                "categories": [{"id": int(c), "name": n} for c, n in sorted(categories.items())],
                "annotations": [],
            },
        )
    summary = {
        "ensemble": config.name,
        "method": run["method"],
        "head": config.fusion.head,
        "models": member_names,
        "images": len(names),
        "done": len(done),
        "complete": complete,
        "processed_this_run": run["processed"],
        "resumed": run["resumed"],
        # in the images' order, whichever order the engine met them in (Ray's rows come as they finish)
        "unreadable": {n: unreadable[n] for n in names if n in unreadable},
        # fused all the same: a JPEG decoded only in part, a TIFF of several pages, an orientation not applied
        "read_warnings": {n: read_warnings[n] for n in names if n in read_warnings},
        "interrupted": run["interrupted"],
        "boxes": boxes_total,
        f"boxes_score_ge_{config.output.vis_conf:g}": boxes_shown,
        "ms_per_image": ms_per_image,
        "fuse_first_call_ms": run["first_call_ms"],
        "wall_s_this_run": round(run["wall_s"], 3),
        "images_per_s_this_run": round(run["processed"] / run["wall_s"], 3) if run["wall_s"] > 0 else None,
        "weights": run["weights"],
        "inputs": run["inputs"],
    }
    atomic_write_json(out / "summary.json", summary, indent=2)
    if complete:
        discard_partial(out)
        # after partial/: a run killed in between leaves a run record that says what summary.json says
        (out / RUN_RECORD).unlink(missing_ok=True)
    return summary


def write_image(out: Path, record: dict[str, Any], files: dict[str, bytes]) -> None:
    """Write one image's files, then its partial record (last: a record means the image is done)."""
    for relative, payload in files.items():
        atomic_write_bytes(out / relative, payload)
    atomic_write_json(partial_path(out, record["file_name"]), record)


def process_image(out: Path, name: str, *fuse_arguments: Any) -> dict[str, Any]:
    """:func:`fuse_image` of the image ``name`` (its other arguments follow) and :func:`write_image`; returns
    the record."""
    record, files = fuse_image(name, *fuse_arguments)
    write_image(out, record, files)
    return record


def _written_by_a_run(path: Path, out: Path) -> bool:
    """Whether ``path`` lies in one of the folders a run writes into ``out`` (its drawings are images)."""
    # os.path.realpath, not Path.resolve: that raises on a link that leads to itself, which is an image
    # that cannot be read (reported as one), not the end of the run
    parents = Path(os.path.realpath(path)).parents
    return any((out / name).resolve() in parents for name in (*OUTPUT_NAMES, *WORK_FOLDERS))


def _read_json(path: Path) -> Any:
    """The JSON content of the run's own file at ``path``; None where it is missing or cannot be read
    (:func:`~detens.io.read_json_file`: cut short, nested too deeply, ...), as if the run had not written it."""
    try:
        return read_json_file(path, "run file")
    except (OSError, ValueError):
        return None


# -------------------------------------------------------------------------------------------------- run
def run(options: FuseOptions) -> int:
    """Fuse the images of ``options.source`` into ``options.out``, under its lock, after finishing what a
    killed ``--overwrite`` run left there; returns 0.

    Raises:
        KeyboardInterrupt: a Ctrl-C, once the finished images and the outputs of them are saved (the same
            run again resumes), or before the first result, with ``options.out`` as it was.
        UsageError: Ray options without ``engine="ray"``, or bad ones.
        ValueError: anything refused before (or while) the images are fused, as the command reports it;
            a run that could read none of its images (after writing its summary, which lists them); a run
            whose lock file went while it wrote (its folder moved or deleted), before it writes again; a
            run whose outputs lack images it fused (after writing them: its summary says it is not complete).
    """
    check_writable_folder(options.out, "--out")
    with output_lock(options.out, "detens fuse", outputs=(*OUTPUT_NAMES, *WORK_FOLDERS)) as lock:
        if options.out.is_dir():
            recover_replaced(options.out)
        return _run(options, lock)


def _run(options: FuseOptions, lock: HeldLock) -> int:
    engine = ray_options(options)
    config = resolve_config(options)
    out: Path = options.out
    declared = declared_member_names(config)  # None: an entry without a name, known once loaded
    params = fusion_params(config, declared)
    dataset_names = dataset_categories(config)
    check_class_maps(config, dataset_names)
    check_heads_label_space(config, params, dataset_names)
    images, root = resolve_source(options.source)
    images = [path for path in images if not _written_by_a_run(path, out)]  # --out inside --source
    if not images:
        raise ValueError(f"no images found in --source {options.source!r} (expected an image, a folder, or a glob)")
    check_output_folder(out)
    check_resume(out, config, options.overwrite)
    out_existed, was_run_folder = out.exists(), is_run_folder(out)
    run_file = out / RUN_RECORD
    had_run_record = run_file.exists()  # an unfinished run's: resumed, never discarded
    previous = None if options.overwrite else earlier_run_record(out)
    fingerprints = input_fingerprints(config)
    check_inputs_unchanged(out, previous, fingerprints)

    names = [relative_name(p, root) for p in images]
    if len(set(names)) != len(names):  # several roots: fall back to full paths
        names = [p.absolute().as_posix().lstrip("/") for p in images]
    unpacked = 0 if options.overwrite else unpack_finished_run(out)

    def pack_finished_run() -> None:
        """The run ends before its first new result: a complete run's folder goes back to what it was (its
        files still hold every image), without the unfinished run's records it was unpacked into (none for
        a complete run that finished no image) and the run record this run wrote."""
        if unpacked:
            discard_partial(out)
        if not had_run_record:
            run_file.unlink(missing_ok=True)

    members: list[Any] = []
    first_call_ms: float | None = None
    claimed = False

    def claim_output(record: dict[str, Any] | None = None) -> None:
        """Everything is checked: only now does the run change --out. The run record goes first: a run
        killed before its config is written leaves a folder that is told to be its own (is_run_folder). Each
        call first checks that --out is still the folder the run locked."""
        nonlocal claimed
        lock.check()
        if not claimed:
            if options.overwrite:
                set_aside_outputs(out)
            out.mkdir(parents=True, exist_ok=True)
            if record is not None:
                atomic_write_json(run_file, record)
            save_ensemble_config(config, out / "config.yaml")
            claimed = True
        elif record is not None:
            atomic_write_json(run_file, record)

    def release_output() -> None:
        """The run failed before its first result: --out goes back to what it was."""
        if not claimed:
            return
        if was_run_folder:
            if options.overwrite:
                restore_outputs(out)
        else:  # --overwrite too: it set nothing aside
            clear_outputs(out)  # only what this run created (check_output_folder found none of it)
            if not out_existed and not any(out.iterdir()):
                out.rmdir()

    def check_members(loaded: list[str], sources: dict[str, str | None]) -> None:
        """The loaded members against the head and an earlier run; then the run claims --out."""
        nonlocal member_names, weights, params
        if declared is None:
            for name in loaded:  # named after their weights: checked as a config's names are
                check_member_name(name)
            params = fusion_params(config, loaded)
        # an earlier run that read no image names no members ([] where the config names none): nothing to compare
        if isinstance(previous, dict) and previous.get("models") and previous["models"] != loaded:
            raise ValueError(
                f"the ensemble's members changed since the earlier run in {out} ({previous['models']} -> "
                f"{loaded}); use another --out, or --overwrite"
            )
        member_names, weights = loaded, sources
        claim_output({"models": member_names, "weights": weights, "inputs": fingerprints, "image_ids": ids})

    def load_members() -> None:
        """Load the detectors once an image needs them (a rerun with nothing readable left loads none)."""
        nonlocal members, first_call_ms
        members = build_ensemble(config, built=saved)  # the saved predictions are read and checked once
        check_members([m.name for m in members], {m.name: weights_of(m) for m in members})
        first_call_ms = time_first_call(config.fusion.method, params, member_names, min(categories))

    unreadable: dict[str, str] = {}
    processed = 0
    interrupted: BaseException | None = None  # the Ctrl-C, raised once the finished images are saved
    bar: Any = None
    try:  # from here on, a run that ends before its first new result leaves --out as it was
        # images finished earlier (also those of other sources) keep their results, ids and file stems
        earlier = {} if options.overwrite else finished_records(out, names)
        done = set(earlier)
        todo = [(p, n) for p, n in zip(images, names, strict=True) if n not in done]
        listed = set(names)
        warn_of_planned_images_left_out(out, previous, done, listed)
        # the source's order, whichever of its images an interrupted run finished (Ray's come as they finish)
        names = [n for n in earlier if n not in listed] + names
        categories = dataset_names or dict(COCO_ID_TO_NAME)
        ids = plan_image_ids(out, names, config.dataset, earlier, previous)
        stems = output_stems(names, {n: r["output_stem"] for n, r in earlier.items() if "output_stem" in r},
                             STEM_SUFFIXES)
        # Saved predictions are checked here, on the driver, for both engines: a Ray run would otherwise
        # find a missing image or a category it cannot name on an actor, after other results were written.
        saved = saved_prediction_members(config, dataset_names) if todo else {}
        check_saved_predictions(list(saved.values()), [path for path, _ in todo], sorted(categories),
                                label_space_name(config))
        if isinstance(previous, dict) and "models" in previous:
            member_names, weights = list(previous["models"]), dict(previous.get("weights") or {})
        else:
            member_names, weights = list(declared or []), {}
        yolo_ids = sorted(categories) if config.dataset else list(COCO_CATEGORY_IDS)
        start = time.perf_counter()
        bar = tqdm(
            total=len(names),
            initial=len(done),
            unit="img",
            desc=config.name,
            disable=options.quiet,
            dynamic_ncols=True,
        )
        if engine is not None and todo:
            from detens.engines.ray_cache import ray_session
            from detens.engines.ray_fuse import fuse_on_ray

            with ray_session(engine, quiet=options.quiet, address_name="--ray-address"):
                items = [(name, stems[name], str(path)) for path, name in todo]
                for row in fuse_on_ray(items, config, categories, yolo_ids, engine):
                    if row["error"]:
                        unreadable[row["name"]] = row["error"]
                        logger.warning("skipped: %s", row["error"])
                    else:
                        if not members:
                            # as the local engine's first load: the members (and their one-time fusion
                            # cost) that fused an image, those of the actor whose image came first
                            members = list(row["members"])
                            check_members(list(row["members"]), dict(row["members"]))
                            first_call_ms = row["first_call_ms"]
                        lock.check()
                        write_image(out, row["record"], row["files"])
                        processed += 1
                    bar.update(1)
        for begin in range(0, len(todo) if engine is None else 0, config.batch):
            chunk = todo[begin : begin + config.batch]
            loaded, loaded_names, read_ms, read_notes = [], [], [], []
            for path, name in chunk:
                t = time.perf_counter()
                notes: list[str] = []
                try:
                    loaded.append((path, read_image(path, notes=notes)))
                    loaded_names.append(name)
                    read_ms.append((time.perf_counter() - t) * 1000)
                    read_notes.append(notes)
                except ImageReadError as err:
                    unreadable[name] = str(err)
                    logger.warning("skipped: %s", err)
                    bar.update(1)
            if not loaded:
                continue
            if not members:
                load_members()
            arrays = [image for _, image in loaded]
            per_image, detect_ms = detect_batch(members, arrays, [path for path, _ in loaded])
            settings = FuseSettings(config, params, categories, yolo_ids)  # params: of the loaded members
            for i, name in enumerate(loaded_names):
                times = {"read": read_ms[i], **detect_ms}
                lock.check()
                process_image(out, name, stems[name], arrays[i], per_image[i], settings, times, read_notes[i])
                processed += 1
                bar.update(1)
    except BaseException as err:
        # a folder whose lock went is no longer this run's to put back: it may be another run's by now
        if processed == 0 and lock.held():
            release_output()
            pack_finished_run()
        if not is_interruption(err):
            raise
        if processed == 0:
            logger.warning("interrupted before the first result: %s is as it was", out)
            raise_interruption(err)
        interrupted = err
        logger.warning("interrupted: the finished images are saved; %s to resume", options.run_again,
                       extra={RESUME_ADVICE: True})
    finally:
        if bar is not None:
            bar.close()
    # A Ctrl-C while the final files are written would leave some of them (images.json saying the run is
    # complete beside no predictions.json): held, it stops the run once they all are
    with ctrl_c_held() as ctrl_c:
        claim_output()
        discard_replaced(out)  # the new run stands: the earlier outputs go
        run_info = {
            "method": method_label(config, params),
            "processed": processed,
            "resumed": len(done),
            "interrupted": interrupted is not None,
            "wall_s": time.perf_counter() - start,
            "weights": weights,
            "inputs": fingerprints,
            "first_call_ms": first_call_ms,
        }
        summary = write_outputs(out, config, names, ids, stems, member_names, categories, unreadable, run_info,
                                sound=earlier.keys())
    if not options.quiet:
        print_summary(out, config, summary, options.run_again)
    if ctrl_c.pressed and interrupted is None:
        logger.warning("interrupted while the outputs were written: the run finished first; %s holds all of them",
                       out)
        raise ctrl_c.interruption()
    if interrupted is not None:  # saved: the caller stops now (a script's loop too), the command with status 130
        raise_interruption(interrupted)
    if summary["done"] == 0 and unreadable:
        # the outputs say which files failed and why; a script must not take an empty run for a finished one
        raise ValueError(
            f"no image of --source {options.source} could be read ({len(unreadable)} unreadable, "
            f"listed in {out / 'summary.json'})"
        )
    if not summary["complete"]:
        # images fused (or finished earlier) whose records went from partial/ while the run wrote: the
        # outputs lack them, and a script must not take them for the run's results
        missing = summary["images"] - summary["done"] - len(unreadable)
        raise ValueError(
            f"{out} lacks the results of {missing} of the run's {summary['images']} images, whose records went "
            f"from {out / 'partial'} while the run wrote there (its summary.json says complete: false); run the "
            "same command again to fuse them"
        )
    return 0


def warn_of_planned_images_left_out(out: Path, previous: Any, done: set[str], listed: set[str]) -> None:
    """Warn of the images that the interrupted run in ``out`` planned (``previous``, its run record) and left
    unfinished, and that this run's source (``listed``) lacks: the run ends complete without them."""
    planned = previous.get("image_ids") if isinstance(previous, dict) else None
    if not isinstance(planned, dict):  # a complete run's summary, or an unfinished run of an earlier version
        return
    left_out = [name for name in planned if name not in done and name not in listed]
    if left_out:
        many = len(left_out) > 1
        logger.warning(
            "%s: %d image%s that the interrupted run had yet to fuse %s not in this --source and %s left "
            "out: %s; run with that run's --source to fuse them", out, len(left_out), "s" if many else "",
            "are" if many else "is", "are" if many else "is", first_few(left_out, 5),
        )


def print_summary(out: Path, config: EnsembleConfig, summary: dict[str, Any], run_again: str) -> None:
    """Print what the run in ``out`` did; ``run_again`` says, in the caller's words, what finishes an
    interrupted run."""
    stages = ", ".join(f"{k.removeprefix('detect:')} {v:.1f}" for k, v in summary["ms_per_image"].items())
    shown_key = f"boxes_score_ge_{config.output.vis_conf:g}"
    lines = [
        f"{summary['ensemble']} ({summary['method']} of {', '.join(summary['models'])}): "
        f"{summary['done']}/{summary['images']} images done ({summary['processed_this_run']} this run, "
        f"{summary['resumed']} resumed, {len(summary['unreadable'])} unreadable)",
        f"boxes: {summary['boxes']} fused ({summary[shown_key]} with score >= {config.output.vis_conf:g})",
        # a run with nothing left to do shows the timings its summary keeps from the runs that did the work
        f"ms per image{' (earlier runs)' if summary['processed_this_run'] == 0 and stages else ''}: {stages}"
        + (f" (first fusion call, compiling included: {summary['fuse_first_call_ms']:.0f} ms)"
           if summary.get("fuse_first_call_ms") is not None else ""),
    ]
    lines += unreadable_lines(summary["unreadable"])
    lines += read_warning_lines(summary["read_warnings"], "summary.json")
    # labels/ and vis/ hold a file per image done: a run whose every image was unreadable writes neither
    folders = {"labels": config.output.labels, "vis": config.output.vis, "per_model": config.output.save_per_model}
    written = ["predictions.json", "images.json",
               *(f"{name}/" for name, wanted in folders.items() if wanted and (out / name).is_dir()),
               "summary.json", "config.yaml"]
    # an interrupted run's files are valid but hold only the images done: not the run's results to hand on
    results = "results" if summary["complete"] else f"partial results ({summary['done']} of {summary['images']} images)"
    lines.append(f"{results} in {out}/: {', '.join(written)}")
    if summary["interrupted"]:
        lines.append(f"interrupted: {run_again} to finish")
    print("\n".join(lines))
