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

    @pytest.mark.parametrize("resamples", [0, -1, True, 2.0])
    def test_bad_counts(self, resamples):
        with pytest.raises(ValueError, match="resamples must be an integer >= 1"):
            resample_image_ids([1, 2], resamples)
        with pytest.raises(ValueError, match="at least one scored image"):
            resample_image_ids([], 3)

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
