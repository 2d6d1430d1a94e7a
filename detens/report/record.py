"""What one ``detens evaluate`` run saves so that its report page can be built, or rebuilt later, from the
very predictions its table scored: no refitting, no fusing again.

The record is one gzip-compressed JSON file beside the table, ``<out stem>.evaluation.json.gz``::

    {"format": "detens-evaluation/1",
     "meta":        {"command", "gt", "images", "predictions", "models", "protocol", "cv", "seed",
                     "folds", "fit_on", "backend", "all_images", "scored_images", "left_out", "created",
                     "detens_version", "software"},
     "gt":          the COCO dataset of the scored images (images, annotations, categories): those
                    with annotations, every image of the file with ``all_images``,
     "metrics":     {method: {metric: value}}           the table, in the run's order,
     "calibration": {method: detection_calibration(...)},
     "results":     {method: columns}                   the pooled held-out predictions of each method,
     "members":     {model: columns}}                   each member's own predictions on those images,

``meta.left_out`` lists the images of the annotation file that the cache could not read, neither scored
nor fitted on (``{"image_id", "file_name", "unreadable_by": {member: error}}``; older records lack it),
``meta.fit_on.left_out`` those of the fitting data. ``columns`` is a COCO results list stored by column
(``image_id``, ``category_id``, ``bbox``, ``score``), floats written in full (Python's shortest
round-trip form), so that a metric computed from the record equals the table's to the last bit.
Dimension legend: D results of one method.

The table and its record are one run's only when the record's ``metrics`` equal the table: a run writes
its finished rows to ``<out stem>.partial.json`` while it goes (:func:`partial_path`) and the record and
the table only once every method has run, the table last. :meth:`EvaluationRecord.load` given the table
checks that the two agree, so a page is never drawn from one run's predictions under another's table.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from detens.checks import check_real
from detens.coco import validate_coco_results
from detens.detections import MAX_LABEL
from detens.io import atomic_write_bytes, check_file_path, parse_json

__all__ = ["PARTIAL_SUFFIX", "RECORD_FORMAT", "RECORD_SUFFIX", "EvaluationRecord", "partial_path", "record_path"]

logger = logging.getLogger(__name__)

RECORD_FORMAT = "detens-evaluation/1"
RECORD_SUFFIX = ".evaluation.json.gz"
PARTIAL_SUFFIX = ".partial.json"
_COLUMNS = ("image_id", "category_id", "bbox", "score")


def record_path(out: str | Path) -> Path:
    """The record beside a table ``out`` (``report.json`` → ``report.evaluation.json.gz``); a path that
    already ends in :data:`RECORD_SUFFIX` is returned as is."""
    out = Path(out)
    if out.name.endswith(RECORD_SUFFIX):
        return out
    return out.with_name(out.stem + RECORD_SUFFIX)


def partial_path(out: str | Path) -> Path:
    """Where an unfinished ``detens evaluate`` run keeps the rows it has finished, beside its table ``out``
    or record (``report.json`` or ``report.evaluation.json.gz`` → ``report.partial.json``)."""
    out = Path(out)
    stem = out.name[: -len(RECORD_SUFFIX)] if out.name.endswith(RECORD_SUFFIX) else out.stem
    return out.with_name(stem + PARTIAL_SUFFIX)


@dataclass
class EvaluationRecord:
    """One evaluation run, as saved (module docstring).

    Attributes:
        meta (dict): how the run was made; :meth:`describe` lists the keys the page reads.
        gt (dict): the COCO dataset of the scored images.
        metrics (dict[str, dict[str, float]]): the table, one row per method in the run's order.
        calibration (dict[str, dict]): per method, ``detection_calibration``'s bins and ECE.
        results (dict[str, list[dict]]): per method, the pooled COCO results it was scored on.
        members (dict[str, list[dict]]): per ensemble member, its predictions on the scored images.
    """

    meta: dict[str, Any]
    gt: dict[str, Any]
    metrics: dict[str, dict[str, float]]
    calibration: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    members: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _check_sections({"meta": self.meta, "gt": self.gt, "metrics": self.metrics,
                         "calibration": self.calibration, "results": self.results, "members": self.members})
        missing = [m for m in self.metrics if m not in self.results]
        if missing:
            raise ValueError(f"the evaluation record has metrics but no predictions for {missing}")
        for key in ("images", "annotations", "categories"):
            if key not in self.gt:
                raise ValueError(f"the evaluation record's ground truth lacks {key!r}")
        if not self.gt["images"]:
            raise ValueError("the evaluation record's ground truth lists no image: a run scores at least one")
        singles = [m for m in self.metrics if m.startswith("single:")]
        unnamed = [m for m in singles if m == "single:"]
        if unnamed:
            raise ValueError("the evaluation record's metrics has a row 'single:' that names no model")
        # the page draws a single model's boxes from its member predictions
        unknown = [m for m in singles if self.members and m.split(":", 1)[1] not in self.members]
        if unknown:
            raise ValueError(
                f"the evaluation record's metrics has rows {unknown} of models that are not among its members "
                f"{sorted(self.members)}"
            )

    @property
    def image_ids(self) -> list[int]:
        """The scored images, ascending."""
        return sorted(int(image["id"]) for image in self.gt["images"])

    def save(self, path: str | Path) -> Path:
        """Write the record atomically (gzip JSON); returns the path."""
        document = {
            "format": RECORD_FORMAT,
            "meta": self.meta,
            "gt": self.gt,
            "metrics": self.metrics,
            "calibration": self.calibration,
            "results": {name: _to_columns(results) for name, results in self.results.items()},
            "members": {name: _to_columns(results) for name, results in self.members.items()},
        }
        path = check_file_path(path)
        # mtime=0: the same evaluation gives the same bytes
        atomic_write_bytes(path, gzip.compress(json.dumps(document).encode("utf-8"), compresslevel=6, mtime=0))
        return path

    @classmethod
    def load(cls, path: str | Path) -> EvaluationRecord:
        """Read a record written by :meth:`save`.

        Args:
            path: the record, or the table it sits beside (``--out`` of ``detens evaluate``). Given the
                table, the record's metrics must be that table (module docstring).

        Raises:
            FileNotFoundError: no record there (the message says which command writes one).
            ValueError: not a record of this format, naming the file and what is wrong; or a table that
                the record's run did not write, naming both files and the rows that differ.
        """
        if Path(path).is_dir():
            raise IsADirectoryError(f"evaluation record (or the table beside it) expected, got a folder: {path}")
        # a record renamed (``run.json.gz``) is still one: gzip, which no table is
        table = None if Path(path).name.endswith(RECORD_SUFFIX) or _is_gzip(Path(path)) else Path(path)
        path = Path(path) if table is None else record_path(path)
        if not path.is_file():
            # a run of several seeds writes its table and <stem>.run.json, but no record
            run = path.with_name(path.name[: -len(RECORD_SUFFIX)] + ".run.json")
            why = (f"{run} is of a detens evaluate run of several seeds, which writes none: run one --seed for a "
                   "report page") if run.is_file() else "detens evaluate writes it beside its --out"
            raise FileNotFoundError(f"evaluation record not found: {path} ({why})")
        try:
            text = gzip.decompress(path.read_bytes())
        except (OSError, EOFError, zlib.error) as err:  # zlib.error: compressed data damaged inside a block
            raise ValueError(f"{path} is not a gzip-compressed JSON evaluation record: {err}") from err
        document = parse_json(text, "evaluation record", path)
        if not isinstance(document, dict) or document.get("format") != RECORD_FORMAT:
            found = document.get("format") if isinstance(document, dict) else type(document).__name__
            raise ValueError(f"{path} is not a detens evaluation record ({RECORD_FORMAT}); its format is {found!r}")
        missing = [k for k in ("meta", "gt", "metrics", "results") if k not in document]
        if missing:
            raise ValueError(f"{path}: the evaluation record lacks {missing}")
        try:
            _check_sections(document)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err
        # without the table beside it the record still stands alone: it holds its own table
        if table is not None and table.is_file():
            _check_table(table, document["metrics"], path)
        partial = partial_path(path)
        if partial.is_file():
            created = document["meta"].get("created", "?")
            logger.warning("%s is left by a detens evaluate run that did not finish; %s is of a complete run "
                           "(evaluated %s)", partial, path, created)
        results = {name: _from_columns(c, f"{path}: results[{name!r}]") for name, c in document["results"].items()}
        members = {name: _from_columns(c, f"{path}: members[{name!r}]") for name, c in document.get("members", {}).items()}
        try:
            return cls(document["meta"], document["gt"], document["metrics"], document.get("calibration", {}),
                       results, members)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err


def _is_gzip(path: Path) -> bool:
    """Whether ``path`` is a file that begins as gzip data does."""
    try:
        with path.open("rb") as file:
            return file.read(2) == b"\x1f\x8b"
    except OSError:
        return False


#: Each section of a record → what it holds, for the error that names a malformed one.
_SECTIONS = {
    "meta": "how the run was made",
    "gt": "the COCO dataset of the scored images",
    "metrics": "{method: {metric: value}}",
    "calibration": "{method: detection_calibration(...)}",
    "results": "{method: columns}",
    "members": "{model: columns}",
}


def _check_sections(document: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the first section of ``document`` (those present) that is not a JSON
    object, or a row of ``metrics`` or ``calibration`` that is not one."""
    for section, holds in _SECTIONS.items():
        if section in document and not isinstance(document[section], dict):
            raise ValueError(
                f"the evaluation record's {section!r} must be a JSON object ({holds}), "
                f"got {type(document[section]).__name__}"
            )
    for section in ("metrics", "calibration"):
        for method, row in document.get(section, {}).items():
            if not isinstance(row, dict):
                raise ValueError(
                    f"the evaluation record's {section}[{method!r}] must be a JSON object, got {type(row).__name__}"
                )
    if "metrics" in document:
        _check_metrics(document["metrics"])
    if "meta" in document:
        _check_meta(document["meta"])
    for method, row in document.get("calibration", {}).items():
        if not isinstance(row.get("bins"), list) or "ece" not in row:
            raise ValueError(
                f"the evaluation record's calibration[{method!r}] must hold 'ece' (a number) and 'bins' (a list): "
                "detection_calibration's output, which the reliability diagram draws"
            )
        if row["ece"] is not None:  # null: no detection to measure
            _check_figure(row["ece"], f"the evaluation record's calibration[{method!r}]['ece']", 0.0, 1.0)


#: The keys of ``meta`` the page reads → the JSON type each must have where present (null: not known).
_META_TYPES: dict[str, tuple[type, ...]] = {
    "command": (str,), "gt": (str,), "images": (str,), "predictions": (str,), "protocol": (str,),
    "backend": (str,), "created": (str,), "seed": (int,), "models": (list,), "folds": (list,),
    "fit_on": (dict,), "left_out": (list,),
}
_JSON_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "a JSON object"}


def _check_meta(meta: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the first key of ``meta`` that the page reads and that is not of its type
    (:data:`_META_TYPES`), or a member name or fold size that is not one."""
    for key, types in _META_TYPES.items():
        value = meta.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise ValueError(
                f"the evaluation record's meta[{key!r}] must be {_JSON_NAMES[types[0]]} or null, "
                f"got {type(value).__name__}: {value!r}"[:300]
            )
    if not all(isinstance(name, str) for name in meta.get("models") or []):
        raise ValueError(f"the evaluation record's meta['models'] must list the members' names, got {meta['models']!r}"[:300])
    if not all(isinstance(size, int) and not isinstance(size, bool) for size in meta.get("folds") or []):
        raise ValueError(f"the evaluation record's meta['folds'] must list the folds' image counts, got {meta['folds']!r}"[:300])


def _check_metrics(metrics: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise ``ValueError`` unless the table has a row, each with its ``map``, and every value is a number
    (``null`` for a figure not measured): the page ranks the methods by them and draws them."""
    if not metrics:
        raise ValueError("the evaluation record's 'metrics' holds no method: a run scores at least one")
    for method, row in metrics.items():
        if "map" not in row:
            raise ValueError(f"the evaluation record's metrics[{method!r}] lacks 'map', the mAP the page ranks by")
        for key, value in row.items():
            if value is None and key != "map":  # a figure not measured
                continue
            _check_figure(value, f"the evaluation record's metrics[{method!r}][{key!r}]")


def _check_figure(value: Any, name: str, low: float = -math.inf, high: float = math.inf) -> None:
    """``check_real`` (finite, from ``low`` to ``high``), raising ``ValueError`` for a value of the wrong type too: a
    malformed record is a ValueError naming its file, whatever is wrong."""
    try:
        check_real(value, name, low, high)
    except TypeError as err:
        raise ValueError(str(err)) from None


def _check_table(table: Path, metrics: Any, record: Path) -> None:
    """Raise ``ValueError`` unless ``table`` holds exactly ``metrics``, the table of ``record``'s run."""
    found = parse_json(table.read_bytes(), "detens evaluate table", table)
    if _canonical(found) == _canonical(metrics):
        return
    if isinstance(found, dict) and isinstance(metrics, dict):
        differences = [
            f"{what}: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}"
            for what, names in (
                ("rows only in the table", [m for m in found if m not in metrics]),
                ("rows only in the record", [m for m in metrics if m not in found]),
                ("rows that differ", [m for m in found if m in metrics and _canonical(found[m]) != _canonical(metrics[m])]),
            )
            if names
        ]
    else:
        differences = [f"the table is a {type(found).__name__}, not {{method: {{metric: value}}}}"]
    partial = partial_path(record)
    unfinished = f"; {partial} holds the rows of a run that did not finish" if partial.is_file() else ""
    raise ValueError(
        f"{table} and {record} are not from the same detens evaluate run ({'; '.join(differences)}){unfinished}; "
        f"run detens evaluate again, or pass {record} to draw the run it holds"
    )


def _canonical(value: Any) -> str:
    """JSON text independent of key order; NaN equals NaN, unlike in a ``==`` of the parsed values."""
    return json.dumps(value, sort_keys=True)


def _to_columns(results: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    return {key: [r[key] for r in results] for key in _COLUMNS}


def _from_columns(columns: Any, where: str) -> list[dict[str, Any]]:
    """COCO result dicts from :func:`_to_columns`'s lists.

    Raises:
        ValueError: not those lists, or a result that is no COCO result (``where`` and its index named).
    """
    if not isinstance(columns, dict) or any(not isinstance(columns.get(k), list) for k in _COLUMNS):
        raise ValueError(f"{where} must hold the lists {list(_COLUMNS)}")
    lengths = {k: len(columns[k]) for k in _COLUMNS}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{where}: its columns differ in length {lengths}")
    results = [
        {"image_id": i, "category_id": c, "bbox": b, "score": s}
        for i, c, b, s in zip(*(columns[k] for k in _COLUMNS), strict=True)
    ]
    if not _columns_are_results(columns):
        try:  # names the first bad result
            validate_coco_results(results, where)
        except TypeError as err:  # a malformed record is a ValueError naming its file, whatever is wrong
            raise ValueError(str(err)) from None
    return results


def _columns_are_results(columns: Mapping[str, list[Any]]) -> bool:
    """Whether every row passes :func:`validate_coco_results`' checks, tested column by column: a record
    holds up to a million results, which that function's row-by-row checks would take seconds over. False
    where unsure (JSON floats as ids): the row-by-row check decides then."""
    try:
        boxes = np.asarray(columns["bbox"], dtype=np.float64)
        scores = np.asarray(columns["score"], dtype=np.float64)
    except (TypeError, ValueError):  # ragged boxes, strings, lists
        return False
    if not len(scores):
        return True
    if boxes.shape != (len(scores), 4):
        return False
    # exact types: numpy reads a JSON true as 1 and a null as nan; the row check refuses the first
    id_types = set(map(type, chain(columns["image_id"], columns["category_id"])))
    number_types = set(map(type, chain(columns["score"], chain.from_iterable(columns["bbox"]))))
    return (
        id_types <= {int}
        and 0 <= min(columns["category_id"]) <= max(columns["category_id"]) <= MAX_LABEL  # as the row check bounds it
        and number_types <= {int, float}
        and bool(np.isfinite(boxes).all() and (boxes[:, 2:] >= 0).all())
        and bool(np.isfinite(scores).all() and ((scores >= 0) & (scores <= 1)).all())
    )
