"""The heads beyond Θ (selection / e2e-CEL, deep ensemble, Super Learner), their training, the
``random_k`` and ``oracle`` baselines, and their evaluation methods.

Dimension legend: C clusters, N models, F features, G ground-truth boxes.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
import re

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import detens.heads._features as features_module
from detens import Detections, fuse, match
from detens.fusers.consensus import average_clusters
from detens.heads import HEADS, HeadFileError, fit_head, load_head
from detens.heads._features import (
    cluster_features,
    feature_names,
    num_features,
    pairwise_iou,
    present_median_box,
)
from detens.heads._fit import (
    DeepTrainConfig,
    ImageSample,
    SelectionTrainConfig,
    SuperLearnerTrainConfig,
    config_for,
    score_targets,
    train_head,
    train_network_head,
)
from detens.heads._net import FEATURE_GROUPS
from detens.heads.deep import MEDIAN_MIN_PRESENT, DeepEnsembleHead, score_weighted_box
from detens.heads.selection import SelectionHead, combine_selected
from detens.heads.superlearner import SuperLearnerHead
from detens.matching import Clusters
from detens.targets import Targets

KINDS = ["selection", "deep", "superlearner"]
CLASSES = {"selection": SelectionHead, "deep": DeepEnsembleHead, "superlearner": SuperLearnerHead}
NAMES = ["m0", "m1", "m2"]
SIZE = (120, 160)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# ------------------------------------------------------------------------------------------ fixtures
def scene(seed: int, num_models: int = 3, num_objects: int = 6, size=SIZE):
    """GT objects, and per model noisy copies (model m's jitter grows with m), misses and false positives."""
    rng = random.Random(seed)
    height, width = size
    gt_boxes, gt_labels = [], []
    for _ in range(num_objects):
        x, y = rng.uniform(0, width - 50), rng.uniform(0, height - 50)
        gt_boxes.append([x, y, x + rng.uniform(15, 45), y + rng.uniform(15, 45)])
        gt_labels.append(rng.randrange(3))
    per_model = []
    for m in range(num_models):
        boxes, scores, labels = [], [], []
        for box, label in zip(gt_boxes, gt_labels, strict=True):
            if rng.random() < 0.15:
                continue
            jitter = [rng.gauss(0, 1.0 + 2.0 * m) for _ in range(4)]
            x1, y1 = box[0] + jitter[0], box[1] + jitter[1]
            boxes.append([x1, y1, max(x1 + 2, box[2] + jitter[2]), max(y1 + 2, box[3] + jitter[3])])
            scores.append(rng.uniform(0.4, 0.95))
            labels.append(label)
        for _ in range(3):  # false positives
            x, y = rng.uniform(0, width - 30), rng.uniform(0, height - 30)
            boxes.append([x, y, x + rng.uniform(8, 30), y + rng.uniform(8, 30)])
            scores.append(rng.uniform(0.01, 0.5))
            labels.append(rng.randrange(3))
        per_model.append(Detections(torch.tensor(boxes), scores, labels, size))
    return per_model, torch.tensor(gt_boxes), torch.tensor(gt_labels)


def samples(num_images: int = 6, seed: int = 0, num_models: int = 3) -> list[ImageSample]:
    return copy.deepcopy(_samples(num_images, seed, num_models))


@functools.cache
def _samples(num_images: int, seed: int, num_models: int) -> list[ImageSample]:
    out = []
    for i in range(num_images):
        per_model, gt_boxes, gt_labels = scene(seed * 1000 + i, num_models)
        clusters = match(per_model, 0.55)
        out.append(ImageSample(i, clusters, gt_boxes, gt_labels, torch.zeros(len(gt_labels), dtype=torch.bool)))
    return out


def small_config(kind: str, **overrides):
    options = dict(epochs=3, hidden=16, depth=1, batch_clusters=16, seed=0)
    if kind == "selection":
        options["num_samples"] = 8
    return config_for(kind, **{**options, **overrides})


def trained(kind: str, **overrides):
    return copy.deepcopy(_trained(kind, tuple(sorted(overrides.items()))))


@functools.cache
def _trained(kind: str, overrides: tuple):
    head, _ = train_head(kind, samples(4), NAMES, small_config(kind, **dict(overrides)))
    return head


def outputs_equal(a, b, clusters):
    boxes_a, scores_a = a(clusters)
    boxes_b, scores_b = b(clusters)
    assert_close(boxes_a, boxes_b)
    assert_close(scores_a, scores_b)


# ------------------------------------------------------------------------------------------ features
def crowded_clusters(num: int, generator: torch.Generator, dtype: torch.dtype):
    """Mean boxes, scores and labels of ``num`` clusters crowded around a few places: exact duplicates,
    scores tied to two decimals, some boxes without area, three classes."""
    centres = torch.rand(4, 2, generator=generator) * 0.8 + 0.1
    place = torch.randint(4, (num,), generator=generator)
    half = torch.rand(num, 2, generator=generator) * 0.1 + 0.02
    centre = centres[place] + torch.randn(num, 2, generator=generator) * 0.03
    boxes = torch.cat([centre - half, centre + half], 1)
    if num > 3:
        boxes[1] = boxes[0]  # an exact duplicate
        boxes[2, 2] = boxes[2, 0]  # no width
        boxes[3, 2:] = boxes[3, :2]  # a point
    scores = (torch.rand(num, generator=generator) * 20).round() / 20  # ties
    labels = torch.randint(3, (num,), generator=generator)
    if num > 4:  # cluster 4's duplicates of equal IoU score differently: the lower index is the one
        boxes[4] = boxes[0] + 0.01
        labels[:5] = labels[0]
        scores[[0, 1, 4]] = torch.tensor([0.8, 0.9, 0.3])
    return boxes.to(dtype), scores.to(dtype), labels


def slow_iou(a: list, b: list) -> float:
    """IoU of two xyxy boxes; 0 where they do not overlap (boxes without area included)."""
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    if width <= 0 or height <= 0:
        return 0.0
    inter = width * height
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def slow_context(boxes: list, scores: list, labels: list) -> list:
    """The context columns of :mod:`detens.heads._features`, one cluster and one pair at a time."""
    iou = slow_iou

    def before(j, i):
        return scores[j] > scores[i] or (scores[j] == scores[i] and j < i)

    rows = []
    confident = [s > 0.25 for s in scores]
    for i, score in enumerate(scores):
        others = [j for j in range(len(scores)) if j != i]
        same = [j for j in others if labels[j] == labels[i]]
        other = [j for j in others if labels[j] != labels[i]]
        dup_iou, dup_at = 0.0, None
        for j in same:  # ascending j: the lowest index wins a tie
            if before(j, i) and iou(boxes[i], boxes[j]) > dup_iou:
                dup_iou, dup_at = iou(boxes[i], boxes[j]), j
        overlaps = sum(iou(boxes[i], boxes[j]) > 0.3 for j in same)
        rank = sum(before(j, i) for j in same)
        best = max([score] + [scores[j] for j in same])
        other_iou = max([0.0] + [iou(boxes[i], boxes[j]) for j in other if before(j, i)])
        colocated = [scores[j] for j in other if iou(boxes[i], boxes[j]) > 0.7]
        other_best = max([0.0] + colocated)
        rows.append([
            dup_iou,
            scores[dup_at] - score if dup_at is not None else 0.0,
            math.log1p(overlaps),
            math.log1p(rank),
            score / max(best, 1e-6),
            other_iou,
            other_best / max(other_best + score, 1e-6),
            score / max(sum(colocated) + score, 1e-6),
            math.log1p(sum(confident)),
            math.log1p(sum(confident[j] for j in same) + confident[i]),
        ])
    return rows


def slow_cluster_features(preds: list, present: list, labels: list, visible: list) -> list:
    """Every feature column of :func:`cluster_features`, one cluster, model and pair at a time; the context
    columns by :func:`slow_context` on the mean boxes and mean scores."""
    iou = slow_iou
    num_models = len(present[0]) if present else 0
    rows, mean_boxes, mean_scores = [], [], []
    for c in range(len(preds)):
        here = [n for n in range(num_models) if present[c][n]]
        mean = [sum(preds[c][n][k] for n in here) / len(here) for k in range(4)]
        width, height = max(mean[2] - mean[0], 1e-6), max(mean[3] - mean[1], 1e-6)
        scores = [preds[c][n][4] if present[c][n] else 0.0 for n in range(num_models)]
        row = []
        for n in range(num_models):
            box = preds[c][n][:4]
            seen = present[c][n]
            offsets = [(box[k] - mean[k]) / (width if k % 2 == 0 else height) if seen else 0.0 for k in range(4)]
            row += [float(seen), scores[n], math.log(scores[n] + 1e-3), *offsets, iou(box, mean) if seen else 0.0]
        present_mean = sum(scores) / len(here)
        row += [
            len(here) / num_models,
            sum(scores) / num_models,
            max(scores),
            math.sqrt(sum((scores[n] - present_mean) ** 2 for n in here) / len(here)),
            math.log(width),
            math.log(height),
            math.log(width) - math.log(height),
            (mean[0] + mean[2]) / 2,
            (mean[1] + mean[3]) / 2,
        ]
        row += [iou(preds[c][i][:4], preds[c][j][:4]) if present[c][i] and present[c][j] else 0.0
                for i in range(num_models) for j in range(i + 1, num_models)]
        rows.append(row)
        mean_boxes.append(mean)
        mean_scores.append(sum(scores) / num_models)
    context = slow_context(mean_boxes, mean_scores, labels)
    for c, row in enumerate(rows):
        seen = [float(v) for v in visible[c]]
        count = max(sum(seen), 1.0)
        row += context[c] + seen + [sum(float(present[c][n]) * seen[n] for n in range(num_models)) / count,
                                    sum((preds[c][n][4] if present[c][n] else 0.0) * seen[n]
                                        for n in range(num_models)) / count]
    return rows


def random_clusters(num: int, num_models: int, generator: torch.Generator, dtype: torch.dtype = torch.float64):
    """Clusters as :func:`detens.match` makes them (absent rows: score 0, the present rows' mean box) around
    a few places: some rows duplicated, scores tied to two decimals, boxes without width, three classes."""
    centres = torch.rand(3, 2, generator=generator, dtype=dtype) * 0.8 + 0.1
    place = torch.randint(3, (num, 1), generator=generator)
    half = torch.rand(num, num_models, 2, generator=generator, dtype=dtype) * 0.1 + 0.02
    half[torch.rand(num, num_models, generator=generator) < 0.1, 0] = 0.0
    centre = centres[place] + (torch.rand(num, num_models, 2, generator=generator, dtype=dtype) - 0.5) * 0.05
    scores = (torch.rand(num, num_models, generator=generator, dtype=dtype) * 100).round() / 100
    preds = torch.cat([centre - half, centre + half, scores[..., None]], dim=2)
    if num and num_models > 1:
        preds[::4, 1] = preds[::4, 0]  # two members with one box
    present = torch.rand(num, num_models, generator=generator) < 0.6
    present[torch.arange(num), torch.randint(num_models, (num,), generator=generator)] = True
    mean = (preds[..., :4] * present[..., None]).sum(1) / present.sum(1, keepdim=True)
    preds[..., :4] = torch.where(present[..., None], preds[..., :4], mean[:, None, :])
    preds[..., 4] *= present
    labels = torch.randint(3, (num,), generator=generator)
    return Clusters(preds, present, labels, torch.where(present, 0, -1), SIZE)


class TestFeatures:
    @pytest.mark.parametrize("num_models", [1, 2, 3, 5])
    def test_every_column_matches_a_slow_reference(self, num_models):
        """Per-member, per-cluster, pairwise, context and visibility columns of crowded clusters against
        their definitions, with and without a visibility mask."""
        generator = torch.Generator().manual_seed(num_models)
        for num in (0, 1, 2, 40):
            clusters = random_clusters(num, num_models, generator)
            masks = [None, torch.rand(num, num_models, generator=generator) < 0.7]
            for visible in masks:
                got = cluster_features(clusters, visible=visible)
                seen = torch.ones(num, num_models, dtype=torch.bool) if visible is None else visible
                expected = slow_cluster_features(clusters.preds.tolist(), clusters.present.tolist(),
                                                 clusters.labels.tolist(), seen.tolist())
                expected = torch.tensor(expected, dtype=torch.float64).reshape(num, num_features(num_models))
                assert_close(got, expected, rtol=0, atol=1e-9)
                assert_close(pairwise_iou(clusters.preds, clusters.present),
                             got[:, [feature_names(num_models).index(f"iou[{i},{j}]")
                                     for i in range(num_models) for j in range(i + 1, num_models)]])

    def test_shape_names_and_empty(self):
        clusters = samples(1)[0].clusters
        features = cluster_features(clusters)
        assert features.shape == (len(clusters), num_features(3)) == (len(clusters), len(feature_names(3)))
        assert torch.isfinite(features).all()
        empty = cluster_features(Clusters.empty(3, SIZE))
        assert empty.shape == (0, num_features(3))
        assert set(FEATURE_GROUPS) >= {"score", "iou", "dup_iou"}

    def test_duplicate_and_agreement_columns(self):
        """Two identical same-class clusters: the lower-scored one has dup_iou 1, the other 0."""
        box = torch.tensor([0.1, 0.1, 0.4, 0.5])
        preds = torch.zeros(2, 2, 5)
        preds[:, :, :4] = box
        preds[0, :, 4] = torch.tensor([0.9, 0.8])
        preds[1, :, 4] = torch.tensor([0.3, 0.0])
        present = torch.tensor([[True, True], [True, False]])
        clusters = Clusters(preds, present, torch.tensor([1, 1]), torch.zeros(2, 2, dtype=torch.int64), SIZE)
        names = feature_names(2)
        features = cluster_features(clusters)
        assert features[:, names.index("dup_iou")].tolist() == [0.0, 1.0]
        assert features[:, names.index("iou[0,1]")].tolist() == [1.0, 0.0]  # 0 where a model is absent
        assert_close(features[:, names.index("mean_score")], torch.tensor([0.85, 0.15]))
        assert_close(pairwise_iou(preds, present), torch.tensor([[1.0], [0.0]]))


    @pytest.mark.parametrize("formulation", ["compiled", "dense"])
    @pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
    def test_context_matches_a_slow_reference(self, formulation, dtype, monkeypatch):
        """The ten context columns of crowded images (duplicate boxes, tied scores, boxes without area,
        several classes) against their definitions computed pair by pair."""
        if formulation == "dense":  # the GPU formulation, on the CPU, in blocks smaller than an image
            monkeypatch.setattr(features_module, "_compiled_context_terms", features_module._dense_context_terms)
            monkeypatch.setattr(features_module, "_BLOCK", 7)
        generator = torch.Generator().manual_seed(3)
        for num in (0, 1, 2, 25, 60):
            boxes, scores, labels = crowded_clusters(num, generator, dtype)
            got = features_module._context(boxes, scores, labels)
            expected = torch.tensor(slow_context(boxes.tolist(), scores.tolist(), labels.tolist()), dtype=dtype)
            tolerance = 1e-12 if dtype == torch.float64 else 1e-6
            assert_close(got, expected.reshape(num, len(features_module._CONTEXT)), rtol=0, atol=tolerance)

    def test_context_formulations_agree_to_the_bit(self, monkeypatch):
        """A network head's fit can turn on a feature's last bit, so the CPU kernel and the dense
        formulation give identical columns, sums over many colocated clusters of other classes included."""
        generator = torch.Generator().manual_seed(4)
        boxes, scores, labels = crowded_clusters(80, generator, torch.float32)
        stack = boxes[0] + torch.rand(12, 4, generator=generator) * 0.002  # 12 classes at one place
        boxes = torch.cat([boxes, stack])
        scores = torch.cat([scores, torch.rand(12, generator=generator)])
        labels = torch.cat([labels, torch.arange(3, 15)])
        compiled = features_module._context(boxes, scores, labels)
        monkeypatch.setattr(features_module, "_compiled_context_terms", features_module._dense_context_terms)
        dense = features_module._context(boxes, scores, labels)
        assert (compiled[80:, features_module._CONTEXT.index("other_class_mass")] < 1).all()
        assert torch.equal(compiled, dense)

    def test_dense_context_blocks_hold_a_bounded_number_of_pairs(self, monkeypatch):
        """The GPU formulation's [rows, C] blocks stay near ``_BLOCK``² pairs however many clusters an image
        has (2048 rows of 50,000 clusters took 4.9 GB), and give what one block gives."""
        generator = torch.Generator().manual_seed(5)
        boxes, scores, labels = crowded_clusters(60, generator, torch.float64)
        whole = features_module._dense_context_terms(boxes, scores, labels)
        blocks = []
        paired_iou = features_module._paired_iou
        monkeypatch.setattr(features_module, "_paired_iou", lambda a, b: blocks.append(a.shape[0] * b.shape[1]) or
                            paired_iou(a, b))
        monkeypatch.setattr(features_module, "_BLOCK", 7)
        split = features_module._dense_context_terms(boxes, scores, labels)
        assert len(blocks) > 1 and max(blocks) <= max(7 * 7, 60)
        assert all(torch.equal(a, b) for a, b in zip(whole, split, strict=True))

    def test_present_median_box_matches_a_slow_reference(self):
        import statistics

        generator = torch.Generator().manual_seed(0)
        for num_models in (1, 2, 3, 4, 5):
            preds = torch.rand(40, num_models, 5, generator=generator, dtype=torch.float64)
            present = torch.rand(40, num_models, generator=generator) < 0.6
            present[torch.arange(40), torch.randint(num_models, (40,), generator=generator)] = True
            got = present_median_box(preds, present)
            for c in range(40):
                rows = [preds[c, n, :4].tolist() for n in range(num_models) if present[c, n]]
                expected = [statistics.median(row[side] for row in rows) for side in range(4)]
                assert_close(got[c], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
        assert present_median_box(torch.zeros(0, 3, 5), torch.zeros(0, 3, dtype=torch.bool)).shape == (0, 4)


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("lambdas", [(1.0, 1.0), (0.5, 3.0), (1.0, 0.0)])
def test_score_and_box_loss_matches_a_slow_reference(soft, lambdas):
    """The network heads' per-cluster loss: BCE of the clamped score against the matched flag (or a soft
    target) plus the GIoU loss of matched clusters' boxes, 0 for ignored ones, cluster by cluster."""
    from detens.heads._net import _CLAMP, score_and_box_loss

    lambda_cls, lambda_box = lambdas
    generator = torch.Generator().manual_seed(int(soft) + 10 * int(lambda_box))
    for num in (0, 1, 40):
        xy = torch.rand(num, 2, generator=generator, dtype=torch.float64) * 0.6
        boxes = torch.cat([xy, xy + torch.rand(num, 2, generator=generator, dtype=torch.float64) * 0.4], 1)
        gt_xy = xy + (torch.rand(num, 2, generator=generator, dtype=torch.float64) - 0.5) * 0.3
        gt = torch.cat([gt_xy, gt_xy + torch.rand(num, 2, generator=generator, dtype=torch.float64) * 0.4], 1)
        scores = torch.rand(num, generator=generator, dtype=torch.float64)
        scores[::7] = 0.0  # clamped away from log(0)
        scores[1::7] = 1.0
        matched = torch.rand(num, generator=generator) < 0.6
        ignore = ~matched & (torch.rand(num, generator=generator) < 0.3)
        targets = Targets(torch.where(matched[:, None], gt, torch.zeros_like(gt)), matched, ignore)
        soft_targets = torch.rand(num, generator=generator, dtype=torch.float64) * matched if soft else None
        got = score_and_box_loss(boxes, scores, targets, soft_targets, lambda_cls, lambda_box)
        expected = []
        for c in range(num):
            if ignore[c]:
                expected.append(0.0)
                continue
            target = soft_targets[c].item() if soft else float(matched[c])
            q = min(max(scores[c].item(), _CLAMP), 1 - _CLAMP)
            loss = -lambda_cls * (target * math.log(q) + (1 - target) * math.log(1 - q))
            if matched[c] and lambda_box > 0:
                a, b = boxes[c].tolist(), gt[c].tolist()
                inter = max(min(a[2], b[2]) - max(a[0], b[0]), 0) * max(min(a[3], b[3]) - max(a[1], b[1]), 0)
                union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
                hull = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
                eps = 1e-7  # torchvision's generalized_box_iou_loss adds it to the union and the hull
                loss += lambda_box * (1 - (inter / (union + eps) - (hull - union) / (hull + eps)))
            expected.append(loss)
        assert_close(got, torch.tensor(expected, dtype=torch.float64).reshape(num), rtol=1e-9, atol=1e-9)


class TestMedianBox:
    """``median_box``: clusters of at least three present boxes take the per-side median; the others, and the
    training loss, keep the weighted box."""

    def test_boxes_and_loss(self):
        head = trained("deep", box="learned")
        median_head = copy.deepcopy(head)
        median_head.median_box = True
        data = samples(3, seed=2)
        for s in data:
            boxes, scores = head(s.clusters)
            median_boxes, median_scores = median_head(s.clusters)
            assert_close(median_scores, scores)
            many = s.clusters.present.sum(1) >= MEDIAN_MIN_PRESENT
            assert bool(many.any()) and bool((~many).any())
            assert_close(median_boxes[~many], boxes[~many])
            assert_close(median_boxes[many], present_median_box(s.clusters.preds[many], s.clusters.present[many]))
        from detens.heads._fit import assign_all_targets

        assigned = assign_all_targets(head, data, 0.5)
        clusters = [s.clusters for s in data]
        assert_close(median_head.loss(clusters, assigned), head.loss(clusters, assigned))

    @pytest.mark.parametrize("suffix", [".json", ".safetensors"])
    def test_saved_and_loaded(self, suffix, tmp_path):
        head = trained("deep")
        head.median_box = True
        path = tmp_path / f"head{suffix}"
        head.save(path)
        loaded = load_head(path)
        assert loaded.median_box is True and loaded.config()["median_box"] is True
        for s in samples(2, seed=5):
            outputs_equal(head, loaded, s.clusters)

    def test_a_file_without_the_key_is_refused(self, tmp_path):
        # the shipped heads were fitted with the median box on: a file without the key is not read as off
        head = trained("deep")
        head.median_box = True
        path = tmp_path / "head.json"
        head.save(path)
        document = json.loads(path.read_text())
        del document["config"]["median_box"]
        path.write_text(json.dumps(document))
        with pytest.raises(HeadFileError, match=r"the config lacks the keys \['median_box'\]"):
            load_head(path)

    def test_bad_value(self):
        with pytest.raises(TypeError, match="median_box must be true or false, got 'yes'"):
            DeepEnsembleHead(NAMES, median_box="yes")


# --------------------------------------------------------------------------------------------- heads
@pytest.mark.parametrize("kind", KINDS)
class TestHeadContract:
    def test_registered_and_shapes(self, kind):
        assert HEADS.get(kind) is CLASSES[kind]
        head = CLASSES[kind](NAMES)
        clusters = samples(1)[0].clusters
        boxes, scores = head(clusters)
        assert boxes.shape == (len(clusters), 4) and scores.shape == (len(clusters),)
        assert ((scores >= 0) & (scores <= 1)).all() and torch.isfinite(boxes).all()
        assert head.num_models == 3 and head.model_names == NAMES
        fused = head.fuse(clusters)
        assert isinstance(fused, Detections) and len(fused) == len(clusters)
        assert fused.source == f"fused:{kind}"

    def test_empty_clusters(self, kind):
        head = CLASSES[kind](NAMES)
        empty = Clusters.empty(3, SIZE)
        boxes, scores = head(empty)
        assert boxes.shape == (0, 4) and scores.shape == (0,)
        assert len(head.fuse(empty)) == 0
        loss = head.loss(empty, Targets.empty())
        assert float(loss.detach()) == 0.0
        loss.backward()  # a graph (possibly without gradient) that does not fail

    def test_wrong_number_of_models(self, kind):
        head = CLASSES[kind](["a", "b"])
        with pytest.raises(ValueError, match="3 models but this"):
            head(samples(1)[0].clusters)

    @pytest.mark.parametrize("suffix", [".json", ".safetensors"])
    def test_round_trip(self, kind, suffix, tmp_path):
        head = trained(kind, class_embed=2)
        path = tmp_path / f"head{suffix}"
        head.save(path)
        loaded = load_head(path)
        assert type(loaded) is CLASSES[kind] and loaded.config() == head.config()
        for s in samples(2, seed=5):
            outputs_equal(head, loaded, s.clusters)
        assert CLASSES[kind].load(path, model_names=NAMES).model_names == NAMES
        raw = path.read_bytes()  # plain JSON, or safetensors' JSON header + raw tensor bytes: no pickle
        if suffix == ".json":
            document = json.loads(raw)
            assert document["type"] == kind and document["model_names"] == NAMES
        else:
            length = int.from_bytes(raw[:8], "little")
            header = json.loads(raw[8 : 8 + length])
            assert header["__metadata__"]["type"] == kind
            assert set(header) - {"__metadata__"} == set(head.state_dict())

    def test_wrong_model_names(self, kind, tmp_path):
        path = tmp_path / "head.json"
        CLASSES[kind](NAMES).save(path)
        reordered = load_head(path, model_names=["m2", "m1", "m0"])  # members are matched by name
        assert reordered.model_names == NAMES
        with pytest.raises(ValueError, match="trained for models"):
            CLASSES[kind].load(path, model_names=["a", "b", "c"])
        other = "theta" if kind != "theta" else "deep"
        with pytest.raises(HeadFileError, match="load it with detens.load_head"):
            HEADS.get(other).load(path)

    def test_corrupt_files(self, kind, tmp_path):
        path = tmp_path / "head.json"
        CLASSES[kind](NAMES).save(path)
        document = json.loads(path.read_text())
        document["config"]["bogus"] = 1
        path.write_text(json.dumps(document))
        with pytest.raises(HeadFileError, match="unknown config keys"):
            load_head(path)
        document["config"].pop("bogus")
        first = next(iter(document["tensors"]))
        document["tensors"][first]["shape"] = [1] + document["tensors"][first]["shape"]
        document["tensors"][first]["data"] = document["tensors"][first]["data"]
        path.write_text(json.dumps(document))
        with pytest.raises(HeadFileError):
            load_head(path)

    @pytest.mark.parametrize("device", DEVICES)
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_device_and_dtype(self, kind, device, dtype):
        head = trained(kind).to(device=device, dtype=dtype)
        clusters = samples(1, seed=3)[0].clusters.to(device)
        boxes, scores = head(clusters)
        assert boxes.device.type == device and boxes.dtype == dtype and scores.dtype == dtype
        fused = head.fuse(clusters)
        assert fused.device.type == device and fused.boxes.dtype == torch.float32
        reference = trained(kind)
        ref_boxes, ref_scores = reference(clusters.to("cpu"))
        assert_close(boxes.cpu().float(), ref_boxes, atol=1e-4, rtol=1e-4)
        assert_close(scores.cpu().float(), ref_scores, atol=1e-4, rtol=1e-4)

    def test_training_lowers_the_loss_and_is_deterministic(self, kind):
        data = samples(4)
        config = small_config(kind, epochs=6, batch_clusters=0, lr=0.01)  # full batch: loss[0] is the untrained loss
        head, history = train_head(kind, data, NAMES, config)
        assert len(history.loss) == 6 and history.seconds > 0
        assert history.loss[-1] < history.loss[0]
        again, _ = train_head(kind, data, NAMES, config)
        for (name, a), (_, b) in zip(head.state_dict().items(), again.state_dict().items(), strict=True):
            assert torch.equal(a, b), name
        other, _ = train_head(kind, data, NAMES, small_config(kind, epochs=6, batch_clusters=0, lr=0.01, seed=1))
        assert any(not torch.equal(a, b) for a, b in zip(head.state_dict().values(), other.state_dict().values(), strict=True))

    def test_loss_is_mean_over_counted_clusters(self, kind):
        head = trained(kind)
        data = samples(2, seed=9)
        targets = [
            score_targets(s.clusters, *head(s.clusters), s.gt_boxes, s.gt_labels, kind="matched")[0] for s in data
        ]
        ignore = targets[0].ignore.clone()
        ignore[0] = True
        targets[0] = Targets(targets[0].boxes, targets[0].matched & ~ignore, ignore)
        # Every kind, selection included: its knapsack layer draws noise only for the backward pass (the
        # forward is the exact top-k), so the loss value is deterministic; eval() rules out anything that
        # only training mode does.
        head.eval()
        torch.manual_seed(0)
        total = head.loss([s.clusters for s in data], targets)
        per = [
            head.loss_features(s.clusters, head.features_of(s.clusters), t) for s, t in zip(data, targets, strict=True)
        ]
        count = sum(int((~t.ignore).sum()) for t in targets)
        assert float(per[0][0].detach()) == 0.0  # the ignored cluster contributes nothing
        assert_close(total, sum(p.sum() for p in per) / count)

    @pytest.mark.parametrize("bad", [5.0, -3.0, float("nan")])
    def test_score_targets_outside_0_1_are_refused(self, kind, bad):
        # binary cross-entropy of such a target has no minimum (or is NaN): a loss below 0 would train nonsense
        head = trained(kind)
        s = samples(1)[0]
        targets, _ = score_targets(s.clusters, *head(s.clusters), s.gt_boxes, s.gt_labels, kind="matched")
        soft = torch.full((len(s.clusters),), 0.5)
        soft[2] = bad
        with pytest.raises(ValueError, match=rf"score_targets must lie in \[0, 1\], got {bad} for cluster 2 \(1 of"):
            head.loss(s.clusters, targets, soft)
        with pytest.raises(ValueError, match="score_targets must lie in"):
            head.loss_features(s.clusters, head.features_of(s.clusters), targets, soft)
        soft[2] = 1.0  # the ends are targets
        assert float(head.loss(s.clusters, targets, soft).detach()) >= 0

    def test_plugs_into_fuse(self, kind, tmp_path):
        head = trained(kind)
        per_model, _, _ = scene(11)
        fused = fuse(per_model, "theta", head=head)
        expected = head.fuse(match(per_model, 0.55))
        assert fused.source == f"fused:{kind}"
        assert_close(fused.boxes, expected.boxes)
        assert_close(fused.scores, expected.scores)
        path = tmp_path / f"{kind}.safetensors"
        head.save(path)
        from_path = fuse(per_model, "theta", head=str(path))
        assert_close(from_path.boxes, expected.boxes)
        with pytest.raises(ValueError, match="trained for 3 models"):
            fuse(per_model[:2], "theta", head=head)

    @pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
    def test_fuses_in_its_own_dtype_inside_autocast(self, kind, autocast_dtype, assert_fuses_alike_inside_autocast):
        per_model, _, _ = scene(13)
        assert_fuses_alike_inside_autocast(trained(kind), per_model, autocast_dtype)

    def test_remembers_its_matching_iou(self, kind, tmp_path):
        head = trained(kind, match_iou=0.8)
        assert head.match_iou == 0.8
        path = tmp_path / "head.json"
        head.save(path)
        assert load_head(path).match_iou == 0.8
        per_model, _, _ = scene(12)
        fused = fuse(per_model, "theta", head=head)  # the fuser's default IoU is the head's
        assert_close(fused.boxes, head.fuse(match(per_model, 0.8)).boxes)
        assert len(fused) == len(match(per_model, 0.8)) != len(match(per_model, 0.3))


class TestFuseChecksTheLabelSpace:
    """``detens.fuse(..., head=, label_space=)``: a head with per-class parameters for other classes is refused."""

    @staticmethod
    def per_class_head(label_space=None):
        head = DeepEnsembleHead(NAMES, class_ids=[0, 1, 2], class_embed=2, hidden=4, depth=1)
        head.label_space = label_space
        return head

    def test_a_head_whose_ids_name_other_classes_is_refused_naming_them(self, tmp_path):
        head = self.per_class_head({0: "cat", 1: "dog", 2: "bird"})
        head.save(tmp_path / "head.json")
        per_model, _, _ = scene(11)
        here = {0: "person", 1: "dog", 2: "car", 3: "bus"}
        renamed = r"0 is 'cat' in the head but 'person' there, 2 is 'bird' in the head but 'car' there"
        with pytest.raises(ValueError, match=rf"^the head was trained on a label space whose category ids name other "
                                             rf"classes than in label_space: {renamed}; its per-class parameters"):
            fuse(per_model, "deep", head=head, label_space=here)
        for method in ("deep", "theta"):  # given as a file: named by its path
            with pytest.raises(ValueError, match=rf"^head '.*head\.json' was trained on .*: {renamed};"):
                fuse(per_model, method, head=tmp_path / "head.json", label_space=here)
        # a head without a recorded label space is checked by its ids alone (detections of its other ids)
        without_0 = [d[d.labels != 0] for d in per_model]
        with pytest.raises(ValueError, match=r"^the head has per-class parameters for category ids 0, which are not "
                                             r"among the 2 category ids of label_space: 1, 2; it was trained on"):
            fuse(without_0, "deep", head=self.per_class_head(), label_space={1: "dog", 2: "car"})

    def test_a_head_of_these_classes_or_of_none_is_accepted(self, tmp_path):
        per_model, _, _ = scene(11)
        head = self.per_class_head({0: "cat", 1: "dog", 2: "bird"})
        expected = fuse(per_model, "deep", head=head)
        got = fuse(per_model, "deep", head=head, label_space={0: "Cat", 1: "dog", 2: "BIRD", 7: "car"})
        assert_close(got.boxes, expected.boxes)
        assert_close(got.scores, expected.scores)
        # no per-class parameters: nothing of it belongs to a class, whatever it records
        agnostic = DeepEnsembleHead(NAMES, hidden=4, depth=1)
        agnostic.label_space = {0: "cat"}
        agnostic.save(tmp_path / "agnostic.json")
        elsewhere = {0: "person", 1: "car", 2: "bus"}
        assert len(fuse(per_model, "deep", head=agnostic, label_space=elsewhere)) > 0
        assert len(fuse(per_model, "theta", head=str(tmp_path / "agnostic.json"), label_space=elsewhere)) > 0

    def test_a_label_the_label_space_does_not_define_is_refused(self):
        """The detections are then of another label space, whose ids the head would take for other classes."""
        per_model, _, _ = scene(11)
        assert {int(c) for d in per_model for c in d.labels} == {0, 1, 2}
        with pytest.raises(ValueError, match=r"^per_model\[0\] has labels 0, which label_space does not define \(its "
                                             r"ids: 1, 2, 7\); label_space names the classes of the detections' labels"):
            fuse(per_model, "wbf", label_space={1: "dog", 2: "car", 7: "bus"})
        with pytest.raises(ValueError, match=r"^per_model\[1\] has labels 2, which"):
            fuse([per_model[0][per_model[0].labels < 2], *per_model[1:]], "wbf", label_space={0: "a", 1: "b"})
        assert len(fuse(per_model, "wbf", label_space={0: "a", 1: "b", 2: "c", 9: "d"})) > 0

    def test_a_bad_label_space_is_named(self):
        per_model, _, _ = scene(11)
        with pytest.raises(TypeError, match=r"^label_space must map category ids to names \(\{id: name\}\), got list"):
            fuse(per_model, "wbf", label_space=["cat"])
        with pytest.raises(TypeError, match=r"^label_space: the name of category id 1 must be a non-empty string"):
            fuse(per_model, "deep", head=self.per_class_head(), label_space={1: ["cat"]})

    def test_each_call_is_checked_image_after_image(self, tmp_path):
        head = self.per_class_head({0: "cat", 1: "dog", 2: "bird"})
        head.save(tmp_path / "head.json")
        here = {0: "cat", 1: "dog", 2: "bird"}
        for seed in range(3):
            per_model, _, _ = scene(seed)
            fuse(per_model, "deep", head=head, label_space=here)
            fuse(per_model, "theta", head=tmp_path / "head.json", label_space=here)
        # accepted before in one label space, refused in another
        with pytest.raises(ValueError, match="'cat' in the head but 'person' there"):
            fuse(per_model, "deep", head=head, label_space={**here, 0: "person"})
        with pytest.raises(ValueError, match="'cat' in the head but 'person' there"):
            fuse(per_model, "theta", head=tmp_path / "head.json", label_space={**here, 0: "person"})


class TestUntrainedHeadsAreBaselines:
    def test_deep_starts_as_mean_score_with_score_weighted_box(self):
        clusters = samples(1)[0].clusters
        boxes, scores = DeepEnsembleHead(NAMES)(clusters)
        assert_close(scores, clusters.preds[..., 4].sum(1) / 3, atol=1e-6, rtol=1e-5)
        assert_close(boxes, score_weighted_box(clusters.preds, clusters.present))
        _, mean_scores = DeepEnsembleHead(NAMES, box="mean")(clusters)
        assert_close(mean_scores, scores)

    def test_superlearner_starts_as_mean(self):
        clusters = samples(1)[0].clusters
        boxes, scores = SuperLearnerHead(NAMES)(clusters)
        mean_boxes, mean_scores = average_clusters(clusters, torch.ones(3))
        assert_close(boxes, mean_boxes)
        assert_close(scores, mean_scores)

    @pytest.mark.parametrize("k", [3, 5])
    def test_selection_with_k_at_least_n_is_mean(self, k):
        torch.manual_seed(0)
        clusters = samples(1)[0].clusters
        boxes, scores = SelectionHead(NAMES, k=k)(clusters)
        mean_boxes, mean_scores = average_clusters(clusters, torch.ones(3))
        assert_close(boxes, mean_boxes)
        assert_close(scores, mean_scores)


class TestSelection:
    def test_k1_picks_one_present_row(self):
        torch.manual_seed(0)
        head = SelectionHead(NAMES, k=1)
        clusters = samples(1)[0].clusters
        with torch.no_grad():
            chosen = head.select(clusters, head.inputs(head.features_of(clusters), clusters.labels))
        assert torch.equal(chosen.sum(1), torch.ones(len(clusters)))
        assert not (chosen.bool() & ~clusters.present).any()
        boxes, scores = head(clusters)
        picked = chosen.argmax(1)
        rows = clusters.preds[torch.arange(len(clusters)), picked]
        assert_close(boxes, rows[:, :4])
        assert_close(scores, rows[:, 4] * clusters.present.sum(1) / 3)

    def test_score_modes(self):
        preds = torch.tensor([[[0, 0, 1, 1, 0.8], [0, 0, 1, 1, 0.4], [0, 0, 1, 1, 0.0]]], dtype=torch.float32)
        present = torch.tensor([[True, True, False]])
        chosen = torch.tensor([[1.0, 0.0, 0.0]])
        assert_close(combine_selected(preds, present, chosen, 2, score="mean_present")[1], torch.tensor([0.8 * 2 / 3]))
        assert_close(combine_selected(preds, present, chosen, 2, score="sum_k")[1], torch.tensor([0.4]))
        assert_close(combine_selected(preds, present, chosen, 2, score="sum_n")[1], torch.tensor([0.8 / 3]))

    def test_gradients_reach_the_selection_net_only_through_the_knapsack(self):
        torch.manual_seed(0)
        head = SelectionHead(NAMES, k=1, num_samples=64, epsilon=1.0)  # ε large enough for selections to flip
        s = samples(1)[0]
        targets, soft = score_targets(s.clusters, *head(s.clusters), s.gt_boxes, s.gt_labels)
        head.loss(s.clusters, targets, soft).backward()
        grads = [p.grad for p in head.selector.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert sum(float(g.abs().sum()) for g in grads) > 0

    def test_bad_options(self):
        for kwargs, error in [
            (dict(k=0), "k must be"),
            (dict(epsilon=0.0), "epsilon"),
            (dict(combine="max"), "combine must be"),
            (dict(score="max"), "score must be"),
            (dict(features=["nope"]), "unknown feature groups"),
            (dict(activation="gelu"), "activation must be"),
        ]:
            with pytest.raises(ValueError, match=error):
                SelectionHead(NAMES, **kwargs)
        for kwargs, error in [
            (dict(num_samples=True), "num_samples must be an integer, got bool: True"),
            (dict(k=2.0), "k must be an integer, got float: 2.0"),
        ]:
            with pytest.raises(TypeError, match=error):
                SelectionHead(NAMES, **kwargs)
        assert SelectionHead(NAMES, k=np.int64(2)).k == 2 and type(SelectionHead(NAMES, k=np.int64(2)).k) is int

    @pytest.mark.parametrize(
        "members, error, message",
        [
            (0, ValueError, "members must be an integer >= 1, got 0"),
            (-1, ValueError, "members must be an integer >= 1, got -1"),
            (1.0, TypeError, "members must be an integer, got float: 1.0"),
            (True, TypeError, "members must be an integer, got bool: True"),
            ("2", TypeError, "members must be an integer, got str: '2'"),
        ],
    )
    def test_deep_members_must_be_a_positive_integer(self, members, error, message):
        with pytest.raises(error, match=message):
            DeepEnsembleHead(NAMES, members=members)


# ----------------------------------------------------------------------------------------- training
class TestTraining:
    def test_iou_fraction_target_is_exact_at_known_ious(self):
        """A fused box of IoU 0.72 with its GT box is a TP at τ = 0.50 ... 0.70: 5 of 10 thresholds."""
        preds = torch.zeros(2, 1, 5)
        preds[0, 0] = torch.tensor([0.0, 0.0, 0.5, 0.36, 0.9])  # IoU 0.72 with the GT box below
        preds[1, 0] = torch.tensor([0.0, 0.0, 0.5, 0.5, 0.5])  # IoU 1.0, but ranked second: a duplicate at .50
        clusters = Clusters(preds, torch.ones(2, 1, dtype=torch.bool), torch.tensor([0, 0]),
                            torch.zeros(2, 1, dtype=torch.int64), (100, 200))
        gt = torch.tensor([[0.0, 0.0, 100.0, 50.0]])  # normalized [0, 0, 0.5, 0.5]
        targets, soft = score_targets(clusters, preds[:, 0, :4], preds[:, 0, 4], gt, torch.tensor([0]))
        assert targets.matched.tolist() == [True, False]
        # cluster 1 matches at every threshold above 0.72, where cluster 0 no longer can
        assert_close(soft, torch.tensor([0.5, 0.5]))
        _, hard = score_targets(clusters, preds[:, 0, :4], preds[:, 0, 4], gt, torch.tensor([0]), kind="matched")
        assert hard.tolist() == [1.0, 0.0]

    def test_config_validation(self):
        with pytest.raises(ValueError, match="unknown network head 'nope'; valid: selection, deep, superlearner"):
            train_head("nope", samples(1), NAMES)
        with pytest.raises(ValueError, match="unknown head type 'nope'; valid: calibration, deep, selection"):
            config_for("nope")
        with pytest.raises(TypeError, match=r"^head type must be a string, one of calibration, .*; got list$"):
            fit_head(["theta"], None, [1])
        with pytest.raises(TypeError, match=r"^predictions must be EnsemblePredictions \(.*\), got list$"):
            fit_head("theta", [[{"image_id": 1}]], [1])
        with pytest.raises(TypeError, match="trains with DeepTrainConfig"):
            train_head("deep", samples(1), NAMES, SelectionTrainConfig())
        with pytest.raises(ValueError, match="unknown deep training options"):
            config_for("deep", k=2)
        with pytest.raises(ValueError, match="score_target"):
            DeepTrainConfig(score_target="iou")
        with pytest.raises(ValueError, match="no training images"):
            train_head("deep", [], NAMES)
        assert SuperLearnerTrainConfig().lr < DeepTrainConfig().lr

    @pytest.mark.parametrize("config, sizes", [
        (lambda: DeepTrainConfig(hidden=10**9), "hidden 1000000000, depth 2, class_embed 0"),
        (lambda: SuperLearnerTrainConfig(hidden=4000, depth=12), "hidden 4000, depth 12, class_embed 0"),
    ])
    def test_a_network_too_large_to_fit_is_refused_when_the_config_is_made(self, config, sizes):
        """It was built at the first fit, which ended in a RuntimeError from the allocator (a traceback)."""
        with pytest.raises(ValueError, match=re.escape(sizes) + r"\), more than the 100,000,000 a fit allocates"):
            config()
        DeepTrainConfig(hidden=1024, depth=3)  # large, and within the bound

    @pytest.mark.parametrize(
        "bags_grid, error, message",
        [
            ([1, 2.0], TypeError, r"bags_grid\[1\] must be an integer, got float: 2.0"),
            ([True, 2], TypeError, r"bags_grid\[0\] must be an integer, got bool: True"),
            ([1, "3"], TypeError, r"bags_grid\[1\] must be an integer, got str: '3'"),
            ((1, 2), TypeError, r"bags_grid must be a list of integers >= 1, got tuple: \(1, 2\)"),
            ("1,2", TypeError, "bags_grid must be a list of integers >= 1, got str: '1,2'"),
            ([1, 0], ValueError, r"bags_grid must be a list of integers >= 1, got \[1, 0\]"),
        ],
    )
    def test_bags_grid_of_another_type_is_a_type_error_naming_the_entry(self, bags_grid, error, message):
        with pytest.raises(error, match=message):
            SuperLearnerTrainConfig(bags_grid=bags_grid)

    def test_numpy_integers_in_bags_grid_are_the_python_ints_they_hold(self):
        config = SuperLearnerTrainConfig(bags_grid=[np.int64(3), np.int32(1), 3])
        assert config.bags_grid == [1, 3] and all(type(b) is int for b in config.bags_grid)

    def test_class_embedding_handles_unseen_classes(self):
        head = trained("deep", class_embed=3)
        assert head.class_ids.tolist() == [0, 1, 2]
        assert head.class_rows(torch.tensor([0, 2, 7])).tolist() == [1, 3, 0]
        clusters = samples(1)[0].clusters
        clusters.labels[:] = 50  # never seen: the shared "unknown" row
        boxes, scores = head(clusters)
        assert torch.isfinite(scores).all()

    @pytest.mark.parametrize("kind", KINDS)
    def test_the_unseen_class_row_is_zero_after_training(self, kind):
        # no training cluster has an unseen class: a row of its own would keep its random initialization
        head = trained(kind, class_embed=3)
        assert torch.equal(head.embedding.weight[0], torch.zeros(3))
        assert head.embedding.weight[1:].abs().sum() > 0
        clusters = samples(1)[0].clusters
        clusters.labels[:] = 50
        features = head.features_of(clusters)
        reference = torch.cat([(features - head.feature_mean) / head.feature_std, torch.zeros(len(clusters), 3)], 1)
        assert_close(head.inputs(features, clusters.labels), reference)

    def test_a_file_with_a_random_unseen_row_loads_with_it_zeroed(self, tmp_path):
        head = trained("deep", class_embed=3)
        path = tmp_path / "head.json"
        head.save(path)
        document = json.loads(path.read_text())
        document["tensors"]["embedding.weight"]["data"][:3] = [0.7, -1.3, 0.4]  # as files written before hold it
        path.write_text(json.dumps(document))
        loaded = load_head(path)
        assert torch.equal(loaded.embedding.weight[0], torch.zeros(3))
        assert torch.equal(loaded.embedding.weight[1:], head.embedding.weight[1:])
        outputs_equal(loaded, head, samples(1)[0].clusters)  # the seen classes fuse as before

    def test_learned_box_moves_toward_the_accurate_model(self):
        """Model 0 jitters least: the learned box weights should favour it."""
        data = samples(6)
        config = small_config("deep", box="learned", epochs=25, lambda_box=5.0, batch_clusters=0, lr=0.03)
        head, history = train_head("deep", data, NAMES, config)
        assert history.loss[-1] < history.loss[0]
        x = torch.cat([head.inputs(head.features_of(s.clusters), s.clusters.labels) for s in data])
        weights = torch.softmax(head.box_net(x), 1).mean(0)
        assert weights[0] > weights[2]


# ---------------------------------------------------------------------------------------- baselines
class TestRandomK:
    def test_k_at_least_n_is_mean(self):
        per_model, _, _ = scene(2)
        for k in (3, 4):
            out = fuse(per_model, "random_k", k=k)
            mean = fuse(per_model, "mean")
            assert_close(out.boxes, mean.boxes)
            assert_close(out.scores, mean.scores)

    def test_k1_boxes_are_model_rows_and_seeded(self):
        per_model, _, _ = scene(3)
        clusters = match(per_model, 0.55)
        from detens.fusers.subset import random_subset

        chosen = random_subset(clusters, 1, torch.Generator().manual_seed(0))
        assert torch.equal(chosen.sum(1), torch.ones(len(clusters), dtype=torch.int64))
        assert not (chosen & ~clusters.present).any()
        a = fuse(per_model, "random_k", k=1, seed=0)
        b = fuse(per_model, "random_k", k=1, seed=0)
        assert torch.equal(a.boxes, b.boxes)
        draws = {tuple(random_subset(clusters, 1, torch.Generator().manual_seed(s)).flatten().tolist()) for s in range(5)}
        assert len(draws) > 1
        rows = torch.cat([d.boxes for d in per_model])
        for box in a.boxes:
            assert (rows - box).abs().sum(1).min() < 1e-3

    def test_uniform_over_present_models(self):
        preds = torch.rand(1, 3, 5).repeat(3000, 1, 1)
        present = torch.ones(3000, 3, dtype=torch.bool)
        clusters = Clusters(preds, present, torch.zeros(3000, dtype=torch.int64), torch.zeros(3000, 3, dtype=torch.int64), SIZE)
        from detens.fusers.subset import random_subset

        counts = random_subset(clusters, 1, torch.Generator().manual_seed(0)).sum(0).float()
        assert ((counts / 3000 - 1 / 3).abs() < 0.04).all()


class TestOracle:
    def test_takes_the_closest_present_row(self):
        from detens.evaluation import oracle_fusion

        per_model, gt_boxes, gt_labels = scene(4)
        clusters = match(per_model, 0.55)
        out = oracle_fusion(clusters, gt_boxes, gt_labels)
        mean = fuse(per_model, "mean")
        assert_close(out.scores, mean.scores)
        from torchvision.ops import box_iou

        best_oracle = box_iou(gt_boxes, out.boxes).max(1).values
        best_mean = box_iou(gt_boxes, mean.boxes).max(1).values
        assert (best_oracle >= best_mean - 1e-6).all() and (best_oracle > best_mean + 1e-3).any()
        empty = oracle_fusion(Clusters.empty(3, SIZE), gt_boxes, gt_labels)
        assert len(empty) == 0

    @pytest.mark.parametrize("seed", range(5))
    def test_matches_a_slow_reference(self, seed):
        """Each cluster matched to a ground-truth box (as the ``mean`` output is) takes its present row of
        highest IoU with that box; the others keep the mean box; scores stay the mean's."""
        from detens.evaluation import oracle_fusion
        from detens.targets import assign_targets

        per_model, gt_boxes, gt_labels = scene(10 + seed, num_objects=8)
        if seed % 2:  # a member with the first one's boxes: rows tied in IoU
            first = per_model[0]
            per_model[1] = Detections(first.boxes, first.scores, first.labels, first.image_size, per_model[1].source)
        clusters = match(per_model, 0.55)
        out = oracle_fusion(clusters, gt_boxes, gt_labels)
        boxes, scores = average_clusters(clusters, torch.ones(clusters.num_models))
        targets = assign_targets(clusters, boxes, scores, gt_boxes, gt_labels, iou_thr=0.5)
        expected = boxes.clone()
        assert targets.matched.any() and not targets.matched.all()
        for c in range(len(clusters)):
            if not targets.matched[c]:
                continue
            rows = [n for n in range(clusters.num_models) if clusters.present[c, n]]
            overlaps = [slow_iou(clusters.preds[c, n, :4].tolist(), targets.boxes[c].tolist()) for n in rows]
            expected[c] = clusters.preds[c, rows[overlaps.index(max(overlaps))], :4]
        reference = clusters.to_detections(expected, scores)
        assert_close(out.boxes, reference.boxes)
        assert_close(out.scores, reference.scores)
        assert torch.equal(out.labels, reference.labels)


# --------------------------------------------------------------------------------------- evaluation
def test_evaluation_methods_registered_and_run():
    from detens.coco import CocoGroundTruth
    from detens.evaluation import METHODS, cross_validate, selection_methods
    from detens.predictions import EnsemblePredictions

    for name in ["deep", "superlearner", "selection", "selection_k1", "random_k2", "oracle"]:
        assert name in METHODS
    assert selection_methods(3) == ["selection_k1", "selection_k2", "selection_k3"]

    images, annotations, results = [], [], [[], [], []]
    for image_id in range(1, 9):
        per_model, gt_boxes, gt_labels = scene(100 + image_id)
        images.append({"id": image_id, "width": SIZE[1], "height": SIZE[0], "file_name": f"{image_id}.jpg"})
        for box, label in zip(gt_boxes.tolist(), gt_labels.tolist(), strict=True):
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": label + 1,
                                "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                                "area": (box[2] - box[0]) * (box[3] - box[1]), "iscrowd": 0})
        for m, det in enumerate(per_model):
            for box, score, label in zip(det.boxes.tolist(), det.scores.tolist(), det.labels.tolist(), strict=True):
                results[m].append({"image_id": image_id, "category_id": label + 1, "score": score,
                                   "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]})
    gt = CocoGroundTruth({"images": images, "annotations": annotations,
                          "categories": [{"id": i, "name": str(i)} for i in (1, 2, 3)]})
    predictions = EnsemblePredictions(NAMES, results, gt)
    fast = {"epochs": 2, "hidden": 8, "depth": 1, "match_iou_grid": []}
    report = cross_validate(
        predictions, ["mean", "deep", "selection_k1", "random_k1", "oracle"], k=2, backend="faster",
        method_options={"deep": fast, "selection_k1": {**fast, "num_samples": 4}},
    )
    assert report["oracle"].metrics["map"] >= report["mean"].metrics["map"]
    assert len(report["deep"].fitted) == 2 and report["deep"].fitted[0]["kind"] == "deep"
    assert report["selection_k1"].fitted[0]["config"]["k"] == 1
    for result in report.values():
        assert 0.0 <= result.metrics["map"] <= 1.0


# ------------------------------------------------------------------------------------------ bagging
class TestBagged:
    def fit(self, kind, bags, seed=0):
        config = config_for(kind, epochs=2, hidden=8, depth=1, match_iou_grid=[], bags=bags, seed=seed)
        return train_network_head(kind, samples(6), NAMES, config)

    @pytest.mark.parametrize("kind", KINDS)
    def test_averages_bootstrap_fits_with_their_own_seeds(self, kind):
        from detens.heads.bagged import BaggedHead

        head, history = self.fit(kind, 3)
        assert isinstance(head, BaggedHead) and len(head.members) == 3 and len(history.loss) == 2
        clusters = match(scene(7)[0], iou_thr=0.55)
        outputs = [member(clusters) for member in head.members]
        boxes, scores = head(clusters)
        assert_close(boxes, sum(b for b, _ in outputs) / 3)
        assert_close(scores, sum(s for _, s in outputs) / 3)
        assert not torch.equal(outputs[0][1], outputs[1][1])  # other samples and seeds: other fits
        again, _ = self.fit(kind, 3)
        assert_close(again(clusters)[1], scores)  # deterministic for the seed

    def test_fuses_in_its_own_dtype_inside_autocast(self, assert_fuses_alike_inside_autocast):
        head, _ = self.fit("deep", 2)
        assert_fuses_alike_inside_autocast(head, scene(9)[0], torch.bfloat16)

    def test_one_bag_is_the_plain_head(self):
        head, _ = self.fit("deep", 1)
        assert isinstance(head, DeepEnsembleHead)

    @pytest.mark.parametrize("suffix", [".json", ".safetensors"])
    def test_round_trip_and_fuse(self, suffix, tmp_path):
        head, _ = self.fit("deep", 2)
        path = tmp_path / f"bagged{suffix}"
        head.save(path)
        loaded = load_head(path, model_names=NAMES[::-1])
        per_model = scene(9)[0]
        expected = fuse(per_model, "theta", head=head)
        got = fuse(per_model, "theta", head=path)
        assert got.source == "fused:deep"  # a bag of deep heads runs as deep, as a calibrated deep head does
        assert_close(got.boxes, expected.boxes)
        assert_close(got.scores, expected.scores)
        assert loaded.model_names == NAMES
        for method in ("deep", "bagged"):
            assert_close(fuse(per_model, method, head=path).scores, expected.scores)
        with pytest.raises(ValueError, match="method 'selection' was given a 'deep' head; use method='deep'"):
            fuse(per_model, "selection", head=path)

    @pytest.mark.parametrize("kind", KINDS)
    def test_a_bag_and_a_calibrated_bag_run_as_the_type_of_their_members(self, kind):
        """The methods that run a head, innermost last: `detens fuse` records the last, and boxes say it."""
        from detens.fusers import head_methods
        from detens.heads.calibrated import CalibratedHead
        from detens.heads.calibration import CalibrationHead

        head, _ = self.fit(kind, 2)
        calibrated = CalibratedHead(CalibrationHead(NAMES), head)
        assert head_methods(head) == ["bagged", kind]
        assert head_methods(calibrated) == ["calibrated", "bagged", kind]
        assert head_methods(head.members[0]) == [kind] and head_methods(object()) == []
        per_model = scene(9)[0]
        assert fuse(per_model, kind, head=calibrated).source == f"fused:{kind}"

    def test_bad_members_and_files(self, tmp_path):
        from detens.heads.bagged import BaggedHead

        with pytest.raises(ValueError, match="at least one member"):
            BaggedHead([])
        with pytest.raises(ValueError, match="member 1 is a 'superlearner' head"):
            BaggedHead([DeepEnsembleHead(NAMES), SuperLearnerHead(NAMES)])
        with pytest.raises(ValueError, match="member 1 fuses models"):
            BaggedHead([DeepEnsembleHead(NAMES), DeepEnsembleHead(NAMES[::-1])])
        with pytest.raises(ValueError, match="bags must be an integer >= 1"):
            config_for("deep", bags=0)
        head, _ = self.fit("deep", 2)
        path = tmp_path / "bagged.json"
        head.save(path)
        document = json.loads(path.read_text())
        for change, message in [
            (lambda d: d["config"].update(member_type="theta"), "member_type must name a network head type"),
            (lambda d: d["config"].update(members=[]), "members must be a non-empty list"),
            (lambda d: d["config"]["members"].pop(), "belong to no member"),
            (lambda d: d["config"].update(extra=1), r"unknown config keys \['extra'\]"),
            (lambda d: d["config"].pop("member_type"), r"the config lacks the keys \['member_type'\]"),
        ]:
            broken = copy.deepcopy(document)
            change(broken)
            path.write_text(json.dumps(broken))
            with pytest.raises(HeadFileError, match=message):
                load_head(path)


# ------------------------------------------------------------------------------------ member order
def _named_heads():
    from detens.heads.bagged import BaggedHead
    from detens.heads.theta import ThetaHead

    theta = ThetaHead(NAMES)
    with torch.no_grad():
        theta.theta.copy_(torch.tensor([0.6, 0.3, 0.1], dtype=theta.theta.dtype))
    config = config_for("deep", epochs=2, hidden=8, depth=1, match_iou_grid=[], bags=2, seed=0)
    bagged = train_network_head("deep", samples(6), NAMES, config)[0]
    assert isinstance(bagged, BaggedHead)
    heads = {"theta": theta, "bagged": bagged, **{kind: trained(kind) for kind in KINDS}}
    # with k = 2 and mostly two models per object every present model is chosen, whatever its column; and
    # three epochs leave the net choosing alike whichever column holds a model
    heads["selection"] = trained("selection", k=1)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in heads["selection"].parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    return heads


class TestMemberOrder:
    """``head(match(per_model))`` places the models by their Detections' source names, as ``fuse`` does."""

    @pytest.fixture(scope="class")
    @classmethod
    def heads(cls):
        return _named_heads()

    @staticmethod
    def named_scene(seed):
        return [d.with_source(name) for d, name in zip(scene(seed)[0], NAMES, strict=True)]

    @pytest.mark.parametrize("kind", ["theta", "bagged", *KINDS])
    @pytest.mark.parametrize("order", [[2, 0, 1], [1, 0, 2]])
    def test_any_model_order_fuses_alike(self, heads, kind, order):
        head = heads[kind]
        per_model = self.named_scene(11)
        expected = head.fuse(match(per_model, 0.55))
        shuffled = match([per_model[i] for i in order], 0.55)
        assert shuffled.sources == tuple(NAMES[i] for i in order)
        got = head.fuse(shuffled)
        assert_close(got.boxes, expected.boxes)
        assert_close(got.scores, expected.scores)
        assert torch.equal(got.labels, expected.labels)
        # the head's weights are not symmetric in its models: placing them by position differs
        positional = head.fuse(match([per_model[i].with_source(None) for i in order], 0.55))
        assert not (torch.equal(positional.scores, expected.scores) and torch.equal(positional.boxes, expected.boxes))

    def test_the_differentiable_path_reorders_too(self, heads):
        head = heads["deep"]
        per_model = self.named_scene(12)
        boxes, scores = head(match(per_model, 0.55))
        reordered = match(per_model[::-1], 0.55)
        # the slow, obvious reference: the models put back by hand
        by_hand = reordered.select_models([2, 1, 0])
        assert by_hand.sources == tuple(NAMES)
        boxes_by_hand, scores_by_hand = head(by_hand)
        got_boxes, got_scores = head(reordered)
        assert_close(got_boxes, boxes_by_hand)
        assert_close(got_scores, scores_by_hand)
        assert_close(torch.sort(got_scores).values, torch.sort(scores).values)

    def test_features_of_refuses_another_order(self, heads):
        head = heads["deep"]
        reordered = match(self.named_scene(13)[::-1], 0.55)
        with pytest.raises(ValueError, match=r"the clusters' models are \['m2', 'm1', 'm0'\] but this deep head"):
            head.features_of(reordered)
        head.features_of(reordered.select_models([2, 1, 0]))

    @pytest.mark.parametrize("kind", ["theta", "bagged", "deep"])
    def test_other_models_and_repeats_are_refused(self, heads, kind):
        per_model = self.named_scene(14)
        with pytest.raises(ValueError, match=r"sources are \['other', 'm1', 'm2'\] but this .*head is for"):
            heads[kind](match([per_model[0].with_source("other"), *per_model[1:]], 0.55))
        with pytest.raises(ValueError, match="name the same model"):
            heads[kind](match([per_model[0], per_model[0], per_model[2]], 0.55))

    def test_unnamed_models_are_taken_in_order(self, heads):
        head = heads["deep"]
        per_model = self.named_scene(15)
        unnamed = match([d.with_source(None) for d in per_model], 0.55)
        assert unnamed.sources == (None, None, None)
        assert_close(head(unnamed)[1], head(match(per_model, 0.55))[1])


class TestClustersSources:
    def test_select_models_and_empty(self):
        per_model = [d.with_source(name) for d, name in zip(scene(16)[0], NAMES, strict=True)]
        clusters = match(per_model, 0.55)
        picked = clusters.select_models([2, 0])
        assert picked.sources == ("m2", "m0")
        assert torch.equal(picked.preds, clusters.preds[:, [2, 0]])
        assert torch.equal(picked.present, clusters.present[:, [2, 0]])
        assert torch.equal(picked.source_index, clusters.source_index[:, [2, 0]])
        assert torch.equal(picked.labels, clusters.labels)
        assert clusters[:2].sources == clusters.sources == clusters.to("cpu").sources
        empty = match([Detections.empty(SIZE, source=name) for name in NAMES], 0.55)
        assert len(empty) == 0 and empty.sources == tuple(NAMES)

    def test_sources_must_name_every_model(self):
        clusters = samples(1)[0].clusters
        with pytest.raises(ValueError, match="Clusters.sources names 2 models but the clusters hold 3"):
            Clusters(clusters.preds, clusters.present, clusters.labels, clusters.source_index, SIZE, ("a", "b"))
