"""The contract every registered fuser satisfies, tested over the registry itself.

A new fuser is tested here for free; one that needs parameters to run at all declares them in
``REQUIRED_PARAMS``.
"""

from __future__ import annotations

import inspect
import math
import random
import warnings

import numpy as np
import pytest
import torch

from detens import Detections, fuse
from detens.detections import MAX_LABEL
from detens.fusers import FUSERS
from detens.fusers.wbf import CONF_TYPES
from detens.heads.theta import ThetaHead

IMAGE_SIZE = (120, 160)


def uniform_head(num_models: int) -> ThetaHead:
    return ThetaHead([f"m{i}" for i in range(num_models)])


#: fuser name → callable(num_models) → the parameters it cannot run without.
REQUIRED_PARAMS = {"theta": lambda n: {"head": uniform_head(n)}}

#: fusers whose output may depend on the order of the models (none so far with default parameters).
ORDER_DEPENDENT: set[str] = set()


def params_for(name: str, num_models: int) -> dict:
    return REQUIRED_PARAMS.get(name, lambda n: {})(num_models)


def random_models(seed: int, num_models: int = 3, device: str = "cpu") -> list[Detections]:
    rng = random.Random(seed)
    objects = []
    for _ in range(8):
        x, y = rng.uniform(-20, 140), rng.uniform(-20, 100)
        objects.append((x, y, x + rng.uniform(5, 60), y + rng.uniform(5, 60), rng.randrange(3)))
    per_model = []
    for _ in range(num_models):
        boxes, scores, labels = [], [], []
        for x1, y1, x2, y2, label in objects:
            if rng.random() < 0.2:
                continue
            j = [rng.gauss(0, 2) for _ in range(4)]
            boxes.append([x1 + j[0], y1 + j[1], max(x1 + j[0], x2 + j[2]), max(y1 + j[1], y2 + j[3])])
            scores.append(rng.uniform(0.05, 0.99))
            labels.append(label)
        per_model.append(Detections(torch.tensor(boxes).reshape(-1, 4), scores, labels, IMAGE_SIZE).to(device))
    return per_model


def as_set(det: Detections, decimals: int = 3) -> list[tuple]:
    rows = torch.cat([det.boxes, det.scores[:, None], det.labels[:, None].float()], 1)
    return sorted(tuple(round(v, decimals) for v in row.tolist()) for row in rows)


@pytest.mark.parametrize("name", FUSERS.names())
class TestFuserContract:
    def test_all_empty_input_gives_empty_output(self, name):
        empty = [Detections.empty(IMAGE_SIZE), Detections.empty(IMAGE_SIZE)]
        out = fuse(empty, name, **params_for(name, 2))
        assert isinstance(out, Detections) and len(out) == 0
        assert out.image_size == IMAGE_SIZE

    def test_one_model_empty_is_normal(self, name):
        """A model without boxes adds no box; where a fuser counts the models, it is one that saw nothing."""
        pair = random_models(0, 2)
        assert [len(d) for d in pair] == [6, 7]
        out = fuse([*pair, Detections.empty(IMAGE_SIZE)], name, **params_for(name, 3))
        assert len(out) > 0
        if name in ("nms", "soft_nms", "refine"):
            # they pool every model's boxes (no weights: scores as given), so no box means nothing to pool
            expected, scale = fuse(pair, name), 1.0
        elif name in ("wbf", "mean", "theta", "vote"):
            # the same clusters; each score is averaged over 3 models instead of 2, the empty one adding 0
            # (wbf: mean score * min(boxes, N) / N, each cluster holding at most one box per model here;
            # theta: the untrained head weighs each model 1/N); vote: a majority of 3 is 2 models
            majority = {"min_votes": 2} if name == "vote" else {}
            expected, scale = fuse(pair, name, **params_for(name, 2), **majority), 2 / 3
        else:
            # random_k (k=1) keeps the clusters of mean and draws one model's box of each, so every output box
            # is an input box (its draw of 3 models differs from a draw of 2: no closer comparison)
            assert name == "random_k"
            assert len(out) == len(fuse(pair, "mean"))
            inputs = torch.cat([d.clip().boxes for d in pair])
            apart = (out.boxes[:, None] - inputs[None]).abs().amax(-1).min(1).values
            assert (apart < 1e-3).all()
            return
        assert out.labels.tolist() == expected.labels.tolist()
        torch.testing.assert_close(out.boxes, expected.boxes, rtol=0, atol=1e-4)
        torch.testing.assert_close(out.scores, expected.scores * scale, rtol=1e-5, atol=1e-7)

    @pytest.mark.parametrize("seed", range(5))
    def test_output_is_valid(self, name, seed):
        per_model = random_models(seed)
        out = fuse(per_model, name, **params_for(name, 3))
        height, width = IMAGE_SIZE
        assert out.boxes.dtype == torch.float32 and out.labels.dtype == torch.int64
        assert (out.boxes[:, 0::2] >= 0).all() and (out.boxes[:, 0::2] <= width).all()
        assert (out.boxes[:, 1::2] >= 0).all() and (out.boxes[:, 1::2] <= height).all()
        assert ((out.scores >= 0) & (out.scores <= 1)).all()
        assert torch.equal(out.scores, out.scores.sort(descending=True).values)
        input_labels = set(torch.cat([d.labels for d in per_model]).tolist())
        assert set(out.labels.tolist()) <= input_labels
        assert out.source == f"fused:{name}"

    def test_iou_thr_is_in_0_to_1_excluded_as_documented(self, name):
        """No IoU exceeds 1, not even that of identical boxes: at 1 a fuser would return its input unfused,
        so every fuser taking ``iou_thr`` refuses it, and says so where it documents the option."""
        if "iou_thr" not in inspect.signature(FUSERS.get(name)).parameters:
            pytest.skip(f"{name} takes no iou_thr")
        assert "in [0, 1)" in inspect.getdoc(FUSERS.get(name))
        per_model = random_models(0)
        with pytest.raises(ValueError, match=r"^iou_thr must be in \[0, 1\), got 1.0$"):
            fuse(per_model, name, **params_for(name, 3), iou_thr=1.0)
        for accepted in (0.0, 0.999):
            assert isinstance(fuse(per_model, name, **params_for(name, 3), iou_thr=accepted), Detections)

    def test_inputs_are_not_modified(self, name):
        per_model = random_models(3)
        before = [(d.boxes.clone(), d.scores.clone(), d.labels.clone()) for d in per_model]
        fuse(per_model, name, **params_for(name, 3))
        for det, (boxes, scores, labels) in zip(per_model, before, strict=True):
            assert torch.equal(det.boxes, boxes) and torch.equal(det.scores, scores) and torch.equal(det.labels, labels)

    def test_inputs_that_require_grad_fuse_like_plain_ones(self, name):
        # what a detector called without torch.no_grad() returns
        per_model = random_models(7)
        with_grad = [
            Detections(d.boxes.clone().requires_grad_(), d.scores.clone().requires_grad_(), d.labels, d.image_size)
            for d in per_model
        ]
        got = fuse(with_grad, name, **params_for(name, 3))
        expected = fuse(per_model, name, **params_for(name, 3))
        assert torch.equal(got.boxes, expected.boxes) and torch.equal(got.scores, expected.scores)
        assert not got.boxes.requires_grad and not got.scores.requires_grad  # results hold no autograd graph

    def test_model_order_does_not_matter(self, name):
        if name in ORDER_DEPENDENT:
            pytest.skip(f"{name} depends on the model order by design")
        per_model = random_models(4)
        forward = fuse(per_model, name, **params_for(name, 3))
        backward = fuse(per_model[::-1], name, **params_for(name, 3))
        assert as_set(forward) == as_set(backward)

    def test_model_order_does_not_matter_when_scores_tie(self, name):
        # every score equal and the models listing the objects in different orders: the order in which
        # tied clusters come out of matching must not decide anything
        if name in ORDER_DEPENDENT:
            pytest.skip(f"{name} depends on the model order by design")
        objects = [[10.0, 10, 50, 50], [80, 20, 120, 70], [30, 60, 70, 110]]
        jitter = [[0, 0, 0, 0], [3, 2, 2, 4], [-2, 1, 3, -1]]
        per_model = [
            Detections([[v + j for v, j in zip(objects[i], jitter[m], strict=True)] for i in order], [0.5] * 3,
                       [1, 1, 1], IMAGE_SIZE, f"m{m}")
            for m, order in enumerate([(0, 1, 2), (2, 0, 1), (1, 2, 0)])
        ]
        for permutation in ([1, 0, 2], [2, 1, 0]):
            reordered = [per_model[i] for i in permutation]
            assert as_set(fuse(reordered, name, **params_for(name, 3))) == as_set(fuse(per_model, name, **params_for(name, 3)))

    def test_class_ids_at_the_top_of_the_valid_range_stay_apart(self, name):
        # classes 0, 1, 2 renamed to the largest valid ids: the same fusion, under the new names
        per_model = random_models(6)
        renamed = {0: 0, 1: MAX_LABEL - 1, 2: MAX_LABEL}
        big = [Detections(d.boxes, d.scores, [renamed[v] for v in d.labels.tolist()], d.image_size, d.source)
               for d in per_model]
        expected = fuse(per_model, name, **params_for(name, 3))
        got = fuse(big, name, **params_for(name, 3))
        back = {v: k for k, v in renamed.items()}
        got = Detections(got.boxes, got.scores, [back[v] for v in got.labels.tolist()], got.image_size)
        assert as_set(got) == as_set(expected)

    def test_bad_input_is_an_error(self, name):
        with pytest.raises(ValueError, match="^per_model is empty: pass one Detections per model"):
            fuse([], name, **params_for(name, 1))
        with pytest.raises(ValueError, match="image size"):
            fuse([Detections.empty((10, 10)), Detections.empty((20, 10))], name, **params_for(name, 2))

    @pytest.mark.parametrize("max_det", [1, 3, 7, 1000])
    def test_max_det_keeps_the_highest_scoring_boxes(self, name, max_det):
        per_model = random_models(8)
        everything = fuse(per_model, name, **params_for(name, 3))
        capped = fuse(per_model, name, **params_for(name, 3), max_det=max_det)
        # the obvious way: every fused box as a row, sorted by score (a stable sort keeps the fuser's order
        # among ties), the first max_det rows
        rows = sorted(zip(everything.scores.tolist(), everything.boxes.tolist(), everything.labels.tolist(),
                          strict=True), key=lambda row: -row[0])[:max_det]
        assert len(capped) == min(max_det, len(everything))
        assert capped.scores.tolist() == [row[0] for row in rows]
        assert capped.boxes.tolist() == [row[1] for row in rows] and capped.labels.tolist() == [row[2] for row in rows]
        assert capped.image_size == everything.image_size and capped.source == everything.source

    def test_max_det_of_empty_input_is_empty(self, name):
        empty = [Detections.empty(IMAGE_SIZE), Detections.empty(IMAGE_SIZE)]
        assert len(fuse(empty, name, **params_for(name, 2), max_det=1)) == 0

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_cuda_in_cuda_out(self, name):
        per_model = random_models(5, device="cuda")
        out = fuse(per_model, name, **params_for(name, 3))
        assert out.device.type == "cuda"
        cpu = fuse([d.to("cpu") for d in per_model], name, **params_for(name, 3))
        assert as_set(out.to("cpu"), 2) == as_set(cpu, 2)


def test_unknown_method_lists_the_valid_names():
    with pytest.raises(ValueError, match=r"unknown fusion method 'wfb'; valid names: .*wbf.*Did you mean 'wbf'"):
        fuse([Detections.empty(IMAGE_SIZE)], "wfb")


@pytest.mark.parametrize("name", FUSERS.names())
def test_an_unknown_parameter_names_the_method_and_its_parameters(name):
    """As Ensemble and fuse_results say it: the method the caller named and what it takes, not Python's
    complaint about an internal function."""
    with pytest.raises(TypeError) as info:
        fuse(random_models(0), name, **params_for(name, 3), bogus_option=1)
    message = str(info.value)
    assert message.startswith(f"fusion method {name!r} takes no parameter ['bogus_option']; its parameters: ")
    assert "_fusion()" not in message and "calibration" in message


def test_an_unknown_parameter_of_a_head_type_names_that_type():
    from detens.heads.deep import DeepEnsembleHead

    head = DeepEnsembleHead(["m0", "m1", "m2"])
    with pytest.raises(TypeError, match=r"^fusion method 'deep' takes no parameter \['iou'\]; its parameters: .*'head'"):
        fuse(random_models(0), "deep", head=head, iou=0.5)


@pytest.mark.parametrize("method", ["wbf", "nms"])
def test_a_head_given_to_a_fixed_fuser_says_which_methods_take_one(method):
    from detens import ThetaHead

    with pytest.raises(TypeError, match=rf"^fusion method '{method}' takes no head; pass method='theta' \(which runs "
                                        r"any head\) or the head's type \(method='deep', \.\.\.\)$"):
        fuse(random_models(0), method, head=ThetaHead(["m0", "m1", "m2"]))


def test_a_head_without_a_method_runs_the_head_as_the_cli_does():
    from detens import ThetaHead, TorchvisionFusion

    head = ThetaHead(["m0", "m1", "m2"])
    per_model = random_models(0)
    by_head = fuse(per_model, head=head)
    by_theta = fuse(per_model, "theta", head=head)
    assert torch.equal(by_head.boxes, by_theta.boxes) and torch.equal(by_head.scores, by_theta.scores)
    assert not torch.equal(fuse(per_model).scores, by_theta.scores)  # without a head: wbf, as before
    assert TorchvisionFusion(head=head, model_names=["m0", "m1", "m2"]).method == "theta"
    assert TorchvisionFusion().method == "wbf"


def test_a_theta_head_given_to_another_head_type_says_theta_once():
    from detens import ThetaHead

    with pytest.raises(ValueError, match=r"^method 'deep' was given a 'theta' head; use method='theta'$"):
        fuse(random_models(0), "deep", head=ThetaHead(["m0", "m1", "m2"]))


def test_theta_without_head_is_an_error():
    with pytest.raises(ValueError, match="theta fusion needs head="):
        fuse(random_models(0), "theta")


def test_wrong_length_weights_are_an_error_not_a_reset():
    for name in ("wbf", "nms", "soft_nms", "mean", "vote"):
        with pytest.raises(ValueError, match="one number per model"):
            fuse(random_models(0), name, weights=[1.0, 2.0])


WEIGHTED = [name for name in FUSERS.names() if "weights" in inspect.signature(FUSERS.get(name)).parameters]
FUSER_RUNS = [("wbf", {"conf_type": conf_type}) for conf_type in CONF_TYPES] + [
    (name, {}) for name in WEIGHTED if name != "wbf"]


def test_the_weighted_fusers_are_the_expected_ones():
    assert sorted(WEIGHTED) == ["mean", "nms", "refine", "soft_nms", "vote", "wbf"]


@pytest.mark.parametrize("name, options", FUSER_RUNS, ids=[f"{n}-{o.get('conf_type', '')}" for n, o in FUSER_RUNS])
@pytest.mark.parametrize("scale", [1e-45, 1e-40, 1e-38, 1e-30, 3.0, 1e300])
def test_only_the_ratios_of_the_weights_matter(name, options, scale):
    """Weights far below float32's smallest normal number (1.2e-38) fuse as their ratios do."""
    per_model = random_models(1)
    for ratios in ([1.0, 1.0, 1.0], [1.0, 2.0, 0.5], [0.0, 1.0, 4.0]):
        expected = fuse(per_model, name, weights=ratios, **options)
        got = fuse(per_model, name, weights=[r * scale for r in ratios], **options)
        assert len(got) == len(expected) > 0
        torch.testing.assert_close(got.boxes, expected.boxes, rtol=0, atol=1e-4)
        torch.testing.assert_close(got.scores, expected.scores, rtol=0, atol=1e-6)
        assert torch.equal(got.labels, expected.labels)


@pytest.mark.parametrize("name, options", FUSER_RUNS, ids=[f"{n}-{o.get('conf_type', '')}" for n, o in FUSER_RUNS])
@pytest.mark.parametrize("dtype", ["f4", "f8", "i4"])
def test_weights_in_any_array_layout_fuse_alike(name, options, dtype):
    """An array of weights in the other byte order (``dtype('>f4')`` on this machine) or read backwards
    (negative strides, which torch cannot wrap either) holds the same numbers as the plain one, and fuses
    as it does."""
    per_model = random_models(1)
    native = np.array([1, 2, 4], dtype=dtype)
    swapped = native.astype(native.dtype.newbyteorder(">" if native.dtype.byteorder in "=<" else "<"))
    backwards = np.array([4, 2, 1], dtype=dtype)[::-1]
    assert not swapped.dtype.isnative and np.array_equal(swapped, native)
    assert backwards.strides[0] < 0 and np.array_equal(backwards, native)
    expected = fuse(per_model, name, weights=native, **options)
    for given in (swapped, backwards):
        got = fuse(per_model, name, weights=given, **options)
        assert len(got) == len(expected) > 0
        assert torch.equal(got.boxes, expected.boxes) and torch.equal(got.scores, expected.scores)
        assert torch.equal(got.labels, expected.labels)


#: (fuser, options, error, message): each option is checked before any work, naming it, the expected type
#: or range and the value given.
BAD_OPTIONS = [
    ("nms", {"iou_thr": None}, TypeError, "iou_thr must be a number, got NoneType: None"),
    ("nms", {"iou_thr": True}, TypeError, "iou_thr must be a number, got bool"),
    ("wbf", {"iou_thr": "0.5"}, TypeError, "iou_thr must be a number, got str: '0.5'"),
    ("wbf", {"skip_box_thr": "0.1"}, TypeError, "skip_box_thr must be a number, got str"),
    ("wbf", {"skip_box_thr": math.nan}, ValueError, r"skip_box_thr must be in \[0, 1\], got nan"),
    # scores lie in [0, 1]: a threshold above 1 would drop every box
    ("wbf", {"skip_box_thr": 1.5}, ValueError, r"skip_box_thr must be in \[0, 1\], got 1.5"),
    ("wbf", {"allows_overflow": "yes"}, TypeError, "allows_overflow must be True or False, got str"),
    ("wbf", {"conf_type": None}, TypeError, "conf_type must be one of avg, max, .*got NoneType None"),
    ("soft_nms", {"sigma": math.inf}, ValueError, "sigma must be a positive number, got inf"),
    ("soft_nms", {"thresh": 1.0}, ValueError, r"thresh must be in \[0, 1\), got 1.0"),
    ("soft_nms", {"decay": 2}, TypeError, "decay must be one of gaussian, linear, got int 2"),
    ("refine", {"vote_sigma": "0.04"}, TypeError, "vote_sigma must be a number, got str"),
    ("refine", {"vote_iou": [0.1]}, TypeError, "vote_iou must be a number, got list"),
    ("mean", {"iou_thr": 1.0}, ValueError, r"iou_thr must be in \[0, 1\), got 1.0"),
    ("mean", {"iou_thr": 1 + 1j}, TypeError, "iou_thr must be a number, got complex"),
    ("vote", {"min_votes": True}, TypeError, "min_votes must be an integer, got bool: True"),
    ("vote", {"min_votes": 2.0}, TypeError, "min_votes must be an integer, got float: 2.0"),
    ("vote", {"min_votes": 4}, ValueError, r"min_votes must be an integer in \[1, 3\], got 4"),
    ("random_k", {"k": 1.5}, TypeError, "k must be an integer, got float: 1.5"),
    ("random_k", {"seed": "a"}, TypeError, "seed must be an integer, got str: 'a'"),
    ("random_k", {"seed": math.inf}, TypeError, "seed must be an integer, got float: inf"),
    ("random_k", {"seed": 2**64}, ValueError, "seed must be an integer in"),
    ("theta", {"iou_thr": "x"}, TypeError, "iou_thr must be a number, got str"),
] + [
    (name, {"weights": weights}, TypeError, message)
    for name in ("wbf", "nms", "soft_nms", "refine", "mean", "vote")
    for weights, message in [
        ("1,1,1", "weights must be a list with one number per model"),
        ({"m0": 1.0}, "weights must be a list with one number per model"),
        ([1.0, None, 1.0], r"weights\[1\] must be a number, got NoneType"),
    ]
]


@pytest.mark.parametrize("name, options, error, message", BAD_OPTIONS)
def test_bad_options_name_the_option_and_what_it_must_be(name, options, error, message):
    with pytest.raises(error, match=message):
        fuse(random_models(0), name, **params_for(name, 3), **options)


@pytest.mark.parametrize(
    "name, options",
    [("vote", {"min_votes": np.int64(2)}), ("random_k", {"k": np.int64(2), "seed": np.int32(3)}),
     ("wbf", {"iou_thr": np.float32(0.5), "skip_box_thr": 0, "allows_overflow": np.bool_(True)}),
     ("soft_nms", {"sigma": np.float64(0.5), "weights": np.array([1, 2, 3])})],
)
def test_numpy_scalars_are_numbers(name, options):
    """numpy scalars and arrays fuse exactly as the Python numbers they hold."""
    got = fuse(random_models(0), name, **options)
    plain = {key: value.tolist() for key, value in options.items() if isinstance(value, (np.generic, np.ndarray))}
    assert plain and all(type(v) in (int, float, bool, list) for v in plain.values())
    expected = fuse(random_models(0), name, **{**options, **plain})
    assert isinstance(got, Detections) and len(got) > 0
    assert torch.equal(got.boxes, expected.boxes) and torch.equal(got.scores, expected.scores)
    assert torch.equal(got.labels, expected.labels)


@pytest.mark.parametrize(
    ("max_det", "error", "message"),
    [
        (0, ValueError, "max_det must be an integer >= 1, got 0"),
        (-5, ValueError, "max_det must be an integer >= 1, got -5"),
        (2.5, TypeError, "max_det must be an integer, got float: 2.5"),
        (True, TypeError, "max_det must be an integer, got bool: True"),
        ("100", TypeError, "max_det must be an integer, got str: '100'"),
    ],
)
def test_a_bad_max_det_is_named(max_det, error, message):
    with pytest.raises(error, match=f"^{message}$"):
        fuse(random_models(0), "wbf", max_det=max_det)


def test_max_det_takes_numpy_integers_and_none():
    per_model = random_models(2)
    assert len(fuse(per_model, "wbf", max_det=np.int64(2))) == 2
    assert fuse(per_model, "wbf", max_det=None).boxes.tolist() == fuse(per_model, "wbf").boxes.tolist()


def test_max_det_cuts_supervision_detections_too():
    sv = pytest.importorskip("supervision")
    per_model = [d.clip() for d in random_models(9)]  # as detectors give them: inside the image
    as_sv = [sv.Detections(xyxy=d.boxes.numpy(), confidence=d.scores.numpy(), class_id=d.labels.numpy())
             for d in per_model]
    capped = fuse(as_sv, "wbf", image_size=IMAGE_SIZE, max_det=4)
    assert isinstance(capped, sv.Detections) and len(capped) == 4
    np.testing.assert_array_equal(capped.confidence, fuse(per_model, "wbf").scores.numpy()[:4])


def test_max_det_sorts_a_registered_fusers_boxes_whatever_their_number(monkeypatch):
    """A fuser registered by a user need not sort its boxes: with ``max_det`` they come back sorted by
    score whether the cut removes any or not."""
    monkeypatch.setitem(FUSERS._items, "every_box_ascending", lambda per_model: (
        lambda pooled: pooled[torch.argsort(pooled.scores)])(Detections.concat(per_model)))
    per_model = random_models(10)
    count = sum(len(d) for d in per_model)
    for max_det in (3, count, count + 5):
        out = fuse(per_model, "every_box_ascending", max_det=max_det)
        assert len(out) == min(max_det, count)
        assert out.scores.tolist() == sorted(torch.cat([d.scores for d in per_model]).tolist(), reverse=True)[:max_det]


def test_boxes_normalized_by_the_image_size_are_warned_of():
    """Normalized boxes taken as pixels all land in the image's top-left pixel: a warning says so, and
    nothing is changed (the boxes are fused as given)."""

    def model(boxes, size=(480, 640)):
        boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
        return Detections(boxes, torch.full((len(boxes),), 0.9), torch.ones(len(boxes), dtype=torch.int64), size)

    normalized = [model([[0.1, 0.2, 0.4, 0.5]]), model([[0.11, 0.2, 0.4, 0.52]])]
    with pytest.warns(UserWarning, match=r"every box lies within \[0, 1\] \(the largest coordinate is 0\.52\) on a "
                                         r"480x640 image: detens takes boxes in absolute pixels"):
        fused = fuse(normalized, "wbf")
    assert len(fused) == 1 and float(fused.boxes.max()) <= 0.52
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fuse([model([[10, 20, 40, 50]]), model([[0.1, 0.2, 0.4, 0.5]])], "wbf")  # pixels: one box beyond 1
        fuse([model([]), model([])], "wbf")  # no box at all
        fuse([model([[0, 0, 0, 0]]), model([[0, 0, 0, 0]])], "wbf")  # boxes without area, at the origin
        fuse([model([[0.1, 0.2, 0.4, 0.5]], (16, 16))] * 2, "wbf")  # a tiny image: such boxes may be real
