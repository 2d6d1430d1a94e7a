#!/usr/bin/env python
"""Run an ensemble on images and fuse its detections.

    python tools/fuse.py --config configs/ensembles/coco_yolo3.yaml --source PATH --out DIR \\
        [--method wbf | theta --head PATH] [--save-per-model]

``--source``: an image, a folder (searched recursively), a glob (quote it), or ``ultralytics-assets`` (the
sample images bundled with Ultralytics). Flags override the config's values; the resolved config is saved
as ``DIR/config.yaml``.

Writes into ``--out``:

- ``predictions.json``: ``{"info", "images": [{"id", "file_name", "height", "width", "output_stem"}],
  "categories", "results": [COCO results]}`` — ``images`` maps each file name (relative to the source folder)
  to its image id (the ids of ``dataset`` in the config when it has one) and to the stem of its ``labels/``
  and ``vis/`` files (unique per image: ``a.jpg`` and ``a.JPG`` do not share one);
- ``labels/<stem>.txt``: YOLO labels ``class cx cy w h conf`` (normalized; scores >= output.labels_conf);
- ``vis/<stem>.jpg``: the image with the fused boxes and class names (scores >= output.vis_conf);
- ``per_model/<member>.json`` with ``--save-per-model``: each member's COCO results (same image ids);
- ``summary.json``: images, boxes, time per image per stage; ``config.yaml``: the resolved config;
- ``partial/``: one small file per finished image. An interrupted run (Ctrl-C, a crash) leaves every
  file valid (all writes are atomic); running the same command again skips the finished images and
  completes ``predictions.json``. ``--overwrite`` starts over.

Unreadable or corrupt images are reported and skipped. Sub-folders are kept under ``labels/`` and ``vis/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

try:
    import detens  # noqa: F401
except ImportError:  # run from a clone without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cv2
import yaml
from tqdm import tqdm

from detens._cli import log_above_progress_bars
from detens.adapters import build_ensemble, dataset_categories, detect_loaded, member_weights
from detens.coco import detections_to_coco, load_coco_gt
from detens.detections import Detections
from detens.ensemble_config import EnsembleConfig, load_ensemble_config, save_ensemble_config
from detens.export import save_yolo_txt
from detens.fusers import FUSERS, fuse
from detens.io import atomic_write_bytes, atomic_write_json, output_stems
from detens.labels import COCO_CATEGORY_IDS, COCO_ID_TO_NAME
from detens.sources import ImageReadError, list_images, read_image
from detens.visualize import draw_detections

logger = logging.getLogger("detens.fuse")

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "ensembles" / "coco_yolo3.yaml"
ASSETS_SOURCE = "ultralytics-assets"
# Outputs that --overwrite removes (never anything else in --out).
OUTPUT_NAMES = ("partial", "labels", "vis", "per_model", "predictions.json", "summary.json", "config.yaml")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="fuse.py",
        description="Run an ensemble of detectors on images and fuse their boxes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__[__doc__.index("Writes into") :] if __doc__ else None,
    )
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="ensemble YAML (default: %(default)s)")
    p.add_argument(
        "--source",
        required=True,
        help=f"an image, a folder (recursive), a glob (quote it), or {ASSETS_SOURCE!r} (Ultralytics' sample images)",
    )
    p.add_argument("--out", type=Path, required=True, help="output folder (created; a re-run resumes)")
    p.add_argument(
        "--method", help="fusion method (overrides fusion.method), e.g. wbf, nms, mean, vote, theta"
    )
    p.add_argument("--head", help="trained head file for --method theta (overrides fusion.head)")
    p.add_argument("--save-per-model", action="store_true", help="also save each member's own predictions")
    p.add_argument("--conf", type=float, help="minimum detection score of every model (overrides conf)")
    p.add_argument("--imgsz", type=int, help="inference size of every model (overrides imgsz)")
    p.add_argument("--device", help="device of every model: cpu, cuda, cuda:0 ... (overrides device)")
    p.add_argument("--batch", type=int, help="images per detector call (overrides batch)")
    p.add_argument("--weights-dir", help="folder that weights names are relative to (overrides weights_dir)")
    p.add_argument("--vis-conf", type=float, help="minimum score of drawn boxes (overrides output.vis_conf)")
    p.add_argument("--no-vis", action="store_true", help="do not write vis/")
    p.add_argument("--no-labels", action="store_true", help="do not write labels/")
    p.add_argument(
        "--overwrite", action="store_true", help="discard earlier results in --out instead of resuming"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar, warnings only")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ config
def resolve_config(args: argparse.Namespace) -> EnsembleConfig:
    """The config file with the flags applied (a flag given for every model also replaces each model's own value)."""
    per_model = {"conf": args.conf, "imgsz": args.imgsz, "device": args.device, "batch": args.batch}
    overrides: dict[str, Any] = {
        "weights_dir": args.weights_dir,
        "fusion.method": args.method,
        "fusion.head": args.head,
        "output.save_per_model": True if args.save_per_model else None,
        "output.vis": False if args.no_vis else None,
        "output.labels": False if args.no_labels else None,
        "output.vis_conf": args.vis_conf,
    }
    config = load_ensemble_config(args.config, overrides, per_model)
    if args.head is None and args.method is not None and config.fusion.head is not None:
        if args.method != load_ensemble_config(args.config).fusion.method:
            # The YAML's head belongs to the YAML's method; another --method does not use it.
            logger.info("--method %s: not using the config's head %s", args.method, config.fusion.head)
            config.fusion.head = None
    return config


def fusion_params(config: EnsembleConfig, names: list[str]) -> dict[str, Any]:
    FUSERS.get(config.fusion.method)  # unknown method: the error lists the valid ones
    params = dict(config.fusion.params)
    weights = member_weights(config)
    if any(w != 1.0 for w in weights):
        params["weights"] = weights
    if config.fusion.head is not None:
        if config.fusion.method != "theta":
            raise ValueError(
                f"fusion.head is set but the method is {config.fusion.method!r}; use --method theta"
            )
        from detens.heads import load_head

        params["head"] = load_head(config.fusion.head, model_names=names)
    return params


# ------------------------------------------------------------------------------------------------ images
def resolve_source(source: str) -> tuple[list[Path], Path]:
    """The images and the folder their output names are relative to."""
    if source == ASSETS_SOURCE and not Path(source).exists():
        import importlib.util

        spec = importlib.util.find_spec("ultralytics")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("--source ultralytics-assets needs the ultralytics package")
        source = str(Path(next(iter(spec.submodule_search_locations))) / "assets")
    path = Path(source).expanduser()
    images = list_images(source)
    if path.is_dir():
        root = path
    elif images:
        root = Path(os.path.commonpath([str(p.parent.absolute()) for p in images]))
    else:
        root = path.parent
    return images, root


def relative_name(path: Path, root: Path) -> str:
    try:
        return path.absolute().relative_to(root.absolute()).as_posix()
    except ValueError:
        return path.name


# ----------------------------------------------------------------------------------------------- partial
def partial_path(out: Path, name: str) -> Path:
    return out / "partial" / f"{name}.json"


def read_partial(out: Path, name: str) -> dict[str, Any] | None:
    path = partial_path(out, name)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) and record.get("file_name") == name else None


def check_resume(out: Path, config: EnsembleConfig, overwrite: bool) -> None:
    if overwrite:
        for item in OUTPUT_NAMES:
            target = out / item
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        return
    saved = out / "config.yaml"
    if (out / "partial").is_dir() and saved.is_file():
        previous = yaml.safe_load(saved.read_text(encoding="utf-8"))
        current = yaml.safe_load(yaml.safe_dump(_config_dict(config), sort_keys=False))
        if previous != current:
            raise SystemExit(
                f"error: {out} holds results of a different config (see {saved}); use another --out, "
                "or --overwrite to discard them"
            )


def _config_dict(config: EnsembleConfig) -> dict[str, Any]:
    from detens.config import to_dict

    return to_dict(config)


# ---------------------------------------------------------------------------------------------- outputs
def image_ids(names: list[str], dataset: str | None) -> dict[str, int]:
    """Image ids: the dataset's (matched by file name, then by base name), else 1..N in file order."""
    if dataset is None:
        return {n: i + 1 for i, n in enumerate(names)}
    gt = load_coco_gt(dataset)
    by_file = {str(im["file_name"]): int(im["id"]) for im in gt.dataset["images"]}
    by_base: dict[str, list[int]] = defaultdict(list)
    for file_name, image_id in by_file.items():
        by_base[Path(file_name).name].append(image_id)
    ids: dict[str, int] = {}
    next_id = max(by_file.values(), default=0) + 1
    for name in names:
        image_id = by_file.get(name)
        if image_id is None and len(by_base.get(Path(name).name, [])) == 1:
            image_id = by_base[Path(name).name][0]
        if image_id is None:
            logger.warning("%s is not in %s; it gets the new image id %d", name, dataset, next_id)
            image_id, next_id = next_id, next_id + 1
        ids[name] = image_id
    return ids


def write_outputs(
    out: Path,
    config: EnsembleConfig,
    names: list[str],
    member_names: list[str],
    categories: dict[int, str],
    unreadable: dict[str, str],
    run: dict[str, Any],
) -> dict[str, Any]:
    """Assemble predictions.json, per_model/*.json and summary.json from the partial records."""
    records = {n: r for n in names if (r := read_partial(out, n)) is not None}
    done = [n for n in names if n in records]
    ids = image_ids(done, config.dataset)
    stems = output_stems(names)  # the names of each image's labels/ and vis/ files
    images, results = [], []
    per_model: dict[str, list[dict[str, Any]]] = {m: [] for m in member_names}
    stage_ms: dict[str, float] = defaultdict(float)
    boxes_total = boxes_shown = 0
    for name in done:
        record, image_id = records[name], ids[name]
        images.append(
            {"id": image_id, "file_name": name, "height": record["height"], "width": record["width"],
             "output_stem": stems[name]}
        )
        for r in record["fused"]:
            results.append({**r, "image_id": image_id})
        boxes_total += len(record["fused"])
        boxes_shown += sum(r["score"] >= config.output.vis_conf for r in record["fused"])
        for member, member_results in (record.get("per_model") or {}).items():
            per_model.setdefault(member, []).extend({**r, "image_id": image_id} for r in member_results)
        for stage, ms in record.get("times_ms", {}).items():
            stage_ms[stage] += ms
    category_list = [{"id": int(c), "name": n} for c, n in sorted(categories.items())]
    info = {
        "description": f"detens fused detections: ensemble {config.name!r}, method {config.fusion.method!r}",
        "models": member_names,
        "method": config.fusion.method,
        "complete": len(done) + len(unreadable) == len(names),
    }
    atomic_write_json(
        out / "predictions.json",
        {"info": info, "images": images, "categories": category_list, "results": results},
    )
    if config.output.save_per_model:
        for member, member_results in per_model.items():
            atomic_write_json(out / "per_model" / f"{member}.json", member_results)
    summary = {
        "ensemble": config.name,
        "method": config.fusion.method,
        "models": member_names,
        "images": len(names),
        "done": len(done),
        "processed_this_run": run["processed"],
        "resumed": run["resumed"],
        "unreadable": unreadable,
        "interrupted": run["interrupted"],
        "boxes": boxes_total,
        f"boxes_score_ge_{config.output.vis_conf:g}": boxes_shown,
        "ms_per_image": {k: round(v / max(1, len(done)), 2) for k, v in stage_ms.items()},
        "wall_s_this_run": round(run["wall_s"], 3),
        "images_per_s_this_run": round(run["processed"] / run["wall_s"], 3) if run["wall_s"] > 0 else None,
        "weights": run["weights"],
    }
    atomic_write_json(out / "summary.json", summary, indent=2)
    return summary


def _results_of(det: Detections) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "image_id"} for r in detections_to_coco(det, 0)]


def process_image(
    out: Path,
    name: str,
    stem: str,
    image: Any,
    per_model: list[Detections],
    config: EnsembleConfig,
    params: dict[str, Any],
    categories: dict[int, str],
    yolo_ids: list[int],
    times: dict[str, float],
) -> Detections:
    t = time.perf_counter()
    fused = fuse(per_model, config.fusion.method, **params)
    times["fuse"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    if config.output.labels:
        save_yolo_txt(out / "labels" / f"{stem}.txt", fused, yolo_ids, conf=config.output.labels_conf)
    if config.output.vis:
        drawn = draw_detections(image, fused, categories, conf=config.output.vis_conf)
        ok, encoded = cv2.imencode(".jpg", drawn, [cv2.IMWRITE_JPEG_QUALITY, 90])
        if not ok:
            raise RuntimeError(f"OpenCV could not encode the drawing of {name}")
        atomic_write_bytes(out / "vis" / f"{stem}.jpg", encoded.tobytes())
    record: dict[str, Any] = {
        "file_name": name,
        "height": fused.image_size[0],
        "width": fused.image_size[1],
        "fused": _results_of(fused),
    }
    if config.output.save_per_model:
        record["per_model"] = {det.source: _results_of(det) for det in per_model}
    times["write"] = (time.perf_counter() - t) * 1000
    record["times_ms"] = {k: round(v, 3) for k, v in times.items()}
    atomic_write_json(partial_path(out, name), record)  # last: a partial record means the image is done
    return fused


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _weights_of(member: Any) -> str | None:
    """Where a member's weights came from (resolved path or upstream name), for the summary."""
    inner = getattr(member, "detector", member)  # a test-time view: its detector
    resolved = getattr(inner, "resolved", None)
    if resolved is not None:
        return resolved.value
    return getattr(inner, "weights_source", None)


# ------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_above_progress_bars(args.quiet)

    config = resolve_config(args)
    out: Path = args.out
    images, root = resolve_source(args.source)
    if not images:
        print(f"error: no images found in {args.source!r}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    check_resume(out, config, args.overwrite)
    save_ensemble_config(config, out / "config.yaml")

    names = [relative_name(p, root) for p in images]
    if len(set(names)) != len(names):  # several roots: fall back to full paths
        names = [p.absolute().as_posix().lstrip("/") for p in images]
    stems = output_stems(names)
    done = {n for n in names if read_partial(out, n) is not None}
    todo = [(p, n) for p, n in zip(images, names, strict=True) if n not in done]

    run_file = out / "partial" / "_run.json"
    previous_run = _read_json(run_file)  # same config (check_resume): same members
    members: list[Any] | None = None
    if isinstance(previous_run, dict) and "models" in previous_run:
        member_names, weights = list(previous_run["models"]), dict(previous_run["weights"])
    else:
        members = build_ensemble(config)
        member_names = [m.name for m in members]
        weights = {m.name: _weights_of(m) for m in members}
        atomic_write_json(run_file, {"models": member_names, "weights": weights})
    params = fusion_params(config, member_names)
    categories = dataset_categories(config) or dict(COCO_ID_TO_NAME)
    yolo_ids = sorted(categories) if config.dataset else list(COCO_CATEGORY_IDS)

    unreadable: dict[str, str] = {}
    processed = 0
    interrupted = False
    start = time.perf_counter()
    bar = tqdm(
        total=len(names),
        initial=len(done),
        unit="img",
        desc=config.name,
        disable=args.quiet,
        dynamic_ncols=True,
    )
    try:
        for begin in range(0, len(todo), config.batch):
            chunk = todo[begin : begin + config.batch]
            loaded, loaded_names, read_ms = [], [], []
            for path, name in chunk:
                t = time.perf_counter()
                try:
                    loaded.append((path, read_image(path)))
                    loaded_names.append(name)
                    read_ms.append((time.perf_counter() - t) * 1000)
                except ImageReadError as err:
                    unreadable[name] = str(err)
                    logger.warning("skipped: %s", err)
                    bar.update(1)
            if not loaded:
                continue
            if members is None:  # resuming: load the models only once an image needs them
                members = build_ensemble(config)
                if [m.name for m in members] != member_names:
                    raise SystemExit(
                        f"error: the ensemble's members changed since the first run in {out}; use --overwrite"
                    )
            arrays = [image for _, image in loaded]
            paths = [path for path, _ in loaded]
            per_member: list[list[Detections]] = []
            detect_ms: dict[str, float] = {}
            for member in members:
                t = time.perf_counter()
                per_member.append(detect_loaded(member, arrays, paths))
                detect_ms[f"detect:{member.name}"] = (time.perf_counter() - t) * 1000 / len(arrays)
            for i, name in enumerate(loaded_names):
                times = {"read": read_ms[i], **detect_ms}
                dets = [per_member[n][i].with_source(member_names[n]) for n in range(len(members))]
                process_image(
                    out, name, stems[name], arrays[i], dets, config, params, categories, yolo_ids, times
                )
                processed += 1
                bar.update(1)
    except KeyboardInterrupt:
        interrupted = True
        logger.warning("interrupted: the finished images are saved; run the same command again to resume")
    finally:
        bar.close()
    run = {
        "processed": processed,
        "resumed": len(done),
        "interrupted": interrupted,
        "wall_s": time.perf_counter() - start,
        "weights": weights,
    }
    summary = write_outputs(out, config, names, member_names, categories, unreadable, run)
    print_summary(out, config, summary)
    return 130 if interrupted else 0


def print_summary(out: Path, config: EnsembleConfig, summary: dict[str, Any]) -> None:
    stages = ", ".join(f"{k.removeprefix('detect:')} {v:.1f}" for k, v in summary["ms_per_image"].items())
    shown_key = f"boxes_score_ge_{config.output.vis_conf:g}"
    lines = [
        f"{summary['ensemble']} ({summary['method']} of {', '.join(summary['models'])}): "
        f"{summary['done']}/{summary['images']} images done ({summary['processed_this_run']} this run, "
        f"{summary['resumed']} resumed, {len(summary['unreadable'])} unreadable)",
        f"boxes: {summary['boxes']} fused ({summary[shown_key]} with score >= {config.output.vis_conf:g})",
        f"ms per image: {stages}",
    ]
    for name, err in summary["unreadable"].items():
        lines.append(f"unreadable: {name}: {err}")
    written = ["predictions.json"]
    if config.output.labels:
        written.append("labels/")
    if config.output.vis:
        written.append("vis/")
    if config.output.save_per_model:
        written.append("per_model/")
    written += ["summary.json", "config.yaml"]
    lines.append(f"results in {out}/: {', '.join(written)}")
    if summary["interrupted"]:
        lines.append("interrupted: run the same command again to finish")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
