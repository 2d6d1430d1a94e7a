"""The engine options shared by the jobs that run detectors (``cache``, ``fuse``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from detens.engines import ENGINES
from detens.jobs._options import JobOptions, UsageError, integer, number, text

__all__ = ["EngineOptions", "ray_options"]


@dataclasses.dataclass(kw_only=True)
class EngineOptions(JobOptions):
    """The options of a job that runs detectors on an engine; its own options derive from this.

    Attributes:
        engine (str): ``local`` (this process) or ``ray`` (Ray Data actors).
        ray_address (str | None): with ``ray``: an existing cluster (``host:port``, ``ray://host:port``,
            ``auto``); None starts a local one.
        actors (int | None): with ``ray``: predictor actors per model (None: 1).
        gpus_per_actor (float | None): with ``ray``: GPUs per actor (None: 1 when CUDA is present, else 0).
    """

    engine: str = text("local", choices=ENGINES)
    ray_address: str | None = text()
    actors: int | None = integer()
    gpus_per_actor: float | None = number()


def ray_options(options: EngineOptions) -> Any:
    """The :class:`~detens.engines.ray_cache.RayOptions` of ``engine="ray"`` (None for the local engine);
    Ray options without ``engine="ray"`` are a :class:`UsageError`.

    Args:
        options: a job's :class:`EngineOptions`.
    """
    if options.engine != "ray":
        # given at all, their defaults included: a run on the local engine would leave them unused unseen
        if options.ray_address is not None or options.actors is not None or options.gpus_per_actor is not None:
            raise UsageError("--ray-address, --actors and --gpus-per-actor go with --engine ray")
        return None
    from detens.engines.ray_address import check_address

    if options.ray_address is not None:
        try:
            check_address(options.ray_address, "--ray-address", "leave the option out")
        except ValueError as err:
            raise UsageError(str(err)) from None
    actors = 1 if options.actors is None else options.actors
    if actors < 1:
        raise UsageError(f"--actors must be >= 1, got {actors}")
    if options.gpus_per_actor is not None and not options.gpus_per_actor >= 0:  # NaN too
        raise UsageError(f"--gpus-per-actor must be >= 0, got {options.gpus_per_actor:g}")
    from detens.engines.ray_cache import RayOptions, import_ray

    import_ray()  # a missing ray is reported before any work
    return RayOptions(address=options.ray_address, actors=actors, num_gpus=options.gpus_per_actor)
