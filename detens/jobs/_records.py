"""Checks of the record that a run keeps of each image it finishes (``detens cache``'s ``.partial/``,
``detens fuse``'s ``partial/``), read back when a later run resumes.

A record is damaged when it cannot be read as JSON (cut short by a full disk, edited by hand), is not of
the form its run writes, or holds boxes that are no COCO results: taken as it is, it would go into the
run's results, which ``train`` and ``evaluate`` then refuse as a whole, or stop the run half-way. A run
names each damaged record in a warning (:func:`warn_of_damaged_record`) and does the image again.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from detens.checks import real_as_float
from detens.coco import validate_coco_results
from detens.io import read_json_file

__all__ = [
    "DamagedRecord", "check_milliseconds", "is_duration", "check_read_warnings", "checked_results", "read_record",
    "warn_of_damaged_record",
]


class DamagedRecord(ValueError):
    """A record of a finished image that cannot be used; the message says what is wrong with it."""


def read_record(path: Path) -> dict[str, Any] | None:
    """The record at ``path``; None where there is none.

    Raises:
        DamagedRecord: it cannot be read as JSON (:func:`detens.io.parse_json`: cut short, a key twice, nested
            too deeply, ...), or it is no JSON object.
    """
    try:
        record = read_json_file(path, "finished image record")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise DamagedRecord(str(err)) from None
    if not isinstance(record, dict):
        raise DamagedRecord(f"a JSON object expected, got {type(record).__name__}")
    return record


def is_duration(value: Any) -> bool:
    """Whether ``value``, read from a run's file, is a time it took: a finite number (no bool), at least 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(real_as_float(value)) and value >= 0


def check_milliseconds(value: Any, where: str) -> None:
    """Raise :class:`DamagedRecord` naming ``where`` unless ``value`` is a time in milliseconds
    (:func:`is_duration`)."""
    if not is_duration(value):
        raise DamagedRecord(f"{where} must be the milliseconds it took, got {value!r}")


def check_read_warnings(warnings: Any) -> None:
    """Raise :class:`DamagedRecord` unless ``warnings`` (a record's ``read_warnings``) is a list of messages."""
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise DamagedRecord(f"read_warnings must be a list of messages, got {warnings!r}")


def checked_results(results: Any, where: str) -> list[dict[str, Any]]:
    """``results`` as :func:`detens.coco.validate_coco_results` returns them.

    Raises:
        DamagedRecord: naming ``where``, the result and what is wrong with it (a NaN box, a box of 3 numbers,
            a score beyond [0, 1], ...).
    """
    try:
        return validate_coco_results(results, where)
    except (TypeError, ValueError) as err:
        raise DamagedRecord(str(err)) from None


def warn_of_damaged_record(logger: logging.Logger, path: Path, damage: DamagedRecord, then: str) -> None:
    """Name the damaged record at ``path`` and what is wrong (``damage``); ``then`` says what the run does
    instead (``"the image is detected again"``)."""
    logger.warning("%s: the record of an image finished by an earlier run is damaged (%s); %s", path, damage, then)
