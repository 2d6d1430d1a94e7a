#!/usr/bin/env python
"""Cache each ensemble member's detections on a COCO-format dataset, for training and evaluating fusion.

    detens cache --config coco_yolo3 --images DIR --gt instances.json --out predictions/ \\
        [--models 'yolo26n*,yolov8n'] [--device cuda:0] [--conf 0.001] [--shard i/n]
    detens cache merge --out predictions/ [--gt instances.json]      # after sharded runs

The images are the ground truth's (``--gt``): their ids and file names come from it, the files are
``--images/<file_name>``. Every member of the ensemble (a model with ``tta`` views gives one member per
view) writes ``--out/<member>.json``: a plain COCO results list (``image_id``, ``category_id``, ``bbox``
``[x, y, w, h]`` pixels, ``score``), sorted by image id, in the label space of the ground truth. Scores
and counts follow the config (``conf`` 0.001 and ``max_det`` 300 by default); flags override it. The
config's ``dataset`` defaults to ``--gt``, so model classes are mapped onto the ground truth's categories;
a ``dataset`` of other categories than ``--gt``'s (an id that one of them lacks, or that they name as
different classes) is refused before any model loads: the members' labels would be recorded as ``--gt``'s.

Order of work: the models in turn. Each model of the config is loaded once and run over all images
before the next one is loaded (one model in memory at a time); the views of a test-time-augmented model
share the loaded model and each image is read once for all of them. ``--models`` picks members by name or
glob (``'yolo26n*'``: the model and all its views; left out: every member; an empty value is an error); a
config entry without ``name`` is loaded up front to learn its members' names and released at once (it is
loaded again when its turn comes). A member may not be named ``cache_summary`` (its ``<member>.json``
would be the summary), in any case.

Writes into ``--out``:

- ``<member>.json``: the member's COCO results, written (atomically) once every image is done;
- ``.partial/<member>/<image_id>.json``: one small file per finished image (an image with no box is a
  finished image with an empty list), and ``_settings.json``, the settings that produced them. A killed
  run leaves every file valid (all writes are atomic); running the same command again (without
  ``--overwrite``) skips the finished images. Changed settings (``conf``, ``imgsz``, weights, ...) and changed input files are refused unless
  ``--overwrite``: a ``precomputed`` member's results file or image map (its ``images``, or the
  ``images.json`` beside its results) rewritten at the same path, and weights that are not the file the
  earlier run used (a model re-exported over the old one, or the same name found in another folder through
  ``$DETENS_WEIGHTS`` or ``--weights-dir``) or that are no longer found on disk (a name that would now be
  downloaded). Where the weights were found is no setting: the same files through another
  ``--weights-dir`` resume (and their shards merge). The sha256 of each file is recorded; of a weights
  folder such as an OpenVINO export, one over its files and their names; of an ONNX model whose tensors
  lie in external-data files, one over the model and those files. ``--overwrite`` discards the selected
  members' earlier results: those of this shard's images, and, when they were made with other settings,
  all of them (every shard's and image's, so that no later run takes them for results of the new
  settings). Every selected
  member is checked before anything is written, so a refused run changes nothing; ``--overwrite`` removes
  a member's earlier results only once its model has given its first new result, so a run that fails
  before (a bad ``--device``, a missing weights file) leaves them, and ``config.yaml``, as they were. A
  cache written before the digests (or the image map's) were recorded resumes on the files as they are
  now and records their digests from then on. Delete ``.partial/`` once everything is cached to save space
  (a later run then starts over);
- ``cache_summary.json``: per member: images, boxes, unreadable files, detection seconds (summed over
  images, across resumed runs), wall and model-load seconds of the last run (``wall_s_this_run``,
  ``load_s_this_run``; with ``--engine ray`` the load is the slowest actor's, the actors loading in
  parallel), the settings; also written when a run stops early (``stopped_by``: ``interrupt``, ``max_images`` or the
  error; null for a run that ran to its end), with the members it got to, so that their unreadable
  images stay listed; ``image_ids``: the images of ``--gt`` (``detens evaluate`` and ``detens train`` refuse
  an annotation file with images beyond them, which every model would seem to have found nothing in);
  ``software``: the versions of Python, detens, torch, the detector runtimes and the
  scorers that the run had (a resumed member's earlier images may come from other versions);
- ``config.yaml``: the resolved config (the file with the flags applied).

A second run on an ``--out`` that a running one uses is refused, naming it (``--out/.detens.lock``, held
until the run ends, however it ends); the shards of one split may run at once into one ``--out``, each
shard once, but none beside an unsharded run or a merge of that ``--out`` (whichever starts second is
refused, naming the other). The shards share each member's ``_settings.json``: a shard whose settings
differ from those recorded (by another shard or an unsharded run) is refused, naming the settings that
differ, also when the two start at the same moment (the settings are compared and recorded holding
``--out/.detens.cache.lock`` for that moment); its ``--overwrite`` is refused too while another shard
runs, which may be writing results with the recorded settings, and when another shard recorded its own
settings after this one started (run it again once that shard has ended).
A run whose ``--out`` is moved or deleted, or its lock file removed, while it runs stops with an error
(exit status 2) before it writes there again; its finished images stay where the folder went, and a run
on that folder resumes them.

Sharding: ``--shard i/n`` (``0 <= i < n``) takes the images at positions ``i, i + n, i + 2n, ...`` of the
ground truth's images sorted by id, and writes ``--out/shards/<member>.shard-<i>-of-<n>.json`` (the
shard's results with the image ids it covers), ``shards/cache_summary.shard-<i>-of-<n>.json`` and
``shards/config.shard-<i>-of-<n>.yaml``, and, as it starts, ``shards/.annotations.shard-<i>-of-<n>.json``
(its ``--gt``): a shard started on another annotation file than a shard of its split already in
``--out`` is refused, naming both files (with ``--overwrite`` it starts over on its file, and a warning
names the shards to run again on it). Run the shards with any launcher (processes, machines, GPUs
with ``--device``), collect every ``shards/`` folder into one ``--out/shards/``, then ``merge``: it checks
that every image of the ground truth is covered exactly once by shards made on the same annotation file
with the same settings, naming the missing shards (incomplete: a run of it stopped before its file was
written) and images otherwise (and the files or settings that differ, with the shards of each), and writes
``<member>.json`` and ``cache_summary.json``.

The saved predictions of ``precomputed`` members are checked before any model loads: every image of
the run must be among them, and every ``category_id`` (after the member's ``class_map``) one of the
ground truth's categories (the config's ``dataset``'s when it names one).

Unreadable or corrupt images are reported, skipped and listed in the summary (each member's
``unreadable``); they are not finished, so a later run tries them again, and they stay listed until a run
reads them. ``detens train`` and ``detens evaluate`` leave them out, for every member. A run that can
read none of its images writes its summary and ends with an error (exit status 2).
"""

from __future__ import annotations

import argparse

from detens.catalogue import DEFAULT_ENSEMBLE
from detens.cli import add_weights_dir_argument, finite_number, folder_path, integer, run_command
from detens.cli._engine import add_engine_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action", nargs="?", choices=["merge"],
        help="merge: join the shards in OUT/shards into <member>.json (same as --merge)",
    )
    p.add_argument(
        "--config", default=DEFAULT_ENSEMBLE, help="shipped ensemble name or ensemble YAML (default: %(default)s)"
    )
    p.add_argument(
        "--images",
        type=folder_path,
        help="folder holding the images (the ground truth's file_name is relative to it)",
    )
    p.add_argument("--gt", help="COCO annotation file: the images' ids, file names and categories")
    p.add_argument("--out", type=folder_path, required=True, help="output folder (created; a re-run resumes)")
    p.add_argument(
        "--models",
        help="comma-separated member names or globs to cache (quote them: 'yolo26n*,yolov8n'); default: all",
    )
    p.add_argument("--shard", help="i/n: process only the images at positions i, i+n, ... (0 <= i < n)")
    p.add_argument("--merge", action="store_true", help="join the shards in OUT/shards into <member>.json")
    p.add_argument("--conf", type=finite_number, help="minimum detection score of every model (overrides conf)")
    p.add_argument("--iou", type=finite_number, help="NMS IoU of every model (overrides iou)")
    p.add_argument(
        "--max-det", type=integer, help="maximum detections per image of every model (overrides max_det)"
    )
    p.add_argument("--imgsz", type=integer, help="inference size of every model (overrides imgsz)")
    p.add_argument("--device", help="device of every model: cpu, cuda, cuda:0 ... (overrides device)")
    p.add_argument("--batch", type=integer, help="images per detector call (overrides batch)")
    add_weights_dir_argument(p)
    p.add_argument(
        "--max-images",
        type=integer,
        help="stop after this many new images per model (as if interrupted; run again to go on)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="discard the selected members' earlier results (in this shard) instead of resuming",
    )
    add_engine_arguments(p)


def run(args: argparse.Namespace) -> int:
    from detens.jobs.cache import CacheOptions, run

    return run(CacheOptions.from_namespace(args))


def main(argv: list[str] | None = None) -> int:
    return run_command("cache", argv)
