"""detection_calibration against a slow reference written from the definition and against pycocotools'
COCOeval labels; plot_reliability's PNG."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest

from detens.calibration_metrics import detection_calibration
from detens.coco import CocoGroundTruth, load_coco_gt
from detens.report import plot_reliability

REPO = Path(__file__).resolve().parents[1]
ANNOTATIONS = REPO.parent / "shared" / "data" / "coco_val2017_206" / "instances_val2017.json"
CATEGORIES = (1, 2, 3)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------------------------- builders
def make_gt(annotations, image_ids=(1,), categories=CATEGORIES) -> CocoGroundTruth:
    """A ground truth from ``(image_id, category_id, [x, y, w, h], iscrowd)`` tuples."""
    return CocoGroundTruth(
        {
            "images": [{"id": i, "width": 200, "height": 200, "file_name": f"{i}.jpg"} for i in image_ids],
            "annotations": [
                {
                    "id": k + 1,
                    "image_id": image_id,
                    "category_id": category,
                    "bbox": list(bbox),
                    "iscrowd": int(crowd),
                    "area": bbox[2] * bbox[3],
                }
                for k, (image_id, category, bbox, crowd) in enumerate(annotations)
            ],
            "categories": [{"id": c, "name": f"class{c}"} for c in categories],
        }
    )


def result(bbox, score, image_id=1, category_id=1):
    return {"image_id": image_id, "category_id": category_id, "bbox": list(bbox), "score": score}


def random_case(seed: int, grid: bool = False, num_images: int = 5):
    """Ground truth (with crowds and one image without annotations) and detections around it.

    ``grid=True`` snaps every coordinate to whole pixels and scores to tenths, so that IoUs land exactly
    on thresholds and on each other and scores tie: the cases where only COCOeval's own rules decide.
    """
    rng = random.Random(seed)

    def coord(value):
        return float(round(value)) if grid else value

    def box(max_size=60.0):
        w, h = coord(rng.uniform(4, max_size)), coord(rng.uniform(4, max_size))
        return [coord(rng.uniform(0, 140)), coord(rng.uniform(0, 140)), w, h]

    annotations = []
    for image_id in range(1, num_images):  # the last image has no annotation
        for _ in range(rng.randint(0, 7)):
            crowd = rng.random() < 0.15
            annotations.append((image_id, rng.choice(CATEGORIES), box(120.0 if crowd else 60.0), crowd))
    results = []
    for image_id, category, (x, y, w, h), _ in annotations:
        for _ in range(rng.choice((0, 1, 1, 1, 2, 3))):  # missed, found, found twice ...
            jitter = [coord(v + rng.gauss(0, 0.15) * s) for v, s in ((x, w), (y, h), (w, w), (h, h))]
            jitter[2], jitter[3] = max(jitter[2], 1.0), max(jitter[3], 1.0)
            label = category if rng.random() < 0.85 else rng.choice(CATEGORIES)
            results.append(result(jitter, 0.0, image_id, label))
    for _ in range(rng.randint(0, 12)):  # background
        results.append(result(box(), 0.0, rng.randint(1, num_images), rng.choice(CATEGORIES)))
    for r in results:
        if grid:
            r["score"] = rng.randint(0, 10) / 10
        else:
            r["score"] = rng.choice((rng.random(), rng.random(), rng.random(), 0.0, 0.5, 1.0))
    rng.shuffle(results)
    return make_gt(annotations, image_ids=range(1, num_images + 1)), results


# ------------------------------------------------------------------------------------------- reference
def reference_iou(a, b, crowd=False):
    """IoU of two xywh boxes; a crowd ``b`` divides by ``a``'s area."""
    ax1, ay1, ax2, ay2 = a[0], a[1], a[0] + a[2], a[1] + a[3]
    bx1, by1, bx2, by2 = b[0], b[1], b[0] + b[2], b[1] + b[3]
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    if inter == 0:
        return 0.0
    area_a = a[2] * a[3]
    return inter / area_a if crowd else inter / (area_a + b[2] * b[3] - inter)


def reference_labels(gt, results, image_ids, iou_thr, max_dets):
    """``[(score, is_tp)]`` of the detections in the statistics, and the number ignored."""
    labelled, ignored = [], 0
    for image_id in image_ids:
        anns = gt.annotations(image_id)
        mine = [r for r in results if r["image_id"] == image_id]
        for category in sorted({r["category_id"] for r in mine}):
            dets = sorted((r for r in mine if r["category_id"] == category), key=lambda r: -r["score"])
            regular = [a["bbox"] for a in anns if a["category_id"] == category and not a["iscrowd"]]
            crowds = [a["bbox"] for a in anns if a["category_id"] == category and a["iscrowd"]]
            used = set()
            for det in dets[:max_dets]:
                best, best_iou = None, -1.0
                for j, g in enumerate(regular):
                    value = reference_iou(det["bbox"], g)
                    if j not in used and value >= iou_thr and value > best_iou:
                        best, best_iou = j, value
                if best is not None:
                    used.add(best)
                    labelled.append((det["score"], True))
                elif any(reference_iou(det["bbox"], c, crowd=True) >= iou_thr for c in crowds):
                    ignored += 1
                else:
                    labelled.append((det["score"], False))
    return labelled, ignored


def reference_ece(labelled, bins):
    ece, table = 0.0, []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [(s, tp) for s, tp in labelled if lo <= s < hi or (b == bins - 1 and s == 1.0)]
        if members:
            mean_score = sum(s for s, _ in members) / len(members)
            tp_rate = sum(tp for _, tp in members) / len(members)
            ece += len(members) / len(labelled) * abs(mean_score - tp_rate)
            table.append((len(members), mean_score, tp_rate))
        else:
            table.append((0, None, None))
    return ece, table


def assert_matches(out, labelled, ignored, bins):
    ece, table = reference_ece(labelled, bins)
    assert out["count"] == len(labelled)
    assert out["tp"] == sum(tp for _, tp in labelled)
    assert out["ignored"] == ignored
    assert out["ece"] == pytest.approx(ece, abs=1e-12)
    assert len(out["bins"]) == bins
    for got, (count, mean_score, tp_rate) in zip(out["bins"], table, strict=True):
        assert got["count"] == count
        if count:
            assert got["mean_score"] == pytest.approx(mean_score, abs=1e-12)
            assert got["tp_rate"] == pytest.approx(tp_rate, abs=1e-12)
        else:
            assert got["mean_score"] is None and got["tp_rate"] is None


# ------------------------------------------------------------------------------------------- pycocotools
def cocoeval_labels(gt, results, image_ids, iou_index):
    """``[(score, is_tp)]`` and the number ignored, read from COCOeval's evalImgs (area "all", last maxDets)."""
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt = gt.coco.loadRes(copy.deepcopy(results))
        evaluator = COCOeval(gt.coco, coco_dt, iouType="bbox")
        evaluator.params.imgIds = list(image_ids)
        evaluator.evaluate()
    params = evaluator.params
    labelled, ignored = [], 0
    for entry in evaluator.evalImgs:
        if entry is None or entry["aRng"] != params.areaRng[0] or entry["maxDet"] != params.maxDets[-1]:
            continue
        matched = entry["dtMatches"][iou_index] > 0
        skip = entry["dtIgnore"][iou_index].astype(bool)
        ignored += int(skip.sum())
        labelled += [(s, bool(m)) for s, m, i in zip(entry["dtScores"], matched, skip, strict=True) if not i]
    return labelled, ignored, float(params.iouThrs[iou_index])


# ------------------------------------------------------------------------------------------------ tests
class TestAgainstReference:
    @pytest.mark.parametrize("seed", range(60))
    def test_random_cases(self, seed):
        gt, results = random_case(seed)
        bins = (1, 7, 10, 15)[seed % 4]
        max_dets = (100, 2)[seed % 2]
        for iou_thr in (0.3, 0.5, 0.75):
            out = detection_calibration(gt, results, bins=bins, iou_thr=iou_thr, max_dets=max_dets)
            labelled, ignored = reference_labels(gt, results, gt.annotated_image_ids, iou_thr, max_dets)
            assert_matches(out, labelled, ignored, bins)

    @pytest.mark.parametrize("seed", range(10))
    def test_explicit_image_ids_include_negative_images(self, seed):
        gt, results = random_case(seed)
        image_ids = [1, 3, 5]  # 5 has no annotation: what is detected there is a false positive
        out = detection_calibration(gt, results, image_ids=image_ids)
        labelled, ignored = reference_labels(gt, results, image_ids, 0.5, 100)
        assert_matches(out, labelled, ignored, 10)


class TestAgainstCocoEval:
    @pytest.mark.parametrize("grid", [False, True], ids=["continuous", "pixel-grid"])
    @pytest.mark.parametrize("seed", range(15))
    def test_labels_are_cocoevals(self, seed, grid):
        gt, results = random_case(seed, grid=grid)
        if not results:
            pytest.skip("pycocotools' loadRes cannot take an empty list")
        image_ids = gt.annotated_image_ids
        for iou_index in (0, 5):  # IoU 0.5 and COCOeval's own ~0.75
            labelled, ignored, iou_thr = cocoeval_labels(gt, results, image_ids, iou_index)
            out = detection_calibration(gt, results, iou_thr=iou_thr, bins=10)
            assert_matches(out, labelled, ignored, 10)

    def test_top_100_per_image_and_category(self):
        rng = random.Random(7)
        gt = make_gt([(1, 1, [50, 50, 40, 40], False), (1, 2, [20, 20, 60, 60], False)])
        results = [
            result([50 + rng.uniform(-8, 8), 50 + rng.uniform(-8, 8), 40, 40], rng.random(), 1, category)
            for category in (1, 2)
            for _ in range(150)
        ]
        labelled, ignored, iou_thr = cocoeval_labels(gt, results, [1], 0)
        out = detection_calibration(gt, results, iou_thr=iou_thr)
        assert out["count"] == 200  # 100 of each category, not 100 of the image
        assert_matches(out, labelled, ignored, 10)

    def test_equal_iou_takes_the_later_box(self):
        gt = make_gt([(1, 1, [0, 0, 10, 10], False), (1, 1, [2, 0, 10, 10], False)])
        results = [
            result([1, 0, 10, 10], 0.9),  # IoU 90 / 110 with both boxes: pycocotools takes the later one
            result([-3, 0, 10, 10], 0.8),  # IoU 0.54 with the first box, 0.33 with the second
        ]
        labelled, ignored, iou_thr = cocoeval_labels(gt, results, [1], 0)
        out = detection_calibration(gt, results, iou_thr=iou_thr)
        assert out["tp"] == 2
        assert_matches(out, labelled, ignored, 10)

    def test_real_annotations_with_crowds(self):
        assert ANNOTATIONS.is_file(), f"the shared COCO data must sit beside the repository: {ANNOTATIONS}"
        gt = load_coco_gt(ANNOTATIONS)
        rng = random.Random(0)
        results = []
        for image_id in gt.image_ids:
            for ann in gt.annotations(image_id):
                x, y, w, h = ann["bbox"]
                for _ in range(rng.choice((0, 1, 1, 2))):
                    box = [x + rng.gauss(0, 0.2) * w, y + rng.gauss(0, 0.2) * h, w, h]
                    results.append(result(box, rng.random(), image_id, ann["category_id"]))
        assert sum(a["iscrowd"] for a in gt.dataset["annotations"]) > 0
        labelled, ignored, iou_thr = cocoeval_labels(gt, results, gt.annotated_image_ids, 0)
        out = detection_calibration(gt, results, iou_thr=iou_thr)
        assert ignored > 0
        assert_matches(out, labelled, ignored, 10)


class TestKnownValues:
    GT = [(1, 1, [10, 10, 30, 30], False), (1, 1, [100, 100, 40, 20], False), (1, 2, [60, 10, 20, 50], False)]

    def test_all_true_positives_at_score_one(self):
        gt = make_gt(self.GT)
        results = [result(bbox, 1.0, 1, category) for _, category, bbox, _ in self.GT]
        out = detection_calibration(gt, results)
        assert out["ece"] == 0.0
        assert (out["count"], out["tp"], out["ignored"]) == (3, 3, 0)
        assert out["bins"][-1] == {"lo": 0.9, "hi": 1.0, "count": 3, "mean_score": 1.0, "tp_rate": 1.0}
        assert all(b["count"] == 0 for b in out["bins"][:-1])

    def test_all_false_positives_at_095(self):
        gt = make_gt(self.GT)
        results = [result([150, 150, 10, 10], 0.95), result([0, 150, 10, 10], 0.95, category_id=3)]
        out = detection_calibration(gt, results)
        assert out["ece"] == pytest.approx(0.95)
        assert (out["count"], out["tp"]) == (2, 0)

    def test_two_bins(self):
        gt = make_gt(self.GT)
        results = [
            result([10, 10, 30, 30], 0.25),  # TP: |0.25 - 1| = 0.75
            result([100, 100, 40, 20], 0.75),  # TP and FP: |0.75 - 0.5| = 0.25
            result([150, 0, 10, 10], 0.75),
            result([60, 10, 20, 50], 0.75, category_id=1),  # the wrong category: FP
        ]
        out = detection_calibration(gt, results, bins=4)
        # bins [0, .25) [.25, .5) [.5, .75) [.75, 1]: 0.25 and 0.75 open their bins
        assert [b["count"] for b in out["bins"]] == [0, 1, 0, 3]
        assert out["bins"][3]["tp_rate"] == pytest.approx(1 / 3)
        assert out["ece"] == pytest.approx(1 / 4 * 0.75 + 3 / 4 * abs(0.75 - 1 / 3))

    def test_duplicate_is_a_false_positive(self):
        gt = make_gt([(1, 1, [10, 10, 30, 30], False)])
        results = [result([10, 10, 30, 30], 0.9), result([11, 11, 30, 30], 0.8)]
        out = detection_calibration(gt, results)
        assert (out["count"], out["tp"]) == (2, 1)
        assert out["ece"] == pytest.approx(0.5 * 0.1 + 0.5 * 0.8)

    def test_higher_score_matches_first(self):
        gt = make_gt([(1, 1, [10, 10, 30, 30], False)])
        # the later, better-placed detection scores higher, so it takes the box
        results = [result([14, 14, 30, 30], 0.6), result([10, 10, 30, 30], 0.9)]
        out = detection_calibration(gt, results, bins=2)
        assert [(b["count"], b["tp_rate"]) for b in out["bins"]] == [(0, None), (2, 0.5)]

    @pytest.mark.parametrize(("iou_thr", "tp"), [(0.5, 1), (0.5000001, 0)])
    def test_iou_exactly_at_the_threshold_matches(self, iou_thr, tp):
        gt = make_gt([(1, 1, [0, 0, 10, 10], False)])
        results = [result([0, 0, 10, 20], 0.5)]  # intersection 100, union 200
        assert detection_calibration(gt, results, iou_thr=iou_thr)["tp"] == tp

    def test_scores_on_bin_edges(self):
        gt = make_gt(self.GT)
        results = [result([150, 150, 10, 10], s) for s in (0.0, 0.3, 0.7, 1.0)]
        counts = [b["count"] for b in detection_calibration(gt, results)["bins"]]
        assert counts == [1, 0, 0, 1, 0, 0, 0, 1, 0, 1]

    def test_max_dets_is_per_category(self):
        gt = make_gt(self.GT)
        results = [result([150, 150, 10, 10], s, 1, c) for c in (1, 2) for s in (0.1, 0.5, 0.9)]
        out = detection_calibration(gt, results, max_dets=2)
        assert out["count"] == 4
        assert [b["count"] for b in out["bins"] if b["count"]] == [2, 2]  # the two 0.1s are dropped

    def test_max_dets_keeps_the_first_of_tied_scores(self):
        gt = make_gt([(1, 1, [10, 10, 30, 30], False)])
        results = [result([150, 150, 10, 10], 0.5), result([10, 10, 30, 30], 0.5)]
        out = detection_calibration(gt, results, max_dets=1)
        assert (out["count"], out["tp"]) == (1, 0)


class TestCrowds:
    def test_detection_on_a_crowd_is_ignored(self):
        gt = make_gt([(1, 1, [0, 0, 100, 100], True)])
        results = [result([10, 10, 20, 20], 0.9)]  # crowd IoU 400 / 400 = 1; plain IoU only 0.04
        out = detection_calibration(gt, results)
        assert (out["ece"], out["count"], out["tp"], out["ignored"]) == (0.0, 0, 0, 1)

    def test_crowd_catches_duplicates_and_regular_boxes_come_first(self):
        gt = make_gt([(1, 1, [0, 0, 100, 100], True), (1, 1, [10, 10, 20, 20], False)])
        results = [
            result([10, 10, 20, 20], 0.9),  # TP: the regular box is preferred over the crowd
            result([11, 11, 20, 20], 0.8),  # would be a duplicate FP; inside the crowd: ignored
            result([50, 50, 20, 20], 0.7),  # inside the crowd: ignored
            result([150, 150, 20, 20], 0.6),  # outside everything: FP
        ]
        out = detection_calibration(gt, results)
        assert (out["count"], out["tp"], out["ignored"]) == (2, 1, 2)
        assert out["ece"] == pytest.approx(0.5 * 0.1 + 0.5 * 0.6)

    def test_crowd_of_another_category_does_not_ignore(self):
        gt = make_gt([(1, 2, [0, 0, 100, 100], True)])
        out = detection_calibration(gt, [result([10, 10, 20, 20], 0.9, category_id=1)])
        assert (out["count"], out["ignored"]) == (1, 0)

    def test_crowd_iou_is_over_the_detection_area(self):
        gt = make_gt([(1, 1, [0, 0, 10, 10], True)])
        # half of the detection lies inside the crowd: intersection over the detection's area is 0.5
        results = [result([5, 0, 10, 10], 0.9)]
        assert detection_calibration(gt, results, iou_thr=0.5)["ignored"] == 1
        assert detection_calibration(gt, results, iou_thr=0.51)["ignored"] == 0


class TestInputs:
    def test_empty_results(self):
        out = detection_calibration(make_gt(TestKnownValues.GT), [], bins=5)
        assert (out["ece"], out["count"], out["tp"], out["ignored"]) == (0.0, 0, 0, 0)
        assert [b["count"] for b in out["bins"]] == [0] * 5
        assert all(b["mean_score"] is None and b["tp_rate"] is None for b in out["bins"])
        assert [(b["lo"], b["hi"]) for b in out["bins"]] == [(k / 5, (k + 1) / 5) for k in range(5)]

    def test_results_elsewhere_are_dropped(self, caplog):
        gt = make_gt(TestKnownValues.GT, image_ids=(1, 2))
        results = [result([0, 0, 5, 5], 0.5, image_id=2), result([0, 0, 5, 5], 0.5, image_id=99)]
        with caplog.at_level(logging.WARNING, logger="detens.calibration_metrics"):
            out = detection_calibration(gt, results)  # image 2 has no annotation: not evaluated
        assert out["count"] == 0
        assert "dropped 1 results on images absent" in caplog.text
        assert detection_calibration(gt, results, image_ids=[2])["count"] == 1

    def test_inputs_untouched_and_results_file(self, tmp_path):
        gt, results = random_case(3)
        before_gt, before_results = copy.deepcopy(gt.dataset), copy.deepcopy(results)
        out = detection_calibration(gt, results)
        assert gt.dataset == before_gt and results == before_results
        path = tmp_path / "results.json"
        path.write_text(json.dumps(results))
        assert detection_calibration(gt, path) == out
        assert detection_calibration(gt.dataset, results) == out  # a plain annotation dict works too

    @pytest.mark.parametrize(
        ("kwargs", "error", "message"),
        [
            ({"bins": 0}, ValueError, "bins must be an integer >= 1, got 0"),
            ({"bins": 2.5}, TypeError, "bins must be an integer"),
            ({"bins": True}, TypeError, "bins must be an integer"),
            ({"max_dets": 0}, ValueError, "max_dets must be an integer >= 1"),
            ({"iou_thr": 0.0}, ValueError, r"iou_thr must be in \(0, 1\), got 0.0"),
            ({"iou_thr": 1.0}, ValueError, r"iou_thr must be in \(0, 1\), got 1.0"),
            ({"iou_thr": -0.5}, ValueError, "iou_thr must be in"),
            ({"iou_thr": "0.5"}, TypeError, "iou_thr must be a number"),
            ({"image_ids": [1, 42]}, ValueError, r"image_ids not in the ground truth: \[42\]"),
            ({"image_ids": []}, ValueError, "image_ids is empty"),
            ({"results": [result([0, 0, 5, 5], 1.5)]}, ValueError, r"results\[0\].score must be in \[0, 1\].*got 1.5"),
            ({"results": [result([0, 0, 5, 5], 0.5, category_id=7)]}, ValueError, r"category ids \[7\]"),
            ({"results": [result([0, 0, -5, 5], 0.5)]}, ValueError, r"results\[0\].bbox"),
            ({"results": {"annotations": []}}, TypeError, "COCO annotation file"),
            ({"gt": 42}, TypeError, "ground truth must be"),
        ],
    )
    def test_bad_input_is_named(self, kwargs, error, message):
        call = {"gt": make_gt(TestKnownValues.GT), "results": [result([0, 0, 5, 5], 0.5)], **kwargs}
        with pytest.raises(error, match=message):
            detection_calibration(**call)


class TestPlotReliability:
    def test_writes_a_png(self, tmp_path):
        from PIL import Image

        gt, results = random_case(1)
        curves = {
            "model": detection_calibration(gt, results),
            "overconfident": detection_calibration(gt, [dict(r, score=1.0) for r in results]),
            "nothing": detection_calibration(gt, []),
        }
        path = tmp_path / "plots" / "reliability.png"
        plot_reliability(curves, path, title="calibration")
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        assert len(data) > 10_000
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            assert image.format == "PNG" and min(image.size) >= 300
            assert len(np.unique(np.asarray(image.convert("L")))) > 2  # something was drawn
        assert [p.name for p in path.parent.iterdir()] == ["reliability.png"]  # no temporary file left

    def test_a_method_without_detections_is_labelled_so_and_many_methods_get_their_own_colours(self, tmp_path,
                                                                                               monkeypatch):
        """An ECE not measured (null in a record) ended the page in a float() TypeError; the legend said
        "ECE 0.000" for a member with no detection, which the table shows as "-"; the eleventh method took the
        first one's colour."""
        import matplotlib.axes

        drawn = []
        real_plot = matplotlib.axes.Axes.plot
        monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                            lambda ax, *args, **kwargs: drawn.append(kwargs) or real_plot(ax, *args, **kwargs))
        gt, results = random_case(1)
        measured = detection_calibration(gt, results)
        curves = {"single:none": {"ece": None, "bins": []}, "single:empty": detection_calibration(gt, []),
                  **{f"fused{i}": measured for i in range(12)}}
        plot_reliability(curves, tmp_path / "r.png")
        labels = {kwargs["label"]: kwargs.get("color") for kwargs in drawn[1:]}  # after the diagonal
        assert list(labels)[:3] == ["single:none (no detection)", "single:empty (no detection)",
                                    f"fused0 (ECE {measured['ece']:.3f})"]
        fused_colours = [labels[f"fused{i} (ECE {measured['ece']:.3f})"] for i in range(12)]
        assert len(set(fused_colours)) == 12

    def test_no_curve_draws_the_diagonal(self, tmp_path):
        path = tmp_path / "empty.png"
        plot_reliability({}, path)
        assert path.read_bytes().startswith(PNG_SIGNATURE)

    @pytest.mark.parametrize(
        ("curves", "error", "message"),
        [
            ({"m": {"bins": []}}, ValueError, r"curves\['m'\] lacks \['ece'\]"),
            ({"m": [1, 2]}, TypeError, r"curves\['m'\] must be a detection_calibration dict"),
            ({"m": {"ece": 0.1, "bins": [{"count": 1}]}}, ValueError, r"\['bins'\]\[0\] lacks"),
            ([1, 2], TypeError, "curves must be a dict"),
        ],
    )
    def test_bad_curves_are_named_and_nothing_is_written(self, tmp_path, curves, error, message):
        path = tmp_path / "bad.png"
        with pytest.raises(error, match=message):
            plot_reliability(curves, path)
        assert not path.exists()
