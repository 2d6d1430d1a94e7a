"""``ThetaHead``: fusion, per-class Θ, training, optimizers, save/load, the ``theta`` fuser.

Dimension legend: C clusters, N models, K classes with their own Θ.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from detens import Detections, fuse, match
from detens.fusers.consensus import average_clusters
from detens.heads import HEADS, HeadFileError, ThetaTrainConfig, list_heads, load_head
from detens.heads._fit import ImageSample, train_theta
from detens.heads.theta import ThetaHead, make_optimizer
from detens.matching import Clusters
from detens.targets import Targets, assign_targets

F64 = torch.float64
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def random_clusters(
    seed, num_clusters=12, num_models=3, num_classes=4, dtype=torch.float32, image_size=(80, 120)
):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(num_clusters, num_models, 2, generator=g, dtype=dtype) * 0.6
    wh = torch.rand(num_clusters, num_models, 2, generator=g, dtype=dtype) * 0.3 + 0.05
    scores = torch.rand(num_clusters, num_models, 1, generator=g, dtype=dtype)
    preds = torch.cat([xy, xy + wh, scores], 2)
    present = torch.rand(num_clusters, num_models, generator=g) < 0.7
    present[:, 0] |= ~present.any(1)
    preds[..., 4] = preds[..., 4].masked_fill(~present, 0)
    labels = torch.randint(0, num_classes, (num_clusters,), generator=g)
    source = torch.zeros(num_clusters, num_models, dtype=torch.int64)
    return Clusters(preds, present, labels, source, image_size)


def random_detections(seed, num_models=3, size=(90, 160)):
    g = torch.Generator().manual_seed(seed)
    out = []
    for m in range(num_models):
        k = int(torch.randint(0, 15, (1,), generator=g)) if m else 12
        xy = torch.rand(k, 2, generator=g) * torch.tensor([120.0, 60.0])
        wh = torch.rand(k, 2, generator=g) * 35 + 3
        out.append(
            Detections(
                torch.cat([xy, xy + wh], 1),
                torch.rand(k, generator=g),
                torch.randint(0, 3, (k,), generator=g),
                size,
            )
        )
    return out


def slow_fuse(theta_rows, preds, normalize_box=False):
    """A = ŶᵀΘ by explicit loops; theta_rows[c] is the Θ of cluster c."""
    boxes, scores = [], []
    for c in range(preds.shape[0]):
        a = [
            sum(float(theta_rows[c][n]) * float(preds[c, n, k]) for n in range(preds.shape[1]))
            for k in range(5)
        ]
        if normalize_box:
            total = sum(float(t) for t in theta_rows[c])
            a[:4] = [v / total for v in a[:4]]
        boxes.append(a[:4])
        scores.append(min(max(a[4], 0.0), 1.0))
    return torch.tensor(boxes, dtype=F64).reshape(-1, 4), torch.tensor(scores, dtype=F64)


def set_theta(head, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.theta.copy_(torch.rand(head.theta.shape, generator=g, dtype=head.theta.dtype) + 0.05)
        if head.class_theta is not None:
            head.class_theta.copy_(
                torch.rand(head.class_theta.shape, generator=g, dtype=head.theta.dtype) + 0.05
            )


class TestForward:
    @pytest.mark.parametrize("normalize_box", [False, True])
    @pytest.mark.parametrize("seed", range(5))
    def test_global_equals_slow_loop(self, seed, normalize_box):
        clusters = random_clusters(seed, dtype=F64)
        head = ThetaHead(["a", "b", "c"], normalize_box=normalize_box).double()
        set_theta(head, seed)
        boxes, scores = head(clusters)
        ref_boxes, ref_scores = slow_fuse(
            [head.theta.detach()] * len(clusters), clusters.preds, normalize_box
        )
        assert_close(boxes, ref_boxes)
        assert_close(scores, ref_scores)

    @pytest.mark.parametrize("seed", range(5))
    def test_per_class_equals_slow_loop_with_fallback(self, seed):
        clusters = random_clusters(
            seed, num_classes=5, dtype=F64
        )  # classes 0..4; 2 and 4 have no Θ of their own
        head = ThetaHead(["a", "b", "c"], per_class=True, class_ids=[3, 0, 1]).double()
        set_theta(head, seed)
        ids = head.class_ids.tolist()
        assert ids == [0, 1, 3]  # kept sorted
        rows = [
            head.class_theta[ids.index(k)].detach() if k in ids else head.theta.detach()
            for k in clusters.labels.tolist()
        ]
        boxes, scores = head(clusters)
        ref_boxes, ref_scores = slow_fuse(rows, clusters.preds)
        assert_close(boxes, ref_boxes)
        assert_close(scores, ref_scores)
        assert head.class_rows(torch.tensor([0, 1, 2, 3, 4, 99])).tolist() == [0, 1, -1, 2, -1, -1]

    def test_scores_clamped(self):
        clusters = random_clusters(0, dtype=F64)
        head = ThetaHead(["a", "b", "c"]).double()
        with torch.no_grad():
            head.theta.fill_(5.0)
        _, scores = head(clusters)
        assert scores.max() == 1.0 and scores.min() >= 0.0
        assert (clusters.preds[..., 4].sum(1) * 5 > 1).any()

    @pytest.mark.parametrize("seed", range(8))
    def test_uniform_theta_reproduces_mean(self, seed):
        per_model = random_detections(seed)
        clusters = match(per_model)
        head = ThetaHead(["a", "b", "c"])
        boxes, scores = head(clusters)
        mean_boxes, mean_scores = average_clusters(clusters, torch.ones(3))
        assert_close(boxes, mean_boxes, atol=1e-6, rtol=1e-5)
        assert_close(scores, mean_scores, atol=1e-6, rtol=1e-5)
        fused_theta = fuse(per_model, "theta", head=head)
        fused_mean = fuse(per_model, "mean")
        assert fused_theta.source == "fused:theta"
        assert_close(fused_theta.boxes, fused_mean.boxes, atol=1e-3, rtol=0)
        assert_close(fused_theta.scores, fused_mean.scores, atol=1e-6, rtol=0)
        assert torch.equal(fused_theta.labels, fused_mean.labels)

    def test_empty_clusters(self):
        for per_class in (False, True):
            head = ThetaHead(["a", "b"], per_class=per_class, class_ids=[1] if per_class else None)
            empty = Clusters.empty(2, (10, 20))
            boxes, scores = head(empty)
            assert boxes.shape == (0, 4) and scores.shape == (0,)
            fused = head.fuse(empty)
            assert len(fused) == 0 and fused.image_size == (10, 20)
            loss = head.loss(empty, Targets.empty())
            loss.backward()
            assert loss.item() == 0.0 and torch.equal(head.theta.grad, torch.zeros(2))

    def test_differentiable_from_the_input_boxes_through_match(self):
        # matching is discrete, but each cluster row is its model's box: Θ's output has a gradient
        # with respect to the input boxes and scores, and to Θ itself
        boxes = torch.tensor([[10.0, 10.0, 40.0, 40.0], [60.0, 10.0, 90.0, 30.0]], requires_grad=True)
        scores = torch.tensor([0.9, 0.6], requires_grad=True)
        a = Detections(boxes, scores, [1, 2], (50, 100), "a")
        b = Detections([[12.0, 11.0, 41.0, 39.0]], [0.8], [1], (50, 100), "b")
        head = ThetaHead(["a", "b"])
        fused_boxes, fused_scores = head(match([a, b]))
        (fused_boxes.sum() + fused_scores.sum()).backward()
        assert boxes.grad is not None and (boxes.grad != 0).all() and (scores.grad != 0).all()
        assert head.theta.grad is not None

    def test_all_models_empty_through_fuser(self):
        per_model = [Detections.empty((50, 50)) for _ in range(3)]
        assert len(fuse(per_model, "theta", head=ThetaHead(["a", "b", "c"]))) == 0

    def test_wrong_number_of_models(self):
        head = ThetaHead(["a", "b"])
        with pytest.raises(ValueError, match="3 models"):
            head(random_clusters(0, num_models=3))
        with pytest.raises(ValueError, match=r"trained for 2 models \['a', 'b'\] but 3"):
            fuse(random_detections(0), "theta", head=head)

    def test_named_members_that_do_not_fit_the_head_are_named(self):
        one = Detections([[10.0, 10.0, 40.0, 40.0]], [0.8], [1], (50, 100))
        head = ThetaHead(["a", "b", "c"])
        with pytest.raises(ValueError, match=r"but 2 models' detections were given \(missing: \['b'\]\)"):
            fuse([one.with_source("c"), one.with_source("a")], "theta", head=head)
        with pytest.raises(ValueError, match=r"\(missing: \['b', 'c'\]; not the head's: \['x'\]\)"):
            fuse([one.with_source("a"), one.with_source("x")], "theta", head=head)


class TestDeviceAndDtype:
    @pytest.mark.parametrize("device", DEVICES)
    @pytest.mark.parametrize(
        "head_dtype, preds_dtype",
        [(torch.float32, torch.float32), (F64, torch.float32), (torch.float32, F64)],
    )
    def test_device_and_dtype(self, device, head_dtype, preds_dtype):
        clusters = random_clusters(1, dtype=preds_dtype).to(device)
        head = ThetaHead(["a", "b", "c"], per_class=True, class_ids=[0, 1]).to(head_dtype)  # stays on the CPU
        boxes, scores = head(clusters)
        assert boxes.device.type == device and scores.device.type == device
        assert boxes.dtype == torch.promote_types(head_dtype, preds_dtype)
        assert head.fuse(clusters).device.type == device
        targets = Targets(
            torch.zeros(len(clusters), 4, device=device),
            torch.zeros(len(clusters), dtype=torch.bool, device=device),
            torch.zeros(len(clusters), dtype=torch.bool, device=device),
        )
        head.loss(clusters, targets).backward()
        assert head.theta.grad.device.type == "cpu" and head.theta.grad.dtype == head_dtype

    @pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
    def test_fuses_in_its_own_dtype_inside_autocast(self, autocast_dtype, assert_fuses_alike_inside_autocast):
        head = ThetaHead(["a", "b", "c"], per_class=True, class_ids=[0, 1])
        set_theta(head, 3)
        per_model = [d.with_source(name) for d, name in zip(random_detections(3), "abc", strict=True)]
        assert_fuses_alike_inside_autocast(head, per_model, autocast_dtype)

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_cuda_matches_cpu(self):
        clusters = random_clusters(2)
        head = ThetaHead(["a", "b", "c"])
        set_theta(head, 2)
        cpu = head(clusters)
        gpu = head.cuda()(clusters.to("cuda"))
        assert_close(gpu[0].cpu(), cpu[0])
        assert_close(gpu[1].cpu(), cpu[1])


def synthetic_two_models(seed, num_clusters=300, labels=None):
    """Model 0 is accurate (tight boxes, high scores on true objects only); model 1 is noisy."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(num_clusters, 2, generator=g) * 0.6
    gt = torch.cat([xy, xy + 0.1 + torch.rand(num_clusters, 2, generator=g) * 0.2], 1)
    matched = torch.rand(num_clusters, generator=g) < 0.6
    accurate = gt + torch.randn(num_clusters, 4, generator=g) * 0.005
    noisy = gt + torch.randn(num_clusters, 4, generator=g) * 0.08
    s_acc = torch.where(
        matched,
        0.7 + 0.25 * torch.rand(num_clusters, generator=g),
        0.05 + 0.25 * torch.rand(num_clusters, generator=g),
    )
    s_noisy = torch.rand(num_clusters, generator=g)
    preds = torch.stack(
        [torch.cat([accurate, s_acc[:, None]], 1), torch.cat([noisy, s_noisy[:, None]], 1)], 1
    )
    labels = torch.zeros(num_clusters, dtype=torch.int64) if labels is None else labels
    clusters = Clusters(
        preds,
        torch.ones(num_clusters, 2, dtype=torch.bool),
        labels,
        torch.zeros(num_clusters, 2, dtype=torch.int64),
        (100, 100),
    )
    return clusters, Targets(gt * matched[:, None], matched, torch.zeros(num_clusters, dtype=torch.bool))


class TestTraining:
    @pytest.mark.parametrize("normalize_box", [False, True])
    @pytest.mark.parametrize("optimizer, lr", [("gd", 0.1), ("adam", 0.01)])
    def test_moves_toward_accurate_model(self, optimizer, lr, normalize_box):
        clusters, targets = synthetic_two_models(0)
        head = ThetaHead(["accurate", "noisy"], normalize_box=normalize_box)
        history = head.fit(clusters, targets, steps=300, lr=lr, optimizer=optimizer)
        assert history[-1] < history[0]
        theta = head.theta.detach()
        assert theta[0] > theta[1] + 0.2
        uniform_err = (
            (ThetaHead(["accurate", "noisy"])(clusters)[0] - targets.boxes)[targets.matched].abs().mean()
        )
        trained_err = (head(clusters)[0] - targets.boxes)[targets.matched].abs().mean()
        if normalize_box:
            assert trained_err < uniform_err  # the trained head fuses better boxes than the uniform one
        else:
            # Seed-exact J: J_cls pulls every θᵢpᵢ toward 1 on true objects, inflating ΣΘ beyond 1, and
            # the box ŶᵀΘ scales with ΣΘ, so boxes get worse (the reason for the normalized variant).
            assert theta.sum() > 1.2 and trained_err > uniform_err

    def test_multi_image_loss_is_mean_over_all_clusters(self):
        c1, t1 = synthetic_two_models(1, num_clusters=5)
        c2, t2 = synthetic_two_models(2, num_clusters=9)
        t2.ignore[0], t2.matched[0] = True, False
        head = ThetaHead(["a", "b"]).double()
        set_theta(head, 0)
        both = head.loss([c1, c2], [t1, t2])
        stacked = Clusters(
            torch.cat([c1.preds, c2.preds]),
            torch.cat([c1.present, c2.present]),
            torch.cat([c1.labels, c2.labels]),
            torch.cat([c1.source_index, c2.source_index]),
            (1, 1),
        )
        assert_close(both, head.loss(stacked, Targets.cat([t1, t2])))
        n1, n2 = 5, 8  # one cluster of image 2 is ignored
        expected = (head.loss(c1, t1) * n1 + head.loss(c2, t2) * n2) / (n1 + n2)
        assert_close(both, expected)
        with pytest.raises(ValueError, match="2 Clusters but 1 Targets"):
            head.loss([c1, c2], [t1])
        with pytest.raises(ValueError, match="clusters but"):
            head.loss(c1, t2)

    def test_gd_step_is_the_seed_rule(self):
        clusters, targets = synthetic_two_models(3, num_clusters=20)
        head = ThetaHead(["a", "b"])
        before = head.theta.detach().clone()
        opt = make_optimizer(head, "gd", lr=0.05)
        loss = head.loss(clusters, targets)
        loss.backward()
        grad = head.theta.grad.clone()
        opt.step()
        assert_close(head.theta.detach(), before - 0.05 * grad)

    @pytest.mark.parametrize("name", ["gd", "adam"])
    def test_projection_keeps_theta_above_eps(self, name):
        clusters, targets = synthetic_two_models(3, num_clusters=20)
        head = ThetaHead(["a", "b"], per_class=True, class_ids=[0], eps=1e-4)
        opt = make_optimizer(head, name, lr=100.0)
        with torch.no_grad():
            head.theta.fill_(2.0)  # J_cons drives Θ far below zero in one big step
            head.class_theta.fill_(2.0)
        head.loss(clusters, targets).backward()
        assert (head.theta.grad > 0).all()
        opt.step()
        assert (head.theta.detach() == 1e-4).all() and (head.class_theta.detach() == 1e-4).all()

    def test_unknown_optimizer(self):
        with pytest.raises(ValueError, match="valid names: gd, adam"):
            make_optimizer(ThetaHead(["a"]), "sgd-momentum")

    @pytest.mark.parametrize(("lr", "error", "message"), [
        ("0.1", TypeError, "lr must be a number, got str"), (True, TypeError, "lr must be a number, got bool"),
        (0.0, ValueError, "lr must be a positive number, got 0.0"), (float("nan"), ValueError, "lr must be"),
    ])
    def test_a_learning_rate_of_another_kind_or_not_positive_is_named(self, lr, error, message):
        with pytest.raises(error, match=message):
            make_optimizer(ThetaHead(["a"]), "gd", lr=lr)
        assert make_optimizer(ThetaHead(["a"]), "gd", lr=np.float32(0.25)).param_groups[0]["lr"] == 0.25

    def test_per_class_shrinkage(self):
        # class 0: model 0 accurate; class 1: model 1 accurate (models swapped)
        c0, t0 = synthetic_two_models(4, num_clusters=200)
        c1, t1 = synthetic_two_models(5, num_clusters=200, labels=torch.ones(200, dtype=torch.int64))
        c1 = Clusters(c1.preds.flip(1), c1.present, c1.labels, c1.source_index, c1.image_size)
        spread = {}
        for shrinkage in (0.0, 2.0):
            head = ThetaHead(["a", "b"], per_class=True, class_ids=[0, 1], shrinkage=shrinkage)
            head.fit([c0, c1], [t0, t1], steps=150, lr=0.1)
            ct = head.class_theta.detach()
            spread[shrinkage] = (ct - head.theta.detach()).abs().max().item()
            if shrinkage == 0.0:
                assert ct[0, 0] > ct[0, 1] and ct[1, 1] > ct[1, 0]  # each class follows its own data
        assert spread[2.0] < 0.05 < 0.1 < spread[0.0]

    def test_a_class_seen_only_as_ground_truth_fuses_with_the_global_theta(self):
        # class 0 has clusters; class 5 only ground-truth boxes, so no cluster could fit a Θ of its own
        samples = []
        for seed in range(3):
            clusters, targets = synthetic_two_models(seed, num_clusters=60)
            gt_boxes = torch.cat([targets.boxes[targets.matched] * 100, torch.tensor([[10.0, 10.0, 40.0, 40.0]])])
            gt_labels = torch.cat([torch.zeros(int(targets.matched.sum()), dtype=torch.int64), torch.tensor([5])])
            samples.append(ImageSample(seed, clusters, gt_boxes, gt_labels, torch.zeros(len(gt_labels), dtype=torch.bool)))
        head, _ = train_theta(samples, ["a", "b"], ThetaTrainConfig(per_class=True, epochs=30, match_iou_grid=[]))
        theta = head.theta.detach()
        assert (theta - 0.5).abs().min() > 0.04  # the global Θ moved away from 1/N, where a row without data stays
        clusters, _ = synthetic_two_models(9, num_clusters=20, labels=torch.full((20,), 5))
        boxes, scores = head(clusters)
        ref_boxes, ref_scores = slow_fuse([theta.tolist()] * 20, clusters.preds, normalize_box=True)
        assert_close(boxes.double(), ref_boxes)
        assert_close(scores.double(), ref_scores)
        assert head.class_ids.tolist() == [0]

    def test_divergence_is_an_error(self):
        clusters, targets = synthetic_two_models(4, num_clusters=50)
        head = ThetaHead(["a", "b"], per_class=True, class_ids=[0], shrinkage=100.0)
        with pytest.raises(FloatingPointError, match="lower the learning rate"):
            head.fit(clusters, targets, steps=100, lr=0.05)


class TestConstruction:
    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"model_names": []}, ValueError, "empty"),
            ({"model_names": ["a", "a"]}, ValueError, "unique"),
            ({"model_names": "ab"}, TypeError, "list of model names"),
            ({"per_class": True}, ValueError, "class_ids"),
            ({"class_ids": [1, 2]}, ValueError, "per_class=True"),
            ({"per_class": True, "class_ids": [1, 1]}, ValueError, "unique"),
            ({"per_class": True, "class_ids": [-1]}, ValueError, r"class_ids\[0\] must be an integer in \[0, 2147483647\]"),
            ({"per_class": True, "class_ids": [2**31]}, ValueError, r"class_ids\[0\] must be an integer in"),
            ({"per_class": True, "class_ids": [1.0]}, TypeError, r"class_ids\[0\] must be an integer, got float"),
            ({"eps": 0.0}, ValueError, "eps"),
            ({"lambda_cls": -1.0}, ValueError, "lambda_cls"),
        ],
    )
    def test_bad_config(self, kwargs, error, match):
        kwargs = {"model_names": ["a", "b"], **kwargs}
        with pytest.raises(error, match=match):
            ThetaHead(**kwargs)

    def test_init_and_num_classes(self):
        head = ThetaHead(["a", "b", "c", "d"], per_class=True, num_classes=3)
        assert_close(head.theta.detach(), torch.full((4,), 0.25))
        assert head.class_ids.tolist() == [0, 1, 2] and head.class_theta.shape == (3, 4)
        assert head.num_models == 4 and "theta" in HEADS and list_heads() == HEADS.names()


class TestSaveLoad:
    @pytest.mark.parametrize("suffix", [".json", ".safetensors"])
    @pytest.mark.parametrize(
        "per_class, normalize_box, dtype",
        [(False, False, torch.float32), (True, True, torch.float32), (True, False, F64)],
    )
    def test_round_trip(self, tmp_path, suffix, per_class, normalize_box, dtype):
        head = ThetaHead(
            ["yolov8n", "yolo11n", "yolo26n"],
            per_class=per_class,
            class_ids=[1, 5, 7] if per_class else None,
            normalize_box=normalize_box,
            eps=1e-5,
            lambda_reg=2.0,
            lambda_cls=0.5,
            lambda_cons=3.0,
            shrinkage=0.2,
        ).to(dtype)
        set_theta(head, 9)
        path = tmp_path / f"head{suffix}"
        head.save(path)
        for loaded in (
            ThetaHead.load(path),
            load_head(path),
            load_head(path, model_names=["yolov8n", "yolo11n", "yolo26n"]),
        ):
            assert isinstance(loaded, ThetaHead)
            assert loaded.model_names == head.model_names and loaded.config() == head.config()
            assert loaded.theta.dtype == dtype
            assert torch.equal(loaded.theta.detach(), head.theta.detach())
            if per_class:
                assert torch.equal(loaded.class_theta.detach(), head.class_theta.detach())
                assert torch.equal(loaded.class_ids, head.class_ids)
            clusters = random_clusters(3, num_classes=8)
            assert torch.equal(loaded(clusters)[0], head(clusters)[0])

    def test_json_is_readable_and_has_no_pickle(self, tmp_path):
        head = ThetaHead(["a", "b"])
        head.save(tmp_path / "h.json")
        doc = json.loads((tmp_path / "h.json").read_text())
        assert (
            doc["type"] == "theta"
            and doc["model_names"] == ["a", "b"]
            and doc["config"]["per_class"] is False
        )
        assert doc["tensors"]["theta"]["data"] == [0.5, 0.5]

    @pytest.mark.parametrize("suffix", [".json", ".safetensors"])
    def test_model_names_mismatch(self, tmp_path, suffix):
        path = tmp_path / f"h{suffix}"
        ThetaHead(["yolov8n", "yolo11n"]).save(path)
        with pytest.raises(ValueError, match=r"\['yolov8n', 'yolo11n'\].*\['yolov8n', 'rtdetr'\]"):
            ThetaHead.load(path, model_names=["yolov8n", "rtdetr"])
        assert load_head(path, model_names=["yolo11n", "yolov8n"]).model_names == ["yolov8n", "yolo11n"]

    @pytest.mark.parametrize(
        "content",
        [
            b"not json at all",
            b"[1, 2]",
            b'{"format": "something-else", "type": "theta"}',
            b'{"format": "detens-head", "format_version": 1, "type": "theta", "model_names": ["a"], "config": {}, "tensors": {"theta": {"dtype": "float32", "shape": [2], "data": [1.0]}}}',
            b'{"format": "detens-head", "format_version": 1, "type": "theta", "model_names": ["a", "b"], "config": {}, "tensors": {"theta": {"dtype": "float32", "shape": [3], "data": [1.0, 1.0, 1.0]}}}',
            b'{"format": "detens-head", "format_version": 1, "type": "theta", "model_names": ["a"], "config": {"bogus": 1}, "tensors": {"theta": {"dtype": "float32", "shape": [1], "data": [1.0]}}}',
            b'{"format": "detens-head", "format_version": 1, "type": "theta", "model_names": ["a"], "config": {"eps": -1}, "tensors": {"theta": {"dtype": "float32", "shape": [1], "data": [1.0]}}}',
            b'{"format": "detens-head", "format_version": 9, "type": "theta", "model_names": ["a"], "config": {}, "tensors": {}}',
        ],
    )
    def test_corrupt_json(self, tmp_path, content):
        path = tmp_path / "h.json"
        path.write_bytes(content)
        with pytest.raises(HeadFileError, match="h.json"):
            load_head(path)

    def test_corrupt_safetensors(self, tmp_path):
        good = tmp_path / "good.safetensors"
        ThetaHead(["a", "b"]).save(good)
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes(good.read_bytes()[:20])
        with pytest.raises(HeadFileError, match="bad.safetensors"):
            load_head(bad)
        bad.write_bytes(b"\x00" * 64)
        with pytest.raises(HeadFileError):
            ThetaHead.load(bad)

    def test_unknown_type_lists_valid_ones(self, tmp_path):
        path = tmp_path / "h.json"
        ThetaHead(["a"]).save(path)
        doc = json.loads(path.read_text())
        doc["type"] = "thetta"
        path.write_text(json.dumps(doc))
        with pytest.raises(HeadFileError, match=r"valid names: .*theta.*Did you mean 'theta'"):
            load_head(path)
        with pytest.raises(HeadFileError, match="not 'theta'"):
            ThetaHead.load(path)

    def test_suffix_and_missing_file(self, tmp_path):
        with pytest.raises(ValueError, match=r"\.json, \.safetensors"):
            ThetaHead(["a"]).save(tmp_path / "h.pt")
        with pytest.raises(FileNotFoundError):
            load_head(tmp_path / "missing.json")

    def test_fuser_loads_a_path(self, tmp_path):
        per_model = random_detections(4)
        head = ThetaHead(["a", "b", "c"])
        set_theta(head, 4)
        path = tmp_path / "h.safetensors"
        head.save(path)
        from_path = fuse(per_model, "theta", head=str(path), iou_thr=0.5)
        direct = fuse(per_model, "theta", head=head, iou_thr=0.5)
        assert torch.equal(from_path.boxes, direct.boxes) and torch.equal(from_path.scores, direct.scores)
        with pytest.raises(ValueError, match="trained for 3 models"):
            fuse(per_model[:2], "theta", head=path)
        # a head saved again at the same path is picked up, not served from the cache
        ThetaHead(["a", "b", "c"], normalize_box=True, lambda_cls=0.25).save(path)
        again = fuse(per_model, "theta", head=path, iou_thr=0.5)
        assert_close(again.scores, fuse(per_model, "mean", iou_thr=0.5).scores, atol=1e-6, rtol=0)


def test_fuser_with_an_untrained_head_fuses_like_mean():
    per_model = random_detections(6)
    fused = fuse(per_model, "theta", head=ThetaHead(["a", "b", "c"][: len(per_model)]))
    assert_close(fused.scores, fuse(per_model, "mean").scores, atol=1e-6, rtol=0)


def test_fuser_rejects_non_heads():
    with pytest.raises(TypeError, match="fuse"):
        fuse(random_detections(0), "theta", head=object())


def test_assign_targets_with_head_output_round_trip():
    # the head's own output drives the target assignment; a GT equal to a fused box is matched to it
    clusters = random_clusters(5, num_clusters=6)
    head = ThetaHead(["a", "b", "c"])
    boxes, scores = head(clusters)
    height, width = clusters.image_size
    gt = boxes[:3].detach() * torch.tensor([width, height, width, height])
    targets = assign_targets(clusters, boxes, scores, gt, clusters.labels[:3])
    assert targets.matched[:3].all()
    loss = head.loss(clusters, targets)
    assert torch.isfinite(loss)


def test_fuser_defaults_to_the_heads_matching_iou(tmp_path):
    per_model = random_detections(11)
    names = ["a", "b", "c"][: len(per_model)]
    head = ThetaHead(names, normalize_box=True, match_iou=0.3)
    path = tmp_path / "head.json"
    head.save(path)
    assert ThetaHead.load(path).match_iou == 0.3
    by_default = fuse(per_model, "theta", head=path)
    explicit = fuse(per_model, "theta", head=head, iou_thr=0.3)
    other = fuse(per_model, "theta", head=head, iou_thr=0.8)
    assert_close(by_default.boxes, explicit.boxes)
    assert len(other) != len(by_default)


def random_samples(seed, sizes, num_models=3, dtype=F64):
    """Training samples with ``sizes`` clusters each (0: an image with ground truth only) and their
    targets: some clusters matched, some crowd-ignored."""
    from detens.heads._fit import ImageSample

    g = torch.Generator().manual_seed(seed)
    samples, targets = [], []
    for index, size in enumerate(sizes):
        clusters = random_clusters(seed * 100 + index, num_clusters=size, num_models=num_models, dtype=dtype)
        matched = torch.rand(size, generator=g) < 0.5
        ignore = ~matched & (torch.rand(size, generator=g) < 0.3)
        boxes = (clusters.preds[:, 0, :4] + 0.02 * torch.randn(size, 4, generator=g, dtype=dtype)) * matched[:, None]
        empty_gt = (torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.bool))
        samples.append(ImageSample(index, clusters, *empty_gt))
        targets.append(Targets(boxes, matched, ignore))
    return samples, targets


def every_sample_stacked(head, samples, targets):
    """The reference: J of the whole training set stacked into one batch."""
    with torch.no_grad():
        return float(head.loss_on_batch(*head.stack_batch([s.clusters for s in samples], targets)))


class TestObjectiveInBatches:
    """The objective of the Θ fit's divergence check with mini-batches, summed batch by batch, against the
    objective of every sample stacked at once."""

    @pytest.mark.parametrize("per_class", [False, True])
    @pytest.mark.parametrize("normalize_box", [False, True])
    @pytest.mark.parametrize("batch_images", [1, 2, 3, 7, 50])
    def test_equals_the_objective_of_every_sample_stacked(self, per_class, normalize_box, batch_images):
        from detens.heads._fit import _objective_in_batches

        for seed in range(3):
            samples, targets = random_samples(seed, [5, 0, 12, 1, 7, 3, 9])
            # class 3 has no Θ of its own: its clusters use the global Θ
            head = ThetaHead(["a", "b", "c"], per_class=per_class, num_classes=3 if per_class else None,
                             normalize_box=normalize_box, shrinkage=0.5).double()
            set_theta(head, seed)
            got = _objective_in_batches(head, samples, targets, batch_images)
            assert got == pytest.approx(every_sample_stacked(head, samples, targets), rel=1e-12)

    @pytest.mark.parametrize("per_class", [False, True])
    @pytest.mark.parametrize("sizes", [[], [6], [0], [0, 0], [4, 0, 5]])
    def test_no_sample_one_sample_and_no_cluster_that_counts(self, per_class, sizes):
        from detens.heads._fit import _objective_in_batches

        samples, targets = random_samples(1, sizes)
        if sizes == [4, 0, 5]:  # every cluster crowd-ignored: the mean over none is 0
            for t in targets:
                t.matched[:], t.ignore[:] = False, True
        head = ThetaHead(["a", "b", "c"], per_class=per_class, num_classes=4 if per_class else None).double()
        set_theta(head, 2)
        expected = every_sample_stacked(head, samples, targets)
        assert _objective_in_batches(head, samples, targets, 2) == pytest.approx(expected, rel=1e-12, abs=1e-15)
        if not any(sizes) or sizes == [4, 0, 5]:
            assert expected == pytest.approx(float(head.shrinkage_pull().detach()), abs=1e-15)  # the pull alone

    def test_float32_within_rounding(self):
        from detens.heads._fit import _objective_in_batches

        samples, targets = random_samples(4, [30, 17, 25, 8], dtype=torch.float32)
        head = ThetaHead(["a", "b", "c"], per_class=True, num_classes=4, normalize_box=True)
        set_theta(head, 4)
        got = _objective_in_batches(head, samples, targets, 3)
        assert got == pytest.approx(every_sample_stacked(head, samples, targets), rel=1e-5)

    def test_mistakes(self):
        from detens.heads._fit import _objective_in_batches

        samples, targets = random_samples(0, [3, 2])
        head = ThetaHead(["a", "b", "c"]).double()
        with pytest.raises(ValueError, match="got 2 samples but 1 targets"):
            _objective_in_batches(head, samples, targets[:1], 1)
        with pytest.raises(ValueError, match="batch_images must be an integer >= 1, got 0"):
            _objective_in_batches(head, samples, targets, 0)
