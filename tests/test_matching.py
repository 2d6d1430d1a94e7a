"""``detens.match`` against a slow, obviously correct pure-Python reference."""

from __future__ import annotations

import random

import pytest
import torch

from detens import Detections, match
from detens.detections import MAX_LABEL
from detens.matching import Clusters


def _iou(a, b):
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(iw, 0.0) * max(ih, 0.0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def reference_match(per_model, iou_thr):
    """Returns a list of clusters, each (label, {model: box index}), in the order match() documents.

    Equal scores are ordered by model, then box index (the position in the concatenation of the models).
    """
    height, width = per_model[0].image_size
    boxes = []  # (model, index, box normalized, score, label)
    for m, det in enumerate(per_model):
        for i in range(len(det)):
            x1, y1, x2, y2 = det.boxes[i].tolist()
            x1, x2 = min(max(x1, 0), width), min(max(x2, 0), width)
            y1, y2 = min(max(y1, 0), height), min(max(y2, 0), height)
            if x2 - x1 <= 0 or y2 - y1 <= 0:
                continue
            boxes.append((m, i, (x1 / width, y1 / height, x2 / width, y2 / height), float(det.scores[i]), int(det.labels[i])))
    clusters = []
    pending = list(range(len(boxes)))
    while pending:
        by_score = sorted(pending, key=lambda k: (-boxes[k][3], k))
        seeds = []
        for k in by_score:  # greedy NMS per class
            if all(boxes[s][4] != boxes[k][4] or _iou(boxes[s][2], boxes[k][2]) <= iou_thr for s in seeds):
                seeds.append(k)
        members = {s: [] for s in seeds}
        for k in pending:
            if k in members:
                members[k].append(k)
                continue
            same = [s for s in seeds if boxes[s][4] == boxes[k][4]]
            best = max(same, key=lambda s: _iou(boxes[s][2], boxes[k][2]))
            members[best].append(k)
        leftover = []
        for s in seeds:
            chosen = {}
            for k in sorted(members[s], key=lambda k: (-boxes[k][3], k)):
                m = boxes[k][0]
                if m in chosen:
                    leftover.append(k)
                else:
                    chosen[m] = k
            clusters.append((boxes[s][4], {m: boxes[k][1] for m, k in chosen.items()}))
        pending = leftover
    return clusters


def random_per_model(rng: random.Random, num_models: int, image_size=(120, 160), num_objects=12, num_classes=3):
    height, width = image_size
    objects = []
    for _ in range(num_objects):
        x, y = rng.uniform(-10, width - 10), rng.uniform(-10, height - 10)
        w, h = rng.uniform(4, 60), rng.uniform(4, 60)
        objects.append(((x, y, x + w, y + h), rng.randrange(num_classes)))
    per_model = []
    for _ in range(num_models):
        boxes, scores, labels = [], [], []
        if rng.random() < 0.15:
            per_model.append(Detections.empty(image_size))
            continue
        for (x1, y1, x2, y2), label in objects:
            for _ in range(rng.choice([0, 1, 1, 1, 2])):  # missed, found, or found twice
                j = [rng.gauss(0, 3) for _ in range(4)]
                bx = (x1 + j[0], y1 + j[1], x2 + j[2], y2 + j[3])
                boxes.append((min(bx[0], bx[2]), min(bx[1], bx[3]), max(bx[0], bx[2]), max(bx[1], bx[3])))
                scores.append(rng.random())
                labels.append(label if rng.random() > 0.1 else rng.randrange(num_classes))
        per_model.append(Detections(torch.tensor(boxes).reshape(-1, 4), scores, labels, image_size))
    return per_model


def _jittered(det: Detections, rng: random.Random) -> Detections:
    """The same boxes moved by a few pixels, with new scores: duplicates of one model."""
    if len(det) == 0:
        return det
    height, width = det.image_size
    shift = torch.tensor([[rng.gauss(0, 2) for _ in range(4)] for _ in range(len(det))])
    boxes = det.boxes + shift
    boxes = torch.cat([torch.minimum(boxes[:, :2], boxes[:, 2:]), torch.maximum(boxes[:, :2], boxes[:, 2:])], 1)
    return Detections(boxes, torch.tensor([rng.random() for _ in range(len(det))]), det.labels, det.image_size)


def as_reference_form(clusters: Clusters):
    out = []
    for c in range(len(clusters)):
        rows = {m: int(clusters.source_index[c, m]) for m in range(clusters.num_models) if clusters.present[c, m]}
        out.append((int(clusters.labels[c]), rows))
    return out


BACKENDS = ["compiled", "tensor"]


class TestMatchAgainstReference:
    @pytest.mark.parametrize("backend", BACKENDS)
    @pytest.mark.parametrize("seed", range(60))
    @pytest.mark.parametrize("iou_thr", [0.3, 0.55, 0.75])
    def test_same_clusters(self, seed, iou_thr, backend):
        rng = random.Random(seed)
        per_model = random_per_model(rng, num_models=rng.randint(1, 5))
        clusters = match(per_model, iou_thr=iou_thr, backend=backend)
        assert as_reference_form(clusters) == reference_match(per_model, iou_thr)

    @pytest.mark.parametrize("backend", BACKENDS)
    @pytest.mark.parametrize("seed", range(30))
    def test_equal_scores_are_ordered_by_model_then_box(self, seed, backend):
        # Quantized detectors (INT8) emit many equal scores: the order must still be defined.
        rng = random.Random(500 + seed)
        per_model = random_per_model(rng, num_models=rng.randint(2, 5), num_objects=15, num_classes=2)
        per_model = [
            Detections(d.boxes, (d.scores * 4).round() / 4, d.labels, d.image_size) for d in per_model
        ]
        assert as_reference_form(match(per_model, backend=backend)) == reference_match(per_model, 0.55)

    @pytest.mark.parametrize("seed", range(2))
    def test_crowded_images_give_the_same_clusters_in_both_backends(self, seed):
        # Many boxes per object and per model: tens of rounds, large classes.
        rng = random.Random(900 + seed)
        per_model = random_per_model(rng, num_models=5, image_size=(200, 240), num_objects=40, num_classes=3)
        per_model = [Detections.concat([d, _jittered(d, rng), _jittered(d, rng)]) for d in per_model]
        expected = reference_match(per_model, 0.55)
        assert len(expected) > 100
        for backend in BACKENDS:
            assert as_reference_form(match(per_model, backend=backend)) == expected, backend


    @pytest.mark.parametrize("seed", range(4))
    def test_small_boxes_across_a_wide_image_give_the_reference_clusters(self, seed):
        # The compiled rounds file seeds in cells of x1 as wide as the widest box: here hundreds of cells,
        # boxes piled on objects that straddle their edges, and (seed 1 and 3) one box as wide as the image.
        rng = random.Random(1200 + seed)
        width = 4000
        per_model = []
        for name in ("a", "b", "c"):
            rows = []
            for k in range(120):
                x = k * 33.0 + rng.choice([0.0, 0.5, rng.uniform(-3, 3)])
                rows.append([x, 5.0 + rng.uniform(-1, 1), x + 8 + rng.uniform(-1, 1), 13.0, round(rng.random(), 1), k % 2])
            if seed % 2:
                rows.append([0.0, 0.0, float(width), 40.0, 0.5, 0])
            table = torch.tensor(rows)
            per_model.append(Detections(table[:, :4], table[:, 4], table[:, 5].long(), (40, width), name))
        expected = reference_match(per_model, 0.3)
        for backend in BACKENDS:
            assert as_reference_form(match(per_model, iou_thr=0.3, backend=backend)) == expected, backend

    @pytest.mark.parametrize("seed", range(10))
    def test_same_clusters_when_the_pair_search_is_chunked(self, seed, monkeypatch):
        import detens.matching

        monkeypatch.setattr(detens.matching, "_IOU_BLOCK_ELEMENTS", 7)
        rng = random.Random(100 + seed)
        per_model = random_per_model(rng, num_models=4, num_objects=20, num_classes=2)
        clusters = match(per_model, iou_thr=0.5, backend="tensor")
        assert as_reference_form(clusters) == reference_match(per_model, 0.5)


    @pytest.mark.parametrize("seed", range(10))
    def test_same_clusters_through_the_per_class_nms_loop(self, seed, monkeypatch):
        """Images of more than 2000 boxes take ``batched_nms``'s per-class loop instead of one ``nms`` call on
        class-offset boxes: lowered to 0 boxes, every image takes it."""
        import detens.matching

        monkeypatch.setattr(detens.matching, "_ONE_CALL_NMS_BOXES", 0)
        rng = random.Random(300 + seed)
        per_model = random_per_model(rng, num_models=rng.randint(1, 4), num_objects=20, num_classes=3)
        for backend in BACKENDS:
            assert as_reference_form(match(per_model, iou_thr=0.55, backend=backend)) == reference_match(per_model, 0.55)


class TestMatchInvariants:
    @pytest.mark.parametrize("seed", range(20))
    def test_rows_copy_source_boxes_and_absent_rows_are_imputed(self, seed):
        rng = random.Random(seed)
        per_model = random_per_model(rng, num_models=3)
        clusters = match(per_model)
        height, width = per_model[0].image_size
        scale = torch.tensor([width, height, width, height])
        for c in range(len(clusters)):
            present = clusters.present[c]
            assert present.any()
            for m in range(3):
                row = clusters.preds[c, m]
                if present[m]:
                    det = per_model[m].clip()
                    i = int(clusters.source_index[c, m])
                    assert int(det.labels[i]) == int(clusters.labels[c])
                    torch.testing.assert_close(row[:4] * scale, det.boxes[i])
                    assert float(row[4]) == pytest.approx(float(det.scores[i]))
                else:
                    assert int(clusters.source_index[c, m]) == -1
                    assert float(row[4]) == 0.0
                    mean_box = clusters.preds[c, present, :4].mean(0)
                    torch.testing.assert_close(row[:4], mean_box)

    def test_every_box_with_area_lands_in_exactly_one_cluster(self):
        per_model = random_per_model(random.Random(7), num_models=4, num_objects=30)
        clusters = match(per_model)
        for m, det in enumerate(per_model):
            used = clusters.source_index[:, m]
            used = used[used >= 0]
            assert used.unique().numel() == used.numel()
            assert used.numel() == int((det.clip().area() > 0).sum())

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_one_model_two_overlapping_boxes_make_two_clusters(self, backend):
        a = Detections([[0, 0, 10, 10], [0, 0, 10, 11]], [0.9, 0.8], [1, 1], (20, 20))
        b = Detections([[0, 0, 10, 10]], [0.7], [1], (20, 20))
        clusters = match([a, b], backend=backend)
        assert as_reference_form(clusters) == [(1, {0: 0, 1: 0}), (1, {0: 1})]

    @pytest.mark.parametrize("backend", BACKENDS)
    @pytest.mark.parametrize("labels", [(1, 2), (0, 2**31 - 1), (2**31 - 2, 2**31 - 1)])
    def test_classes_never_mix(self, backend, labels):
        # the same box in two classes, with the first model's other boxes close to it; class ids at the
        # top of the valid range must stay as separate as small ones
        a = Detections([[0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 9, 9]], [0.9, 0.8, 0.7], [labels[0]] * 3, (20, 20))
        b = Detections([[0, 0, 10, 10]], [0.9], [labels[1]], (20, 20))
        clusters = match([a, b], backend=backend)
        assert sorted(clusters.labels.tolist()) == sorted([labels[0]] * 3 + [labels[1]])
        assert clusters.present.sum(1).tolist() == [1, 1, 1, 1]

    @pytest.mark.parametrize("backend", BACKENDS)
    @pytest.mark.parametrize("label", [0, MAX_LABEL])
    def test_threshold_is_exact_for_every_valid_class_id(self, backend, label):
        # IoU 0.5000004 in float64: one object at iou_thr=0.5, in both backends, whatever the class id
        a = Detections([[10.0, 10.0, 93.591064453125, 267.28143310546875]], [0.9], [label], (480, 640))
        b = Detections([[10.0, 10.0, 177.18197631835938, 267.28143310546875]], [0.8], [label], (480, 640))
        assert len(match([a, b], iou_thr=0.5, backend=backend)) == 1

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_threshold_is_strict(self, backend):
        # IoU exactly 0.5 (inter 100, union 200): matched only when the threshold is below it.
        a = Detections([[0, 0, 10, 10]], [0.9], [0], (40, 40))
        b = Detections([[0, 0, 20, 10]], [0.8], [0], (40, 40))
        assert len(match([a, b], iou_thr=0.5, backend=backend)) == 2
        assert len(match([a, b], iou_thr=0.49, backend=backend)) == 1

    def test_model_order_permutes_columns_only(self):
        per_model = random_per_model(random.Random(3), num_models=3)
        forward = match(per_model)
        backward = match(per_model[::-1])
        key = lambda cl: sorted(  # noqa: E731
            (lab, tuple(sorted(rows.items()))) for lab, rows in as_reference_form(cl)
        )
        flipped = [(lab, {2 - m: i for m, i in rows.items()}) for lab, rows in as_reference_form(backward)]
        assert key(forward) == sorted((lab, tuple(sorted(rows.items()))) for lab, rows in flipped)


class TestMatchEdgeCases:
    @pytest.mark.parametrize("backend", BACKENDS)
    def test_all_models_empty(self, backend):
        clusters = match([Detections.empty((10, 20)), Detections.empty((10, 20))], backend=backend)
        assert len(clusters) == 0
        assert clusters.preds.shape == (0, 2, 5)
        assert clusters.present.dtype == torch.bool

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_boxes_entirely_outside_the_image_are_dropped(self, backend):
        a = Detections([[30, 30, 40, 40], [1, 1, 5, 5]], [0.9, 0.5], [0, 0], (20, 20))
        clusters = match([a], backend=backend)
        assert clusters.source_index[:, 0].tolist() == [1]

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_only_boxes_outside_the_image(self, backend):
        a = Detections([[30, 30, 40, 40]], [0.9], [0], (20, 20))
        clusters = match([a, Detections.empty((20, 20))], backend=backend)
        assert len(clusters) == 0 and clusters.preds.shape == (0, 2, 5)

    def test_unknown_backend_lists_the_valid_ones(self):
        with pytest.raises(ValueError, match="compiled, tensor"):
            match([Detections.empty((5, 5))], backend="numba")

    def test_boxes_partly_outside_are_clipped(self):
        a = Detections([[-5, -5, 10, 10]], [0.9], [0], (20, 20))
        clusters = match([a])
        torch.testing.assert_close(clusters.preds[0, 0, :4], torch.tensor([0.0, 0.0, 0.5, 0.5]))

    @pytest.mark.parametrize(
        "bad, error, message",
        [
            ([], ValueError, "^per_model is empty: pass one Detections per model"),
            (Detections.empty((5, 5)), TypeError,
             "^per_model must be a list with one Detections per model, got Detections$"),
            ([Detections.empty((5, 5)), "boxes"], TypeError, r"^per_model\[1\] must be Detections, got str$"),
            ([{"boxes": torch.zeros(0, 4)}], TypeError,
             r"^per_model\[0\] must be Detections, got dict: fuse torchvision output dicts with "
             r"detens.TorchvisionFusion, or convert one with detens.convert.torchvision_to_detections"),
            ([Detections.empty((5, 5)), Detections.empty((6, 5))], ValueError,
             r"^per_model: models disagree on the image size \[\(5, 5\), \(6, 5\)\]"),
        ],
    )
    def test_bad_input(self, bad, error, message):
        with pytest.raises(error, match=message):
            match(bad)

    def test_bad_threshold(self):
        with pytest.raises(ValueError, match="iou_thr"):
            match([Detections.empty((5, 5))], iou_thr=1.5)

    def test_to_detections_refuses_fused_rows_of_another_count_naming_them(self):
        """Boxes of another count were reported as Detections.labels of the wrong shape, which the caller never
        passed; boxes of 5 columns stopped at a broadcasting error."""
        a = Detections([[0, 0, 10, 10], [20, 20, 30, 30]], [0.9, 0.5], [1, 1], (40, 40), source="a")
        clusters = match([a, a.with_source("b")])
        assert len(clusters) == 2
        with pytest.raises(ValueError, match=r"^boxes must have shape \[C, 4\] = \[2, 4\], got \[3, 4\]$"):
            clusters.to_detections(torch.zeros(3, 4), torch.zeros(2))
        with pytest.raises(ValueError, match=r"^boxes must have shape \[C, 4\] = \[2, 4\], got \[2, 5\]$"):
            clusters.to_detections(torch.zeros(2, 5), torch.zeros(2))
        with pytest.raises(ValueError, match=r"^scores must have shape \[C\] = \[2\], got \[2, 1\]$"):
            clusters.to_detections(torch.zeros(2, 4), torch.zeros(2, 1))
        fused = clusters.to_detections(clusters.preds[:, 0, :4], clusters.preds[:, 0, 4])
        assert fused.scores.tolist() == pytest.approx([0.9, 0.5])

    def test_inputs_not_mutated(self):
        per_model = random_per_model(random.Random(1), num_models=2)
        before = [(d.boxes.clone(), d.scores.clone(), d.labels.clone()) for d in per_model]
        match(per_model)
        for d, (b, s, lab) in zip(per_model, before, strict=True):
            assert torch.equal(d.boxes, b) and torch.equal(d.scores, s) and torch.equal(d.labels, lab)

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    @pytest.mark.parametrize("backend", ["auto", *BACKENDS])
    def test_cuda_matches_cpu(self, backend):
        per_model = random_per_model(random.Random(2), num_models=3)
        cpu = match(per_model)
        gpu = match([d.to("cuda") for d in per_model], backend=backend)
        assert gpu.preds.device.type == "cuda" and gpu.labels.device.type == "cuda"
        assert as_reference_form(gpu.to("cpu")) == as_reference_form(cpu)


    @pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs MPS (Apple GPU)")
    @pytest.mark.parametrize("backend", ["auto", *BACKENDS])
    def test_mps_matches_cpu(self, backend):
        """MPS has no float64: the rounds' IoUs are computed on the CPU, the clusters returned on MPS."""
        per_model = random_per_model(random.Random(2), num_models=3)
        mps = match([d.to("mps") for d in per_model], backend=backend)
        assert mps.preds.device.type == "mps" and mps.labels.device.type == "mps"
        assert as_reference_form(mps.to("cpu")) == as_reference_form(match(per_model))

    def test_float64_work_runs_where_the_backend_has_float64(self):
        from detens.detections import compute_device

        for kept in ("cpu", "cuda", "cuda:1"):
            assert compute_device(torch.device(kept)) == torch.device(kept)
        assert compute_device(torch.device("mps")) == torch.device("cpu")


class TestBackendsAgree:
    @pytest.mark.parametrize("seed", range(3))
    def test_on_benchmark_images(self, seed):
        # the benchmark's synthetic images: 5 models x 1000 boxes, 80 classes, tens of rounds.
        import numpy as np

        from detens.jobs import bench
        per_model = bench.synthetic_image(np.random.default_rng(seed), 5, 1000)
        for iou_thr in (0.55, 0.7):
            compiled = match(per_model, iou_thr, backend="compiled")
            tensor = match(per_model, iou_thr, backend="tensor")
            assert len(compiled) > 500
            assert as_reference_form(compiled) == as_reference_form(tensor)
            torch.testing.assert_close(compiled.preds, tensor.preds, rtol=0, atol=0)
