"""Training and cross-validated evaluation on a small slice of the real COCO annotations.

Per-model predictions are synthesized from the ground truth (jittered boxes, misses, false positives,
a different noise level per model), so the tests exercise the real tools without running detectors.
"""

from __future__ import annotations

import codecs
import collections
import errno
import json
import logging
import math
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from detens.coco import METRIC_KEYS, load_coco_gt
from detens.evaluation import (
    METHODS,
    EvalMethod,
    EvaluationData,
    FixedFusion,
    TunedWBF,
    build_method,
    cross_validate,
)
from detens.folds import kfold_image_splits
from detens.fusers import fuse
from detens.heads import ThetaTrainConfig, build_samples, fit_head, load_head
from detens.heads._fit import train_theta
from detens.heads._io import head_digest, read_head_file
from detens.heads.theta import ThetaHead
from detens.predictions import EnsemblePredictions, LeftOutImage, join_predictions, shared_images
from detens.report.record import EvaluationRecord, record_path

REPO = Path(__file__).resolve().parents[1]
ANNOTATIONS = REPO.parent / "shared" / "data" / "coco_val2017_206" / "instances_val2017.json"
from detens.cli import evaluate as evaluate_cli  # noqa: E402
from detens.cli import train as train_cli  # noqa: E402
from detens.jobs import evaluate as evaluate_job  # noqa: E402

MODELS = {"sharp": 0.02, "blurry": 0.08, "noisy": 0.15}  # box jitter relative to the box size


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """12 annotated images of the real annotation file and three synthetic models' predictions."""
    root = tmp_path_factory.mktemp("slice")
    full = json.loads(ANNOTATIONS.read_text())
    annotated = sorted({a["image_id"] for a in full["annotations"]})[:12]
    keep = set(annotated)
    subset = {
        "images": [im for im in full["images"] if im["id"] in keep],
        "annotations": [a for a in full["annotations"] if a["image_id"] in keep],
        "categories": full["categories"],
    }
    gt_path = root / "instances.json"
    gt_path.write_text(json.dumps(subset))
    predictions = root / "predictions"
    predictions.mkdir()
    category_ids = [c["id"] for c in full["categories"]]
    for index, (name, jitter) in enumerate(MODELS.items()):
        rng = random.Random(index)
        results = []
        for ann in subset["annotations"]:
            if ann["iscrowd"] or rng.random() < 0.15:
                continue
            x, y, w, h = ann["bbox"]
            box = [x + rng.gauss(0, jitter * w), y + rng.gauss(0, jitter * h), w * (1 + rng.gauss(0, jitter)),
                   h * (1 + rng.gauss(0, jitter))]
            box[2], box[3] = max(box[2], 1.0), max(box[3], 1.0)
            score = min(1.0, max(0.01, rng.gauss(0.8 - jitter * 2, 0.15)))
            results.append({"image_id": ann["image_id"], "category_id": ann["category_id"], "bbox": box, "score": score})
        for image in subset["images"]:
            for _ in range(5):  # false positives
                w, h = rng.uniform(10, 100), rng.uniform(10, 100)
                x, y = rng.uniform(0, image["width"] - w), rng.uniform(0, image["height"] - h)
                results.append({"image_id": image["id"], "category_id": rng.choice(category_ids),
                                "bbox": [x, y, w, h], "score": rng.uniform(0.01, 0.5)})
        (predictions / f"{name}.json").write_text(json.dumps(results))
    return gt_path, predictions


@pytest.fixture(scope="module")
def ensemble(dataset):
    gt_path, predictions = dataset
    return EnsemblePredictions.from_folder(predictions, load_coco_gt(gt_path))


class TestFolds:
    @pytest.mark.parametrize("k", [2, 3, 5])
    def test_partition_without_overlap(self, k):
        ids = list(range(100, 137))
        splits = kfold_image_splits(ids, k, seed=4)
        assert len(splits) == k
        held_out = [i for _, test in splits for i in test]
        assert sorted(held_out) == ids
        for train, test in splits:
            assert not set(train) & set(test)
            assert sorted(train + test) == ids

    def test_fixed_by_seed_and_order_independent(self):
        ids = list(range(50))
        assert kfold_image_splits(ids, 2, 0) == kfold_image_splits(ids[::-1], 2, 0)
        assert kfold_image_splits(ids, 2, 0) != kfold_image_splits(ids, 2, 1)

    @pytest.mark.parametrize("ids, k, message", [([1, 2, 3], 1, "k"), ([1, 2], 3, "cannot make 3 folds"),
                                                 ([1, 1, 2], 2, "duplicates")])
    def test_bad_input(self, ids, k, message):
        with pytest.raises(ValueError, match=message):
            kfold_image_splits(ids, k)

    def test_too_few_annotated_images_for_the_folds_are_counted_apart_from_the_negative_ones(self):
        with pytest.raises(ValueError, match=r"^cannot make 3 folds from 2 images with annotations \(each fold "
                           r"needs one; the 10 without are dealt after them\)$"):
            kfold_image_splits([1, 2], 3, negative_ids=list(range(10, 20)))

    @pytest.mark.parametrize("k, seed, message", [
        (2, None, "seed must be an integer, got NoneType: None"),  # would draw other folds on every run
        (2, 1.5, "seed must be an integer, got float: 1.5"),
        (2, True, "seed must be an integer, got bool: True"),
        (True, 0, "k must be an integer, got bool: True"),
        (2.0, 0, "k must be an integer, got float: 2.0"),
    ])
    def test_k_and_seed_must_be_integers(self, k, seed, message):
        with pytest.raises(TypeError, match=message):
            kfold_image_splits(list(range(10)), k, seed)

    def test_negative_seeds_are_refused(self):
        # random.Random reads -1 as 1: the two seeds would name the same folds
        with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 9223372036854775807\], got -1"):
            kfold_image_splits(list(range(10)), 2, -1)

    @pytest.mark.parametrize("config", ["ThetaTrainConfig", "DeepTrainConfig", "SelectionTrainConfig"])
    def test_training_configs_refuse_negative_seeds(self, config):
        import detens.heads._fit as fit

        with pytest.raises(ValueError, match="seed must be an integer in"):
            getattr(fit, config)(seed=-1)
        assert getattr(fit, config)(seed=2**63 - 1).seed == 2**63 - 1

    def test_numpy_integers_are_integers(self):
        ids = list(range(10))
        assert kfold_image_splits(ids, np.int64(2), np.int64(3)) == kfold_image_splits(ids, 2, 3)

    @pytest.mark.parametrize("k, seed", [(2, 0), (3, 1), (5, 7)])
    def test_negative_images_leave_the_annotated_images_folds_as_they_were(self, k, seed):
        annotated, negatives = list(range(100, 123)), [7, 3, 50, 1, 999, 2, 8]
        plain = kfold_image_splits(annotated, k, seed)
        joined = kfold_image_splits(annotated, k, seed, negatives)
        held_out = []
        for (plain_train, plain_test), (train, test) in zip(plain, joined, strict=True):
            assert [i for i in test if i in annotated] == plain_test
            assert [i for i in train if i in annotated] == plain_train
            assert not set(train) & set(test) and sorted(train + test) == sorted(annotated + negatives)
            held_out += [i for i in test if i in negatives]
        assert sorted(held_out) == sorted(negatives)  # each negative image held out once
        sizes = [len(test) for _, test in joined]
        assert max(sizes) - min(sizes) <= 1  # dealt on where the annotated images' round ended
        assert joined == kfold_image_splits(annotated[::-1], k, seed, negatives[::-1])  # the sets alone count
        assert kfold_image_splits(annotated, k, seed, []) == plain

    @pytest.mark.parametrize("negatives, message", [([1, 1], "negative_ids contains duplicates"),
                                                    ([5, 2], r"image ids \[2\] are in both image_ids and negative_ids")])
    def test_negative_images_are_distinct_images(self, negatives, message):
        with pytest.raises(ValueError, match=message):
            kfold_image_splits([1, 2, 3], 2, 0, negatives)


class TestTraining:
    def test_deterministic_and_loss_decreases(self, ensemble):
        samples = build_samples(ensemble, ensemble.gt.annotated_image_ids)
        config = ThetaTrainConfig(epochs=30, normalize_box=True, lr=0.05)
        head_a, history_a = train_theta(samples, ensemble.model_names, config)
        head_b, history_b = train_theta(samples, ensemble.model_names, config)
        assert torch.equal(head_a.theta, head_b.theta)
        assert history_a.loss == history_b.loss
        assert len(history_a.loss) == 30
        assert history_a.loss[-1] < history_a.loss[0]

    def test_minibatches_are_deterministic_for_a_seed(self, ensemble):
        samples = build_samples(ensemble, ensemble.gt.annotated_image_ids)
        runs = [train_theta(samples, ensemble.model_names, ThetaTrainConfig(epochs=5, batch_images=3, seed=s))[0].theta
                for s in (0, 0, 1)]
        assert torch.equal(runs[0], runs[1])
        assert not torch.equal(runs[0], runs[2])

    def test_learns_to_trust_the_sharp_model(self, ensemble):
        samples = build_samples(ensemble, ensemble.gt.annotated_image_ids)
        config = ThetaTrainConfig(epochs=150, normalize_box=True, lr=0.2)
        head, _ = train_theta(samples, ensemble.model_names, config)
        theta = dict(zip(ensemble.model_names, head.theta.tolist(), strict=True))
        assert theta["sharp"] > theta["noisy"]

    def test_match_iou_grid_picks_from_the_grid(self, ensemble):
        config = ThetaTrainConfig(epochs=5, normalize_box=True, match_iou_grid=[0.4, 0.7])
        head, _, fitted = fit_head("theta", ensemble, ensemble.gt.annotated_image_ids, config)
        assert fitted.match_iou in (0.4, 0.7) and fitted.match_iou_grid == []

    def test_no_samples_is_an_error(self, ensemble):
        with pytest.raises(ValueError, match="no training images"):
            train_theta([], ensemble.model_names, ThetaTrainConfig())

    def test_a_repeated_image_is_an_error(self, ensemble):
        ids = ensemble.gt.annotated_image_ids
        with pytest.raises(ValueError, match=rf"image_ids must be distinct, got duplicates \[{ids[1]}\]"):
            fit_head("theta", ensemble, [ids[0], ids[1], ids[2], ids[1]], ThetaTrainConfig(epochs=1, match_iou_grid=[]))

    @pytest.mark.parametrize("kind", ["theta", "deep", "calibration"])
    def test_image_ids_missing_from_the_ground_truth_or_none_at_all(self, ensemble, kind):
        from detens.heads import config_for

        ids = ensemble.gt.annotated_image_ids
        config = config_for(kind) if kind == "calibration" else config_for(kind, epochs=1, match_iou_grid=[])
        with pytest.raises(ValueError, match=r"image_ids \[999999999\] are not in the ground truth \(12 images\)"):
            fit_head(kind, ensemble, [ids[0], 999999999, ids[1]], config)
        with pytest.raises(ValueError, match=f"no image ids given: a {kind} head is fitted on the training images"):
            fit_head(kind, ensemble, [], config)
        with pytest.raises(ValueError, match=r"image_ids \[999999999\] are not in the ground truth"):
            build_samples(ensemble, [ids[0], 999999999])

    @pytest.mark.parametrize("changes", [{"match_iou": 1.2}, {"epochs": -1}, {"lr": 0}, {"match_iou_grid": [0.5, 1.0]}])
    def test_bad_config(self, changes):
        with pytest.raises(ValueError):
            ThetaTrainConfig(**changes)

    @pytest.mark.parametrize("kind", ["theta", "theta_seed", "deep", "selection", "superlearner"])
    def test_no_epochs_is_refused_not_saved_as_a_fitted_head(self, kind, tmp_path):
        """epochs 0 was accepted: the head came back as initialized (Θ = 1/N, or mean scoring), as if fitted."""
        from detens.heads import config_for, load_train_config

        with pytest.raises(ValueError, match=r"^epochs must be an integer >= 1, got 0$"):
            config_for(kind, epochs=0)
        (tmp_path / "train.yaml").write_text("epochs: 0\n")
        with pytest.raises(ValueError, match=r"train\.yaml: epochs must be an integer >= 1, got 0$"):
            load_train_config(kind, str(tmp_path / "train.yaml"))
        assert config_for(kind, epochs=1).epochs == 1

    @pytest.mark.parametrize("kind", ["theta", "theta_seed"])
    def test_theta_without_any_loss_term_is_refused_and_each_term_alone_may_be_left_out(self, kind):
        from detens.heads import config_for

        with pytest.raises(ValueError, match=r"^lambda_reg, lambda_cls and lambda_cons are all 0: the loss would be 0"):
            config_for(kind, lambda_reg=0, lambda_cls=0, lambda_cons=0)
        for kept in ("lambda_reg", "lambda_cls", "lambda_cons"):
            zeros = {name: 0.0 for name in ("lambda_reg", "lambda_cls", "lambda_cons") if name != kept}
            assert getattr(config_for(kind, **zeros), kept) > 0

    @pytest.mark.parametrize("changes, message", [
        ({"epochs": "5"}, "epochs must be an integer, got str: '5'"),
        ({"epochs": 2.5}, "epochs must be an integer, got float: 2.5"),
        ({"lr": "0.1"}, "lr must be a number, got str: '0.1'"),
        ({"match_iou": "0.5"}, "match_iou must be a number, got str"),
        ({"match_iou_grid": 0.6}, "match_iou_grid must be a list of numbers, got float: 0.6"),
        ({"per_class": "yes"}, "per_class must be True or False"),
        ({"seed": None}, "seed must be an integer, got NoneType"),
        ({"device": 0.5}, "device must be a device string"),
    ])
    def test_wrong_types_are_named(self, changes, message):
        from detens.heads import config_for

        with pytest.raises(TypeError, match=message):
            config_for("theta", **changes)

    @pytest.mark.parametrize("kind", ["theta", "deep"])
    def test_a_device_this_machine_lacks_is_refused_up_front(self, kind, monkeypatch):
        from detens.heads import config_for

        with pytest.raises(ValueError, match="device must be a torch device: cpu, cuda or cuda:<index>, got 'banana'"):
            config_for(kind, device="banana")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        with pytest.raises(ValueError, match="device is 'cuda' but no CUDA device is available"):
            config_for(kind, device="cuda")

    @pytest.mark.parametrize("batch_images", [0, 4])
    @pytest.mark.parametrize("lr", [1.0, 1e6])
    def test_a_diverged_fit_is_an_error_naming_the_learning_rate(self, ensemble, lr, batch_images):
        samples = build_samples(ensemble, ensemble.gt.annotated_image_ids)
        message = rf"the Θ fit diverged: .* rose .*lr={re.escape(f'{lr:g}')}.*lower the learning rate"
        with pytest.raises(FloatingPointError, match=message):
            train_theta(samples, ensemble.model_names,
                        ThetaTrainConfig(epochs=30, match_iou_grid=[], lr=lr, batch_images=batch_images))

    def test_mini_batches_never_stack_more_images_than_one_batch(self, ensemble, monkeypatch):
        samples = build_samples(ensemble, ensemble.gt.annotated_image_ids)
        stacked = []
        stack_batch = ThetaHead.stack_batch

        def counting(self, clusters, targets):
            stacked.append(len(clusters))
            return stack_batch(self, clusters, targets)

        monkeypatch.setattr(ThetaHead, "stack_batch", counting)
        # the divergence check scores every sample after each reassignment and at the end: batch by batch too
        train_theta(samples, ensemble.model_names,
                    ThetaTrainConfig(epochs=4, match_iou_grid=[], batch_images=4, reassign_every=2))
        assert max(stacked) == 4 < len(samples)
        assert sum(stacked) == len(samples) * (4 + 3)  # 4 epochs of training, 3 scorings of every sample

    def test_a_non_finite_objective_is_an_error(self, ensemble, monkeypatch):
        samples = build_samples(ensemble, ensemble.gt.annotated_image_ids)
        loss_on_batch = ThetaHead.loss_on_batch
        calls = []

        def breaks_on_the_third_step(self, *batch):
            calls.append(1)
            loss = loss_on_batch(self, *batch)
            return loss * math.nan if len(calls) == 4 else loss  # the first call scores the initial Θ

        monkeypatch.setattr(ThetaHead, "loss_on_batch", breaks_on_the_third_step)
        with pytest.raises(FloatingPointError, match=r"the Θ objective became nan at epoch 2 \(gd, lr=0.1\)"):
            train_theta(samples, ensemble.model_names, ThetaTrainConfig(epochs=5, match_iou_grid=[]))


@pytest.fixture
def recording(monkeypatch):
    """``RecordingMethod`` registered as the method ``recording`` for one test (the registry is shared by
    every test, whose lists of methods must not show it)."""
    monkeypatch.setitem(METHODS._items, "recording", RecordingMethod)
    return RecordingMethod


class RecordingMethod(EvalMethod):
    """A learned method that records what it was fitted on and asked to predict."""

    learned = True
    log: list[tuple[str, list[int]]] = []

    def __init__(self, model_names):
        self.inner = FixedFusion("mean")

    def fit(self, data, train_ids):
        RecordingMethod.log.append(("fit", list(train_ids)))

    def predict(self, data, image_id):
        RecordingMethod.log.append(("predict", [image_id]))
        return self.inner.predict(data, image_id)


class TestCrossValidation:
    def test_no_image_is_scored_by_a_method_fitted_on_it(self, ensemble, recording):
        RecordingMethod.log.clear()
        report = cross_validate(ensemble, ["recording"], k=3, seed=0, backend="faster")
        fitted_on: list[int] = []
        predicted: set[int] = set()
        for kind, ids in RecordingMethod.log:
            if kind == "fit":
                fitted_on = ids
            else:
                assert ids[0] not in fitted_on
                predicted.add(ids[0])
        assert predicted == set(ensemble.gt.annotated_image_ids)
        assert sum(kind == "fit" for kind, _ in RecordingMethod.log) == 3
        assert 0.0 < report["recording"].metrics["map"] <= 1.0

    def test_each_fusion_runs_once_untimed_before_its_timed_images(self, ensemble, monkeypatch):
        """One-time costs (loading compiled kernels) stay out of ``fusion_ms``: each method, and each fold's
        fitted method, fuses its first held-out image once before the clock runs."""
        events: list[tuple] = []
        original = FixedFusion.predict

        def spy(self, data, image_id):
            events.append(("predict", image_id))
            return original(self, data, image_id)

        def clock():  # 2 ms from every reading to the next
            events.append(("clock",))
            return 0.002 * events.count(("clock",))

        monkeypatch.setattr(FixedFusion, "predict", spy)
        for method, plan in (("mean", [ensemble.gt.annotated_image_ids]),
                             ("wbf", [test for _, test in kfold_image_splits(ensemble.gt.annotated_image_ids, 2, 0)])):
            if method == "wbf":  # the same fuser, fitted per fold
                monkeypatch.setattr(FixedFusion, "learned", True)
            events.clear()
            report = cross_validate(ensemble, [method], k=2, backend="faster", clock=clock)
            expected = []
            for test_ids in plan:
                expected += [("predict", test_ids[0])]
                for image_id in test_ids:
                    expected += [("clock",), ("predict", image_id), ("clock",)]
            assert events == expected
            assert report[method].metrics["fusion_ms"] == pytest.approx(2.0)

    def test_an_unknown_backend_is_refused_before_any_method_runs(self, ensemble, monkeypatch):
        def never(self, data, image_id):
            raise AssertionError("a method ran")

        monkeypatch.setattr(FixedFusion, "predict", never)
        with pytest.raises(ValueError, match="backend must be one of pycocotools, faster, hotcoco, got 'hotcocoo'"):
            cross_validate(ensemble, ["mean"], k=2, backend="hotcocoo")

    def test_fixed_methods_predict_every_image_once(self, ensemble):
        report = cross_validate(ensemble, ["mean", "single"], k=2, backend="faster")
        assert list(report) == ["mean", "single:blurry", "single:noisy", "single:sharp"]
        for result in report.values():
            assert set(result.metrics) == set(METRIC_KEYS) | {"ece", "fusion_ms"}
            assert 0.0 <= result.metrics["ece"] <= 1.0 and result.calibration["count"] > 0
            assert result.fitted == []
        # The ensemble of three noisy copies should beat its noisiest member.
        assert report["mean"].metrics["map"] > report["single:noisy"].metrics["map"]

    def test_wbf_tuned_fits_per_fold(self, ensemble):
        options = {"wbf_tuned": {"iou_grid": [0.5, 0.7], "conf_types": ["avg", "max"], "weight_values": [1.0, 2.0],
                                 "max_widenings": 0}}
        report = cross_validate(ensemble, ["wbf_tuned"], k=2, backend="faster", method_options=options)
        fitted = report["wbf_tuned"].fitted
        assert len(fitted) == 2
        for fold in fitted:
            assert fold["iou_thr"] in (0.5, 0.7) and set(fold["weights"]) <= {1.0, 2.0}
            assert fold["conf_type"] in ("avg", "max")
            assert {"iou_interior", "weights_interior", "settings_searched", "train_map"} <= set(fold)

    def test_wbf_tuned_ends_where_no_single_change_helps(self, ensemble):
        method = TunedWBF(ensemble.model_names, iou_grid=[0.5, 0.6, 0.7], conf_types=["avg", "max"],
                          weight_values=[1.0, 2.0, 3.0], max_rounds=10)
        data = EvaluationData(ensemble)
        train_ids = ensemble.gt.annotated_image_ids[:8]
        method.fit(data, train_ids)
        best = method.best
        setting = (best["iou_thr"], best["conf_type"], tuple(best["weights"]))
        assert best["train_map"] == method._score(data, train_ids, setting)
        neighbours = [(t, setting[1], setting[2]) for t in method.iou_grid]
        neighbours += [(setting[0], c, setting[2]) for c in method.conf_types]
        for m in range(len(setting[2])):
            neighbours += [(setting[0], setting[1], setting[2][:m] + (w,) + setting[2][m + 1 :])
                           for w in method.weight_grid]
        for other in neighbours:  # a coordinate-wise optimum: scored directly, not through the memo
            params = dict(iou_thr=other[0], conf_type=other[1], weights=list(other[2]))
            score = data.score(lambda i, params=params: fuse(data.per_model(i), "wbf", **params), train_ids)
            assert score <= best["train_map"] + 1e-12

    def test_wbf_tuned_reports_an_optimum_on_the_grid_edge(self, ensemble):
        method = TunedWBF(ensemble.model_names, iou_grid=[0.55], conf_types=["avg"], weight_values=[1.0],
                          max_widenings=0)
        method.fit(EvaluationData(ensemble), ensemble.gt.annotated_image_ids[:4])
        assert method.describe()["iou_interior"] is False

    def test_wbf_tuned_widens_the_iou_grid_from_its_top(self, ensemble):
        """An iou_thr on the top of its grid adds the value halfway to 1, until it is not on top (or 0.99)."""
        train_ids = ensemble.gt.annotated_image_ids[:8]
        kwargs = dict(iou_grid=[0.55], conf_types=["avg"], weight_values=[1.0])
        narrow = TunedWBF(ensemble.model_names, max_widenings=0, **kwargs)
        narrow.fit(EvaluationData(ensemble), train_ids)
        assert narrow.describe()["iou_grid"] == [0.55]
        wide = TunedWBF(ensemble.model_names, max_widenings=3, **kwargs)
        wide.fit(EvaluationData(ensemble), train_ids)
        described = wide.describe()
        grid = described["iou_grid"]
        assert grid[:2] == [0.55, 0.775] and all(b == round((a + 1) / 2, 4) for a, b in zip(grid[:-1], grid[1:], strict=True))
        assert described["iou_thr"] in grid and described["train_map"] >= narrow.best["train_map"]
        # it stopped because the choice left the top, or because the widenings ran out
        assert described["iou_thr"] != grid[-1] or len(grid) == 4

    def test_wbf_tuned_widens_the_weight_grid_from_its_edge(self, ensemble):
        """Weights ending on the edge (one at the largest value, one at the smallest) widen the grid; the
        widened fit scores at least as well as the first and reports its grid."""
        train_ids = ensemble.gt.annotated_image_ids[:8]
        kwargs = dict(iou_grid=[0.55], conf_types=["avg"], weight_values=[1.0, 1.5])
        narrow = TunedWBF(ensemble.model_names, max_widenings=0, **kwargs)
        narrow.fit(EvaluationData(ensemble), train_ids)
        assert narrow.describe()["weights_interior"] is False  # the sharp model wants more than 1.5x the noisy one
        wide = TunedWBF(ensemble.model_names, max_widenings=2, **kwargs)
        wide.fit(EvaluationData(ensemble), train_ids)
        described = wide.describe()
        assert described["weight_grid"][0] < 1.0 and described["weight_grid"][-1] > 1.5
        assert set(described["weights"]) <= set(described["weight_grid"])
        assert described["train_map"] >= narrow.best["train_map"]

    @pytest.mark.parametrize("options, error, message", [
        ({"iou_grid": []}, ValueError, r"wbf_tuned needs a non-empty iou_grid, got \[\]"),
        ({"conf_types": ()}, ValueError, r"wbf_tuned needs a non-empty conf_types, got \[\]"),
        ({"weight_values": []}, ValueError, r"wbf_tuned needs a non-empty weight_values, got \[\]"),
        ({"iou_grid": [0.5, 1.0]}, ValueError, r"iou_grid\[1\] must be in \(0, 1\), got 1.0"),
        ({"iou_grid": [0]}, ValueError, r"iou_grid\[0\] must be in \(0, 1\), got 0"),
        ({"iou_grid": [1.5]}, ValueError, r"iou_grid\[0\] must be in \(0, 1\), got 1.5"),
        ({"iou_grid": [math.nan]}, ValueError, r"iou_grid\[0\] must be in \(0, 1\), got nan"),
        ({"iou_grid": 0.5}, TypeError, r"iou_grid must be a list of numbers, got float: 0.5"),
        ({"iou_grid": ["0.5"]}, TypeError, r"iou_grid\[0\] must be a number, got str: '0.5'"),
        ({"weight_values": [1.0, -1.0]}, ValueError, r"weight_values\[1\] must be a positive number, got -1.0"),
        ({"weight_values": [0.0]}, ValueError, r"weight_values\[0\] must be a positive number, got 0.0"),
        ({"weight_values": [math.inf]}, ValueError, r"weight_values\[0\] must be a positive number, got inf"),
        ({"weight_values": [1, True]}, TypeError, r"weight_values\[1\] must be a number, got bool: True"),
        ({"conf_types": ["avg", "mean"]}, ValueError,
         r"conf_types\[1\] must be one of avg, max, box_and_model_avg, absent_model_aware_avg, got 'mean'"),
        ({"conf_types": "avg"}, TypeError, r"conf_types must be a list of names among avg, .*, got str: 'avg'"),
        ({"conf_types": [None]}, TypeError, r"conf_types\[0\] must be one of avg, .*, got NoneType None"),
        ({"max_rounds": 0}, ValueError, r"max_rounds must be an integer >= 1, got 0"),
        ({"max_rounds": 2.0}, TypeError, r"max_rounds must be an integer, got float: 2.0"),
        ({"max_widenings": -1}, ValueError, r"max_widenings must be an integer >= 0, got -1"),
    ])
    def test_wbf_tuned_refuses_a_bad_search_option_naming_it_and_the_value(self, options, error, message):
        with pytest.raises(error, match=f"^{message}$"):
            TunedWBF(["a", "b"], **options)

    def test_a_bad_wbf_tuned_grid_is_refused_before_any_method_runs(self, ensemble):
        """WBF itself took an IoU of 1.5 only in the search, after the methods before it had run."""
        ran = []
        with pytest.raises(ValueError, match=r"^iou_grid\[1\] must be in \(0, 1\), got 1.5$"):
            cross_validate(ensemble, ["wbf", "wbf_tuned"], k=2, backend="faster",
                           method_options={"wbf_tuned": {"iou_grid": [0.5, 1.5]}}, on_method=lambda name, _: ran.append(name))
        assert ran == []

    def test_pretrained_head_is_scored_as_a_fixed_method(self, dataset, ensemble, tmp_path):
        samples = build_samples(ensemble, ensemble.gt.annotated_image_ids[:8], 0.55)
        head, _ = train_theta(samples, ensemble.model_names, ThetaTrainConfig(epochs=3, batch_images=4, seed=0))
        path = tmp_path / "elsewhere.json"
        head.save(path)
        name = f"head:{path}"
        report = cross_validate(ensemble, [name], k=2, backend="faster")
        assert report[name].fitted == []  # never refitted per fold
        data = EvaluationData(ensemble)
        expected = data.score(lambda i: fuse(data.per_model(i), "theta", head=head), data.image_ids, backend="faster")
        assert report[name].metrics["map"] == pytest.approx(expected, abs=1e-12)
        method = build_method(name, ensemble.model_names)
        assert method.describe() == {"head": str(path), "type": "theta", "match_iou": head.match_iou}
        # A head trained with the models in another order gets its inputs in its own order.
        names = ensemble.model_names
        reordered = EnsemblePredictions.from_folder(dataset[1], ensemble.gt, models=names[::-1])
        assert reordered.model_names == names[::-1]
        again = cross_validate(reordered, [name], k=2, backend="faster")
        assert again[name].metrics["map"] == pytest.approx(expected, abs=1e-12)

    def test_bad_head_file_fails_before_any_method_runs(self, ensemble, tmp_path, recording):
        RecordingMethod.log.clear()
        with pytest.raises(FileNotFoundError, match="missing.json"):
            cross_validate(ensemble, ["recording", f"head:{tmp_path / 'missing.json'}"], k=2, backend="faster")
        assert RecordingMethod.log == []
        ThetaHead(["a", "b", "c"]).save(tmp_path / "other.json")
        with pytest.raises(ValueError, match=r"trained for models \['a', 'b', 'c'\], but the predictions have"):
            cross_validate(ensemble, [f"head:{tmp_path / 'other.json'}"], k=2, backend="faster")
        # per-class rows of ids the ground truth lacks: trained on another label space, whose ids mean
        # other classes
        foreign = max(ensemble.gt.category_ids) + 1
        own = ensemble.gt.category_ids[0]
        ThetaHead(ensemble.model_names, per_class=True, class_ids=[own, foreign]).save(tmp_path / "foreign.json")
        with pytest.raises(ValueError, match=rf"^head '.*foreign\.json' has per-class parameters for category ids "
                                             rf"{foreign}, which are not among the \d+ category ids of the ground "
                                             r"truth: .*train one on this dataset"):
            cross_validate(ensemble, ["recording", f"head:{tmp_path / 'foreign.json'}"], k=2, backend="faster")
        assert RecordingMethod.log == []
        ThetaHead(ensemble.model_names, per_class=True, class_ids=[own]).save(tmp_path / "own.json")
        report = cross_validate(ensemble, [f"head:{tmp_path / 'own.json'}"], k=2, backend="faster")
        assert report[f"head:{tmp_path / 'own.json'}"].metrics["map"] > 0

    def test_a_pretrained_head_whose_ids_name_other_classes_is_refused(self, ensemble, tmp_path, recording):
        RecordingMethod.log.clear()
        names = ensemble.gt.category_names
        ids = ensemble.gt.category_ids[:3]
        # a custom dataset numbered 1, 5, 9 like COCO: every id exists here, each names another class
        head = ThetaHead(ensemble.model_names, per_class=True, class_ids=ids)
        head.label_space = dict(zip(ids, ["cat", "dog", "bird"], strict=True))
        head.save(tmp_path / "custom.json")
        shown = ", ".join(f"{c} is {n!r} in the head but {names[c]!r} there"
                          for c, n in zip(ids, ["cat", "dog", "bird"], strict=True))
        with pytest.raises(ValueError, match=rf"^head '.*custom\.json' was trained on a label space whose category "
                                             rf"ids name other classes than in the ground truth: {re.escape(shown)}; "
                                             r"its per-class parameters would fuse the wrong classes"):
            cross_validate(ensemble, ["recording", f"head:{tmp_path / 'custom.json'}"], k=2, backend="faster")
        assert RecordingMethod.log == []
        # the ground truth's names in other spellings are its classes
        head.label_space = {c: f" {names[c].upper().replace(' ', '_')}" for c in ids}
        head.save(tmp_path / "spelled.json")
        report = cross_validate(ensemble, [f"head:{tmp_path / 'spelled.json'}"], k=2, backend="faster")
        assert report[f"head:{tmp_path / 'spelled.json'}"].metrics["map"] > 0

    def test_a_pretrained_head_without_per_class_parameters_of_another_label_space_is_warned_of_once(
        self, ensemble, tmp_path, caplog
    ):
        """A deep head fitted on a custom dataset's classes applies to any label space, and was scored on
        another one's without a word."""
        from detens.heads.deep import DeepEnsembleHead

        names = ensemble.gt.category_names
        first, second = ensemble.gt.category_ids[:2]
        foreign = max(names) + 1
        head = DeepEnsembleHead(ensemble.model_names, hidden=4, depth=1)
        head.label_space = {first: names[first], second: "pedestrian", foreign: "vehicle"}
        head.save(tmp_path / "custom.json")
        listed = ", ".join(f"{c} {n!r}" for c, n in sorted(names.items())[:5])
        caplog.set_level(logging.WARNING, logger="detens")
        cross_validate(ensemble, [f"head:{tmp_path / 'custom.json'}"], k=2, backend="faster")
        assert [r.getMessage() for r in caplog.records if r.name == "detens.heads"] == [  # once, not per fold
            f"head '{tmp_path / 'custom.json'}' was fitted on another label space than the ground truth, whose "
            f"categories are {listed}, ... ({len(names)} in all): {second} is 'pedestrian' in the head but "
            f"{names[second]!r} there, {foreign} is 'vehicle' in the head and no category there; it has no "
            "per-class parameters, so it applies as it is, every class alike: fine if it was meant to carry over "
            "to these classes, else fit one on this label space (detens cache, detens train)"]
        caplog.clear()
        head.label_space = dict(names)
        head.save(tmp_path / "own.json")
        cross_validate(ensemble, [f"head:{tmp_path / 'own.json'}"], k=2, backend="faster")
        assert [r for r in caplog.records if r.name == "detens.heads"] == []

    def test_fit_head_records_the_ground_truths_label_space(self, ensemble, tmp_path):
        config = ThetaTrainConfig(epochs=1, per_class=True, match_iou_grid=[])
        head, _, _ = fit_head("theta", ensemble, ensemble.gt.annotated_image_ids, config)
        assert head.label_space == ensemble.gt.category_names
        head.save(tmp_path / "head.safetensors")
        assert load_head(tmp_path / "head.safetensors").label_space == ensemble.gt.category_names
        method = build_method(f"head:{tmp_path / 'head.safetensors'}", ensemble.model_names)
        method.check_data(EvaluationData(ensemble))

    def test_unknown_method(self, ensemble):
        with pytest.raises(ValueError, match="unknown evaluation method 'wbf_tunned'.*Did you mean 'wbf_tuned'"):
            cross_validate(ensemble, ["wbf_tunned"])


ONE_GRID_POINT = {"wbf_tuned": {"iou_grid": [0.5], "conf_types": ["avg"], "weight_values": [1.0]}}


def tuned_wbf_fits(monkeypatch) -> list[list[int]]:
    """The image ids each ``wbf_tuned`` fit from now on is given, one list per fit."""
    seen = []
    original = TunedWBF.fit

    def spy(self, data, train_ids):
        seen.append(list(train_ids))
        original(self, data, train_ids)

    monkeypatch.setattr(TunedWBF, "fit", spy)
    return seen


def _split_dataset(gt_path, predictions, tmp_path, reverse_models=False, drop_category=False, same_ids=False,
                   share_one=False):
    """The 12-image slice split into an evaluated half and an extra half, each its own files. ``share_one``:
    the extra half also holds the evaluated half's first image, under another id and in a folder.
    ``reverse_models``: the extra half's members are loaded in the reverse of the evaluated half's order
    (``from_folder`` lists a folder's files by name), so that matching them by name has work to do."""
    full = json.loads(Path(gt_path).read_text())
    ids = sorted(im["id"] for im in full["images"])
    halves = {"evaluated": set(ids[:6]), "extra": set(ids[6:]) | ({ids[0]} if share_one else set())}
    out = {}
    for part, keep in halves.items():
        folder = tmp_path / part
        (folder / "predictions").mkdir(parents=True)
        id_map = {i: i for i in keep}
        if part == "extra" and same_ids:  # the extra images reuse the evaluated images' ids
            id_map = dict(zip(sorted(keep), ids[:6], strict=True))
        if part == "extra" and share_one:
            id_map[ids[0]] = 10**9
        data = {
            "images": [{**im, "id": id_map[im["id"]]} for im in full["images"] if im["id"] in keep],
            "annotations": [{**a, "image_id": id_map[a["image_id"]]} for a in full["annotations"]
                            if a["image_id"] in keep],
            "categories": full["categories"][1:] if part == "extra" and drop_category else full["categories"],
        }
        if part == "extra" and drop_category:
            data["annotations"] = [a for a in data["annotations"] if a["category_id"] != full["categories"][0]["id"]]
        if part == "extra" and share_one:
            for image in data["images"]:
                if image["id"] == 10**9:
                    image["file_name"] = "val2017/" + image["file_name"]
        (folder / "instances.json").write_text(json.dumps(data))
        for name in MODELS:
            results = [{**r, "image_id": id_map[r["image_id"]]} for r in json.loads((predictions / f"{name}.json").read_text())
                       if r["image_id"] in keep]
            if part == "extra" and drop_category:
                results = [r for r in results if r["category_id"] != full["categories"][0]["id"]]
            (folder / "predictions" / f"{name}.json").write_text(json.dumps(results))
        models = sorted(MODELS)[::-1] if part == "extra" and reverse_models else None  # None: sorted by name
        out[part] = EnsemblePredictions.from_folder(folder / "predictions", load_coco_gt(folder / "instances.json"),
                                                    models=models)
    return out["evaluated"], out["extra"]


def _without_annotation_ids(folder):
    """The predictions of a folder of _split_dataset, its annotation file rewritten without annotation ids."""
    annotations = json.loads((folder / "instances.json").read_text())
    for ann in annotations["annotations"]:
        del ann["id"]
    (folder / "instances.json").write_text(json.dumps(annotations))
    return EnsemblePredictions.from_folder(folder / "predictions", load_coco_gt(folder / "instances.json"))


class TestExtraFittingData:
    def test_join_keeps_both_and_renumbers_colliding_ids(self, dataset, tmp_path):
        evaluated, extra = _split_dataset(*dataset, tmp_path, reverse_models=True, same_ids=True)
        assert evaluated.model_names == ["blurry", "noisy", "sharp"]
        assert extra.model_names == ["sharp", "noisy", "blurry"]  # the order join_predictions must undo
        joined, extra_ids = join_predictions(evaluated, extra)
        assert joined.model_names == evaluated.model_names
        assert not set(extra_ids) & set(evaluated.gt.image_ids)
        assert sorted(joined.gt.image_ids) == sorted(evaluated.gt.image_ids + extra_ids)
        annotation_ids = [a["id"] for a in joined.gt.dataset["annotations"]]
        assert len(set(annotation_ids)) == len(annotation_ids)
        # every extra image keeps its boxes, its ground truth and its models by name
        for old, new in zip(extra.gt.annotated_image_ids, extra_ids, strict=True):
            for mine, theirs in zip(joined.per_model(new), extra.select(evaluated.model_names).per_model(old), strict=True):
                assert mine.source == theirs.source
                torch.testing.assert_close(mine.boxes, theirs.boxes)
                torch.testing.assert_close(mine.scores, theirs.scores)
            for mine, theirs in zip(joined.gt.targets(new), extra.gt.targets(old), strict=True):
                torch.testing.assert_close(mine, theirs)
        for image_id in evaluated.gt.image_ids:
            assert [len(d) for d in joined.per_model(image_id)] == [len(d) for d in evaluated.per_model(image_id)]
        # the same join as with the extra members listed in the evaluated order
        in_order = EnsemblePredictions.from_folder(tmp_path / "extra" / "predictions", extra.gt)
        assert in_order.model_names == evaluated.model_names
        same, same_ids = join_predictions(evaluated, in_order)
        assert same_ids == extra_ids and same.model_names == joined.model_names
        for image_id in joined.gt.image_ids:
            for mine, theirs in zip(joined.per_model(image_id), same.per_model(image_id), strict=True):
                assert mine.source == theirs.source
                assert torch.equal(mine.boxes, theirs.boxes) and torch.equal(mine.scores, theirs.scores)
                assert torch.equal(mine.labels, theirs.labels)

    def test_join_numbers_annotations_without_ids(self, dataset, tmp_path):
        _split_dataset(*dataset, tmp_path)
        halves = [_without_annotation_ids(tmp_path / part) for part in ("evaluated", "extra")]
        joined, extra_ids = join_predictions(*halves)
        ids = [a["id"] for a in joined.gt.dataset["annotations"]]
        assert len(set(ids)) == len(ids) == sum(len(half.gt.dataset["annotations"]) for half in halves)
        for old, new in zip(halves[1].gt.annotated_image_ids, extra_ids, strict=True):
            for mine, theirs in zip(joined.gt.targets(new), halves[1].gt.targets(old), strict=True):
                torch.testing.assert_close(mine, theirs)

    def test_join_refuses_other_categories_or_missing_models(self, dataset, tmp_path):
        evaluated, extra = _split_dataset(*dataset, tmp_path, drop_category=True)
        with pytest.raises(ValueError, match="other categories than the evaluated data"):
            join_predictions(evaluated, extra)
        evaluated, extra = _split_dataset(*dataset, tmp_path / "b")
        with pytest.raises(ValueError, match=r"no predictions of \['noisy'\]"):
            join_predictions(evaluated, extra.select(["sharp", "blurry"]))
        # the same ids, named otherwise: another label space numbered alike
        renamed = json.loads((tmp_path / "b" / "extra" / "instances.json").read_text())
        first = renamed["categories"][0]
        first["name"] = "not_" + first["name"]
        other = EnsemblePredictions.from_folder(tmp_path / "b" / "extra" / "predictions", load_coco_gt(renamed))
        shown = f"{first['id']} is {first['name'].removeprefix('not_')!r} in the evaluated data but {first['name']!r} in the extra fitting data"
        with pytest.raises(ValueError, match=rf"names 1 category ids otherwise than the evaluated data \({re.escape(shown)}\)"):
            join_predictions(evaluated, other)
        with pytest.raises(ValueError, match=r"^the fitting data names 1 category ids otherwise .* in the fitting data\)"):
            join_predictions(evaluated, other, what="the fitting data")
        # names spelled otherwise are the same classes, as the class maps and the cache's summary read them
        for category in renamed["categories"]:
            category["name"] = category["name"].removeprefix("not_").upper().replace(" ", "_")
        respelled = EnsemblePredictions.from_folder(tmp_path / "b" / "extra" / "predictions", load_coco_gt(renamed))
        assert join_predictions(evaluated, respelled)[1]

    def test_extra_images_join_every_fold_and_are_never_scored(self, dataset, tmp_path, monkeypatch):
        evaluated, extra = _split_dataset(*dataset, tmp_path)
        seen = tuned_wbf_fits(monkeypatch)
        options = ONE_GRID_POINT
        plain = cross_validate(evaluated, ["mean", "wbf_tuned"], k=2, backend="faster", method_options=options)
        joined = cross_validate(evaluated, ["mean", "wbf_tuned"], k=2, backend="faster", method_options=options,
                                fit_on=extra)
        untimed = [{k: v for k, v in r["mean"].metrics.items() if k != "fusion_ms"} for r in (plain, joined)]
        assert untimed[0] == untimed[1]  # fixed methods: the same images scored
        without, with_extra = seen[:2], seen[2:]
        assert [len(ids) for ids in with_extra] == [len(ids) + len(extra.gt.annotated_image_ids) for ids in without]
        for fold, train_ids in zip(kfold_image_splits(evaluated.gt.annotated_image_ids, 2, 0), with_extra, strict=True):
            assert not set(train_ids) & set(fold[1])

    def test_fit_on_one_dataset_and_score_another(self, dataset, tmp_path):
        evaluated, extra = _split_dataset(*dataset, tmp_path, reverse_models=True)
        assert extra.model_names == evaluated.model_names[::-1]  # fit_on's members matched by name
        options = {"iou_grid": [0.5, 0.7], "conf_types": ["avg", "max"], "weight_values": [1.0, 2.0]}
        report = cross_validate(evaluated, ["wbf_tuned"], k=0, backend="faster",
                                method_options={"wbf_tuned": options}, fit_on=extra)
        [fitted] = report["wbf_tuned"].fitted
        in_order = EnsemblePredictions.from_folder(tmp_path / "extra" / "predictions", extra.gt)
        assert in_order.model_names == evaluated.model_names
        same = cross_validate(evaluated, ["wbf_tuned"], k=0, backend="faster",
                              method_options={"wbf_tuned": options}, fit_on=in_order)
        [same_fitted] = same["wbf_tuned"].fitted
        assert {k: fitted[k] for k in ("iou_thr", "conf_type", "weights", "train_map")} == {
            k: same_fitted[k] for k in ("iou_thr", "conf_type", "weights", "train_map")}
        untimed = [{k: v for k, v in r["wbf_tuned"].metrics.items() if k != "fusion_ms"} for r in (report, same)]
        assert untimed[0] == untimed[1]  # the same fusion scored on the evaluated images
        direct = TunedWBF(evaluated.model_names, **options)
        ordered = extra.select(evaluated.model_names)
        direct.fit(EvaluationData(ordered), ordered.gt.annotated_image_ids)
        assert {k: fitted[k] for k in ("iou_thr", "conf_type", "weights")} == {
            k: direct.best[k] for k in ("iou_thr", "conf_type", "weights")}
        assert fitted["train_map"] == pytest.approx(direct.best["train_map"], abs=1e-9)

    @pytest.mark.parametrize("k", [2, 0])
    def test_fitting_data_holding_a_scored_image_is_refused(self, dataset, tmp_path, k):
        evaluated, extra = _split_dataset(*dataset, tmp_path, share_one=True)
        shared = evaluated.gt.file_name(evaluated.gt.image_ids[0])
        assert shared_images(evaluated, extra) == [shared]
        with pytest.raises(ValueError, match=(
                rf"shares 1 annotated image with the scored data \(same file name, folders aside: {shared}\); "
                "the fitting data must not contain scored images")):
            cross_validate(evaluated, ["mean"], k=k, backend="faster", fit_on=extra)
        with pytest.raises(ValueError, match=r"shares 6 annotated images .*: \S+\.jpg, (\S+\.jpg, ){4}\.\.\.\)"):
            cross_validate(evaluated, ["mean"], k=k, backend="faster", fit_on=evaluated)
        evaluated, extra = _split_dataset(*dataset, tmp_path / "apart")
        assert shared_images(evaluated, extra) == []
        cross_validate(evaluated, ["mean"], k=k, backend="faster", fit_on=extra)

    def test_images_without_a_file_name_cannot_be_compared_and_are_counted(self, dataset, tmp_path, caplog):
        evaluated, _ = _split_dataset(*dataset, tmp_path)
        annotations = json.loads((tmp_path / "extra" / "instances.json").read_text())
        for image in annotations["images"]:
            del image["file_name"]
        unnamed = EnsemblePredictions.from_folder(tmp_path / "extra" / "predictions", load_coco_gt(annotations))
        with caplog.at_level(logging.WARNING, logger="detens.predictions"):
            assert shared_images(evaluated, unnamed) == []
        assert "6 annotated images without a file_name: whether the two datasets share them cannot be checked" in caplog.text

    def test_no_cross_validation_needs_fitting_data_for_a_method_that_fits(self, ensemble):
        with pytest.raises(ValueError, match="k=0 .* needs fit_on"):
            cross_validate(ensemble, ["mean", "theta"], k=0)


def _cache_folder(predictions, folder, unreadable, summary=None):
    """A copy of the prediction folder with ``detens cache``'s summary: ``unreadable`` per member
    (``{member: {file_name: error}}``), or the ``summary`` given as it is."""
    shutil.copytree(predictions, folder)
    if summary is None:
        summary = {"gt_fingerprint": "0", "models": {
            name: {"status": "complete", "unreadable": unreadable.get(name, {})} for name in MODELS}}
    (folder / "cache_summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    return folder


def _without(predictions, gt, image_ids):
    """The predictions of a ground truth that never had ``image_ids``: what leaving them out must equal."""
    names = sorted(MODELS)
    kept = [i for i in gt.image_ids if i not in set(image_ids)]
    results = [[r for r in json.loads((predictions / f"{name}.json").read_text()) if r["image_id"] not in image_ids]
               for name in names]
    return EnsemblePredictions(names, results, gt.subset(kept))


class TestUnreadableImages:
    """Images the cache could not read (its summary lists them per member) are neither scored nor fitted on."""

    def test_left_out_for_every_model_and_scored_as_if_never_there(self, dataset, tmp_path, caplog):
        gt_path, predictions = dataset
        gt = load_coco_gt(gt_path)
        first, second = gt.annotated_image_ids[2], gt.annotated_image_ids[5]
        folder = _cache_folder(predictions, tmp_path / "cache", {
            "sharp": {gt.file_name(first): "cannot read image: corrupt"},
            "noisy": {gt.file_name(second): "cannot read image: truncated", "not_in_the_gt.jpg": "gone"},
            "blurry": {gt.file_name(second): "cannot read image: truncated"},
        })
        with caplog.at_level(logging.WARNING, logger="detens.predictions"):
            loaded = EnsemblePredictions.from_folder(folder, gt)
        assert [image.image_id for image in loaded.left_out] == [first, second]
        assert loaded.left_out[0] == LeftOutImage(first, gt.file_name(first), {"sharp": "cannot read image: corrupt"})
        # read by the other two models, yet left out: the ensemble never saw the image whole
        assert loaded.left_out[1].unreadable_by == {"blurry": "cannot read image: truncated",
                                                    "noisy": "cannot read image: truncated"}
        assert first not in loaded.gt.image_ids and second not in loaded.gt.annotated_image_ids
        assert len(loaded.gt) == len(gt) - 2 and len(gt) == 12  # the given ground truth is untouched
        [record] = [r for r in caplog.records if r.name == "detens.predictions"]
        message = record.getMessage()
        assert record.levelname == "WARNING" and "left out 2 images" in message and "neither scored nor fitted" in message
        assert f"{first} ({gt.file_name(first)}, unreadable by sharp)" in message
        assert f"{second} ({gt.file_name(second)}, unreadable by blurry, noisy)" in message

        reference = _without(predictions, gt, {first, second})
        options = {"wbf_tuned": {"iou_grid": [0.5], "conf_types": ["avg"], "weight_values": [1.0]}}
        report, expected = (cross_validate(p, ["single:sharp", "mean", "wbf_tuned"], k=2, backend="faster",
                                           method_options=options) for p in (loaded, reference))
        for method in expected:
            assert {k: v for k, v in report[method].metrics.items() if k != "fusion_ms"} == {
                k: v for k, v in expected[method].metrics.items() if k != "fusion_ms"}
        config = ThetaTrainConfig(epochs=3, match_iou_grid=[])
        head, _, _ = fit_head("theta", loaded, loaded.gt.annotated_image_ids, config)
        same, _, _ = fit_head("theta", reference, reference.gt.annotated_image_ids, config)
        assert torch.equal(head.theta, same.theta)
        with pytest.raises(KeyError, match=f"image_id {first} is not in the ground truth"):
            loaded.per_model(first)

    def test_only_the_chosen_models_count_and_the_choice_stays(self, dataset, tmp_path):
        gt_path, predictions = dataset
        gt = load_coco_gt(gt_path)
        image_id = gt.annotated_image_ids[0]
        folder = _cache_folder(predictions, tmp_path / "cache", {"sharp": {gt.file_name(image_id): "corrupt"}})
        assert EnsemblePredictions.from_folder(folder, gt, models=["blurry", "noisy"]).left_out == []
        loaded = EnsemblePredictions.from_folder(folder, gt)
        picked = loaded.select(["noisy", "blurry"])
        assert picked.left_out == loaded.left_out and image_id not in picked.gt.image_ids
        evaluated, extra = _split_dataset(gt_path, predictions, tmp_path / "split")
        joined, _ = join_predictions(loaded, extra)
        assert joined.left_out == loaded.left_out and image_id not in joined.gt.image_ids

    @pytest.mark.parametrize("summary", [
        None,  # no summary at all: results files of another tool
        {"models": {"sharp": {"status": "complete", "images": 12}}},  # a summary from before 'unreadable'
        {"models": {}},  # members the summary does not describe
    ])
    def test_caches_without_the_list_leave_nothing_out(self, dataset, tmp_path, summary):
        gt_path, predictions = dataset
        folder = tmp_path / "cache"
        shutil.copytree(predictions, folder)
        if summary is not None:
            (folder / "cache_summary.json").write_text(json.dumps(summary))
        loaded = EnsemblePredictions.from_folder(folder, load_coco_gt(gt_path))
        assert loaded.left_out == [] and len(loaded.gt) == 12

    def test_a_member_whose_last_cache_run_did_not_finish_is_warned_about(self, dataset, tmp_path, caplog):
        gt_path, predictions = dataset
        summary = {"models": {"sharp": {"status": "incomplete", "images_left": 5, "unreadable": {}},
                              "noisy": {"status": "complete", "unreadable": {}}}}
        folder = _cache_folder(predictions, tmp_path / "cache", {}, summary=summary)
        with caplog.at_level("WARNING", logger="detens.predictions"):
            EnsemblePredictions.from_folder(folder, load_coco_gt(gt_path))
        assert "the last cache run of 'sharp' did not finish (5 images left)" in caplog.text
        assert "'noisy'" not in caplog.text

    @pytest.mark.parametrize("summary, message", [
        ("{not json", r"cache_summary.json is not valid JSON"),
        ([1, 2], r"cache_summary.json is not a summary of detens cache"),
        ({"models": {"sharp": "done"}}, r"models\['sharp'\] must be an object"),
        ({"models": {"sharp": {"unreadable": ["a.jpg"]}}}, r"models\['sharp'\].unreadable must map file names"),
        # ids as text, shown as text: "got 1, 2" would not say what is wrong
        ({"models": {}, "image_ids": [1, "2"]}, r"image_ids must be a list of image ids, got \[1, '2'\]$"),
        ('{"models": {}, "models": {"sharp": {"unreadable": {"a.jpg": "corrupt"}}}}', r"has the key 'models' twice"),
    ])
    def test_a_broken_summary_is_named(self, dataset, tmp_path, summary, message):
        gt_path, predictions = dataset
        folder = _cache_folder(predictions, tmp_path / "cache", {}, summary=summary)
        with pytest.raises(ValueError, match=message):
            EnsemblePredictions.from_folder(folder, load_coco_gt(gt_path))

    def test_a_summary_that_is_a_pipe_is_refused_not_taken_for_none(self, dataset, tmp_path, capsys, named_pipe):
        """Taken for no summary, the images it lists as unreadable would be scored as found by no model."""
        gt_path, predictions = dataset
        folder = tmp_path / "cache"
        shutil.copytree(predictions, folder)
        pipe = named_pipe(folder / "cache_summary.json")
        message = f"cache summary {pipe} is not a regular file (a pipe); save its content to a file and give that file's path"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            EnsemblePredictions.from_folder(folder, load_coco_gt(gt_path))
        assert evaluate_cli.main(["--gt", str(gt_path), "--predictions", str(folder), "--methods", "mean", "--backend",
                                  "faster", "--out", str(tmp_path / "report.json"), "--quiet"]) == 2
        assert capsys.readouterr().err == f"error: {message}\n"

    def test_every_annotated_image_left_out_is_an_error(self, dataset, tmp_path):
        gt_path, predictions = dataset
        gt = load_coco_gt(gt_path)
        folder = _cache_folder(predictions, tmp_path / "cache", {
            "noisy": {gt.file_name(i): "corrupt" for i in gt.image_ids}})
        with pytest.raises(ValueError, match=r"every annotated image is left out: the cache could not read 12 images"):
            EnsemblePredictions.from_folder(folder, gt)

    @pytest.mark.parametrize("cv, seeds, fitting", [
        (2, [0], None),
        (2, [0, 1], None),
        (2, [0], "--also-fit-on"),
        (2, [0, 1], "--also-fit-on"),
        (0, [0], "--fit-on"),
    ])
    def test_evaluate_records_the_images_left_out_in_every_mode(self, dataset, tmp_path, cv, seeds, fitting):
        evaluated, extra = _split_dataset(*dataset, tmp_path / "split")
        left_out = {}
        for part, data in (("evaluated", evaluated), ("extra", extra)):
            image_id = data.gt.annotated_image_ids[1]
            left_out[part] = {"image_id": image_id, "file_name": data.gt.file_name(image_id),
                              "unreadable_by": {"noisy": "cannot read image: corrupt"}}
            _cache_folder(tmp_path / "split" / part / "predictions", tmp_path / part,
                          {"noisy": {data.gt.file_name(image_id): "cannot read image: corrupt"}})
        extra_gt = tmp_path / "split" / "extra" / "instances.json"
        out = tmp_path / "report.json"
        assert evaluate_cli.main([
            "--gt", str(tmp_path / "split" / "evaluated" / "instances.json"), "--predictions", str(tmp_path / "evaluated"),
            "--methods", "mean", "--cv", str(cv), "--seed", ",".join(map(str, seeds)), "--backend", "faster",
            "--out", str(out), "--quiet", *([fitting, str(extra_gt), str(tmp_path / "extra")] if fitting else []),
        ]) == 0
        run = tmp_path / "report.run.json"
        # one cross-validation has its record; several seeds, which have none, say how the run was made
        assert record_path(out).exists() == (len(seeds) == 1) and run.exists() == (len(seeds) > 1)
        meta = EvaluationRecord.load(out).meta if len(seeds) == 1 else json.loads(run.read_text())
        assert meta["left_out"] == [left_out["evaluated"]] and meta["scored_images"] == 5
        assert meta["fit_on"] == (None if fitting is None else {
            "gt": str(extra_gt.resolve()), "predictions": str((tmp_path / "extra").resolve()), "images": 5,
            "mode": "the only fitting data" if fitting == "--fit-on" else "joined to every fold's fitting side",
            "left_out": [left_out["extra"]]})
        scored = [i for i in evaluated.gt.annotated_image_ids if i != left_out["evaluated"]["image_id"]]
        folds = {seed: [len(test) for _, test in kfold_image_splits(scored, cv, seed)] if cv else [] for seed in seeds}
        if len(seeds) == 1:
            assert meta["seed"] == seeds[0] and meta["folds"] == folds[seeds[0]]
        else:
            assert meta["seeds"] == seeds and meta["folds_by_seed"] == {str(seed): folds[seed] for seed in seeds}

    def test_bad_unreadable_argument(self, dataset):
        gt_path, predictions = dataset
        gt = load_coco_gt(gt_path)
        results = [json.loads((predictions / f"{name}.json").read_text()) for name in MODELS]
        with pytest.raises(ValueError, match=r"unreadable names models \['other'\]"):
            EnsemblePredictions(list(MODELS), results, gt, unreadable={"other": {}})
        with pytest.raises(TypeError, match=r"unreadable\['sharp'\] must map file names to error messages"):
            EnsemblePredictions(list(MODELS), results, gt, unreadable={"sharp": ["a.jpg"]})
        with pytest.raises(TypeError, match="unreadable must map model names"):
            EnsemblePredictions(list(MODELS), results, gt, unreadable=["sharp"])


class TestTools:
    def test_train_cli_writes_a_loadable_head_and_is_deterministic(self, dataset, tmp_path):
        gt_path, predictions = dataset
        outs = []
        for run in ("a", "b"):
            out = tmp_path / run / "head.json"
            assert train_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--out", str(out),
                                   "--epochs", "10", "--set", "match_iou_grid=[]", "--quiet"]) == 0
            outs.append(out)
        assert outs[0].read_bytes() == outs[1].read_bytes()
        head = load_head(outs[0])
        assert head.model_names == sorted(MODELS)
        log = json.loads((outs[0].parent / "head.json.log.json").read_text())
        assert len(log["loss"]) == 10 and log["models"] == sorted(MODELS)
        assert (outs[0].parent / "head.json.loss.png").stat().st_size > 1000
        assert "normalize_box: true" in (outs[0].parent / "head.json.config.yaml").read_text()

    def test_train_cli_writes_the_head_where_out_names_it_with_or_without_a_tilde(self, dataset, tmp_path,
                                                                                   monkeypatch):
        """``--out=~/...`` is under the home folder (the shell leaves ``~`` after ``=``); ``./~/...`` is a folder
        named ``~``, where the run reads back the head it staged there, never the home folder's file."""
        gt_path, predictions = dataset
        home, work = tmp_path / "home", tmp_path / "work"
        home.mkdir()
        work.mkdir()
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.chdir(work)
        base = ["--gt", str(gt_path), "--predictions", str(predictions), "--epochs", "2", "--set", "match_iou_grid=[]",
                "--quiet"]
        assert train_cli.main([*base, "--out=~/heads/head.json"]) == 0
        assert load_head(home / "heads" / "head.json").model_names == sorted(MODELS)
        assert not (work / "~").exists()
        assert train_cli.main([*base, "--out", "./~/heads/head.json"]) == 0
        assert load_head(work / "~" / "heads" / "head.json").model_names == sorted(MODELS)
        assert sorted(p.name for p in (work / "~" / "heads").iterdir()) == sorted(
            p.name for p in (home / "heads").iterdir())

    @pytest.mark.parametrize("given", ["--gt", "--config", "--images-from", "a prediction file"])
    def test_train_cli_names_a_pipe_given_for_an_input_as_no_regular_file(self, dataset, tmp_path, capsys, named_pipe,
                                                                           given):
        """``--gt <(cat gt.json)`` is a pipe, which the run would read more than once: it is there, and the
        message says what it is instead of 'not found'."""
        gt_path, predictions = dataset
        pipe = named_pipe(tmp_path / "pipe")
        args = {"--gt": str(gt_path), "--predictions": str(predictions), "--out": str(tmp_path / "head.json")}
        what = {"--gt": "COCO annotation file", "--config": "training config", "--images-from": "--images-from",
                "a prediction file": "COCO results file"}[given]
        if given == "a prediction file":
            shutil.copytree(predictions, tmp_path / "predictions")
            pipe = named_pipe(tmp_path / "predictions" / "piped.json")
            args["--predictions"] = str(tmp_path / "predictions")
        else:
            args[given] = str(pipe)
        assert train_cli.main([*(word for pair in args.items() for word in pair), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: {what} {pipe} is not a regular file (a pipe); save its content to a file and give "
                       "that file's path\n"), err

    def test_train_cli_refuses_an_out_that_another_train_is_writing(self, dataset, tmp_path, capsys,
                                                                     lock_in_another_process):
        """Both would fit, and the last to finish would replace the other's head without a word; another --out
        in the same folder is another run's."""
        gt_path, predictions = dataset
        out = tmp_path / "head.json"
        holder = lock_in_another_process(tmp_path, ".head.json.detens.lock", "detens train")
        base = ["--gt", str(gt_path), "--predictions", str(predictions), "--epochs", "2", "--set", "match_iou_grid=[]",
                "--quiet"]
        assert train_cli.main([*base, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert re.fullmatch(rf"error: --out {re.escape(str(out))} is being written by detens train \(pid "
                            rf"{holder.pid} on .*\); two runs writing one output would spoil each other's "
                            r"results: wait for it to end, or give another output\n", err), err
        assert not out.exists()
        assert train_cli.main([*base, "--out", str(tmp_path / "other.json")]) == 0
        holder.kill()
        holder.wait()
        assert train_cli.main([*base, "--out", str(out)]) == 0
        assert sorted(p.name for p in tmp_path.glob(".*lock")) == []  # let go of at the end

    def test_train_cli_calibration_has_no_loss_curve(self, dataset, tmp_path):
        gt_path, predictions = dataset
        out = tmp_path / "calibration.json"
        out.with_name(out.name + ".loss.png").write_bytes(b"an earlier head's curve")
        assert train_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--head", "calibration",
                               "--out", str(out), "--quiet"]) == 0
        assert load_head(out).type_name == "calibration"
        assert not out.with_name(out.name + ".loss.png").exists()
        assert out.with_name(out.name + ".log").read_text() == "no epochs: a calibration head is fitted without gradient steps\n"
        assert json.loads(out.with_name(out.name + ".log.json").read_text())["loss"] == []

    @pytest.mark.parametrize("head", ["theta", "calibration"])
    def test_a_ctrl_c_while_the_head_is_written_waits_for_all_its_files(self, dataset, tmp_path, capfd,
                                                                        monkeypatch, head, real_signals_handled):
        """A Ctrl-C that comes while the head and its files are written (a real SIGINT, as the .log is) is held
        until they all are: no earlier run's file is left beside the new head, and none is missing; the run
        then ends as interrupted, saying it finished."""
        import signal

        from detens.jobs import train as train_job

        gt_path, predictions = dataset
        out = tmp_path / "head.json"
        beside = {suffix: out.with_name(out.name + suffix) for suffix in (".config.yaml", ".loss.png", ".log",
                                                                          ".log.json")}
        for path in (out, *beside.values()):
            path.write_text("an earlier run's")
        real_write = train_job.atomic_write_text

        def ctrl_c_then_write(*args, **kwargs):
            signal.raise_signal(signal.SIGINT)
            return real_write(*args, **kwargs)

        monkeypatch.setattr(train_job, "atomic_write_text", ctrl_c_then_write)
        args = ["--gt", str(gt_path), "--predictions", str(predictions), "--head", head, "--out", str(out), "--quiet"]
        assert train_cli.main([*args, *(["--epochs", "2", "--set", "match_iou_grid=[]"] if head == "theta" else [])]) == 130
        assert load_head(out).type_name == head
        log = json.loads(beside[".log.json"].read_text())
        assert log["head"] == head and log["images"] == len(load_coco_gt(gt_path).annotated_image_ids)
        assert beside[".log"].read_text().endswith("\n") and "earlier" not in beside[".log"].read_text()
        assert "earlier" not in beside[".config.yaml"].read_text()
        if head == "theta":
            assert beside[".loss.png"].read_bytes().startswith(b"\x89PNG")
        else:  # fitted without epochs: no curve, and the earlier one gone
            assert not beside[".loss.png"].exists()
        err = capfd.readouterr().err  # --quiet: sys.stderr is a copy of fd 2
        files = ".config.yaml, .loss.png, .log and .log.json" if head == "theta" else ".config.yaml, .log and .log.json"
        assert (f"interrupted while the head was written: the run finished first; {out} and its {files} files are "
                "all this run's") in err and err.endswith("error: interrupted\n"), err

    def test_a_failed_write_leaves_the_earlier_head_and_its_files(self, dataset, tmp_path, monkeypatch, capsys):
        """A full disk while the head's files are written: the earlier head keeps every file of its own,
        none of the new run's is left beside it, and the command names the file it could not write."""
        from detens.jobs import train as train_job

        gt_path, predictions = dataset
        out = tmp_path / "head.json"
        earlier = {path: f"an earlier run's {path.name}" for path in (out, *(
            out.with_name(out.name + suffix) for suffix in (".config.yaml", ".loss.png", ".log", ".log.json")))}
        for path, text in earlier.items():
            path.write_text(text)
        real_write = train_job.atomic_write_json

        def disk_full(path, *args, **kwargs):
            if Path(path).name == "head.json.log.json":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return real_write(path, *args, **kwargs)

        monkeypatch.setattr(train_job, "atomic_write_json", disk_full)
        args = ["--gt", str(gt_path), "--predictions", str(predictions), "--head", "calibration", "--out", str(out)]
        assert train_cli.main([*args, "--quiet"]) == 2
        assert {path: path.read_text() for path in earlier} == earlier
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in earlier)  # no stage left
        err = capsys.readouterr().err
        assert f"No space left on device: {str(out) + '.log.json'!r}" in err, err  # the file, not its stage

    def test_train_cli_shows_no_epoch_bar_for_a_head_without_epochs(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        args = ["--gt", str(gt_path), "--predictions", str(predictions), "--out", str(tmp_path / "head.json")]
        assert train_cli.main([*args, "--head", "calibration"]) == 0
        assert "calibration fit:" not in capsys.readouterr().err  # tqdm's "calibration fit: 0epoch [00:00, ?epoch/s]"
        assert train_cli.main([*args, "--head", "theta", "--epochs", "2"]) == 0
        assert "theta fit: 100%" in capsys.readouterr().err  # the bar of a head that has epochs

    @pytest.mark.parametrize("flag, value", [("--epochs", "3"), ("--lr", "0.1"), ("--seed", "1")])
    def test_train_cli_names_a_flag_the_head_type_lacks(self, dataset, tmp_path, capsys, flag, value):
        gt_path, predictions = dataset
        out = tmp_path / "calibration.json"
        code = train_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--head", "calibration",
                               "--out", str(out), "--quiet", flag, value])
        err = capsys.readouterr().err
        assert code == 2 and err.count("error:") == 1 and "Traceback" not in err and not out.exists()
        assert f"{flag}: a calibration head has no {flag[2:]} option; its training options are fuser_params" in err
        assert "--set" not in err

    @pytest.mark.parametrize("value", ["nan", "inf"])
    def test_train_cli_names_lr_for_a_learning_rate_that_is_not_finite(self, dataset, tmp_path, capsys, value):
        gt_path, predictions = dataset
        out = tmp_path / "head.json"
        with pytest.raises(SystemExit) as stop:
            train_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--out", str(out), "--lr", value])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and not out.exists()
        assert err == f"error: detens train: argument --lr: expected a finite number, got '{value}' (see detens train --help)\n"

    def test_train_cli_images_from_and_errors(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        ids = load_coco_gt(gt_path).annotated_image_ids
        listing = tmp_path / "ids.txt"
        listing.write_text("# training fold\n" + "\n".join(map(str, ids[:5])) + "\n")
        out = tmp_path / "head.safetensors"
        args = ["--gt", str(gt_path), "--predictions", str(predictions), "--epochs", "3", "--quiet",
                "--set", "match_iou_grid=[]"]
        assert train_cli.main(args + ["--out", str(out), "--images-from", str(listing)]) == 0
        assert load_head(out).num_models == 3
        log = json.loads((out.parent / "head.safetensors.log.json").read_text())
        assert (out.parent / "head.safetensors.log").read_text().splitlines() == ["fit 1"] + [
            f"epoch {e} loss {loss:.6f}" for e, loss in enumerate(log["loss"], 1)
        ]
        assert log["train_seconds"] > 0
        # a search over matching IoUs runs one fit per IoU: the .log heads each; log.json keeps the chosen one
        searched = tmp_path / "searched.json"
        assert train_cli.main([*args[:-2], "--set", "match_iou_grid=[0.6, 0.7]", "--epochs", "2", "--out",
                               str(searched), "--images-from", str(listing)]) == 0
        lines = (tmp_path / "searched.json.log").read_text().splitlines()
        assert [line for line in lines if line.startswith("fit")] == ["fit 1", "fit 2"] and len(lines) == 6
        assert len(json.loads((tmp_path / "searched.json.log.json").read_text())["loss"]) == 2
        listing.write_text("999999999\n")
        assert train_cli.main(args + ["--out", str(out), "--images-from", str(listing)]) == 2
        assert "not in" in capsys.readouterr().err
        for missing in (tmp_path / "nope.txt", tmp_path):
            assert train_cli.main(args + ["--out", str(out), "--images-from", str(missing)]) == 2
            assert capsys.readouterr().err == (f"error: detens train: --images-from: no such file: {missing} "
                                               "(one image id per line) (see detens train --help)\n")
        assert train_cli.main(args + ["--out", str(out), "--set", "epoch=3"]) == 2
        assert "unknown key 'epoch'" in capsys.readouterr().err
        with pytest.raises(ValueError, match="unknown key 'epoch'"):  # --debug: the exception itself
            train_cli.main(args + ["--out", str(out), "--set", "epoch=3", "--debug"])

    @pytest.mark.parametrize("command, target", [
        ("train", "gt"), ("train", "member"), ("train", "member left out"), ("train", "prediction folder"),
        ("evaluate", "gt"), ("evaluate", "member"), ("evaluate", "member left out"), ("evaluate", "prediction folder"),
    ])
    def test_an_output_over_an_input_is_refused_before_the_run(self, dataset, tmp_path, capsys, command, target):
        """A new .json file in a prediction folder is an input too: every later run would read it as a
        member's predictions."""
        gt_path, predictions = dataset
        shutil.copy(gt_path, tmp_path / "instances.json")
        shutil.copytree(predictions, tmp_path / "predictions")
        out = {"gt": tmp_path / "instances.json", "member": tmp_path / "predictions" / "sharp.json",
               "member left out": tmp_path / "predictions" / "noisy.json",
               "prediction folder": tmp_path / "predictions" / "results.json"}[target]
        before = {path: path.read_bytes() for path in [tmp_path / "instances.json", *(tmp_path / "predictions").iterdir()]}
        args = ["--gt", str(tmp_path / "instances.json"), "--predictions", str(tmp_path / "predictions"),
                "--models", "sharp,blurry", "--out", str(out), "--quiet"]
        if command == "train":
            code = train_cli.main([*args, "--head", "calibration"])
        else:
            code = evaluate_cli.main([*args, "--methods", "mean", "--backend", "faster"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("error:") == 1 and "Traceback" not in err, err
        if target == "prediction folder":
            assert (f"--out {out} would be written into the prediction folder of --predictions, where every .json "
                    "file is read as a member's predictions; give it another folder") in err, err
        else:
            named = "--gt" if target == "gt" else f"{out.name} in --predictions"
            assert f"--out {out} is {named}: the run would write over its own input" in err, err
        assert {path: path.read_bytes() for path in before} == before
        assert sorted(tmp_path.rglob("*")) == sorted([*before, tmp_path / "predictions"])

    def test_evaluate_refuses_a_report_page_in_a_prediction_folder(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        shutil.copytree(predictions, tmp_path / "predictions")
        code = evaluate_cli.main(["--gt", str(gt_path), "--predictions", str(tmp_path / "predictions"),
                                  "--methods", "mean", "--quiet", "--out", str(tmp_path / "report.json"),
                                  "--report", str(tmp_path / "predictions")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("error:") == 1, err
        assert (f"the report page's numbers {tmp_path / 'predictions' / 'page.json'} would be written into the "
                "prediction folder of --predictions") in err, err
        assert sorted(p.name for p in tmp_path.rglob("*")) == ["blurry.json", "noisy.json", "predictions", "sharp.json"]

    @pytest.mark.parametrize("flags, expected", [
        (["--out", "{tmp}/report.json", "--plot", "{tmp}/report.json"], "--plot and --out"),
        (["--out", "{tmp}/report.json", "--plot", "{tmp}/a.png", "--reliability", "{tmp}/a.png"],
         "--reliability and --plot"),
        (["--out", "{tmp}/report.evaluation.json.gz"], "the record and --out"),
        (["--out", "{tmp}/report.json", "--reliability", "{tmp}/report.fitted.json"],
         "--reliability and the .fitted.json file"),
    ], ids=["plot over the table", "reliability over the plot", "table over its record", "over the fits"])
    def test_evaluate_refuses_two_outputs_on_one_file(self, dataset, tmp_path, capsys, flags, expected):
        gt_path, predictions = dataset
        code = evaluate_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--methods", "mean",
                                  "--quiet", *(flag.format(tmp=tmp_path) for flag in flags)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("error:") == 1 and "Traceback" not in err, err
        assert f"{expected} would both be written to {tmp_path}" in err, err
        assert not any(tmp_path.iterdir())

    def test_train_cli_refuses_an_image_listed_twice(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        ids = load_coco_gt(gt_path).annotated_image_ids
        listing = tmp_path / "ids.txt"
        listing.write_text(f"{ids[0]}\n{ids[1]}  # fold 1\n\n{ids[2]}\n{ids[1]}\n{ids[0]}\n")
        out = tmp_path / "head.json"
        code = train_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--epochs", "1", "--quiet",
                               "--out", str(out), "--images-from", str(listing)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("error:") == 1 and "Traceback" not in err
        assert f"lists image ids more than once: {min(ids[:2])} (lines " in err
        assert f"{ids[0]} (lines 1, 6)" in err and f"{ids[1]} (lines 2, 5)" in err
        assert not out.exists()

    def test_train_cli_names_an_image_list_that_is_not_text(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        listing = tmp_path / "ids.txt"
        listing.write_bytes(b"\xff\xd8\xff\xe0 a JPEG given by mistake")
        out = tmp_path / "head.json"
        code = train_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--head", "calibration",
                               "--quiet", "--out", str(out), "--images-from", str(listing)])
        err = capsys.readouterr().err
        assert code == 2 and not out.exists()
        assert err == f"error: {listing} is not a text file of image ids, one per line (invalid start byte at byte 0)\n"

    def test_train_cli_reads_an_image_list_saved_with_a_byte_order_mark(self, dataset, tmp_path, capsys):
        """As Windows editors save UTF-8 text: the mark is not part of the first id."""
        gt_path, predictions = dataset
        ids = load_coco_gt(gt_path).annotated_image_ids
        listing = tmp_path / "ids.txt"
        listing.write_bytes(codecs.BOM_UTF8 + "\r\n".join(map(str, ids[:4])).encode("utf-8"))
        out = tmp_path / "head.json"
        args = ["--gt", str(gt_path), "--predictions", str(predictions), "--head", "calibration", "--quiet",
                "--out", str(out), "--images-from", str(listing)]
        assert train_cli.main(args) == 0, capsys.readouterr().err
        assert json.loads(out.with_name(out.name + ".log.json").read_text())["images"] == 4
        # a byte that is no UTF-8 is named at its place in the file, the mark counted
        listing.write_bytes(codecs.BOM_UTF8 + b"12\xff")
        assert train_cli.main(args) == 2
        err = capsys.readouterr().err
        assert err == f"error: {listing} is not a text file of image ids, one per line (invalid start byte at byte 5)\n"

    def test_train_cli_refuses_extra_data_that_holds_a_training_image(self, dataset, tmp_path, capsys):
        evaluated, _ = _split_dataset(*dataset, tmp_path, share_one=True)
        shared_id = evaluated.gt.image_ids[0]
        out = tmp_path / "head.json"
        base = ["--gt", str(tmp_path / "evaluated" / "instances.json"), "--predictions",
                str(tmp_path / "evaluated" / "predictions"), "--epochs", "1", "--quiet", "--out", str(out),
                "--also-fit-on", str(tmp_path / "extra" / "instances.json"), str(tmp_path / "extra" / "predictions")]
        code = train_cli.main(base)
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and not out.exists()
        assert err.startswith(
            "error: --also-fit-on's data shares 1 annotated image with the training images of --gt (same file "
            f"name, folders aside: {evaluated.gt.file_name(shared_id)}); each image must be trained on once")
        # trained on once when --images-from leaves the shared image out of --gt's training images
        listing = tmp_path / "ids.txt"
        listing.write_text("\n".join(str(i) for i in evaluated.gt.annotated_image_ids if i != shared_id))
        assert train_cli.main([*base, "--images-from", str(listing)]) == 0
        assert json.loads(out.with_name(out.name + ".log.json").read_text())["images"] == 5 + 7

    def test_a_trained_head_scored_on_its_own_training_images_is_said_to_be_no_held_out_figure(
        self, dataset, tmp_path, capfd
    ):
        """train lists the images it fitted on (by file name, folders aside) beside the head; head:PATH warns
        when it scores them, and says nothing on other images."""
        evaluated, extra = _split_dataset(*dataset, tmp_path, share_one=True)
        out = tmp_path / "head.json"
        assert train_cli.main(["--gt", str(tmp_path / "extra" / "instances.json"), "--predictions",
                               str(tmp_path / "extra" / "predictions"), "--epochs", "1", "--quiet",
                               "--out", str(out)]) == 0
        trained_on = json.loads(out.with_name(out.name + ".log.json").read_text())["trained_on"]
        shared_name = evaluated.gt.file_name(evaluated.gt.image_ids[0])
        assert trained_on == sorted(Path(extra.gt.file_name(i)).name for i in extra.gt.annotated_image_ids)
        assert shared_name in trained_on and len(trained_on) == 7

        def evaluate(part, method):
            capfd.readouterr()  # --quiet: sys.stderr is a copy of fd 2
            assert evaluate_cli.main(["--gt", str(tmp_path / part / "instances.json"), "--predictions",
                                      str(tmp_path / part / "predictions"), "--methods", method, "--cv", "2",
                                      "--backend", "faster", "--quiet", "--out", str(tmp_path / f"{part}.json")]) == 0
            return [line.removeprefix("WARNING detens.evaluation: ") for line in capfd.readouterr().err.splitlines()
                    if line.startswith("WARNING")]

        assert evaluate("extra", f"head:{out}") == [
            f"head:{out} shares 7 images with the images scored here (same file name, folders aside: "
            f"{', '.join(trained_on[:5])}, ...), so its row scores images it was fitted on: it is not a held-out "
            "figure"]
        assert evaluate("evaluated", f"head:{out}") == [
            f"head:{out} shares 1 image with the images scored here (same file name, folders aside: {shared_name}), "
            "so its row scores images it was fitted on: it is not a held-out figure"]
        log = out.with_name(out.name + ".log.json")
        assert json.loads(log.read_text())["head_sha256"] == head_digest(read_head_file(out))
        # a head file replaced since its log was written (copied over, or a run killed among its moves) is
        # not credited with the log's images
        other = tmp_path / "other.json"
        assert train_cli.main(["--gt", str(tmp_path / "evaluated" / "instances.json"), "--predictions",
                               str(tmp_path / "evaluated" / "predictions"), "--epochs", "1", "--quiet",
                               "--out", str(other)]) == 0
        trained = out.read_bytes()
        out.write_bytes(other.read_bytes())
        assert evaluate("extra", f"head:{out}") == [
            f"WARNING detens.heads._io: {str(log)!r} was written for another head than {str(out)!r} (its "
            "head_sha256 differs: the head file was replaced after it): the images this head was fitted on are "
            "not known, so scoring them is not warned of"]
        out.write_bytes(trained)
        # a head whose log does not list its images (an earlier version's, or saved from Python) is taken as is
        log.write_text(json.dumps({k: v for k, v in json.loads(log.read_text()).items() if k != "trained_on"}))
        assert evaluate("extra", f"head:{out}") == []
        log.write_text(json.dumps({"trained_on": "a.jpg"}))
        assert evaluate_cli.main(["--gt", str(tmp_path / "extra" / "instances.json"), "--predictions",
                                  str(tmp_path / "extra" / "predictions"), "--methods", f"head:{out}", "--cv", "2",
                                  "--quiet", "--out", str(tmp_path / "bad.json")]) == 2
        assert capfd.readouterr().err == f"error: {str(log)!r}: trained_on must be a list of image file names\n"

    def test_train_and_evaluate_cli_leave_out_unreadable_images(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        gt = load_coco_gt(gt_path)
        bad = gt.annotated_image_ids[3]
        folder = _cache_folder(predictions, tmp_path / "cache", {"blurry": {gt.file_name(bad): "corrupt"}})
        base = ["--gt", str(gt_path), "--predictions", str(folder)]
        out = tmp_path / "head.json"
        assert train_cli.main(base + ["--out", str(out), "--epochs", "1", "--set", "match_iou_grid=[]"]) == 0
        assert f"left out 1 image that the cache could not read (cache_summary.json), neither scored nor fitted on: " \
               f"{bad} ({gt.file_name(bad)}, unreadable by blurry)" in capsys.readouterr().err
        log = json.loads((tmp_path / "head.json.log.json").read_text())
        assert log["images"] == 11 and log["left_out"] == [
            {"image_id": bad, "file_name": gt.file_name(bad), "unreadable_by": {"blurry": "corrupt"}}]
        # an --images-from list may name it: it is left out there too, and a list of nothing else is an error
        listing = tmp_path / "ids.txt"
        listing.write_text("\n".join(map(str, gt.annotated_image_ids[:5])) + "\n")
        assert train_cli.main(base + ["--out", str(out), "--epochs", "1", "--set", "match_iou_grid=[]",
                                      "--images-from", str(listing), "--quiet"]) == 0
        assert json.loads((tmp_path / "head.json.log.json").read_text())["images"] == 4
        listing.write_text(f"{bad}\n")
        assert train_cli.main(base + ["--out", str(out), "--images-from", str(listing), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "every image that --images-from" in err and "is left out" in err and err.count("error:") == 1

        report = tmp_path / "report.json"
        assert evaluate_cli.main(base + ["--methods", "single,mean", "--cv", "2", "--backend", "faster",
                                         "--out", str(report)]) == 0
        assert f"{bad} ({gt.file_name(bad)}, unreadable by blurry)" in capsys.readouterr().err
        record = EvaluationRecord.load(report)
        assert record.meta["left_out"] == log["left_out"] and record.meta["scored_images"] == 11
        assert bad not in record.image_ids and len(record.image_ids) == 11
        expected = cross_validate(_without(predictions, gt, {bad}), ["single", "mean"], k=2, backend="faster")
        table = json.loads(report.read_text())
        for method, result in expected.items():
            assert table[method]["map"] == result.metrics["map"]

    def test_train_cli_rejects_a_matching_iou_that_the_grid_search_would_overwrite(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        args = ["--gt", str(gt_path), "--predictions", str(predictions), "--epochs", "1", "--quiet",
                "--out", str(tmp_path / "head.json")]
        assert train_cli.main(args + ["--set", "match_iou=0.5"]) == 2
        err = capsys.readouterr().err
        assert "--set: match_iou 0.5 would not be used" in err and "[0.6, 0.65, 0.7]" in err
        assert train_cli.main(args + ["--set", "epochs=2"]) == 2  # args hold --epochs 1
        assert "error: --epochs 1 and --set epochs=2 both set epochs: give one of them" in capsys.readouterr().err
        assert train_cli.main(args + ["--set", "match_iou=0.5", "--set", "match_iou_grid=[]"]) == 0
        assert load_head(tmp_path / "head.json").match_iou == 0.5
        capsys.readouterr()
        seed = tmp_path / "seed.yaml"
        seed.write_text("epochs: 1\n")
        assert train_cli.main(args + ["--head", "theta_seed", "--config", str(seed)]) == 0
        written = (tmp_path / "head.json.config.yaml").read_text()
        # a partial file of the seed's variant keeps the seed's settings, not the plain theta defaults
        assert "normalize_box: false" in written and "match_iou_grid: []" in written

    @pytest.mark.parametrize("options, message", [
        (["--lr", "1.0"], r"the Θ fit diverged: .*lr=1\b.*lower the learning rate"),
        (["--head", "superlearner", "--lr", "1e6", "--set", "calibrate=false"],
         r"the superlearner loss became nan at epoch \d+ \(lr=1e\+06\); lower the learning rate"),
        (["--set", "device=banana"], r"device must be a torch device: cpu, cuda or cuda:<index>, got 'banana'"),
    ])
    def test_train_cli_reports_a_diverged_fit_or_a_bad_device_in_one_line(self, dataset, tmp_path, capsys,
                                                                          options, message):
        gt_path, predictions = dataset
        out = tmp_path / "head.json"
        code = train_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--epochs", "20", "--quiet",
                               "--set", "match_iou_grid=[]", "--out", str(out), *options])
        err = capsys.readouterr().err
        assert code == 2 and err.count("error:") == 1 and "Traceback" not in err, err
        assert re.search(message, err), err
        assert not out.exists()

    def test_evaluate_cli_takes_one_train_config_per_head(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        config = tmp_path / "theta.yaml"
        config.write_text("epochs: 1\n")
        base = ["--gt", str(gt_path), "--predictions", str(predictions), "--methods", "theta", "--out",
                str(tmp_path / "r.json"), "--quiet"]
        assert evaluate_cli.main(base + ["--train-config", f"theta={config}", "--train-config", f"theta={config}"]) == 2
        assert "--train-config theta= is given twice" in capsys.readouterr().err
        config.write_text("match_iou: 0.5\n")
        assert evaluate_cli.main(base + ["--train-config", f"theta={config}"]) == 2
        assert f"{config}: match_iou 0.5 would not be used" in capsys.readouterr().err
        assert evaluate_cli.main(base + ["--set", "theta.epochs=abc"]) == 2
        assert "error: --set theta.epochs: expected an integer, got str 'abc'" in capsys.readouterr().err

    def test_evaluate_cli_fit_on_needs_no_cross_validation(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        base = ["--gt", str(gt_path), "--predictions", str(predictions), "--out", str(tmp_path / "r.json"), "--quiet"]
        for extra in (["--methods", "mean,theta", "--cv", "0"], ["--methods", "wbf_tuned", "--cv", "0"],
                      ["--methods", "mean", "--cv", "0", "--also-fit-on", str(gt_path), str(predictions)],
                      ["--methods", "mean", "--fit-on", str(gt_path), str(predictions)]):
            assert evaluate_cli.main(base + extra) == 2
            assert "--cv 0 and --fit-on go together" in capsys.readouterr().err
        assert not (tmp_path / "r.json").exists()

    def test_fixed_methods_alone_are_scored_once_without_folds_or_fitting_data(self, dataset, ensemble, tmp_path):
        """A test split scored by fixed methods needs no fitting data: --cv 0 without --fit-on was refused,
        and --cv 2 scored the same figures under a page that called them 2-fold CV."""
        gt_path, predictions = dataset
        base = ["--gt", str(gt_path), "--predictions", str(predictions), "--methods", "single,wbf,nms", "--quiet"]
        assert evaluate_cli.main([*base, "--cv", "0", "--out", str(tmp_path / "once.json"),
                                  "--report", str(tmp_path / "page")]) == 0
        assert evaluate_cli.main([*base, "--cv", "2", "--out", str(tmp_path / "folds.json")]) == 0

        def figures(table):  # the timings aside
            return {method: {k: v for k, v in row.items() if k != "fusion_ms"} for method, row in table.items()}

        once, folds = (figures(json.loads((tmp_path / name).read_text())) for name in ("once.json", "folds.json"))
        assert once == folds and len(once) == len(ensemble.model_names) + 2
        meta = EvaluationRecord.load(tmp_path / "once.json").meta
        assert (meta["cv"], meta["folds"], meta["fit_on"]) == (0, [], None)
        assert meta["protocol"] == "no CV, no method fitted: every image scored once"
        html = (tmp_path / "page" / "index.html").read_text()
        assert "none: no method fitted, every image scored once" in html and "fold CV" not in html
        assert figures({"wbf": cross_validate(ensemble, ["wbf"], k=0, backend="faster")["wbf"].metrics}) == {
            "wbf": once["wbf"]}

    @pytest.mark.parametrize("fitting", [["--also-fit-on"], ["--cv", "0", "--fit-on"]])
    def test_evaluate_cli_refuses_fitting_data_that_holds_scored_images(self, dataset, tmp_path, capsys, fitting):
        gt_path, predictions = dataset
        out = tmp_path / "r.json"
        code = evaluate_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--methods", "mean",
                                  "--backend", "faster", "--out", str(out), "--quiet",
                                  *fitting, str(gt_path), str(predictions)])
        err = capsys.readouterr().err
        assert code == 2 and not out.exists()
        fitting_data = "the extra fitting data" if fitting == ["--also-fit-on"] else "the fitting data"  # all of it
        assert err.startswith(f"error: {fitting_data} shares 12 annotated images with the scored data"), err
        assert err.count("\n") == 1 and "must not contain scored images" in err

    @pytest.mark.parametrize("fitting", [["--also-fit-on"], ["--cv", "0", "--fit-on"]])
    def test_evaluate_cli_fits_on_annotations_without_ids(self, dataset, tmp_path, capsys, fitting):
        _split_dataset(*dataset, tmp_path)
        for part in ("evaluated", "extra"):
            _without_annotation_ids(tmp_path / part)
        out = tmp_path / "r.json"
        code = evaluate_cli.main([
            "--gt", str(tmp_path / "evaluated" / "instances.json"), "--predictions", str(tmp_path / "evaluated" / "predictions"),
            "--methods", "mean,wbf_tuned", "--backend", "faster", "--out", str(out), "--quiet",
            *fitting, str(tmp_path / "extra" / "instances.json"), str(tmp_path / "extra" / "predictions")])
        assert (code, capsys.readouterr().err) == (0, "")
        assert list(json.loads(out.read_text())) == ["mean", "wbf_tuned"]

    def test_evaluate_cli_bootstrap(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        out = tmp_path / "report.json"
        base = ["--gt", str(gt_path), "--predictions", str(predictions), "--methods", "single,mean", "--cv", "2",
                "--backend", "faster", "--out", str(out), "--quiet"]
        assert evaluate_cli.main(base + ["--bootstrap", "7", "--bootstrap-against", "mean"]) == 0
        printed = capsys.readouterr().out
        saved = json.loads(out.with_name("report.bootstrap.json").read_text())
        assert saved["draws"] == 7 and saved["against"] == "mean" and saved["seed"] == 0
        assert set(saved["methods"]) == set(json.loads(out.read_text()))
        assert saved["methods"]["mean"]["difference"]["sd"] == 0.0
        assert "bootstrap:" in printed
        assert ("| method | mAP sd over draws | − mean, points (mean of draws) | 95 % of draws, points "
                "| share of draws above |") in printed
        for extra, message in [
            (["--bootstrap", "-1"], "--bootstrap must be the number of draws"),
            (["--bootstrap-against", "mean"], "--bootstrap-against needs --bootstrap B"),
            (["--bootstrap", "3", "--bootstrap-against", "wbf"], "--bootstrap-against 'wbf' is not among the methods run"),
            (["--bootstrap", "3", "--seed", "0,1"], "--bootstrap draws one cross-validation's predictions"),
        ]:
            assert evaluate_cli.main(base + extra) == 2
            err = capsys.readouterr().err
            assert message in err and "Traceback" not in err

    def test_evaluate_cli_report_schema(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        config = tmp_path / "theta.yaml"
        config.write_text("epochs: 5\nnormalize_box: true\nmatch_iou_grid: []\n")
        out = tmp_path / "report.json"
        code = evaluate_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--methods",
                                  "single,mean,theta", "--cv", "2", "--train-config", f"theta={config}",
                                  "--backend", "faster", "--out", str(out), "--plot", str(tmp_path / "r.png"),
                                  "--reliability", str(tmp_path / "reliability.png"), "--quiet"])
        assert code == 0
        report = json.loads(out.read_text())
        assert list(report) == ["single:blurry", "single:noisy", "single:sharp", "mean", "theta"]
        assert (tmp_path / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        for metrics in report.values():
            assert set(metrics) == set(METRIC_KEYS) | {"ece", "fusion_ms"}
            assert all(isinstance(v, float) for v in metrics.values())
        fitted = json.loads((tmp_path / "report.fitted.json").read_text())
        assert list(fitted) == ["theta"] and len(fitted["theta"]) == 2
        calibration = json.loads((tmp_path / "report.calibration.json").read_text())
        assert list(calibration) == list(report) and all(len(c["bins"]) == 10 for c in calibration.values())
        assert "| theta |" in capsys.readouterr().out
        assert (tmp_path / "r.png").stat().st_size > 1000

    def test_evaluate_cli_train_config_reaches_every_method_of_its_head(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        config = tmp_path / "selection.yaml"
        config.write_text("epochs: 1\nhidden: 8\nk: 3\n")
        out = tmp_path / "report.json"
        base = ["--gt", str(gt_path), "--predictions", str(predictions), "--cv", "2", "--backend", "faster",
                "--out", str(out), "--quiet"]
        assert evaluate_cli.main(base + ["--methods", "selection_k1,selection_k2,mean",
                                         "--train-config", f"selection={config}"]) == 0
        fitted = json.loads((tmp_path / "report.fitted.json").read_text())
        assert list(fitted) == ["selection_k1", "selection_k2"]
        for method, k in (("selection_k1", 1), ("selection_k2", 2)):
            for fold in fitted[method]:
                # the file's settings, with the k that the method's name fixes
                assert fold["config"]["epochs"] == 1 and fold["config"]["hidden"] == 8 and fold["config"]["k"] == k
        capsys.readouterr()
        assert evaluate_cli.main(base + ["--methods", "mean,wbf_tuned", "--train-config", f"deep={config}"]) == 2
        err = capsys.readouterr().err
        assert "no method of --methods (mean, wbf_tuned) fits a deep head" in err and "Traceback" not in err

    def test_evaluate_cli_refuses_an_out_that_another_run_is_writing(self, dataset, tmp_path, capsys):
        """A second run would take the first's finished rows for an interrupted run's, or start its folder of
        finished methods over under it; another --out in the same folder is another run's own."""
        import subprocess
        import sys

        gt_path, predictions = dataset
        out = tmp_path / "report.json"
        holder = subprocess.Popen(  # another process holds the lock, as a running evaluate does
            [sys.executable, "-c", "import sys, time\nfrom detens.io import output_lock\n"
             f"with output_lock({str(tmp_path)!r}, 'detens evaluate', '.report.json.detens.lock', "
             f"output='--out {out}'):\n    print('held', flush=True)\n    time.sleep(60)\n"],
            stdout=subprocess.PIPE, text=True,
        )
        try:
            assert holder.stdout.readline().strip() == "held"
            base = ["--gt", str(gt_path), "--predictions", str(predictions), "--methods", "mean", "--cv", "2",
                    "--backend", "faster", "--quiet"]
            assert evaluate_cli.main(base + ["--out", str(out)]) == 2
            err = capsys.readouterr().err
            assert re.fullmatch(rf"error: --out {re.escape(str(out))} is being written by detens evaluate \(pid "
                                rf"{holder.pid} on .*\); two runs writing one output would spoil each other's "
                                r"results: wait for it to end, or give another output\n", err), err
            assert not out.exists()
            assert evaluate_cli.main(base + ["--out", str(tmp_path / "other.json")]) == 0
        finally:
            holder.kill()
            holder.wait()
        assert evaluate_cli.main(base + ["--out", str(out)]) == 0
        assert sorted(p.name for p in tmp_path.glob(".*lock")) == []  # let go of at the end

    def test_evaluate_cli_runs_on_an_out_whose_lock_file_name_would_be_too_long(self, dataset, tmp_path):
        """.<name>.detens.lock is 13 bytes longer than --out's name: 256 bytes here, which Linux refuses."""
        gt_path, predictions = dataset
        out = tmp_path / ("e" * 235 + ".results")  # its files beside it fit: e…e.evaluation.json.gz is 254 bytes
        assert evaluate_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--methods", "mean",
                                  "--cv", "2", "--backend", "faster", "--quiet", "--out", str(out)]) == 0
        assert "mean" in json.loads(out.read_text())
        assert sorted(p.name for p in tmp_path.glob(".*lock")) == []

    @pytest.mark.parametrize("command", ["evaluate", "train"])
    def test_an_out_whose_files_would_have_too_long_names_is_refused_before_any_work(self, dataset, tmp_path,
                                                                                       capsys, command):
        """Only the rename that ends a file's writing finds its name too long: after the fits."""
        gt_path, predictions = dataset
        main = {"evaluate": evaluate_cli.main, "train": train_cli.main}[command]
        args = ["--gt", str(gt_path), "--predictions", str(predictions), "--quiet"]
        if command == "evaluate":
            args += ["--methods", "mean", "--cv", "2", "--backend", "faster"]
        beside = {"evaluate": ("the record", ".evaluation.json.gz"), "train": ("the .config.yaml file", ".json.config.yaml")}
        for name, what, path, advice in (
            ("e" * 250 + ".json", beside[command][0], "e" * 250 + beside[command][1],
             "give --out, which it is named after, a shorter name"),
            ("e" * 251 + ".json", "--out", "e" * 251 + ".json", "give a shorter name"),
        ):
            assert main([*args, "--out", str(tmp_path / name)]) == 2
            size = len(path)
            assert capsys.readouterr().err == (
                f"error: {what} {tmp_path / path} cannot be written: its name is {size} bytes long, and a file "
                f"system takes at most 255; {advice}\n")
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("command", ["evaluate", "train"])
    @pytest.mark.parametrize("which", ["--out", "a file beside it"])
    def test_an_out_whose_files_may_not_be_replaced_is_refused_before_any_work(self, dataset, tmp_path, capsys,
                                                                               immutable, command, which):
        """An immutable ``--out``, or file beside it, refuses only the rename that ends its writing: after the
        fits, with the run's other files written beside the old ones."""
        gt_path, predictions = dataset
        main = {"evaluate": evaluate_cli.main, "train": train_cli.main}[command]
        args = ["--gt", str(gt_path), "--predictions", str(predictions), "--out", str(tmp_path / "r.json"), "--quiet"]
        if command == "evaluate":
            args += ["--methods", "mean", "--cv", "2", "--backend", "faster"]
        what, name, advice = {
            "--out": ("--out", "r.json", "another path"),
            "evaluate": ("the record", "r.evaluation.json.gz", "--out another name"),
            "train": ("the .config.yaml file", "r.json.config.yaml", "--out another name"),
        }[which if which == "--out" else command]
        (tmp_path / name).write_text("earlier")
        immutable(tmp_path / name)
        assert main(args) == 2
        assert capsys.readouterr().err == (
            f"error: {what} {tmp_path / name} cannot be written: the file there may be neither replaced, moved nor "
            "removed (Operation not permitted: it is marked immutable or append-only, as lsattr shows); lift that "
            f"mark, or give {advice}\n")
        assert sorted(p.name for p in tmp_path.iterdir()) == [name]
        assert (tmp_path / name).read_text() == "earlier"

    def test_evaluate_cli_set_overrides_a_key_of_a_head_types_training_config(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        config = tmp_path / "selection.yaml"
        config.write_text("epochs: 1\nhidden: 8\n")
        out = tmp_path / "report.json"
        base = ["--gt", str(gt_path), "--predictions", str(predictions), "--cv", "2", "--backend", "faster",
                "--out", str(out), "--quiet"]
        # over the file's value, and over the code defaults where no file is given
        assert evaluate_cli.main(base + ["--methods", "selection_k1,theta", "--train-config", f"selection={config}",
                                         "--set", "selection.hidden=4", "--set", "theta.epochs=2",
                                         "--set", "theta.lr=1e-3"]) == 0
        fitted = json.loads((tmp_path / "report.fitted.json").read_text())
        for fold in fitted["selection_k1"]:
            assert (fold["config"]["epochs"], fold["config"]["hidden"]) == (1, 4)
        for fold in fitted["theta"]:
            assert (fold["config"]["epochs"], fold["config"]["lr"]) == (2, 0.001)
        capsys.readouterr()
        for given, message in [
            ("epochs=2", r"--set takes HEAD\.KEY=VALUE with HEAD one of .*deep.*theta.* \(deep\.epochs=5\), got 'epochs=2'"),
            ("thetaa.epochs=2", r"got 'thetaa\.epochs=2'"),
            ("deep.epochs=2", r"--set deep\.epochs=2: no method of --methods \(theta\) fits a deep head"),
            ("theta.epochs=[2", r"--set 'theta\.epochs=\[2': the value is not valid YAML"),
            ("theta.epoch=2", r"epoch"),
        ]:
            assert evaluate_cli.main(base + ["--methods", "theta", "--set", given]) == 2, given
            err = capsys.readouterr().err
            assert err.count("error:") == 1 and "Traceback" not in err and re.search(message, err), err

    def test_evaluate_cli_repeats_the_cross_validation_per_seed(self, dataset, tmp_path, capsys):
        gt_path, predictions = dataset
        base = ["--gt", str(gt_path), "--predictions", str(predictions), "--methods", "mean,wbf_tuned",
                "--cv", "2", "--backend", "faster", "--quiet"]
        single = {}
        for seed in (0, 3):
            out = tmp_path / f"seed{seed}.json"
            assert evaluate_cli.main(base + ["--seed", str(seed), "--out", str(out)]) == 0
            single[seed] = json.loads(out.read_text())
        out = tmp_path / "repeated.json"
        assert evaluate_cli.main(base + ["--seed", "0,3", "--out", str(out), "--plot", str(tmp_path / "r.png")]) == 0
        repeated = json.loads(out.read_text())
        assert list(repeated) == ["mean", "wbf_tuned"]
        for method, row in repeated.items():
            maps = [single[0][method]["map"], single[3][method]["map"]]
            assert row["map"] == pytest.approx(sum(maps) / 2)
            assert row["map50"] == pytest.approx((single[0][method]["map50"] + single[3][method]["map50"]) / 2)
            assert row["map_by_seed"] == {"0": pytest.approx(maps[0]), "3": pytest.approx(maps[1])}
            assert row["map_sd"] == pytest.approx(abs(maps[0] - maps[1]) / 2**0.5)
        # a fixed method does not depend on the folds; the tuned one is fitted per fold of every seed
        assert repeated["mean"]["map_sd"] == 0.0
        fitted = json.loads((tmp_path / "repeated.fitted.json").read_text())
        assert list(fitted) == ["wbf_tuned"] and list(fitted["wbf_tuned"]) == ["0", "3"]
        assert all(len(folds) == 2 for folds in fitted["wbf_tuned"].values())
        printed = capsys.readouterr().out
        assert "| method | mAP | mAP sd | AP50 |" in printed  # the result, which --quiet keeps
        assert "seed 3:" not in printed and "mAP 0." not in printed  # progress lines, which it does not
        assert (tmp_path / "r.png").stat().st_size > 1000
        assert not (tmp_path / "repeated.evaluation.json.gz").exists()  # a record holds one cross-validation

    @pytest.mark.parametrize("seeds", [["--seed", "0"], ["--seed", "0,1"]])
    def test_an_interrupted_evaluation_resumes_its_finished_methods(self, dataset, tmp_path, capfd, monkeypatch, seeds):
        """The same command again takes the methods the interrupted run finished as they were (not fitted or
        scored again) and gives the table an uninterrupted run gives; another command starts over."""
        gt_path, predictions = dataset
        base = ["--gt", str(gt_path), "--predictions", str(predictions), "--cv", "2", "--backend", "faster",
                "--methods", "wbf_tuned,mean", "--quiet", *seeds]
        assert evaluate_cli.main(base + ["--out", str(tmp_path / "whole.json")]) == 0
        out = tmp_path / "report.json"
        real, ran = evaluate_job.cross_validate, []

        def counted(*args, on_method, **kwargs):
            def on_method_counted(name, result):
                ran.append(name)
                on_method(name, result)
                if stop_after and len(ran) == stop_after:
                    raise KeyboardInterrupt

            return real(*args, on_method=on_method_counted, **kwargs)

        monkeypatch.setattr(evaluate_job, "cross_validate", counted)
        stop_after = 1
        capfd.readouterr()
        assert evaluate_cli.main(base + ["--out", str(out)]) == 130
        assert ran == ["wbf_tuned"] and (tmp_path / "report.unfinished").is_dir()
        err = capfd.readouterr().err  # --quiet: sys.stderr is a copy of fd 2
        assert err.endswith(f"interrupted: 1 finished method result is saved in {tmp_path / 'report.unfinished'}; run "
                            "the same command again to resume (not fitted or scored again)\nerror: interrupted\n"), err
        ran.clear()
        stop_after = 0
        capfd.readouterr()
        loud = [arg for arg in base if arg != "--quiet"]
        assert evaluate_cli.main(loud + ["--out", str(out)]) == 0
        per_seed = ["mean"] if len(seeds[1]) == 1 else ["mean", "wbf_tuned", "mean"]
        assert ran == per_seed  # wbf_tuned of the first seed was not run again
        resumed = [line for line in capfd.readouterr().out.splitlines() if "finished by the interrupted run" in line]
        assert len(resumed) == 1 and "wbf_tuned: mAP" in resumed[0], resumed
        assert resumed[0].startswith("seed 0: ") == (len(seeds[1]) > 1), resumed
        def untimed(path):  # fusion_ms is a timing: every run measures its own
            return {method: {k: v for k, v in row.items() if "fusion_ms" not in k}
                    for method, row in json.loads(path.read_text()).items()}

        assert untimed(out) == untimed(tmp_path / "whole.json")
        assert not (tmp_path / "report.unfinished").exists()
        if len(seeds[1]) == 1:
            assert EvaluationRecord.load(out).results == EvaluationRecord.load(tmp_path / "whole.json").results

        # interrupted again, then run with another option: nothing of the other run is taken
        stop_after, ran[:] = 1, []
        assert evaluate_cli.main(base + ["--out", str(out)]) == 130
        stop_after, ran[:] = 0, []
        kept = sorted(p.name for p in (tmp_path / "report.unfinished").iterdir())
        # a run that stops on a mistake in its options, before any method, leaves them be and writes nothing
        mistaken = tmp_path / "mistaken.json"
        assert evaluate_cli.main(base + ["--out", str(mistaken), "--methods", "single:nope"]) == 2
        assert evaluate_cli.main(base + ["--out", str(out), "--cv", "500"]) == 2
        assert not (tmp_path / "mistaken.unfinished").exists() and ran == []
        assert sorted(p.name for p in (tmp_path / "report.unfinished").iterdir()) == kept
        capfd.readouterr()
        assert evaluate_cli.main(loud + ["--out", str(out), "--max-det", "50"]) == 0
        assert ran[:2] == ["wbf_tuned", "mean"]
        err = capfd.readouterr().err  # said before the first method, while a Ctrl-C can still keep them
        assert (f"{tmp_path / 'report.unfinished'} holds 1 method result finished by an interrupted run with other "
                "inputs or options") in err and "this run discards them when it finishes its first method" in err

    def test_an_interrupt_while_the_page_is_drawn_says_the_table_is_complete(self, dataset, tmp_path, capsys, monkeypatch):
        import detens.report.page as page

        def interrupted(record, folder):
            raise KeyboardInterrupt

        monkeypatch.setattr(page, "write_report", interrupted)
        gt_path, predictions = dataset
        out = tmp_path / "report.json"
        assert evaluate_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--methods", "mean",
                                  "--cv", "2", "--backend", "faster", "--out", str(out),
                                  "--report", str(tmp_path / "page")]) == 130
        err = capsys.readouterr().err
        assert (f"interrupted after the table {out} and its record were written, complete; what comes after them "
                f"(the plots, the report page, the bootstrap) may be missing: detens report {out} --out "
                f"{tmp_path / 'page'} draws the page from them") in err
        assert err.rstrip().endswith("error: interrupted")
        assert list(json.loads(out.read_text())) == ["mean"] and EvaluationRecord.load(out).image_ids

    def test_evaluate_cli_replaces_a_runs_files_only_when_it_completes(self, dataset, tmp_path, capsys, monkeypatch):
        gt_path, predictions = dataset
        out = tmp_path / "report.json"
        base = ["--gt", str(gt_path), "--predictions", str(predictions), "--cv", "2", "--backend", "faster",
                "--out", str(out), "--quiet"]
        assert evaluate_cli.main(base + ["--methods", "single,mean", "--bootstrap", "3"]) == 0
        files = sorted(tmp_path.glob("report*"))
        assert [f.name for f in files] == ["report.bootstrap.json", "report.calibration.json",
                                           "report.evaluation.json.gz", "report.fitted.json", "report.json"]
        before = {f.name: f.read_bytes() for f in files}
        real = evaluate_job.cross_validate

        def interrupted_after_the_first_method(*args, on_method, **kwargs):
            def on_method_then_stop(name, result):
                on_method(name, result)
                raise KeyboardInterrupt

            return real(*args, on_method=on_method_then_stop, **kwargs)

        monkeypatch.setattr(evaluate_job, "cross_validate", interrupted_after_the_first_method)
        assert evaluate_cli.main(base + ["--methods", "wbf,mean"]) == 130
        # the earlier run's files are all as they were, and still one run's; the finished row is kept apart
        assert {f.name: f.read_bytes() for f in tmp_path.glob("report*") if f.name in before} == before
        assert list(json.loads((tmp_path / "report.partial.json").read_text())) == ["wbf"]
        assert list(EvaluationRecord.load(out).metrics) == list(json.loads(out.read_text()))
        capsys.readouterr()

        # another run stopped before its first row: the rows left are never the earlier run's
        def interrupted_at_once(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(evaluate_job, "cross_validate", interrupted_at_once)
        assert evaluate_cli.main(base + ["--methods", "mean"]) == 130
        assert not (tmp_path / "report.partial.json").exists()
        assert {f.name: f.read_bytes() for f in tmp_path.glob("report*") if f.name in before} == before
        capsys.readouterr()

        # killed after the record, before the table: the table left beside it is refused
        monkeypatch.setattr(evaluate_job, "cross_validate", real)
        def interrupt(*args):
            raise KeyboardInterrupt

        monkeypatch.setattr(evaluate_job, "_complete", interrupt)
        assert evaluate_cli.main(base + ["--methods", "wbf,mean"]) == 130
        assert out.read_bytes() == before["report.json"] and not (tmp_path / "report.bootstrap.json").exists()
        with pytest.raises(ValueError, match=r"report\.json and .*report\.evaluation\.json\.gz are not from the same "
                                             r"detens evaluate run \(rows only in the table: single:blurry, .*"
                                             r"report\.partial\.json holds the rows of a run that did not finish"):
            EvaluationRecord.load(out)
        assert list(EvaluationRecord.load(record_path(out)).metrics) == ["wbf", "mean"]  # the record on its own

        monkeypatch.undo()
        assert evaluate_cli.main(base + ["--methods", "wbf,mean"]) == 0
        assert not (tmp_path / "report.partial.json").exists()
        assert list(EvaluationRecord.load(out).metrics) == ["wbf", "mean"] == list(json.loads(out.read_text()))
        # several seeds write no record: the earlier run's one-seed files go with its table
        assert evaluate_cli.main(base + ["--methods", "mean", "--seed", "0,1"]) == 0
        assert sorted(f.name for f in tmp_path.glob("report*")) == ["report.fitted.json", "report.json", "report.run.json"]
        # and one seed again: its record says how the run was made
        assert evaluate_cli.main(base + ["--methods", "mean"]) == 0
        assert sorted(f.name for f in tmp_path.glob("report*")) == [
            "report.calibration.json", "report.evaluation.json.gz", "report.fitted.json", "report.json"]

    @pytest.mark.parametrize("kind", ["deep", "superlearner", "selection"])
    def test_train_cli_other_heads_plug_into_fuse(self, dataset, tmp_path, kind):
        from detens import fuse

        gt_path, predictions = dataset
        out = tmp_path / f"{kind}.safetensors"
        assert train_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--out", str(out),
                               "--head", kind, "--epochs", "2", "--set", "match_iou_grid=[]", "--quiet"]) == 0
        head = load_head(out)
        # deep calibrates its members' scores by default: a calibrated head holding a deep one
        assert getattr(head, "head_type", head.type_name) == kind and head.model_names == sorted(MODELS)
        assert head.type_name == ("calibrated" if kind == "deep" else kind)
        ensemble = EnsemblePredictions.from_folder(predictions, load_coco_gt(gt_path))
        image_id = ensemble.gt.annotated_image_ids[0]
        fused = fuse(ensemble.per_model(image_id), "theta", head=out)
        assert len(fused) > 0 and fused.source == f"fused:{kind}"
        log = json.loads((tmp_path / f"{kind}.safetensors.log.json").read_text())
        assert log["head"] == kind and len(log["loss"]) == 2


class TestSummarizeRepeats:
    @staticmethod
    def _table(rng, methods):
        return {m: {k: float(rng.uniform(0, 1)) for k in ("map", "map50", "ece", "fusion_ms")} for m in methods}

    def test_matches_a_slow_reference(self):
        import statistics

        from detens.evaluation import summarize_repeats

        rng = np.random.default_rng(0)
        runs = {seed: self._table(rng, ["wbf", "deep", "single:a"]) for seed in (4, 0, 7)}
        summary = summarize_repeats(runs)
        assert list(summary) == ["wbf", "deep", "single:a"]
        for method, row in summary.items():
            for key in ("map", "map50", "ece", "fusion_ms"):
                assert row[key] == pytest.approx(statistics.mean(runs[s][method][key] for s in runs))
            assert row["map_sd"] == pytest.approx(statistics.stdev(runs[s][method]["map"] for s in runs))
            assert row["map_by_seed"] == {s: runs[s][method]["map"] for s in (4, 0, 7)}

    def test_one_seed_has_no_spread_and_bad_runs_are_refused(self):
        from detens.evaluation import summarize_repeats

        rng = np.random.default_rng(1)
        one = {0: self._table(rng, ["mean"])}
        assert summarize_repeats(one)["mean"]["map_sd"] == 0.0
        assert summarize_repeats(one)["mean"]["map"] == one[0]["mean"]["map"]
        with pytest.raises(ValueError, match="at least one run"):
            summarize_repeats({})
        with pytest.raises(ValueError, match=r"seed 1 has the methods \['wbf'\]"):
            summarize_repeats({0: self._table(rng, ["mean"]), 1: self._table(rng, ["wbf"])})


def test_markdown_table_escapes_pipes_in_method_names():
    from detens.report import markdown_table

    table = markdown_table({"single:yolo26n|hflip": {"map": 0.5}})
    row = table.splitlines()[-1]
    assert row.startswith("| single:yolo26n\\|hflip | 0.5000 |")
    assert row.replace("\\|", "").count("|") == table.splitlines()[0].count("|")


class TestHeadsMatchMembersByName:
    def test_any_member_order_gives_the_same_fusion(self, ensemble):
        ids = ensemble.gt.annotated_image_ids
        samples = build_samples(ensemble, ids[:8], 0.55)
        head, _ = train_theta(samples, ensemble.model_names,  # lr 0.5 would double J on these 8 images: diverged
                              ThetaTrainConfig(epochs=5, batch_images=4, match_iou_grid=[], lr=0.2))
        assert len(set(head.theta.detach().tolist())) > 1  # unequal weights: a wrong order would show
        for image_id in ids[:4]:
            per_model = ensemble.per_model(image_id)
            expected = fuse(per_model, "theta", head=head)
            for order in ([2, 0, 1], [1, 2, 0]):
                got = fuse([per_model[i] for i in order], "theta", head=head)
                torch.testing.assert_close(got.boxes, expected.boxes)
                torch.testing.assert_close(got.scores, expected.scores)

    def test_unknown_or_repeated_members_are_refused(self, ensemble):
        from detens.heads.theta import ThetaHead

        head = ThetaHead(ensemble.model_names)
        per_model = ensemble.per_model(ensemble.gt.annotated_image_ids[0])
        with pytest.raises(ValueError, match=r"sources are \['other', 'noisy', 'sharp'\] but this head is for"):
            fuse([per_model[0].with_source("other"), *per_model[1:]], "theta", head=head)
        with pytest.raises(ValueError, match="two Detections name the same model"):
            fuse([per_model[0], per_model[0], per_model[2]], "theta", head=head)

    def test_calibration_is_a_cross_validated_method(self, ensemble):
        report = cross_validate(ensemble, ["calibration"], k=2, backend="faster",
                                method_options={"calibration": {"fusers": ["wbf", "refine"],
                                                                "fuser_params": {"wbf": {"iou_thr": 0.6}}}})
        fitted = report["calibration"].fitted
        assert len(fitted) == 2 and all(len(f["config"]["fusers"]) == 1 for f in fitted)
        assert 0.0 < report["calibration"].metrics["map"] <= 1.0


class TestCalibratedHeads:
    """``calibrate: true``: the member scores are calibrated on the training images, then the network head is
    fitted on (and applied to) the calibrated detections; one file holds both parts."""

    @staticmethod
    def small(kind: str = "deep", **options):
        from detens.heads import config_for

        return config_for(kind, epochs=3, match_iou_grid=[], **options)

    def test_equals_fitting_the_head_on_calibrated_predictions(self, ensemble):
        from detens.heads import CalibratedHead, fit_calibration
        from detens.heads.calibrated import CalibratedPredictions

        ids = ensemble.gt.annotated_image_ids
        head, _, fitted = fit_head("deep", ensemble, ids, self.small(calibrate=True))
        assert isinstance(head, CalibratedHead) and head.head_type == "deep" and fitted.calibrate
        # the slow obvious way: calibrate, wrap, fit the plain head, fuse the calibrated detections
        calibration = fit_calibration(ensemble, ids)
        reference, _, _ = fit_head("deep", CalibratedPredictions(ensemble, calibration), ids, self.small(calibrate=False))
        for image_id in ids[:6]:
            per_model = ensemble.per_model(image_id)
            got = fuse(per_model, "deep", head=head)
            expected = fuse(calibration.calibrate(per_model), "theta", head=reference)
            assert len(got) > 0
            torch.testing.assert_close(got.boxes, expected.boxes)
            torch.testing.assert_close(got.scores, expected.scores)

    @pytest.mark.parametrize("suffix", [".json", ".safetensors"])
    @pytest.mark.parametrize("bags", [1, 2])
    def test_saved_and_loaded_for_the_models_in_any_order(self, ensemble, tmp_path, suffix, bags):
        ids = ensemble.gt.annotated_image_ids
        head, _, _ = fit_head("superlearner", ensemble, ids, self.small("superlearner", calibrate=True, bags=bags))
        path = tmp_path / f"head{suffix}"
        head.save(path)
        loaded = load_head(path, model_names=ensemble.model_names[::-1])
        assert type(loaded) is type(head) and loaded.head_type == ("bagged" if bags > 1 else "superlearner")
        for image_id in ids[:4]:
            per_model = ensemble.per_model(image_id)
            expected = fuse(per_model, "theta", head=head)
            got = fuse(per_model[::-1], "theta", head=loaded)
            assert got.source == "fused:superlearner"  # a calibrated bag runs as its members' type
            torch.testing.assert_close(got.boxes, expected.boxes)
            torch.testing.assert_close(got.scores, expected.scores)

    def test_runs_as_its_head_type_only(self, ensemble):
        head, _, _ = fit_head("deep", ensemble, ensemble.gt.annotated_image_ids, self.small(calibrate=True))
        per_model = ensemble.per_model(ensemble.gt.annotated_image_ids[0])
        assert len(fuse(per_model, "calibrated", head=head)) == len(fuse(per_model, "deep", head=head))
        with pytest.raises(ValueError, match="method 'selection' was given a 'deep' head"):
            fuse(per_model, "selection", head=head)

    def test_parts_must_fit_together(self, ensemble):
        from detens.heads import CalibratedHead, CalibrationHead
        from detens.heads.deep import DeepEnsembleHead
        from detens.heads.theta import ThetaHead

        names = ensemble.model_names
        with pytest.raises(ValueError, match=r"the calibration is for models \['a', 'b', 'c'\]"):
            CalibratedHead(CalibrationHead(["a", "b", "c"]), DeepEnsembleHead(names))
        with pytest.raises(TypeError, match="head must be a network head"):
            CalibratedHead(CalibrationHead(names), ThetaHead(names))
        with pytest.raises(TypeError, match="calibration must be a CalibrationHead"):
            CalibratedHead(DeepEnsembleHead(names), DeepEnsembleHead(names))
        with pytest.raises(TypeError, match="calibrate must be True or False"):
            self.small(calibrate="yes")


class TestBagsByInnerCrossValidation:
    """``bags_grid``: the number of bootstrap fits averaged is chosen by a cross-validation inside the
    training images, so held-out images of an outer cross-validation are never looked at."""

    @staticmethod
    def small(**options):
        from detens.heads import config_for

        return config_for("superlearner", epochs=2, hidden=8, depth=1, match_iou_grid=[], calibrate=False, **options)

    def test_each_candidate_is_scored_on_folds_it_was_not_fitted_on(self, ensemble):
        from detens.coco import detections_to_coco, evaluate_coco, fastest_backend
        from detens.heads import TRAINERS
        from detens.heads._fit import choose_by_inner_cv

        ids = ensemble.gt.annotated_image_ids
        fitted_on = []

        def fit(predictions, image_ids, config, progress, on_epoch):
            fitted_on.append(list(image_ids))
            return TRAINERS["superlearner"].fit(predictions, image_ids, config, progress, on_epoch)

        candidates = [self.small(bags=1), self.small(bags=3)]
        best, scores = choose_by_inner_cv(fit, ensemble, ids, candidates, folds=3, seed=5)
        splits = kfold_image_splits(ids, 3, 5)
        assert fitted_on == [train for train, _ in splits] * 2  # every candidate, every inner fold
        # the slow obvious way: fit on each fold's training side, fuse its held-out images, pool, score
        for candidate, score in zip(candidates, scores, strict=True):
            results = []
            for train, held_out in splits:
                head, _, _ = fit_head("superlearner", ensemble, train, candidate)
                for image_id in held_out:
                    fused = fuse(ensemble.per_model(image_id), "theta", head=head)
                    results += detections_to_coco(fused, image_id, decimals=None)
            expected = evaluate_coco(ensemble.gt, results, image_ids=ids, backend=fastest_backend())["map"]
            assert score == pytest.approx(expected, abs=1e-12)
        assert scores[best] == max(scores) and (best == 0 or scores[0] < scores[best])  # ties keep the first

    def test_fit_head_refits_with_the_choice_and_reports_it(self, ensemble):
        from detens.heads._fit import choose_by_inner_cv
        from detens.heads.bagged import BaggedHead

        ids = ensemble.gt.annotated_image_ids
        config = self.small(bags_grid=[3, 1, 3], inner_folds=2)
        assert config.bags_grid == [1, 3]
        head, history, fitted = fit_head("superlearner", ensemble, ids, config)
        best, scores = choose_by_inner_cv(
            lambda *a: fit_head("superlearner", *a[:3]), ensemble, ids,
            [self.small(bags=1), self.small(bags=3)], folds=2, seed=0,
        )
        assert fitted.bags == [1, 3][best] and fitted.bags_grid == []
        assert isinstance(head, BaggedHead) == (fitted.bags == 3)
        assert history.selection == {"option": "bags", "folds": 2,
                                     "held_out_map": {"1": scores[0], "3": scores[1]}}
        plain, _, _ = fit_head("superlearner", ensemble, ids, self.small(bags=fitted.bags))
        per_model = ensemble.per_model(ids[0])
        torch.testing.assert_close(fuse(per_model, "theta", head=head).scores, fuse(per_model, "theta", head=plain).scores)

    def test_cross_validation_reports_the_inner_choice(self, ensemble):
        report = cross_validate(ensemble, ["superlearner"], k=2, backend="faster", method_options={
            "superlearner": {"epochs": 2, "hidden": 8, "depth": 1, "match_iou_grid": [], "calibrate": False,
                             "bags_grid": [1, 2]}})
        for fold in report["superlearner"].fitted:
            assert fold["config"]["bags"] in (1, 2) and set(fold["inner_cv"]["held_out_map"]) == {"1", "2"}

    def test_bags_that_the_grid_would_overwrite_is_an_error(self):
        from detens.heads import train_config_from

        with pytest.raises(ValueError, match=r"bags 3 would not be used: .* among bags_grid \[1, 2\]"):
            self.small(bags=3, bags_grid=[1, 2])
        assert self.small(bags=3).bags == 3 and self.small(bags_grid=[1, 2]).bags == 1
        # a layer that gives bags alone onto a grid is named, as match_iou is
        with pytest.raises(ValueError, match=r"^--set: bags 1 would not be used.*\[1, 3\]"):
            train_config_from("deep", ("a.yaml", {"bags_grid": [1, 3]}), ("--set", {"bags": 1}))
        assert train_config_from("deep", ("a.yaml", {"bags": 1, "bags_grid": [1, 3]})).bags_grid == [1, 3]

    def test_bad_settings(self, ensemble):
        from detens.heads._fit import choose_by_inner_cv

        with pytest.raises(ValueError, match=r"bags_grid must be a list of integers >= 1, got \[1, 0\]"):
            self.small(bags_grid=[1, 0])
        with pytest.raises(ValueError, match="inner_folds must be an integer >= 2, got 1"):
            self.small(inner_folds=1)
        ids = ensemble.gt.annotated_image_ids[:2]
        with pytest.raises(ValueError, match="an inner 3-fold cross-validation needs at least 3 training images, got 2"):
            fit_head("superlearner", ensemble, ids, self.small(bags_grid=[1, 2], inner_folds=3))
        with pytest.raises(ValueError, match="at least one candidate"):
            choose_by_inner_cv(fit_head, ensemble, ids, [], folds=2)


class TestMedianBox:
    """``median_box``: the per-side median of the members' boxes where at least three see the object;
    ``auto`` keeps it when it raises the training images' mAP."""

    @staticmethod
    def small(**options):
        from detens.heads import config_for

        return config_for("deep", epochs=2, hidden=8, depth=1, match_iou_grid=[], calibrate=False, **options)

    @staticmethod
    def stray_sides(same_stray: bool, num_images: int = 8) -> EnsemblePredictions:
        """Three models, three objects per image. ``same_stray`` False: each model moves a different side of
        every box by 40 % of its size (two of three are exact on every side: the median is the ground
        truth). True: models 1 and 2 move the same side the same way and score low, model 0 is exact and
        scores high (the median is the stray side; the score-weighted box is close to model 0's)."""
        rng = random.Random(3)
        images, annotations, results = [], [], {"m0": [], "m1": [], "m2": []}
        for image_id in range(num_images):
            images.append({"id": image_id, "width": 320, "height": 240, "file_name": f"{image_id}.jpg"})
            for k in range(3):
                x, y = 20.0 + 100 * k + rng.uniform(0, 10), 40.0 + rng.uniform(0, 100)
                box = [x, y, x + 60.0, y + 60.0]
                annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": 1,
                                    "bbox": [x, y, 60.0, 60.0], "area": 3600.0, "iscrowd": 0})
                for m, name in enumerate(results):
                    moved = list(box)
                    side = 2 if same_stray else m
                    if not same_stray or m > 0:
                        moved[side] += 24.0 if side >= 2 else -24.0
                    score = (0.9 if m == 0 else 0.3) if same_stray else 0.8 - 0.1 * m
                    results[name].append({"image_id": image_id, "category_id": 1,
                                          "bbox": [moved[0], moved[1], moved[2] - moved[0], moved[3] - moved[1]],
                                          "score": score})
        gt = load_coco_gt({"images": images, "annotations": annotations,
                           "categories": [{"id": 1, "name": "thing"}]})
        return EnsemblePredictions(list(results), list(results.values()), gt)

    @staticmethod
    def training_map(head, predictions, on):
        from detens.coco import detections_to_coco, evaluate_coco, fastest_backend

        head.median_box = on
        ids = predictions.gt.annotated_image_ids
        results = []
        for image_id in ids:
            results += detections_to_coco(fuse(predictions.per_model(image_id), "theta", head=head), image_id, decimals=None)
        return evaluate_coco(predictions.gt, results, image_ids=ids, backend=fastest_backend())["map"]

    @pytest.mark.parametrize("same_stray, expected", [(False, True), (True, False)])
    def test_auto_keeps_it_where_it_raises_the_training_map(self, same_stray, expected):
        predictions = self.stray_sides(same_stray)
        ids = predictions.gt.annotated_image_ids
        head, _, fitted = fit_head("deep", predictions, ids, self.small())
        assert fitted.median_box is expected and head.median_box is expected
        # the slow obvious way: score the training images with the median box off and on
        off, on = self.training_map(head, predictions, False), self.training_map(head, predictions, True)
        assert (on > off) is expected
        if not same_stray:
            assert on == pytest.approx(1.0)  # two exact sides of three: the median is the ground truth

    def test_auto_on_real_shaped_data_is_the_better_of_the_two(self, ensemble):
        ids = ensemble.gt.annotated_image_ids
        head, _, fitted = fit_head("deep", ensemble, ids, self.small())
        off, on = self.training_map(head, ensemble, False), self.training_map(head, ensemble, True)
        assert fitted.median_box is (on > off)

    @pytest.mark.parametrize("fixed", [True, False])
    def test_a_fixed_setting_is_kept(self, fixed):
        predictions = self.stray_sides(not fixed)  # the data would choose the other
        head, _, fitted = fit_head("deep", predictions, predictions.gt.annotated_image_ids, self.small(median_box=fixed))
        assert fitted.median_box is fixed and head.median_box is fixed

    def test_bagged_members_share_the_choice(self):
        predictions = self.stray_sides(False)
        head, _, fitted = fit_head("deep", predictions, predictions.gt.annotated_image_ids, self.small(bags=2))
        assert fitted.median_box is True and all(member.median_box for member in head.members)

    def test_bad_setting(self):
        with pytest.raises(ValueError, match="median_box must be true, false or auto, got 'sometimes'"):
            self.small(median_box="sometimes")


def test_head_kind_names_the_head_a_method_fits():
    from detens.evaluation import MAX_K, head_kind
    from detens.heads import TRAINERS

    assert all(head_kind(kind) == kind for kind in TRAINERS)
    assert [head_kind(f"selection_k{k}") for k in range(1, MAX_K + 1)] == ["selection"] * MAX_K
    for name in ("mean", "wbf_tuned", "single:yolo26n", "random_k2", "oracle", "head:theta"):
        assert head_kind(name) is None


def test_load_train_config_refuses_a_key_set_both_by_set_and_by_its_own_flag():
    from detens.heads import config_for, load_train_config

    # without the refusal the flag's layer, last, would win and the --set value be dropped unseen
    with pytest.raises(ValueError, match=r"^--epochs 1 and --set epochs=2 both set epochs: give one of them$"):
        load_train_config("deep", overrides={"epochs": 2}, flags={"epochs": 1})
    assert load_train_config("deep", overrides={"lr": 0.01}, flags={"epochs": 1}) == config_for("deep", lr=0.01, epochs=1)
    # the overrides' layer is named as the command's user typed it (detens evaluate: --set HEAD.KEY=VALUE)
    with pytest.raises(TypeError, match=r"^--set theta.epochs: expected an integer, got str 'abc'$"):
        load_train_config("theta", overrides={"epochs": "abc"}, overrides_name="--set theta")
    with pytest.raises(ValueError, match=r"^unknown key 'epochz' in --set theta; .* Did you mean 'epochs'\?$"):
        load_train_config("theta", overrides={"epochz": 3}, overrides_name="--set theta")


def test_train_config_from_layers_the_user_keys_over_the_head_defaults():
    from detens.heads import config_for, theta_seed_config, train_config_from

    assert train_config_from("theta_seed") == theta_seed_config()
    partial = train_config_from("theta_seed", ("seed.yaml", {"lr": 0.05}))
    assert partial == theta_seed_config(lr=0.05)
    layered = train_config_from("deep", ("a.yaml", {"epochs": 3, "match_iou_grid": [0.6]}), ("--set", {"epochs": 4}))
    assert layered == config_for("deep", epochs=4, match_iou_grid=[0.6])
    # match_iou is overwritten by a non-empty grid: the layer that sets it alone is named
    with pytest.raises(ValueError, match=r"^--set: match_iou 0.5 would not be used.*\[0.6\]"):
        train_config_from("deep", ("a.yaml", {"match_iou_grid": [0.6]}), ("--set", {"match_iou": 0.5}))
    with pytest.raises(ValueError, match=r"^a.yaml: match_iou 0.5"):
        train_config_from("theta", ("a.yaml", {"match_iou": 0.5}))
    # a value out of range is refused as that, before whether the grid would overwrite it
    with pytest.raises(ValueError, match=r"^--set: match_iou must be in \(0, 1\), got -0.5$"):
        train_config_from("deep", ("--set", {"match_iou": -0.5}))
    assert train_config_from("selection", ("a.yaml", {"match_iou": 0.5})).match_iou == 0.5  # no grid by default
    assert train_config_from("deep", ("a.yaml", {"match_iou": 0.5, "match_iou_grid": []})).match_iou == 0.5
    with pytest.raises(ValueError, match=r"unknown key 'epoch' in b.yaml"):
        train_config_from("deep", ("a.yaml", {"epochs": 2}), ("b.yaml", {"epoch": 2}))


def test_a_shipped_training_config_of_another_head_type_is_named_as_such():
    """Each shipped YAML loads for its own head type; given to a head type whose options it does not fit,
    the error says whose config it is, rather than listing its first key as unknown."""
    from dataclasses import fields

    import yaml

    from detens.heads import load_train_config
    from detens.heads._fit import TRAINERS

    def options(head):
        return {f.name for f in fields(TRAINERS[head].config_class)}

    mismatched = 0
    for shipped in TRAINERS:
        load_train_config(shipped, shipped)
        keys = set(yaml.safe_load((REPO / "detens" / "configs" / "train" / f"{shipped}.yaml").read_text()))
        for kind in TRAINERS:
            if keys <= options(kind):
                load_train_config(kind, shipped)
                continue
            mismatched += 1
            with pytest.raises(ValueError, match=rf"{shipped}\.yaml is a training config of an? .*\b{shipped}\b.* head "
                                                 rf"\(its keys are that type's\), not of a {kind} head"):
                load_train_config(kind, shipped)
    assert mismatched >= 20  # most pairs of the six head types differ


def test_an_ensemble_config_given_for_a_training_config_is_named_as_one():
    from detens.heads import load_train_config
    from detens.heads._fit import TRAINERS

    ensemble = REPO / "detens" / "configs" / "ensembles" / "coco_yolo3.yaml"
    for kind in TRAINERS:
        with pytest.raises(ValueError, match=rf"coco_yolo3\.yaml is an ensemble config \(its keys are those of detens "
                                             rf"fuse / detens cache --config\), not a training config of a {kind} head"):
            load_train_config(kind, ensemble)


@pytest.mark.parametrize("kind, keys, error, message", [
    ("deep", {"box": "nope"}, ValueError, r"box must be one of score_weighted, mean, learned, got 'nope'"),
    ("deep", {"members": 0}, ValueError, r"members must be an integer >= 1, got 0"),
    ("deep", {"activation": "gelu"}, ValueError, r"activation must be one of relu, silu, sigmoid, tanh, got 'gelu'"),
    ("deep", {"hidden": 0}, ValueError, r"hidden must be an integer >= 1, got 0"),
    ("deep", {"features": ["nope"]}, ValueError, r"features: unknown feature groups \['nope'\]; valid groups: present"),
    ("superlearner", {"lambda_cls": -1.0}, ValueError, r"lambda_cls must be a number >= 0, got -1.0"),
    ("selection", {"k": 0}, ValueError, r"k must be an integer >= 1, got 0"),
    ("selection", {"epsilon": -1.0}, ValueError, r"epsilon must be a positive number, got -1.0"),
    ("selection", {"combine": "x"}, ValueError, r"combine must be one of mean, score_weighted, got 'x'"),
    ("selection", {"score": "max"}, ValueError, r"score must be one of mean_present, sum_k, sum_n, got 'max'"),
    ("selection", {"num_samples": 0}, ValueError, r"num_samples must be an integer >= 1, got 0"),
    ("calibration", {"tie_break": 2.0}, ValueError, r"tie_break must be in \[0, 1\), got 2.0"),
    ("calibration", {"shrinkage": -5.0}, ValueError, r"shrinkage must be a number >= 0, got -5.0"),
    ("calibration", {"fuser_params": {"wbf": {"bogus": 1}}}, TypeError,
     r"fuser_params \{'bogus': 1\} do not fit the 'wbf' fuser: .*takes no parameter \['bogus'\]"),
    ("calibration", {"fusers": ["wbf", "nope"], "fuser_params": {}}, ValueError,
     r"fusers\[1\]: unknown fusion method 'nope'; valid names: mean"),
    # per-model weights tell the ensemble's size, and with it a vote's largest min_votes
    ("calibration", {"fusers": ["vote"], "fuser_params": {"vote": {"weights": [1, 2], "min_votes": 3}}}, ValueError,
     r"min_votes must be an integer in \[1, 2\], got 3"),
])
def test_head_options_are_checked_when_the_config_is_made(kind, keys, error, message):
    from detens.heads import TRAINERS, config_for, train_config_from

    with pytest.raises(error, match=message):
        TRAINERS[kind].config_class(**keys)
    with pytest.raises(error, match=message):
        config_for(kind, **keys)
    with pytest.raises((TypeError, ValueError), match=message):  # a TypeError comes back naming the file
        train_config_from(kind, ("a.yaml", keys))


@pytest.mark.parametrize("fusers", [["refine"], ["soft_nms"], ["wbf", "refine"]])
def test_any_list_of_fusers_is_a_calibration_config_as_it_is(fusers):
    from detens.heads import config_for

    config = config_for("calibration", fusers=fusers)
    assert config.fusers == fusers and config.fuser_params == {}
    with pytest.raises(ValueError, match=r"fuser_params names fusers \['wbf'\] that are not in fusers \['refine'\]"):
        config_for("calibration", fusers=["refine"], fuser_params={"wbf": {"iou_thr": 0.6}})


def test_a_method_name_that_is_none_is_refused_with_every_valid_name():
    from detens.evaluation import check_method_names, expand_methods, method_names

    valid = ", ".join(method_names())
    assert method_names() == sorted(["single", *METHODS.names()])
    with pytest.raises(ValueError, match=rf"^no methods given; valid names: {re.escape(valid)}$"):
        check_method_names([])
    for check in (check_method_names, lambda names: expand_methods(names, ["a", "b"])):
        with pytest.raises(ValueError, match=rf"^unknown evaluation method 'singel'; valid names: {re.escape(valid)}\. "
                                             r"Did you mean 'single'\?$"):
            check(["wbf", "singel"])
        with pytest.raises(ValueError, match=rf"^unknown evaluation method 'sngle:'; valid names: {re.escape(valid)}\."):
            check(["sngle:a"])


def test_a_method_named_twice_is_refused():
    from detens.evaluation import expand_methods

    assert expand_methods(["single", "wbf"], ["a", "b"]) == ["single:a", "single:b", "wbf"]
    with pytest.raises(ValueError, match=r"name \['single:b'\] twice \('single' is every single:<model>\)"):
        expand_methods(["single", "single:b", "wbf"], ["a", "b"])
    with pytest.raises(ValueError, match=r"name \['wbf'\] twice"):
        expand_methods(["wbf", "wbf"], ["a", "b"])


def test_options_that_depend_on_the_ensemble_are_left_to_the_fit():
    from detens.heads import config_for

    # without weights the ensemble's size is unknown: a vote of 5 models is fine until the data says otherwise
    assert config_for("calibration", fusers=["vote"], fuser_params={"vote": {"min_votes": 5}}).fusers == ["vote"]
    assert config_for("calibration", fusers=["wbf"], fuser_params={"wbf": {"weights": [1, 2, 3]}}).fusers == ["wbf"]
    # the groups of pairwise features select no column for one model, but do for the two or more of most ensembles
    assert config_for("deep", features=["iou"]).features == ["iou"]


def test_a_bad_head_option_fails_before_any_method_runs(ensemble):
    done = []
    with pytest.raises(ValueError, match="box must be one of"):
        cross_validate(ensemble, ["mean", "theta", "deep"], k=2, backend="faster",
                       method_options={"deep": {"box": "nope"}}, on_method=lambda name, result: done.append(name))
    assert done == []


def test_calibration_fusers_must_be_a_list():
    from detens.heads import config_for

    with pytest.raises(TypeError, match="fusers must be a list of fuser names, got str: 'wbf'"):
        config_for("calibration", fusers="wbf")
    with pytest.raises(TypeError, match="fuser_params must be a mapping of fuser name to parameters, got list"):
        config_for("calibration", fuser_params=["wbf"])
    assert config_for("calibration", fusers=["wbf"]).fusers == ["wbf"]


def test_images_without_annotations_are_said_to_be_left_out_of_scoring(dataset, tmp_path, capsys):
    """A plain COCOeval over the file counts their false positives; the log says the table does not."""
    gt_path, predictions = dataset
    gt = json.loads(gt_path.read_text())
    top = max(im["id"] for im in gt["images"])
    gt["images"] += [{"id": top + 1, "file_name": "bg1.jpg", "width": 64, "height": 48},
                     {"id": top + 2, "file_name": "bg2.jpg", "width": 64, "height": 48}]
    (tmp_path / "instances.json").write_text(json.dumps(gt))
    assert evaluate_cli.main([
        "--gt", str(tmp_path / "instances.json"), "--predictions", str(predictions), "--methods", "single:sharp",
        "--cv", "2", "--out", str(tmp_path / "report.json"),
    ]) == 0  # the command's log goes to stderr, above the progress bars, unless --quiet
    assert "2 images of --gt without annotations are neither scored nor fitted on" in capsys.readouterr().err
    assert EvaluationRecord.load(tmp_path / "report.json").meta["scored_images"] == 12


def _without_annotations(gt_path, tmp_path) -> Path:
    """The annotation file of ``gt_path`` with its images and none of its annotations."""
    gt = json.loads(Path(gt_path).read_text())
    (tmp_path / "background.json").write_text(json.dumps({**gt, "annotations": []}))
    return tmp_path / "background.json"


def test_no_annotated_image_to_score_is_refused_before_any_fit(dataset, ensemble, tmp_path, monkeypatch):
    gt_path, predictions = dataset
    background = EnsemblePredictions.from_folder(predictions, load_coco_gt(_without_annotations(gt_path, tmp_path)))
    fits = tuned_wbf_fits(monkeypatch)
    for options in ({"k": 2, "all_images": True}, {"k": 0, "fit_on": ensemble}):
        with pytest.raises(ValueError, match="the scored data has no annotated image: there is no ground truth"):
            cross_validate(background, ["wbf_tuned", "mean"], backend="faster", **options)
    assert fits == []


@pytest.mark.parametrize("command", ["evaluate", "train"])
def test_the_commands_name_a_gt_without_annotations(dataset, tmp_path, capsys, command):
    gt_path, predictions = dataset
    background = _without_annotations(gt_path, tmp_path)
    args = ["--gt", str(background), "--predictions", str(predictions), "--quiet"]
    if command == "evaluate":
        code = evaluate_cli.main([*args, "--methods", "mean", "--all-images", "--out", str(tmp_path / "r.json")])
        expected = f"--gt {background} has no annotated image: there is no ground truth to score methods against"
    else:
        code = train_cli.main([*args, "--head", "calibration", "--out", str(tmp_path / "head.json")])
        expected = f"--gt {background} has no annotated image to train on"
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: detens {command}: {expected} (see detens {command} --help)\n", err
    assert sorted(tmp_path.iterdir()) == [background]


@pytest.mark.parametrize("head", ["deep", "theta"])
def test_train_refuses_to_fit_on_images_without_any_annotation(dataset, tmp_path, capsys, head):
    """--all-images fits on images without annotations as negatives; with nothing else, every target is 0."""
    gt_path, predictions = dataset
    background = _without_annotations(gt_path, tmp_path)
    code = train_cli.main(["--gt", str(background), "--predictions", str(predictions), "--quiet", "--all-images",
                           "--head", head, "--epochs", "1", "--out", str(tmp_path / "head.json")])
    images = len(load_coco_gt(background).image_ids)
    err = capsys.readouterr().err
    assert code == 2 and err == (
        f"error: detens train: none of the {images} images to train on has an annotation (--gt {background}): a head "
        "fitted on them could only learn to score every box 0 (see detens train --help)\n"), err
    assert sorted(tmp_path.iterdir()) == [background]


@pytest.mark.parametrize("command", ["evaluate", "train"])
def test_models_are_read_as_methods_are(dataset, tmp_path, capsys, command):
    """The spaces around a name are not part of it and an empty name between commas is passed over, as in
    --methods; a value that names no model (an unset shell variable) is an error, not every model."""
    gt_path, predictions = dataset

    def run(models, out):
        args = ["--gt", str(gt_path), "--predictions", str(predictions), "--models", models, "--out", str(out),
                "--quiet"]
        if command == "evaluate":
            return evaluate_cli.main([*args, "--methods", "mean", "--backend", "faster"])
        return train_cli.main([*args, "--head", "calibration"])

    out = tmp_path / "out.json"
    assert run(" blurry , sharp,", out) == 0
    chosen = EvaluationRecord.load(out).meta["models"] if command == "evaluate" else load_head(out).model_names
    assert chosen == ["blurry", "sharp"]
    for value in ("", " , "):
        assert run(value, tmp_path / "refused.json") == 2
        err = capsys.readouterr().err
        assert err == (f"error: --models {value!r} names no model; give model names separated by commas; "
                       "valid names: blurry, noisy, sharp\n"), err
        assert not (tmp_path / "refused.json").exists()


@pytest.mark.parametrize("command, flag", [("evaluate", "--fit-on"), ("evaluate", "--also-fit-on"),
                                           ("train", "--also-fit-on")])
def test_fitting_data_without_annotations_is_named(dataset, tmp_path, capsys, command, flag):
    """Not trained on as if given: train would fit on --gt alone, evaluate said only 'the extra fitting data'."""
    gt_path, predictions = dataset
    background = _without_annotations(gt_path, tmp_path)
    args = ["--gt", str(gt_path), "--predictions", str(predictions), flag, str(background), str(predictions), "--quiet"]
    if command == "evaluate":
        code = evaluate_cli.main([*args, "--methods", "mean", "--cv", "0" if flag == "--fit-on" else "2",
                                  "--out", str(tmp_path / "r.json")])
    else:
        code = train_cli.main([*args, "--head", "calibration", "--out", str(tmp_path / "head.json")])
    err = capsys.readouterr().err
    verb = "fit" if command == "evaluate" else "train"
    assert code == 2 and err == (f"error: detens {command}: {flag}'s annotation file {background} has no annotated "
                                 f"image to {verb} on (see detens {command} --help)\n"), err
    assert sorted(tmp_path.iterdir()) == [background]


# --------------------------------------------------------------- images without annotations: --all-images
@pytest.fixture(scope="module")
def with_background(dataset, tmp_path_factory):
    """The 12-image slice with two images without annotations added (file names bg1.jpg, bg2.jpg), on
    which every model has false positives, some scored high."""
    gt_path, predictions = dataset
    root = tmp_path_factory.mktemp("background")
    gt = json.loads(gt_path.read_text())
    top = max(im["id"] for im in gt["images"])
    background = [top + 1, top + 2]
    gt["images"] += [{"id": image_id, "file_name": f"bg{n}.jpg", "width": 640, "height": 480}
                     for n, image_id in enumerate(background, 1)]
    (root / "instances.json").write_text(json.dumps(gt))
    (root / "predictions").mkdir()
    category_ids = sorted({a["category_id"] for a in gt["annotations"]})
    for index, name in enumerate(MODELS):
        rng = random.Random(100 + index)
        results = json.loads((predictions / f"{name}.json").read_text())
        for image_id in background:
            for _ in range(6):
                results.append({"image_id": image_id, "category_id": rng.choice(category_ids),
                                "bbox": [rng.uniform(0, 500), rng.uniform(0, 380), rng.uniform(20, 120),
                                         rng.uniform(20, 90)], "score": rng.uniform(0.05, 0.95)})
        (root / "predictions" / f"{name}.json").write_text(json.dumps(results))
    return root / "instances.json", root / "predictions", background


def cocoeval_map(gt_path, results, image_ids=None):
    """pycocotools' COCOeval on the annotation file, as one runs it by hand: every image of the file by
    default."""
    import contextlib
    import copy
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(gt_path))
        evaluator = COCOeval(coco, coco.loadRes(copy.deepcopy(results)), "bbox")
        if image_ids is not None:
            evaluator.params.imgIds = list(image_ids)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return float(evaluator.stats[0])


class TestAllImages:
    def _evaluate(self, gt_path, predictions, out, *flags):
        assert evaluate_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--methods",
                                  "single:sharp,wbf", "--cv", "2", "--out", str(out), "--quiet", *flags]) == 0
        return json.loads(out.read_text())

    def _wbf_results(self, gt_path, predictions, image_ids):
        from detens.coco import detections_to_coco

        ensemble = EnsemblePredictions.from_folder(predictions, load_coco_gt(gt_path))
        return [r for i in image_ids for r in detections_to_coco(fuse(ensemble.per_model(i), "wbf"), i, decimals=None)]

    def test_single_models_and_fixed_fusers_equal_cocoeval_over_the_whole_file(self, with_background, tmp_path):
        gt_path, predictions, background = with_background
        every = sorted(im["id"] for im in json.loads(gt_path.read_text())["images"])
        annotated = [i for i in every if i not in background]
        sharp = json.loads((predictions / "sharp.json").read_text())
        wbf = self._wbf_results(gt_path, predictions, every)

        table = self._evaluate(gt_path, predictions, tmp_path / "all.json", "--all-images")
        assert table["single:sharp"]["map"] == pytest.approx(cocoeval_map(gt_path, sharp), abs=1e-12)
        assert table["wbf"]["map"] == pytest.approx(cocoeval_map(gt_path, wbf), abs=1e-12)
        # without the flag: the annotated images alone, the figures of the file without its background images
        plain = self._evaluate(gt_path, predictions, tmp_path / "plain.json")
        assert plain["single:sharp"]["map"] == pytest.approx(cocoeval_map(gt_path, sharp, annotated), abs=1e-12)
        assert plain["wbf"]["map"] == pytest.approx(cocoeval_map(gt_path, wbf, annotated), abs=1e-12)
        for method in ("single:sharp", "wbf"):
            assert table[method]["map"] < plain[method]["map"]  # the background images' false positives count

    def test_without_the_flag_the_table_is_that_of_the_file_without_its_background_images(
            self, dataset, with_background, tmp_path):
        gt_path, predictions, _ = with_background
        plain = self._evaluate(gt_path, predictions, tmp_path / "plain.json")
        before = self._evaluate(*dataset, tmp_path / "before.json")
        strip = ("fusion_ms",)
        assert ({m: {k: v for k, v in row.items() if k not in strip} for m, row in plain.items()}
                == {m: {k: v for k, v in row.items() if k not in strip} for m, row in before.items()})

    def test_the_record_and_its_page_hold_the_background_images(self, with_background, tmp_path):
        from detens.report.page import write_report

        gt_path, predictions, background = with_background
        table = self._evaluate(gt_path, predictions, tmp_path / "all.json", "--all-images")
        record = EvaluationRecord.load(tmp_path / "all.json")
        assert record.meta["all_images"] is True and record.meta["scored_images"] == 14
        assert set(background) <= set(record.image_ids) and len(record.image_ids) == 14
        assert sum(record.meta["folds"]) == 14 and "images without annotations scored" in record.meta["protocol"]
        assert {r["image_id"] for r in record.results["wbf"]} >= set(background)
        html = write_report(record, tmp_path / "page", examples=0).read_text()  # its curves check the table
        assert "14 images scored, 12 with ground truth and 2 without (their detections are false positives)" in html
        assert json.loads((tmp_path / "page" / "page.json").read_text())["metrics"] == table
        plain = self._evaluate(gt_path, predictions, tmp_path / "plain.json")
        assert plain and EvaluationRecord.load(tmp_path / "plain.json").meta["all_images"] is False

    def test_learned_methods_fit_on_the_background_images_in_their_folds(self, with_background, monkeypatch):
        gt_path, predictions, background = with_background
        ensemble = EnsemblePredictions.from_folder(predictions, load_coco_gt(gt_path))
        seen = tuned_wbf_fits(monkeypatch)
        for all_images in (False, True):
            cross_validate(ensemble, ["wbf_tuned"], k=2, backend="faster", method_options=ONE_GRID_POINT,
                           all_images=all_images)
        without, with_negatives = seen[:2], seen[2:]
        annotated = ensemble.gt.annotated_image_ids
        assert [[i for i in ids if i in annotated] for ids in with_negatives] == without  # the same folds
        assert not {i for ids in without for i in ids} & set(background)
        # each background image is fitted on in the one fold that does not score it
        assert sorted(i for ids in with_negatives for i in ids if i in background) == background
        for (_, test), train in zip(kfold_image_splits(annotated, 2, 0, background), with_negatives, strict=True):
            assert sorted(train) == sorted(set(ensemble.gt.image_ids) - set(test))

    @staticmethod
    def _fitting_data(gt: dict, predictions: Path, folder: Path) -> EnsemblePredictions:
        """The images of ``gt`` (a COCO dict) with the members' predictions on them, cached in ``folder``."""
        kept = {image["id"] for image in gt["images"]}
        folder.mkdir()
        for name in MODELS:
            results = [r for r in json.loads((predictions / f"{name}.json").read_text()) if r["image_id"] in kept]
            (folder / f"{name}.json").write_text(json.dumps(results))
        return EnsemblePredictions.from_folder(folder, load_coco_gt(gt))

    def test_the_fitting_datas_background_images_are_fitted_on_too(self, dataset, with_background, tmp_path,
                                                                 monkeypatch):
        gt_path, predictions, background = with_background
        evaluated = EnsemblePredictions.from_folder(dataset[1], load_coco_gt(dataset[0]))
        # the fitting data: the background images alone would have no annotated image, so with one annotated
        gt = json.loads(gt_path.read_text())
        keep = {background[0], background[1], gt["annotations"][0]["image_id"]}
        fitting = {"images": [{**im, "file_name": "fit_" + im["file_name"]} for im in gt["images"] if im["id"] in keep],
                   "annotations": [a for a in gt["annotations"] if a["image_id"] in keep],
                   "categories": gt["categories"]}
        fit_on = self._fitting_data(fitting, predictions, tmp_path / "predictions")
        seen = tuned_wbf_fits(monkeypatch)
        for all_images in (False, True):
            cross_validate(evaluated, ["wbf_tuned"], k=0, backend="faster", method_options=ONE_GRID_POINT,
                           fit_on=fit_on, all_images=all_images)
        assert [len(ids) for ids in seen] == [1, 3]

    def test_an_image_without_annotations_in_both_datasets_is_refused_when_both_are_scored_or_fitted(
            self, with_background, tmp_path):
        gt_path, predictions, background = with_background
        ensemble = EnsemblePredictions.from_folder(predictions, load_coco_gt(gt_path))
        gt = json.loads(gt_path.read_text())
        first_annotated = gt["annotations"][0]["image_id"]
        keep = {background[0], first_annotated}
        fitting = {"images": [{**im, "file_name": im["file_name"] if im["id"] in background else "other.jpg"}
                              for im in gt["images"] if im["id"] in keep],
                   "annotations": [a for a in gt["annotations"] if a["image_id"] in keep],
                   "categories": gt["categories"]}
        fit_on = self._fitting_data(fitting, predictions, tmp_path / "predictions")
        cross_validate(ensemble, ["mean"], k=2, backend="faster", fit_on=fit_on)  # bg1.jpg neither scored nor fitted
        with pytest.raises(ValueError, match=r"shares 1 image with the scored data \(same file name, folders aside: "
                                             r"bg1\.jpg\); the fitting data must not contain scored images"):
            cross_validate(ensemble, ["mean"], k=2, backend="faster", fit_on=fit_on, all_images=True)

    def test_train_fits_on_every_image(self, with_background, tmp_path, capsys):
        gt_path, predictions, background = with_background
        args = ["--gt", str(gt_path), "--predictions", str(predictions), "--head", "calibration", "--quiet"]
        assert train_cli.main([*args, "--out", str(tmp_path / "all.json"), "--all-images"]) == 0
        assert json.loads((tmp_path / "all.json.log.json").read_text())["images"] == 14
        every = sorted(im["id"] for im in json.loads(gt_path.read_text())["images"])
        (tmp_path / "ids.txt").write_text("\n".join(map(str, every)) + "\n")
        assert train_cli.main([*args, "--out", str(tmp_path / "listed.json"), "--images-from",
                               str(tmp_path / "ids.txt")]) == 0
        assert (tmp_path / "all.json").read_bytes() == (tmp_path / "listed.json").read_bytes()
        assert train_cli.main([*args, "--out", str(tmp_path / "plain.json")]) == 0
        assert json.loads((tmp_path / "plain.json.log.json").read_text())["images"] == 12
        assert (tmp_path / "plain.json").read_bytes() != (tmp_path / "all.json").read_bytes()
        capsys.readouterr()
        assert train_cli.main([*args, "--out", str(tmp_path / "both.json"), "--all-images", "--images-from",
                               str(tmp_path / "ids.txt")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--images-from lists the images to train on and --all-images" in err

    def test_train_fits_on_every_image_of_the_extra_data_too_and_on_each_once(self, with_background, tmp_path, capsys):
        gt_path, predictions, background = with_background
        gt = json.loads(gt_path.read_text())
        keep = {*background, gt["annotations"][0]["image_id"]}
        for name, rename in (("apart", lambda n: "fit_" + n), ("shared", lambda n: n if n.startswith("bg") else "x.jpg")):
            folder = tmp_path / name
            (folder / "predictions").mkdir(parents=True)
            fitting = {"images": [{**im, "file_name": rename(im["file_name"])} for im in gt["images"] if im["id"] in keep],
                       "annotations": [a for a in gt["annotations"] if a["image_id"] in keep],
                       "categories": gt["categories"]}
            (folder / "instances.json").write_text(json.dumps(fitting))
            for model in MODELS:
                results = [r for r in json.loads((predictions / f"{model}.json").read_text()) if r["image_id"] in keep]
                (folder / "predictions" / f"{model}.json").write_text(json.dumps(results))
        args = ["--gt", str(gt_path), "--predictions", str(predictions), "--head", "calibration", "--quiet"]
        for flags, images in (([], 12 + 1), (["--all-images"], 14 + 3)):
            out = tmp_path / f"head{len(flags)}.json"
            assert train_cli.main([*args, *flags, "--out", str(out), "--also-fit-on", str(tmp_path / "apart" / "instances.json"),
                                   str(tmp_path / "apart" / "predictions")]) == 0
            assert json.loads(out.with_name(out.name + ".log.json").read_text())["images"] == images
        also = ["--also-fit-on", str(tmp_path / "shared" / "instances.json"), str(tmp_path / "shared" / "predictions")]
        assert train_cli.main([*args, "--out", str(tmp_path / "s.json"), *also]) == 0  # bg1.jpg, bg2.jpg not trained on
        capsys.readouterr()
        assert train_cli.main([*args, "--out", str(tmp_path / "s2.json"), "--all-images", *also]) == 2
        err = capsys.readouterr().err
        assert "--also-fit-on's data shares 2 images with the training images of --gt (same file name, folders aside: " \
               "bg1.jpg, bg2.jpg)" in err, err


def _best_per_image(results, max_det):
    """The obvious cut: each image's results sorted by score (stable, so ties keep their order), the first
    ``max_det``."""
    by_image: dict[int, list[dict]] = {}
    for r in results:
        by_image.setdefault(r["image_id"], []).append(r)
    return [r for rows in by_image.values() for r in sorted(rows, key=lambda r: -r["score"])[:max_det]]


class TestMaxDet:
    def test_each_image_is_scored_on_its_best_boxes(self, ensemble):
        from detens.coco import evaluate_coco

        methods = ["mean", "single:noisy", "wbf_tuned"]
        fixed = {"wbf_tuned": {**ONE_GRID_POINT["wbf_tuned"], "max_widenings": 0}}  # the same setting either way
        every = cross_validate(ensemble, methods, k=2, backend="faster", method_options=fixed)
        capped = cross_validate(ensemble, methods, k=2, backend="faster", method_options=fixed, max_det=3)
        ids = ensemble.gt.annotated_image_ids
        for method in methods:
            expected = _best_per_image(every[method].results, 3)
            assert sorted(map(json.dumps, capped[method].results)) == sorted(map(json.dumps, expected))
            assert capped[method].metrics["map"] == pytest.approx(
                evaluate_coco(ensemble.gt, expected, image_ids=ids, backend="faster")["map"], abs=1e-12)
            assert capped[method].metrics["map"] < every[method].metrics["map"]  # 3 boxes miss objects here

    def test_the_search_on_the_fitting_images_scores_the_cut_boxes(self, ensemble):
        from detens.coco import detections_to_coco, evaluate_coco

        ids = ensemble.gt.annotated_image_ids[:8]

        def predict(image_id):
            return fuse(ensemble.per_model(image_id), "wbf")

        every = [r for i in ids for r in detections_to_coco(predict(i), i, decimals=None)]
        expected = evaluate_coco(ensemble.gt, _best_per_image(every, 2), image_ids=ids, backend="faster")["map"]
        assert EvaluationData(ensemble, max_det=2).score(predict, ids, backend="faster") == pytest.approx(
            expected, abs=1e-12)
        assert EvaluationData(ensemble).score(predict, ids, backend="faster") > expected

    @pytest.mark.parametrize(("max_det", "error", "message"), [
        (0, ValueError, "max_det must be an integer >= 1, got 0"),
        (2.0, TypeError, "max_det must be an integer, got float: 2.0"),
    ])
    def test_a_bad_max_det_is_named_before_any_method_runs(self, ensemble, monkeypatch, max_det, error, message):
        monkeypatch.setattr(FixedFusion, "predict", lambda *a: pytest.fail("a method ran"))
        with pytest.raises(error, match=f"^{message}$"):
            cross_validate(ensemble, ["mean"], k=2, backend="faster", max_det=max_det)

    def test_the_command_says_it_in_the_protocol_and_the_record(self, dataset, tmp_path, capsys):
        from detens.coco import detections_to_coco

        gt_path, predictions = dataset
        out = tmp_path / "t.json"
        assert evaluate_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--methods", "mean",
                                  "--cv", "2", "--max-det", "3", "--out", str(out), "--quiet"]) == 0
        record = EvaluationRecord.load(record_path(out))
        assert record.meta["max_det"] == 3 and record.meta["protocol"].endswith(", each image's 3 best boxes scored")
        assert max(collections.Counter(r["image_id"] for r in record.results["mean"]).values()) == 3
        # the members the report compares with are cut as the methods are
        every = EnsemblePredictions.from_folder(predictions, load_coco_gt(gt_path))
        for n, name in enumerate(record.meta["models"]):
            expected = [r for i in record.image_ids for r in _best_per_image(
                detections_to_coco(every.per_model(i)[n], i, decimals=None), 3)]
            assert sorted(map(json.dumps, record.members[name])) == sorted(map(json.dumps, expected))
        for bad, message in (("0", "expected an integer >= 1, got 0"), ("x", "expected an integer >= 1, got 'x'")):
            with pytest.raises(SystemExit) as exit_status:
                evaluate_cli.main(["--gt", str(gt_path), "--predictions", str(predictions), "--out",
                                   str(tmp_path / "bad.json"), "--max-det", bad])
            assert exit_status.value.code == 2
            err = capsys.readouterr().err
            assert "--max-det" in err and message in err and "Traceback" not in err, err


class TestMaxDetInTheHeadsChoices:
    """``score_max_det``: a head's choices on its fitting images score what the evaluation scores."""

    def test_the_fitting_images_map_is_that_of_each_images_best_boxes(self, ensemble):
        from detens.coco import detections_to_coco, evaluate_coco
        from detens.heads._fit import _pooled_map

        ids = ensemble.gt.annotated_image_ids
        fused = {i: fuse(ensemble.per_model(i), "wbf") for i in ids}
        every = [r for i in ids for r in detections_to_coco(fused[i], i, decimals=None)]
        for max_det in (1, 2, 4):
            expected = evaluate_coco(ensemble.gt, _best_per_image(every, max_det), image_ids=ids)["map"]
            assert _pooled_map(ensemble.gt, fused.items(), ids, max_det) == pytest.approx(expected, abs=1e-12)
        assert _pooled_map(ensemble.gt, fused.items(), ids) == pytest.approx(
            evaluate_coco(ensemble.gt, every, image_ids=ids)["map"], abs=1e-12)

    @pytest.mark.parametrize("kind, options", [
        ("deep", {"epochs": 1, "hidden": 8, "depth": 1, "match_iou_grid": [0.55, 0.7], "median_box": "auto"}),
        ("theta", {"epochs": 2, "match_iou_grid": [0.6, 0.7]}),
        ("calibration", {"fusers": ["wbf", "soft_nms"]}),
        ("superlearner", {"epochs": 1, "hidden": 8, "depth": 1, "match_iou_grid": [], "bags_grid": [1, 2]}),
    ])
    def test_evaluate_max_det_reaches_every_choice_of_the_fit(self, ensemble, monkeypatch, kind, options):
        import detens.heads._fit as fit_module

        cuts = []
        original = fit_module._pooled_map

        def spy(gt, fused, image_ids, max_det=None):
            cuts.append(max_det)
            return original(gt, fused, image_ids, max_det)

        monkeypatch.setattr(fit_module, "_pooled_map", spy)
        report = cross_validate(ensemble, [kind], k=2, backend="faster", method_options={kind: options}, max_det=3)
        # per fit: each matching IoU (and the median box off and on), each fuser, each number of bags
        choices = {"deep": 2 + 2, "theta": 2, "calibration": 2, "superlearner": 2}[kind]
        assert cuts == [3] * (2 * choices)
        assert [fold["config"]["score_max_det"] for fold in report[kind].fitted] == [3, 3]
        cuts.clear()
        cross_validate(ensemble, [kind], k=2, backend="faster", method_options={kind: options})
        assert cuts == [None] * (2 * choices)

    @pytest.mark.parametrize("kind", ["theta", "theta_seed", "deep", "selection", "superlearner", "calibration"])
    @pytest.mark.parametrize(("value", "error", "message"), [
        (0, ValueError, "score_max_det must be an integer >= 1, got 0"),
        ("100", TypeError, "score_max_det must be an integer, got str: '100'"),
        (True, TypeError, "score_max_det must be an integer, got bool: True"),
    ])
    def test_a_bad_score_max_det_is_named(self, kind, value, error, message):
        from detens.heads import config_for

        with pytest.raises(error, match=f"^{message}$"):
            config_for(kind, score_max_det=value)

    def test_a_training_config_that_cuts_otherwise_than_the_evaluation_is_refused(self, ensemble, monkeypatch):
        monkeypatch.setattr(FixedFusion, "predict", lambda *a: pytest.fail("a method ran"))
        for max_det, scored in ((3, "scores each image's 3 best boxes"), (None, "scores every box")):
            with pytest.raises(ValueError, match=rf"^deep: its training config's score_max_det 50 would choose its "
                               rf"settings by other boxes than the evaluation scores \(it {scored}\); leave it out, "
                               rf"the evaluation sets it \(--max-det\)$"):
                cross_validate(ensemble, ["mean", "deep"], k=2, backend="faster",
                               method_options={"deep": {"score_max_det": 50}}, max_det=max_det)
        # the same cut is no conflict
        build_method("deep", ensemble.model_names, score_max_det=50).check_data(EvaluationData(ensemble, max_det=50))


@pytest.mark.parametrize("damage", ["cut short", "damaged within"])
def test_an_unreadable_finished_method_of_an_unfinished_run_runs_again(tmp_path, caplog, damage):
    """A finished method's .json.gz cut short (a full disk) or damaged within is named in a warning and left
    out, as a file that is not JSON is, where gzip's EOFError or zlib's error stopped the run."""
    from detens.evaluation import MethodResult
    from detens.jobs._unfinished import UnfinishedRun

    out = tmp_path / "report.json"
    UnfinishedRun(out, "key").save(0, "mean", MethodResult({"map": 0.5}, {}, {}, []))
    UnfinishedRun(out, "key").save(0, "wbf", MethodResult({"map": 0.6}, {}, {}, []))
    assert sorted(UnfinishedRun(out, "key").finished(0, ["mean", "wbf"])) == ["mean", "wbf"]
    path = UnfinishedRun(out, "key")._path(0, "mean")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "cut short" else data[:10] + b"\xff" * (len(data) - 18) + data[-8:])
    with caplog.at_level(logging.WARNING, logger="detens.jobs._unfinished"):
        assert list(UnfinishedRun(out, "key").finished(0, ["mean", "wbf"])) == ["wbf"]
    assert [r.getMessage().startswith(f"{path}: cannot read the finished mean (") and r.getMessage().endswith("); it runs again")
            for r in caplog.records] == [True], caplog.records
