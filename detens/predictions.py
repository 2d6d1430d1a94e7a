"""Saved per-model predictions on a COCO-format dataset: the input of training and evaluation.

A prediction folder holds one COCO results file per model, ``<model name>.json``, as written by
``detens cache``, and the cache's ``cache_summary.json``, whose per-member ``unreadable`` names the
images the cache could not read: those images are left out (:class:`EnsemblePredictions`).
Dimension legend: N models.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import Any

import torch
from torch import Tensor

from detens.checks import check_name_list, first_few
from detens.coco import (
    CocoGroundTruth,
    coco_to_detections,
    load_coco_gt,
    load_coco_results,
    validate_coco_results,
    with_annotation_ids,
)
from detens.detections import Detections
from detens.io import check_not_special_file, read_json_file

__all__ = [
    "CACHE_PARTIAL", "CACHE_SUMMARY", "EnsemblePredictions", "LeftOutImage", "NOT_RESULTS", "base_file_names",
    "finished_image_records", "folder_models", "join_predictions", "shared_images", "shares_images_phrase",
]

logger = logging.getLogger(__name__)

#: ``detens cache``'s report in a prediction folder (members' images, boxes, unreadable files, timings).
CACHE_SUMMARY = "cache_summary.json"
#: Where ``detens cache`` keeps each member's finished images until its ``<model>.json`` is written (and after).
CACHE_PARTIAL = ".partial"

#: JSON files of a prediction folder that are not a model's results (``detens cache``'s summary).
NOT_RESULTS: frozenset[str] = frozenset({CACHE_SUMMARY})


def finished_image_records(member_folder: Path) -> Iterator[Path]:
    """The records of the images a member of a cache has finished, in its folder of :data:`CACHE_PARTIAL`
    (``<image id>.json``), not the settings they were made with; none where there is no such folder."""
    return member_folder.glob("[0-9]*.json")


def folder_models(folder: str | Path) -> list[str]:
    """The models of a prediction folder, sorted: the stems of its ``<model>.json`` files; none where
    ``folder`` is not a folder."""
    # cache_summary.json is detens cache's report, not a model's results; hidden files are other tools'
    # (macOS writes ._<name>.json beside each file copied to some disks)
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.json") if p.name not in NOT_RESULTS and not p.name.startswith("."))


@dataclass(frozen=True)
class LeftOutImage:
    """An image of the ground truth that :class:`EnsemblePredictions` leaves out: the cache could not
    read it for at least one model.

    Attributes:
        image_id (int): its id in the ground truth.
        file_name (str): its ``file_name`` in the ground truth.
        unreadable_by (dict[str, str]): each model that could not read it → the cache's error message.
    """

    image_id: int
    file_name: str
    unreadable_by: dict[str, str]

    def describe(self) -> str:
        """``"139 (000000000139.jpg, unreadable by a, b)"``, for messages."""
        return f"{self.image_id} ({self.file_name}, unreadable by {', '.join(self.unreadable_by)})"


def _describe_images(images: Sequence[LeftOutImage], limit: int = 10) -> str:
    return first_few(images, limit, "; ", show=LeftOutImage.describe)


class EnsemblePredictions:
    """Predictions of N models on the images of one ground truth, grouped by image.

    Images that a model could not read (``unreadable``) are left out for every model, also for the models
    that did read them: the ensemble never saw such an image whole, so fusing it without a member, or
    scoring the member's absent boxes as misses, would measure the broken file rather than the ensemble.
    A left-out image is removed from :attr:`gt` with its annotations and every model's predictions, so it
    is neither scored nor fitted on; :attr:`left_out` lists it.

    Args:
        model_names (list[str]): the ensemble's members, in the order every ``per_model`` list uses.
        results (list[list[dict]]): COCO result dicts of each model.
        gt (CocoGroundTruth | str | Path | dict): the dataset (anything :func:`~detens.coco.load_coco_gt`
            takes); gives image sizes and the valid image ids.
        validated (bool): the results come from :func:`~detens.coco.load_coco_results` or
            :func:`~detens.coco.validate_coco_results` (schema checked); False: they are checked here.
        unreadable (dict[str, dict[str, str]] | None): per model (a name of ``model_names``), the images it
            could not read as ``{file_name: error}``, the form of each member's ``unreadable`` in
            ``detens cache``'s ``cache_summary.json``. File names that are not in ``gt`` are ignored (those
            images are not evaluated anyway). Default: none.
        folder (str | Path | None): where the results were read from (``<folder>/<model>.json``), named in
            errors; :meth:`from_folder` passes it.

    Attributes:
        model_names (list[str]): as given.
        gt (CocoGroundTruth): ``gt`` without the left-out images (``gt`` itself when none is).
        left_out (list[LeftOutImage]): the images of ``gt`` left out, by image id; empty when none is.

    Raises:
        ValueError: no model name, a name repeated or empty, or not one per result list; a result that is
            no COCO result (naming the model and the result); results of images that are not in
            ``gt`` or of categories it does not define; ``unreadable`` naming another model; every annotated
            image of ``gt`` left out.
        TypeError: ``unreadable`` not a mapping of model names to ``{file_name: error}`` mappings; ``results``
            not one list of result dicts per model; ``gt`` of none of the types above.
    """

    def __init__(
        self,
        model_names: Sequence[str],
        results: Sequence[Sequence[dict]],
        gt: CocoGroundTruth | str | Path | Mapping[str, Any],
        validated: bool = False,
        unreadable: Mapping[str, Mapping[str, str]] | None = None,
        folder: str | Path | None = None,
    ) -> None:
        model_names = _check_model_names(model_names, "model_names")
        if isinstance(results, (str, bytes)) or not isinstance(results, Sequence):
            raise TypeError(f"results must be one list of COCO result dicts per model, got {type(results).__name__}")
        if len(model_names) != len(results):
            raise ValueError(f"{len(model_names)} model names but {len(results)} result lists")
        if not isinstance(gt, CocoGroundTruth):
            gt = load_coco_gt(gt)  # a path, a COCO dict or a pycocotools COCO, as evaluate_coco takes
        if not validated:  # each list named by its model: coco_to_detections would name the image's list
            results = [validate_coco_results(model_results, f"results of {name!r}")
                       for name, model_results in zip(model_names, results, strict=True)]
        self.model_names = model_names
        self.left_out = _left_out_images(gt, self.model_names, unreadable)
        if self.left_out:
            dropped = {image.image_id for image in self.left_out}
            kept = gt.subset(i for i in gt.image_ids if i not in dropped)
            if gt.annotated_image_ids and not kept.annotated_image_ids:
                raise ValueError(
                    f"every annotated image is left out: the cache could not read {len(self.left_out)} images "
                    f"({_describe_images(self.left_out)}), so none is left to score or fit on; repair or "
                    "replace those files and cache their predictions again"
                )
            results = [[r for r in model_results if int(r["image_id"]) not in dropped] for model_results in results]
            gt = kept
        self.gt = gt
        known = set(gt.image_ids)
        categories = set(gt.category_ids)
        # Per model: image id → (boxes Tensor[K, 4] xyxy, scores Tensor[K], labels Tensor[K]), converted
        # once: far smaller than the result dicts, and per_model() then costs one validation.
        self._by_image: list[dict[int, tuple[Tensor, Tensor, Tensor]]] = []
        for name, model_results in zip(self.model_names, results, strict=True):
            grouped: dict[int, list[dict]] = defaultdict(list)
            for r in model_results:
                grouped[int(r["image_id"])].append(r)
            unknown = sorted(set(grouped) - known)
            if unknown:
                raise ValueError(
                    f"predictions of {name!r} refer to {len(unknown)} image ids that are not in the ground truth, "
                    f"e.g. {unknown[:5]}; cache predictions on the same annotation file"
                )
            by_image = {}
            for image_id, image_results in grouped.items():
                det = coco_to_detections(image_results, gt.image_size(image_id), source=name, validate=False)
                by_image[image_id] = (det.boxes, det.scores, det.labels)
            # Checked here, per model: scoring would refuse these only at the first COCO evaluation that sees
            # them, naming no model, after every method before it has been fitted and scored; and a head
            # fitted on another label space's ids (COCO's, under a dataset of one's own) would take its 5
            # (airplane) for the dataset's 5, and a head type that never scores while fitting would be
            # written without a word.
            used = torch.cat([labels for _, _, labels in by_image.values()]) if by_image else torch.zeros(0)
            foreign = sorted({int(c) for c in used.unique().tolist()} - categories)
            if foreign:
                from detens.adapters._labels import id_ranges

                where = "" if folder is None else f" ({Path(folder) / name}.json)"
                raise ValueError(
                    f"predictions of {name!r}{where} use category ids that the ground truth does not define: "
                    f"{id_ranges(foreign)} (the ground truth's: {id_ranges(sorted(categories))}); map the model's "
                    "classes onto the dataset's category ids (a member's class_map) and cache them again"
                )
            self._by_image.append(by_image)

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        gt: CocoGroundTruth | str | Path | Mapping[str, Any],
        models: Sequence[str] | None = None,
    ) -> EnsemblePredictions:
        """Load ``folder/<name>.json`` for each model (all ``*.json`` files, sorted by name, by default).

        ``gt`` is the dataset, as the constructor takes it (a :class:`~detens.coco.CocoGroundTruth`, or
        anything :func:`~detens.coco.load_coco_gt` takes).

        The images that ``folder/cache_summary.json`` lists as unreadable for one of ``models`` are left
        out (see the class docstring), with a warning that names them. A folder without the summary, or
        a summary without a member's ``unreadable`` (caches of older versions, results files written by
        other tools), leaves nothing out. Ground truth with images that the summary's ``image_ids`` (the
        images the cache ran on) lack is refused: every model would count as finding nothing there. Ground
        truth of some of those images takes their predictions and leaves the others' out (a folder without
        the list refuses predictions of images the ground truth lacks).

        Raises:
            FileNotFoundError: no such folder, or no ``<name>.json`` for one of ``models``.
            NotADirectoryError: a file where the folder should be.
            ValueError: no results file in the folder; a summary that is not valid JSON or not of
                ``detens cache``'s form; ground truth with images the cache never ran on; the errors of the
                constructor.
        """
        if models is not None:
            models = _check_model_names(models, "models")
        if not isinstance(gt, CocoGroundTruth):
            gt = load_coco_gt(gt)
        folder = Path(folder)
        if folder.is_file():  # most often one member's results file, given for the folder that holds it
            raise NotADirectoryError(f"prediction folder expected, got a file: {folder} (give the folder that holds it)")
        if not folder.is_dir():
            raise FileNotFoundError(f"prediction folder not found: {folder}")
        available = folder_models(folder)
        chosen = models is not None
        if models is None:
            models = available
        missing = [m for m in models if m not in available]
        if missing:
            raise FileNotFoundError(
                f"no predictions for {missing} in {folder}; available: {', '.join(available) or 'none'}"
            )
        summary = _read_summary(folder / CACHE_SUMMARY)
        # a member's <model>.json is written when its last image is done: without the members named, the
        # finished ones alone would be taken for the whole ensemble
        unfinished = {} if chosen else _unfinished_members(folder, summary, available)
        if unfinished:
            left = ", ".join(f"{name} ({state})" for name, state in sorted(unfinished.items()))
            raise ValueError(
                f"the cache in {folder} is not finished ({left}): run the same detens cache command again to "
                f"finish it{', or name the finished members to use them alone' if available else ''}"
            )
        if not models:
            raise ValueError(f"{folder} holds no <model>.json prediction files")
        unreadable = _summary_unreadable(summary, folder / CACHE_SUMMARY, models)
        _check_cached_images(summary, folder / CACHE_SUMMARY, gt)
        _check_cached_categories(summary, folder / CACHE_SUMMARY, gt)
        results = [load_coco_results(folder / f"{m}.json") for m in models]
        cached = set((summary or {}).get("image_ids") or ())
        if len(cached) > len(gt.image_ids):
            # ground truth of some of the images the cache ran on (checked above: of no other image)
            wanted = set(gt.image_ids)
            results = [[r for r in model_results if int(r["image_id"]) in wanted] for model_results in results]
            logger.info(
                "%s: the ground truth has %d of the %d images the cache ran on; the others' predictions are not used",
                folder, len(wanted), len(cached),
            )
        for name, model_results in zip(models, results, strict=True):
            if not model_results and gt.image_ids:
                # a model that detects nothing on any image is most often a broken export, or
                # results written by a tool that failed: every method would score it as a member regardless
                logger.warning(
                    "%s: %s.json holds no detection on %s: check the model (its export, its class_map) and the "
                    "tool that wrote the file",
                    folder, name, "the image" if len(gt.image_ids) == 1 else f"any of the {len(gt.image_ids)} images",
                )
        predictions = cls(models, results, gt, validated=True, unreadable=unreadable, folder=folder)
        if predictions.left_out:
            logger.warning(
                "%s: left out %d image%s that the cache could not read (%s), neither scored nor fitted on: %s",
                folder, len(predictions.left_out), "s" if len(predictions.left_out) > 1 else "", CACHE_SUMMARY,
                _describe_images(predictions.left_out),
            )
        return predictions

    @property
    def num_models(self) -> int:
        return len(self.model_names)

    @property
    def image_ids(self) -> list[int]:
        """Images of the ground truth, with or without predictions (``detens evaluate`` scores the annotated ones)."""
        return list(self.gt.image_ids)

    def per_model(self, image_id: int) -> list[Detections]:
        """One Detections per model for ``image_id`` (empty where a model found nothing)."""
        image_size = self.gt.image_size(image_id)  # refuses an id that is no integer
        image_id = int(image_id)
        per_model = []
        for name, by_image in zip(self.model_names, self._by_image, strict=True):
            arrays = by_image.get(image_id)
            per_model.append(
                Detections.empty(image_size, name) if arrays is None else Detections(*arrays, image_size, name)
            )
        return per_model

    def select(self, models: Sequence[str]) -> EnsemblePredictions:
        """The same predictions restricted to (and ordered as) ``models`` (the same images left out)."""
        models = _check_model_names(models, "models")
        unknown = [m for m in models if m not in self.model_names]
        if unknown:
            raise ValueError(f"unknown models {unknown}; this ensemble has {self.model_names}")
        subset = EnsemblePredictions.__new__(EnsemblePredictions)
        subset.model_names = list(models)
        subset.gt = self.gt
        # the images stay out: dropping the member that could not read one does not bring its data back
        subset.left_out = list(self.left_out)
        subset._by_image = [self._by_image[self.model_names.index(m)] for m in models]
        return subset


def _check_model_names(names: Any, what: str) -> list[str]:
    """``names`` as a list of an ensemble's members: at least one, each a non-empty string, none twice. A
    string is a sequence too: ``"yolo"`` would be the four models ``y``, ``o``, ``l``, ``o``."""
    if isinstance(names, str):
        raise TypeError(f"{what} must be a list of model names, got the string {names!r}; write [{names!r}]")
    names = check_name_list(names, what)
    if not names:
        raise ValueError(f"{what} must name at least one model, got {names!r}")
    if repeated := sorted({name for name in names if names.count(name) > 1}):
        raise ValueError(f"{what} must name each model once, got {repeated} more than once: {names}")
    return names


def join_predictions(
    evaluated: EnsemblePredictions,
    extra: EnsemblePredictions,
    all_images: bool = False,
    what: str = "the extra fitting data",
) -> tuple[EnsemblePredictions, list[int]]:
    """One set of predictions holding the images of both, for fitting on ``extra`` besides ``evaluated``.

    ``extra`` must have the same categories (the label space) and every model of ``evaluated``; its
    members are matched by name, so its files may list them in any order. Image ids of ``extra`` that
    collide with ``evaluated``'s are moved past the largest id, annotations without an id are numbered
    (:func:`~detens.coco.with_annotation_ids`), and annotation ids are renumbered when the two files share
    any, so the joined ground truth stays valid COCO (pycocotools indexes annotations by id: a shared id
    would silently drop one of them). Whether the two hold the same images is not checked here (see
    :func:`shared_images`).

    Images either side left out stay out; the joined predictions' ``left_out`` is ``evaluated``'s (those of
    ``extra`` have no id in the joined ground truth: see ``extra.left_out``).

    Args:
        all_images (bool): return the joined ids of every image of ``extra``, those without annotations
            too (to fit on as negative images), not only of its annotated images.
        what (str): what ``extra`` is, for messages (``"the fitting data"`` where it is the only one).

    Returns:
        (EnsemblePredictions, list[int]): the joined predictions (models in ``evaluated``'s order, the
        ground truth of both) and the joined ids of ``extra``'s annotated images (every image of ``extra``
        with ``all_images``).
    """
    from detens.adapters._labels import describe_label_space_difference, renamed_ids
    from detens.coco import CocoGroundTruth

    ours, theirs = evaluated.gt.category_ids, extra.gt.category_ids
    if ours != theirs:
        only_extra, only_ours = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
        raise ValueError(
            f"{what} has other categories than the evaluated data: category ids only in {what} "
            f"{only_extra[:10]}, only in the evaluated data {only_ours[:10]}; fit and score in one label space"
        )
    # names compared as the class maps and the cache's summary compare them: "Traffic_Light" is "traffic light"
    renamed = renamed_ids(ours, evaluated.gt.category_names, extra.gt.category_names)
    if renamed:
        shown = first_few(renamed, 5, show=lambda r: describe_label_space_difference(r, "in the evaluated data", f"in {what}"))
        raise ValueError(
            f"{what} names {len(renamed)} category ids otherwise than the evaluated data ({shown}); "
            "its ids would mean other classes: fit and score in one label space"
        )
    missing = [m for m in evaluated.model_names if m not in extra.model_names]
    if missing:
        raise ValueError(
            f"{what} has no predictions of {missing}; it has {extra.model_names}, the evaluated "
            f"data {evaluated.model_names}"
        )
    extra = extra.select(evaluated.model_names)
    taken = set(evaluated.gt.image_ids)
    shift = max(taken, default=0) + 1 if taken & set(extra.gt.image_ids) else 0
    new_id = {i: i + shift for i in extra.gt.image_ids}

    dataset = dict(evaluated.gt.dataset)
    dataset["images"] = list(evaluated.gt.dataset["images"]) + [
        {**image, "id": new_id[int(image["id"])]} for image in extra.gt.dataset["images"]
    ]
    extra_annotations = [{**a, "image_id": new_id[int(a["image_id"])]} for a in extra.gt.dataset["annotations"]]
    annotations = with_annotation_ids([*evaluated.gt.dataset["annotations"], *extra_annotations])
    if len({a["id"] for a in annotations}) < len(annotations):
        annotations = [{**a, "id": i + 1} for i, a in enumerate(annotations)]
    dataset["annotations"] = annotations

    joined = EnsemblePredictions.__new__(EnsemblePredictions)
    joined.model_names = list(evaluated.model_names)
    joined.gt = CocoGroundTruth(dataset, evaluated.gt.images_dir)
    joined.left_out = list(evaluated.left_out)
    joined._by_image = [
        {**ours_by_image, **{new_id[i]: arrays for i, arrays in theirs_by_image.items()}}
        for ours_by_image, theirs_by_image in zip(evaluated._by_image, extra._by_image, strict=True)
    ]
    return joined, [new_id[i] for i in (extra.gt.image_ids if all_images else extra.gt.annotated_image_ids)]


def shared_images(
    first: EnsemblePredictions,
    second: EnsemblePredictions,
    first_ids: Sequence[int] | None = None,
    second_ids: Sequence[int] | None = None,
) -> list[str]:
    """The annotated images (or those given) that both sets of predictions hold, as their base file names,
    sorted.

    Image ids belong to one annotation file (two datasets may number different images alike, and
    :func:`join_predictions` moves such ids apart), so across two files an image is identified by its
    ``file_name`` without folders: ``val2017/000000000139.jpg`` and ``000000000139.jpg`` are one image. Two
    different images with one base name count as shared. An image without a ``file_name`` cannot be
    compared: a warning counts those.

    Args:
        first_ids (Sequence[int] | None): the images of ``first`` to compare, annotated or not (default: its
            annotated images).
        second_ids (Sequence[int] | None): the same of ``second``.
    """
    kind = "annotated image" if second_ids is None else "image"
    first_ids = first.gt.annotated_image_ids if first_ids is None else first_ids
    second_ids = second.gt.annotated_image_ids if second_ids is None else second_ids
    first_names, second_names = base_file_names(first.gt, first_ids), base_file_names(second.gt, second_ids)
    unnamed = sum(name is None for name in first_names + second_names)
    if unnamed:
        logger.warning(
            "%d %s%s without a file_name: whether the two datasets share %s cannot be checked",
            unnamed, kind, "s" if unnamed > 1 else "", "them" if unnamed > 1 else "it",
        )
    return sorted((set(first_names) & set(second_names)) - {None})


def shares_images_phrase(shared: Sequence[str], other: str, annotated: bool = True) -> str:
    """How an error names the images of :func:`shared_images` that a dataset shares with ``other``:
    ``"shares 2 annotated images with <other> (same file name, folders aside: a.jpg, b.jpg)"``, the first
    five names shown; ``annotated=False`` where images without annotations were compared too."""
    shown = ", ".join(shared[:5]) + (", ..." if len(shared) > 5 else "")
    plural = "s" if len(shared) > 1 else ""
    kind = "annotated image" if annotated else "image"
    return f"shares {len(shared)} {kind}{plural} with {other} (same file name, folders aside: {shown})"


def base_file_names(gt: CocoGroundTruth, image_ids: Sequence[int]) -> list[str | None]:
    """Each image's ``file_name`` without folders (None where it has none): how an image is told apart across
    annotation files (:func:`shared_images`)."""
    names = (gt.image(image_id).get("file_name") for image_id in image_ids)
    # either separator: annotation files written on Windows use backslashes
    return [None if name is None else PureWindowsPath(str(name)).name for name in names]


def _left_out_images(
    gt: CocoGroundTruth, model_names: Sequence[str], unreadable: Mapping[str, Mapping[str, str]] | None
) -> list[LeftOutImage]:
    """The images of ``gt`` that a model of ``unreadable`` could not read, by image id."""
    if unreadable is None:
        return []
    if not isinstance(unreadable, Mapping):
        raise TypeError(f"unreadable must map model names to {{file_name: error}}, got {type(unreadable).__name__}")
    others = [name for name in unreadable if name not in model_names]
    if others:
        raise ValueError(f"unreadable names models {others} that are not among the models {list(model_names)}")
    for name in model_names:
        files = unreadable.get(name, {})
        if not isinstance(files, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise TypeError(f"unreadable[{name!r}] must map file names to error messages (str to str), got {files!r}")
    if not any(unreadable.values()):  # nothing to look up: file names are not needed
        return []
    ids_by_name: dict[str, list[int]] = defaultdict(list)
    for image_id in gt.image_ids:
        ids_by_name[gt.file_name(image_id)].append(image_id)
    errors: dict[int, dict[str, str]] = defaultdict(dict)
    for name in model_names:  # the models' order, for messages
        for file_name, error in unreadable.get(name, {}).items():
            for image_id in ids_by_name.get(file_name, []):
                errors[image_id][name] = error
    return [LeftOutImage(i, gt.file_name(i), errors[i]) for i in sorted(errors)]


def _unfinished_members(folder: Path, summary: dict[str, Any] | None, finished: Sequence[str]) -> dict[str, str]:
    """``{member: how far it got}`` of the members of a cache in ``folder`` without their ``<model>.json``:
    those its summary marks incomplete (a run that stopped), and those with finished images kept in
    :data:`CACHE_PARTIAL` (a run killed before it wrote a summary)."""
    unfinished = {
        name: f"{entry.get('images_left', 'some')} images left"
        for name, entry in (summary or {}).get("models", {}).items()
        if isinstance(entry, dict) and entry.get("status") == "incomplete" and name not in finished
    }
    partial = folder / CACHE_PARTIAL
    if partial.is_dir():
        for member in sorted(p for p in partial.iterdir() if p.is_dir() and p.name not in finished):
            done = sum(1 for _ in finished_image_records(member)) if member.name not in unfinished else 0
            if done:
                unfinished[member.name] = f"{done} images done"
    return unfinished


def _read_summary(path: Path) -> dict[str, Any] | None:
    """``detens cache``'s summary at ``path``; None where there is none (results written by other tools).

    Raises:
        ValueError: a pipe or a device at ``path`` (:func:`detens.io.check_not_special_file`), which is not
            taken for no summary: the images it lists as unreadable would be scored as found by no model.
    """
    check_not_special_file(path, "cache summary")
    if not path.is_file():
        return None
    summary: Any = read_json_file(path, "cache summary")
    if not isinstance(summary, dict) or not isinstance(summary.get("models", {}), dict):
        raise ValueError(
            f"{path} is not a summary of detens cache (expected an object with 'models': {{member: ...}}); "
            "it lists the images the cache could not read: cache the predictions again to rewrite it"
        )
    return summary


def _check_cached_images(summary: dict[str, Any] | None, path: Path, gt: CocoGroundTruth) -> None:
    """Refuse ground truth with images the cache never ran on: they would count as images where every model
    found nothing. Summaries of older versions, which do not list the cache's images, are not checked."""
    cached = None if summary is None else summary.get("image_ids")
    if cached is None:
        return
    if not isinstance(cached, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in cached):
        shown = f"[{first_few(cached, show=repr)}]" if isinstance(cached, list) else repr(cached)
        raise ValueError(f"{path}: image_ids must be a list of image ids, got {shown}")
    never = sorted(set(gt.image_ids) - set(cached))
    if never:
        raise ValueError(
            f"{len(never)} of the {len(gt.image_ids)} images of the ground truth were never run by the cache in "
            f"{path.parent} (its {path.name} lists the {len(cached)} images of {summary.get('gt') or 'its annotation file'}): "
            f"{first_few(never)}; every model would count as finding nothing there. Give the annotation file the "
            "cache ran on, or cache these images (detens cache --gt with this file)"
        )


def _check_cached_categories(summary: dict[str, Any] | None, path: Path, gt: CocoGroundTruth) -> None:
    """Refuse ground truth whose category ids name other classes than those of the annotation file the cache
    ran on (its summary records them): the members' labels were mapped onto that file's ids, and scored or
    fitted on these they would be taken for other classes (an annotation file of the same images under
    COCO's ids, where the cache ran on a dataset's own). Names are compared as class maps compare them; an
    id either side lacks is not. Summaries of older versions, which do not record the categories, are not
    checked.

    Raises:
        ValueError: naming a few ids with both names, and the file the cache ran on.
    """
    recorded = None if summary is None else summary.get("categories")
    if recorded is None:
        return
    from detens.adapters._labels import describe_label_space_difference, renamed_ids
    from detens.heads._io import check_label_space

    try:
        cached = check_label_space(recorded, "categories")
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from None
    given = gt.category_names
    renamed = renamed_ids(sorted(given), given, cached)
    if renamed:
        shown = first_few(renamed, 5, show=lambda r: describe_label_space_difference(r, "in the ground truth", "in the cache"))
        raise ValueError(
            f"the ground truth's category ids name other classes than those of the annotation file the cache in "
            f"{path.parent} ran on ({summary.get('gt') or 'see its ' + path.name}): {shown}; the members' labels were "
            "mapped onto that file's ids: give the annotation file the cache ran on, or cache the predictions on "
            "this one"
        )


def _summary_unreadable(summary: dict[str, Any] | None, path: Path, models: Sequence[str]) -> dict[str, dict[str, str]]:
    """Each of ``models``' unreadable files (``{file_name: error}``) as ``detens cache``'s summary lists
    them; none for a missing summary or a member it does not describe. A member whose last cache run did
    not finish is warned about: its results file, if any, is an earlier run's."""
    if summary is None:
        return {}
    members = summary.get("models", {})
    unreadable = {}
    for name in models:
        entry = members.get(name)
        if entry is None:  # a results file that detens cache did not write
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: models[{name!r}] must be an object, got {entry!r}")
        if entry.get("status", "complete") != "complete":
            logger.warning(
                "%s: the last cache run of %r did not finish (%s images left): %s.json is from an earlier run, "
                "and images it lacks count as found nothing; finish the cache (run it again) first",
                path, name, entry.get("images_left", "some"), name,
            )
        files = entry.get("unreadable")
        if files is None:  # written before the summary listed unreadable images
            continue
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise ValueError(
                f"{path}: models[{name!r}].unreadable must map file names to error messages, got {files!r}"
            )
        unreadable[name] = files
    return unreadable
