"""What one ``detens evaluate`` run saves so that its report page can be built, or rebuilt later, from the
very predictions its table scored: no refitting, no fusing again.

The record is one gzip-compressed JSON file beside the table, ``<out stem>.evaluation.json.gz``::

    {"format": "detens-evaluation/1",
     "meta":        {"command", "gt", "images", "predictions", "models", "protocol", "cv", "seed",
                     "folds", "fit_on", "backend", "scored_images", "left_out", "created", "detens_version"},
     "gt":          the COCO dataset of the scored images (images, annotations, categories),
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
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detens.io import atomic_write_bytes

__all__ = ["RECORD_FORMAT", "RECORD_SUFFIX", "EvaluationRecord", "record_path"]

RECORD_FORMAT = "detens-evaluation/1"
RECORD_SUFFIX = ".evaluation.json.gz"
_COLUMNS = ("image_id", "category_id", "bbox", "score")


def record_path(out: str | Path) -> Path:
    """The record beside a table ``out`` (``report.json`` → ``report.evaluation.json.gz``); a path that
    already ends in :data:`RECORD_SUFFIX` is returned as is."""
    out = Path(out)
    if out.name.endswith(RECORD_SUFFIX):
        return out
    return out.with_name(out.stem + RECORD_SUFFIX)


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
        missing = [m for m in self.metrics if m not in self.results]
        if missing:
            raise ValueError(f"the evaluation record has metrics but no predictions for {missing}")
        for key in ("images", "annotations", "categories"):
            if key not in self.gt:
                raise ValueError(f"the evaluation record's ground truth lacks {key!r}")

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
        path = Path(path)
        # mtime=0: the same evaluation gives the same bytes
        atomic_write_bytes(path, gzip.compress(json.dumps(document).encode("utf-8"), compresslevel=6, mtime=0))
        return path

    @classmethod
    def load(cls, path: str | Path) -> EvaluationRecord:
        """Read a record written by :meth:`save`.

        Args:
            path: the record, or the table it sits beside (``--out`` of ``detens evaluate``).

        Raises:
            FileNotFoundError: no record there (the message says which command writes one).
            ValueError: not a record of this format, naming the file and what is wrong.
        """
        path = record_path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"evaluation record not found: {path} (detens evaluate writes it beside its --out)"
            )
        try:
            document = json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
        except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} is not a gzip-compressed JSON evaluation record: {err}") from err
        if not isinstance(document, dict) or document.get("format") != RECORD_FORMAT:
            found = document.get("format") if isinstance(document, dict) else type(document).__name__
            raise ValueError(f"{path} is not a detens evaluation record ({RECORD_FORMAT}); its format is {found!r}")
        missing = [k for k in ("meta", "gt", "metrics", "results") if k not in document]
        if missing:
            raise ValueError(f"{path}: the evaluation record lacks {missing}")
        results = {name: _from_columns(c, f"{path}: results[{name!r}]") for name, c in document["results"].items()}
        members = {name: _from_columns(c, f"{path}: members[{name!r}]") for name, c in document.get("members", {}).items()}
        try:
            return cls(document["meta"], document["gt"], document["metrics"], document.get("calibration", {}),
                       results, members)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err


def _to_columns(results: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    return {key: [r[key] for r in results] for key in _COLUMNS}


def _from_columns(columns: Any, where: str) -> list[dict[str, Any]]:
    """COCO result dicts from :func:`_to_columns`'s lists (the schema is checked where they are used)."""
    if not isinstance(columns, dict) or any(not isinstance(columns.get(k), list) for k in _COLUMNS):
        raise ValueError(f"{where} must hold the lists {list(_COLUMNS)}")
    lengths = {k: len(columns[k]) for k in _COLUMNS}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{where}: its columns differ in length {lengths}")
    return [
        {"image_id": i, "category_id": c, "bbox": b, "score": s}
        for i, c, b, s in zip(*(columns[k] for k in _COLUMNS), strict=True)
    ]
