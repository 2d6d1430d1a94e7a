"""The ``--engine`` options shared by the commands that run detectors (``cache``, ``fuse``)."""

from __future__ import annotations

import argparse
from typing import Any

from detens.cli import UsageError
from detens.engines import ENGINES

__all__ = ["add_engine_arguments", "ray_options"]


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="local: this process (default); ray: Ray Data actors (pip install 'detens[ray]')")
    p.add_argument("--ray-address", help="with --engine ray: an existing cluster (auto, ray://host:10001); "
                   "default: start a local one")
    p.add_argument("--actors", type=int, default=1, help="with --engine ray: predictor actors per model (default 1)")
    p.add_argument("--gpus-per-actor", type=float,
                   help="with --engine ray: GPUs per actor (default: 1 when CUDA is present, else 0)")


def ray_options(args: argparse.Namespace) -> Any:
    """The :class:`~detens.engines.ray_cache.RayOptions` of ``--engine ray`` (None for the local engine);
    Ray flags without ``--engine ray`` are a :class:`UsageError`."""
    if args.engine != "ray":
        if args.ray_address or args.actors != 1 or args.gpus_per_actor is not None:
            raise UsageError("--ray-address, --actors and --gpus-per-actor go with --engine ray")
        return None
    if args.actors < 1:
        raise UsageError(f"--actors must be >= 1, got {args.actors}")
    if args.gpus_per_actor is not None and not args.gpus_per_actor >= 0:  # NaN too
        raise UsageError(f"--gpus-per-actor must be >= 0, got {args.gpus_per_actor:g}")
    from detens.engines.ray_cache import RayOptions, import_ray

    import_ray()  # a missing ray is reported before any work
    return RayOptions(address=args.ray_address, actors=args.actors, num_gpus=args.gpus_per_actor)
