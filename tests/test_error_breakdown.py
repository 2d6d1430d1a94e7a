"""The TIDE error breakdown: a hand-built image whose every error type and every dAP is worked out by hand;
the base AP is pycocotools' AP50 on random cases (crowds, ties, several images); hotcoco's tide_errors
agrees where both follow TIDE; the precision-recall curves come from the same COCOeval run as the metrics."""

from __future__ import annotations

import random

import numpy as np
import pytest

from detens.coco import CocoGroundTruth, evaluate_coco
from detens.coco_curves import coco_curves
from detens.error_breakdown import ERROR_TYPES, SPECIAL_ERRORS, analyze_errors, error_breakdown

CATEGORIES = (1, 2)


def make_gt(annotations, image_ids=(1,), categories=CATEGORIES, size=200) -> CocoGroundTruth:
    """Ground truth from ``(image_id, category_id, [x, y, w, h], iscrowd)``."""
    return CocoGroundTruth(
        {
            "images": [{"id": i, "width": size, "height": size, "file_name": f"{i}.jpg"} for i in image_ids],
            "annotations": [
                {"id": k + 1, "image_id": i, "category_id": c, "bbox": list(b), "iscrowd": int(crowd),
                 "area": b[2] * b[3]}
                for k, (i, c, b, crowd) in enumerate(annotations)
            ],
            "categories": [{"id": c, "name": f"class{c}"} for c in categories],
        }
    )


def det(category, bbox, score, image_id=1):
    return {"image_id": image_id, "category_id": category, "bbox": list(bbox), "score": score}


# ------------------------------------------------------------------------------------ the hand-built case
# One 200x200 image, classes 1 and 2. Each detection is one error type (IoUs in the comments).
HAND_GT = make_gt([
    (1, 1, [0, 0, 100, 100], 0),  # g0: found by d0
    (1, 1, [120, 0, 50, 50], 0),  # g1: only d2 points at it (IoU 0.4)
    (1, 2, [0, 120, 60, 60], 0),  # g2: only d3 points at it, with the wrong class
    (1, 1, [150, 150, 40, 40], 0),  # g3: nothing near it -> missed
    (1, 1, [100, 160, 30, 30], 0),  # g5: found by d6, late
    (1, 2, [140, 60, 40, 40], 0),  # g6: found by d7, late
    (1, 1, [0, 180, 200, 20], 1),  # a crowd region: d8 lands in it and is ignored
])
HAND_RESULTS = [
    det(1, [0, 0, 100, 100], 0.9),  # d0 TP (g0)
    det(1, [0, 0, 100, 96], 0.8),  # d1 dupe: IoU 0.96 with g0, already taken
    det(1, [120, 0, 50, 20], 0.7),  # d2 loc: IoU 0.4 with g1
    det(1, [0, 120, 60, 60], 0.6),  # d3 cls: IoU 1 with g2 (class 2)
    det(1, [180, 100, 15, 15], 0.5),  # d4 bkg: touches nothing
    det(2, [0, 0, 100, 40], 0.4),  # d5 both: IoU 0.4 with g0 (class 1), nothing of class 2 near
    det(1, [100, 160, 30, 30], 0.3),  # d6 TP (g5)
    det(2, [140, 60, 40, 40], 0.2),  # d7 TP (g6)
    det(1, [10, 185, 20, 10], 0.95),  # d8 inside the crowd region: ignored, as COCOeval ignores it
]
# AP50 = mean over the two classes of the 101-point interpolated precision; worked out by hand
# (class 1: 4 boxes, class 2: 2 boxes). In units of 1/606 (= 1/(2 * 303)):
BASE = 179.5 / 606  # class 1: (26 + 25/3)/101, class 2: 0.5 * 51/101
EXPECTED_DAP = {
    "cls": 181.5 / 606,  # d3 becomes a class-2 TP of g2; class 1 loses an FP above d6
    "loc": 62.5 / 606,  # d2 becomes a TP of g1: class 1 reaches recall 0.75
    "both": 76.5 / 606,  # d5 removed: class 2's TP d7 has precision 1
    "dupe": 5 / 606,  # d1 removed: precision at d6 from 2/6 to 2/5
    "bkg": 5 / 606,  # d4 likewise
    "missed": 32 / 606,  # g3 removed: class 1 has 3 boxes
    "false_positives": 126.5 / 606,  # d1 ... d5 removed
    "false_negatives": 175 / 606,  # g1, g2, g3 removed (no detection took them)
}
EXPECTED_COUNTS = {"tp": 3, "ignored": 1, "cls": 1, "loc": 1, "both": 1, "dupe": 1, "bkg": 1, "missed": 1, "gt": 6}


class TestHandBuiltCase:
    def test_base_ap_is_pycocotools_ap50(self):
        summary = error_breakdown(HAND_GT, HAND_RESULTS)
        assert summary["ap"] == evaluate_coco(HAND_GT, HAND_RESULTS)["map50"]
        assert summary["ap"] == pytest.approx(BASE, abs=1e-12)

    def test_every_error_type_is_counted(self):
        counts = error_breakdown(HAND_GT, HAND_RESULTS)["counts"]
        assert counts == EXPECTED_COUNTS
        # every scored detection is a TP or exactly one error; every box found, pointed at or missed
        assert counts["tp"] + sum(counts[t] for t in ERROR_TYPES[:5]) == len(HAND_RESULTS) - counts["ignored"]

    @pytest.mark.parametrize("error", ERROR_TYPES + SPECIAL_ERRORS)
    def test_dap(self, error):
        summary = error_breakdown(HAND_GT, HAND_RESULTS)
        dap = {**summary["dap"], **summary["dap_special"]}
        assert dap[error] == pytest.approx(EXPECTED_DAP[error], abs=1e-12)

    def test_fixing_every_error_gives_ap_1(self):
        analysis = analyze_errors(HAND_GT, HAND_RESULTS)
        assert analysis.ap(ERROR_TYPES) == pytest.approx(1.0, abs=1e-12)
        assert analysis.ap(["false_positives", "false_negatives"]) == pytest.approx(1.0, abs=1e-12)

    def test_the_highest_scored_error_pointing_at_a_box_is_the_one_fixed(self):
        # a second loc error at g1 scored below d3: fixing loc turns d2 (0.7) into the TP and removes the
        # other (promoting it instead would put the TP below d3's false positive: a lower AP)
        weaker = det(1, [120, 0, 50, 18], 0.55)
        analysis = analyze_errors(HAND_GT, HAND_RESULTS + [weaker])
        assert analysis.counts()["loc"] == 2
        loc = analysis.det_error == ERROR_TYPES.index("loc")
        assert analysis.det_score[analysis.det_fixable & loc].tolist() == [0.7]
        assert analysis.ap(["loc"]) == pytest.approx(BASE + EXPECTED_DAP["loc"], abs=1e-12)

    def test_a_poor_box_at_an_object_already_found_is_removed_not_promoted(self):
        # IoU 0.4 with g0, which d0 took: a loc error that no fix can turn into a TP
        late = det(1, [0, 0, 100, 40], 0.85)
        analysis = analyze_errors(HAND_GT, HAND_RESULTS + [late])
        assert analysis.counts()["loc"] == 2
        assert int(analysis.det_fixable.sum()) == 2  # d2 (loc at g1) and d3 (cls at g2), not the late box


class TestEdges:
    def test_no_detections_every_box_missed(self):
        summary = error_breakdown(HAND_GT, [])
        assert summary["ap"] == 0.0 and summary["counts"]["missed"] == 6 and summary["counts"]["tp"] == 0
        assert summary["dap"]["missed"] == 1.0  # nothing left to find and nothing wrong

    def test_bad_arguments_name_themselves(self):
        with pytest.raises(ValueError, match="pos_thr"):
            error_breakdown(HAND_GT, HAND_RESULTS, pos_thr=1.0)
        with pytest.raises(ValueError, match="bg_thr"):
            error_breakdown(HAND_GT, HAND_RESULTS, bg_thr=0.6)
        with pytest.raises(ValueError, match="unknown error types"):
            analyze_errors(HAND_GT, HAND_RESULTS).ap(["localization"])
        with pytest.raises(ValueError, match=r"category ids \[7\]"):
            error_breakdown(HAND_GT, [det(7, [0, 0, 5, 5], 0.5)])

    @pytest.mark.parametrize(
        "options, error, message",
        [
            ({"max_dets": 0}, ValueError, "max_dets must be an integer >= 1, got 0"),
            ({"max_dets": True}, TypeError, "max_dets must be an integer, got bool: True"),
            ({"max_dets": 100.0}, TypeError, "max_dets must be an integer, got float: 100.0"),
            ({"max_dets": "100"}, TypeError, "max_dets must be an integer, got str: '100'"),
            ({"pos_thr": "0.5"}, TypeError, "pos_thr must be a number, got str: '0.5'"),
            ({"pos_thr": 1.0}, ValueError, r"pos_thr must be in \(0, 1\), got 1.0"),
            ({"bg_thr": None}, TypeError, "bg_thr must be a number, got NoneType: None"),
            ({"bg_thr": -0.1}, ValueError, "bg_thr must be a number >= 0, got -0.1"),
            ({"bg_thr": 0.5}, ValueError, r"bg_thr must be in \[0, pos_thr = 0.5\), got 0.5"),
        ],
    )
    def test_options_of_another_type_are_a_type_error_naming_them(self, options, error, message):
        with pytest.raises(error, match=message):
            analyze_errors(HAND_GT, HAND_RESULTS, **options)

    def test_numpy_options_are_the_python_numbers_they_hold(self):
        for max_dets in (1, 2, 100):
            expected = error_breakdown(HAND_GT, HAND_RESULTS, max_dets=max_dets)
            got = error_breakdown(
                HAND_GT, HAND_RESULTS, pos_thr=np.float32(0.5), bg_thr=np.float64(0.1), max_dets=np.int64(max_dets)
            )
            assert got == expected


# ----------------------------------------------------------------------------------------- random cases
def random_case(seed: int, crowds: bool = True, distinct_scores: bool = False, num_images: int = 6):
    """Boxes around the ground truth (kept, shifted, resized, relabelled) and background boxes; with
    ``distinct_scores=False`` coordinates are whole pixels and scores tenths, so IoUs and scores tie."""
    rng = random.Random(seed)
    annotations, results = [], []
    for image_id in range(1, num_images + 1):
        for _ in range(rng.randint(0, 5)):
            x, y, w, h = rng.randint(0, 150), rng.randint(0, 150), rng.randint(5, 50), rng.randint(5, 50)
            crowd = crowds and rng.random() < 0.1
            annotations.append((image_id, rng.choice(CATEGORIES), [x, y, w, h], crowd))
            for _ in range(rng.randint(0, 3)):
                dx, dy = rng.randint(-8, 8), rng.randint(-8, 8)
                category = rng.choice(CATEGORIES) if rng.random() < 0.2 else annotations[-1][1]
                score = rng.random() if distinct_scores else round(rng.random(), 1)
                results.append(det(category, [x + dx, y + dy, max(1, w + dx), max(1, h + dy)], score, image_id))
        for _ in range(rng.randint(0, 4)):
            score = rng.random() if distinct_scores else round(rng.random(), 1)
            box = [rng.randint(0, 180), rng.randint(0, 180), rng.randint(2, 30), rng.randint(2, 30)]
            results.append(det(rng.choice(CATEGORIES), box, score, image_id))
    return make_gt(annotations, range(1, num_images + 1)), results


@pytest.mark.parametrize("seed", range(12))
def test_base_ap_is_pycocotools_on_random_cases(seed):
    gt, results = random_case(seed)
    if not gt.annotated_image_ids:
        pytest.skip("no annotation drawn")
    analysis = analyze_errors(gt, results)
    assert analysis.ap() == evaluate_coco(gt, results)["map50"]  # bit-identical
    assert analyze_errors(gt, results, pos_thr=0.75).ap() == evaluate_coco(gt, results)["map75"]
    # each fix alone never lowers AP, every fix together gives 1
    for error in ERROR_TYPES + SPECIAL_ERRORS:
        assert analysis.ap([error]) >= analysis.ap() - 1e-12
    assert analysis.ap(ERROR_TYPES) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_agrees_with_hotcoco_tide_errors(seed):
    """hotcoco follows TIDE too; with distinct scores (its tie order differs) and no crowd region (it
    counts crowds in the error tests, TIDE does not) every figure agrees, but false_negatives where a
    class has no true positive (hotcoco keeps it in the mean at AP 0, we leave it out as COCOeval does)."""
    hotcoco = pytest.importorskip("hotcoco")
    import contextlib
    import io

    gt, results = random_case(seed, crowds=False, distinct_scores=True, num_images=10)
    ids = gt.annotated_image_ids
    results = [r for r in results if r["image_id"] in set(ids)]
    ours = analyze_errors(gt, results)
    summary = ours.summary()
    coco_gt = hotcoco.COCO(gt.dataset)
    evaluator = hotcoco.COCOeval(coco_gt, coco_gt.load_res(results), "bbox")
    evaluator.params.img_ids = ids
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator.evaluate()
        evaluator.accumulate()
    theirs = evaluator.tide_errors()
    names = {"cls": "Cls", "loc": "Loc", "both": "Both", "dupe": "Dupe", "bkg": "Bkg", "missed": "Miss",
             "false_positives": "FP", "false_negatives": "FN"}
    every_class_found = set(ours.gt_category.tolist()) <= set(ours.det_category[ours.det_label == 1].tolist())
    assert summary["ap"] == pytest.approx(theirs["ap_base"], abs=1e-12)
    for error, their_name in names.items():
        if error == "false_negatives" and not every_class_found:
            continue
        mine = {**summary["dap"], **summary["dap_special"]}[error]
        assert mine == pytest.approx(theirs["delta_ap"][their_name], abs=1e-9), error
        if their_name in theirs["counts"]:
            assert summary["counts"][error] == theirs["counts"][their_name], error


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("backend", ["pycocotools", "faster"])
def test_curves_are_the_metrics_of_the_same_run(seed, backend):
    gt, results = random_case(seed)
    if not gt.annotated_image_ids:
        pytest.skip("no annotation drawn")
    curves = coco_curves(gt, results, backend=backend)
    metrics = evaluate_coco(gt, results, backend=backend)
    assert curves["metrics"] == metrics
    assert np.mean(curves["precision"]["0.5"]) == pytest.approx(metrics["map50"], abs=1e-12)
    assert np.mean(curves["precision"]["0.75"]) == pytest.approx(metrics["map75"], abs=1e-12)
    per_class = [ap for ap in curves["class_ap"].values() if ap is not None]
    assert np.mean(per_class) == pytest.approx(metrics["map"], abs=1e-12)
    assert len(curves["recall"]) == 101 and curves["recall"][0] == 0.0 and curves["recall"][-1] == 1.0
    # each class's AP is the mAP of that class alone (the other classes' boxes and annotations removed)
    dataset = gt.coco.dataset
    for category in CATEGORIES:
        alone = CocoGroundTruth({**dataset, "annotations": [a for a in dataset["annotations"]
                                                             if a["category_id"] == category]})
        kept = [r for r in results if r["category_id"] == category]
        has_gt = any(not a["iscrowd"] for a in alone.coco.dataset["annotations"])
        if not has_gt:
            assert curves["class_ap"][category] is None and curves["class_ap50"][category] is None
            continue
        figures = evaluate_coco(alone, kept, image_ids=gt.annotated_image_ids, backend=backend)  # the images scored
        assert curves["class_ap"][category] == pytest.approx(figures["map"], abs=1e-12), category
        assert curves["class_ap50"][category] == pytest.approx(figures["map50"], abs=1e-12), category


# ------------------------------------------------------------------------- bg_thr = 0: no loc without a box
def test_at_bg_thr_0_a_box_without_its_class_in_the_image_is_no_loc_error():
    """A dog far from the only box (a cat) touches nothing: background, not a poor box of the cat; a dog
    over half the cat is a wrong class and poor box (both). At IoU 0 with a cat, a cat is loc."""
    gt = make_gt([(1, 1, [0, 0, 20, 20], 0)])
    results = [det(2, [70, 70, 20, 20], 0.9), det(2, [0, 0, 20, 8], 0.85), det(1, [0, 0, 20, 20], 0.8),
               det(1, [100, 100, 10, 10], 0.7)]
    for bg_thr in (0.0, 0.1):
        analysis = analyze_errors(gt, results, bg_thr=bg_thr)
        types = {score: ERROR_TYPES[e] if e >= 0 else None
                 for score, e in zip(analysis.det_score.tolist(), analysis.det_error.tolist(), strict=True)}
        # the far cat: IoU 0 with a cat, loc only when bg_thr admits IoU 0
        assert types == {0.9: "bkg", 0.85: "both", 0.8: None, 0.7: "loc" if bg_thr == 0 else "bkg"}, bg_thr
        loc = analysis.det_error == ERROR_TYPES.index("loc")
        assert (analysis.gt_category[analysis.det_target[loc]] == analysis.det_category[loc]).all()


def reference_types(gt: CocoGroundTruth, results, bg_thr: float, pos_thr: float = 0.5) -> dict[float, str | None]:
    """Each detection's error type, keyed by its score (distinct), by the module docstring's rules written
    out one detection and one box at a time; pycocotools says which detections are false positives and
    which boxes true positives took."""
    import contextlib
    import copy
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = copy.deepcopy(gt.dataset)
        coco.createIndex()
        evaluator = COCOeval(coco, coco.loadRes(copy.deepcopy(results)), "bbox")
        evaluator.params.imgIds = gt.annotated_image_ids
        evaluator.params.iouThrs = np.array([pos_thr])
        evaluator.evaluate()
    label, taken = {}, set()
    for e in evaluator.evalImgs:
        if e is None or e["aRng"] != [0, 1e10]:
            continue
        for dt_id, match, ignored in zip(e["dtIds"], e["dtMatches"][0], e["dtIgnore"][0], strict=True):
            label[dt_id] = "ignored" if ignored else "tp" if match > 0 else "fp"
            if match > 0 and not ignored:
                taken.add(int(match))

    def iou(a, b):
        w = min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0])
        h = min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1])
        inter = max(w, 0) * max(h, 0)
        return inter / (a[2] * a[3] + b[2] * b[3] - inter)

    types = {}
    for dt_id, r in enumerate(results, start=1):
        if label.get(dt_id, "none") != "fp":
            types[r["score"]] = None
            continue
        boxes = [a for a in gt.dataset["annotations"] if a["image_id"] == r["image_id"] and not a["iscrowd"]]
        same = [iou(r["bbox"], a["bbox"]) for a in boxes if a["category_id"] == r["category_id"]]
        other = [iou(r["bbox"], a["bbox"]) for a in boxes if a["category_id"] != r["category_id"]]
        taken_same = [iou(r["bbox"], a["bbox"]) for a in boxes
                      if a["category_id"] == r["category_id"] and a["id"] in taken]
        if same and bg_thr <= max(same) <= pos_thr:
            types[r["score"]] = "loc"
        elif other and max(other) >= pos_thr:
            types[r["score"]] = "cls"
        elif taken_same and max(taken_same) >= pos_thr:
            types[r["score"]] = "dupe"
        elif max(same + other, default=0.0) <= bg_thr:
            types[r["score"]] = "bkg"
        else:
            types[r["score"]] = "both"
    return types


@pytest.mark.parametrize("bg_thr", [0.0, 0.1])
@pytest.mark.parametrize("seed", range(10))
def test_error_types_are_the_rules_written_out(seed, bg_thr):
    gt, results = random_case(seed, crowds=False, distinct_scores=True, num_images=8)
    ids = set(gt.annotated_image_ids)
    results = [r for r in results if r["image_id"] in ids]
    if not results:
        pytest.skip("no detection drawn")
    analysis = analyze_errors(gt, results, bg_thr=bg_thr)
    ours = {score: ERROR_TYPES[e] if e >= 0 else None
            for score, e in zip(analysis.det_score.tolist(), analysis.det_error.tolist(), strict=True)}
    assert ours == reference_types(gt, results, bg_thr)
