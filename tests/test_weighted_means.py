"""Weighted averages of boxes stay finite and inside their members' hull, whatever the weights.

Dimension legend: C clusters, N models.

Weights of 0 (a model weighted out, boxes scoring 0) and tiny weights (1e-45: float32 subnormals, whose
products with a box underflow) are where a plain Σ wᵢbᵢ / Σ wᵢ gives NaN or a box at the origin.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from test_fuser_contract import IMAGE_SIZE, random_models
from test_heads_beyond import random_clusters

from detens import Detections, fuse
from detens.fusers.consensus import average_clusters
from detens.heads.deep import score_weighted_box
from detens.heads.selection import SCORE_MODES, combine_selected
from detens.matching import weighted_mean_box

WEIGHTED_FUSERS = ["wbf", "nms", "soft_nms", "refine", "mean", "vote"]
TINY = 1.4e-45  # the smallest float32 subnormal


def reference_mean(boxes, weights, members):
    """Per cluster, in float64 Python: Σ w·b / Σ w over the members, their plain mean when Σ w = 0."""
    out = []
    for c in range(len(boxes)):
        rows = [n for n in range(len(boxes[c])) if members[c][n]]
        if not rows:
            out.append([0.0] * 4)
            continue
        w = [float(weights[c][n]) for n in rows]
        if math.fsum(w) == 0:
            w = [1.0] * len(rows)
        total = math.fsum(w)
        out.append([math.fsum(wi * float(boxes[c][n][j]) for wi, n in zip(w, rows, strict=True)) / total for j in range(4)])
    return out


class TestWeightedMeanBox:
    @pytest.mark.parametrize("seed", range(6))
    @pytest.mark.parametrize("scale", [1.0, TINY, 1e-30, 0.0])
    def test_matches_the_slow_reference(self, seed, scale):
        g = torch.Generator().manual_seed(seed)
        xy = torch.rand(20, 3, 2, generator=g)
        boxes = torch.cat([xy, xy + torch.rand(20, 3, 2, generator=g)], 2)  # [C, N, 4]
        weights = torch.rand(20, 3, generator=g) * scale
        weights[torch.rand(20, 3, generator=g) < 0.2] = 0.0
        members = torch.rand(20, 3, generator=g) < 0.7
        got = weighted_mean_box(boxes, weights, members)
        expected = torch.tensor(reference_mean(boxes.tolist(), weights.tolist(), members.tolist()))
        # subnormal weights carry few significant bits: the reference sees the same rounded values
        torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-6)

    def test_inside_the_hull_and_finite(self):
        boxes = torch.tensor([[[0.1, 0.1, 0.3, 0.3], [0.2, 0.2, 0.4, 0.4]]]).repeat(4, 1, 1)
        weights = torch.tensor([[TINY, TINY], [0.0, 0.0], [TINY, 0.0], [0.0, 1.0]])
        got = weighted_mean_box(boxes, weights, torch.ones(4, 2, dtype=torch.bool))
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got[:2], torch.tensor([[0.15, 0.15, 0.35, 0.35]] * 2))
        torch.testing.assert_close(got[2:], torch.tensor([[0.1, 0.1, 0.3, 0.3], [0.2, 0.2, 0.4, 0.4]]))

    @pytest.mark.parametrize("score", [TINY, 0.0])
    def test_heads_score_weighted_boxes(self, score):
        preds = torch.tensor([[[0.1, 0.1, 0.3, 0.3, score], [0.2, 0.2, 0.4, 0.4, score]]])
        present = torch.ones(1, 2, dtype=torch.bool)
        expected = torch.tensor([[0.15, 0.15, 0.35, 0.35]])
        torch.testing.assert_close(score_weighted_box(preds, present), expected)
        boxes, _ = combine_selected(preds, present, present.float(), 2, "score_weighted")
        torch.testing.assert_close(boxes, expected)


class TestClusterAverages:
    """The ``mean`` and ``vote`` average and the selection head's combination against loops over models."""

    @pytest.mark.parametrize("seed", range(4))
    def test_average_clusters_matches_a_slow_reference(self, seed):
        g = torch.Generator().manual_seed(seed)
        for num_models in (1, 2, 4):
            for num in (0, 1, 30):
                clusters = random_clusters(num, num_models, g)
                weights = torch.rand(num_models, generator=g, dtype=torch.float64) + 0.01
                if num_models > 1:
                    weights[0] = 0.0  # a model weighted out: its boxes count only where no other is present
                boxes, scores = average_clusters(clusters, weights)
                preds, present, w = clusters.preds.tolist(), clusters.present.tolist(), weights.tolist()
                for c in range(num):
                    rows = [n for n in range(num_models) if present[c][n]]
                    box_weights = [w[n] for n in rows] if math.fsum(w[n] for n in rows) > 0 else [1.0] * len(rows)
                    expected_box = [math.fsum(bw * preds[c][n][k] for bw, n in zip(box_weights, rows, strict=True))
                                    / math.fsum(box_weights) for k in range(4)]
                    expected_score = math.fsum(w[n] * preds[c][n][4] for n in rows) / math.fsum(w)
                    torch.testing.assert_close(boxes[c], torch.tensor(expected_box, dtype=torch.float64))
                    assert scores[c].item() == pytest.approx(min(max(expected_score, 0.0), 1.0), abs=1e-12)
                assert boxes.shape == (num, 4) and scores.shape == (num,)

    @pytest.mark.parametrize("combine", ["mean", "score_weighted"])
    @pytest.mark.parametrize("score", SCORE_MODES)
    def test_combine_selected_matches_a_slow_reference(self, combine, score):
        g = torch.Generator().manual_seed(7)
        for num_models, k in ((1, 1), (3, 2), (5, 3)):
            for num in (0, 1, 30):
                clusters = random_clusters(num, num_models, g)
                preds, present = clusters.preds, clusters.present
                chosen = (torch.rand(num, num_models, generator=g) < 0.6) & present
                chosen[torch.arange(num), present.to(torch.float64).argmax(1)] = True  # at least one row chosen
                if num:
                    preds[0, :, 4] = 0.0  # a selection scoring 0: its plain mean
                boxes, scores = combine_selected(preds, present, chosen.to(torch.float64), k, combine, score)
                for c in range(num):
                    rows = [n for n in range(num_models) if chosen[c, n]]
                    weights = [preds[c, n, 4].item() if combine == "score_weighted" else 1.0 for n in rows]
                    if math.fsum(weights) == 0:
                        weights = [1.0] * len(rows)
                    expected_box = [math.fsum(w * preds[c, n, j].item() for w, n in zip(weights, rows, strict=True))
                                    / math.fsum(weights) for j in range(4)]
                    total = math.fsum(preds[c, n, 4].item() for n in rows)
                    expected_score = {"sum_k": total / k, "sum_n": total / num_models,
                                      "mean_present": total / len(rows) * present[c].sum().item() / num_models}[score]
                    torch.testing.assert_close(boxes[c], torch.tensor(expected_box, dtype=torch.float64))
                    assert scores[c].item() == pytest.approx(min(max(expected_score, 0.0), 1.0), abs=1e-12)
                assert boxes.shape == (num, 4) and scores.shape == (num,)


def _lone_object_models() -> list[Detections]:
    """Model 0 alone sees the object at (10, 10, 40, 40); the others see another one."""
    return [
        Detections([[10, 10, 40, 40], [60, 60, 100, 100]], [0.9, 0.8], [1, 1], IMAGE_SIZE),
        Detections([[61, 61, 100, 100]], [0.7], [1], IMAGE_SIZE),
        Detections([[60, 62, 101, 100]], [0.6], [1], IMAGE_SIZE),
    ]


#: fusers that drop the lone object when its only model weighs 0: they scale model n's scores by w_n / Σw
#: (0 · 0.9 = 0 for model 0) and drop boxes whose (decayed) score is <= thresh (0.001 by default).
#: The others keep it, with score 0: nms has no score threshold, and wbf, mean and vote average the
#: cluster's one box with its weight 0 (the plain mean of its boxes, where Σw = 0: the box itself).
DROP_ZERO_SCORES = {"soft_nms", "refine"}


@pytest.mark.parametrize("name", WEIGHTED_FUSERS)
class TestFuserWeights:
    def test_zero_weight_for_the_only_model_that_saw_an_object(self, name):
        params = {"min_votes": 1} if name == "vote" else {}
        fused = fuse(_lone_object_models(), name, weights=[0.0, 1.0, 1.0], **params)
        assert torch.isfinite(fused.boxes).all() and torch.isfinite(fused.scores).all()
        lone = [(box, score) for box, score in zip(fused.boxes.tolist(), fused.scores.tolist(), strict=True)
                if box[0] < 50]
        if name in DROP_ZERO_SCORES:
            assert lone == []
        else:
            assert len(lone) == 1
            assert lone[0][0] == pytest.approx([10, 10, 40, 40]) and lone[0][1] == 0.0

    @pytest.mark.parametrize("weight", [TINY, 1e-30])
    def test_tiny_equal_weights_fuse_like_unit_weights(self, name, weight):
        per_model = random_models(8)
        tiny = fuse(per_model, name, weights=[weight] * 3)
        unit = fuse(per_model, name)
        assert len(tiny) == len(unit)
        order = torch.argsort(unit.boxes[:, 0] * 1e4 + unit.boxes[:, 1])
        tiny_order = torch.argsort(tiny.boxes[:, 0] * 1e4 + tiny.boxes[:, 1])
        torch.testing.assert_close(tiny.boxes[tiny_order], unit.boxes[order], rtol=0, atol=1e-3)
        assert (tiny.area() > 0).all()


@pytest.mark.parametrize("seed", range(3))
def test_wbf_with_every_weight_zero_but_one_is_finite(seed):
    rng = random.Random(seed)
    per_model = random_models(seed)
    weights = [0.0, 0.0, 0.0]
    weights[rng.randrange(3)] = 1.0
    fused = fuse(per_model, "wbf", weights=weights)
    assert torch.isfinite(fused.boxes).all()
