"""The finished methods of a ``detens evaluate`` run that did not complete, kept so that the same command
resumes where it stopped instead of fitting and scoring them again.

``<out stem>.unfinished/`` beside ``--out`` holds ``run.json`` (``{"key": ...}``: a digest of everything
that makes a method's row, see :func:`run_key`) and one ``<seed>-<digest of the method's name>.json.gz``
per finished method and fold seed: the method's metrics, fits, calibration bins and pooled held-out
predictions, floats in full, so a resumed row is the row the interrupted run computed, to the last bit.
A run whose key differs (another annotation file, other predictions, other options) starts the folder
over; a run that completes removes it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import shutil
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from detens.evaluation import MethodResult
from detens.io import atomic_write_bytes, atomic_write_json, parse_json, read_json_file

__all__ = ["UnfinishedRun", "discard_unfinished", "run_key", "unfinished_folder"]

logger = logging.getLogger(__name__)


def unfinished_folder(out: Path) -> Path:
    """Where a run with ``--out out`` keeps its finished methods until it completes."""
    return out.with_name(out.stem + ".unfinished")


def discard_unfinished(out: Path) -> None:
    """The run with ``--out out`` completed: its files hold every method."""
    shutil.rmtree(unfinished_folder(out), ignore_errors=True)


def run_key(parts: Mapping[str, Any]) -> str:
    """A digest of ``parts`` (JSON, anything else by its ``repr``: training configs are dataclasses)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode("utf-8")).hexdigest()


class UnfinishedRun:
    """The finished methods of the run with ``--out out`` and key ``key``: an earlier run's with the same key
    are kept (and resumed), any other earlier run's are discarded when this run saves its first method (a
    run that stops before, on a mistake in its options, leaves them and writes nothing)."""

    def __init__(self, out: Path, key: str) -> None:
        self.folder = unfinished_folder(out)
        self.key = key
        try:
            self._ours = read_json_file(self.folder / "run.json", "unfinished run's key").get("key") == key
        except (OSError, ValueError, AttributeError):
            self._ours = False
        others = 0 if self._ours else len(list(self.folder.glob("*.json.gz")))
        if others:  # said now, while a Ctrl-C can still keep them
            logger.warning(
                "%s holds %d method result%s finished by an interrupted run with other inputs or options (annotation "
                "file, predictions, methods, their settings, --cv, --seed, ...): this run discards them when it "
                "finishes its first method; to resume that run instead, stop this one and run its command again",
                self.folder, others, "s" if others > 1 else "",
            )

    def count(self) -> int:
        """How many method results (one per method and fold seed) of this run's key the folder keeps."""
        return len(list(self.folder.glob("*.json.gz"))) if self._ours else 0

    def _path(self, seed: int, name: str) -> Path:
        return self.folder / f"{seed}-{hashlib.sha256(name.encode('utf-8')).hexdigest()[:16]}.json.gz"

    def finished(self, seed: int, names: list[str]) -> dict[str, MethodResult]:
        """The methods of ``names`` that an earlier run with this key finished with fold seed ``seed``; a file
        that cannot be read is left out (the method runs again)."""
        found: dict[str, MethodResult] = {}
        if not self._ours:
            return found
        for name in names:
            path = self._path(seed, name)
            if not path.is_file():
                continue
            try:
                stored = parse_json(gzip.decompress(path.read_bytes()), "finished method", path)
                if stored["name"] != name:
                    raise ValueError(f"holds {stored['name']!r}")
                found[name] = MethodResult(stored["metrics"], stored["fitted"], stored["calibration"], stored["results"])
            # EOFError: cut short (a full disk); zlib.error: damaged within
            except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError) as err:
                logger.warning("%s: cannot read the finished %s (%s); it runs again", path, name, err)
        return found

    def save(self, seed: int, name: str, result: MethodResult) -> None:
        if not self._ours:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.folder / "run.json", {"key": self.key})
            self._ours = True
        stored = {"name": name, "metrics": result.metrics, "fitted": result.fitted,
                  "calibration": result.calibration, "results": result.results}
        atomic_write_bytes(self._path(seed, name), gzip.compress(json.dumps(stored).encode("utf-8"), compresslevel=3))

