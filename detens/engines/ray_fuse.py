"""The fuse job on Ray Data: actors that hold the whole ensemble and the fusion (any method or head).

The driver lists the images as paths and checks the saved predictions of ``precomputed`` members (as the
local engine does, before any work); ``map_batches`` runs :class:`EnsembleFuser` actors, each of which
builds the ensemble's detectors and loads the head once (in its constructor), then reads, detects and
fuses its batches and returns per image the same partial record and output files (YOLO labels, the
drawing) the local engine makes. The driver writes them, so the outputs (``predictions.json``,
``images.json``, ``labels/``, ``vis/``, ``summary.json``) are the local job's, and a rerun resumes.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detens.engines.ray_cache import (
    FailureReportingActor,
    RayOptions,
    map_on_actors,
    named_as_given,
    ready_for_actors,
)

__all__ = ["EnsembleFuser", "fuse_on_ray"]


class EnsembleFuser(FailureReportingActor):
    """A Ray Data actor running an ensemble config end to end on batches of image paths.

    Args:
        config (EnsembleConfig): the resolved config (its head path must be readable on every node).
        categories (dict[int, str]): the label space, for drawing.
        yolo_ids (list[int]): category id of each YOLO class index, for the labels.

    Called with ``{"name": str[B], "stem": str[B], "path": str[B]}``, returns ``name``, ``record`` (the
    partial record as JSON), ``files`` (JSON of {relative path: base64 bytes}), ``members`` (JSON of
    {member name: where its weights came from}), ``first_call_ms`` (this actor's :func:`time_first_call
    <detens.engines.fusing.time_first_call>`, on every row: rows do not say which actor made them), ``error`` (why
    the image could not be read; empty when it was) and ``failure`` (empty; else the only row, a
    :func:`~detens.engines.ray_cache.failure_record` of the error that stopped the actor: the driver raises it).
    """

    failure_row = {"name": "", "record": "", "files": "{}", "members": "{}", "first_call_ms": 0.0, "error": ""}

    def _build(self, config: Any, categories: Mapping[int, str], yolo_ids: Sequence[int]) -> None:
        from detens.adapters import build_ensemble
        from detens.engines.fusing import FuseSettings, fusion_params, time_first_call, weights_of

        self.members = build_ensemble(config)
        names = [m.name for m in self.members]
        self.weights = json.dumps({m.name: weights_of(m) for m in self.members})
        self.settings = FuseSettings(config, fusion_params(config, names), dict(categories), list(yolo_ids))
        # the one-time compile happens here, not in the first image's fusion time
        self.first_call_ms = time_first_call(config.fusion.method, self.settings.params, names, min(categories))

    def _map(self, batch: Mapping[str, np.ndarray]) -> dict[str, list[Any]]:
        from detens.engines.fusing import detect_batch, fuse_image
        from detens.sources import ImageReadError, read_image

        columns: dict[str, list[Any]] = {
            "name": [], "record": [], "files": [], "members": [], "first_call_ms": [], "error": [], "failure": []
        }
        loaded, read_ms, read_notes = [], [], []
        for name, stem, path in zip(batch["name"], batch["stem"], batch["path"], strict=True):
            start = time.perf_counter()
            notes: list[str] = []
            try:
                image = read_image(str(path), notes=notes)
            except ImageReadError as err:
                for key, value in (("name", str(name)), ("record", ""), ("files", "{}"), ("members", self.weights),
                                   ("first_call_ms", self.first_call_ms), ("error", str(err)), ("failure", "")):
                    columns[key].append(value)
                continue
            loaded.append((str(name), str(stem), str(path), image))
            read_ms.append((time.perf_counter() - start) * 1000)
            read_notes.append(notes)
        if not loaded:
            return columns
        per_image, detect_ms = detect_batch(
            self.members, [image for *_, image in loaded], [path for _, _, path, _ in loaded]
        )
        for i, (name, stem, _, image) in enumerate(loaded):
            times = {"read": read_ms[i], **detect_ms}
            record, files = fuse_image(name, stem, image, per_image[i], self.settings, times, read_notes[i])
            columns["name"].append(name)
            columns["record"].append(json.dumps(record))
            columns["files"].append(json.dumps({k: base64.b64encode(v).decode("ascii") for k, v in files.items()}))
            columns["members"].append(self.weights)
            columns["first_call_ms"].append(self.first_call_ms)
            columns["error"].append("")
            columns["failure"].append("")
        return columns


def fuse_on_ray(
    items: Sequence[tuple[str, str, str]],
    config: Any,
    categories: Mapping[int, str],
    yolo_ids: Sequence[int],
    options: RayOptions,
) -> Iterator[dict[str, Any]]:
    """Fuse ``items`` (``(name, stem, path)`` per image) on Ray; yields each image's row as it arrives:
    ``name``, ``record`` (dict, None when unreadable), ``files`` ({relative path: bytes}), ``members`` ({name: weights}),
    ``first_call_ms`` (the one-time cost of the first fusion call on the actor that made the row), ``error``."""
    if not items:
        return
    config, _ = ready_for_actors(config, config.models)
    given = {n: str(p) for n, _, p in items}
    sent = {n: str(Path(p).absolute()) for n, _, p in items}  # the actors' working directory may be another
    rows = map_on_actors(
        [{"name": n, "stem": s, "path": sent[n]} for n, s, _ in items],
        EnsembleFuser,
        {"config": config, "categories": dict(categories), "yolo_ids": list(yolo_ids)},
        config.batch,
        options,
    )
    for row in rows:
        name = str(row["name"])
        yield {
            "name": name,
            "record": json.loads(row["record"]) if row["record"] else None,
            "files": {k: base64.b64decode(v) for k, v in json.loads(row["files"]).items()},
            "members": json.loads(row["members"]),
            "first_call_ms": float(row["first_call_ms"]),
            "error": named_as_given(str(row["error"]), sent[name], given[name]) if name in given else str(row["error"]),
        }
