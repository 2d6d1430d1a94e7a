"""The ``--engine`` flags shared by the commands that run detectors (``cache``, ``fuse``); the job reads them
as its :class:`~detens.jobs._engine.EngineOptions`."""

from __future__ import annotations

import argparse
import dataclasses

from detens.cli import finite_number, integer
from detens.engines import ENGINES
from detens.jobs._engine import EngineOptions

__all__ = ["add_engine_arguments"]


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    defaults = {field.name: field.default for field in dataclasses.fields(EngineOptions)}
    p.add_argument("--engine", choices=ENGINES, default=defaults["engine"],
                   help="local: this process (default: %(default)s); ray: Ray Data actors (pip install 'detens[ray]')")
    p.add_argument("--ray-address", help="with --engine ray: an existing cluster (host:port, ray://host:port, auto); "
                   "default: start a local one (or use $RAY_ADDRESS's, as Ray does)")
    p.add_argument("--actors", type=integer, default=defaults["actors"],
                   help="with --engine ray: predictor actors per model (default 1)")
    p.add_argument("--gpus-per-actor", type=finite_number,
                   help="with --engine ray: GPUs per actor (default: 1 when CUDA is present, else 0)")
