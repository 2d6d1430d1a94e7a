"""Run an ensemble on images and fuse its detections.

    detens fuse --config coco_yolo3 --source PATH --out DIR [--method wbf | --head HEAD] [--save-per-model]

``--config``: a shipped ensemble by name (``coco_yolo3``, ``coco_yolo3_tiles``, ``coco_yolo4_tta``, ``coco_diverse``,
``coco_all6``) or a YAML file. ``--source``: an image, a folder (searched recursively), a glob (quote
it), or ``ultralytics-assets`` (the sample images bundled with Ultralytics). Flags override the config's
values; the resolved config is saved as ``DIR/config.yaml``.

``--method``: a fixed fuser (``wbf``, ``nms``, ``soft_nms``, ``mean``, ``vote``, ...) or a head type
(``theta``, ``deep``, ``selection``, ``superlearner``, ``calibration``, ``bagged``), which needs a head
file of that type. ``--head`` (a file, or a shipped head by name such as ``coco_yolo3_deep``) implies its
type; the outputs record the type that ran. The head's models are matched to the members by name, in any
order.

Writes into ``--out``:

- ``predictions.json``: the fused boxes as a plain COCO results list (``image_id``, ``category_id``,
  ``bbox`` ``[x, y, w, h]`` pixels, ``score``): what ``pycocotools.coco.COCO.loadRes`` reads;
- ``images.json``: the images and categories as a COCO dataset without annotations (``info``,
  ``images`` with ``id``, ``file_name`` (relative to the source folder), ``height``, ``width``,
  ``output_stem`` (the stem of its ``labels/`` and ``vis/`` files, unique per image: ``a.jpg`` and ``a.JPG``
  do not share one, and no image's file is at the path of a folder of others': ``x.png`` beside a folder
  ``x.jpg/`` of images gets ``x_png``, not ``x``, whose ``vis/x.jpg`` would be that folder; a stem whose
  files' names would be longer than the 255 bytes a file system takes for a name, such as that of a
  250-byte name given ``_png``, is cut short and ends in ``~`` and 12 hex digits of a digest of the
  whole, so such an image is fused and written like any other), ``categories``,
  ``annotations: []``), so COCO tools and FiftyOne can open the results; the images are listed by id, and
  each image has its own id: with a ``dataset`` in the config, the id of the dataset's image whose
  ``file_name`` is the image's relative path, else of its one image with the same base name (a base name
  that several images share, on either side, is refused before any work); images not in the dataset (or
  all, without one) get new ids after every id in use, in the source's order: 1..N for a new run of N
  images. Every image's id is given when the run starts, before any image is read, so that it depends
  neither on the order in which images finish (Ray's actors finish out of order) nor on an interruption:
  a resumed run gives the ids an uninterrupted one gives. An image that turns out unreadable leaves its
  id unused;
- ``labels/<stem>.txt``: YOLO labels ``class cx cy w h conf`` (normalized; scores >= output.labels_conf);
  ``class`` is the position of the box's category in ``images.json``'s ``categories``, which are sorted by
  id (a dataset's ids 1, 5, 9 are classes 0, 1, 2; COCO's 80 are Ultralytics' 0..79);
- ``vis/<stem>.jpg``: the image with the fused boxes and class names (scores >= output.vis_conf);
- ``per_model/<member>.json`` with ``--save-per-model``: each member's COCO results (same image ids);
- ``summary.json``: images, boxes, time per image per stage (the one-time compile of the fusion kernels
  apart: ``fuse_first_call_ms``, the first fusion call, timed on a tiny made-up image as the members
  load; on Ray each actor makes its own, and the one given is that of the actor whose result arrived
  first), the method and head type that ran, the members (``models``) and where their weights came from
  (``weights``). Both engines record the detectors that fused the images: a run that reads no image
  (every one unreadable) records no ``weights`` (``{}``) and no ``fuse_first_call_ms`` (null), and for
  ``models`` the names the config gives (``[]`` where it gives none). The local engine loads no detector
  (nor downloads its weights) for no image; the Ray engine's actors load theirs anyway, but it records
  the same; ``config.yaml``: the resolved config;
- ``partial/`` while a run is unfinished: one small file per finished image, ``partial/<name>.json``
  (``<name>``: the image's path relative to the source folder, where a folder named like a record,
  ``x.png.json/``, gets a ``_`` appended, and a name that ``.json`` makes longer than 255 bytes is cut
  short as a stem is; each record names its image), and beside it ``unfinished_run.json``, the run's
  members, their weights, the digests of its inputs, which a resumed run checks, and the id of every
  image. An interrupted run (Ctrl-C, a crash) leaves every file valid (all writes are atomic); running
  the same command again
  (without ``--overwrite``) skips the finished images, which keep the ids its outputs gave them (those of a run left unfinished by
  an earlier version, which numbered images as they finished, are renumbered, with a warning). A
  complete run removes both;
  running it again on more images adds them, and images finished earlier keep their results, ids and
  output stems whatever the new ``--source`` (a complete run whose ``images.json``, ``predictions.json`` or
  ``per_model/`` file cannot be read, or is not as a run writes it, is refused, naming the file: taken as
  absent, its images outside the new ``--source`` would be lost). A run left unfinished by an earlier version, which kept its
  record as ``partial/_run.json``, resumes too.
  A resumed run refuses a changed config, head file, ``precomputed`` results file or weights file (the
  members' weights on disk are recorded by sha256, as `detens cache` does).
  ``--overwrite`` starts over: the earlier outputs wait in ``.replaced/`` until the new run's first
  result, and come back if it fails before; if it is killed before (``kill -9``, a crash), the next run
  on ``--out`` puts them back first, saying so.

An ``--out`` holding outputs (``labels/``, ``vis/``, ...) that no run wrote is refused; an ``--out`` inside
the ``--source`` folder is not read back as input.
A second run on an ``--out`` that a running one uses is refused, naming it (``--out/.detens.lock``, held
until the run ends, however it ends). A run whose ``--out`` is moved or deleted, or its lock file removed,
while it runs stops with an error before it writes there again (its finished images stay where the
folder went); a run whose outputs lack images it fused (their records removed meanwhile: ``summary.json``
says ``complete: false``) ends with an error (exit status 2) once they are written.

Unreadable or corrupt images are reported and skipped; a run that can read none of its images writes
its summary and ends with an error (exit status 2). Sub-folders are kept under ``labels/`` and ``vis/``.
Everything that can be checked before the detectors load (the config, the method, its parameters' names
and values, the head and its models, the output folder, the images) is checked first, with either
``--engine``. So are the saved
predictions of ``precomputed`` members: every image must be among them, and every ``category_id`` (after
the member's ``class_map``) one of the categories the run writes, the ``dataset``'s or COCO's 80, with or
without ``--no-labels``; and every member's ``class_map``: each category id it gives must be one of them;
and so must every category id a head (or ``calibration``) has per-class parameters for: one trained on
another label space (COCO's, for a dataset of one's own) would fuse the ids it shares with the run's as
the classes they were there.
"""

from __future__ import annotations

import argparse

from detens.catalogue import ASSETS_SOURCE, DEFAULT_ENSEMBLE, FUSION_METHODS
from detens.cli import add_weights_dir_argument, finite_number, folder_path, integer
from detens.cli._engine import add_engine_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", default=DEFAULT_ENSEMBLE, help="shipped ensemble name or ensemble YAML (default: %(default)s)"
    )
    p.add_argument(
        "--source",
        required=True,
        help=f"an image, a folder (recursive), a glob (quote it), or {ASSETS_SOURCE!r} (Ultralytics' sample images)",
    )
    p.add_argument("--out", type=folder_path, required=True, help="output folder (created; a re-run resumes)")
    p.add_argument(
        "--method", help=f"fusion method or head type (overrides fusion.method): {', '.join(FUSION_METHODS)}"
    )
    p.add_argument(
        "--head", help="trained head file, or a shipped head's name; implies its type (overrides fusion.head)"
    )
    p.add_argument("--save-per-model", action="store_true", help="also save each member's own predictions")
    p.add_argument("--conf", type=finite_number, help="minimum detection score of every model (overrides conf)")
    p.add_argument("--imgsz", type=integer, help="inference size of every model (overrides imgsz)")
    p.add_argument("--device", help="device of every model: cpu, cuda, cuda:0 ... (overrides device)")
    p.add_argument("--batch", type=integer, help="images per detector call (overrides batch)")
    add_weights_dir_argument(p)
    p.add_argument("--vis-conf", type=finite_number, help="minimum score of drawn boxes (overrides output.vis_conf)")
    p.add_argument("--no-vis", action="store_true", help="do not write vis/")
    p.add_argument("--no-labels", action="store_true", help="do not write labels/")
    p.add_argument(
        "--overwrite", action="store_true", help="discard earlier results in --out instead of resuming"
    )
    add_engine_arguments(p)


def run(args: argparse.Namespace) -> int:
    from detens.jobs.fuse import FuseOptions, run

    return run(FuseOptions.from_namespace(args))


def main(argv: list[str] | None = None) -> int:
    from detens.cli import run_command

    return run_command("fuse", argv)
