"""``assign_targets``: COCO-style greedy one-to-one matching, against a slow pure-Python reference.

Dimension legend: C clusters, G ground-truth boxes, N models.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from detens.matching import Clusters
from detens.targets import Targets, assign_targets

F64 = torch.float64


def _iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _crowd_iou(det, gt):
    iw = max(0.0, min(det[2], gt[2]) - max(det[0], gt[0]))
    ih = max(0.0, min(det[3], gt[3]) - max(det[1], gt[1]))
    area = (det[2] - det[0]) * (det[3] - det[1])
    return iw * ih / area if area > 0 else 0.0


def reference_assign(boxes, scores, labels, gt_boxes, gt_labels, crowd, thr, image_size):
    """Obvious loops: clusters by descending score (stable), best free non-crowd GT (on equal IoU the later
    one, COCO's ``>=``), then crowd check; IoUs in pixels, as COCO computes them."""
    height, width = image_size
    gts = [[g[0] / width, g[1] / height, g[2] / width, g[3] / height] for g in gt_boxes]
    pixels = [[b[0] * width, b[1] * height, b[2] * width, b[3] * height] for b in boxes]
    order = sorted(range(len(scores)), key=lambda c: -scores[c])  # sorted() is stable
    taken = [False] * len(gts)
    gt_index = [-1] * len(scores)
    ignore = [False] * len(scores)
    for c in order:
        best, best_iou = -1, -1.0
        for g in range(len(gts)):
            if taken[g] or crowd[g] or gt_labels[g] != labels[c]:
                continue
            iou = _iou(pixels[c], gt_boxes[g])
            if iou >= thr and iou >= best_iou:
                best, best_iou = g, iou
        if best >= 0:
            gt_index[c] = best
            taken[best] = True
        else:
            ignore[c] = any(
                crowd[g] and gt_labels[g] == labels[c] and _crowd_iou(pixels[c], gt_boxes[g]) >= thr
                for g in range(len(gts))
            )
    target_boxes = [gts[g] if g >= 0 else [0.0] * 4 for g in gt_index]
    return gt_index, ignore, target_boxes


def make_clusters(boxes_norm, labels, image_size=(64, 64), num_models=2):
    num = boxes_norm.shape[0]
    preds = torch.zeros(num, num_models, 5, dtype=boxes_norm.dtype)
    preds[..., :4] = boxes_norm[:, None, :]
    preds[..., 4] = 0.5
    present = torch.ones(num, num_models, dtype=torch.bool)
    return Clusters(
        preds,
        present,
        torch.as_tensor(labels, dtype=torch.int64),
        torch.zeros(num, num_models, dtype=torch.int64),
        image_size,
    )


def random_case(seed):
    g = torch.Generator().manual_seed(seed)
    image_size = (
        int(torch.randint(50, 500, (1,), generator=g)),
        int(torch.randint(50, 500, (1,), generator=g)),
    )
    height, width = image_size
    num_gt = int(torch.randint(0, 12, (1,), generator=g))
    num_clusters = int(torch.randint(0, 30, (1,), generator=g))
    num_classes = int(torch.randint(1, 4, (1,), generator=g))
    scale = torch.tensor([width, height, width, height], dtype=F64)
    xy = torch.rand(num_gt, 2, generator=g, dtype=F64) * 0.7
    gt_norm = torch.cat([xy, xy + torch.rand(num_gt, 2, generator=g, dtype=F64) * 0.25 + 0.03], 1)
    gt_boxes = gt_norm * scale
    gt_labels = torch.randint(0, num_classes, (num_gt,), generator=g)
    crowd = torch.rand(num_gt, generator=g) < 0.2
    # clusters: jittered copies of GT boxes (so many match, some compete) plus random false positives
    pick = torch.randint(0, max(num_gt, 1), (num_clusters,), generator=g)
    near = torch.rand(num_clusters, generator=g) < 0.7
    if num_gt:
        base = gt_norm[pick] + torch.randn(num_clusters, 4, generator=g, dtype=F64) * 0.02
        base_labels = torch.where(
            torch.rand(num_clusters, generator=g) < 0.85,
            gt_labels[pick],
            torch.randint(0, num_classes, (num_clusters,), generator=g),
        )
    else:
        base = torch.zeros(num_clusters, 4, dtype=F64)
        base_labels = torch.zeros(num_clusters, dtype=torch.int64)
    rxy = torch.rand(num_clusters, 2, generator=g, dtype=F64) * 0.7
    rand_boxes = torch.cat([rxy, rxy + torch.rand(num_clusters, 2, generator=g, dtype=F64) * 0.3 + 0.01], 1)
    boxes = torch.where(near[:, None] & (num_gt > 0), base, rand_boxes)
    boxes = torch.cat(
        [torch.minimum(boxes[:, :2], boxes[:, 2:]), torch.maximum(boxes[:, :2], boxes[:, 2:])], 1
    )
    labels = torch.where(
        near & (num_gt > 0), base_labels, torch.randint(0, num_classes, (num_clusters,), generator=g)
    )
    scores = torch.rand(num_clusters, generator=g, dtype=F64)
    return image_size, boxes, scores, labels, gt_boxes, gt_labels, crowd


class TestAgainstReference:
    @pytest.mark.parametrize("thr", [0.5, 0.3, 0.75])
    @pytest.mark.parametrize("seed", range(60))
    def test_random(self, seed, thr):
        image_size, boxes, scores, labels, gt_boxes, gt_labels, crowd = random_case(seed)
        clusters = make_clusters(boxes, labels, image_size)
        targets = assign_targets(clusters, boxes, scores, gt_boxes, gt_labels, iou_thr=thr, gt_iscrowd=crowd)
        gt_index, ignore, target_boxes = reference_assign(
            boxes.tolist(),
            scores.tolist(),
            labels.tolist(),
            gt_boxes.tolist(),
            gt_labels.tolist(),
            crowd.tolist(),
            thr,
            image_size,
        )
        assert targets.gt_index.tolist() == gt_index
        assert targets.matched.tolist() == [g >= 0 for g in gt_index]
        assert targets.ignore.tolist() == ignore
        assert_close(targets.boxes, torch.tensor(target_boxes, dtype=F64).reshape(-1, 4))

    def test_random_cases_exercise_every_branch(self):
        matched = ignored = unmatched = 0
        for seed in range(60):
            image_size, boxes, scores, labels, gt_boxes, gt_labels, crowd = random_case(seed)
            t = assign_targets(
                make_clusters(boxes, labels, image_size), boxes, scores, gt_boxes, gt_labels, gt_iscrowd=crowd
            )
            matched += int(t.matched.sum())
            ignored += int(t.ignore.sum())
            unmatched += int((~t.matched & ~t.ignore).sum())
        assert matched > 50 and ignored > 5 and unmatched > 50


class TestAsCocoMatches:
    """The targets are COCO's own matches of the fused boxes (``coco_match.match_category``, which agrees
    with pycocotools' ``evaluateImg``), on whole-pixel boxes, where equal IoUs and IoUs of exactly the
    threshold are common."""

    @pytest.mark.parametrize("seed", range(300))
    def test_whole_pixel_boxes(self, seed):
        from detens.coco_match import TP, match_category

        g = torch.Generator().manual_seed(seed)
        height, width = 92, 183
        def whole_boxes(n):
            xy = torch.randint(0, 12, (n, 2), generator=g) * 4  # a coarse grid: equal and exact IoUs are common
            return torch.cat([xy, xy + torch.randint(1, 6, (n, 2), generator=g) * 4], 1).double()

        gt_boxes = whole_boxes(int(torch.randint(1, 8, (1,), generator=g)))
        boxes = torch.cat([gt_boxes[torch.randint(0, len(gt_boxes), (6,), generator=g)]
                           + torch.randint(-2, 3, (6, 4), generator=g) * 4, whole_boxes(4)])
        boxes = torch.cat([torch.minimum(boxes[:, :2], boxes[:, 2:]), torch.maximum(boxes[:, :2], boxes[:, 2:])], 1)
        scores = torch.randperm(len(boxes), generator=g).double() / len(boxes)
        norm = boxes / torch.tensor([width, height, width, height], dtype=F64)
        t = assign_targets(make_clusters(norm, [1] * len(boxes), (height, width)), norm, scores, gt_boxes,
                           [1] * len(gt_boxes), iou_thr=0.5)
        order = torch.argsort(scores, descending=True).tolist()

        def xywh(b):
            return [b[0], b[1], b[2] - b[0], b[3] - b[1]]

        pixels = norm * torch.tensor([width, height, width, height], dtype=F64)  # the fused boxes COCO would see
        dts = [{"bbox": xywh(pixels[c].tolist()), "score": float(scores[c])} for c in order]
        gts = [{"id": i + 1, "bbox": xywh(b), "area": 1.0, "iscrowd": 0} for i, b in enumerate(gt_boxes.tolist())]
        labels, taken = match_category(dts, gts, 0.5)
        expected = [-1] * len(boxes)
        for c, label, gt in zip(order, labels, taken, strict=True):
            expected[c] = gt if label == TP else -1
        assert t.gt_index.tolist() == expected

    def test_equal_ious_go_to_the_later_box(self):
        # GTs [0,0,20,10] and [0,10,20,20]; cluster A [0,0,20,20] has IoU 0.5 with both: COCO gives it the
        # second, so B (on the second only) is a false positive
        size = torch.tensor([100.0, 100.0, 100.0, 100.0], dtype=F64)
        boxes = torch.tensor([[0.0, 0.0, 20.0, 20.0], [0.0, 10.0, 20.0, 20.0]], dtype=F64) / size
        t = assign_targets(make_clusters(boxes, [1, 1], (100, 100)), boxes, torch.tensor([0.9, 0.8], dtype=F64),
                           torch.tensor([[0.0, 0.0, 20.0, 10.0], [0.0, 10.0, 20.0, 20.0]]), [1, 1])
        assert t.gt_index.tolist() == [1, -1]

    def test_an_iou_of_exactly_the_threshold_in_pixels_matches(self, dtype=F64):
        # 92x183 image: [0,40,90,110] and [20,50,90,140] overlap 70x60 = 4200 of 6300 + 6300 - 4200 = 8400
        # pixels, IoU 0.5; normalized by 183 and 92 it rounds to 0.4999999... (float32 boxes normalized
        # are not whole pixels to begin with: 40/92 in float32 times 92 is not 40)
        boxes = (torch.tensor([[0.0, 40.0, 90.0, 110.0]], dtype=F64) / torch.tensor([183.0, 92.0, 183.0, 92.0],
                                                                                   dtype=F64)).to(dtype)
        t = assign_targets(make_clusters(boxes, [1], (92, 183)), boxes, torch.tensor([0.9], dtype=dtype),
                           torch.tensor([[20.0, 50.0, 90.0, 140.0]]), [1])
        assert t.matched.tolist() == [True]


class TestFixtures:
    def test_iou_exactly_at_threshold_matches(self):
        # image 64×64: GT [0,0,16,16] → [0,0,.25,.25]; cluster [0,0,.5,.25]: IoU = .0625/.125 = 0.5 exactly
        boxes = torch.tensor([[0.0, 0.0, 0.5, 0.25]])
        clusters = make_clusters(boxes, [3])
        t = assign_targets(
            clusters, boxes, torch.tensor([0.9]), torch.tensor([[0.0, 0.0, 16.0, 16.0]]), torch.tensor([3])
        )
        assert t.matched.tolist() == [True]
        assert_close(t.boxes, torch.tensor([[0.0, 0.0, 0.25, 0.25]]))
        t = assign_targets(
            clusters,
            boxes,
            torch.tensor([0.9]),
            torch.tensor([[0.0, 0.0, 16.0, 16.0]]),
            torch.tensor([3]),
            iou_thr=0.5 + 1e-6,
        )
        assert t.matched.tolist() == [False]

    def test_one_to_one_by_score(self):
        boxes = torch.tensor([[0.0, 0.0, 0.25, 0.25], [0.0, 0.0, 0.26, 0.25]])
        clusters = make_clusters(boxes, [1, 1])
        gt = torch.tensor([[0.0, 0.0, 16.0, 16.0]])
        t = assign_targets(clusters, boxes, torch.tensor([0.2, 0.8]), gt, torch.tensor([1]))
        assert t.matched.tolist() == [False, True]  # the higher-scored cluster wins, though its IoU is lower
        assert t.gt_index.tolist() == [-1, 0]

    def test_greedy_not_optimal(self):
        # cluster 0 (high score) takes GT 0 (IoU .96 > .83 with GT 1); cluster 1 then has only GT 1 at IoU .45:
        # greedy leaves it unmatched although the pairing 0→GT1, 1→GT0 would match both (COCO is greedy too)
        boxes = torch.tensor([[0.0, 0.0, 0.24, 0.25], [0.06, 0.0, 0.31, 0.25]])
        gt = torch.tensor([[0.0, 0.0, 16.0, 16.0], [0.0, 0.0, 12.8, 16.0]])
        clusters = make_clusters(boxes, [0, 0])
        t = assign_targets(clusters, boxes, torch.tensor([0.9, 0.1]), gt, torch.tensor([0, 0]))
        assert t.gt_index.tolist() == [0, -1]

    def test_class_aware(self):
        boxes = torch.tensor([[0.0, 0.0, 0.25, 0.25]])
        clusters = make_clusters(boxes, [2])
        t = assign_targets(
            clusters, boxes, torch.tensor([0.9]), torch.tensor([[0.0, 0.0, 16.0, 16.0]]), torch.tensor([5])
        )
        assert t.matched.tolist() == [False] and t.ignore.tolist() == [False]

    def test_crowd(self):
        # a big crowd box absorbs any number of clusters inside it; a non-crowd GT is preferred when it fits
        boxes = torch.tensor(
            [[0.0, 0.0, 0.25, 0.25], [0.1, 0.1, 0.2, 0.2], [0.3, 0.3, 0.4, 0.4], [0.7, 0.7, 0.9, 0.9]]
        )
        clusters = make_clusters(boxes, [1, 1, 1, 1])
        gt = torch.tensor([[0.0, 0.0, 16.0, 16.0], [0.0, 0.0, 32.0, 32.0]])
        t = assign_targets(
            clusters,
            boxes,
            torch.tensor([0.9, 0.8, 0.7, 0.6]),
            gt,
            torch.tensor([1, 1]),
            gt_iscrowd=torch.tensor([False, True]),
        )
        assert t.matched.tolist() == [True, False, False, False]
        assert t.ignore.tolist() == [False, True, True, False]

    def test_empty(self):
        clusters = Clusters.empty(3, (10, 10))
        t = assign_targets(
            clusters,
            torch.zeros(0, 4),
            torch.zeros(0),
            torch.tensor([[0.0, 0.0, 5.0, 5.0]]),
            torch.tensor([1]),
        )
        assert len(t) == 0 and t.boxes.shape == (0, 4)
        boxes = torch.tensor([[0.0, 0.0, 0.5, 0.5]])
        t = assign_targets(
            make_clusters(boxes, [1]),
            boxes,
            torch.tensor([0.5]),
            torch.zeros(0, 4),
            torch.zeros(0, dtype=torch.int64),
        )
        assert t.matched.tolist() == [False] and t.ignore.tolist() == [False]

    def test_numpy_and_lists_accepted(self):
        boxes = torch.tensor([[0.0, 0.0, 0.25, 0.25]])
        t = assign_targets(
            make_clusters(boxes, [1]),
            boxes,
            torch.tensor([0.5]),
            [[0.0, 0.0, 16.0, 16.0]],
            [1],
            gt_iscrowd=[0],
        )
        assert t.matched.tolist() == [True]

    @pytest.mark.parametrize("seed", range(6))
    @pytest.mark.parametrize("labels_dtype", ["i8", "f8"])
    def test_big_endian_arrays_are_the_same_numbers(self, seed, labels_dtype):
        """Arrays in the other byte order (``dtype('>f8')``, as some file formats store numbers) give the
        targets of the same arrays in this machine's order."""
        image_size, boxes, scores, labels, gt_boxes, gt_labels, crowd = random_case(seed)
        clusters = make_clusters(boxes, labels, image_size)
        arrays = [boxes.numpy(), scores.numpy(), gt_boxes.numpy(), gt_labels.numpy().astype(labels_dtype),
                  crowd.numpy().astype("i8")]
        expected = assign_targets(clusters, *arrays[:4], gt_iscrowd=arrays[4])
        swapped = [a.astype(a.dtype.newbyteorder(">" if a.dtype.byteorder in "=<" else "<")) for a in arrays]
        assert all(not a.dtype.isnative and np.array_equal(a, b) for a, b in zip(swapped, arrays, strict=True))
        got = assign_targets(clusters, *swapped[:4], gt_iscrowd=swapped[4])
        for name in ("boxes", "matched", "ignore", "gt_index"):
            assert torch.equal(getattr(got, name), getattr(expected, name)), name

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"gt_boxes": torch.zeros(2, 3)}, "gt_boxes"),
            ({"gt_labels": torch.zeros(3, dtype=torch.int64)}, "gt_labels"),
            ({"fused_scores": torch.zeros(2)}, "fused_scores"),
            ({"fused_boxes": torch.zeros(1, 5)}, "fused_boxes"),
            ({"iou_thr": 0.0}, "iou_thr"),
            ({"gt_iscrowd": torch.zeros(3, dtype=torch.bool)}, "gt_iscrowd"),
            ({"fused_boxes": torch.tensor([[float("nan"), 0.0, 0.25, 0.25]])}, "must be finite"),
            ({"fused_scores": torch.tensor([float("inf")])}, "must be finite"),
            ({"gt_boxes": torch.tensor([[0.0, 0.0, 16.0, 16.0], [5.0, 5.0, 1.0, 1.0]])},
             r"gt_boxes\[1\] = \[5.0, 5.0, 1.0, 1.0\] has x2 < x1"),
            ({"gt_labels": [1, 1.5]}, r"gt_labels\[1\] = 1.5 is not a whole number"),
            ({"gt_iscrowd": [0, 2]}, r"gt_iscrowd must hold 0/1 flags, got \[0, 2\]"),
            ({"gt_iscrowd": [0.5, 0]}, r"gt_iscrowd\[0\] = 0.5 is not a whole number"),
            # flattened before, and matched; and a negative class id taken as one
            ({"gt_labels": torch.tensor([[1], [1]])}, r"^gt_labels must have shape \[G\], one value per box, got \[2, 1\]$"),
            ({"gt_labels": [[1.0], [1.0]]}, r"^gt_labels must have shape \[G\], one value per box, got \[2, 1\]$"),
            ({"gt_labels": torch.tensor([1, -3])}, r"^gt_labels\[1\] = -3 is negative: class ids are >= 0$"),
        ],
    )
    def test_bad_input(self, kwargs, match):
        boxes = torch.tensor([[0.0, 0.0, 0.25, 0.25]])
        args = {
            "fused_boxes": boxes,
            "fused_scores": torch.tensor([0.5]),
            "gt_boxes": torch.tensor([[0.0, 0.0, 16.0, 16.0], [1.0, 1.0, 5.0, 5.0]]),
            "gt_labels": torch.tensor([1, 1]),
        }
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            assign_targets(make_clusters(boxes, [1]), **args)


def test_inputs_of_the_wrong_kind_are_named():
    boxes = torch.tensor([[0.0, 0.0, 0.25, 0.25]])
    gt_boxes = torch.tensor([[0.0, 0.0, 16.0, 16.0]])
    with pytest.raises(TypeError, match=r"^gt_labels must hold numbers, got <U6 values: person$"):
        assign_targets(make_clusters(boxes, [1]), boxes, torch.tensor([0.5]), gt_boxes, ["person"])
    with pytest.raises(TypeError, match=r"^clusters must be Clusters \(detens.match's output\), got list$"):
        assign_targets([1], boxes, torch.tensor([0.5]), gt_boxes, [1])


@pytest.mark.parametrize("iou_thr, message", [("0.5", "iou_thr must be a number, got str"),
                                               (True, "iou_thr must be a number, got bool")])
def test_iou_thr_must_be_a_number(iou_thr, message):
    boxes = torch.tensor([[0.0, 0.0, 0.25, 0.25]])
    with pytest.raises(TypeError, match=message):
        assign_targets(make_clusters(boxes, [1]), boxes, torch.tensor([0.5]), [[0.0, 0.0, 16.0, 16.0]], [1],
                       iou_thr=iou_thr)


class TestTargets:
    def test_y_and_weights(self):
        t = Targets(
            torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 0.0, 0.0]]),
            torch.tensor([True, False]),
            torch.tensor([False, False]),
        )
        assert_close(t.y(), torch.tensor([[0.1, 0.2, 0.3, 0.4, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]]))
        assert_close(t.weights(), torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 1.0]]))
        assert t.gt_index.tolist() == [-1, -1]

    def test_cat_and_index(self):
        a = Targets(torch.rand(2, 4), torch.tensor([True, False]), torch.tensor([False, True]))
        b = Targets(torch.rand(1, 4), torch.tensor([True]), torch.tensor([False]))
        c = Targets.cat([a, b])
        assert len(c) == 3 and c.matched.tolist() == [True, False, True]
        assert c[torch.tensor([False, True, False])].ignore.tolist() == [True]
        assert len(Targets.cat([])) == 0

    def test_validation(self):
        with pytest.raises(ValueError, match="both matched and ignored"):
            Targets(torch.zeros(1, 4), torch.tensor([True]), torch.tensor([True]))
        with pytest.raises(ValueError, match="matched"):
            Targets(torch.zeros(2, 4), torch.tensor([True]), torch.tensor([True, False]))
        with pytest.raises(TypeError, match="bool"):
            Targets(torch.zeros(1, 4), torch.tensor([1]), torch.tensor([False]))

    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
    def test_a_box_that_is_not_finite_is_refused(self, bad):
        boxes = torch.tensor([[0.125, 0.25, 0.375, 0.5], [0.25, bad, 0.5, 0.75]])
        with pytest.raises(ValueError, match=rf"Targets.boxes must be finite, got \[0.25, {bad}, 0.5, 0.75\] for cluster 1"):
            Targets(boxes, torch.tensor([True, True]), torch.tensor([False, False]))
        # an unmatched cluster's box is multiplied by a weight of 0 in the Θ loss: 0 · NaN is NaN all the same
        with pytest.raises(ValueError, match="for cluster 1"):
            Targets(boxes, torch.tensor([True, False]), torch.tensor([False, False]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    image_size, boxes, scores, labels, gt_boxes, gt_labels, crowd = random_case(3)
    cpu = assign_targets(
        make_clusters(boxes, labels, image_size), boxes, scores, gt_boxes, gt_labels, gt_iscrowd=crowd
    )
    gpu = assign_targets(
        make_clusters(boxes, labels, image_size).to("cuda"),
        boxes.cuda(),
        scores.cuda(),
        gt_boxes.cuda(),
        gt_labels.cuda(),
        gt_iscrowd=crowd.cuda(),
    )
    assert gpu.boxes.device.type == "cuda"
    assert gpu.gt_index.cpu().tolist() == cpu.gt_index.tolist()
    assert gpu.ignore.cpu().tolist() == cpu.ignore.tolist()


@pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs MPS (Apple GPU)")
def test_mps_matches_cpu():
    """MPS has no float64: COCO's IoUs are computed on the CPU, the targets returned on MPS."""
    image_size, boxes, scores, labels, gt_boxes, gt_labels, crowd = random_case(3)
    cpu = assign_targets(
        make_clusters(boxes, labels, image_size), boxes, scores, gt_boxes, gt_labels, gt_iscrowd=crowd
    )
    mps = assign_targets(
        make_clusters(boxes, labels, image_size).to("mps"), boxes.to("mps"), scores.to("mps"),
        gt_boxes.to("mps"), gt_labels.to("mps"), gt_iscrowd=crowd.to("mps"),
    )
    assert mps.boxes.device.type == "mps"
    assert torch.equal(mps.matched.cpu(), cpu.matched) and torch.equal(mps.ignore.cpu(), cpu.ignore)
    assert torch.equal(mps.gt_index.cpu(), cpu.gt_index)
