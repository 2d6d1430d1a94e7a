"""COCO I/O and evaluation: results JSON, per-image ground truth, and mAP with labelled keys.

Dimension legend: K predicted boxes in one image, G ground-truth boxes in one image.

COCO boxes are ``[x, y, width, height]`` in absolute pixels; detens boxes are xyxy. The conversion
happens here and nowhere else. A COCO *result* is one dict per box::

    {"image_id": 139, "category_id": 1, "bbox": [x, y, w, h], "score": 0.87}

``category_id`` is a label in detens' label space (COCO category ids by default), so
``Detections.labels`` go in and out unchanged.

pycocotools prints its progress; everything it prints is captured and sent to this module's logger
at DEBUG level, so the library itself prints nothing.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor

from detens.catalogue import COCO_BACKENDS as BACKENDS
from detens.checks import check_integer, check_integers, check_whole, real_as_float
from detens.detections import MAX_IMAGE_SIDE, MAX_LABEL, Detections
from detens.io import atomic_write_json, check_file_path, read_json_file

if TYPE_CHECKING:  # pycocotools is imported lazily
    from pycocotools.coco import COCO

__all__ = [
    "METRIC_KEYS",
    "BACKENDS",
    "fastest_backend",
    "detections_to_array",
    "CocoGroundTruth",
    "load_coco_gt",
    "evaluate_coco",
    "CheckedCocoInput",
    "check_coco_input",
    "evaluate_checked",
    "detections_to_coco",
    "coco_to_detections",
    "load_coco_results",
    "save_coco_results",
    "validate_coco_results",
    "group_results_by_image",
    "with_annotation_ids",
    "files_under_several_ids",
    "check_one_id_per_file",
    "check_file_name_inside",
]

logger = logging.getLogger(__name__)

#: Keys of :func:`evaluate_coco`'s dict, in the order of ``COCOeval.stats``.
METRIC_KEYS: tuple[str, ...] = (
    "map",  # AP @ IoU 0.50:0.95, all areas, maxDets 100
    "map50",  # AP @ IoU 0.50
    "map75",  # AP @ IoU 0.75
    "map_small",  # AP, area < 32²
    "map_medium",  # AP, 32² <= area < 96²
    "map_large",  # AP, area >= 96²
    "mar_1",  # AR, maxDets 1
    "mar_10",  # AR, maxDets 10
    "mar_100",  # AR, maxDets 100
    "mar_small",
    "mar_medium",
    "mar_large",
)

_RESULT_KEYS = ("image_id", "category_id", "bbox", "score")


# ------------------------------------------------------------------------------------------------ helpers
@contextlib.contextmanager
def _captured_stdout(what: str):
    """Run pycocotools quietly: what it prints goes to the logger at DEBUG level."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        yield
    text = buffer.getvalue().strip()
    if text:
        logger.debug("pycocotools (%s):\n%s", what, text)


_INT_TYPES = frozenset({int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64})
_NUMBER_TYPES = _INT_TYPES | {float, np.float16, np.float32, np.float64}


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def _is_finite_number(value: Any) -> bool:
    """A number (not a bool or string) that a float holds finitely (an integer of 400 digits does not)."""
    return _is_number(value) and math.isfinite(real_as_float(value))


def validate_coco_results(results: Any, where: str = "COCO results") -> list[dict[str, Any]]:
    """Check the COCO results schema and return the results as fresh, plain-Python dicts.

    Each entry must be a dict with an integer ``image_id``, an integer ``category_id`` in ``[0, MAX_LABEL]``
    (the labels :class:`~detens.detections.Detections` holds), a ``bbox`` of four finite numbers
    ``[x, y, w, h]`` with ``w, h >= 0``, and a ``score`` in ``[0, 1]``. Extra keys are kept.

    Raises:
        TypeError, ValueError: naming the entry index, the field and the offending value.
    """
    if isinstance(results, Mapping):
        hint = (
            " (this looks like a COCO annotation file; results are a JSON list of "
            '{"image_id", "category_id", "bbox", "score"} dicts)'
            if "annotations" in results or "images" in results
            else ""
        )
        raise TypeError(f"{where} must be a list of result dicts, got a dict{hint}")
    if isinstance(results, (str, bytes)) or not isinstance(results, Iterable):
        raise TypeError(f"{where} must be a list of result dicts, got {type(results).__name__}")
    clean: list[dict[str, Any]] = []
    for i, entry in enumerate(results):
        # Fast path: exact types (bool is not int here), one dict lookup per field; anything unusual
        # goes through _check_entry, which names the problem.
        try:
            image_id, category_id, bbox, score = (entry[k] for k in _RESULT_KEYS)
            fast = (
                type(image_id) in _INT_TYPES
                and type(category_id) in _INT_TYPES
                and 0 <= category_id <= MAX_LABEL
                and type(score) in _NUMBER_TYPES
                and type(bbox) in (list, tuple)
                and len(bbox) == 4
                and all(type(v) in _NUMBER_TYPES for v in bbox)
            )
        except (KeyError, TypeError):
            fast = False
        if not fast:
            _check_entry(i, entry, where)
        item = dict(entry)
        item["image_id"] = int(entry["image_id"])
        item["category_id"] = int(entry["category_id"])
        try:
            item["bbox"] = [float(v) for v in entry["bbox"]]
            item["score"] = float(entry["score"])
        except OverflowError:  # an integer beyond the float range: _check_entry names it
            _check_entry(i, entry, where)
        clean.append(item)
    if clean:  # finiteness and box sizes, checked in bulk
        values = np.array([r["bbox"] + [r["score"]] for r in clean], dtype=np.float64)  # [K, 5]
        bad = (
            ~np.isfinite(values).all(axis=1) | (values[:, 2] < 0) | (values[:, 3] < 0)
            | (values[:, 4] < 0) | (values[:, 4] > 1)
        )
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            _check_entry(i, clean[i], where)
    return clean


def _check_entry(i: int, entry: Any, where: str) -> None:
    """Raise the error that names what is wrong with result ``i`` (called only when something is)."""
    if not isinstance(entry, Mapping):
        raise TypeError(f"{where}[{i}] must be a dict, got {type(entry).__name__}: {entry!r}")
    missing = [k for k in _RESULT_KEYS if k not in entry]
    if missing:
        raise ValueError(f"{where}[{i}] lacks {missing}; each result needs {list(_RESULT_KEYS)}: {dict(entry)!r}")
    for key in ("image_id", "category_id"):
        value = entry[key]
        if not (_is_int(value) or (isinstance(value, float) and value.is_integer())):
            raise ValueError(f"{where}[{i}].{key} must be an integer, got {value!r}")
    category_id = entry["category_id"]
    if not 0 <= category_id <= MAX_LABEL:  # a box's label: Detections would refuse it at the first image
        raise ValueError(
            f"{where}[{i}].category_id must be a category id in [0, {MAX_LABEL}], got {category_id!r}"
        )
    bbox = entry["bbox"]
    if (
        not isinstance(bbox, (list, tuple, np.ndarray))
        or len(bbox) != 4
        or not all(_is_finite_number(v) for v in bbox)
    ):
        raise ValueError(f"{where}[{i}].bbox must be 4 finite numbers [x, y, width, height], got {bbox!r}")
    if float(bbox[2]) < 0 or float(bbox[3]) < 0:
        raise ValueError(
            f"{where}[{i}].bbox = {list(bbox)!r} has a negative width or height; COCO boxes are [x, y, w, h]"
        )
    score = entry["score"]
    if not _is_finite_number(score):
        raise ValueError(f"{where}[{i}].score must be a finite number, got {score!r}")
    if not 0.0 <= float(score) <= 1.0:
        raise ValueError(f"{where}[{i}].score must be in [0, 1] (detens' scores are probabilities), got {score!r}")


def group_results_by_image(results: Sequence[Mapping[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """COCO results → ``{image_id: [result, ...]}`` (insertion order kept within each image)."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for entry in results:
        grouped.setdefault(int(entry["image_id"]), []).append(dict(entry))
    return grouped


# ---------------------------------------------------------------------------------- Detections <-> COCO
def detections_to_coco(det: Detections, image_id: int, decimals: int | None = 3) -> list[dict[str, Any]]:
    """One image's ``Detections`` → COCO result dicts.

    Args:
        det (Detections): boxes xyxy pixels; ``labels`` are written as ``category_id`` unchanged.
        image_id (int): the COCO image id.
        decimals (int | None): boxes are rounded to this many decimals (>= 0; 1/1000 px by default, like
            Ultralytics) and scores to ``decimals + 2``; ``None`` keeps full precision, which makes
            :func:`coco_to_detections` an exact inverse.

    Returns:
        list[dict]: ``{"image_id", "category_id", "bbox": [x, y, w, h], "score"}``, in the order of ``det``.
    """
    if not isinstance(det, Detections):
        raise TypeError(f"det must be Detections, got {type(det).__name__}")
    if not _is_int(image_id):
        raise TypeError(f"image_id must be an integer, got {image_id!r}")
    if decimals is not None:
        decimals = check_integer(decimals, "decimals", 0)
    boxes = det.boxes.detach().to("cpu", torch.float64)  # [K, 4]; float64 keeps x + (x2 - x) == x2 exact
    xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1).tolist()
    scores = det.scores.detach().cpu().tolist()
    labels = det.labels.detach().cpu().tolist()
    out = []
    for box, score, label in zip(xywh, scores, labels, strict=True):
        if decimals is not None:
            box = [round(v, decimals) for v in box]
            score = round(score, decimals + 2)
        out.append({"image_id": int(image_id), "category_id": int(label), "bbox": box, "score": score})
    return out


def coco_to_detections(
    results: Sequence[Mapping[str, Any]],
    image_size: tuple[int, int],
    source: str | None = None,
    image_id: int | None = None,
    validate: bool = True,
) -> Detections:
    """COCO result dicts of ONE image → ``Detections`` (boxes xyxy pixels, ``labels = category_id``).

    Args:
        results (list[dict]): COCO results; all of one image unless ``image_id`` selects one.
        image_size (tuple[int, int]): ``(height, width)``; COCO results do not carry it.
        source (str | None): stored in ``Detections.source``.
        image_id (int | None): keep only the results of this image (so a whole results file can be passed).
        validate (bool): check the schema; ``False`` only for results :func:`load_coco_results` or
            :func:`validate_coco_results` already returned.

    Raises:
        ValueError: results of several images and no ``image_id``.
    """
    clean = validate_coco_results(results, "results") if validate else list(results)
    if image_id is not None:
        if not _is_int(image_id):
            raise TypeError(f"image_id must be an integer, got {image_id!r}")
        clean = [r for r in clean if r["image_id"] == int(image_id)]
    else:
        ids = sorted({r["image_id"] for r in clean})
        if len(ids) > 1:
            raise ValueError(
                f"coco_to_detections converts one image, but the results hold {len(ids)} image ids "
                f"({ids[:10]}{' ...' if len(ids) > 10 else ''}); pass image_id= or group_results_by_image() first"
            )
    if not clean:
        return Detections.empty(image_size, source)
    xywh = torch.tensor([r["bbox"] for r in clean], dtype=torch.float64)  # [K, 4]
    boxes = torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1)
    scores = torch.tensor([r["score"] for r in clean], dtype=torch.float64)
    labels = torch.tensor([r["category_id"] for r in clean], dtype=torch.int64)
    # float64 into Detections: a corner beyond float32 (x + w of two large numbers) is named as that, not as inf
    return Detections(boxes, scores, labels, image_size, source)


# ---------------------------------------------------------------------------------------- results files
def load_coco_results(path: str | Path) -> list[dict[str, Any]]:
    """Read a COCO results JSON file (a list of result dicts), checking its schema.

    Args:
        path (str | Path): the file.

    Returns:
        list[dict]: the result dicts (``image_id``, ``category_id``, ``bbox`` xywh pixels, ``score``), in the
        file's order.

    Raises:
        FileNotFoundError: no such file.
        ValueError, TypeError: invalid JSON or schema, naming the file, the entry and the field.
    """
    path = Path(path)
    return validate_coco_results(read_json_file(path, "COCO results file"), where=str(path))


def save_coco_results(results: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write COCO results JSON atomically (a killed run never leaves half a file).

    Args:
        results (list[dict]): COCO result dicts (``image_id``, ``category_id``, ``bbox`` xywh pixels,
            ``score`` in [0, 1]); checked before anything is written. An empty list writes ``[]``.
        path (str | Path): the file to write; missing parent folders are created.

    Returns:
        Path: ``path``.

    Raises:
        TypeError, ValueError: ``results`` is no list of valid result dicts (naming the entry and the
            field), or ``path`` is written as a folder (``"runs/"``).
    """
    path = check_file_path(path)
    clean = validate_coco_results(results, "results")
    atomic_write_json(path, clean)
    return path


# ----------------------------------------------------------------------------------------- ground truth
#: The largest image or annotation id: pycocotools holds ids in float64 arrays.
_MAX_ID = 2**53


def files_under_several_ids(images: Iterable[tuple[int, str]]) -> dict[str, list[int]]:
    """``{file_name: [image id, ...]}`` of each file name that the ``(image id, file_name)`` pairs give more
    than one id, the names and their ids in the order given: one image file whose records would split its
    annotations, or its saved boxes, between ids."""
    ids_by_file: dict[str, list[int]] = {}
    for image_id, file_name in images:
        ids_by_file.setdefault(file_name, []).append(image_id)
    return {name: ids for name, ids in ids_by_file.items() if len(ids) > 1}


def check_one_id_per_file(images: Iterable[tuple[int, str]], source: str | Path) -> None:
    """Raise ``ValueError`` where the ``(image id, file_name)`` pairs of the annotation file ``source`` list
    a file under more than one id (:func:`files_under_several_ids`), naming how many and the first."""
    if shared := files_under_several_ids(images):
        name, ids = next(iter(shared.items()))
        raise ValueError(
            f"{source} lists {len(shared)} file{'s' if len(shared) > 1 else ''} under more than one image id, e.g. "
            f"{name!r} under {ids}: each image file needs one record, holding all its annotations"
        )


def check_file_name_inside(file_name: str, image_id: int, whose: str = "the ground truth") -> str:
    """``file_name`` of the image ``image_id`` of ``whose``, checked to name a file inside the images folder:
    relative (no root, no drive) and without a ``..`` part, under either separator (annotation files written
    on Windows use backslashes). Joined to the folder, any other would read a file from outside it.

    Raises:
        ValueError: naming the image, ``whose`` it is and the file name.
    """
    path = PureWindowsPath(file_name)
    if path.drive or path.root or ".." in path.parts:
        raise ValueError(
            f"image {image_id} of {whose} has file_name {file_name!r}, which leads outside the images folder: "
            "expected a path inside it (relative to it, without '..')"
        )
    return file_name


def _duplicates(values: Iterable[Any]) -> list[Any]:
    seen: set[Any] = set()
    return sorted({v for v in values if v in seen or seen.add(v)})


def _check_gt_dataset(dataset: Any, where: str) -> None:
    """Raise unless ``dataset`` is a COCO annotation dict that pycocotools scores correctly.

    pycocotools accepts, and silently mis-scores, duplicate annotation or image ids, boxes of negative or
    NaN size, and annotations of categories it was not told about; here each is an error naming the
    entry, the field and the value.
    """
    if not isinstance(dataset, Mapping):
        raise TypeError(f"{where} must be a COCO annotation dict, got {type(dataset).__name__}")
    missing = [k for k in ("images", "annotations", "categories") if k not in dataset]
    if missing:
        hint = (
            " (a list looks like a results file: pass it as predictions)" if isinstance(dataset, list) else ""
        )
        raise ValueError(f"{where} is not a COCO annotation file: it lacks {missing}{hint}")
    for key in ("images", "annotations", "categories"):
        if not isinstance(dataset[key], list) or not all(isinstance(e, Mapping) for e in dataset[key]):
            raise TypeError(f"{where}: {key!r} must be a list of objects")

    for i, category in enumerate(dataset["categories"]):
        category_id = category.get("id")
        if not _is_int(category_id) or not 0 <= category_id <= MAX_LABEL:
            raise ValueError(f"{where}: categories[{i}].id must be an integer in [0, {MAX_LABEL}], got {category_id!r}")
    category_ids = [int(c["id"]) for c in dataset["categories"]]
    if duplicated := _duplicates(category_ids):
        raise ValueError(f"{where}: category ids {duplicated[:10]} appear more than once in 'categories'")

    for i, image in enumerate(dataset["images"]):
        for key in ("id", "width", "height"):
            if key not in image:
                raise ValueError(f"{where}: images[{i}] lacks {key!r}: {dict(image)!r}")
        if not _is_int(image["id"]) or not 0 <= image["id"] <= _MAX_ID:
            raise ValueError(f"{where}: images[{i}].id must be an integer in [0, 2**53], got {image['id']!r}")
        for key in ("width", "height"):
            if not _is_int(image[key]) or not 0 < image[key] <= MAX_IMAGE_SIDE:
                raise ValueError(f"{where}: images[{i}].{key} must be a positive integer, got {image[key]!r}")
    image_ids = [int(image["id"]) for image in dataset["images"]]
    if duplicated := _duplicates(image_ids):
        raise ValueError(f"{where}: image ids {duplicated[:10]} appear more than once in 'images'")

    sizes = {int(image["id"]): (image["width"], image["height"]) for image in dataset["images"]}
    known_categories = set(category_ids)
    for i, ann in enumerate(dataset["annotations"]):
        for key in ("image_id", "category_id", "bbox"):
            if key not in ann:
                raise ValueError(f"{where}: annotations[{i}] lacks {key!r}")
        for key in ("image_id", "category_id"):  # "64" is no id, whether or not 64 is one
            if not _is_int(ann[key]):
                raise ValueError(
                    f"{where}: annotations[{i}].{key} must be an integer, got {type(ann[key]).__name__}: {ann[key]!r}"
                )
        if ann["image_id"] not in sizes:
            raise ValueError(
                f"{where}: annotations[{i}] refers to image_id {ann['image_id']!r}, which is not in 'images'"
            )
        if ann["category_id"] not in known_categories:
            raise ValueError(
                f"{where}: annotations[{i}] has category_id {ann['category_id']!r}, which is not in 'categories'"
            )
        bbox = ann["bbox"]
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not all(map(_is_finite_number, bbox)):
            raise ValueError(f"{where}: annotations[{i}].bbox must be 4 finite numbers [x, y, width, height], got {bbox!r}")
        x, y, w, h = (float(v) for v in bbox)
        # pycocotools can never match a box without area (nor one whose size vanishes next to its position)
        if not (x + w > x and y + h > y):
            raise ValueError(
                f"{where}: annotations[{i}].bbox = {list(bbox)} has no area (width and height must be > 0: it "
                "could never be matched); remove it or give it a size"
            )
        width, height = sizes[ann["image_id"]]
        if x >= width or y >= height or x + w <= 0 or y + h <= 0:
            raise ValueError(
                f"{where}: annotations[{i}].bbox = {list(bbox)} lies outside its {width}x{height} image"
            )
        # pycocotools takes an id <= 0 for "not matched": such a box would count as a miss
        if "id" in ann and (not _is_int(ann["id"]) or not 1 <= ann["id"] <= _MAX_ID):
            raise ValueError(f"{where}: annotations[{i}].id must be an integer in [1, 2**53], got {ann['id']!r}")
        if "iscrowd" in ann and ann["iscrowd"] not in (0, 1):  # True and False are 1 and 0
            raise ValueError(f"{where}: annotations[{i}].iscrowd must be 0 or 1, got {ann['iscrowd']!r}")
        if "area" in ann and not (_is_finite_number(ann["area"]) and ann["area"] >= 0):
            raise ValueError(f"{where}: annotations[{i}].area must be a finite number >= 0, got {ann['area']!r}")
    if duplicated := _duplicates(int(a["id"]) for a in dataset["annotations"] if "id" in a):
        raise ValueError(f"{where}: annotation ids {duplicated[:10]} appear more than once in 'annotations'")


@dataclass(eq=False)
class CocoGroundTruth:
    """Per-image ground truth of a COCO annotation file.

    Build it with :func:`load_coco_gt`. Boxes come out as xyxy absolute pixels, labels as category ids.

    Attributes:
        dataset (dict): the annotation file's content (treat as read-only).
        images_dir (Path | None): folder of the image files, for :meth:`image_path`.
    """

    dataset: dict[str, Any]
    images_dir: Path | None = None
    _images: dict[int, dict[str, Any]] = field(init=False, repr=False)
    _anns: dict[int, list[dict[str, Any]]] = field(init=False, repr=False)
    _coco: COCO | None = field(init=False, repr=False, default=None)
    _fast_coco: Any = field(init=False, repr=False, default=None)
    _hot_coco: Any = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        _check_gt_dataset(self.dataset, "ground truth")
        self._images = {int(image["id"]): image for image in self.dataset["images"]}
        self._anns = {image_id: [] for image_id in self._images}
        for ann in self.dataset["annotations"]:
            self._anns[int(ann["image_id"])].append(ann)
        if self.images_dir is not None:
            self.images_dir = Path(self.images_dir)

    def __repr__(self) -> str:
        return (
            f"CocoGroundTruth(images={len(self)}, annotations={len(self.dataset['annotations'])}, "
            f"categories={len(self.category_ids)}, images_dir={self.images_dir})"
        )

    def __len__(self) -> int:
        return len(self._images)

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._images

    def check_has_images(self, image_ids: Sequence[int]) -> None:
        """Raise ``ValueError`` naming the ids of ``image_ids`` (up to 10) that this ground truth does not hold:
        fitting on such an image would otherwise stop at its first lookup, with a bare ``KeyError``."""
        unknown = [i for i in image_ids if i not in self]
        if unknown:
            raise ValueError(f"image_ids {unknown[:10]} are not in the ground truth ({len(self)} images)")

    @property
    def image_ids(self) -> list[int]:
        """All image ids, sorted (images with no annotation included)."""
        return sorted(self._images)

    @property
    def annotated_image_ids(self) -> list[int]:
        """Image ids with at least one annotation, sorted."""
        return sorted(i for i, anns in self._anns.items() if anns)

    @property
    def unannotated_image_ids(self) -> list[int]:
        """Image ids without any annotation (negative images), sorted."""
        return sorted(i for i, anns in self._anns.items() if not anns)

    @property
    def category_ids(self) -> list[int]:
        """The ids of the ``categories``, sorted."""
        return sorted(int(c["id"]) for c in self.dataset["categories"])

    @property
    def category_names(self) -> dict[int, str]:
        """``{category_id: name}``."""
        return {int(c["id"]): str(c.get("name", c["id"])) for c in self.dataset["categories"]}

    def _image(self, image_id: int) -> dict[str, Any]:
        key = check_whole(image_id, "image_id")  # 1.7 is not image 1, nor "1" a missing one
        try:
            return self._images[key]
        except KeyError:
            raise KeyError(f"image_id {image_id!r} is not in the ground truth ({len(self)} images)") from None

    def image_size(self, image_id: int) -> tuple[int, int]:
        """``(height, width)`` in pixels."""
        image = self._image(image_id)
        return int(image["height"]), int(image["width"])

    def file_name(self, image_id: int) -> str:
        """The image's ``file_name``.

        Raises:
            ValueError: the ground truth's image has none (optional for scoring, needed to find the file).
        """
        image = self._image(image_id)
        if "file_name" not in image:
            raise ValueError(
                f"image {image_id} of the ground truth has no 'file_name': the image file cannot be found from it; "
                "give every image its file name relative to the image folder"
            )
        return str(image["file_name"])

    def image_path(self, image_id: int) -> Path:
        """``images_dir / file_name``; needs ``images_dir`` (given to :func:`load_coco_gt`)."""
        if self.images_dir is None:
            raise ValueError(
                "CocoGroundTruth.image_path needs images_dir: load_coco_gt(path, images_dir=...)"
            )
        return self.images_dir / self.file_name(image_id)

    def image(self, image_id: int) -> dict[str, Any]:
        """The raw image dict of one image (treat as read-only)."""
        return self._image(image_id)

    def annotations(self, image_id: int) -> list[dict[str, Any]]:
        """The raw annotation dicts of one image (treat as read-only)."""
        self._image(image_id)
        return list(self._anns[int(image_id)])

    def targets(self, image_id: int) -> tuple[Tensor, Tensor, Tensor]:
        """Ground truth of one image.

        Returns:
            boxes (Tensor[G, 4] float32): xyxy absolute pixels.
            labels (Tensor[G] int64): category ids.
            iscrowd (Tensor[G] bool): crowd regions (COCO ignores detections matched to them).
        """
        self._image(image_id)
        anns = self._anns[int(image_id)]
        if not anns:
            return (
                torch.zeros((0, 4)),
                torch.zeros((0,), dtype=torch.int64),
                torch.zeros((0,), dtype=torch.bool),
            )
        xywh = torch.tensor([a["bbox"] for a in anns], dtype=torch.float64)  # [G, 4]
        boxes = torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1).float()
        labels = torch.tensor([int(a["category_id"]) for a in anns], dtype=torch.int64)
        iscrowd = torch.tensor([bool(a.get("iscrowd", 0)) for a in anns], dtype=torch.bool)
        return boxes, labels, iscrowd

    def detections(
        self, image_id: int, include_crowd: bool = False, source: str = "ground_truth"
    ) -> Detections:
        """The ground truth of one image as ``Detections`` with score 1 (crowd regions left out by default)."""
        boxes, labels, iscrowd = self.targets(image_id)
        keep = torch.ones_like(iscrowd) if include_crowd else ~iscrowd
        return Detections(
            boxes[keep], torch.ones(int(keep.sum())), labels[keep], self.image_size(image_id), source
        )

    def subset(self, image_ids: Iterable[int]) -> CocoGroundTruth:
        """A ground truth restricted to ``image_ids`` (e.g. one cross-validation fold)."""
        wanted = set(check_integers(image_ids, "image_ids"))
        unknown = sorted(wanted - set(self._images))
        if unknown:
            raise ValueError(
                f"image ids not in the ground truth: {unknown[:10]}{' ...' if len(unknown) > 10 else ''}"
            )
        dataset = dict(self.dataset)
        dataset["images"] = [im for im in self.dataset["images"] if int(im["id"]) in wanted]
        dataset["annotations"] = [a for a in self.dataset["annotations"] if int(a["image_id"]) in wanted]
        return CocoGroundTruth(dataset, self.images_dir)

    @property
    def coco(self) -> COCO:
        """A ``pycocotools.coco.COCO`` over a copy of the annotations (built once, quietly)."""
        if self._coco is None:
            self._coco = _coco_from_dataset(self.dataset)
        return self._coco


def load_coco_gt(
    source: str | Path | Mapping[str, Any] | COCO | CocoGroundTruth, images_dir: str | Path | None = None
) -> CocoGroundTruth:
    """Load a COCO annotation file (path), dict, or ``pycocotools.coco.COCO`` as :class:`CocoGroundTruth`.

    Args:
        source: the annotations (a :class:`CocoGroundTruth` is returned as it is when ``images_dir`` is None).
        images_dir: folder holding the images (``file_name`` is relative to it), for ``image_path()``.

    Returns:
        CocoGroundTruth: boxes as xyxy absolute pixels, labels as category ids.

    Raises:
        FileNotFoundError: no such file.
        ValueError: invalid JSON, a results list given for annotations, or annotations that break the input
            contract (repeated ids, a box without area, ...), naming the file and the entry.
        TypeError: ``source`` of none of these types.
    """
    if isinstance(source, CocoGroundTruth):
        if images_dir is None:
            return source
        return CocoGroundTruth(source.dataset, Path(images_dir))
    if isinstance(source, (str, Path)):
        path = Path(source)
        dataset = read_json_file(path, "COCO annotation file")
        if isinstance(dataset, list):
            raise ValueError(f"{path} holds a list, i.e. COCO results, not a COCO annotation file")
        _check_gt_dataset(dataset, str(path))
        return CocoGroundTruth(dataset, Path(images_dir) if images_dir is not None else None)
    if isinstance(source, Mapping):
        return CocoGroundTruth(dict(source), Path(images_dir) if images_dir is not None else None)
    dataset = getattr(source, "dataset", None)
    if dataset is not None and hasattr(source, "getImgIds"):  # a pycocotools COCO (or lookalike)
        return CocoGroundTruth(dataset, Path(images_dir) if images_dir is not None else None)
    raise TypeError(
        "ground truth must be a COCO annotation file path, a dict, a pycocotools COCO or a CocoGroundTruth, "
        f"got {type(source).__name__}"
    )


def with_annotation_ids(annotations: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Shallow copies of ``annotations``, those without an ``id`` numbered after the largest given id.

    An annotation's ``id`` is optional in :func:`load_coco_gt`, but pycocotools indexes annotations by it,
    and code that joins or copies annotation files renumbers by it; new ids above the given ones never
    collide with them (two annotations with one id are mis-scored).
    """
    annotations = [dict(ann) for ann in annotations]
    next_id = max((int(ann["id"]) for ann in annotations if "id" in ann), default=0) + 1
    for ann in annotations:
        if "id" not in ann:
            ann["id"], next_id = next_id, next_id + 1
    return annotations


def _coco_from_dataset(dataset: Mapping[str, Any]) -> COCO:
    """A pycocotools COCO over shallow copies of the annotations (COCOeval adds keys to them).

    Missing ``id`` is numbered (:func:`with_annotation_ids`), missing ``area`` filled with the box area and
    missing ``iscrowd`` with 0, so hand-made annotation dicts evaluate too.
    """
    from pycocotools.coco import COCO

    annotations = with_annotation_ids(dataset["annotations"])
    for ann in annotations:
        ann.setdefault("iscrowd", 0)
        if "area" not in ann:
            ann["area"] = float(ann["bbox"][2]) * float(ann["bbox"][3])
    coco = COCO()
    coco.dataset = {
        "info": dict(dataset.get("info", {})),
        "images": [dict(im) for im in dataset["images"]],
        "annotations": annotations,
        "categories": [dict(c) for c in dataset["categories"]],
    }
    with _captured_stdout("index ground truth"):
        coco.createIndex()
    return coco


# ----------------------------------------------------------------------------------------------- evaluate
def evaluated_image_ids(truth: CocoGroundTruth, image_ids: Iterable[int] | None) -> list[int]:
    """The sorted images to evaluate: ``image_ids`` (each must be in ``truth``, at least one) or, by default,
    every image with an annotation."""
    if image_ids is None:
        return truth.annotated_image_ids
    eval_ids = sorted(set(check_integers(image_ids, "image_ids")))
    unknown = [i for i in eval_ids if i not in truth]
    if unknown:
        raise ValueError(f"image_ids not in the ground truth: {unknown[:10]}{' ...' if len(unknown) > 10 else ''}")
    if not eval_ids:
        raise ValueError("image_ids is empty: nothing to evaluate")
    return eval_ids


def check_result_categories(
    truth: CocoGroundTruth, results: Sequence[Mapping[str, Any]] | np.ndarray, what: str
) -> None:
    """Every result's ``category_id`` must be a category of ``truth`` (pycocotools would drop the others)."""
    known = set(truth.category_ids)
    if isinstance(results, np.ndarray):
        used = {int(c) for c in np.unique(results[:, 6])}
    else:
        used = {r["category_id"] for r in results}
    unknown = sorted(used - known)
    if unknown:
        raise ValueError(
            f"{what} use category ids {unknown} that the ground truth does not define "
            f"(known: {sorted(known)}); map model class indices to dataset category ids first"
        )


def detections_to_array(det: Detections, image_id: int) -> np.ndarray:
    """One image's ``Detections`` as rows ``[image_id, x, y, w, h, score, category_id]`` (float64
    ``[K, 7]``, the array form of COCO results that ``COCO.loadRes`` and :func:`evaluate_coco` take)."""
    if not isinstance(det, Detections):
        raise TypeError(f"det must be Detections, got {type(det).__name__}")
    if not _is_int(image_id):
        raise TypeError(f"image_id must be an integer, got {image_id!r}")
    boxes = det.boxes.detach().to("cpu", torch.float64)  # [K, 4]
    rows = torch.empty(len(det), 7, dtype=torch.float64)
    rows[:, 0] = float(image_id)
    rows[:, 1:3] = boxes[:, :2]
    rows[:, 3:5] = boxes[:, 2:] - boxes[:, :2]
    rows[:, 5] = det.scores.detach().to("cpu", torch.float64)
    rows[:, 6] = det.labels.detach().to("cpu", torch.float64)
    return rows.numpy()


def _check_result_array(array: np.ndarray, where: str) -> np.ndarray:
    """The ``[K, 7]`` array form of COCO results, checked: finite, ``w, h >= 0``, integer ids."""
    if array.ndim != 2 or array.shape[1] != 7:
        raise ValueError(
            f"{where} as an array must have shape [K, 7] (image_id, x, y, w, h, score, category_id), "
            f"got {list(array.shape)}"
        )
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{where} as an array must hold numbers, got dtype {array.dtype}")
    array = np.asarray(array, dtype=np.float64)
    bad = ~np.isfinite(array).all(axis=1) | (array[:, 3] < 0) | (array[:, 4] < 0)
    bad |= (array[:, 0] != np.round(array[:, 0])) | (array[:, 6] != np.round(array[:, 6]))
    bad |= (array[:, 5] < 0) | (array[:, 5] > 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{where}[{i}] is not a valid result row (integer ids, finite values, w, h >= 0, a score "
                         f"in [0, 1]): {array[i].tolist()}")
    return array


def _array_to_results(array: np.ndarray) -> list[dict[str, Any]]:
    return [
        {"image_id": int(row[0]), "category_id": int(row[6]), "bbox": [row[1], row[2], row[3], row[4]],
         "score": row[5]}
        for row in array.tolist()
    ]


def evaluate_coco(
    gt: str | Path | Mapping[str, Any] | COCO | CocoGroundTruth,
    predictions: Sequence[Mapping[str, Any]] | np.ndarray | Tensor | str | Path,
    image_ids: Iterable[int] | None = None,
    backend: Literal["pycocotools", "faster", "hotcoco"] = "pycocotools",
) -> dict[str, float]:
    """COCO bbox mAP (pycocotools) with labelled keys.

    Which images are evaluated: by default the images with at least one ground-truth annotation
    (the evaluation protocol: "only images with ground truth"); ``image_ids`` chooses others explicitly
    (an image with no annotation is then a negative image: boxes predicted there are false positives). Predictions on images absent from the ground truth, or outside
    ``image_ids``, are dropped (the first case is logged as a warning), so predictions pooled over all
    images can be scored fold by fold.

    The same as :func:`evaluate_checked` of :func:`check_coco_input`: check the inputs once with the latter
    to score them with several evaluators.

    Args:
        gt: a COCO annotation file path, a dict, a ``pycocotools.coco.COCO`` or a :class:`CocoGroundTruth`.
            Never modified.
        predictions: COCO result dicts (``image_id``, ``category_id``, ``bbox`` xywh pixels, ``score``),
            the same as a float array ``[K, 7]`` of rows ``[image_id, x, y, w, h, score, category_id]``
            (:func:`detections_to_array`; no per-dict work, for searches; a tensor of those rows too), or
            the path of a results JSON file. Never modified.
        image_ids: evaluate only these images (e.g. one cross-validation fold); each must be in ``gt``.
        backend: ``"pycocotools"`` (the reference), ``"faster"`` (faster-coco-eval's C++ evaluator, the
            same numbers about five times faster) or ``"hotcoco"`` (hotcoco's Rust port, within 1e-4 of
            pycocotools on our data (tested) and another ~15 times faster; used inside hyper-parameter
            searches when installed, see :func:`fastest_backend`).

    Returns:
        dict[str, float]: the keys of :data:`METRIC_KEYS` (``map``, ``map50``, ``map75``,
        ``map_small`` ... ``mar_large``), each in ``[0, 1]``, or ``-1.0`` where pycocotools finds no
        ground truth to measure (e.g. ``map_small`` when no object is small). No predictions at all
        gives ``0.0`` for every measurable key.

    Raises:
        ValueError: a prediction's ``category_id`` is not a category of the ground truth (the error lists
            the unknown ids), an ``image_ids`` entry is not in the ground truth, the schema is wrong, or an
            unknown ``backend``.
        TypeError: ``gt`` or ``predictions`` of none of these types, ``image_ids`` not integers.
        FileNotFoundError: a path of ``gt`` or ``predictions`` that is not there.
    """
    return evaluate_checked(check_coco_input(gt, predictions, image_ids), backend)


@dataclass(frozen=True, eq=False)
class CheckedCocoInput:
    """What :func:`evaluate_coco` scores, checked by :func:`check_coco_input` (make it with that).

    Attributes:
        truth (CocoGroundTruth): the ground truth.
        predictions (list[dict] | np.ndarray[K, 7]): the checked results on ``image_ids``, in the form
            given (dicts, or the rows of :func:`detections_to_array`); the others dropped.
        image_ids (list[int]): the evaluated images, ascending.
    """

    truth: CocoGroundTruth
    predictions: list[dict[str, Any]] | np.ndarray = field(repr=False)
    image_ids: list[int] = field(repr=False)


def check_coco_input(
    gt: str | Path | Mapping[str, Any] | COCO | CocoGroundTruth,
    predictions: Sequence[Mapping[str, Any]] | np.ndarray | Tensor | str | Path,
    image_ids: Iterable[int] | None = None,
) -> CheckedCocoInput:
    """Every check :func:`evaluate_coco` makes of its inputs (same arguments), once: score the result with
    :func:`evaluate_checked` and any evaluator, as ``detens bench --coco`` times the evaluators alone.

    Raises:
        ValueError, TypeError: as :func:`evaluate_coco`.
    """
    truth = load_coco_gt(gt)
    array: np.ndarray | None = None
    if isinstance(predictions, torch.Tensor):  # the array form, as detections_to_array's rows in a tensor
        predictions = predictions.detach().cpu().numpy()
    if isinstance(predictions, np.ndarray):
        array = _check_result_array(predictions, "predictions")
    elif isinstance(predictions, (str, Path)):
        results = load_coco_results(predictions)
    else:
        results = validate_coco_results(predictions, "predictions")

    eval_ids = evaluated_image_ids(truth, image_ids)
    check_result_categories(truth, results if array is None else array, "predictions")

    if array is not None:
        outside = int((~np.isin(array[:, 0], truth.image_ids)).sum())
    else:
        outside = sum(r["image_id"] not in truth for r in results)
    if outside:
        logger.warning(
            "evaluate_coco: dropped %d predictions on images absent from the ground truth", outside
        )
    if array is not None:
        return CheckedCocoInput(truth, array[np.isin(array[:, 0], eval_ids)], eval_ids)
    wanted = set(eval_ids)
    return CheckedCocoInput(truth, [r for r in results if r["image_id"] in wanted], eval_ids)


def evaluate_checked(
    checked: CheckedCocoInput, backend: Literal["pycocotools", "faster", "hotcoco"] = "pycocotools"
) -> dict[str, float]:
    """:func:`evaluate_coco` of an input :func:`check_coco_input` has checked: the evaluator's work alone.

    Raises:
        TypeError: ``checked`` is not what :func:`check_coco_input` returns.
        ValueError: an unknown ``backend``.
    """
    from pycocotools.cocoeval import COCOeval

    if not isinstance(checked, CheckedCocoInput):
        raise TypeError(f"checked must be what check_coco_input returns, got {type(checked).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    truth, eval_ids = checked.truth, checked.image_ids
    results: list[dict[str, Any]] | None = None
    array: np.ndarray | None = None
    if isinstance(checked.predictions, np.ndarray):
        array = checked.predictions
        if backend != "hotcoco" or not len(array):
            results, array = _array_to_results(array), None
    else:
        results = checked.predictions

    if backend == "hotcoco":
        evaluator = _hotcoco_evaluator(truth, results if array is None else array)
        evaluator.params.img_ids = eval_ids
    elif backend == "faster":
        evaluator = _faster_evaluator(truth, results)
    else:
        coco_gt = truth.coco
        evaluator = COCOeval(coco_gt, _results_coco(coco_gt, results), iouType="bbox")
    evaluator.params.imgIds = eval_ids
    with _captured_stdout("evaluate"):
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = [float(v) for v in evaluator.stats]
    metrics = dict(zip(METRIC_KEYS, stats, strict=True))
    logger.debug(
        "COCO bbox on %d images, %d predictions: mAP %.4f, AP50 %.4f, AP75 %.4f",
        len(eval_ids),
        len(results) if array is None else len(array),
        metrics["map"],
        metrics["map50"],
        metrics["map75"],
    )
    return metrics


def fastest_backend() -> str:
    """``hotcoco`` when it is installed, else ``faster``: for searches that evaluate many settings."""
    import importlib.util

    return "hotcoco" if importlib.util.find_spec("hotcoco") is not None else "faster"


def _hotcoco_evaluator(truth: CocoGroundTruth, results: list[dict[str, Any]] | np.ndarray) -> Any:
    import hotcoco

    if truth._hot_coco is None:
        dataset = truth.coco.dataset
        categories = dataset.get("categories", [])
        if any("name" not in c for c in categories):
            # hotcoco writes a line to stderr for each unnamed category; names are not used in scoring
            named = [c if "name" in c else {**c, "name": f"category {c['id']}"} for c in categories]
            dataset = {**dataset, "categories": named}
        truth._hot_coco = hotcoco.COCO(dataset)
    if not isinstance(results, np.ndarray):
        results = [dict(r) for r in results]
    detections = truth._hot_coco.load_res(results)
    return hotcoco.COCOeval(truth._hot_coco, detections, "bbox")


def _faster_evaluator(truth: CocoGroundTruth, results: list[dict[str, Any]]) -> Any:
    from faster_coco_eval import COCO as FastCOCO
    from faster_coco_eval import COCOeval_faster

    if truth._fast_coco is None:
        fast_gt = FastCOCO()
        fast_gt.dataset = truth.coco.dataset
        with _captured_stdout("index ground truth (faster-coco-eval)"):
            fast_gt.createIndex()
        truth._fast_coco = fast_gt
    fast_dt = FastCOCO()
    fast_dt.dataset = _results_coco(truth.coco, results, index=False).dataset
    with _captured_stdout("index results (faster-coco-eval)"):
        fast_dt.createIndex()
    return COCOeval_faster(truth._fast_coco, fast_dt, iouType="bbox", print_function=logger.debug)


def _results_coco(coco_gt: COCO, results: list[dict[str, Any]], index: bool = True) -> COCO:
    """What ``COCO.loadRes`` builds for bbox results, without its prints, its mutation of the caller's
    dicts, or its crash on an empty list. With ``index=False`` (the faster-coco-eval path) the box
    polygons that ``loadRes`` adds for drawing are left out: bbox evaluation never reads them."""
    from pycocotools.coco import COCO

    annotations = []
    for i, r in enumerate(results):
        x, y, w, h = r["bbox"]
        annotation = {
            "id": i + 1,
            "image_id": r["image_id"],
            "category_id": r["category_id"],
            "bbox": [x, y, w, h],
            "score": r["score"],
            "area": w * h,
            "iscrowd": 0,
        }
        if index:
            annotation["segmentation"] = [[x, y, x, y + h, x + w, y + h, x + w, y]]
        annotations.append(annotation)
    coco = COCO()
    coco.dataset = {
        "info": dict(coco_gt.dataset.get("info", {})),
        "images": list(coco_gt.dataset["images"]),
        "categories": list(coco_gt.dataset["categories"]),
        "annotations": annotations,
    }
    if index:
        with _captured_stdout("index results"):
            coco.createIndex()
    return coco
