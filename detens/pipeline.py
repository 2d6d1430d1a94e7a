"""detens inside existing pipelines: an ``Ensemble`` of detectors, Ultralytics ``Results`` fusion, and a
torchvision post-processing module.

Dimension legend: N models, B images, K boxes in one image.

Every entry point fuses image by image with :func:`detens.fuse`, so the methods and their parameters
(``method="wbf"``, ``iou_thr=...``, ``method="theta", head=...``) are the same everywhere.

Label spaces:

- ``Ensemble``: detectors return ``Detections`` already in detens' label space (COCO category ids for
  detens' adapters).
- ``fuse_results``: inside, a box's label is the COCO category id of its class when the first model's
  class names are COCO's 80 classes in COCO order (so heads trained on detens' COCO predictions apply),
  else the first model's class index. Other models' classes are matched to the first model's *by name*,
  so models whose names are the same set in another order fuse correctly; different name sets are an error.
- ``TorchvisionFusion``: torchvision's labels (category ids) are kept as they are, COCO's unless its
  ``label_space=`` names their classes.

Each refuses a head whose per-class parameters were trained on other classes than that label space's
(:func:`detens.heads.check_head_label_space`), as ``detens fuse`` does.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from detens.checks import check_flag, check_integer, check_name_list
from detens.convert import (
    _as_image_size,
    coco_category_ids_for,
    detections_to_results,
    detections_to_torchvision,
    results_to_detections,
    torchvision_to_detections,
)
from detens.detections import Detections
from detens.fusers import (
    FUSERS,
    check_members_named,
    check_parameter_names,
    default_method,
    fuse,
    resolve_method,
)

if TYPE_CHECKING:
    from ultralytics.engine.results import Results

__all__ = ["Ensemble", "PredictionList", "PredictionStream", "fuse_results", "TorchvisionFusion", "Detector", "check_fusion_params"]

logger = logging.getLogger(__name__)

#: A detector: ``detector(images: list[path | BGR ndarray]) -> list[Detections]`` with a ``.name``.
Detector = Callable[[Sequence[Any]], Sequence[Detections]]


# ------------------------------------------------------------------------------------------------ shared
def _fusion_params(method: str, head: Any, params: dict[str, Any], model_names: Sequence[str] | None) -> dict:
    """Check ``method`` and its parameters once, up front; load a head given as a path.

    Raises:
        ValueError: unknown method (the error lists the valid ones).
        TypeError: a parameter the method does not take (the error lists the ones it takes).
    """
    params = dict(params)
    if head is not None:
        if isinstance(head, (str, Path)):
            from detens.heads import load_head

            head = load_head(head, model_names=list(model_names) if model_names is not None else None)
        params["head"] = head
    fuser = FUSERS.get(resolve_method(method, params))  # a fuser, or a head type given its head
    check_parameter_names(method, fuser, params, own=("calibration", "max_det"))  # detens.fuse's own, around any fuser
    return params


def _heads_of(params: dict[str, Any]) -> dict[str, Any]:
    return {key: params.get(key) for key in ("head", "calibration")}


def check_fusion_params(
    method: str, params: dict[str, Any], member_names: Sequence[str | None], head: Any = None
) -> dict[str, Any]:
    """``params`` of ``method`` for the members ``member_names`` (None for a member not named yet), checked
    before any detector runs: the names the method takes, then their values (ranges, one weight per
    member, a head's members), as :class:`Ensemble` checks them. ``head`` (a head, or the path or shipped
    name of one, loaded here) joins ``params``; None keeps a head ``params`` holds.

    Raises:
        ValueError: an unknown method, a value out of range, a head of other members.
        TypeError: a parameter the method does not take (the message lists the ones it takes).
    """
    checked = _fusion_params(method, head, params, member_names)
    _check_fusion_values(method, checked, member_names)
    return checked


def _check_fusion_values(method: str, params: dict[str, Any], names: Sequence[str | None]) -> None:
    """Have the fuser check the values of ``params`` (ranges, one weight per member, the head's members) on
    empty detections of each member, so that a mistake is reported before any detector runs, not after."""
    device = _device_of(params.get("head"))  # a head computes on its own device
    fuse([Detections.empty((1, 1), source=name, device=device) for name in names], method, **params)


def _device_of(head: Any) -> torch.device:
    """The device of a head's first parameter or buffer; the CPU for anything else."""
    tensors = itertools.chain(head.parameters(), head.buffers()) if isinstance(head, nn.Module) else iter(())
    first = next(tensors, None)
    return first.device if first is not None else torch.device("cpu")


def _lists_per_model(per_model: Sequence[Any], what: str, items: str, example: str) -> list[list[Any]]:
    """``per_model`` as one list per model; one item in place of a model's list (a ``Results``, an output
    dict, a tensor) is a ``TypeError``, not a list of its boxes."""
    for n, entry in enumerate(per_model):
        single = hasattr(entry, "boxes") or isinstance(entry, (str, bytes, Mapping, Tensor))
        if single or not isinstance(entry, Iterable):
            raise TypeError(
                f"{what}[{n}] must be model {n}'s list of {items}, got {type(entry).__name__}; for one image "
                f"per model pass {example}"
            )
    return [list(entry) for entry in per_model]


def _check_model_names(model_names: Sequence[str] | None, num_models: int) -> list[str | None]:
    if model_names is None:  # unnamed: a head then takes the models in its own order
        return [None] * num_models
    names = [str(n) for n in model_names]
    if len(names) != num_models:
        raise ValueError(f"model_names has {len(names)} names for {num_models} models: {names}")
    return names


# ---------------------------------------------------------------------------------------------- Ensemble
def _check_one_label_space(detectors: Sequence[Any], names: Sequence[str]) -> tuple[dict[int, str], bool]:
    """Refuse detectors whose declared label spaces (their ``categories``, ``{id: name}``) name one id as
    different classes: fused by id, one model's class would be merged with another's. A detector that
    declares none, or an id one of them leaves out, is not compared.

    Returns:
        The label space they declare together (``{id: name}``, the first name of each id), and whether every
        detector declares one (else the ids of those that do not are unknown).

    Raises:
        ValueError: naming both detectors and the first ids that differ.
    """
    from detens.adapters._labels import describe_label_space_difference, normalize_class_name
    from detens.checks import first_few

    seen: dict[int, tuple[str, str]] = {}  # category id -> (its name, the first detector that names it)
    for detector, name in zip(detectors, names, strict=True):
        categories = getattr(detector, "categories", None)
        if not isinstance(categories, Mapping):
            continue
        # each as describe_label_space_difference takes it: (id, both names), where each name comes from
        differ = [((c, seen[c][0], categories[c]), f"in {seen[c][1]!r}", f"in {name!r}") for c in sorted(categories)
                  if c in seen and normalize_class_name(categories[c]) != normalize_class_name(seen[c][0])]
        if differ:
            shown = first_few(differ, 3, show=lambda d: describe_label_space_difference(*d))
            raise ValueError(
                f"the detectors are in different label spaces: {shown}; give "
                "them one (the same categories=, with a class_map where a model names its classes otherwise)"
            )
        for c, class_name in categories.items():
            seen.setdefault(c, (class_name, name))
    declared = all(isinstance(getattr(d, "categories", None), Mapping) for d in detectors)
    return {c: class_name for c, (class_name, _) in seen.items()}, declared


def _check_heads_label_space(
    params: dict[str, Any], label_space: Mapping[int, str], complete: bool, whose: str = "the detectors' label space"
) -> None:
    """Refuse a head (or calibration) of ``params`` whose per-class parameters belong to another label space
    than the models' (:func:`detens.heads.check_head_label_space`), as ``detens fuse`` refuses it; ``whose``
    names the label space in the message."""
    if not label_space:
        return
    from detens.heads import check_head_label_space

    for key, head in _heads_of(params).items():
        if head is not None and not isinstance(head, (str, Path)):
            check_head_label_space(head, label_space, f"the {key}", whose, complete=complete)


class Ensemble:
    """Run several detectors on the same images and fuse their boxes image by image.

    Args:
        detectors (list): callables ``detector(images) -> list[Detections]`` (one per image, in one label
            space), each with a ``.name`` — e.g. detens' adapters — or models already loaded: an
            ``ultralytics.YOLO`` or a torchvision detection ``nn.Module``, wrapped in their adapter with its
            defaults and named after the model (:func:`detens.adapters.as_detector`; wrap one yourself to
            name it: ``UltralyticsDetector(model, name="v8")``). An ``AugmentedDetector`` adds one member
            per view. The boxes of each member carry its name as their ``source``.
        method (str | None): a fusion method of :func:`detens.fuse` (``"wbf"``, ``"theta"``, ...). None
            (default): ``"wbf"``, or ``"theta"`` (which runs any head) when ``head`` is given.
        head: for ``method="theta"`` or a head type (``"deep"``, ...): a head, the path of a saved one, or
            a shipped head's name (``"coco_yolo3_deep"``), checked against the detector names.
        **params: the method's parameters (``iou_thr``, ``weights``, ...), checked here, names and values
            (an ``iou_thr`` of 5, weights of another length, a head of other models): a mistake is reported
            before any detector runs.

    An Ensemble may be called from several threads at once (the workers of a threaded server sharing one) and
    gives each what a call alone gives: detens' adapters run one call at a time of each loaded Ultralytics or
    torchvision model, which keep a call's settings in the model (detectors sharing a model share its turn),
    while ONNX Runtime sessions, the other members and the fusion run side by side. A detector of your own is
    called from those threads as it is, and a model given to detens must not be called by your code meanwhile.

    Example::

        ens = Ensemble([YOLO("a.tflite"), UltralyticsDetector("b.onnx")], method="wbf", iou_thr=0.55)
        fused = ens(["bus.jpg"])              # list[Detections], one per image
        fused = ens.predict("images/")        # a file, folder or glob, like Ultralytics' predict
        fused.paths, fused.skipped            # the images of the Detections; unreadable images and why
    """

    def __init__(
        self, detectors: Sequence[Detector], method: str | None = None, head: Any = None, **params: Any
    ) -> None:
        if callable(detectors) or not isinstance(detectors, Sequence) or not detectors:
            raise ValueError("Ensemble needs a non-empty list of detectors")
        from detens.adapters import as_detector
        from detens.adapters.augmented import AugmentedDetector

        # an AugmentedDetector returns every view's boxes per image: each view is one member
        self.detectors = [
            member
            for i, d in enumerate(detectors)
            for member in (d.members if isinstance(d, AugmentedDetector) else [as_detector(d, f"detectors[{i}]")])
        ]
        self.names = [str(getattr(d, "name", None) or type(d).__name__) for d in self.detectors]
        if len(set(self.names)) != len(self.names):
            raise ValueError(
                f"detector names must be unique (they identify the ensemble's members), got {self.names}; "
                "give each detector its own with name= (UltralyticsDetector(model, name=...), OnnxDetector(file, "
                "name=...), ...)"
            )
        label_space, every_detector_declares_one = _check_one_label_space(self.detectors, self.names)
        self.method = method = default_method(method, head, params)
        self.params = check_fusion_params(method, params, self.names, head)
        _check_heads_label_space(self.params, label_space, complete=every_detector_declares_one)

    def __repr__(self) -> str:
        return f"Ensemble(detectors={self.names}, method={self.method!r})"

    def run_detectors(
        self, images: Sequence[Any], paths: Sequence[Any] | None = None
    ) -> list[list[Detections]]:
        """Every detector on ``images``; returns ``per_model[n][b]``, checked for count and image size.

        ``paths`` (optional) name the files that ``images`` (BGR arrays already read) came from; detectors
        that find saved predictions by file name (``PrecomputedDetector``) need them. With ``paths`` each
        detector gets the arrays through :func:`detens.adapters.detect_loaded`.
        """
        from detens.adapters import detect_loaded

        if paths is not None and len(paths) != len(images):
            raise ValueError(f"got {len(paths)} paths for {len(images)} images")
        per_model = []
        for name, detector in zip(self.names, self.detectors, strict=True):
            out = list(detector(images)) if paths is None else detect_loaded(detector, images, paths)
            if len(out) != len(images):
                raise ValueError(f"detector {name!r} returned {len(out)} Detections for {len(images)} images")
            for b, det in enumerate(out):
                if not isinstance(det, Detections):
                    raise TypeError(
                        f"detector {name!r} returned {type(det).__name__} for image {b}, not Detections"
                    )
            # the member's name, which a head was checked against, whatever source the detector set
            per_model.append([d.with_source(name) for d in out])
        for b in range(len(images)):
            sizes = [per_model[n][b].image_size for n in range(len(self.detectors))]
            if len(set(sizes)) != 1:
                raise ValueError(
                    f"image {b}: detectors disagree on its size {dict(zip(self.names, sizes, strict=True))}; "
                    "each detector must report boxes in original-image pixels"
                )
        return per_model

    def __call__(self, images: Sequence[Any] | str | Path | np.ndarray) -> list[Detections]:
        """Detect and fuse.

        Args:
            images: a list of image paths or BGR ``uint8`` arrays ``[H, W, 3]`` (one path or array is
                accepted too).

        Returns:
            list[Detections]: one fused Detections per image, in order.
        """
        from detens.adapters._base import as_image_list

        return self._detect_and_fuse(as_image_list(images))

    def _detect_and_fuse(self, images: list[Any], paths: Sequence[Any] | None = None) -> list[Detections]:
        if not images:
            return []
        per_model = self.run_detectors(images, paths)
        return [
            fuse([per_model[n][b] for n in range(len(self.detectors))], method=self.method, **self.params)
            for b in range(len(images))
        ]

    def predict(
        self,
        source: str | Path | Sequence[str | Path],
        batch_size: int = 8,
        stream: bool = False,
        on_error: Literal["skip", "raise"] = "skip",
    ) -> PredictionList | PredictionStream:
        """Detect and fuse over a file, folder or glob (``detens.sources.list_images``).

        Images are read once (``detens.sources.read_image``) and handed to every detector as BGR arrays
        with their paths (so ``PrecomputedDetector`` members find their saved predictions). An image that
        cannot be read (corrupt, truncated, not an image, unreadable) is logged as a warning naming the
        file and the reason and skipped, as ``detens fuse`` does; the answer's ``skipped`` lists it.

        Args:
            source: an image path, a folder, a glob pattern or a list of paths (a path that does not exist
                is a ``FileNotFoundError`` before anything runs, see ``list_images``).
            batch_size: images per detector call: an integer >= 1 (a Python or NumPy integer).
            stream: True to return an iterator instead of a list (constant memory over large folders).
            on_error: ``"skip"`` (default) reports and skips unreadable images; ``"raise"`` stops at the
                first one with its :class:`~detens.sources.ImageReadError`.

        Returns:
            PredictionList | PredictionStream: one fused Detections per image read, in the order of
            ``detens.sources.list_images(source)``; ``.paths[i]`` is the image of the i-th Detections and
            ``.skipped`` maps each skipped image to the reason (a stream fills both as it goes).

        Raises:
            TypeError: ``batch_size`` is no integer (a float, a bool) or ``stream`` no bool.
            ValueError: ``batch_size`` < 1, or ``on_error`` is neither ``"skip"`` nor ``"raise"``.
        """
        batch_size = check_integer(batch_size, "batch_size", 1)
        stream = check_flag(stream, "stream")
        if on_error not in _ON_ERROR:
            raise ValueError(f"on_error must be one of {list(_ON_ERROR)}, got {on_error!r}")
        from detens.sources import list_images

        paths = list(list_images(source))
        if not paths:  # a normal answer, but most often a mistyped folder or glob pattern
            logger.warning("no image files in %r: nothing to predict (see detens.sources.IMAGE_EXTENSIONS)", source)
        predictions = PredictionStream(self, paths, batch_size, on_error)
        return predictions if stream else PredictionList(predictions, predictions.paths, predictions.skipped)


_ON_ERROR = ("skip", "raise")


class PredictionStream(Iterator[Detections]):
    """The fused Detections of :meth:`Ensemble.predict` image by image, as the images are read.

    Attributes:
        paths (list[Path]): ``paths[i]`` is the image of the i-th Detections yielded so far.
        skipped (dict[Path, str]): each image skipped so far (it could not be read) and why.
    """

    def __init__(
        self, ensemble: Ensemble, paths: Sequence[Path], batch_size: int, on_error: Literal["skip", "raise"]
    ) -> None:
        self.paths: list[Path] = []
        self.skipped: dict[Path, str] = {}
        self._detections = self._run(ensemble, paths, batch_size, on_error)

    def __iter__(self) -> PredictionStream:
        return self

    def __next__(self) -> Detections:
        return next(self._detections)

    def _run(
        self, ensemble: Ensemble, paths: Sequence[Path], batch_size: int, on_error: str
    ) -> Iterator[Detections]:
        from detens.sources import ImageReadError, read_image

        for begin in range(0, len(paths), batch_size):
            images, read_paths = [], []
            for path in paths[begin : begin + batch_size]:
                try:
                    images.append(read_image(path))
                except ImageReadError as err:
                    if on_error == "raise":
                        raise
                    logger.warning("skipped: %s", err)
                    self.skipped[Path(path)] = str(err)
                    continue
                read_paths.append(Path(path))
            for path, fused in zip(read_paths, ensemble._detect_and_fuse(images, read_paths), strict=True):
                self.paths.append(path)
                yield fused


class PredictionList(list[Detections]):
    """The ``list[Detections]`` that :meth:`Ensemble.predict` returns: one fused Detections per image read.

    Attributes:
        paths (list[Path]): ``paths[i]`` is the image of ``self[i]``.
        skipped (dict[Path, str]): each image that could not be read and why, in the order met; empty when
            every image was read.
    """

    def __init__(self, detections: Iterable[Detections], paths: list[Path], skipped: dict[Path, str]) -> None:
        super().__init__(detections)
        self.paths = paths
        self.skipped = skipped


# ---------------------------------------------------------------------------------------- Ultralytics
def _class_maps(names_per_model: Sequence[Mapping[int, str]]) -> list[dict[int, int]]:
    """For each model: class index → detens label (see the module docstring)."""
    for n, names in enumerate(names_per_model):
        if not isinstance(names, Mapping):
            raise TypeError(
                f"model {n}: Results.names must be a dict {{index: name}}, got {type(names).__name__}"
            )
        if len(set(names.values())) != len(names):
            raise ValueError(
                f"model {n}: duplicate class names in {dict(names)}; classes are matched by name"
            )
    reference = names_per_model[0]
    for n, names in enumerate(names_per_model[1:], start=1):
        if set(names.values()) != set(reference.values()):
            only_first = sorted(set(reference.values()) - set(names.values()))
            only_this = sorted(set(names.values()) - set(reference.values()))
            raise ValueError(
                f"models 0 and {n} have different class names: only in model 0: {only_first[:10]}, "
                f"only in model {n}: {only_this[:10]}; fusion needs one label space"
            )
    coco_ids = coco_category_ids_for(reference)
    label_of_name = {
        name: (coco_ids[int(index)] if coco_ids is not None else int(index))
        for index, name in reference.items()
    }
    return [{int(index): label_of_name[name] for index, name in names.items()} for names in names_per_model]


def _add_speeds(per_model: Sequence[Results], fusion_ms: float) -> dict[str, float | None]:
    speed: dict[str, float | None] = {}
    for r in per_model:
        for key, value in (r.speed or {}).items():
            if value is not None:
                speed[key] = (speed.get(key) or 0.0) + float(value)
            else:
                speed.setdefault(key, None)
    speed["postprocess"] = (speed.get("postprocess") or 0.0) + fusion_ms
    return speed


def fuse_results(
    per_model_results: Sequence[Sequence[Results]],
    method: str | None = None,
    head: Any = None,
    model_names: Sequence[str] | None = None,
    **params: Any,
) -> list[Results]:
    """Fuse the Ultralytics ``Results`` of several models on the same images.

    Args:
        per_model_results (list[list[Results]]): ``per_model_results[n][b]``: model n on image b (what
            ``model(images)`` returns, one list per model; same images in the same order).
        method (str | None): a fusion method of :func:`detens.fuse`. None (default): ``"wbf"``, or
            ``"theta"`` (which runs any head) when ``head`` is given.
        head: for ``method="theta"`` or a head type (``"deep"``, ...): a head, the path of a saved one, or
            a shipped head's name (``"coco_yolo3_deep"``).
        model_names (list[str] | None): names of the models (stored as ``Detections.source``; a head
            given as a path is checked against them). Default: unnamed, which a head of several models
            refuses (``Results`` carry no model name: taken in the head's order, each model's weights could go
            to another model's boxes).
        **params: the method's parameters (``iou_thr``, ``weights``, ...).

    Returns:
        list[Results]: one per image, with the image, path and class names of the first model's Results;
        ``.boxes`` holds the fused boxes, so ``.plot()``, ``.save_txt()``, ``.to_json()`` work as usual, in
        the dtype of the first model's boxes (``torch.float16`` from a half-precision model).
        ``speed`` sums the models' times, the fusion time added to ``postprocess``.

    Raises:
        ValueError: lists of different lengths, Results of different images (``orig_shape`` or ``path``
            differ, or their ``orig_img`` pixels: in-memory images are named by their place in the batch; an
            image given by its path to some models and as an array to others is one image where the pixels
            that every model saw are the same),
            different class-name sets, an unknown method, a head of several models without ``model_names``.
    """
    if isinstance(per_model_results, (str, bytes)) or not isinstance(per_model_results, Sequence):
        raise TypeError("per_model_results must be a list with one list of Results per model")
    per_model = _lists_per_model(
        per_model_results, "per_model_results", "Results (what model(images) returns)", "[[r0], [r1], ...]"
    )
    if not per_model:
        raise ValueError("per_model_results is empty: pass one list of Results per model")
    counts = [len(results) for results in per_model]
    if len(set(counts)) != 1:
        raise ValueError(
            f"models returned different numbers of Results {counts}; they must run on the same images"
        )
    model_names = check_name_list(model_names)
    names = _check_model_names(model_names, len(per_model))
    method = default_method(method, head, params)
    # A head given as a path is checked against the model names only when the caller gave them.
    params = _fusion_params(method, head, params, model_names)
    if model_names is None:
        check_members_named(_heads_of(params), "Ultralytics Results", len(per_model))
    _check_head_model_count(params, len(per_model), "lists of Results")
    if counts[0] == 0:  # no image to fuse: the values are checked all the same, as a call with images would
        _check_fusion_values(method, params, model_names if model_names is not None else [None] * len(per_model))
        return []
    for n, results in enumerate(per_model):
        for b, r in enumerate(results):
            if getattr(r, "boxes", None) is None or not hasattr(r, "orig_shape"):
                what = [key for key in ("obb", "probs", "keypoints", "masks") if getattr(r, key, None) is not None]
                why = (f" (it holds {', '.join(what)} and no boxes: the Results of a model of another task)"
                       if hasattr(r, "orig_shape") else "")
                raise TypeError(
                    f"per_model_results[{n}][{b}] is not an Ultralytics detection Results: {type(r).__name__}{why}"
                )
    class_maps = _class_maps([results[0].names for results in per_model])
    _check_heads_label_space(
        params, {class_maps[0][int(index)]: str(name) for index, name in per_model[0][0].names.items()},
        complete=True, whose="the label space of the models' Results.names (COCO's ids for COCO's 80 classes)",
    )

    fused_results = []
    for b in range(counts[0]):
        column = [per_model[n][b] for n in range(len(per_model))]
        shapes = [tuple(int(v) for v in r.orig_shape) for r in column]
        paths = [str(r.path) for r in column]
        files = {path for path in paths if not _IN_MEMORY.fullmatch(Path(path).name)}
        if len(set(shapes)) == 1 and len(set(paths)) == 1 and not _same_pixels(column):
            # in-memory images are all named image0.jpg, image1.jpg, ... by their place in the batch
            raise ValueError(
                f"image {b}: the models' Results are of different images of one size, each named {paths[0]!r} "
                "(Ultralytics names in-memory images by their place in the batch); pass the same images in the "
                "same order to every model"
            )
        # one image read from its file by some models and given as an array to others: the same pixels
        same_image_as_an_array = len(set(shapes)) == 1 and len(files) == 1 and _same_pixels(column, strict=True)
        if len(set(shapes)) != 1 or (len(set(paths)) != 1 and not same_image_as_an_array):
            raise ValueError(
                f"image {b}: the models' Results describe different images "
                f"(orig_shape {shapes}, path {paths}); pass the same images in the same order to every model"
            )
        start = time.perf_counter()
        per_image = [results_to_detections(r, class_maps[n], source=names[n]) for n, r in enumerate(column)]
        fused = fuse(per_image, method=method, **params)
        # named after the image's file where a model read it from one
        base = next((n for n, path in enumerate(paths) if path in files), 0)
        out = detections_to_results(fused, column[base], class_maps[base], _output_dtype(column[0].boxes.data))
        out.speed = _add_speeds(column, (time.perf_counter() - start) * 1000.0)
        fused_results.append(out)
    return fused_results


#: How Ultralytics names an image given as an array, a tensor or a PIL image without a file: by its place in
#: the batch.
_IN_MEMORY = re.compile(r"image[0-9]+\.jpg")


def _check_head_model_count(params: Mapping[str, Any], num_models: int, inputs: str) -> None:
    """Refuse a head (or calibration) of models named by the head for another number of models than given,
    in the words of the input (``inputs``: "lists of Results"); the fuser would name Detections instead."""
    for key, head in _heads_of(dict(params)).items():
        head_models = getattr(head, "model_names", None)
        if head_models is not None and len(head_models) != num_models:
            raise ValueError(
                f"the {key} was trained for {len(head_models)} models {list(head_models)} but {num_models} {inputs} "
                f"were given: pass one per model of the {key}, with model_names=[...] naming them in that order"
            )


def _same_pixels(column: Sequence[Any], strict: bool = False) -> bool:
    """Whether the Results of one image hold the same ``orig_img`` (a Results without one is not compared,
    unless ``strict``, where it is never the same): a fraction of a millisecond per model against the
    milliseconds of fusion."""
    images = [r.orig_img for r in column if isinstance(getattr(r, "orig_img", None), np.ndarray)]
    if strict and len(images) != len(column):
        return False
    return all(image is images[0] or np.array_equal(image, images[0]) for image in images[1:])


# ------------------------------------------------------------------------------------------- torchvision
class TorchvisionFusion(nn.Module):
    """Fuse the outputs of several torchvision detection models, as a post-processing module.

    Args:
        method (str | None): a fusion method of :func:`detens.fuse`. None (default): ``"wbf"``, or
            ``"theta"`` (which runs any head) when ``head`` is given.
        head: for ``method="theta"`` or a head type (``"deep"``, ...): a head (registered as a submodule,
            so ``.to(device)`` moves it), the path of a saved one, or a shipped head's name.
        model_names (list[str] | None): names of the models (a head is checked against them). Default:
            unnamed, which a head of several models refuses (the output dicts carry no model name: taken in
            the head's order, each model's weights could go to another model's boxes).
        label_space (Mapping[int, str] | None): the category names of the models' labels, ``{id: name}``
            (or a COCO ``categories`` list), against which a head's (or a calibration's) per-class parameters are checked here
            (:func:`detens.heads.check_head_label_space`): one trained on other classes is refused. Default:
            COCO's category ids, which torchvision's COCO models predict; give yours for models trained on
            other classes.
        **params: the method's parameters (``iou_thr``, ``weights``, ...). Their names are checked here;
            their values too (an ``iou_thr`` of 5, weights of another length, a head of other models) when
            the number of models is known here: from ``model_names``, else from the head's models, else
            from ``weights``. Without any of them, the values that hold for any number of models are checked
            here, ``min_votes`` (at most one per model) on the first call.

    Raises:
        ValueError: an unknown method, a parameter out of its range, a head of other models than
            ``model_names``, a head of several models without ``model_names``, a head trained on other classes
            than ``label_space``'s.
        TypeError: a parameter the method does not take (listing those it takes), or of the wrong type.

    Example::

        fusion = TorchvisionFusion(method="wbf", iou_thr=0.55)
        with torch.no_grad():
            outputs = [model(images) for model in models]          # each: list of B dicts
            fused = fusion(outputs, [img.shape[-2:] for img in images])
    """

    def __init__(
        self,
        method: str | None = None,
        head: Any = None,
        model_names: Sequence[str] | None = None,
        label_space: Mapping[int, str] | None = None,
        **params: Any,
    ) -> None:
        super().__init__()
        self.method = method = default_method(method, head, params)
        self.model_names = check_name_list(model_names)
        params = _fusion_params(method, head, params, self.model_names)
        from detens.heads._io import check_label_space
        from detens.labels import COCO_ID_TO_NAME

        if label_space is None:
            whose = "COCO's category ids (what torchvision's COCO models predict; label_space= gives others)"
            _check_heads_label_space(params, COCO_ID_TO_NAME, complete=True, whose=whose)
        else:
            _check_heads_label_space(params, check_label_space(label_space), complete=True, whose="label_space")
        if self.model_names is None:
            check_members_named(_heads_of(params), "torchvision's output dicts")
        members = _declared_members(self.model_names, params.get("head"), params.get("weights"))
        if members is not None:
            _check_fusion_values(method, params, members)
        elif params.get("head") is None:
            # the values that hold for any number of models, on one: min_votes, at most one per model, waits
            _check_fusion_values(method, {k: v for k, v in params.items() if k != "min_votes"}, [None])
        self.head = params.pop("head", None)  # an nn.Module head becomes a submodule
        self.params = params

    def extra_repr(self) -> str:
        return f"method={self.method!r}, params={self.params}"

    def __prepare_scriptable__(self) -> TorchvisionFusion:
        # torch.jit.script calls this on every module it compiles, a submodule of a user's model too; without
        # it the refusal is a TorchScript parse error in the middle of forward's argument checks.
        raise TypeError(
            "TorchvisionFusion cannot be compiled by torch.jit.script: it runs Python and compiled (numba) code "
            "on the models' outputs. Script or export the detectors alone, and call the fusion on their outputs"
        )

    def forward(
        self, per_model_outputs: Sequence[Sequence[Mapping[str, Tensor]]], image_sizes: Sequence[Any] | Tensor
    ) -> list[dict[str, Tensor]]:
        """Fuse image by image.

        Args:
            per_model_outputs: ``per_model_outputs[n][b]`` is model n's output dict for image b
                (``boxes (Tensor[K, 4])`` xyxy pixels of the original image, ``scores (Tensor[K])``,
                ``labels (Tensor[K])``), what a torchvision detection model returns in ``eval()``.
            image_sizes: per image, ``(height, width)`` of the ORIGINAL image (torchvision's outputs
                do not carry it): tuples, ``torch.Size``, or the image tensors ``[C, H, W]`` themselves; or
                one ``Tensor[B, 2]`` of the sizes.

        Returns:
            list[dict[str, Tensor]]: one ``{"boxes", "scores", "labels"}`` per image, on the input device,
            boxes and scores in the dtype of the first model's boxes if they are a floating-point tensor,
            else float32 (numpy arrays and lists are accepted, as by ``torchvision_to_detections``); other
            keys (masks, ...) are dropped.
        """
        if isinstance(per_model_outputs, Mapping) or not isinstance(per_model_outputs, Sequence):
            raise TypeError("per_model_outputs must be a list with one list of output dicts per model")
        per_model = _lists_per_model(
            per_model_outputs, "per_model_outputs", "output dicts (one per image)", "[[out0], [out1], ...]"
        )
        if not per_model:
            raise ValueError("per_model_outputs is empty: pass one list of output dicts per model")
        for n, outputs in enumerate(per_model):
            if outputs and isinstance(outputs[0], Tensor):
                raise TypeError(
                    f"per_model_outputs[{n}] holds tensors; pass the list of output dicts of model {n}"
                )
        counts = [len(outputs) for outputs in per_model]
        if len(set(counts)) != 1:
            raise ValueError(
                f"models returned different numbers of outputs {counts}; they must run on the same images"
            )
        if isinstance(image_sizes, Tensor) and image_sizes.ndim == 2 and image_sizes.shape[1] == 2:
            image_sizes = image_sizes.tolist()  # [B, 2]
        if isinstance(image_sizes, (str, bytes, Mapping)) or not isinstance(image_sizes, Iterable):
            raise TypeError(
                "image_sizes must be a list with the (height, width) of each image, got "
                f"{type(image_sizes).__name__}: {image_sizes!r}"
            )
        sizes = [_as_image_size(s, f"image_sizes[{i}]") for i, s in enumerate(image_sizes)]
        if len(sizes) != counts[0]:
            raise ValueError(f"got {len(sizes)} image sizes for {counts[0]} images")
        names = _check_model_names(self.model_names, len(per_model))
        params = dict(self.params)
        if self.head is not None:
            params["head"] = self.head
        if not sizes:  # no image to fuse: the values are checked all the same, as a call with images would
            _check_fusion_values(self.method, params, self.model_names or [None] * len(per_model))

        fused_outputs = []
        for b, size in enumerate(sizes):
            per_image = [_output_to_detections(per_model[n][b], size, names[n], n, b) for n in range(len(per_model))]
            fused = fuse(per_image, method=self.method, **params)
            fused_outputs.append(detections_to_torchvision(fused, dtype=_output_dtype(per_model[0][b]["boxes"])))
        return fused_outputs


def _output_to_detections(
    output: Mapping[str, Any], size: tuple[int, int], name: str | None, n: int, b: int
) -> Detections:
    """Model ``n``'s torchvision output for image ``b`` as Detections; a refusal names which one it is (the
    nesting of ``per_model_outputs``, models then images, is easily given the other way round)."""
    try:
        return torchvision_to_detections(output, size, source=name)
    except (TypeError, ValueError) as err:
        err.args = (f"per_model_outputs[{n}][{b}] (model {n}'s output for image {b}): {err}", *err.args[1:])
        raise


def _declared_members(model_names: Sequence[str] | None, head: Any, weights: Any = None) -> list[str | None] | None:
    """The members as :meth:`TorchvisionFusion.forward` names them, where known before its first call:
    ``model_names``, else one unnamed member per model of the head, else per weight; None when none tells."""
    if model_names is not None:
        return _check_model_names(model_names, len(model_names))
    head_models = getattr(head, "model_names", None)
    if head_models is not None:
        return _check_model_names(None, len(head_models))
    try:
        return [None] * len(weights)
    except TypeError:  # None, or no sequence (the fuser's own check names it on the first call)
        return None


def _output_dtype(boxes: Any) -> torch.dtype:
    """The dtype of the fused boxes and scores: that of the first model's boxes when they are a floating-point
    tensor, else float32 (integer tensors, numpy arrays and lists, all accepted as input)."""
    if isinstance(boxes, Tensor) and boxes.dtype.is_floating_point:
        return boxes.dtype
    return torch.float32
