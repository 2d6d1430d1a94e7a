"""The paired bootstrap over scored images (detens.bootstrap), against slow obvious references."""

from __future__ import annotations

import random

import numpy as np
import pytest

from detens.bootstrap import bootstrap_map, resample_image_ids, resampled_dataset, summarize_bootstrap
from detens.coco import CocoGroundTruth, evaluate_coco


def toy(seed: int = 0, num_images: int = 12):
    """A ground truth of ``num_images`` images (one without annotations) and two methods' results."""
    rng = random.Random(seed)
    images, annotations, results = [], [], {"good": [], "poor": []}
    for image_id in range(1, num_images + 1):
        images.append({"id": image_id, "width": 200, "height": 100, "file_name": f"{image_id}.jpg"})
        for _ in range(0 if image_id == num_images else rng.randint(1, 4)):
            x, y, w, h = rng.uniform(0, 150), rng.uniform(0, 60), rng.uniform(8, 50), rng.uniform(8, 40)
            category = rng.choice([1, 2, 3])
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": category,
                                "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0})
            for name, jitter in (("good", 1.0), ("poor", 6.0)):
                results[name].append({"image_id": image_id, "category_id": category, "score": rng.uniform(0.3, 1),
                                      "bbox": [x + rng.gauss(0, jitter), y + rng.gauss(0, jitter), w, h]})
        for name in results:  # a false positive per image
            results[name].append({"image_id": image_id, "category_id": rng.choice([1, 2, 3]),
                                  "score": rng.uniform(0, 0.8), "bbox": [rng.uniform(0, 150), 5.0, 20.0, 20.0]})
    categories = [{"id": i, "name": str(i)} for i in (1, 2, 3)]
    return CocoGroundTruth({"images": images, "annotations": annotations, "categories": categories}), results


def rows(results):
    by_image = {}
    for r in results:
        by_image.setdefault(r["image_id"], []).append([r["image_id"], *r["bbox"], r["score"], r["category_id"]])
    return {i: np.array(v, dtype=np.float64) for i, v in by_image.items()}


class TestResampling:
    def test_draws_with_replacement_fixed_by_seed_and_the_set_of_ids(self):
        ids = [5, 9, 2, 7]
        draws = resample_image_ids(ids, 200, seed=3)
        assert draws.shape == (200, 4) and set(np.unique(draws)) == {2, 5, 7, 9}
        assert (draws == resample_image_ids(ids[::-1], 200, seed=3)).all()
        assert not (draws == resample_image_ids(ids, 200, seed=4)).all()
        assert any(len(set(row)) < 4 for row in draws.tolist())  # repeats happen

    @pytest.mark.parametrize(
        "options, error, message",
        [
            ({"resamples": 0}, ValueError, "resamples must be an integer >= 1, got 0"),
            ({"resamples": -1}, ValueError, "resamples must be an integer >= 1, got -1"),
            ({"resamples": True}, TypeError, "resamples must be an integer, got bool: True"),
            ({"resamples": 2.0}, TypeError, "resamples must be an integer, got float: 2.0"),
            ({"resamples": "2"}, TypeError, "resamples must be an integer, got str: '2'"),
            ({"resamples": 2, "seed": -1}, ValueError, r"seed must be an integer in \[0, .*\], got -1"),
            ({"resamples": 2, "seed": 1.0}, TypeError, "seed must be an integer, got float: 1.0"),
            ({"resamples": 2, "seed": None}, TypeError, "seed must be an integer, got NoneType: None"),
        ],
    )
    def test_bad_counts_and_seeds(self, options, error, message):
        with pytest.raises(error, match=message):
            resample_image_ids([1, 2], **options)
        with pytest.raises(ValueError, match="at least one scored image"):
            resample_image_ids([], 3)
        with pytest.raises(TypeError, match="image_ids"):  # never truncated to the image 1
            resample_image_ids([1.5, 2], 3)

    def test_numpy_integers_draw_as_the_python_ints_they_hold(self):
        expected = resample_image_ids([5, 9, 2, 7], 20, seed=3)
        for resamples, seed in [(np.int64(20), 3), (20, np.int32(3)), (np.uint8(20), np.int64(3))]:
            got = resample_image_ids([5, 9, 2, 7], resamples, seed=seed)
            assert got.dtype == np.int64 and np.array_equal(got, expected)

    def test_a_drawn_image_is_copied_under_a_new_id(self):
        truth, results = toy()
        sample = [3, 3, 12, 1]
        dataset, predictions = resampled_dataset(truth, rows(results["good"]), sample)
        assert [im["id"] for im in dataset["images"]] == [1, 2, 3, 4]
        for new_id, old_id in enumerate(sample, start=1):
            assert dataset["images"][new_id - 1]["file_name"] == f"{old_id}.jpg"
            got = [a for a in dataset["annotations"] if a["image_id"] == new_id]
            assert [a["bbox"] for a in got] == [a["bbox"] for a in truth.annotations(old_id)]
            expected = [r for r in results["good"] if r["image_id"] == old_id]
            mine = predictions[predictions[:, 0] == new_id]
            assert mine[:, 1:5].tolist() == [r["bbox"] for r in expected]
            assert mine[:, 5].tolist() == [r["score"] for r in expected]
        assert len({a["id"] for a in dataset["annotations"]}) == len(dataset["annotations"])

    def test_drawing_every_image_once_gives_the_mAP(self):
        truth, results = toy()
        dataset, predictions = resampled_dataset(truth, rows(results["poor"]), truth.image_ids[::-1])
        once = evaluate_coco(dataset, predictions, image_ids=range(1, len(truth) + 1), backend="faster")["map"]
        assert once == pytest.approx(evaluate_coco(truth, results["poor"], image_ids=truth.image_ids,
                                                   backend="faster")["map"], abs=1e-12)


class TestBootstrapMap:
    def test_every_draw_is_scored_like_its_own_dataset(self):
        truth, results = toy()
        maps = bootstrap_map(truth, results, resamples=6, seed=1, backend="faster")
        draws = resample_image_ids(truth.annotated_image_ids, 6, seed=1)
        for name in results:
            for b, sample in enumerate(draws.tolist()):
                dataset, _ = resampled_dataset(truth, {}, sample)
                shifted = [{**r, "image_id": k} for k, old in enumerate(sample, 1) for r in results[name]
                           if r["image_id"] == old]
                assert maps[name][b] == pytest.approx(evaluate_coco(dataset, shifted, backend="faster")["map"],
                                                      abs=1e-12)
        assert maps["good"].mean() > maps["poor"].mean()

    def test_a_method_against_itself_differs_by_nothing(self):
        truth, results = toy(2)
        maps = bootstrap_map(truth, {"a": results["good"], "b": results["good"]}, resamples=5, backend="faster")
        assert (maps["a"] == maps["b"]).all()
        summary = summarize_bootstrap(maps, "a")
        assert summary["b"]["difference"] == {"mean": 0.0, "sd": 0.0, "ci95": [0.0, 0.0], "above": 0.0}

    def test_summary_against_numpy(self):
        maps = {"x": np.array([0.40, 0.42, 0.44, 0.41]), "y": np.array([0.41, 0.41, 0.46, 0.45])}
        summary = summarize_bootstrap(maps, "x")
        d = maps["y"] - maps["x"]
        assert summary["y"]["difference"]["mean"] == pytest.approx(d.mean())
        assert summary["y"]["difference"]["sd"] == pytest.approx(d.std(ddof=1))
        assert summary["y"]["difference"]["ci95"] == pytest.approx([np.percentile(d, 2.5), np.percentile(d, 97.5)])
        assert summary["y"]["difference"]["above"] == 0.75
        assert summary["x"]["map"]["sd"] == pytest.approx(maps["x"].std(ddof=1))
        with pytest.raises(ValueError, match=r"compares with 'z', which is not among the methods \['x', 'y'\]"):
            summarize_bootstrap(maps, "z")

    def test_bad_results_name_the_method(self):
        truth, results = toy()
        with pytest.raises(ValueError, match="'poor'"):
            bootstrap_map(truth, {"poor": [{"image_id": 1}]}, resamples=2)


def by_hand(truth: CocoGroundTruth, results, sample):
    """One draw built the obvious way, one dict at a time: the k-th drawn image is image k, its annotations
    and results copied under it; scored by pycocotools itself on every drawn image."""
    import contextlib
    import copy
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images, annotations, shifted = [], [], []
    for k, old in enumerate(sample, start=1):
        images.append({**next(im for im in truth.dataset["images"] if im["id"] == old), "id": k})
        for a in truth.dataset["annotations"]:
            if a["image_id"] == old:
                annotations.append({**a, "id": len(annotations) + 1, "image_id": k})
        shifted += [{**r, "image_id": k} for r in results if r["image_id"] == old]
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = {"images": images, "annotations": annotations,
                        "categories": copy.deepcopy(truth.dataset["categories"])}
        coco.createIndex()
        evaluator = COCOeval(coco, coco.loadRes(copy.deepcopy(shifted)), "bbox")
        evaluator.params.imgIds = list(range(1, len(sample) + 1))
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator.stats[0]


class TestImagesWithoutGroundTruth:
    def toy_with_negatives(self):
        """toy() with four more images, none annotated, where both methods still predict boxes."""
        truth, results = toy(3, num_images=6)
        dataset = dict(truth.dataset)
        dataset["images"] = dataset["images"] + [
            {"id": i, "width": 200, "height": 100, "file_name": f"{i}.jpg"} for i in range(7, 11)]
        for name, score in (("good", 0.95), ("poor", 0.2)):
            results[name] += [{"image_id": i, "category_id": 1, "bbox": [10.0, 10.0, 30.0, 30.0], "score": score}
                              for i in range(7, 11)]
        return CocoGroundTruth(dataset), results

    def test_every_drawn_image_is_scored_negatives_too(self):
        truth, results = self.toy_with_negatives()
        every = truth.image_ids
        assert len(truth.annotated_image_ids) == 5 and len(every) == 10  # 6 and 11 have no annotation
        maps = bootstrap_map(truth, results, image_ids=every, resamples=12, seed=0, backend="pycocotools")
        draws = resample_image_ids(every, 12, seed=0)
        for name in results:
            expected = np.array([by_hand(truth, results[name], sample) for sample in draws.tolist()])
            expected[expected < 0] = np.nan  # COCO's -1: nothing to measure
            np.testing.assert_allclose(maps[name], expected, atol=1e-12, equal_nan=True)

    def test_draws_without_ground_truth_are_nan_and_left_out_of_the_summary(self, caplog):
        truth, results = self.toy_with_negatives()
        ids = [truth.annotated_image_ids[0], 6, 7, 8, 9, 10]  # one annotated image of six
        with caplog.at_level("WARNING", logger="detens.bootstrap"):
            maps = bootstrap_map(truth, results, image_ids=ids, resamples=40, seed=1, backend="faster")
        empty = np.isnan(maps["good"])
        draws = resample_image_ids(ids, 40, seed=1)
        assert (empty == ~(draws == ids[0]).any(axis=1)).all() and 0 < empty.sum() < 40  # no annotated image
        assert (np.isnan(maps["poor"]) == empty).all()
        assert f"{int(empty.sum())} of 40 draws hold no ground truth that COCO counts" in caplog.text
        summary = summarize_bootstrap(maps, "poor")
        kept = {name: values[~empty] for name, values in maps.items()}
        reference = summarize_bootstrap(kept, "poor")
        assert summary == reference and summary["good"]["draws"] == int((~empty).sum())
        assert summary["good"]["map"]["mean"] == pytest.approx(kept["good"].mean())
        assert summary["good"]["difference"]["ci95"] == pytest.approx(
            [np.percentile(kept["good"] - kept["poor"], 2.5), np.percentile(kept["good"] - kept["poor"], 97.5)])

    def test_no_draw_with_ground_truth_is_an_error(self):
        truth, results = self.toy_with_negatives()
        maps = bootstrap_map(truth, results, image_ids=[7, 8], resamples=3, backend="faster")
        assert np.isnan(maps["good"]).all()
        with pytest.raises(ValueError, match="none of the 3 draws has a mAP for every method"):
            summarize_bootstrap(maps, "good")

    def test_an_image_not_in_the_ground_truth_is_named(self):
        truth, results = toy()
        with pytest.raises(ValueError, match=r"image_ids \[99\] are not in the ground truth"):
            bootstrap_map(truth, results, image_ids=[1, 99], resamples=3, backend="faster")
