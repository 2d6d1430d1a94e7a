"""Where the AP goes: TIDE's error breakdown (Bolya et al., "TIDE: A General Toolbox for Identifying Object
Detection Errors", ECCV 2020) on COCOeval's own matching.

Every false positive gets one error type, tested in TIDE's order (IoU with the ground-truth boxes of the
image, ``pos_thr`` = 0.5 and ``bg_thr`` = 0.1 by default, as in TIDE):

- ``loc``: its best IoU with a box of its class is in ``[bg_thr, pos_thr]`` (right class, poor box; never
  on an image without a box of its class);
- ``cls``: IoU ``>= pos_thr`` with a box of another class (right box, wrong class);
- ``dupe``: IoU ``>= pos_thr`` with a box of its class that a higher-scored detection already took;
- ``bkg``: IoU ``<= bg_thr`` with every box (detected background);
- ``both``: anything else (wrong class and poor box);

and every ground-truth box that no detection took and no ``loc`` / ``cls`` error points at is ``missed``.
The dAP of a type is the AP gained by fixing all errors of that type and no other (TIDE's main errors,
each fixed alone): a ``loc`` or ``cls`` error becomes a true positive of the box it points at when that box
is free and the error is the highest-scored ``loc`` / ``cls`` error pointing at it, and is removed
otherwise; ``dupe``, ``bkg`` and ``both`` errors are removed; ``missed`` boxes are removed from the ground
truth. Also TIDE's two special errors: ``false_positives`` (every false positive removed) and
``false_negatives`` (every box no detection took removed from the ground truth).

All figures are at the single IoU threshold ``pos_thr`` (AP50 by default, TIDE's default), not averaged
over 0.5:0.95.

Why our own code and not a library (checked on PyPI): ``tidecv`` 1.0.1 (the authors', last released 2020)
pulls in seaborn, pandas and OpenCV for its plots and matches boxes its own way (the top 100 detections of
an image over all classes, not of each class; crowd regions handled differently), so its base AP is not
the AP50 of our table; ``tidecv-light`` 1.0.2 (numpy only) reads its ``[x, y, w, h]`` boxes as
``[x1, y1, x2, y2]`` in its IoU and divides by zero on a zero-area box; ``hotcoco`` 1.3.0 (maintained,
Rust) has ``tide_errors`` whose base AP is pycocotools' AP50, but it is a compiled evaluation toolkit
(dashboards, servers, a CLI) brought in for one function and returns only totals. Here the matching is
COCOeval's (:mod:`detens.coco_match`: the top ``max_dets`` detections of each image *and class*, crowds
as COCOeval treats them), so the base AP is bit-identical to pycocotools' AP at ``pos_thr`` and the
breakdown explains exactly the figure in the table. Departures from TIDE, all where TIDE's matching
differs from COCOeval's: detections COCOeval ignores (matched to a crowd region) are neither errors nor
fixed; crowd boxes take no part in the error tests; a category left without ground truth by a fix leaves
the mean, as COCOeval leaves out a category without ground truth (so fixing every error gives AP 1).

Dimension legend: D detections of one image, G ground-truth boxes of one image (all classes, crowds left
out), K categories.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from detens.checks import check_integer, check_real
from detens.coco import (
    CocoGroundTruth,
    check_result_categories,
    evaluated_image_ids,
    load_coco_gt,
    load_coco_results,
    validate_coco_results,
)
from detens.coco_match import FP, IGNORED, TP, coco_iou, iter_matches, mean_ap

__all__ = ["ERROR_TYPES", "SPECIAL_ERRORS", "ErrorAnalysis", "analyze_errors", "error_breakdown"]

#: TIDE's main error types, in its order; the first five are kinds of false positive.
ERROR_TYPES: tuple[str, ...] = ("cls", "loc", "both", "dupe", "bkg", "missed")
#: TIDE's special errors: perfect precision, perfect recall.
SPECIAL_ERRORS: tuple[str, ...] = ("false_positives", "false_negatives")

_FP_TYPES = ERROR_TYPES[:5]
_NONE = -1  # a detection that is not a false positive


@dataclass
class ErrorAnalysis:
    """Every kept detection and ground-truth box of an evaluation, labelled for TIDE's fixes.

    Build it with :func:`analyze_errors`. Detections are in COCOeval's accumulation order (images
    ascending, then category, then score); arrays of length D are over all detections, of length G over all
    ground-truth boxes that count (crowds and boxes outside COCO's area range left out).

    Attributes:
        categories (list[int]): the evaluated categories (ascending), COCOeval's K.
        det_category, det_image (ndarray[D] int64); det_score (ndarray[D] float64);
        det_label (ndarray[D] int64): :data:`~detens.coco_match.TP`, ``FP`` or ``IGNORED``;
        det_error (ndarray[D] int64): index into :data:`ERROR_TYPES` of a false positive's type, else -1;
        det_target (ndarray[D] int64): the box (index into the G arrays) a ``loc`` / ``cls`` error points at;
        det_fixable (ndarray[D] bool): that error becomes a true positive when its type is fixed;
        gt_category (ndarray[G] int64); gt_used (ndarray[G] bool): taken by a true positive;
        gt_missed (ndarray[G] bool): not taken and no ``loc`` / ``cls`` error points at it.
        pos_thr, bg_thr (float), max_dets (int): the settings.
    """

    categories: list[int]
    det_category: np.ndarray
    det_image: np.ndarray
    det_score: np.ndarray
    det_label: np.ndarray
    det_error: np.ndarray
    det_target: np.ndarray
    det_fixable: np.ndarray
    gt_category: np.ndarray
    gt_used: np.ndarray
    gt_missed: np.ndarray
    pos_thr: float
    bg_thr: float
    max_dets: int

    def ap(self, fixed: Iterable[str] = ()) -> float:
        """The AP at ``pos_thr`` with the errors of the ``fixed`` types fixed (none: COCOeval's AP).

        A fix that leaves no ground truth at all (every box missed, then ``missed`` fixed) gives 1 when no
        false positive is left and 0 otherwise; without any ground truth to begin with it is COCOeval's -1.

        Args:
            fixed: names from :data:`ERROR_TYPES` and :data:`SPECIAL_ERRORS`, fixed together.
        """
        fixed = set(fixed)
        unknown = sorted(fixed - set(ERROR_TYPES) - set(SPECIAL_ERRORS))
        if unknown:
            raise ValueError(f"unknown error types {unknown}; known: {', '.join(ERROR_TYPES + SPECIAL_ERRORS)}")
        category = self.det_category.copy()
        label = self.det_label.copy()
        keep = np.ones(len(label), dtype=bool)
        moved = np.zeros(len(label), dtype=bool)
        for t, name in enumerate(_FP_TYPES):
            if name not in fixed and "false_positives" not in fixed:
                continue
            errors = self.det_error == t
            if name in ("cls", "loc") and "false_positives" not in fixed:
                promoted = errors & self.det_fixable
                label[promoted] = TP
                category[promoted] = self.gt_category[self.det_target[promoted]]
                moved |= promoted & (category != self.det_category)
                keep &= ~(errors & ~self.det_fixable)
            else:
                keep &= ~errors

        counted = np.ones(len(self.gt_category), dtype=bool)
        if "missed" in fixed:
            counted &= ~self.gt_missed
        if "false_negatives" in fixed:
            counted &= self.gt_used
        positives = np.bincount(
            np.searchsorted(self.categories, self.gt_category[counted]), minlength=len(self.categories)
        )

        # COCOeval concatenates each category's detections image by image; a detection given another class
        # by a fix goes after that image's own detections of the class
        order = np.lexsort((np.arange(len(label)), moved, self.det_image))
        per_category = {}
        for k, c in enumerate(self.categories):
            index = order[(category[order] == c) & keep[order]]
            per_category[c] = (self.det_score[index], label[index], int(positives[k]))
        ap = mean_ap(per_category, self.categories)
        if ap < 0 and len(self.gt_category):
            # the fix removed every box, so AP has no class to average over: perfect when no false
            # positive is left, worthless otherwise
            return 0.0 if bool(((label == FP) & keep).any()) else 1.0
        return ap

    def counts(self) -> dict[str, int]:
        """``tp``, ``ignored``, each error type of :data:`ERROR_TYPES`, and ``gt`` (boxes that count)."""
        out = {"tp": int((self.det_label == TP).sum()), "ignored": int((self.det_label == IGNORED).sum())}
        for t, name in enumerate(_FP_TYPES):
            out[name] = int((self.det_error == t).sum())
        out["missed"] = int(self.gt_missed.sum())
        out["gt"] = len(self.gt_category)
        return out

    def summary(self) -> dict[str, Any]:
        """``{"ap", "dap": {type: AP gained}, "dap_special": {...}, "counts": {...}, "pos_thr", "bg_thr",
        "max_dets"}``; dAPs in AP units (0.012 = 1.2 points)."""
        base = self.ap()
        return {
            "ap": base,
            "dap": {name: self.ap([name]) - base for name in ERROR_TYPES},
            "dap_special": {name: self.ap([name]) - base for name in SPECIAL_ERRORS},
            "counts": self.counts(),
            "pos_thr": self.pos_thr,
            "bg_thr": self.bg_thr,
            "max_dets": self.max_dets,
        }


def analyze_errors(
    gt: CocoGroundTruth | Mapping[str, Any] | str | Path,
    results: Sequence[Mapping[str, Any]] | str | Path,
    image_ids: Iterable[int] | None = None,
    pos_thr: float = 0.5,
    bg_thr: float = 0.1,
    max_dets: int = 100,
) -> ErrorAnalysis:
    """Label every detection and ground-truth box of ``results`` for TIDE's fixes (module docstring).

    Args:
        gt: the ground truth (anything :func:`~detens.coco.load_coco_gt` accepts). Never modified.
        results: COCO result dicts or the path of a results JSON. Never modified; those on images outside
            ``image_ids`` are dropped.
        image_ids: the images to evaluate; by default every annotated image, as
            :func:`~detens.coco.evaluate_coco`.
        pos_thr (float): IoU of a true positive, in ``(0, 1)``.
        bg_thr (float): IoU at or below which a detection is background, in ``[0, pos_thr)``.
        max_dets (int): detections kept per image and class, ``>= 1`` (COCO's 100).

    Raises:
        TypeError: a threshold that is no number, ``max_dets`` no integer (a bool, a float).
        ValueError: a threshold out of range, a category the ground truth does not define, an image id
            not in the ground truth, a malformed result (naming its index and field).
    """
    pos_thr = check_real(pos_thr, "pos_thr", 0.0, 1.0, low_open=True, high_open=True)
    bg_thr = check_real(bg_thr, "bg_thr", 0.0)
    if not bg_thr < pos_thr:
        raise ValueError(f"bg_thr must be in [0, pos_thr = {pos_thr}), got {bg_thr!r}")
    max_dets = check_integer(max_dets, "max_dets", 1)
    truth = load_coco_gt(gt)
    clean = load_coco_results(results) if isinstance(results, (str, Path)) else validate_coco_results(results)
    check_result_categories(truth, clean, "results")
    eval_ids = evaluated_image_ids(truth, image_ids)

    det_category, det_image, det_score, det_label, det_error, det_target = [], [], [], [], [], []
    gt_category, gt_used = [], []
    for rank, image in enumerate(iter_matches(truth, clean, eval_ids, pos_thr, max_dets)):
        # the boxes that count, in annotation order: TIDE's ground truth, crowds left out
        counting = [i for i, a in enumerate(image.annotations) if _counts(a)]
        position = {a: g for g, a in enumerate(counting)}
        offset = len(gt_category)
        categories = np.array([int(image.annotations[a]["category_id"]) for a in counting], dtype=np.int64)  # [G]
        used = np.zeros(len(counting), dtype=bool)
        for label, match in zip(image.labels, image.matched, strict=True):
            if label == TP:
                used[position[match]] = True
        boxes = np.array([image.annotations[a]["bbox"] for a in counting], dtype=np.float64).reshape(-1, 4)
        dets = np.array([d["bbox"] for d in image.detections], dtype=np.float64).reshape(-1, 4)
        iou = coco_iou(dets, boxes, np.zeros(len(counting), dtype=bool))  # [D, G]
        det_classes = np.array([d["category_id"] for d in image.detections], dtype=np.int64)  # [D]
        same = det_classes[:, None] == categories[None, :]  # [D, G]
        for d, label in enumerate(image.labels):
            error, target = _classify(label, iou[d], same[d], used, pos_thr, bg_thr)
            det_error.append(error)
            det_target.append(target + offset if target >= 0 else -1)
        det_category += det_classes.tolist()
        det_image += [rank] * len(image.detections)
        det_score += [d["score"] for d in image.detections]
        det_label += image.labels
        gt_category += categories.tolist()
        gt_used += used.tolist()

    error = np.array(det_error, dtype=np.int64)
    target = np.array(det_target, dtype=np.int64)
    score = np.array(det_score, dtype=np.float64)
    used = np.array(gt_used, dtype=bool)
    # TIDE's BestGTMatch: of the loc / cls errors pointing at a free box, the highest-scored one is fixed
    # into a true positive (the first of equal scores); the box is then not "missed"
    fixable = np.zeros(len(error), dtype=bool)
    usable = np.zeros(len(used), dtype=bool)
    pointing = np.flatnonzero(np.isin(error, [ERROR_TYPES.index("cls"), ERROR_TYPES.index("loc")]))
    pointing = pointing[~used[target[pointing]]]
    usable[target[pointing]] = True
    best: dict[int, int] = {}
    for d in pointing[np.argsort(-score[pointing], kind="stable")].tolist():
        best.setdefault(int(target[d]), d)
    fixable[list(best.values())] = True
    return ErrorAnalysis(
        categories=truth.category_ids,
        det_category=np.array(det_category, dtype=np.int64),
        det_image=np.array(det_image, dtype=np.int64),
        det_score=score,
        det_label=np.array(det_label, dtype=np.int64),
        det_error=error,
        det_target=target,
        det_fixable=fixable,
        gt_category=np.array(gt_category, dtype=np.int64),
        gt_used=used,
        gt_missed=~used & ~usable,
        pos_thr=float(pos_thr),
        bg_thr=float(bg_thr),
        max_dets=max_dets,
    )


def error_breakdown(
    gt: CocoGroundTruth | Mapping[str, Any] | str | Path,
    results: Sequence[Mapping[str, Any]] | str | Path,
    image_ids: Iterable[int] | None = None,
    pos_thr: float = 0.5,
    bg_thr: float = 0.1,
    max_dets: int = 100,
) -> dict[str, Any]:
    """TIDE's error breakdown of ``results``: :func:`analyze_errors` then :meth:`ErrorAnalysis.summary`.

    Returns:
        dict: ``ap`` (COCOeval's AP at ``pos_thr``), ``dap`` (per :data:`ERROR_TYPES`, the AP gained by
        fixing that type alone), ``dap_special`` (per :data:`SPECIAL_ERRORS`), ``counts`` (``tp``,
        ``ignored``, each type, ``gt``), and the settings. No detection at all is a normal case (every box
        ``missed``).
    """
    return analyze_errors(gt, results, image_ids, pos_thr, bg_thr, max_dets).summary()


def _counts(annotation: Mapping[str, Any]) -> bool:
    """A box that COCOeval counts at area range "all" (not a crowd, area at most 1e10 px²)."""
    if annotation.get("iscrowd", 0):
        return False
    bbox = annotation["bbox"]
    area = float(annotation["area"]) if "area" in annotation else float(bbox[2]) * float(bbox[3])
    return 0.0 <= area <= 1e5**2


def _classify(
    label: int, iou: np.ndarray, same: np.ndarray, used: np.ndarray, pos_thr: float, bg_thr: float
) -> tuple[int, int]:
    """(index into :data:`ERROR_TYPES`, target box or -1) of one detection, TIDE's tests in TIDE's order.

    Args:
        label (int): the detection's COCOeval label. iou (ndarray[G] float64): its IoU with every box that
            counts. same (ndarray[G] bool): the box has its class. used (ndarray[G] bool): taken by a TP.
    """
    if label != FP:
        return _NONE, -1
    if iou.size == 0:
        return ERROR_TYPES.index("bkg"), -1
    # without a box of its class in the image there is no box to localize better: at bg_thr = 0 a stand-in
    # IoU of 0 would pass the test and aim the error at a box of another class
    if same.any():
        same_iou = np.where(same, iou, -1.0)
        g = int(same_iou.argmax())
        if bg_thr <= same_iou[g] <= pos_thr:
            return ERROR_TYPES.index("loc"), g
    other_iou = np.where(same, 0.0, iou)
    g = int(other_iou.argmax())
    if other_iou[g] >= pos_thr:
        return ERROR_TYPES.index("cls"), g
    if np.where(same & used, iou, 0.0).max() >= pos_thr:
        return ERROR_TYPES.index("dupe"), -1
    if iou.max() <= bg_thr:
        return ERROR_TYPES.index("bkg"), -1
    return ERROR_TYPES.index("both"), -1
