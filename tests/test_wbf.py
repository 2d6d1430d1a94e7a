"""``wbf`` against ``ensemble_boxes.weighted_boxes_fusion`` (1.0.9), plus its bad-input handling."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from detens import Detections
from detens.fusers import fuse
from detens.fusers import wbf as wbf_module
from detens.fusers._lockstep import disjoint_groups
from detens.fusers.wbf import CONF_TYPES, wbf_fusion

ensemble_boxes = pytest.importorskip("ensemble_boxes")

TOL = 1e-5


def random_models(rng: np.random.Generator, num_models: int, image_size: tuple[int, int], num_objects: int,
                  num_classes: int, empty_prob: float = 0.15) -> list[Detections]:
    """Models seeing shared objects with jitter, duplicates, class confusion, clutter and boxes off the image."""
    height, width = image_size
    centers = rng.uniform(0, 1, (num_objects, 2)) * [width, height]
    sizes = rng.uniform(0.02, 0.4, (num_objects, 2)) * [width, height]
    classes = rng.integers(0, num_classes, num_objects)
    per_model = []
    for _ in range(num_models):
        if rng.random() < empty_prob:
            per_model.append(Detections.empty(image_size))
            continue
        boxes, scores, labels = [], [], []
        for o in range(num_objects):
            for _ in range(rng.integers(0, 4)):  # 0..3 boxes of this model on this object
                center = centers[o] + rng.normal(0, 0.08, 2) * sizes[o]
                half = sizes[o] * np.exp(rng.normal(0, 0.1, 2)) / 2
                boxes.append([*(center - half), *(center + half)])
                scores.append(rng.random())
                labels.append(classes[o] if rng.random() < 0.85 else rng.integers(0, num_classes))
        for _ in range(rng.integers(0, 4)):  # clutter
            x, y = rng.uniform(-0.1, 1.0, 2) * [width, height]
            boxes.append([x, y, x + rng.uniform(1, width / 3), y + rng.uniform(1, height / 3)])
            scores.append(rng.random() * 0.3)
            labels.append(rng.integers(0, num_classes))
        per_model.append(
            Detections(np.asarray(boxes, dtype=np.float64).reshape(-1, 4), np.asarray(scores),
                       np.asarray(labels, dtype=np.int64), image_size)
        )
    return per_model


def reference_wbf(per_model: list[Detections], **params):
    """ensemble_boxes on the same boxes divided by the image size, as lists of lists."""
    height, width = per_model[0].image_size
    scale = torch.tensor([width, height, width, height], dtype=torch.float64)
    boxes = [(d.boxes.double() / scale).tolist() for d in per_model]
    scores = [d.scores.tolist() for d in per_model]
    labels = [d.labels.tolist() for d in per_model]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it warns about every box it clips
        return ensemble_boxes.weighted_boxes_fusion(boxes, scores, labels, **params)


def assert_matches_reference(fused: Detections, reference) -> None:
    ref_boxes, ref_scores, ref_labels = reference
    height, width = fused.image_size
    scale = torch.tensor([width, height, width, height], dtype=torch.float64)
    assert len(fused) == len(ref_boxes)
    np.testing.assert_allclose((fused.boxes.double() / scale).numpy(), np.asarray(ref_boxes).reshape(-1, 4),
                               rtol=0, atol=TOL)
    # detens scores live in [0, 1]; the reference's can exceed 1 (allows_overflow, unequal weights).
    np.testing.assert_allclose(fused.scores.double().numpy(), np.minimum(ref_scores, 1.0), rtol=0, atol=TOL)
    np.testing.assert_array_equal(fused.labels.numpy(), np.asarray(ref_labels).astype(np.int64))


def _case(seed: int):
    rng = np.random.default_rng(seed)
    num_models = int(rng.integers(2, 6))
    image_size = (int(rng.integers(64, 1200)), int(rng.integers(64, 1200)))
    per_model = random_models(rng, num_models, image_size, int(rng.integers(1, 25)), int(rng.integers(1, 7)))
    params = {
        "iou_thr": float(rng.uniform(0.2, 0.9)),
        "skip_box_thr": float(rng.choice([0.0, rng.uniform(0, 0.4)])),
        "conf_type": CONF_TYPES[seed % len(CONF_TYPES)],
        "allows_overflow": bool(rng.random() < 0.3),
        "weights": None if rng.random() < 0.3 else rng.uniform(0.1, 3.0, num_models).tolist(),
    }
    return per_model, params


LOOPS = [("compiled", None), ("vectorized", 1), ("vectorized", 10**9)]
LOOP_IDS = ["compiled", "lockstep-only", "per-box-only"]


def use_loop(monkeypatch, backend, alone_below):
    """Make wbf_fusion run one clustering loop: the compiled kernel, or the numpy lockstep / per-box loop."""
    if alone_below is not None:
        monkeypatch.setattr(wbf_module, "_ALONE_BELOW", alone_below)
    return lambda *a, **k: wbf_module.wbf_fusion(*a, **{"backend": backend, **k})


class TestParity:
    @pytest.mark.parametrize("backend", ["compiled", "vectorized"])
    @pytest.mark.parametrize("block", range(8))
    def test_random_inputs_match_ensemble_boxes(self, block, backend):
        """240 random multi-model, multi-class images (some models empty), all conf_types, with weights."""
        compared = 0
        for seed in range(block * 30, block * 30 + 30):
            per_model, params = _case(seed)
            fused = wbf_fusion(per_model, **params, backend=backend)
            assert fused.source == "fused:wbf"
            if all(len(d) == 0 for d in per_model):
                assert len(fused) == 0  # the reference crashes here
                continue
            assert_matches_reference(fused, reference_wbf(per_model, **params))
            compared += 1
        assert compared >= 25

    @pytest.mark.parametrize("backend", ["compiled", "vectorized"])
    @pytest.mark.parametrize("conf_type", CONF_TYPES)
    def test_crowded_image_matches_ensemble_boxes(self, conf_type, backend):
        """Hundreds of boxes piled on few objects: many joins, long float32 accumulations, merged groups."""
        rng = np.random.default_rng(7)
        per_model = random_models(rng, 4, (480, 640), num_objects=12, num_classes=2, empty_prob=0.0)
        per_model = [Detections.concat([d] * 6) for d in per_model]  # exact duplicates (a tie is harmless)
        # Jittered copies get distinct scores: numpy's argsort does not order ties reproducibly.
        generator = torch.Generator().manual_seed(0)
        per_model = [
            Detections((d.boxes + torch.randn(d.boxes.shape, generator=generator)).clamp(min=0),
                       (d.scores * (1 - 0.01 * torch.rand(len(d), generator=generator))), d.labels, d.image_size)
            if i % 2 else d
            for i, d in enumerate(per_model)
        ]
        params = {"iou_thr": 0.5, "conf_type": conf_type, "weights": [1.0, 2.0, 0.5, 1.5]}
        fused = wbf_fusion(per_model, **params, backend=backend)
        assert_matches_reference(fused, reference_wbf(per_model, **params))

    @pytest.mark.parametrize("backend, alone_below", LOOPS, ids=LOOP_IDS)
    def test_every_loop_matches_ensemble_boxes(self, backend, alone_below, monkeypatch):
        """The compiled kernel, the lockstep over groups and the per-box loop for the last groups each
        agree with the reference."""
        wbf_fusion = use_loop(monkeypatch, backend, alone_below)
        for seed in [*range(0, 200, 10), 7]:
            per_model, params = _case(seed)
            if any(len(d) for d in per_model):
                assert_matches_reference(wbf_fusion(per_model, **params), reference_wbf(per_model, **params))
        rng = np.random.default_rng(3)
        crowded = random_models(rng, 5, (480, 640), num_objects=15, num_classes=2, empty_prob=0.0)
        assert_matches_reference(wbf_fusion(crowded, conf_type="max"), reference_wbf(crowded, conf_type="max"))

    def test_touching_boxes_and_threshold_edges(self):
        """Boxes that touch (IoU exactly 0) and pairs at IoU exactly iou_thr stay apart, as in the reference."""
        image_size = (100, 100)
        a = [[0, 0, 10, 10], [10, 0, 20, 10], [20, 0, 30, 10]]  # touching along x
        b = [[0, 0, 10, 10], [0, 0, 10, 5]]  # IoU exactly 0.5 with a[0]
        per_model = [
            Detections(a, [0.9, 0.8, 0.7], [1, 1, 1], image_size),
            Detections(b, [0.6, 0.5], [1, 1], image_size),
        ]
        fused = wbf_fusion(per_model, iou_thr=0.5)
        assert_matches_reference(fused, reference_wbf(per_model, iou_thr=0.5))
        assert len(fused) == 4  # [0,0,10,5] does not join: IoU 0.5 is not > 0.5
        assert_matches_reference(wbf_fusion(per_model, iou_thr=0.0), reference_wbf(per_model, iou_thr=0.0))

    def test_fuse_dispatches_to_wbf(self):
        per_model, params = _case(3)
        direct = wbf_fusion(per_model, **params)
        via_registry = fuse(per_model, "wbf", **params)
        torch.testing.assert_close(via_registry.boxes, direct.boxes)
        torch.testing.assert_close(via_registry.scores, direct.scores)


class TestGroups:
    def test_groups_are_separated(self):
        """Any two groups of one label are apart by more than the margin along x or y; labels never mix."""
        rng = np.random.default_rng(0)
        margin = 1e-3
        num_split = 0
        for _ in range(20):
            det = Detections.concat(random_models(rng, 3, (300, 400), 20, 3, empty_prob=0.0)).clip()
            det = det[det.area() > 0]
            boxes = det.normalized_boxes().double()
            group = disjoint_groups(boxes, det.labels, margin)
            num_groups = int(group.max()) + 1
            lo = torch.full((num_groups, 2), 2.0, dtype=torch.float64).scatter_reduce(
                0, group[:, None].expand(-1, 2), boxes[:, :2], "amin")
            hi = torch.full((num_groups, 2), -1.0, dtype=torch.float64).scatter_reduce(
                0, group[:, None].expand(-1, 2), boxes[:, 2:], "amax")
            label = torch.zeros(num_groups, dtype=torch.int64).scatter(0, group, det.labels)
            assert (label[group] == det.labels).all()  # one label per group
            gap = torch.maximum(lo[None, :, :] - hi[:, None, :], lo[:, None, :] - hi[None, :, :]).amax(-1)  # [G, G]
            same_label = label[:, None] == label[None, :]
            pairs = same_label & ~torch.eye(num_groups, dtype=torch.bool)
            assert (gap[pairs] > margin).all()
            num_split += int(pairs.sum())
        assert num_split > 0  # the check above was not vacuous


class TestBadInput:
    def _models(self):
        return random_models(np.random.default_rng(1), 3, (200, 300), 6, 3, empty_prob=0.0)

    @pytest.mark.parametrize("weights", [[1.0, 2.0], [1.0] * 4, [1.0, -1.0, 1.0], [0.0, 0.0, 0.0]])
    def test_bad_weights_raise(self, weights):
        with pytest.raises(ValueError, match="weights"):
            wbf_fusion(self._models(), weights=weights)

    def test_bad_conf_type_raises(self):
        with pytest.raises(ValueError, match="box_and_model_avg"):
            wbf_fusion(self._models(), conf_type="mean")

    @pytest.mark.parametrize("iou_thr", [-0.1, 1.5])
    def test_bad_iou_thr_raises(self, iou_thr):
        with pytest.raises(ValueError, match="iou_thr"):
            wbf_fusion(self._models(), iou_thr=iou_thr)

    def test_all_empty_gives_empty(self):
        fused = wbf_fusion([Detections.empty((50, 60)), Detections.empty((50, 60))])
        assert len(fused) == 0 and fused.image_size == (50, 60) and fused.source == "fused:wbf"
        assert fused.boxes.shape == (0, 4) and fused.labels.dtype == torch.int64

    def test_everything_filtered_gives_empty(self):
        per_model = self._models()
        assert all(bool((d.scores < 1.0).all()) for d in per_model)
        assert len(wbf_fusion(per_model, skip_box_thr=1.0)) == 0
        outside = Detections([[-50, -50, -10, -10], [400, 10, 500, 20]], [0.9, 0.8], [1, 1], (200, 300))
        assert len(wbf_fusion([outside])) == 0

    def test_empty_list_raises(self):
        with pytest.raises(ValueError, match="empty"):
            wbf_fusion([])

    def test_inputs_not_mutated(self):
        per_model = self._models()
        copies = [(d.boxes.clone(), d.scores.clone(), d.labels.clone()) for d in per_model]
        weights = [0.5, 1.0, 2.0]
        weights_tensor = torch.tensor(weights)
        wbf_fusion(per_model, weights=weights, conf_type="box_and_model_avg")
        wbf_fusion(per_model, weights=weights_tensor)
        assert weights == [0.5, 1.0, 2.0]
        assert torch.equal(weights_tensor, torch.tensor([0.5, 1.0, 2.0]))
        for d, (b, s, lab) in zip(per_model, copies, strict=True):
            assert torch.equal(d.boxes, b) and torch.equal(d.scores, s) and torch.equal(d.labels, lab)

    @pytest.mark.parametrize("backend, alone_below", LOOPS, ids=LOOP_IDS)
    def test_zero_weight_cluster_gets_the_plain_mean_in_any_model_order(self, backend, alone_below, monkeypatch):
        """All members scoring 0 makes the reference divide by 0 (NaN boxes); detens takes their plain mean."""
        wbf_fusion = use_loop(monkeypatch, backend, alone_below)
        image_size = (100, 100)
        per_model = [
            Detections([[10, 10, 50, 50]], [0.9], [0], image_size),
            Detections([[12, 12, 50, 50]], [0.8], [0], image_size),
            Detections([[70, 70, 90, 90]], [0.5], [0], image_size),
        ]
        for order in ([0, 1, 2], [1, 0, 2]):
            weights = [[0.0, 0.0, 1.0][i] for i in order]
            fused = wbf_fusion([per_model[i] for i in order], weights=weights)
            assert len(fused) == 2
            zero = fused[fused.scores == 0]
            torch.testing.assert_close(zero.boxes, torch.tensor([[11.0, 11.0, 50.0, 50.0]]))

    @pytest.mark.parametrize("backend, alone_below", LOOPS, ids=LOOP_IDS)
    @pytest.mark.parametrize("score", [1.4e-45, 1e-40, 2.0**-110, 0.0])
    def test_tiny_scores_give_the_weighted_mean_not_the_origin(self, backend, alone_below, score, monkeypatch):
        # score·box underflows float32 below ~2**-100: the reference returns (0, 0, 0, 0)
        wbf_fusion = use_loop(monkeypatch, backend, alone_below)
        image_size = (100, 100)
        per_model = [
            Detections([[10, 10, 50, 50]], [score], [0], image_size),
            Detections([[20, 20, 60, 60]], [score], [0], image_size),
        ]
        fused = wbf_fusion(per_model, iou_thr=0.3)
        assert len(fused) == 1
        torch.testing.assert_close(fused.boxes, torch.tensor([[15.0, 15.0, 55.0, 55.0]]))
        backward = wbf_fusion(per_model[::-1], iou_thr=0.3)
        assert torch.equal(backward.boxes, fused.boxes)


class TestLoopsAgree:
    @pytest.mark.parametrize("seed", range(40))
    def test_compiled_equals_vectorized_exactly(self, seed):
        """Beyond the reference's float32 tolerance: the two formulations give identical outputs."""
        per_model, params = _case(seed)
        compiled = wbf_fusion(per_model, **params, backend="compiled")
        vectorized = wbf_fusion(per_model, **params, backend="vectorized")
        assert torch.equal(compiled.boxes, vectorized.boxes) and torch.equal(compiled.scores, vectorized.scores)
        assert torch.equal(compiled.labels, vectorized.labels)


class TestOutputContract:
    def test_clipped_sorted_in_range(self):
        for seed in range(10):
            per_model, params = _case(seed)
            fused = wbf_fusion(per_model, **params)
            height, width = fused.image_size
            assert (fused.boxes[:, 0::2] >= 0).all() and (fused.boxes[:, 0::2] <= width).all()
            assert (fused.boxes[:, 1::2] >= 0).all() and (fused.boxes[:, 1::2] <= height).all()
            assert (fused.scores[:-1] >= fused.scores[1:]).all()
            assert ((fused.scores >= 0) & (fused.scores <= 1)).all()
            assert fused.boxes.dtype == torch.float32 and fused.labels.dtype == torch.int64

    def test_overflow_scores_are_clipped(self):
        image_size = (100, 100)
        box = [[10, 10, 50, 50]]
        per_model = [Detections(box * 3, [1.0, 1.0, 1.0], [0, 0, 0], image_size), Detections(box, [1.0], [0], image_size)]
        fused = wbf_fusion(per_model, allows_overflow=True)
        assert len(fused) == 1 and float(fused.scores[0]) == 1.0  # the reference says 2.0
        assert reference_wbf(per_model, allows_overflow=True)[1][0] == pytest.approx(2.0)

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_cuda_matches_cpu(self):
        for seed in range(20):
            per_model, params = _case(seed)
            on_cpu = wbf_fusion(per_model, **params)
            on_gpu = wbf_fusion([d.to("cuda") for d in per_model], **params)
            assert on_gpu.device.type == "cuda"
            torch.testing.assert_close(on_gpu.boxes.cpu(), on_cpu.boxes, rtol=0, atol=1e-3)
            torch.testing.assert_close(on_gpu.scores.cpu(), on_cpu.scores, rtol=0, atol=1e-5)
            assert torch.equal(on_gpu.labels.cpu(), on_cpu.labels)

    def test_model_order_changes_nothing_with_distinct_scores(self):
        """WBF visits boxes by score, so with distinct scores permuting the models changes nothing."""
        per_model, _ = _case(11)
        forward = wbf_fusion(per_model, conf_type="absent_model_aware_avg")
        backward = wbf_fusion(per_model[::-1], conf_type="absent_model_aware_avg")
        torch.testing.assert_close(forward.boxes, backward.boxes)
        torch.testing.assert_close(forward.scores, backward.scores)
