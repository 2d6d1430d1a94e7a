"""The calibration head (MoCaE): PAV against a slow reference, the calibration map, files, member matching,
``detens.fuse(..., calibration=)``, the ``refine`` fuser against a slow reference, and ``fit_calibration``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from detens import Detections, fuse
from detens.coco import load_coco_gt
from detens.fusers.refine import refine_fusion
from detens.heads import HEADS, CalibrationHead, DeepTrainConfig, HeadFileError, fit_calibration, load_head
from detens.heads.calibration import isotonic_blocks, isotonic_fit, isotonic_predict
from detens.predictions import EnsemblePredictions

SIZE = (120, 160)
NAMES = ["a", "b", "c"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# ------------------------------------------------------------------------------------------ references
def reference_isotonic(x, y, w=None, with_weights=False):
    """Slow, obviously correct isotonic regression: pool equal x, then the min-max formula
    ŷᵢ = max_{j≤i} min_{k≥i} mean_w(y_j..y_k); knots = runs of equal ŷ (weighted mean x, ŷ, and with
    ``with_weights`` the run's total weight)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    w = np.ones_like(x) if w is None else np.asarray(w, dtype=np.float64)
    keep = w > 0
    x, y, w = x[keep], y[keep], w[keep]
    ux = np.unique(x)
    pw = np.array([w[x == v].sum() for v in ux])
    py = np.array([(w[x == v] * y[x == v]).sum() for v in ux]) / pw
    n = len(ux)

    def mean(j, k):
        return (pw[j : k + 1] * py[j : k + 1]).sum() / pw[j : k + 1].sum()

    fitted = np.array([max(min(mean(j, k) for k in range(i, n)) for j in range(i + 1)) for i in range(n)])
    knots_x, knots_y, knots_w, start = [], [], [], 0
    for i in range(1, n + 1):
        if i == n or not math.isclose(fitted[i], fitted[start], rel_tol=1e-9, abs_tol=1e-12):
            block = slice(start, i)
            knots_x.append((pw[block] * ux[block]).sum() / pw[block].sum())
            knots_y.append(fitted[start])
            knots_w.append(pw[block].sum())
            start = i
    if with_weights:
        return np.array(knots_x), np.array(knots_y), np.array(knots_w)
    return np.array(knots_x), np.array(knots_y)


def _iou(a, b):
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(iw, 0.0) * max(ih, 0.0)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def reference_refine(per_model, sigma, thresh, vote_iou, vote_sigma, decay="gaussian", iou_thr=0.3):
    """Slow Soft-NMS per class (decayed scores kept), then score voting over all input boxes of the class.

    Returns rows (label, score, x1, y1, x2, y2) in pixels, sorted canonically."""
    height, width = per_model[0].image_size
    scale = (width, height, width, height)
    items = []  # (label, score, normalized box, pixel box)
    for det in per_model:
        triples = zip(det.boxes.double().tolist(), det.scores.double().tolist(), det.labels.tolist(), strict=True)
        for box, score, label in triples:
            pixel = [min(max(v, 0.0), s) for v, s in zip(box, scale, strict=True)]
            norm = [min(max(v / s, 0.0), 1.0) for v, s in zip(box, scale, strict=True)]
            if (norm[2] - norm[0]) * (norm[3] - norm[1]) == 0:
                continue
            items.append((label, score, norm, pixel))
    rows = []
    for label in sorted({it[0] for it in items}):
        candidates = [it for it in items if it[0] == label]
        pool = [[it[1], it[2], it[3]] for it in candidates]
        while pool:
            best = max(range(len(pool)), key=lambda i: pool[i][0])
            score, norm, pixel = pool.pop(best)
            if score <= thresh:
                break
            for other in pool:
                u = _iou(norm, other[1])
                if decay == "gaussian":
                    other[0] *= math.exp(-(u * u) / sigma)
                elif u > iou_thr:
                    other[0] *= 1.0 - u
            num, den = [0.0] * 4, 0.0
            for _, s_j, norm_j, pixel_j in candidates:
                u = _iou(norm, norm_j)
                if u > vote_iou:
                    weight = s_j * math.exp(-((1.0 - u) ** 2) / vote_sigma)
                    den += weight
                    num = [a + weight * b for a, b in zip(num, pixel_j, strict=True)]
            rows.append([label, score, *[v / den for v in num]])
    rows = np.array(rows).reshape(-1, 6)
    return rows[np.lexsort(rows.T[::-1])]


def as_rows(det: Detections) -> np.ndarray:
    rows = torch.cat([det.labels[:, None].double(), det.scores[:, None].double(), det.boxes.double()], 1)
    rows = rows.cpu().numpy()
    return rows[np.lexsort(rows.T[::-1])]


def as_set(det: Detections, decimals: int = 4) -> list[tuple]:
    return sorted(tuple(round(v, decimals) for v in row) for row in as_rows(det).tolist())


def random_models(seed: int, names=NAMES, num_objects: int = 8, num_classes: int = 3) -> list[Detections]:
    """Models seeing shared objects with jitter, duplicates, clutter and boxes past the border; scores with
    three decimals, as in COCO result files."""
    rng = np.random.default_rng(seed)
    height, width = SIZE
    centers = rng.uniform(0, 1, (num_objects, 2)) * [width, height]
    sizes = rng.uniform(0.05, 0.4, (num_objects, 2)) * [width, height]
    classes = rng.integers(0, num_classes, num_objects)
    per_model = []
    for name in names:
        boxes, scores, labels = [], [], []
        for o in range(num_objects):
            for _ in range(rng.integers(0, 3)):
                center = centers[o] + rng.normal(0, 0.08, 2) * sizes[o]
                half = sizes[o] * np.exp(rng.normal(0, 0.1, 2)) / 2
                boxes.append([*(center - half), *(center + half)])
                scores.append(round(float(rng.uniform(0.01, 1.0)), 3))
                labels.append(int(classes[o]))
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        per_model.append(Detections(boxes, scores, labels, SIZE, name))
    return per_model


def curve(x, y):
    return torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)


def make_head(**options) -> CalibrationHead:
    curves = {
        "a": curve([0.1, 0.5, 0.9], [0.0, 0.3, 0.8]),
        "b": curve([0.2, 0.8], [0.1, 0.9]),
        "c": curve([0.5], [0.4]),
    }
    class_curves = {"a": {1: curve([0.3, 0.7], [0.2, 0.6])}, "c": {0: curve([0.0, 1.0], [0.0, 0.5])}}
    options = {"per_class": True, "fuser": "wbf", "fuser_params": {"iou_thr": 0.6}, **options}
    return CalibrationHead(NAMES, curves, class_curves, **options)


# ----------------------------------------------------------------------------------------------- PAV
class TestIsotonicFit:
    @pytest.mark.parametrize("block", range(4))
    def test_matches_the_slow_reference(self, block):
        for seed in range(block * 50, block * 50 + 50):
            rng = np.random.default_rng(seed)
            n = int(rng.integers(1, 30))
            x = rng.uniform(0, 1, n)
            if seed % 3 == 0:
                x = np.round(x, 1)  # many ties in x
            y = (rng.random(n) < x).astype(float) if seed % 2 else rng.uniform(0, 1, n)
            w = None if seed % 4 < 2 else rng.uniform(0, 2, n) * (rng.random(n) > 0.1)
            if w is not None and not (w > 0).any():
                w[0] = 1.0
            knots_x, knots_y = isotonic_fit(x, y, w)
            ref_x, ref_y, ref_w = reference_isotonic(x, y, w, with_weights=True)
            assert knots_x.dtype == torch.float64 and knots_y.dtype == torch.float64
            np.testing.assert_allclose(knots_x.numpy(), ref_x, rtol=0, atol=1e-12, err_msg=f"seed {seed}")
            np.testing.assert_allclose(knots_y.numpy(), ref_y, rtol=0, atol=1e-12, err_msg=f"seed {seed}")
            _, _, knots_w = isotonic_blocks(x, y, w)
            np.testing.assert_allclose(knots_w.numpy(), ref_w, rtol=1e-12, atol=1e-12, err_msg=f"seed {seed}")
            assert (knots_x[1:] > knots_x[:-1]).all() and (knots_y[1:] > knots_y[:-1]).all()

    def test_hand_cases(self):
        x, y = isotonic_fit([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 2.0, 4.0])
        assert x.tolist() == [0.0, 1.5, 3.0] and y.tolist() == [1.0, 2.5, 4.0]
        x, y = isotonic_fit([0.0, 1.0, 2.0], [3.0, 2.0, 1.0])  # decreasing: one block
        assert x.tolist() == [1.0] and y.tolist() == [2.0]
        x, y = isotonic_fit(torch.tensor([0.3, 0.1, 0.2]), torch.tensor([0.3, 0.1, 0.2]))  # sorted inside
        assert_close(x, torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64))
        x, y = isotonic_fit([0.0, 0.0, 1.0], [0.0, 1.0, 0.0])  # equal x pooled first, then a violation
        assert_close(x, torch.tensor([1 / 3], dtype=torch.float64))
        assert_close(y, torch.tensor([1 / 3], dtype=torch.float64))
        x, y = isotonic_fit([0.0, 1.0, 2.0], [0.0, 1.0, 1.0])  # equal means pool: no flat part
        assert x.tolist() == [0.0, 1.5] and y.tolist() == [0.0, 1.0]
        x, y = isotonic_fit([0.0, 1.0, 2.0], [1.0, 0.0, 5.0], weights=[3.0, 1.0, 0.0])  # weight 0 ignored
        assert x.tolist() == [0.25] and y.tolist() == [0.75]

    def test_bad_input(self):
        with pytest.raises(ValueError, match="at least one point"):
            isotonic_fit([], [])
        with pytest.raises(ValueError, match="at least one point"):
            isotonic_fit([0.1, 0.2], [0, 1], weights=[0, 0])
        with pytest.raises(ValueError, match=r"weights\[1\] = -1.0 is negative"):
            isotonic_fit([0.1, 0.2], [0, 1], weights=[1, -1])
        with pytest.raises(ValueError, match="same length"):
            isotonic_fit([0.1, 0.2], [0.0])
        with pytest.raises(ValueError, match=r"y\[0\] = nan is not finite"):
            isotonic_fit([0.1], [float("nan")])
        with pytest.raises(ValueError, match="one-dimensional"):
            isotonic_fit([[0.1]], [[0.0]])


class TestMap:
    def test_piecewise_linear_and_clamped(self):
        kx, ky = curve([0.2, 0.6, 0.8], [0.1, 0.5, 0.9])
        s = torch.tensor([0.0, 0.2, 0.4, 0.6, 0.7, 0.8, 1.0])
        expected = torch.tensor([0.1, 0.1, 0.3, 0.5, 0.7, 0.9, 0.9], dtype=torch.float64)
        assert_close(isotonic_predict(kx, ky, s), expected)
        assert_close(isotonic_predict(*curve([0.5], [0.4]), s), torch.full((7,), 0.4, dtype=torch.float64))

    @pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs MPS (Apple GPU)")
    def test_mps_scores_map_on_the_cpu(self):
        """MPS has no float64: the map runs on the CPU and equals the CPU's."""
        kx, ky = curve([0.2, 0.6, 0.8], [0.1, 0.5, 0.9])
        s = torch.linspace(0, 1, 11)
        out = isotonic_predict(kx, ky, s.to("mps"))
        assert out.device.type == "cpu" and out.dtype == torch.float64
        assert_close(out, isotonic_predict(kx, ky, s))

    @pytest.mark.parametrize("seed", range(10))
    def test_monotone_and_strictly_increasing_with_a_tie_break(self, seed):
        rng = np.random.default_rng(seed)
        x = rng.uniform(0, 1, 200)
        kx, ky = isotonic_fit(x, (rng.random(200) < x).astype(float))
        grid = torch.linspace(0, 1, 1001, dtype=torch.float64)
        plain = isotonic_predict(kx, ky, grid)
        assert (plain[1:] >= plain[:-1]).all()
        broken = isotonic_predict(kx, ky, grid, tie_break=1e-4)
        assert (broken[1:] > broken[:-1]).all()
        assert ((broken >= 0) & (broken <= 1)).all()

    def test_many_packed_curves_match_a_slow_reference(self):
        """One search over the packed curves of a model (its own and per class) against interpolation curve
        by curve: queries below, between, on and beyond the knots, curves of one knot, empty queries."""
        from detens.heads.calibration import _GLOBAL, _interpolate, _pack

        def slow(xs, ys, s):
            if s <= xs[0]:
                return ys[0]
            if s >= xs[-1]:
                return ys[-1]
            i = max(j for j in range(len(xs)) if xs[j] <= s)
            if xs[i] == s or i == len(xs) - 1:
                return ys[i]
            return ys[i] + (s - xs[i]) / (xs[i + 1] - xs[i]) * (ys[i + 1] - ys[i])

        rng = np.random.default_rng(5)
        curves = {}
        for key, knots in ((_GLOBAL, 6), (3, 1), (7, 12), (9, 2), (20, 1)):
            xs = np.sort(rng.choice(np.linspace(0, 1, 101), knots, replace=False))
            curves[key] = (torch.tensor(xs), torch.tensor(np.sort(rng.random(knots))))
        packed = _pack(curves)
        order = [_GLOBAL, 3, 7, 9, 20]  # the packed curves: the model's first, then the classes sorted
        for num in (0, 1, 300):
            which = torch.tensor(rng.integers(0, len(order), num), dtype=torch.int64)
            queries = torch.tensor(rng.choice(np.concatenate([np.linspace(0, 1, 101), rng.random(50)]), num))
            got = _interpolate(packed, which, queries)
            expected = [slow(curves[order[r]][0].tolist(), curves[order[r]][1].tolist(), q)
                        for r, q in zip(which.tolist(), queries.tolist(), strict=True)]
            assert_close(got, torch.tensor(expected, dtype=torch.float64).reshape(num), rtol=0, atol=1e-12)

    def test_three_decimal_scores_stay_distinct_in_float32(self):
        head = CalibrationHead(["a"], {"a": curve([0.4, 0.6], [0.2, 0.7])})  # flat below 0.4 and above 0.6
        scores = torch.arange(0, 1001, dtype=torch.float32) / 1000
        out = head.calibrate_scores("a", scores)
        assert out.dtype == torch.float32 and (out[1:] > out[:-1]).all()
        assert ((out >= 0) & (out <= 1)).all()

    @pytest.mark.parametrize("scores, labels, error, message", [
        # clamped to [0, 1] before, as if the detector had said 1.0
        (torch.tensor([0.5, 5.0]), None, ValueError, r"^scores\[1\] = 5.0 of 'a' is not a score in \[0, 1\]$"),
        (torch.tensor([float("nan")]), None, ValueError, r"^scores\[0\] = nan of 'a' is not a score in \[0, 1\]$"),
        ([0.5], None, TypeError, r"^scores and labels must be tensors \(Tensor\[K\]\), got list$"),
        (torch.tensor([0.5]), [1], TypeError, r"^scores and labels must be tensors \(Tensor\[K\]\), got list$"),
        (torch.tensor([[0.5]]), None, ValueError, r"^scores must be Tensor\[K\] and labels None or Tensor\[K\], got shapes \[1, 1\]"),
        (torch.tensor([0.5, 0.6]), torch.tensor([1]), ValueError, r"got shapes \[2\] and \[1\]$"),
    ])
    def test_scores_that_are_no_scores_are_refused(self, scores, labels, error, message):
        head = CalibrationHead(["a"], {"a": curve([0.4, 0.6], [0.2, 0.7])})
        with pytest.raises(error, match=message):
            head.calibrate_scores("a", scores, labels)
        assert head.calibrate_scores("a", torch.zeros(0)).shape == (0,)  # no detection: a normal case


# ----------------------------------------------------------------------------------------------- head
class TestHead:
    def test_registered(self):
        assert HEADS.get("calibration") is CalibrationHead
        head = make_head()
        assert head.num_models == 3 and head.model_names == NAMES and head.match_iou == 0.6
        assert CalibrationHead(NAMES).match_iou is None

    def test_untrained_head_is_the_identity(self):
        per_model = random_models(0)
        for det, out in zip(per_model, CalibrationHead(NAMES).calibrate(per_model), strict=True):
            assert_close(out.scores, det.scores)

    @pytest.mark.parametrize("device", DEVICES)
    def test_scores_follow_the_curves(self, device):
        head = make_head()
        boxes = torch.tensor([[0, 0, 10, 10]] * 4, dtype=torch.float32)
        scores = torch.tensor([0.3, 0.5, 0.7, 0.95])
        dets = [
            Detections(boxes, scores, [1, 1, 2, 2], SIZE, "a").to(device),  # class 1 has its own curve
            Detections(boxes, scores, [0, 0, 0, 0], SIZE, "b").to(device),
            Detections(boxes, scores, [0, 5, 0, 5], SIZE, "c").to(device),
        ]
        before = [(d.boxes.clone(), d.scores.clone(), d.labels.clone()) for d in dets]
        out = head.calibrate(dets)
        eps = head.tie_break

        def expected(kx_ky, s):
            return (1 - eps) * isotonic_predict(*kx_ky, torch.tensor([s], dtype=torch.float64)).item() + eps * s

        for det, calibrated in zip(dets, out, strict=True):
            assert calibrated.device.type == device and calibrated.source == det.source
            assert torch.equal(calibrated.boxes, det.boxes) and torch.equal(calibrated.labels, det.labels)
            triples = zip(scores.tolist(), det.labels.tolist(), calibrated.scores.tolist(), strict=True)
            for s, label, got in triples:
                assert got == pytest.approx(expected(head.curve(det.source, label), s), abs=1e-6)
        # class 1 of "a" uses its own curve; class 2 (no curve) the model's
        assert out[0].scores[0].item() == pytest.approx(0.2 * (1 - eps) + eps * 0.3, abs=1e-6)
        assert out[0].scores[2].item() == pytest.approx(0.55 * (1 - eps) + eps * 0.7, abs=1e-6)
        assert head.curve("a", 2) is head.curve("a") and head.class_ids("a") == [1] and head.class_ids("b") == []
        for det, (b, s, lab) in zip(dets, before, strict=True):  # inputs untouched
            assert torch.equal(det.boxes, b) and torch.equal(det.scores, s) and torch.equal(det.labels, lab)

    def test_empty_detections(self):
        out = make_head().calibrate([Detections.empty(SIZE, name) for name in NAMES])
        assert [len(d) for d in out] == [0, 0, 0] and [d.source for d in out] == NAMES

    def test_members_are_matched_by_name(self):
        head = make_head()
        per_model = random_models(1)
        forward = head.calibrate(per_model)
        backward = head.calibrate(per_model[::-1])
        assert [d.source for d in backward] == NAMES[::-1]
        for det in forward:
            twin = next(d for d in backward if d.source == det.source)
            assert torch.equal(det.scores, twin.scores)
        assert as_set(head.fuse_detections(per_model)) == as_set(head.fuse_detections(per_model[::-1]))
        # a subset, by name
        subset = head.calibrate([per_model[2]])
        assert torch.equal(subset[0].scores, forward[2].scores)

    @pytest.mark.parametrize("fuser", ["wbf", "nms", "mean"])
    def test_per_model_fuser_weights_follow_the_names(self, fuser):
        # the saved weights belong to the head's models: members passed in another order keep theirs
        head = make_head(fuser=fuser, fuser_params={"weights": [3.0, 1.0, 0.2]})
        per_model = random_models(5)
        assert as_set(head.fuse_detections(per_model)) == as_set(head.fuse_detections(per_model[::-1]))
        assert as_set(head.fuse_detections(per_model)) == as_set(fuse(per_model, "theta", head=head))

    def test_position_is_the_fallback_for_unnamed_detections(self):
        head = make_head()
        per_model = random_models(2)
        unnamed = [d.with_source(None) for d in per_model]
        assert all(torch.equal(a.scores, b.scores) for a, b in
                   zip(head.calibrate(unnamed), head.calibrate(per_model), strict=True))
        other = [d.with_source(f"model{i}") for i, d in enumerate(per_model)]  # names of other models
        with pytest.raises(ValueError, match=r"\['model0', 'model1', 'model2'\] but this calibration head is for"):
            head.calibrate(other)

    def test_wrong_names_are_an_error_naming_both_lists(self):
        head = make_head()
        per_model = random_models(3)
        with pytest.raises(ValueError, match=r"\['x', 'y'\].*\['a', 'b', 'c'\]"):
            head.calibrate([per_model[0].with_source("x"), per_model[1].with_source("y")])
        with pytest.raises(ValueError, match=r"\['b', None, None\].*\['a', 'b', 'c'\]"):  # 'b' at a's place
            head.calibrate([per_model[0].with_source("b"), *(d.with_source(None) for d in per_model[1:])])

    def test_fuse_detections_is_calibrate_then_the_fuser(self):
        head = make_head(fuser="soft_nms", fuser_params={"sigma": 0.3})
        per_model = random_models(4)
        expected = fuse(head.calibrate(per_model), "soft_nms", sigma=0.3)
        assert as_set(head.fuse_detections(per_model)) == as_set(expected)
        assert as_set(head.fuse_detections(per_model, sigma=0.6)) == as_set(
            fuse(head.calibrate(per_model), "soft_nms", sigma=0.6)
        )

    def test_with_fuser_keeps_the_curves(self):
        head = make_head()
        other = head.with_fuser("refine", {"sigma": 0.4})
        assert other.fuser == "refine" and other.fuser_params == {"sigma": 0.4} and head.fuser == "wbf"
        assert other.config() == {**head.config(), "fuser": "refine", "fuser_params": {"sigma": 0.4}}
        per_model = random_models(6)
        for a, b in zip(head.calibrate(per_model), other.calibrate(per_model), strict=True):
            assert torch.equal(a.scores, b.scores)
        assert as_set(other.fuse_detections(per_model)) == as_set(fuse(head.calibrate(per_model), "refine", sigma=0.4))

    def test_theta_fuser_calls_fuse_detections(self, tmp_path):
        head = make_head()
        per_model = random_models(5)
        out = fuse(per_model, "theta", head=head)
        assert out.source == "fused:calibration"
        assert as_set(out) == as_set(head.fuse_detections(per_model))
        assert as_set(fuse(per_model, "theta", head=head, iou_thr=0.3)) == as_set(
            fuse(head.calibrate(per_model), "wbf", iou_thr=0.3)
        )
        path = tmp_path / "calibration.json"
        head.save(path)
        assert as_set(fuse(per_model, "theta", head=str(path))) == as_set(out)

    def test_bad_construction(self):
        with pytest.raises(ValueError, match=r"unknown fusion method 'wfb'.*Did you mean 'wbf'"):
            CalibrationHead(NAMES, fuser="wfb")
        with pytest.raises(ValueError, match="must not hold 'calibration'"):
            CalibrationHead(NAMES, fuser_params={"calibration": "x.json"})
        with pytest.raises(ValueError, match="JSON-serializable"):
            CalibrationHead(NAMES, fuser_params={"weights": torch.ones(3)})
        with pytest.raises(ValueError, match=r"missing \['c'\]"):
            CalibrationHead(NAMES, {"a": curve([0.5], [0.5]), "b": curve([0.5], [0.5])})
        with pytest.raises(ValueError, match=r"not in model_names"):
            CalibrationHead(NAMES, class_curves={"z": {}}, per_class=True)
        with pytest.raises(ValueError, match="non-decreasing"):
            CalibrationHead(["a"], {"a": curve([0.2, 0.8], [0.9, 0.1])})
        with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
            CalibrationHead(["a"], {"a": curve([0.2, 0.8], [0.1, 1.5])})
        with pytest.raises(ValueError, match="only with per_class=True"):
            CalibrationHead(["a"], class_curves={"a": {0: curve([0.5], [0.5])}})
        with pytest.raises(ValueError, match="target must be one of iou, tp50"):
            CalibrationHead(["a"], target="map")


class TestFiles:
    @pytest.mark.parametrize("suffix", [".json", ".safetensors"])
    def test_round_trip(self, suffix, tmp_path):
        head = make_head(fuser="refine", fuser_params={"vote_sigma": 0.05})
        path = tmp_path / f"head{suffix}"
        head.save(path)
        loaded = load_head(path)
        assert type(loaded) is CalibrationHead and loaded.config() == head.config()
        assert loaded.model_names == NAMES and loaded.fuser == "refine"
        for name in NAMES:
            assert loaded.class_ids(name) == head.class_ids(name)
            for class_id in [None, *head.class_ids(name)]:
                for a, b in zip(loaded.curve(name, class_id), head.curve(name, class_id), strict=True):
                    assert torch.equal(a, b)
        for seed in range(3):
            per_model = random_models(10 + seed)
            for a, b in zip(head.calibrate(per_model), loaded.calibrate(per_model), strict=True):
                assert torch.equal(a.scores, b.scores)
            assert as_set(head.fuse_detections(per_model)) == as_set(loaded.fuse_detections(per_model))
        raw = path.read_bytes()  # plain JSON, or safetensors' JSON header + raw tensor bytes: no pickle
        if suffix == ".json":
            assert json.loads(raw)["type"] == "calibration"
        else:
            length = int.from_bytes(raw[:8], "little")
            assert json.loads(raw[8 : 8 + length])["__metadata__"]["type"] == "calibration"

    def test_model_names_on_load(self, tmp_path):
        path = tmp_path / "head.json"
        make_head().save(path)
        reordered = CalibrationHead.load(path, model_names=["c", "a", "b"])  # curves belong to names
        assert reordered.model_names == ["c", "a", "b"]
        assert torch.equal(reordered.curve("a")[1], make_head().curve("a")[1])
        with pytest.raises(ValueError, match=r"trained for models \['a', 'b', 'c'\].*\['a', 'b', 'x'\]"):
            CalibrationHead.load(path, model_names=["a", "b", "x"])

    @pytest.mark.parametrize("fuser", ["wbf", "nms", "mean"])
    def test_fuser_weights_follow_the_names_on_load(self, fuser, tmp_path):
        path = tmp_path / "head.json"
        head = make_head(fuser=fuser, fuser_params={"weights": [3.0, 1.0, 0.2]})
        head.save(path)
        reordered = CalibrationHead.load(path, model_names=["c", "a", "b"])
        assert reordered.fuser_params["weights"] == [0.2, 3.0, 1.0]
        per_model = random_models(5)
        assert as_set(reordered.fuse_detections(per_model)) == as_set(head.fuse_detections(per_model))
        unnamed = [d.with_source(None) for d in per_model]  # by position: the models in the head's order
        assert as_set(reordered.fuse_detections([unnamed[2], unnamed[0], unnamed[1]])) == as_set(head.fuse_detections(per_model))
        with pytest.raises(HeadFileError, match="load it with detens.load_head"):
            HEADS.get("theta").load(path)

    def test_corrupt_files(self, tmp_path):
        path = tmp_path / "head.json"
        make_head().save(path)
        document = json.loads(path.read_text())
        bad = json.loads(json.dumps(document))
        bad["config"]["bogus"] = 1
        path.write_text(json.dumps(bad))
        with pytest.raises(HeadFileError, match="unknown config keys"):
            load_head(path)
        bad = json.loads(json.dumps(document))
        bad["tensors"]["curves"]["data"][2] += 1  # knot counts no longer add up
        path.write_text(json.dumps(bad))
        with pytest.raises(HeadFileError, match="do not add up"):
            load_head(path)
        bad = json.loads(json.dumps(document))
        bad["tensors"]["knots_y"]["data"][0] = 0.9  # decreasing curve
        path.write_text(json.dumps(bad))
        with pytest.raises(HeadFileError, match="non-decreasing"):
            load_head(path)


# ------------------------------------------------------------------------------------- fuse(calibration=)
class TestFuseWithCalibration:
    @pytest.mark.parametrize("method", ["wbf", "nms", "soft_nms", "refine", "mean"])
    def test_equals_fusing_the_calibrated_list(self, method):
        head = make_head()
        for seed in range(3):
            per_model = random_models(20 + seed)
            got = fuse(per_model, method, calibration=head)
            assert as_set(got) == as_set(fuse(head.calibrate(per_model), method))
            assert got.source == f"fused:{method}"

    def test_calibration_from_a_path(self, tmp_path):
        head = make_head()
        path = tmp_path / "head.safetensors"
        head.save(path)
        per_model = random_models(30)
        expected = as_set(fuse(per_model, "wbf", calibration=head, iou_thr=0.5))
        assert as_set(fuse(per_model, "wbf", calibration=path, iou_thr=0.5)) == expected
        assert as_set(fuse(per_model, "wbf", calibration=str(path), iou_thr=0.5)) == expected

    def test_a_calibration_head_of_other_classes_is_refused_in_a_label_space(self, tmp_path):
        head = make_head()  # per-class curves of classes 0 and 1
        head.label_space = {0: "cat", 1: "dog"}
        head.save(tmp_path / "head.json")
        per_model = random_models(31)
        for calibration, named in ((head, "the calibration head"), (tmp_path / "head.json", r"calibration '.*head\.json'")):
            with pytest.raises(ValueError, match=rf"^{named} was trained on a label space whose category ids name other "
                                                 r"classes than in label_space: 1 is 'dog' in the head but 'person' there;"):
                fuse(per_model, "wbf", calibration=calibration, label_space={0: "cat", 1: "person", 2: "car"})
            with pytest.raises(ValueError, match=rf"^{named} has per-class parameters for category ids 0, which are not "
                                                 r"among the 2 category ids of label_space"):
                without_0 = [d[d.labels != 0] for d in per_model]  # detections of the label space's ids
                fuse(without_0, "wbf", calibration=calibration, label_space={1: "dog", 2: "car"})
            got = fuse(per_model, "wbf", calibration=calibration, label_space={0: "Cat", 1: "dog", 2: "car"})
            assert as_set(got) == as_set(fuse(per_model, "wbf", calibration=head))
        agnostic = CalibrationHead(NAMES, {name: curve([0.2, 0.8], [0.1, 0.9]) for name in NAMES}, fuser="wbf")
        agnostic.label_space = {0: "cat", 1: "dog"}
        elsewhere = {0: "person", 1: "car", 2: "bus"}
        assert as_set(fuse(per_model, "wbf", calibration=agnostic, label_space=elsewhere)) == as_set(
            fuse(per_model, "wbf", calibration=agnostic))

    def test_not_a_calibration_head(self):
        from detens.heads.theta import ThetaHead

        with pytest.raises(TypeError, match="calibration must be a CalibrationHead"):
            fuse(random_models(0), "wbf", calibration=ThetaHead(NAMES))


# ----------------------------------------------------------------------------------------------- refine
class TestRefine:
    @pytest.mark.parametrize("decay", ["gaussian", "linear"])
    def test_matches_the_slow_reference(self, decay):
        compared = 0
        for seed in range(30):
            rng = np.random.default_rng(500 + seed)
            num_objects, num_classes = int(rng.integers(1, 10)), int(rng.integers(1, 4))
            per_model = random_models(500 + seed, num_objects=num_objects, num_classes=num_classes)
            sigma, thresh = float(rng.uniform(0.1, 1.0)), float(rng.choice([0.001, 0.05, 0.2]))
            vote_iou, vote_sigma = float(rng.choice([0.0, 0.01, 0.3, 0.6])), float(rng.uniform(0.01, 0.5))
            iou_thr = float(rng.uniform(0.1, 0.7))
            got = refine_fusion(per_model, sigma=sigma, thresh=thresh, vote_iou=vote_iou, vote_sigma=vote_sigma,
                                decay=decay, iou_thr=iou_thr)
            assert got.source == "fused:refine" and (got.scores[:-1] >= got.scores[1:]).all()
            expected = reference_refine(per_model, sigma, thresh, vote_iou, vote_sigma, decay, iou_thr)
            got_rows = as_rows(got)
            assert got_rows.shape == expected.shape, f"seed {seed}"
            np.testing.assert_allclose(got_rows, expected, rtol=0, atol=2e-4, err_msg=f"seed {seed}")
            compared += len(got)
        assert compared > 100

    def test_hand_case(self):
        # Two boxes of one class: the lower one is decayed (kept), both kept boxes are voted toward each other.
        a = Detections(torch.tensor([[10.0, 10.0, 50.0, 50.0]]), [0.9], [1], SIZE, "a")
        b = Detections(torch.tensor([[14.0, 10.0, 54.0, 50.0]]), [0.6], [1], SIZE, "b")
        u = 36 * 40 / (2 * 1600 - 36 * 40)
        out = refine_fusion([a, b], sigma=0.5, vote_sigma=0.1)
        weight = 0.6 * math.exp(-((1 - u) ** 2) / 0.1)
        x1 = (0.9 * 10 + weight * 14) / (0.9 + weight)
        assert out.scores.tolist() == pytest.approx([0.9, 0.6 * math.exp(-u * u / 0.5)], abs=1e-6)
        assert out.boxes[0, 0].item() == pytest.approx(x1, abs=1e-4)
        # vote_iou above their IoU: no voting, the boxes stay as they are
        alone = refine_fusion([a, b], vote_iou=0.9)
        assert alone.boxes.tolist() == [[10.0, 10.0, 50.0, 50.0], [14.0, 10.0, 54.0, 50.0]]
        # another class does not vote
        c = Detections(torch.tensor([[14.0, 10.0, 54.0, 50.0]]), [0.6], [2], SIZE, "c")
        assert refine_fusion([a, c]).boxes[0].tolist() == [10.0, 10.0, 50.0, 50.0]

    @staticmethod
    def _chain(num_boxes: int) -> list[Detections]:
        """One class of boxes in a row, each overlapping the next: a crowd no gap splits into groups."""
        x1 = torch.arange(num_boxes, dtype=torch.float32) * 6
        boxes = torch.stack([x1, torch.full_like(x1, 10), x1 + 10, torch.full_like(x1, 30)], 1)
        scores = torch.linspace(0.9, 0.3, num_boxes)
        return [Detections(boxes, scores, torch.zeros(num_boxes, dtype=torch.int64), (40, 6 * num_boxes + 10), "a")]

    def test_votes_pair_kept_boxes_with_the_boxes_they_overlap_not_with_their_whole_class(self, monkeypatch):
        # Pairing each kept box with every box of its class takes kept × boxes pairs at once (26 GB for
        # 100,000 boxes of 3 classes): here 300 boxes, each overlapping two neighbours on either side.
        import detens.fusers.refine

        pairs = []
        pair_iou = detens.fusers.refine._pair_iou
        monkeypatch.setattr(detens.fusers.refine, "_pair_iou", lambda a, b: pairs.append(len(a)) or pair_iou(a, b))
        per_model = self._chain(300)
        fused = refine_fusion(per_model, sigma=0.01, thresh=0.5)
        assert len(fused) > 30 and max(pairs) <= 5 * 300

    @pytest.mark.parametrize("seed", range(6))
    def test_same_boxes_when_the_votes_are_counted_in_blocks(self, seed, monkeypatch):
        import detens.matching

        per_model = random_models(700 + seed, num_objects=12, num_classes=2)
        whole = refine_fusion(per_model, vote_iou=0.0, vote_sigma=0.3)
        monkeypatch.setattr(detens.matching, "_IOU_BLOCK_ELEMENTS", 5)
        blocks = refine_fusion(per_model, vote_iou=0.0, vote_sigma=0.3)
        assert len(whole) > 10
        assert torch.equal(blocks.boxes, whole.boxes) and torch.equal(blocks.scores, whole.scores)

    def test_bad_parameters(self):
        per_model = random_models(0)
        for params, message in [
            ({"vote_iou": 1.0}, "vote_iou must be in"),
            ({"vote_sigma": 0.0}, "vote_sigma must be a positive number"),
            ({"sigma": -1.0}, "sigma must be a positive number"),
            ({"decay": "cubic"}, "decay must be"),
            ({"thresh": 1.0}, "thresh must be in"),
        ]:
            with pytest.raises(ValueError, match=message):
                fuse(per_model, "refine", **params)
        with pytest.raises(ValueError, match="one number per model"):
            fuse(per_model, "refine", weights=[1.0, 2.0])


# ------------------------------------------------------------------------------------------ fitting
def _xywh(box):
    return [box[0], box[1], box[2] - box[0], box[3] - box[1]]


GT_BOX = [20.0, 20.0, 60.0, 60.0]
HALF_BOX = [20.0, 20.0, 60.0, 40.0]  # IoU 0.5 with GT_BOX
CROWD_BOX = [80.0, 0.0, 160.0, 80.0]
#: a model that overlaps the object of each of 4 images, never by 0.5: 20x30 = 600 inside the 40x40 = 1600
#: GT box, IoU 0.375
LOOSE = [{"image_id": i, "category_id": 1, "bbox": _xywh([20.0, 20.0, 40.0, 50.0]), "score": 0.8} for i in range(4)]


def synthetic(num_images: int = 4, models: dict | None = None, prefix: str = "") -> EnsemblePredictions:
    """Each image (``<prefix><id>.jpg``): one object of class 1 at GT_BOX, one crowd region of class 1 at
    CROWD_BOX.

    Default models: ``sharp`` (see :func:`_sharp_results`) and ``lost``, whose boxes hit nothing."""
    images = [{"id": i, "width": 160, "height": 120, "file_name": f"{prefix}{i}.jpg"} for i in range(num_images)]
    annotations = []
    for i in range(num_images):
        for k, (box, crowd) in enumerate(((GT_BOX, 0), (CROWD_BOX, 1))):
            annotations.append(
                {"id": 2 * i + k + 1, "image_id": i, "category_id": 1, "bbox": _xywh(box), "iscrowd": crowd}
            )
    gt = load_coco_gt({"images": images, "annotations": annotations,
                       "categories": [{"id": 1, "name": "one"}, {"id": 2, "name": "two"}]})

    def result(image_id, box, score, category=1):
        return {"image_id": image_id, "category_id": category, "bbox": _xywh(box), "score": score}

    if models is None:
        models = {
            "sharp": _sharp_results(num_images),
            "lost": [result(i, [0.0, 90.0, 10.0, 100.0], 0.7) for i in range(num_images)],
        }
    return EnsemblePredictions(list(models), list(models.values()), gt)


class TestFitCalibration:
    def test_iou_target(self):
        preds = synthetic(models={"sharp": _sharp_results()})
        head = fit_calibration(preds, preds.image_ids)
        kx, ky = head.curve("sharp")
        assert_close(kx, torch.tensor([0.2, 0.6, 0.9], dtype=torch.float64), atol=1e-6, rtol=0)
        assert_close(ky, torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))  # the crowd box at 0.95 is ignored
        assert head.target == "iou" and head.fuser == "wbf" and not head.per_class
        out = head.calibrate_scores("sharp", torch.tensor([0.1, 0.4, 0.75, 1.0]))
        eps = head.tie_break
        expected = torch.tensor([0.0, 0.25, 0.75, 1.0]) * (1 - eps) + eps * torch.tensor([0.1, 0.4, 0.75, 1.0])
        assert_close(out, expected, atol=1e-6, rtol=0)

    def test_tp50_target(self):
        preds = synthetic(models={"sharp": _sharp_results()})
        head = fit_calibration(preds, preds.image_ids, target="tp50", fuser="refine", fuser_params={"sigma": 0.4})
        assert head.curve("sharp")[1].tolist() == [0.0, 1.0]  # IoU 0.5 and 1 are both hits
        assert head.fuser == "refine" and head.fuser_params == {"sigma": 0.4}
        per_model = preds.per_model(0)
        assert head.fuse_detections(per_model).source == "fused:refine"

    def test_per_class_shrinkage(self):
        results = _sharp_results() + [  # class 2: high scores that never hit (no class-2 object)
            {"image_id": i, "category_id": 2, "bbox": _xywh(GT_BOX), "score": s}
            for i in range(4) for s in (0.8, 0.85)
        ]
        preds = synthetic(models={"sharp": results})
        # the model's curve over both classes, by hand: 0.2 → 0 (4 detections); 0.6 (IoU 0.5), 0.8 and 0.85
        # (IoU 0) pool to 2/12 (12 detections); 0.9 → 1 (4 detections)
        model_x = torch.tensor([0.2, (0.6 * 4 + 0.8 * 4 + 0.85 * 4) / 12, 0.9], dtype=torch.float64)
        model_y = torch.tensor([0.0, 2 / 12, 1.0], dtype=torch.float64)
        for shrinkage in (0.0, 4.0, 1e9):
            head = fit_calibration(preds, preds.image_ids, per_class=True, shrinkage=shrinkage)
            assert head.class_ids("sharp") == [1, 2] and head.per_class
            global_x, global_y = head.curve("sharp")
            assert_close(global_x, model_x, atol=1e-6, rtol=0)
            assert_close(global_y, model_y)
            # the rule: class 2's own points (weight 1) and the model's knots as shrinkage pseudo-detections
            # (in shares 4/20, 12/20, 4/20 of the model's detections), then the weighted isotonic fit
            s = torch.tensor([0.8, 0.85] * 4).double()  # the scores as stored (float32)
            x = np.concatenate([s.numpy(), global_x.numpy()])
            y = np.concatenate([np.zeros(8), global_y.numpy()])
            w = np.concatenate([np.ones(8), shrinkage * np.array([4.0, 12.0, 4.0]) / 20.0])
            want_x, want_y = reference_isotonic(x, y, w)
            got_x, got_y = head.curve("sharp", 2)
            np.testing.assert_allclose(got_x.numpy(), want_x, rtol=0, atol=1e-12)
            np.testing.assert_allclose(got_y.numpy(), want_y, rtol=0, atol=1e-12)
        # no shrinkage: class 2 never hits; huge shrinkage: class 2 follows the model's curve
        head0 = fit_calibration(preds, preds.image_ids, per_class=True, shrinkage=0.0)
        assert head0.curve("sharp", 2)[1].tolist() == [0.0]
        headinf = fit_calibration(preds, preds.image_ids, per_class=True, shrinkage=1e9)
        s = torch.tensor([0.1, 0.4, 0.8, 0.85, 0.95])
        assert_close(headinf.calibrate_scores("sharp", s, torch.tensor([2] * 5)),
                     headinf.calibrate_scores("sharp", s), atol=1e-6, rtol=0)
        # a class without training detections (7) uses the model's curve
        assert_close(head0.calibrate_scores("sharp", s, torch.tensor([7] * 5)), head0.calibrate_scores("sharp", s))

    def test_per_class_curve_returns_to_the_model_curve_beyond_its_scores(self):
        # class 2 is seen in training only at low scores; at a high score its curve must not stay at the
        # value of its highest training score (that would cap every high-scoring class-2 detection)
        results = _sharp_results() + [
            {"image_id": i, "category_id": 2, "bbox": _xywh(GT_BOX), "score": 0.3} for i in range(4)
        ]
        preds = synthetic(models={"sharp": results})
        head = fit_calibration(preds, preds.image_ids, per_class=True, shrinkage=50.0)
        high = torch.tensor([0.9])
        own, model = head.calibrate_scores("sharp", high, torch.tensor([2])), head.calibrate_scores("sharp", high)
        assert model.item() > 0.9 and own.item() > 0.8 * model.item()
        # with no shrinkage the class's own data alone decides: it never hit, so its curve is 0
        head0 = fit_calibration(preds, preds.image_ids, per_class=True, shrinkage=0.0)
        assert head0.calibrate_scores("sharp", high, torch.tensor([2])).item() < 1e-3

    def test_bad_input(self):
        preds = synthetic()
        with pytest.raises(ValueError, match="needs at least 2 images, got 1"):
            fit_calibration(preds, [0])
        with pytest.raises(ValueError, match="model 'lost': none of its 4 detections"):
            fit_calibration(preds, preds.image_ids)
        quiet = synthetic(models={"sharp": _sharp_results(), "quiet": []})
        with pytest.raises(ValueError, match="model 'quiet' has no detection on the 4 training images"):
            fit_calibration(quiet, quiet.image_ids)
        sharp = synthetic(models={"sharp": _sharp_results()})
        with pytest.raises(ValueError, match=r"duplicates \[1\]"):
            fit_calibration(sharp, [0, 1, 1])
        with pytest.raises(ValueError, match=r"image_ids \[99\] are not in the ground truth"):
            fit_calibration(sharp, [0, 99])
        with pytest.raises(ValueError, match="target must be one of"):
            fit_calibration(sharp, [0, 1], target="ap")
        with pytest.raises(ValueError, match="shrinkage must be a number >= 0"):
            fit_calibration(sharp, [0, 1], shrinkage=-1.0)

    def test_tp50_refuses_a_model_that_never_reaches_iou_half(self):
        preds = synthetic(models={"sharp": _sharp_results(), "loose": LOOSE})
        assert fit_calibration(preds, preds.image_ids).curve("loose")[1].max() == pytest.approx(0.375)
        with pytest.raises(ValueError, match="model 'loose': none of its 4 detections .* reaches IoU 0.5"):
            fit_calibration(preds, preds.image_ids, target="tp50")

    def test_a_model_given_twice_is_refused(self):
        preds = synthetic(models={"sharp": _sharp_results(), "copy": _sharp_results()})
        head = fit_calibration(preds, preds.image_ids)
        sharp, copy = preds.per_model(1)
        assert len(head.calibrate([copy])) == 1  # a subset of the models is fine
        for call in (head.calibrate, lambda per_model: fuse(per_model, "wbf", calibration=head)):
            with pytest.raises(ValueError, match=r"two Detections name the same model \['sharp'\]"):
                call([sharp, sharp, copy])

    def test_fitted_head_round_trips_and_fuses(self, tmp_path):
        preds = synthetic(models={"sharp": _sharp_results(), "copy": _sharp_results()})
        head = fit_calibration(preds, preds.image_ids, per_class=True)
        path = tmp_path / "head.json"
        head.save(path)
        per_model = preds.per_model(1)
        assert as_set(fuse(per_model, "wbf", calibration=path)) == as_set(head.fuse_detections(per_model))

    def test_fitted_head_records_the_label_space(self, tmp_path):
        preds = synthetic(models={"sharp": _sharp_results(), "copy": _sharp_results()})
        head = fit_calibration(preds, preds.image_ids).with_fuser("soft_nms")
        path = tmp_path / "head.json"
        head.save(path)
        assert json.loads(path.read_text())["label_space"] == [{"id": 1, "name": "one"}, {"id": 2, "name": "two"}]
        assert load_head(path).label_space == {1: "one", 2: "two"}


#: fast settings of the network heads, for the runs that fit them
FAST_NET = {"epochs": 1, "hidden": 8, "depth": 1, "match_iou_grid": []}
FAST_DEEP = {**FAST_NET, "median_box": False}


def test_calibration_targets_match_a_slow_reference():
    """Each detection's target (IoU with the best non-crowd ground-truth box of its class) and whether it
    counts (not inside a crowd region of its class without a match at 0.5), against the definitions."""
    from detens.heads.calibration import _targets

    def inside(det, region):
        width, height = min(det[2], region[2]) - max(det[0], region[0]), min(det[3], region[3]) - max(det[1], region[1])
        return max(width, 0) * max(height, 0) / max((det[2] - det[0]) * (det[3] - det[1]), 1e-12)

    rng = np.random.default_rng(11)
    for num, num_gt in ((0, 3), (5, 0), (1, 1), (60, 8), (60, 8)):
        centre = rng.uniform(20, 100, (num_gt, 2))
        gt = np.concatenate([centre - rng.uniform(5, 30, (num_gt, 2)), centre + rng.uniform(5, 30, (num_gt, 2))], 1)
        gt_labels, crowd = rng.integers(0, 2, num_gt), rng.random(num_gt) < 0.3
        near = gt[rng.integers(0, max(num_gt, 1), num)] if num_gt else np.zeros((num, 4)) + 50
        boxes = near + rng.normal(0, 6, (num, 4))
        boxes[:, 2:] = np.maximum(boxes[:, 2:], boxes[:, :2] + 1)
        labels = rng.integers(0, 2, num)
        det = Detections(torch.tensor(boxes, dtype=torch.float32), torch.rand(num), torch.tensor(labels), SIZE)
        best, counted = _targets(det, torch.tensor(gt, dtype=torch.float64), torch.tensor(gt_labels),
                                 torch.tensor(crowd))
        boxes = det.boxes.double().tolist()
        for k in range(num):
            same = [g for g in range(num_gt) if gt_labels[g] == labels[k]]
            expected = max([0.0] + [_iou(boxes[k], gt[g]) for g in same if not crowd[g]])
            in_crowd = max([0.0] + [inside(boxes[k], gt[g]) for g in same if crowd[g]])
            assert best[k].item() == pytest.approx(expected, abs=1e-9)
            assert bool(counted[k]) == (not (expected < 0.5 and in_crowd >= 0.5))
        assert best.shape == counted.shape == (num,)


class TestCrossValidationRefusesMembersWithoutCurves:
    """A head that fits calibration curves cannot fit one for a member without detections on a ground-truth
    object: cross_validate refuses it before any method runs, and a fold that lacks them is named."""

    @pytest.mark.parametrize("method, options, models, message", [
        ("calibration", {}, {"quiet": []}, "calibration: model 'quiet' has no detection on the 4 training images; "
         "a calibration curve needs its scores"),
        ("deep", FAST_DEEP, {"quiet": []}, r"deep calibrates every member's scores before it is fitted \(calibrate: "
         r"true; false fits it on the raw scores\): model 'quiet' has no detection on the 4 training images"),
        ("superlearner", {**FAST_NET, "calibrate": True}, {"quiet": []},
         "superlearner calibrates every member's scores .*: model 'quiet' has no detection"),
        ("calibration", {}, None, "calibration: model 'lost': none of its 4 detections on the 4 training images "
         "overlaps a ground-truth box"),
        ("calibration", {"target": "tp50"}, {"loose": LOOSE}, "calibration: model 'loose': none of its 4 detections "
         ".* reaches IoU 0.5"),
    ])
    def test_before_any_method_runs(self, method, options, models, message):
        from detens.evaluation import cross_validate

        preds = synthetic() if models is None else synthetic(models={"sharp": _sharp_results(), **models})
        ran = []
        with pytest.raises(ValueError, match=f"^{message}"):
            cross_validate(preds, ["mean", method], k=2, backend="faster", method_options={method: options},
                           on_method=lambda name, result: ran.append(name))
        assert ran == []

    def test_only_the_fitting_images_count(self):
        from detens.evaluation import cross_validate

        # detections on the scored images are no use to a fit on the extra fitting data alone
        evaluated = synthetic(models={"sharp": _sharp_results(), "quiet": _sharp_results()})
        fit_on = synthetic(models={"sharp": _sharp_results(), "quiet": []}, prefix="fit_")
        with pytest.raises(ValueError, match="^calibration: model 'quiet' has no detection on the 4 training images"):
            cross_validate(evaluated, ["mean", "calibration"], k=0, backend="faster", fit_on=fit_on,
                           on_method=lambda name, result: pytest.fail(f"{name} ran"))

    @pytest.mark.parametrize("method", ["mean", "wbf", "single", "theta", "deep"])
    def test_methods_that_fit_without_the_members_detections_run(self, method):
        from detens.evaluation import cross_validate

        preds = synthetic(models={"sharp": _sharp_results(), "quiet": []})
        options = {"deep": {**FAST_DEEP, "calibrate": False}, "theta": {"epochs": 1, "match_iou_grid": []}}
        report = cross_validate(preds, [method], k=2, backend="faster",
                                method_options={method: options[method]} if method in options else None)
        assert all(0.0 <= result.metrics["map"] <= 1.0 for result in report.values())

    @pytest.mark.parametrize("method", ["calibration", "deep"])
    def test_a_fold_whose_training_images_lack_the_members_detections_is_named(self, method):
        from detens.evaluation import cross_validate
        from detens.folds import kfold_image_splits

        held_out = kfold_image_splits([0, 1, 2, 3], 2, 0)[1][1][0]  # the member's only image: fold 2 fits without it
        quiet = [{"image_id": held_out, "category_id": 1, "bbox": _xywh(GT_BOX), "score": 0.9}]
        preds = synthetic(models={"sharp": _sharp_results(), "quiet": quiet})
        options = FAST_DEEP if method == "deep" else {}
        with pytest.raises(ValueError, match=rf"^{method}, fold 2 of 2, fitted on its 2 training images \(2 held "
                                             r"out\): model 'quiet' has no detection on the 2 training images"):
            cross_validate(preds, [method], k=2, backend="faster", method_options={method: options})


def tp50_deep_config(**options) -> DeepTrainConfig:
    """A deep head whose members' curves are fitted to tp50 instead of the IoU."""
    return DeepTrainConfig(**options, calibration_target="tp50")


class _Stop(Exception):
    """Raised by an ``on_method`` callback: the first method ran, so every check before it was made."""


def _stop(name, result):
    raise _Stop(name)


@pytest.fixture
def calibration_checks(monkeypatch):
    """The targets of every pass that check_calibration_data makes over the images, in order."""
    import detens.heads.calibration as calibration

    targets = []
    original = calibration.check_calibration_data

    def counted(predictions, image_ids, target="iou"):
        targets.append(target)
        return original(predictions, image_ids, target)

    monkeypatch.setattr(calibration, "check_calibration_data", counted)
    return targets


class TestTheFitDataCheck:
    """check_fit_data checks the data for the curves the fit will fit, and a run checks it once per target."""

    def test_it_checks_for_the_target_that_the_fit_uses(self):
        from detens.evaluation import cross_validate
        from detens.heads import check_fit_data, config_for, fit_head

        # loose overlaps every object (IoU 0.375) but never reaches IoU 0.5: an IoU curve, no tp50 one
        preds = synthetic(models={"sharp": _sharp_results(), "loose": LOOSE})
        ids = preds.image_ids
        iou = config_for("deep", **FAST_DEEP)
        check_fit_data("deep", preds, ids, iou)
        assert fit_head("deep", preds, ids, iou)[0].calibration.target == "iou"
        tp50 = tp50_deep_config(**FAST_DEEP)
        reason = r"model 'loose': none of its 4 detections on the 4 training images reaches IoU 0\.5"
        with pytest.raises(ValueError, match=rf"^deep calibrates every member's scores before it is fitted .*: {reason}"):
            check_fit_data("deep", preds, ids, tp50)
        with pytest.raises(ValueError, match=reason):  # what the check foresaw: the fit's own refusal
            fit_head("deep", preds, ids, tp50)
        with pytest.raises(ValueError, match=rf"^deep calibrates .*: {reason}"):
            cross_validate(preds, ["mean", "deep"], k=2, backend="faster", method_options={"deep": {"config": tp50}},
                           on_method=lambda name, result: pytest.fail(f"{name} ran"))
        both_hit = synthetic(models={"sharp": _sharp_results(), "copy": _sharp_results()})
        check_fit_data("deep", both_hit, both_hit.image_ids, tp50)
        assert fit_head("deep", both_hit, both_hit.image_ids, tp50)[0].calibration.target == "tp50"

    @pytest.mark.parametrize("kind, options, reason", [
        ("deep", {**FAST_DEEP, "features": ["iou"]}, r"features \['iou'\] select no column for 1 models"),
        ("calibration", {"fusers": ["vote"], "fuser_params": {"vote": {"min_votes": 2}}},
         r"min_votes must be an integer in \[1, 1\], got 2"),
    ])
    def test_options_that_do_not_fit_the_ensemble_are_refused_before_any_method_runs(self, kind, options, reason):
        """A pairwise feature with one member, a vote of two with one member: the config alone cannot tell
        (it does not know the ensemble), the ensemble can, before any method of an evaluation runs."""
        from detens.evaluation import cross_validate
        from detens.heads import check_fit_data, config_for, fit_head

        config = config_for(kind, **options)
        two = synthetic(models={"sharp": _sharp_results(), "copy": _sharp_results()})
        check_fit_data(kind, two, two.image_ids, config)
        one = synthetic(models={"sharp": _sharp_results()})
        with pytest.raises(ValueError, match=rf"^{kind}, for the models sharp: .*{reason}"):
            check_fit_data(kind, one, one.image_ids, config)
        with pytest.raises(ValueError, match=reason):  # what the check foresaw: the fit's own refusal
            fit_head(kind, one, one.image_ids, config)
        with pytest.raises(ValueError, match=rf"{kind}, for the models sharp: .*{reason}"):
            cross_validate(one, ["mean", kind], k=2, backend="faster", method_options={kind: options},
                           on_method=lambda name, result: pytest.fail(f"{name} ran"))

    def test_a_config_of_another_head_type_is_refused(self):
        from detens.heads import check_fit_data, config_for

        preds = synthetic(models={"sharp": _sharp_results()})
        with pytest.raises(TypeError, match="a deep head trains with DeepTrainConfig, got CalibrationTrainConfig"):
            check_fit_data("deep", preds, preds.image_ids, config_for("calibration"))

    def test_methods_fitting_curves_of_one_target_check_the_data_once(self, calibration_checks):
        from detens.evaluation import cross_validate

        preds = synthetic(models={"sharp": _sharp_results(), "copy": _sharp_results()})
        options = {"deep": FAST_DEEP, "superlearner": {**FAST_NET, "calibrate": True}}
        with pytest.raises(_Stop, match="^mean$"):
            cross_validate(preds, ["mean", "calibration", "deep", "superlearner"], k=2, backend="faster",
                           method_options=options, on_method=_stop)
        assert calibration_checks == ["iou"]

    def test_each_target_is_checked_once(self, calibration_checks):
        from detens.evaluation import cross_validate

        preds = synthetic(models={"sharp": _sharp_results(), "copy": _sharp_results()})
        options = {"calibration": {"target": "tp50"}, "deep": FAST_DEEP, "superlearner": {**FAST_NET, "calibrate": True},
                   "selection": {**FAST_NET, "calibrate": False}}
        with pytest.raises(_Stop):
            cross_validate(preds, ["mean", "calibration", "deep", "selection", "superlearner"], k=2,
                           backend="faster", method_options=options, on_method=_stop)
        assert calibration_checks == ["tp50", "iou"]

    def test_the_target_is_an_option_of_the_training_config(self, tmp_path):
        from detens.heads import config_for, load_train_config
        from detens.heads._fit import calibration_target

        assert calibration_target(config_for("deep")) == "iou"
        path = tmp_path / "deep.yaml"
        path.write_text("calibration_target: tp50\n")
        assert calibration_target(load_train_config("deep", str(path))) == "tp50"
        assert calibration_target(config_for("superlearner", calibration_target="tp50")) is None  # calibrate: false
        assert calibration_target(config_for("superlearner", calibrate=True, calibration_target="tp50")) == "tp50"
        for value in ("tp5", "IoU", 0.5, None):
            with pytest.raises(ValueError, match=r"^calibration_target must be one of iou, tp50, got "):
                config_for("deep", calibration_target=value)

    def test_runs_with_other_fold_seeds_share_the_answers_of_the_same_fitting_images(self, calibration_checks):
        from detens.evaluation import cross_validate

        preds = synthetic(models={"sharp": _sharp_results(), "copy": _sharp_results()})
        shared = {}
        for seed in (0, 1, 2):
            with pytest.raises(_Stop, match="^mean$"):
                cross_validate(preds, ["mean", "deep"], k=2, seed=seed, backend="faster",
                               method_options={"deep": FAST_DEEP}, on_method=_stop, calibration_checks=shared)
        assert calibration_checks == ["iou"]
        assert shared == {tuple(preds.image_ids): {"iou": None}}
        # other fitting images (a fit on one set, scored on another) are checked apart
        fit_on = synthetic(2, models={"sharp": _sharp_results(2), "copy": []}, prefix="extra_")
        with pytest.raises(ValueError, match=r"^deep calibrates every member's scores .*model 'copy'"):
            cross_validate(preds, ["mean", "deep"], k=0, backend="faster", fit_on=fit_on,
                           method_options={"deep": FAST_DEEP}, on_method=_stop, calibration_checks=shared)
        assert calibration_checks == ["iou", "iou"] and len(shared) == 2

    @pytest.mark.parametrize("member, passes", [
        ("copy", [True] * 5),  # every curve can be fitted
        ("quiet", [False] * 5),  # no detection: no curve of either target
        ("loose", [True, True, False, True, False]),  # an IoU curve, no tp50 one
    ])
    def test_the_answers_are_those_of_a_check_per_method(self, calibration_checks, member, passes):
        from detens.evaluation import EvaluationData, build_method
        from detens.heads import check_fit_data

        results = {"copy": _sharp_results(), "quiet": [], "loose": LOOSE}[member]
        preds = synthetic(models={"sharp": _sharp_results(), member: results})
        data = EvaluationData(preds)
        methods = [build_method("calibration", preds.model_names), build_method("deep", preds.model_names, **FAST_DEEP),
                   build_method("calibration", preds.model_names, target="tp50"),
                   build_method("superlearner", preds.model_names, **FAST_NET, calibrate=True),
                   build_method("deep", preds.model_names, config=tp50_deep_config(**FAST_DEEP))]

        def answers(check):
            found = []
            for method in methods:
                try:
                    check(method)
                    found.append(None)
                except ValueError as err:
                    found.append(str(err))
            return found

        shared = answers(lambda method: method.check_data(data))
        assert calibration_checks == ["iou", "tp50"]
        alone = answers(lambda method: check_fit_data(method.kind, preds, data.fit_ids, method.config))
        assert calibration_checks == ["iou", "tp50"] + ["iou", "iou", "tp50", "iou", "tp50"]
        assert shared == alone
        assert [answer is None for answer in shared] == passes


def _sharp_results(num_images: int = 4) -> list[dict]:
    """Per image: an exact box at 0.9 (IoU 1), a half box at 0.6 (IoU 0.5), a false positive at 0.2 (IoU 0)
    and a box inside the crowd region at 0.95 (ignored)."""
    return [
        {"image_id": i, "category_id": 1, "bbox": _xywh(box), "score": score}
        for i in range(num_images)
        for box, score in ((GT_BOX, 0.9), (HALF_BOX, 0.6), ([0.0, 90.0, 10.0, 100.0], 0.2),
                           ([100.0, 10.0, 140.0, 50.0], 0.95))
    ]
