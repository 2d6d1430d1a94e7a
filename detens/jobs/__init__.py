"""What a user starts, as plain functions over the library: one module per job (``cache``, ``fuse``,
``train``, ``evaluate``, ``bench``, ``report``, ``configs``), each with ``run(options) -> int`` over a checked options
dataclass (:mod:`detens.jobs._options`). The ``detens`` command (:mod:`detens.cli`) parses a command line
into those options; :mod:`detens.jobs.calls` (``detens.cache``, ``detens.fuse_images``) makes them from a
Python call's keyword options."""

from __future__ import annotations

import importlib
from typing import Any

from detens.jobs._options import JobOptions

__all__ = ["JOBS", "job"]


#: command -> (job module, its options class); each module has ``run(options) -> int``
JOBS: dict[str, tuple[str, str]] = {
    "cache": ("detens.jobs.cache", "CacheOptions"),
    "fuse": ("detens.jobs.fuse", "FuseOptions"),
    "train": ("detens.jobs.train", "TrainOptions"),
    "evaluate": ("detens.jobs.evaluate", "EvaluateOptions"),
    "bench": ("detens.jobs.bench", "BenchOptions"),
    "report": ("detens.jobs.report", "ReportOptions"),
    "configs": ("detens.jobs.configs", "ConfigsOptions"),
}


def job(command: str) -> tuple[Any, type[JobOptions]]:
    """The job module of ``command`` and its options class.

    Raises:
        ValueError: an unknown command, naming the valid ones.
    """
    if command not in JOBS:
        raise ValueError(f"unknown job {command!r}; valid: {', '.join(JOBS)}")
    name, options_class = JOBS[command]
    module = importlib.import_module(name)
    return module, getattr(module, options_class)
