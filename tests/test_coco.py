"""COCO I/O and evaluation on the real 206-image val2017 annotation file in ../shared/data."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from detens.coco import (
    METRIC_KEYS,
    coco_to_detections,
    detections_to_array,
    detections_to_coco,
    evaluate_coco,
    group_results_by_image,
    load_coco_gt,
    load_coco_results,
    save_coco_results,
    with_annotation_ids,
)
from detens.detections import Detections
from detens.labels import COCO_CATEGORY_IDS

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "coco_val2017_206"
ANNOTATIONS = DATA / "instances_val2017.json"


@pytest.fixture(scope="module")
def gt():
    assert ANNOTATIONS.is_file(), f"the shared COCO data must sit beside the repository: {ANNOTATIONS}"
    return load_coco_gt(ANNOTATIONS, images_dir=DATA / "images")


@pytest.fixture(scope="module")
def raw():
    return json.loads(ANNOTATIONS.read_text())


def gt_as_predictions(gt, image_ids=None, include_crowd=False, shift=0.0):
    """The ground truth written as COCO results with score 1, boxes shifted right by ``shift`` × width."""
    results = []
    for image_id in gt.image_ids if image_ids is None else image_ids:
        det = gt.detections(image_id, include_crowd=include_crowd)
        boxes = det.boxes.clone()
        width = boxes[:, 2] - boxes[:, 0]
        boxes[:, 0] += shift * width
        boxes[:, 2] += shift * width
        results += detections_to_coco(Detections(boxes, det.scores, det.labels, det.image_size), image_id)
    return results


def random_detections(seed: int, num_boxes: int, image_size=(480, 640)) -> Detections:
    g = torch.Generator().manual_seed(seed)
    height, width = image_size
    xy = torch.rand(num_boxes, 2, generator=g) * torch.tensor([width, height])
    wh = torch.rand(num_boxes, 2, generator=g) * 200
    boxes = torch.cat([xy, xy + wh], dim=1)
    scores = torch.rand(num_boxes, generator=g)
    labels = torch.tensor(COCO_CATEGORY_IDS)[torch.randint(0, 80, (num_boxes,), generator=g)]
    return Detections(boxes, scores, labels, image_size, source="random")


class TestGroundTruth:
    def test_matches_the_annotation_file(self, gt, raw):
        assert len(gt) == len(raw["images"]) == 206
        assert gt.image_ids == sorted(im["id"] for im in raw["images"])
        assert gt.category_ids == sorted(COCO_CATEGORY_IDS)
        image = raw["images"][0]
        assert gt.image_size(image["id"]) == (image["height"], image["width"])
        assert gt.file_name(image["id"]) == image["file_name"]
        assert gt.image_path(image["id"]).is_file()
        assert sum(int(gt.targets(i)[2].sum()) for i in gt.image_ids) == sum(
            a["iscrowd"] for a in raw["annotations"]
        )

    def test_targets_are_xyxy_pixels(self, gt, raw):
        ann = raw["annotations"][0]
        anns = [a for a in raw["annotations"] if a["image_id"] == ann["image_id"]]
        boxes, labels, iscrowd = gt.targets(ann["image_id"])
        assert boxes.shape == (len(anns), 4) and boxes.dtype == torch.float32
        assert labels.dtype == torch.int64 and iscrowd.dtype == torch.bool
        x, y, w, h = ann["bbox"]
        i = anns.index(ann)
        torch.testing.assert_close(boxes[i], torch.tensor([x, y, x + w, y + h], dtype=torch.float32))
        assert int(labels[i]) == ann["category_id"]

    def test_image_without_annotations_gives_empty_targets(self, gt):
        empty = [i for i in gt.image_ids if i not in set(gt.annotated_image_ids)]
        assert empty, "the shared file has images without annotations"
        assert gt.unannotated_image_ids == [i for i in gt.image_ids if not gt.annotations(i)] == empty
        boxes, labels, iscrowd = gt.targets(empty[0])
        assert boxes.shape == (0, 4) and labels.shape == (0,) and iscrowd.shape == (0,)
        assert len(gt.detections(empty[0])) == 0

    def test_unknown_image_id(self, gt):
        with pytest.raises(KeyError, match="not in the ground truth"):
            gt.image_size(-5)  # a lookup by key, as a dict's
        with pytest.raises(ValueError, match=r"^image ids not in the ground truth: \[-5\]$"):
            gt.subset([gt.image_ids[0], -5])  # an argument naming ids that are not there

    def test_accepts_dict_and_pycocotools(self, gt, raw):
        from pycocotools.coco import COCO

        assert load_coco_gt(raw).image_ids == gt.image_ids
        assert load_coco_gt(gt.coco).image_ids == gt.image_ids
        assert isinstance(gt.coco, COCO)

    def test_rejects_results_and_junk(self, tmp_path):
        path = tmp_path / "results.json"
        path.write_text("[]")
        with pytest.raises(ValueError, match="not a COCO annotation file"):
            load_coco_gt(path)
        with pytest.raises(ValueError, match="lacks"):
            load_coco_gt({"images": []})
        with pytest.raises(FileNotFoundError):
            load_coco_gt(tmp_path / "missing.json")


def small_gt() -> dict:
    """Two images, two categories, three annotations: a valid COCO annotation dict to break."""
    return {
        "images": [{"id": 1, "width": 100, "height": 80, "file_name": "a.jpg"},
                   {"id": 2, "width": 100, "height": 80, "file_name": "b.jpg"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "area": 400, "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 2, "bbox": [50, 10, 20, 30], "area": 600, "iscrowd": 0},
            {"id": 3, "image_id": 2, "category_id": 1, "bbox": [5, 5, 40, 40], "area": 1600, "iscrowd": 1},
        ],
        "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
    }


#: (where, key, value, error, message): ground truth that pycocotools accepts and silently mis-scores, or
#: that crashed later; each is refused when loaded, naming the entry and the field.
BAD_GROUND_TRUTH = [
    (("annotations", 1), "id", 1, ValueError, r"annotation ids \[1\] appear more than once"),
    (("images", 1), "id", 1, ValueError, r"image ids \[1\] appear more than once"),
    (("annotations", 0), "bbox", [10, 10, -20, 20], ValueError, r"annotations\[0\].bbox = \[10, 10, -20, 20\] has no area"),
    # never matched by pycocotools: a perfect prediction scores 0.5 mAP
    (("annotations", 0), "bbox", [10, 10, 0, 20], ValueError, r"annotations\[0\].bbox = \[10, 10, 0, 20\] has no area \(width and height must be > 0: it could never be matched\); remove it or give it a size"),
    (("annotations", 0), "bbox", [10, 10, float("nan"), 20], ValueError, r"annotations\[0\].bbox must be 4 finite"),
    (("annotations", 0), "bbox", "10 10 20 20", ValueError, r"annotations\[0\].bbox must be 4 finite"),
    (("annotations", 0), "bbox", [10, 10, 20], ValueError, r"annotations\[0\].bbox must be 4 finite"),
    (("annotations", 0), "bbox", [10, 10, 10**400, 20], ValueError, r"annotations\[0\].bbox must be 4 finite"),
    (("annotations", 0), "bbox", [10, 1e300, 20, 20], ValueError, r"annotations\[0\].bbox = .* has no area"),
    (("annotations", 0), "bbox", [10, 10, 1e-300, 20], ValueError, r"annotations\[0\].bbox = .* has no area"),
    (("annotations", 0), "bbox", [200, 10, 20, 20], ValueError, r"annotations\[0\].bbox = .* lies outside its 100x80 image"),
    # pycocotools takes id 0 for "not matched": a perfect prediction scored 0.5 mAP
    (("annotations", 0), "id", 0, ValueError, r"annotations\[0\].id must be an integer in \[1, 2\*\*53\], got 0"),
    (("annotations", 0), "id", 10**400, ValueError, r"annotations\[0\].id must be an integer in \[1, 2\*\*53\]"),
    (("images", 0), "id", -1, ValueError, r"images\[0\].id must be an integer in \[0, 2\*\*53\], got -1"),
    (("annotations", 0), "category_id", 7, ValueError, r"annotations\[0\] has category_id 7, which is not in 'categories'"),
    (("annotations", 0), "image_id", "1", ValueError, r"annotations\[0\].image_id must be an integer, got str: '1'$"),
    (("annotations", 0), "image_id", 7, ValueError, r"annotations\[0\] refers to image_id 7, which is not in 'images'"),
    # the id it spells is a category: saying it is not one pointed at the wrong mistake
    (("annotations", 0), "category_id", "1", ValueError, r"annotations\[0\].category_id must be an integer, got str: '1'$"),
    (("annotations", 0), "category_id", True, ValueError, r"annotations\[0\].category_id must be an integer, got bool: True$"),
    (("annotations", 0), "iscrowd", "no", ValueError, r"annotations\[0\].iscrowd must be 0 or 1, got 'no'"),
    (("annotations", 0), "area", -1, ValueError, r"annotations\[0\].area must be a finite number >= 0"),
    (("categories", 0), "id", None, ValueError, r"categories\[0\].id must be an integer"),
    (("categories", 1), "id", 1, ValueError, r"category ids \[1\] appear more than once"),
    (("images", 0), "width", 0, ValueError, r"images\[0\].width must be a positive integer, got 0"),
    (("images", 0), "height", 80.5, ValueError, r"images\[0\].height must be a positive integer"),
]


@pytest.mark.parametrize("where, key, value, error, message", BAD_GROUND_TRUTH)
def test_ground_truth_pycocotools_would_misscore_is_refused(tmp_path, where, key, value, error, message):
    dataset = small_gt()
    dataset[where[0]][where[1]][key] = value
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(dataset))
    for source in (path, dataset):
        with pytest.raises(error, match=message):
            load_coco_gt(source)


def test_annotations_without_ids_get_new_ones():
    # ids were the annotation's position + 1, which another annotation could already hold
    dataset = small_gt()
    del dataset["annotations"][0]["id"]
    dataset["annotations"][1]["id"] = 1
    results = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
               for a in dataset["annotations"] if not a["iscrowd"]]
    assert evaluate_coco(load_coco_gt(dataset), results)["map"] == pytest.approx(1.0)


def test_annotations_without_ids_are_numbered_after_the_given_ones():
    dataset = small_gt()
    del dataset["annotations"][0]["id"], dataset["annotations"][2]["id"]
    numbered = with_annotation_ids(dataset["annotations"])
    assert [a["id"] for a in numbered] == [3, 2, 4]
    assert "id" not in dataset["annotations"][0]  # copies: the caller's dicts stay as they were
    assert [a["id"] for a in with_annotation_ids([{"bbox": [0, 0, 1, 1]}] * 2)] == [1, 2]


def test_bench_replicates_annotations_without_ids():
    from detens.jobs.bench import replicate_coco

    dataset = small_gt()
    del dataset["annotations"][0]["id"]
    results = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
               for a in dataset["annotations"] if not a["iscrowd"]]
    big_gt, big_results = replicate_coco(dataset, results, 5)
    ids = [a["id"] for a in big_gt["annotations"]]
    assert len(ids) == 3 + 3 + 2 and len(set(ids)) == len(ids)  # the third copy holds image 1 only
    assert evaluate_coco(load_coco_gt(big_gt), big_results)["map"] == pytest.approx(1.0)


def test_bench_leaves_out_results_on_images_absent_from_the_ground_truth(tmp_path, caplog):
    from detens.jobs.bench import bench_coco, replicate_coco

    dataset = small_gt()
    results = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 0.5}
               for a in dataset["annotations"] if not a["iscrowd"]]
    # image 4 is no image of the ground truth; shifted by one copy (3) it would be the second copy's image 1
    stray = {"image_id": 4, "category_id": 1, "bbox": [70, 50, 10, 10], "score": 1.0}
    big_gt, big_results = replicate_coco(dataset, [*results, stray], 4)
    assert sorted(r["image_id"] for r in big_results) == [1, 1, 4, 4]  # image 1 of both copies, nothing else
    assert evaluate_coco(load_coco_gt(big_gt), big_results)["map"] == pytest.approx(1.0)
    (tmp_path / "gt.json").write_text(json.dumps(dataset))
    (tmp_path / "r.json").write_text(json.dumps([*results, stray]))
    with caplog.at_level("WARNING", logger="detens"):
        rows = bench_coco(str(tmp_path / "gt.json"), str(tmp_path / "r.json"), [4])
    assert "1 of 3 results are on images absent from" in caplog.text
    assert {row["map"] for row in rows} == {1.0} and {row["results"] for row in rows} == {4}


def test_a_category_without_id_is_refused():
    dataset = small_gt()
    del dataset["categories"][0]["id"]
    with pytest.raises(ValueError, match=r"categories\[0\].id must be an integer .* got None"):
        load_coco_gt(dataset)


def test_the_small_ground_truth_is_valid_and_scores_one():
    truth = load_coco_gt(small_gt())
    results = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
               for a in small_gt()["annotations"] if not a["iscrowd"]]
    assert evaluate_coco(truth, results)["map"] == pytest.approx(1.0)


@pytest.mark.parametrize("image_ids, error", [("139", TypeError), (139, TypeError), ([1.5], TypeError), ([True], TypeError)])
def test_image_ids_must_be_a_list_of_integers(gt, image_ids, error):
    # a string was iterated as the ids 1, 3 and 9
    with pytest.raises(error, match="image_ids"):
        evaluate_coco(gt, gt_as_predictions(gt, [139]), image_ids=image_ids)


class TestEvaluate:
    def test_ground_truth_as_predictions_scores_one(self, gt):
        metrics = evaluate_coco(ANNOTATIONS, gt_as_predictions(gt, include_crowd=True))
        assert list(metrics) == list(METRIC_KEYS)
        for key in ("map", "map50", "map75", "map_small", "map_medium", "map_large", "mar_100"):
            assert metrics[key] == pytest.approx(1.0), key

    def test_shifted_boxes_score_lower_as_predicted(self, gt):
        # Shifting every box by 10 % of its width gives IoU 0.9 / 1.1 = 0.818 with its own ground truth:
        # a hit at the 7 thresholds 0.50 ... 0.80, a miss at 0.85 ... 0.95, so AP@[.5:.95] ≈ 0.7.
        metrics = evaluate_coco(gt, gt_as_predictions(gt, shift=0.1))
        assert metrics["map50"] == pytest.approx(1.0, abs=0.01)
        assert metrics["map75"] == pytest.approx(1.0, abs=0.01)
        assert metrics["map"] == pytest.approx(0.7, abs=0.02)

    def test_image_ids_restrict_the_evaluation(self, gt):
        fold = gt.annotated_image_ids[:40]
        half, other = fold[:20], fold[20:]
        predictions = gt_as_predictions(gt, image_ids=half)
        assert evaluate_coco(gt, predictions, image_ids=half)["map"] == pytest.approx(1.0)
        assert evaluate_coco(gt, predictions, image_ids=other)["map"] == 0.0
        both = evaluate_coco(gt, predictions, image_ids=fold)["map"]
        assert 0.0 < both < 0.9
        with pytest.raises(ValueError, match="image_ids not in the ground truth"):
            evaluate_coco(gt, predictions, image_ids=[half[0], 123456789])

    def test_default_is_the_annotated_images(self, gt):
        negatives = sorted(set(gt.image_ids) - set(gt.annotated_image_ids))
        assert negatives, "the shared annotation file lists images without annotations"
        predictions = gt_as_predictions(gt) + [
            {"image_id": negatives[0], "category_id": gt.category_ids[0], "bbox": [1, 1, 5, 5], "score": 1.0}
        ]
        assert evaluate_coco(gt, predictions)["map"] == pytest.approx(1.0)
        assert evaluate_coco(gt, predictions, image_ids=gt.image_ids)["map"] < 1.0

    def test_faster_backend_agrees_with_pycocotools(self, gt):
        predictions = gt_as_predictions(gt, shift=0.07)[::2]
        reference = evaluate_coco(gt, predictions)
        faster = evaluate_coco(gt, predictions, backend="faster")
        assert faster == pytest.approx(reference, abs=1e-9)
        with pytest.raises(ValueError, match="backend"):
            evaluate_coco(gt, predictions, backend="fast")

    @pytest.mark.parametrize("seed", range(3))
    def test_hotcoco_backend_agrees_with_pycocotools(self, gt, seed):
        """Realistic results on the official annotations: each ground-truth box jittered, rescored and
        sometimes relabelled or dropped, plus random background boxes (ties in score included)."""
        pytest.importorskip("hotcoco", reason="the hotcoco backend needs hotcoco")
        g = torch.Generator().manual_seed(seed)
        predictions = []
        for image_id in gt.image_ids:
            det = gt.detections(image_id)
            wh = (det.boxes[:, 2:] - det.boxes[:, :2]).repeat(1, 2)
            boxes = det.boxes + 0.04 * wh * torch.randn(det.boxes.shape, generator=g)
            keep = torch.rand(len(det), generator=g) > 0.2
            labels = torch.where(torch.rand(len(det), generator=g) < 0.1, torch.tensor(1), det.labels)
            scores = (torch.rand(len(det), generator=g) * 10).round() / 10  # ties
            noise = random_detections(seed * 1000 + image_id % 997, 30, det.image_size)
            found = Detections(boxes[keep], scores[keep], labels[keep], det.image_size)
            predictions += detections_to_coco(Detections.concat([found, noise]).clip(), image_id)
        reference = evaluate_coco(gt, predictions)
        assert 0.05 < reference["map"] < 0.95  # neither trivial nor perfect
        assert evaluate_coco(gt, predictions, backend="hotcoco") == pytest.approx(reference, abs=1e-4)
        subset = gt.annotated_image_ids[::3]
        assert evaluate_coco(gt, predictions, image_ids=subset, backend="hotcoco") == pytest.approx(
            evaluate_coco(gt, predictions, image_ids=subset), abs=1e-4)
        assert evaluate_coco(gt, [], backend="hotcoco") == {key: 0.0 for key in METRIC_KEYS}

    def test_hotcoco_scores_unnamed_categories_quietly(self, capfd):
        """Category names play no part in scoring; hotcoco would print a line about each missing one."""
        pytest.importorskip("hotcoco", reason="the hotcoco backend needs hotcoco")
        dataset = {
            "images": [{"id": 1, "width": 100, "height": 100, "file_name": "a.jpg"}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [10, 10, 40, 30], "area": 1200,
                             "iscrowd": 0}],
            "categories": [{"id": 3}],
        }
        found = [{"image_id": 1, "category_id": 3, "bbox": [10, 10, 40, 30], "score": 0.9}]
        assert evaluate_coco(load_coco_gt(dataset), found, backend="hotcoco")["map"] == pytest.approx(1.0)
        assert "name" not in capfd.readouterr().err
        assert "name" not in dataset["categories"][0]  # the caller's dataset is left as it was

    @pytest.mark.parametrize("backend", ["pycocotools", "faster", "hotcoco"])
    def test_array_form_scores_like_the_dicts(self, gt, backend):
        if backend == "hotcoco":
            pytest.importorskip("hotcoco", reason="the hotcoco backend needs hotcoco")
        ids = gt.image_ids[:40]
        dets = {i: random_detections(i, 25, gt.image_size(i)) for i in ids}
        dets = {i: Detections.concat([d, gt.detections(i)]) for i, d in dets.items()}
        dicts = [r for i in ids for r in detections_to_coco(dets[i], i, decimals=None)]
        array = np.concatenate([detections_to_array(dets[i], i) for i in ids])
        assert array.shape == (len(dicts), 7)
        for row, r in zip(array.tolist(), dicts, strict=True):  # the rows are the dicts, slowly
            assert row[0] == r["image_id"] and row[6] == r["category_id"] and row[5] == r["score"]
            assert row[1:5] == pytest.approx(r["bbox"], abs=1e-9)
        subset = [i for i in ids if i in set(gt.annotated_image_ids)][:25]
        expected = evaluate_coco(gt, dicts, image_ids=subset, backend=backend)
        assert evaluate_coco(gt, array, image_ids=subset, backend=backend) == pytest.approx(expected, abs=1e-5)
        assert evaluate_coco(gt, array[:0], image_ids=subset, backend=backend) == {k: 0.0 for k in METRIC_KEYS}

    @pytest.mark.parametrize(
        "bad, message",
        [
            (np.zeros((3, 6)), r"shape \[K, 7\]"),
            (np.array([[1.5, 0, 0, 1, 1, 0.5, 1]]), "integer ids"),
            (np.array([[139, 0, 0, -1, 1, 0.5, 1]]), "w, h >= 0"),
            (np.array([[139, 0, 0, 1, 1, np.nan, 1]]), "finite"),
            (np.array([[139, 0, 0, 1, 1, 0.5, 12]]), r"category ids \[12\]"),
        ],
    )
    def test_bad_result_arrays_are_named(self, gt, bad, message):
        with pytest.raises(ValueError, match=message):
            evaluate_coco(gt, bad)

    def test_empty_predictions_give_zeros(self, gt):
        metrics = evaluate_coco(gt, [])
        assert metrics == {key: 0.0 for key in METRIC_KEYS}

    def test_unknown_category_is_named(self, gt):
        predictions = gt_as_predictions(gt, image_ids=gt.image_ids[:3])
        predictions[0] = {**predictions[0], "category_id": 12}  # 12 is a gap in COCO's ids
        predictions.append({**predictions[1], "category_id": 999})
        with pytest.raises(ValueError, match=r"category ids \[12, 999\]"):
            evaluate_coco(gt, predictions)

    def test_predictions_on_unknown_images_are_dropped(self, gt, caplog):
        image_id = gt.annotated_image_ids[0]
        predictions = gt_as_predictions(gt, image_ids=[image_id])
        stray = {**predictions[0], "image_id": 987654321}
        with caplog.at_level(logging.WARNING, logger="detens.coco"):
            metrics = evaluate_coco(gt, predictions + [stray], image_ids=[image_id])
        assert metrics["map"] == pytest.approx(1.0)
        assert "dropped 1 predictions" in caplog.text

    def test_results_file_and_inputs_untouched(self, gt, raw, tmp_path):
        image_ids = gt.annotated_image_ids[:20]
        predictions = gt_as_predictions(gt, image_ids=image_ids, shift=0.05)
        raw_copy, predictions_copy = copy.deepcopy(raw), copy.deepcopy(predictions)
        path = save_coco_results(predictions, tmp_path / "out" / "results.json")
        from_list = evaluate_coco(raw, predictions, image_ids=image_ids)
        from_file = evaluate_coco(raw, path, image_ids=image_ids)
        assert from_list == from_file
        assert raw == raw_copy and predictions == predictions_copy

    @pytest.mark.parametrize("backend", ["pycocotools", "faster", "hotcoco"])
    def test_a_checked_input_scores_like_evaluate_coco(self, gt, backend, caplog):
        """check_coco_input then evaluate_checked is evaluate_coco in two steps: the checks, filters and
        warnings all in the first, so one input is checked once for several evaluators."""
        from detens.coco import check_coco_input, evaluate_checked

        if backend == "hotcoco":
            pytest.importorskip("hotcoco", reason="the hotcoco backend needs hotcoco")
        ids = gt.image_ids[:30]
        dets = {i: Detections.concat([random_detections(i, 20, gt.image_size(i)), gt.detections(i)]) for i in ids}
        dicts = [r for i in ids for r in detections_to_coco(dets[i], i, decimals=None)]
        array = np.concatenate([detections_to_array(dets[i], i) for i in ids])
        subset = [i for i in ids if i in set(gt.annotated_image_ids)][:20]
        stray = {**dicts[0], "image_id": 987654321}
        cases = [(dicts + [stray], None, True), (dicts, subset, False), (array, subset, False), (array[:0], None, False)]
        for predictions, image_ids, warned in cases:
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="detens.coco"):
                checked = check_coco_input(gt, predictions, image_ids)
            assert ("dropped 1 predictions" in caplog.text) == warned
            assert checked.image_ids == (gt.annotated_image_ids if image_ids is None else sorted(image_ids))
            assert evaluate_checked(checked, backend) == evaluate_coco(gt, predictions, image_ids, backend)
        with pytest.raises(TypeError, match="checked must be what check_coco_input returns, got list"):
            evaluate_checked(dicts)
        with pytest.raises(ValueError, match="backend must be one of pycocotools, faster, hotcoco, got 'fast'"):
            evaluate_checked(checked, "fast")

    def test_the_array_form_is_checked_as_the_dicts_are_and_may_be_a_tensor(self):
        dataset = small_gt()
        row = [1, 10.0, 10.0, 20.0, 20.0, 0.9, 1]
        as_dict = [{"image_id": 1, "category_id": 1, "bbox": [10.0, 10.0, 20.0, 20.0], "score": 0.9}]
        assert evaluate_coco(dataset, torch.tensor([row], dtype=torch.float64)) == evaluate_coco(dataset, as_dict)
        for score in (5.0, -1.0):  # scored before, where the same dict is refused
            with pytest.raises(ValueError, match=rf"^predictions\[0\] is not a valid result row .* a score in \[0, 1\]\): "
                                                 rf"\[1\.0, 10\.0, 10\.0, 20\.0, 20\.0, {score}, 1\.0\]$"):
                evaluate_coco(dataset, np.array([row[:5] + [score, 1]]))
        with pytest.raises(TypeError, match=r"^predictions as an array must hold numbers, got dtype <U2$"):
            evaluate_coco(dataset, np.array([["1", "a", "10", "20", "20", ".9", "1"]]))

    def test_nothing_is_printed(self, gt, capsys):
        evaluate_coco(gt, gt_as_predictions(gt, image_ids=gt.image_ids[:5]), image_ids=gt.image_ids[:5])
        assert capsys.readouterr().out == ""


class TestConversions:
    def test_a_corner_beyond_float32_is_named_as_that(self):
        # x + w overflowed in float32 first: the message showed an inf that no result held
        result = {"image_id": 1, "category_id": 1, "bbox": [3e38, 0.0, 3e38, 1.0], "score": 0.5}
        with pytest.raises(ValueError, match=r"^Detections.boxes\[0, 2\] = 6e\+38 is beyond float32's range"):
            coco_to_detections([result], (80, 100))
        small = coco_to_detections([{**result, "bbox": [1.1, 2.2, 3.3, 4.4]}], (80, 100))
        assert small.boxes.dtype == torch.float32 and small.scores.dtype == torch.float32
        assert small.boxes.tolist() == torch.tensor([[1.1, 2.2, 1.1 + 3.3, 2.2 + 4.4]], dtype=torch.float64).float().tolist()

    @pytest.mark.parametrize("seed", range(5))
    def test_exact_round_trip_without_rounding(self, seed):
        det = random_detections(seed, num_boxes=50)
        results = detections_to_coco(det, image_id=7, decimals=None)
        back = coco_to_detections(results, det.image_size, source="random")
        assert torch.equal(back.boxes, det.boxes)
        assert torch.equal(back.scores, det.scores)
        assert torch.equal(back.labels, det.labels)
        assert back.image_size == det.image_size and back.source == "random"

    def test_round_trip_with_default_rounding(self):
        det = random_detections(11, num_boxes=100)
        results = detections_to_coco(det, image_id=7)
        assert all(r["image_id"] == 7 and isinstance(r["category_id"], int) for r in results)
        back = coco_to_detections(results, det.image_size)
        torch.testing.assert_close(back.boxes, det.boxes, atol=1e-3, rtol=0)
        torch.testing.assert_close(back.scores, det.scores, atol=1e-5, rtol=0)
        assert torch.equal(back.labels, det.labels)

    def test_xywh_layout(self):
        det = Detections([[10.0, 20.0, 110.0, 70.0]], [0.5], [3], (100, 200))
        assert detections_to_coco(det, 1) == [
            {"image_id": 1, "category_id": 3, "bbox": [10.0, 20.0, 100.0, 50.0], "score": 0.5}
        ]

    def test_empty(self):
        det = Detections.empty((10, 20))
        assert detections_to_coco(det, 1) == []
        back = coco_to_detections([], (10, 20))
        assert len(back) == 0 and back.image_size == (10, 20)

    def test_several_images(self):
        results = detections_to_coco(random_detections(1, 4), 1) + detections_to_coco(
            random_detections(2, 3), 2
        )
        with pytest.raises(ValueError, match="image_id="):
            coco_to_detections(results, (480, 640))
        assert len(coco_to_detections(results, (480, 640), image_id=2)) == 3
        assert {k: len(v) for k, v in group_results_by_image(results).items()} == {1: 4, 2: 3}

    @pytest.mark.parametrize("image_id", [2.9, "2", True])
    def test_image_id_must_be_an_integer(self, image_id):
        results = detections_to_coco(random_detections(1, 4), 1) + detections_to_coco(random_detections(2, 3), 2)
        with pytest.raises(TypeError, match="image_id must be an integer"):
            coco_to_detections(results, (480, 640), image_id=image_id)  # 2.9 picked image 2, "2" too

    @pytest.mark.parametrize("decimals, error", [(-2, ValueError), (True, TypeError), (2.5, TypeError), ("3", TypeError)])
    def test_decimals_must_be_a_count(self, decimals, error):
        det = Detections([[10.0, 20.0, 110.0, 70.0]], [0.5], [3], (100, 200))
        with pytest.raises(error, match="decimals must be an integer"):
            detections_to_coco(det, 1, decimals=decimals)  # -2 wrote the box at (0, 0)
        assert detections_to_coco(det, 1, decimals=0)[0]["bbox"] == [10.0, 20.0, 100.0, 50.0]


class TestResultsFiles:
    def test_save_load_round_trip(self, tmp_path):
        results = detections_to_coco(random_detections(3, 20), 5)
        path = save_coco_results(results, tmp_path / "r.json")
        assert load_coco_results(path) == results
        assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left

    @pytest.mark.parametrize(
        ("content", "message"),
        [
            ('{"images": [], "annotations": []}', "annotation file"),
            ("[1, 2]", r"\[0\] must be a dict"),
            ('[{"image_id": 1, "bbox": [0, 0, 1, 1], "score": 0.5}]', "lacks \\['category_id'\\]"),
            ('[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1], "score": 0.5}]', "bbox must be 4 finite"),
            ('[{"image_id": 1, "category_id": 1, "bbox": [0, 0, -1, 1], "score": 0.5}]', "negative width"),
            ('[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": "high"}]', "score must be"),
            ('[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 0.5}, '
             '{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 1.7}]',
             r"bad\.json\[1\]\.score must be in \[0, 1\].*got 1\.7"),
            ('[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": -0.1}]', r"score must be in \[0, 1\]"),
            # a label Detections cannot hold: refused here, naming the row, not at the image it belongs to
            ('[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 0.5}, '
             '{"image_id": 1, "category_id": -1, "bbox": [0, 0, 1, 1], "score": 0.5}]',
             r"bad\.json\[1\]\.category_id must be a category id in \[0, 2147483647\], got -1$"),
            ('[{"image_id": 1, "category_id": 2147483648, "bbox": [0, 0, 1, 1], "score": 0.5}]',
             r"bad\.json\[0\]\.category_id must be a category id in \[0, 2147483647\], got 2147483648$"),
            ('[{"image_id": 1, "category_id": -3.0, "bbox": [0, 0, 1, 1], "score": 0.5}]',
             r"bad\.json\[0\]\.category_id must be a category id in \[0, 2147483647\], got -3\.0$"),
            (
                '[{"image_id": "a", "category_id": 1, "bbox": [0, 0, 1, 1], "score": 0.5}]',
                "image_id must be an integer",
            ),
            ("[{", "not valid JSON"),
            ('[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 1' + "0" * 400 + "}]",
             "score must be a finite number"),
            ('[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1' + "0" * 400 + ', 1], "score": 0.5}]',
             "bbox must be 4 finite numbers"),
        ],
    )
    def test_schema_errors(self, tmp_path, content, message):
        path = tmp_path / "bad.json"
        path.write_text(content)
        with pytest.raises((ValueError, TypeError), match=message):
            load_coco_results(path)

    def test_missing_file(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="missing.json"):
            load_coco_results(tmp_path / "missing.json")

    def test_a_file_that_is_not_utf8_is_named(self, tmp_path):
        path = tmp_path / "latin1.json"
        path.write_bytes('[{"image_id": 1, "note": "café"}]'.encode("latin-1"))
        with pytest.raises(ValueError, match=r"COCO results file .*latin1\.json is not UTF-8 text.*0xe9 at position 29"):
            load_coco_results(path)

    def test_save_rejects_bad_results(self, tmp_path):
        with pytest.raises(ValueError, match="lacks"):
            save_coco_results([{"image_id": 1}], tmp_path / "r.json")
        assert not (tmp_path / "r.json").exists()


def test_an_image_without_file_name_is_scored_but_cannot_be_found(tmp_path):
    from detens.predictions import EnsemblePredictions

    dataset = {
        "images": [{"id": 1, "width": 10, "height": 10}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 4, 4], "area": 16, "iscrowd": 0}],
        "categories": [{"id": 1, "name": "a"}],
    }
    gt = load_coco_gt(dataset)
    with pytest.raises(ValueError, match="image 1 of the ground truth has no 'file_name'"):
        gt.file_name(1)
    results = [[{"image_id": 1, "category_id": 1, "bbox": [1, 1, 4, 4], "score": 0.9}]]
    # a cache summary that lists nothing unreadable needs no file names
    predictions = EnsemblePredictions(["m"], results, gt, unreadable={"m": {}})
    assert predictions.left_out == [] and len(predictions.per_model(1)[0]) == 1
    with pytest.raises(ValueError, match="no 'file_name'"):
        EnsemblePredictions(["m"], results, gt, unreadable={"m": {"x.jpg": "corrupt"}})


def test_files_under_several_ids_names_each_shared_file_with_its_ids_in_order():
    from detens.coco import files_under_several_ids

    assert files_under_several_ids([]) == {}
    assert files_under_several_ids([(1, "a.jpg"), (2, "b.jpg")]) == {}
    pairs = [(9, "b.jpg"), (1, "a.jpg"), (3, "b.jpg"), (2, "c.jpg"), (5, "a.jpg"), (4, "b.jpg")]
    assert list(files_under_several_ids(pairs).items()) == [("b.jpg", [9, 3, 4]), ("a.jpg", [1, 5])]
