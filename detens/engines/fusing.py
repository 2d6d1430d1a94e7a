"""The work of a ``detens fuse`` run that every engine does, the local one in the command's process and
Ray's actors alike: the fuser's parameters of an ensemble config, the one-time cost of the first fusion
call, and one image fused into its partial record and output files (computed, not written: the driver
writes them, so both engines' outputs are one code's)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from detens.adapters import detect_loaded, member_weights
from detens.coco import detections_to_coco
from detens.detections import Detections
from detens.ensemble_config import EnsembleConfig
from detens.export import yolo_lines
from detens.fusers import FUSERS, check_method, fuse, head_methods
from detens.visualize import draw_detections

__all__ = ["FuseSettings", "detect_batch", "fusion_params", "fuse_image", "results_of", "time_first_call", "weights_of"]


def fusion_params(config: EnsembleConfig, names: list[str] | None) -> dict[str, Any]:
    """The fuser's parameters: the config's, the members' weights and the loaded head, checked against
    the members (``names``; None: not known yet, checked again once the detectors are loaded).

    Checked here, before any detector loads, by the library's own checks (those ``detens.Ensemble`` runs):
    the parameter names the method takes, and their values (ranges, one weight per member, the head's
    members) on empty detections of each member; unnamed members count by position. With ``fusion.params``
    given, an error names the method and those params.

    Raises:
        ValueError: an unknown method, weights given twice, a head that does not fit the method or the
            members, a value out of range.
        TypeError: a parameter the method does not take (the message lists the ones it takes).
    """
    method = config.fusion.method
    check_method(method)
    params = dict(config.fusion.params)
    weights = member_weights(config)
    if weights and not any(weights):
        raise ValueError(f"every member's weight is 0 (models[].weight: {weights}): give at least one a weight above 0")
    # Equal weights weigh nothing: passed on, they would still scale every score of the NMS-style fusers
    # by 1/N (ensemble_boxes' w / Σw), so that weight 2 on every member would differ from weight 1.
    if len(set(weights)) > 1:
        if "weights" in params:
            raise ValueError(
                f"fusion weights are given twice: fusion.params.weights {params['weights']} and the members' "
                f"weight {weights}; set them in one place"
            )
        params["weights"] = weights
    if config.fusion.head is not None:
        if method in FUSERS and method != "theta":
            raise ValueError(
                f"a head ({config.fusion.head}) is given but the method is the fixed fuser {method!r}: a head "
                "runs as its own type; set fusion.method (or --method) to the head's type, or drop the head "
                "(fusion.head: null)"
            )
        from detens.heads import load_head

        params["head"] = load_head(config.fusion.head, model_names=names)
    elif method not in FUSERS or method == "theta":
        raise ValueError(f"method {method!r} needs a trained head: pass --head (a head file or a shipped name)")
    if "head" in params:
        runs_as = head_methods(params["head"])
        if method != "theta" and method not in runs_as:
            raise ValueError(f"the method {method!r} was given a {runs_as[-1]!r} head ({config.fusion.head}); "
                             f"set fusion.method (or --method) to {runs_as[-1]!r}")
    from detens.pipeline import check_fusion_params

    try:
        return check_fusion_params(method, params, names if names is not None else [None] * len(weights))
    except (TypeError, ValueError) as err:
        if not config.fusion.params:
            raise
        # the fuser's messages name a parameter alone: `max_det` is also a top-level key, the members' cap
        given = f"params {dict(config.fusion.params)}"
        if "weights" in params and "weights" not in config.fusion.params:
            given += f", the members' weights {params['weights']}"
        raise type(err)(f"fusion (method {method!r}, {given}): {err}") from err


def detect_batch(
    members: Sequence[Any], arrays: Sequence[np.ndarray], paths: Sequence[str | Path]
) -> tuple[list[list[Detections]], dict[str, float]]:
    """Every member's detections of a batch of images, per image (``[image][member]``, each named after
    its member), and each member's detection time per image in ms (``{"detect:<member>": ms}``)."""
    per_member, detect_ms = [], {}
    for member in members:
        start = time.perf_counter()
        per_member.append(detect_loaded(member, arrays, paths))
        detect_ms[f"detect:{member.name}"] = (time.perf_counter() - start) * 1000 / len(arrays)
    per_image = [[detections[i].with_source(member.name) for member, detections in zip(members, per_member, strict=True)]
                 for i in range(len(arrays))]
    return per_image, detect_ms


def results_of(det: Detections) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "image_id"} for r in detections_to_coco(det, 0)]


@dataclass(frozen=True)
class FuseSettings:
    """What a run fuses and writes every image with.

    Args:
        config (EnsembleConfig): the run's config (its ``fusion.method`` and ``output`` options).
        params (dict[str, Any]): the fuser's parameters (:func:`fusion_params`, of the loaded members).
        categories (dict[int, str]): the label space, for drawing.
        yolo_ids (list[int]): the category id of each YOLO class number, for the labels.
    """

    config: EnsembleConfig
    params: dict[str, Any]
    categories: dict[int, str]
    yolo_ids: list[int]


def fuse_image(
    name: str,
    stem: str,
    image: Any,
    per_model: list[Detections],
    settings: FuseSettings,
    times: dict[str, float],
    read_warnings: Sequence[str] = (),
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Fuse one image: its partial record and its output files (``labels/<stem>.txt``, ``vis/<stem>.jpg``
    relative to ``--out``, as bytes), computed without writing anything. ``read_warnings``: what reading
    the image warned of (:func:`~detens.sources.read_image`'s ``notes``), kept in the record for the summary."""
    config, categories, yolo_ids = settings.config, settings.categories, settings.yolo_ids
    params = settings.params
    t = time.perf_counter()
    fused = fuse(per_model, config.fusion.method, **params)
    times["fuse"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    files: dict[str, bytes] = {}
    if config.output.labels:
        lines = yolo_lines(fused, yolo_ids, conf=config.output.labels_conf)
        files[f"labels/{stem}.txt"] = "".join(line + "\n" for line in lines).encode("utf-8")
    if config.output.vis:
        drawn = draw_detections(image, fused, categories, conf=config.output.vis_conf)
        ok, encoded = cv2.imencode(".jpg", drawn, [cv2.IMWRITE_JPEG_QUALITY, 90])
        if not ok:
            raise RuntimeError(f"OpenCV could not encode the drawing of {name}")
        files[f"vis/{stem}.jpg"] = encoded.tobytes()
    record: dict[str, Any] = {
        "file_name": name,
        "height": fused.image_size[0],
        "width": fused.image_size[1],
        "fused": results_of(fused),
        "output_stem": stem,
    }
    if config.output.save_per_model:
        record["per_model"] = {det.source: results_of(det) for det in per_model}
    if read_warnings:
        record["read_warnings"] = list(read_warnings)
    # the image's outputs: its labels, its drawing (encoded) and its results as COCO dicts
    times["outputs"] = (time.perf_counter() - t) * 1000
    record["times_ms"] = {k: round(v, 3) for k, v in times.items()}
    return record, files


def weights_of(member: Any) -> str | None:
    """Where a member's weights came from (the absolute path of a local file, or an upstream name), for the
    summary, which is read from other folders than the run's."""
    inner = getattr(member, "detector", member)  # a test-time view: its detector
    resolved = getattr(inner, "resolved", None)
    if resolved is not None:
        return os.path.abspath(resolved.value) if resolved.local else resolved.value
    return getattr(inner, "weights_source", None)


def time_first_call(method: str, params: dict[str, Any], member_names: list[str], label: int) -> float:
    """Milliseconds of one fusion of a tiny made-up image: the one-time costs (compiling the matching
    kernels, first use of the head) that would otherwise be charged to the first real image."""
    import torch

    per_model = [
        Detections(
            boxes=torch.tensor([[10.0 + i, 10.0, 50.0, 50.0 + i]]),
            scores=torch.tensor([0.5]),
            labels=torch.tensor([label]),
            image_size=(64, 64),
            source=name,
        )
        for i, name in enumerate(member_names)
    ]
    start = time.perf_counter()
    fuse(per_model, method, **params)
    return round((time.perf_counter() - start) * 1000, 2)
