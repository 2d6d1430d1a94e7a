"""The cache job's detection step on Ray Data: one pool of stateful predictor actors per ensemble entry.

The driver lists the images as paths (nothing is decoded on the driver), ``ray.data.from_items`` turns
them into a dataset, and ``map_batches`` runs :class:`EntryPredictor` actors over it: each actor builds
the entry's detector once, in its constructor (adapters unchanged), reads its batch's images itself and
returns one row per (image, member) with the member's COCO results as JSON (or the reason the image could
not be read). The driver streams the rows back and writes them as the local engine does (one partial
record per finished image), so everything after detection (resuming, ``<member>.json``, the summary) is
the local job's own code and a rerun skips the images already done.

Every worker runs this module and the adapters: on a cluster, install detens (and the detector libraries)
on every node and give every node the same paths to the images and weights (a shared file system).
"""

from __future__ import annotations

import base64
import builtins
import json
import logging
import pickle
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from detens._termination import raise_terminated
from detens.adapters.weights import resolve_model_weights
from detens.checks import check_flag, check_integer, check_real
from detens.engines.ray_address import (
    check_address,
    check_auto_finds_a_cluster,
    check_cluster_answers,
    check_num_cpus_with,
    check_running_session,
    cluster_to_join,
)
from detens.ensemble_config import EnsembleConfig, ModelConfig, with_absolute_paths

__all__ = [
    "RayOptions", "EntryPredictor", "FailureReportingActor", "detect_on_ray", "failure_record", "raise_failure", "ray_session",
    "ready_for_actors", "strip_ansi",
]

logger = logging.getLogger("detens.ray")


@dataclass(frozen=True)
class RayOptions:
    """How the Ray engine runs.

    In a process where Ray already runs, the engine uses that session: an ``address`` or ``num_cpus`` that
    it does not match is a ValueError when the session starts (see :class:`ray_session`).

    Args:
        address (str | None): an existing cluster (``host:port``, ``ray://host:port``, ``auto``: see
            :mod:`detens.engines.ray_address`), or ``local`` (a new local cluster); None starts a local one
            (unless ``$RAY_ADDRESS`` names one, which ``ray.init`` reads).
        actors (int): predictor actors per ensemble entry (model).
        num_gpus (float | None): GPUs per actor; None: 1 when the driver sees CUDA, else 0.
        num_cpus (int | None): CPUs of the local cluster to start (None: all); not given with the ``address``
            of an existing cluster, which has its own.
    """

    address: str | None = None
    actors: int = 1
    num_gpus: float | None = None
    num_cpus: int | None = None

    def __post_init__(self) -> None:
        """Checks each option (a TypeError for a value of another kind: ``"2"``, ``2.5`` actors, a bool; a
        ValueError out of range) and keeps NumPy numbers as the Python numbers Ray takes."""
        if self.address is not None and not isinstance(self.address, str):
            raise TypeError(f"address must be a str, got {type(self.address).__name__}: {self.address!r}")
        if self.address is not None:
            check_address(self.address)
        object.__setattr__(self, "actors", check_integer(self.actors, "actors", 1))
        if self.num_gpus is not None:
            object.__setattr__(self, "num_gpus", check_real(self.num_gpus, "num_gpus", 0.0))
        if self.num_cpus is not None:
            object.__setattr__(self, "num_cpus", check_integer(self.num_cpus, "num_cpus", 1))
        check_num_cpus_with(self.address, self.num_cpus)

    def gpus_per_actor(self) -> float:
        if self.num_gpus is not None:
            return float(self.num_gpus)
        import torch

        return 1.0 if torch.cuda.is_available() else 0.0


def ready_for_actors(
    ensemble: EnsembleConfig, models: Sequence[ModelConfig]
) -> tuple[EnsembleConfig, list[ModelConfig]]:
    """``ensemble`` and the ``models`` that actors will load, ready to be sent to them: their weights are
    looked up here, on the driver, so that a missing file is one error naming the model, not a Ray error
    per actor, and sent as the paths found here; and every file they name is made absolute, since the
    actors' working directory is the cluster's, not this process's.

    Raises:
        WeightsNotFoundError: the first of ``models`` whose weights are found nowhere.
    """
    ready = [_with_found_weights(model, ensemble) for model in models]
    found = {id(model): done for model, done in zip(models, ready, strict=True)}
    absolute = with_absolute_paths(ensemble)
    # the actors look weights up again where they run: a name found through this process's working
    # directory (a shared/models above it) or environment ($DETENS_WEIGHTS) is not found there
    members = [found.get(id(given), model) for given, model in zip(ensemble.models, absolute.models, strict=True)]
    sent = replace(absolute, models=members)
    sent.source = ensemble.source  # an actor's refusal of a member names the file, as the driver's does
    return sent, ready


def _with_found_weights(model: ModelConfig, ensemble: EnsembleConfig) -> ModelConfig:
    """``model`` of ``ensemble`` with its files made absolute, and its weights, when they are on disk, the
    path this process found them at (beside the ensemble's YAML first).

    Raises:
        WeightsNotFoundError: its weights are found nowhere (naming the model and the YAML).
    """
    resolved = resolve_model_weights(model, ensemble.weights_dir, ensemble.folder, label=ensemble.member_label(model))
    model = with_absolute_paths(model)
    if resolved is not None and resolved.local:
        model = replace(model, weights=str(Path(resolved.value).absolute()))
    return model


#: How many times a batch whose actor died is tried again (on a restarted actor) before the run stops.
ACTOR_TASK_RETRIES = 3


def map_on_actors(
    items: list[dict[str, Any]],
    actor_class: type,
    constructor_kwargs: dict[str, Any],
    batch_size: int,
    options: RayOptions,
) -> Iterator[dict[str, Any]]:
    """Rows of ``items`` through a pool of ``options.actors`` stateful ``actor_class`` actors
    (``map_batches``, numpy batches of ``batch_size``, ``options.gpus_per_actor()`` GPUs each), as they arrive.

    ``actor_class`` returns a ``failure`` column (see :func:`failure_record`): the first row that holds one
    stops the run with the actor's exception, raised here as it was raised there (a corrupt weights file
    is the ``ValueError`` the local engine gives, not a Ray error).
    """
    import_ray()
    import ray
    import ray.data

    check_gpus(options.gpus_per_actor(), ray.cluster_resources().get("GPU", 0.0), options.address)
    # a few blocks per actor keep every actor busy without splitting the work into tiny tasks
    dataset = ray.data.from_items(items, override_num_blocks=max(1, min(len(items), 4 * options.actors)))
    rows = dataset.map_batches(
        actor_class,
        fn_constructor_kwargs=constructor_kwargs,
        batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(size=options.actors),
        num_gpus=options.gpus_per_actor(),
        batch_format="numpy",
        # Ray Data retries a batch whose actor died without end: one that kills it every time (a native
        # crash, the system killing it for memory) would hold the run forever
        max_task_retries=ACTOR_TASK_RETRIES,
    ).iter_rows()
    try:
        for row in rows:
            if row["failure"]:
                raise_failure(str(row["failure"]))
            yield row
    except ray.exceptions.RayActorError as err:
        if "creation task" in str(err):  # not a death on images: its constructor failed, as Ray's error says
            raise
        raise ChildProcessError(
            f"a Ray actor ({actor_class.__name__}) died on the same images {ACTOR_TASK_RETRIES + 1} times: a "
            "native crash, or the system killing it for memory (Ray's worker logs say which); the images "
            "finished are saved, and the same command resumes"
        ) from err
    except ray.exceptions.RayTaskError as err:
        # what the actors do not catch themselves (see failure_record); Ray Data wraps a UDF's error in
        # its own UserCodeException, but a plain task error keeps the user's exception: raise that one
        cause = getattr(err, "cause", None)
        wrappers = (ray.exceptions.RayError, getattr(ray.exceptions, "UserCodeException", ray.exceptions.RayError))
        if isinstance(cause, Exception) and not isinstance(cause, wrappers):
            raise cause from err
        raise
    finally:
        close = getattr(rows, "close", None)
        if close is not None:  # stops the dataset's execution when the driver stops reading early
            close()


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (Ray colours the actor names in its messages)."""
    return _ANSI.sub("", text)


def failure_record(err: BaseException) -> str:
    """An exception raised on an actor, as a JSON string for a row's ``failure`` column.

    The actors catch their own errors (model load, detection) and send them as rows: raised out of an
    actor, Ray Data wraps an error of the constructor in an ``ActorDiedError`` and one of a batch in a
    ``UserCodeException``, both of which lose the exception itself (its type decides whether the command
    reports a user's mistake or a bug) and colour its text with terminal codes. :func:`raise_failure` raises
    it again on the driver.
    """
    try:
        pickled: str | None = base64.b64encode(pickle.dumps(err)).decode("ascii")
    except Exception:  # an attribute that does not pickle: the type's builtin base stands in for it
        pickled = None
    return json.dumps({
        "pickled": pickled,
        "type": f"{type(err).__module__}.{type(err).__qualname__}",
        "builtin_bases": [c.__name__ for c in type(err).__mro__ if c.__module__ == "builtins"],
        "message": str(err),
        "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__)),
    })


def raise_failure(record: str) -> NoReturn:
    """Raise on the driver the exception of a :func:`failure_record`: the actor's exception itself, or (when
    it cannot be unpickled here) its nearest builtin type with its message; the actor's traceback is added
    as a note (Python 3.11+)."""
    failure = json.loads(record)
    err: Any = None
    if failure.get("pickled"):
        try:
            err = pickle.loads(base64.b64decode(failure["pickled"]))  # noqa: S301 - our own actors' rows
        except Exception:
            err = None
    if not isinstance(err, BaseException):
        bases = [getattr(builtins, name, None) for name in failure.get("builtin_bases", [])]
        kind = next((b for b in bases if isinstance(b, type) and issubclass(b, Exception)), RuntimeError)
        err = kind(strip_ansi(f"{failure.get('type')}: {failure.get('message')}"))
    if hasattr(err, "add_note"):
        err.add_note(f"raised on a Ray actor:\n{strip_ansi(str(failure.get('traceback', '')))}")
    raise err


def check_gpus(per_actor: float, in_cluster: float, address: str | None) -> None:
    """Ray waits, without end, for GPUs that no node has: say so before.

    Raises:
        ValueError: a local cluster (``address`` None, which never grows) has fewer GPUs than one actor
            asks for. On a cluster given by ``address`` (an autoscaler may add GPU nodes) a warning.
    """
    if per_actor <= in_cluster:
        return
    message = (
        f"each actor asks for {per_actor:g} GPU but the Ray cluster has {in_cluster:g}; its actors would wait "
        "for one without end"
    )
    if address is None:
        raise ValueError(f"{message}: give --gpus-per-actor 0, or run where a GPU is")
    logger.warning("%s, unless the cluster adds GPU nodes", message)


def import_ray() -> Any:
    """``import ray``, or a :class:`~detens.extras.MissingExtraError` that says how to install it."""
    from detens.extras import import_extra

    return import_extra("ray", "the Ray engine needs ray: pip install 'detens[ray]' (or pip install 'ray[data]')")


def named_as_given(message: str, absolute: str, given: str) -> str:
    """An actor's message about the file ``absolute`` (the path the driver sent, from its working directory)
    with the file named as the user gave it, as the local engine names it."""
    return message.replace(repr(absolute), repr(given)) if absolute != given else message


def _sigterm_handler() -> Any:
    """The process's SIGTERM handler, or None outside the main thread (where ray.init sets none)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.getsignal(signal.SIGTERM)


class ray_session:  # noqa: N801 - used as a context manager, like open()
    """``ray.init`` for the engine (an existing cluster at ``options.address``, else a local one), and
    ``ray.shutdown`` on exit when this session started it.

    Ray's logger levels and Ray Data's progress-bar setting are the process's: what the session changes
    (``ray.init`` sets the ``ray`` logger's level; ``quiet`` sets more) is put back on exit, returned or
    raised, as it was before the session.

    Where Ray already runs in this process, its session is used as it is, and left running; an
    ``options.address`` that names another cluster, or ``options.num_cpus`` other than its CPUs, is a
    ValueError (:func:`~detens.engines.ray_address.check_running_session`).

    Args:
        options (RayOptions): the cluster to use or start.
        quiet (bool): warnings and errors only, for the session (the commands' ``--quiet``): the ``ray`` and
            ``ray.data`` loggers at ERROR and no Ray Data progress bars.
        address_name (str): how messages name ``options.address`` (the commands' ``--ray-address``).

    Raises:
        ValueError: an address or ``num_cpus`` that the running session does not match; ``$RAY_ADDRESS``
            that is no address.
        ConnectionError: nothing answers at the address, or ``auto`` finds no cluster on this machine.
    """

    def __init__(self, options: RayOptions, *, quiet: bool = False, address_name: str = "address") -> None:
        self.options = options
        self.quiet = check_flag(quiet, "quiet")
        self.address_name = address_name
        self.started = False
        self._levels: dict[str, int] = {}  # logger name -> its level before the session
        self._progress_bars: tuple[Any, bool] | None = None  # (Ray Data's context, its setting before)
        self._sigterm: Any = None  # the SIGTERM handler before ray.init, when the session started Ray

    def __enter__(self) -> Any:
        ray = import_ray()
        try:
            if self.quiet:  # ray sets its loggers up when imported: quiet them after that
                import ray.data

                for name in ("ray", "ray.data"):
                    self._set_level(name, logging.ERROR)
                context = ray.data.DataContext.get_current()
                self._progress_bars = (context, context.enable_progress_bars)
                context.enable_progress_bars = False
            if ray.is_initialized():
                check_running_session(self.options.address, self.options.num_cpus, self.address_name)
            else:
                kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
                if self.quiet:
                    kwargs["logging_level"] = logging.ERROR
                joined = cluster_to_join(self.options.address, self.address_name)
                if joined is not None:
                    address, what = joined
                    check_num_cpus_with(address, self.options.num_cpus, what)  # $RAY_ADDRESS's: read here
                    if address == "auto":
                        check_auto_finds_a_cluster(what)
                    check_cluster_answers(address, what)
                if self.options.address is not None:
                    kwargs["address"] = self.options.address
                if self.options.num_cpus is not None:
                    kwargs["num_cpus"] = int(self.options.num_cpus)
                self._levels.setdefault("ray", logging.getLogger("ray").level)  # ray.init sets it
                start = time.perf_counter()
                self._sigterm = _sigterm_handler()
                ray.init(**kwargs)
                self.started = True
                if self._sigterm is raise_terminated:  # ray.init sets its own: the command's comes first
                    signal.signal(signal.SIGTERM, raise_terminated)
                logger.info("ray started in %.1f s: %s", time.perf_counter() - start, ray.cluster_resources())
        except BaseException:
            self._put_back()
            raise
        return ray

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.started:
                import ray

                ray.shutdown()
        finally:
            self._put_back()

    def _set_level(self, name: str, level: int) -> None:
        self._levels.setdefault(name, logging.getLogger(name).level)
        logging.getLogger(name).setLevel(level)

    def _put_back(self) -> None:
        """The logger levels, the progress-bar setting and the SIGTERM handler as they were before the
        session (ray.init's handler would outlive it)."""
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
        self._levels.clear()
        if self._progress_bars is not None:
            context, enabled = self._progress_bars
            context.enable_progress_bars = enabled
            self._progress_bars = None


class FailureReportingActor:
    """A Ray Data actor that sends the error which stops it as a row (:func:`failure_record`), not as a Ray
    error: a subclass builds itself in ``_build`` (the constructor's arguments) and maps a batch in
    ``_map``, and names in ``failure_row`` the values of its other columns in the row that carries the
    failure."""

    failure_row: dict[str, Any] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.failure = ""
        try:
            self._build(*args, **kwargs)
        except Exception as err:  # sent with the first batch
            self.failure = failure_record(err)

    def _build(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def _map(self, batch: Mapping[str, np.ndarray]) -> dict[str, list[Any]]:
        raise NotImplementedError

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, list[Any]]:
        if not self.failure:
            try:
                return self._map(batch)
            except Exception as err:
                self.failure = failure_record(err)
        return {**{key: [value] for key, value in self.failure_row.items()}, "failure": [self.failure]}


class EntryPredictor(FailureReportingActor):
    """A Ray Data actor: one ``models`` entry of an ensemble config, loaded once per actor.

    Args:
        model (ModelConfig): the entry.
        ensemble (EnsembleConfig): its defaults (conf, imgsz, weights folders, ...).
        categories (dict[int, str] | None): the label space.
        members (list[str]): the entry's members (views) to run.

    Called with a batch ``{"image_id": int[B], "path": str[B], "todo": str[B]}`` (``todo``: the members
    that still need each image, a JSON list: a member's name may hold any character), returns the columns
    ``image_id``, ``member``, ``results`` (the COCO results as JSON), ``ms`` (detection time per image),
    ``error`` (why the image could not be read; empty when it was), ``read_warnings`` (what reading it warned
    of, a JSON list), ``load_s`` (the seconds this actor
    took to build the entry, on every row: rows do not say which actor made them) and ``failure`` (empty;
    else the only row, a :func:`failure_record` of the error that stopped the actor).
    """

    failure_row = {"image_id": -1, "member": "", "results": "[]", "ms": 0.0, "error": "", "read_warnings": "[]",
                   "load_s": 0.0}
    load_s = 0.0

    def _build(self, model: Any, ensemble: Any, categories: Mapping[int, str] | None, members: Sequence[str]) -> None:
        from detens.adapters import build_detector

        start = time.perf_counter()
        built = build_detector(model, ensemble, categories)
        self.load_s = time.perf_counter() - start
        loaded = list(built.members) if hasattr(built, "members") else [built]
        by_name = {m.name: m for m in loaded}
        missing = sorted(set(members) - set(by_name))
        if missing:
            raise ValueError(f"the built entry has members {sorted(by_name)}, not {missing}")
        self.members = {name: by_name[name] for name in members}

    def _map(self, batch: Mapping[str, np.ndarray]) -> dict[str, list[Any]]:
        from detens.adapters import detect_loaded
        from detens.coco import detections_to_coco
        from detens.sources import ImageReadError, read_image

        columns: dict[str, list[Any]] = {
            "image_id": [], "member": [], "results": [], "ms": [], "error": [], "read_warnings": [], "load_s": [],
            "failure": [],
        }
        images, ids, paths, wanted, warned = [], [], [], [], []
        rows = zip(batch["image_id"], batch["path"], batch["size"], batch["todo"], strict=True)
        for image_id, path, size, todo in rows:
            names = [str(n) for n in json.loads(str(todo))]
            notes: list[str] = []
            try:
                images.append(read_image(str(path), json.loads(str(size)), notes))
            except ImageReadError as err:
                for name in names:
                    columns["image_id"].append(int(image_id))
                    columns["member"].append(name)
                    columns["results"].append("[]")
                    columns["ms"].append(0.0)
                    columns["error"].append(str(err))
                    columns["read_warnings"].append("[]")
                    columns["load_s"].append(self.load_s)
                    columns["failure"].append("")
                continue
            ids.append(int(image_id))
            paths.append(str(path))
            wanted.append(set(names))
            warned.append(json.dumps(notes))  # the actors' log lines do not reach the driver
        for name, member in self.members.items():
            picked = [k for k in range(len(ids)) if name in wanted[k]]
            if not picked:
                continue
            start = time.perf_counter()
            dets = detect_loaded(member, [images[k] for k in picked], [paths[k] for k in picked])
            ms = (time.perf_counter() - start) * 1000 / len(picked)
            for k, det in zip(picked, dets, strict=True):
                columns["image_id"].append(ids[k])
                columns["member"].append(name)
                columns["results"].append(json.dumps(detections_to_coco(det, ids[k])))
                columns["ms"].append(round(ms, 3))
                columns["error"].append("")
                columns["read_warnings"].append(warned[k])
                columns["load_s"].append(self.load_s)
                columns["failure"].append("")
        return columns


def detect_on_ray(
    model: Any,
    ensemble: Any,
    categories: Mapping[int, str] | None,
    todo: Mapping[str, Sequence[int]],
    path_of: Callable[[int], str],
    batch_size: int,
    options: RayOptions,
    size_of: Callable[[int], tuple[int, int]] | None = None,
) -> Iterator[dict[str, Any]]:
    """Run one entry's members over their images on Ray; yields each finished (image, member) row as
    it arrives (``image_id``, ``member``, ``results`` (list of COCO dicts), ``ms``, ``error``,
    ``read_warnings`` (list of str), ``load_s``:
    the model-load seconds of the actor that made it).

    Args:
        todo: member -> the image ids it still needs.
        path_of: image id -> its file path (read by the actors, not here).
        size_of: image id -> its ``(height, width)`` in the annotations, which the actors check the read
            image against (:class:`~detens.sources.ImageSizeError`); None: not checked.
        batch_size: images per actor call.
    """
    needed: dict[int, list[str]] = {}
    for member, ids in todo.items():
        for image_id in ids:
            needed.setdefault(int(image_id), []).append(member)
    if not needed:
        return
    ensemble, (model,) = ready_for_actors(ensemble, [model])
    given = {image_id: str(path_of(image_id)) for image_id in needed}
    sent = {image_id: str(Path(path).absolute()) for image_id, path in given.items()}  # from the actors' cwd too
    items = [
        {
            "image_id": image_id,
            "path": sent[image_id],
            "size": json.dumps(None if size_of is None else list(size_of(image_id))),
            "todo": json.dumps(members),
        }
        for image_id, members in sorted(needed.items())
    ]
    constructor_kwargs = {
        "model": model,
        "ensemble": ensemble,
        "categories": dict(categories) if categories else None,
        "members": sorted(todo),
    }
    for row in map_on_actors(items, EntryPredictor, constructor_kwargs, batch_size, options):
        image_id = int(row["image_id"])
        yield {
            "image_id": image_id,
            "member": str(row["member"]),
            "results": json.loads(row["results"]),
            "ms": float(row["ms"]),
            "error": named_as_given(str(row["error"]), sent[image_id], given[image_id]),
            "read_warnings": [
                named_as_given(str(text), sent[image_id], given[image_id]) for text in json.loads(row["read_warnings"])
            ],
            "load_s": float(row["load_s"]),
        }
