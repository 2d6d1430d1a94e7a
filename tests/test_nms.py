"""``nms`` against ``ensemble_boxes.nms``; ``soft_nms`` against a slow pure-Python reference (decayed scores)."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest
import torch
from test_wbf import random_models  # tests/ is on sys.path under pytest

from detens import Detections
from detens.detections import MAX_LABEL
from detens.fusers import fuse
from detens.fusers.nms import nms_fusion, soft_nms_fusion

ensemble_boxes = pytest.importorskip("ensemble_boxes")

TOL = 1e-5


def _case(seed: int):
    rng = np.random.default_rng(1000 + seed)
    num_models = int(rng.integers(2, 6))
    image_size = (int(rng.integers(64, 1200)), int(rng.integers(64, 1200)))
    per_model = random_models(rng, num_models, image_size, int(rng.integers(1, 25)), int(rng.integers(1, 7)))
    weights = None if rng.random() < 0.3 else rng.uniform(0.1, 3.0, num_models).tolist()
    return per_model, weights, rng


def reference_inputs(per_model):
    height, width = per_model[0].image_size
    scale = torch.tensor([width, height, width, height], dtype=torch.float64)
    boxes = [(d.boxes.double() / scale).numpy() for d in per_model]
    scores = [d.scores.double().numpy() for d in per_model]
    labels = [d.labels.numpy() for d in per_model]
    return boxes, scores, labels


def as_sorted_rows(boxes, scores, labels) -> np.ndarray:
    """[k, 6] rows (label, score, box) in a canonical order, to compare outputs ordered differently."""
    rows = np.concatenate(
        [np.asarray(labels, dtype=np.float64)[:, None], np.asarray(scores, dtype=np.float64)[:, None],
         np.asarray(boxes, dtype=np.float64).reshape(-1, 4)], axis=1)
    return rows[np.lexsort(rows.T[::-1])]


def normalized_rows(fused: Detections) -> np.ndarray:
    height, width = fused.image_size
    scale = torch.tensor([width, height, width, height], dtype=torch.float64)
    return as_sorted_rows((fused.boxes.double() / scale).numpy(), fused.scores.double().numpy(), fused.labels.numpy())


def _iou(a, b):
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(iw, 0.0) * max(ih, 0.0)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def reference_soft_nms(per_model, weights, iou_thr, sigma, thresh, method):
    """Slow, obviously correct Soft-NMS (Bodla et al. 2017) per class; returns the DECAYED scores."""
    height, width = per_model[0].image_size
    total = sum(weights) if weights is not None else None
    items = []  # [label, score, box] normalized, clipped, zero-area dropped
    for m, det in enumerate(per_model):
        for box, score, label in zip(det.boxes.double().tolist(), det.scores.double().tolist(), det.labels.tolist(), strict=True):
            x1, y1, x2, y2 = (min(max(v / s, 0.0), 1.0) for v, s in zip(box, (width, height, width, height), strict=True))
            if (x2 - x1) * (y2 - y1) == 0:
                continue
            if weights is not None:
                score = score * weights[m] / total
            items.append([label, score, (x1, y1, x2, y2)])
    kept = []
    for label in sorted({it[0] for it in items}):
        pool = [[it[1], it[2]] for it in items if it[0] == label]
        while pool:
            best = max(range(len(pool)), key=lambda i: pool[i][0])
            score, box = pool.pop(best)
            if score <= thresh:
                break
            kept.append((box, score, label))
            for other in pool:
                u = _iou(box, other[1])
                if method == "gaussian":
                    other[0] *= math.exp(-(u * u) / sigma)
                elif u > iou_thr:
                    other[0] *= 1.0 - u
    if not kept:
        return np.zeros((0, 6))
    boxes, scores, labels = zip(*kept, strict=True)
    return as_sorted_rows(np.array(boxes), np.array(scores), np.array(labels))


@pytest.fixture
def interpreted_reference_nms(monkeypatch):
    """ensemble_boxes' NMS kernel is numba-jitted; its pure-Python original gives the same answer without
    seconds of compilation."""
    module = ensemble_boxes.ensemble_boxes_nms
    monkeypatch.setattr(module, "nms_float_fast", module.nms_float_fast.py_func)


class TestNMS:
    @pytest.mark.parametrize("block", range(4))
    def test_matches_ensemble_boxes(self, block, interpreted_reference_nms):
        """Same kept boxes, (weighted) scores and labels as ensemble_boxes.nms on random multi-model inputs."""
        compared = 0
        for seed in range(block * 25, block * 25 + 25):
            per_model, weights, rng = _case(seed)
            iou_thr = float(rng.uniform(0.2, 0.8))
            fused = nms_fusion(per_model, weights=weights, iou_thr=iou_thr)
            assert fused.source == "fused:nms"
            assert (fused.scores[:-1] >= fused.scores[1:]).all()
            if all(len(d) == 0 for d in per_model):
                assert len(fused) == 0  # the reference crashes here
                continue
            boxes, scores, labels = reference_inputs(per_model)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expected = ensemble_boxes.nms(boxes, scores, labels, iou_thr=iou_thr, weights=weights)
            expected = as_sorted_rows(*expected)
            got = normalized_rows(fused)
            assert got.shape == expected.shape
            np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)
            compared += 1
        assert compared >= 20

    def test_suppresses_overlaps_of_one_class_only(self):
        image_size = (100, 100)
        per_model = [
            Detections([[10, 10, 50, 50], [60, 60, 90, 90]], [0.9, 0.5], [1, 1], image_size),
            Detections([[11, 11, 50, 50], [11, 11, 50, 50]], [0.8, 0.7], [1, 2], image_size),
        ]
        fused = nms_fusion(per_model)
        assert fused.scores.tolist() == pytest.approx([0.9, 0.7, 0.5])
        assert fused.labels.tolist() == [1, 2, 1]

    @pytest.mark.parametrize("label", [0, 7, MAX_LABEL])
    def test_threshold_is_exact_for_every_valid_class_id(self, label):
        # IoU 0.5000004 (float64 on normalized boxes): suppressed at iou_thr=0.5 whatever the class id
        a = Detections([[10.0, 10.0, 93.591064453125, 267.28143310546875]], [0.9], [label], (480, 640))
        b = Detections([[10.0, 10.0, 177.18197631835938, 267.28143310546875]], [0.8], [label], (480, 640))
        fused = nms_fusion([a, b], iou_thr=0.5)
        assert fused.scores.tolist() == pytest.approx([0.9]) and fused.labels.tolist() == [label]

    def test_weights_scale_scores_as_ensemble_boxes(self):
        image_size = (100, 100)
        per_model = [Detections([[10, 10, 50, 50]], [0.8], [0], image_size),
                     Detections([[60, 60, 90, 90]], [0.8], [0], image_size)]
        fused = nms_fusion(per_model, weights=[1.0, 3.0])
        assert fused.scores.tolist() == pytest.approx([0.6, 0.2])


class TestSoftNMS:
    @pytest.mark.parametrize("method", ["gaussian", "linear"])
    @pytest.mark.parametrize("block", range(3))
    def test_matches_pure_python_reference(self, method, block):
        for seed in range(block * 15, block * 15 + 15):
            per_model, weights, rng = _case(seed)
            params = {"iou_thr": float(rng.uniform(0.1, 0.7)), "sigma": float(rng.uniform(0.1, 1.0)),
                      "thresh": float(rng.choice([0.001, rng.uniform(0, 0.3)]))}
            fused = soft_nms_fusion(per_model, weights=weights, decay=method, **params)
            assert fused.source == "fused:soft_nms"
            assert (fused.scores[:-1] >= fused.scores[1:]).all()
            expected = reference_soft_nms(per_model, weights, method=method, **params)
            got = normalized_rows(fused)
            assert got.shape == expected.shape
            np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)

    @pytest.mark.parametrize("method", ["gaussian", "linear"])
    def test_keeps_the_boxes_ensemble_boxes_keeps(self, method):
        """Same kept boxes as ensemble_boxes.soft_nms; its scores are the undecayed ones (its bug)."""
        compared = decayed_somewhere = 0
        for seed in range(30):
            per_model, weights, rng = _case(seed)
            if all(len(d) == 0 for d in per_model):
                continue
            iou_thr, sigma, thresh = float(rng.uniform(0.1, 0.7)), float(rng.uniform(0.1, 1.0)), 0.01
            fused = soft_nms_fusion(per_model, weights=weights, iou_thr=iou_thr, sigma=sigma, thresh=thresh,
                                    decay=method)
            boxes, scores, labels = reference_inputs(per_model)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref_boxes, ref_scores, ref_labels = ensemble_boxes.soft_nms(
                    boxes, copy.deepcopy(scores), labels, method={"linear": 1, "gaussian": 2}[method],
                    iou_thr=iou_thr, sigma=sigma, thresh=thresh, weights=weights)
            got = normalized_rows(fused)
            expected = as_sorted_rows(ref_boxes, np.zeros(len(ref_boxes)), ref_labels)
            got_boxes = got[np.lexsort(np.c_[got[:, 0], got[:, 2:]].T[::-1])][:, [0, 2, 3, 4, 5]]
            np.testing.assert_allclose(got_boxes, expected[:, [0, 2, 3, 4, 5]], rtol=0, atol=TOL)
            # Ours never exceed the undecayed scores, and are lower wherever a box overlapped a kept one.
            ours = np.sort(fused.scores.double().numpy())
            theirs = np.sort(np.asarray(ref_scores))
            assert (ours <= theirs + TOL).all()
            decayed_somewhere += int((ours < theirs - TOL).any())
            compared += 1
        assert compared >= 20 and decayed_somewhere >= 10

    def test_decays_the_overlapping_box(self):
        image_size = (100, 100)
        per_model = [Detections([[0, 0, 10, 10]], [0.9], [0], image_size),
                     Detections([[0, 0, 10, 5]], [0.8], [0], image_size)]  # IoU 0.5
        gaussian = soft_nms_fusion(per_model, sigma=0.5)
        assert gaussian.scores.tolist() == pytest.approx([0.9, 0.8 * math.exp(-0.25 / 0.5)])
        linear = fuse(per_model, "soft_nms", decay="linear", iou_thr=0.3)  # through the registry too
        assert linear.scores.tolist() == pytest.approx([0.9, 0.8 * 0.5])
        assert soft_nms_fusion(per_model, decay="linear", iou_thr=0.6).scores.tolist() == pytest.approx([0.9, 0.8])
        with pytest.raises(ValueError, match="gaussian"):
            soft_nms_fusion(per_model, decay="hard")

    def test_crowded_single_class(self):
        rng = np.random.default_rng(5)
        per_model = random_models(rng, 5, (480, 640), num_objects=8, num_classes=1, empty_prob=0.0)
        per_model = [Detections.concat([d] * 3) for d in per_model]
        fused = soft_nms_fusion(per_model, thresh=0.05)
        expected = reference_soft_nms(per_model, None, iou_thr=0.3, sigma=0.5, thresh=0.05, method="gaussian")
        np.testing.assert_allclose(normalized_rows(fused), expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("method", ["nms", "soft_nms"])
class TestContract:
    def _models(self):
        return random_models(np.random.default_rng(2), 3, (200, 300), 8, 3, empty_prob=0.0)

    def test_all_empty_gives_empty(self, method):
        fused = fuse([Detections.empty((40, 50))] * 2, method)
        assert len(fused) == 0 and fused.image_size == (40, 50) and fused.source == f"fused:{method}"

    @pytest.mark.parametrize("weights", [[1.0], [1.0, 1.0, 1.0, 1.0], [1.0, -2.0, 1.0]])
    def test_bad_weights_raise(self, method, weights):
        with pytest.raises(ValueError, match="weights"):
            fuse(self._models(), method, weights=weights)

    def test_inputs_not_mutated(self, method):
        per_model = self._models()
        copies = [(d.boxes.clone(), d.scores.clone(), d.labels.clone()) for d in per_model]
        weights = [0.5, 1.0, 2.0]
        fuse(per_model, method, weights=weights)
        assert weights == [0.5, 1.0, 2.0]
        for d, (b, s, lab) in zip(per_model, copies, strict=True):
            assert torch.equal(d.boxes, b) and torch.equal(d.scores, s) and torch.equal(d.labels, lab)

    def test_clipped_to_image(self, method):
        image_size = (100, 200)
        per_model = [Detections([[-20, -10, 50, 50], [150, 60, 260, 130]], [0.9, 0.8], [0, 1], image_size)]
        fused = fuse(per_model, method)
        assert fused.boxes.tolist() == [[0.0, 0.0, 50.0, 50.0], [150.0, 60.0, 200.0, 100.0]]

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_cuda_matches_cpu(self, method):
        per_model = self._models()
        on_cpu = fuse(per_model, method)
        on_gpu = fuse([d.to("cuda") for d in per_model], method)
        assert on_gpu.device.type == "cuda"
        torch.testing.assert_close(on_gpu.boxes.cpu(), on_cpu.boxes)
        torch.testing.assert_close(on_gpu.scores.cpu(), on_cpu.scores)
