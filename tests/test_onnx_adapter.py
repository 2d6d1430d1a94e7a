"""The ONNX adapter: each decoder on hand-built outputs with boxes computed by hand, the letterbox both ways,
the whole detector on a stand-in onnxruntime session (known output → known boxes in image pixels), the
errors (shapes, unknown decoder, short class map, onnxruntime missing), and the two shipped ONNX models on
real COCO images, built from the ensemble YAML."""

from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from torchvision.ops import box_iou

import detens.adapters.onnx as onnx_adapter
from detens.adapters import ADAPTERS, build_detector
from detens.adapters.onnx import Letterbox, OnnxDetector, select_providers
from detens.adapters.onnx_decoders import DECODERS, NanodetGflDecoder, UltralyticsDecoder, YoloxDecoder
from detens.adapters.weights import repository_weights_dir
from detens.ensemble_config import ensemble_config_from_dict, load_ensemble_config
from detens.labels import COCO_CATEGORY_IDS

REPO = Path(__file__).resolve().parents[1]
SHARED_MODELS = repository_weights_dir()
DATA = REPO.parent / "shared" / "data" / "coco_val2017_206"
YOLOX = SHARED_MODELS / "yolox_nano_onnx" / "yolox_nano.onnx"
NANODET = SHARED_MODELS / "nanodet_m_416_onnx" / "nanodet_m.onnx"
needs_shared = pytest.mark.skipif(
    not (YOLOX.is_file() and NANODET.is_file() and DATA.is_dir()),
    reason="needs ../shared/models/{yolox_nano_onnx,nanodet_m_416_onnx} and ../shared/data/coco_val2017_206",
)


# ------------------------------------------------------------------------------------------------ decoders
class TestYoloxDecoder:
    def test_hand_built_rows(self):
        # 32x32 input: 4x4 cells of stride 8, 2x2 of 16, 1x1 of 32 → 21 rows; 2 classes
        decoder = YoloxDecoder((32, 32))
        rows = np.zeros((21, 7), dtype=np.float32)
        # stride 8, cell (x=1, y=2) → row 2*4+1 = 9: cx = (0.5+1)*8 = 12, cy = (0.25+2)*8 = 18, w = 2*8, h = 1*8
        rows[9] = [0.5, 0.25, np.log(2.0), 0.0, 0.5, 0.2, 0.8]
        # stride 32, the one cell → row 20: cx = cy = 0.5*32 = 16, w = h = 32
        rows[20] = [0.5, 0.5, 0.0, 0.0, 1.0, 0.9, 0.1]
        boxes, scores, classes = decoder([rows])
        assert boxes.shape == (21, 4) and scores.shape == (21,) and classes.shape == (21,)
        np.testing.assert_allclose(boxes[9], [4.0, 14.0, 20.0, 22.0], atol=1e-5)
        np.testing.assert_allclose(boxes[20], [0.0, 0.0, 32.0, 32.0], atol=1e-5)
        np.testing.assert_allclose(scores[[9, 20]], [0.4, 0.9], atol=1e-6)  # objectness x class score
        assert classes[[9, 20]].tolist() == [1, 0]
        assert np.delete(scores, [9, 20]).max() == 0.0  # objectness 0 elsewhere
        # stride 16, cell (x=1, y=0) → row 16 + 1: all-zero offsets give a 16x16 box at (1*16, 0)
        np.testing.assert_allclose(boxes[17], [8.0, -8.0, 24.0, 8.0], atol=1e-5)


class TestNanodetGflDecoder:
    @staticmethod
    def bins(*hot: int, reg_max: int = 7) -> np.ndarray:
        """Logits of one side: equal at the ``hot`` bins, -1e9 (softmax 0) at the others."""
        logits = np.full(reg_max + 1, -1e9, dtype=np.float32)
        logits[list(hot)] = 0.0
        return logits

    def test_hand_built_levels(self):
        # 64x64 input: 8x8 cells of stride 8, 4x4 of 16, 2x2 of 32; 2 classes, 8 bins per side
        decoder = NanodetGflDecoder((64, 64))
        counts = [64, 16, 4]
        cls = [np.zeros((n, 2), dtype=np.float32) for n in counts]
        reg = [np.tile(np.concatenate([self.bins(0)] * 4), (n, 1)) for n in counts]
        # stride 16, cell (x=1, y=0) → row 1 of level 1, centre (1.5*16, 0.5*16) = (24, 8);
        # left bin 1 → 16, top bin 0 → 0, right bin 1 → 16, bottom bins 2 and 4 → mean 3 → 48
        cls[1][1] = [0.3, 0.7]
        reg[1][1] = np.concatenate([self.bins(1), self.bins(0), self.bins(1), self.bins(2, 4)])
        # stride 8, cell (0, 0), centre (4, 4); left bin 7 → 56 reaches x = -52, clipped to the input
        cls[0][0] = [0.6, 0.1]
        reg[0][0] = np.concatenate([self.bins(7), self.bins(0), self.bins(1), self.bins(1)])
        boxes, scores, classes = decoder(cls + reg)
        assert boxes.shape == (84, 4)
        np.testing.assert_allclose(boxes[64 + 1], [8.0, 8.0, 40.0, 56.0], atol=1e-4)
        np.testing.assert_allclose(boxes[0], [0.0, 4.0, 12.0, 12.0], atol=1e-4)
        np.testing.assert_allclose(scores[[0, 65]], [0.6, 0.7], atol=1e-6)  # the best class score
        assert classes[[0, 65]].tolist() == [0, 1]
        # every other cell: zero distances, a point box at its centre; stride 32 cell (1, 1) → (48, 48)
        np.testing.assert_allclose(boxes[80 + 3], [48.0, 48.0, 48.0, 48.0], atol=1e-4)


def _cells(height: int, width: int, strides=(8, 16, 32)):
    """(stride, x, y) of every cell, level by level, row-major; a partial last cell counts (ceil)."""
    return [(stride, x, y) for stride in strides
            for y in range(-(-height // stride)) for x in range(-(-width // stride))]


def _best(scores) -> tuple[float, int]:
    """The highest score and its class, the first class on a tie."""
    best = max(range(len(scores)), key=lambda c: (scores[c], -c))
    return float(scores[best]), best


# non-square inputs, whose sides are not multiples of every stride: a height-width mix-up shows
@pytest.mark.parametrize("input_size", [(64, 96), (40, 72), (8, 8)])
class TestDecodersMatchASlowReference:
    def test_yolox(self, input_size):
        height, width = input_size
        cells = _cells(height, width)
        rng = np.random.default_rng(height)
        rows = rng.normal(size=(len(cells), 5 + 3)).astype(np.float32)
        rows[::5, 5:] = 0.5  # tied class scores
        boxes, scores, classes = YoloxDecoder(input_size)([rows])
        for a, (stride, x, y) in enumerate(cells):
            row = rows[a].astype(np.float64)
            cx, cy = (row[0] + x) * stride, (row[1] + y) * stride
            w, h = math.exp(row[2]) * stride, math.exp(row[3]) * stride
            np.testing.assert_allclose(boxes[a], [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], rtol=1e-5, atol=1e-4)
            score, label = _best([row[4] * c for c in row[5:]])
            assert scores[a] == pytest.approx(score, rel=1e-5, abs=1e-6) and classes[a] == label

    def test_nanodet_gfl(self, input_size):
        height, width = input_size
        cells = _cells(height, width)
        rng = np.random.default_rng(width)
        counts = [sum(1 for cell in cells if cell[0] == stride) for stride in (8, 16, 32)]
        cls = [rng.random((n, 3)).astype(np.float32) for n in counts]
        reg = [rng.normal(size=(n, 4 * 8)).astype(np.float32) * 3 for n in counts]
        boxes, scores, classes = NanodetGflDecoder(input_size)(cls + reg)
        a = 0
        for level, stride in enumerate((8, 16, 32)):
            for i, (_, x, y) in enumerate(cell for cell in cells if cell[0] == stride):
                sides = []
                for side in range(4):
                    logits = reg[level][i, side * 8:(side + 1) * 8].astype(np.float64)
                    weights = [math.exp(v - max(logits)) for v in logits]
                    sides.append(sum(b * w for b, w in enumerate(weights)) / sum(weights) * stride)
                cx, cy = (x + 0.5) * stride, (y + 0.5) * stride
                expected = [min(max(cx - sides[0], 0), width), min(max(cy - sides[1], 0), height),
                            min(max(cx + sides[2], 0), width), min(max(cy + sides[3], 0), height)]
                np.testing.assert_allclose(boxes[a], expected, rtol=1e-5, atol=1e-4)
                score, label = _best(cls[level][i].tolist())
                assert scores[a] == pytest.approx(score) and classes[a] == label
                a += 1
        assert a == len(boxes)

    def test_ultralytics(self, input_size):
        height, width = input_size
        cells = _cells(height, width)
        rng = np.random.default_rng(height + width)
        out = rng.random((4 + 3, len(cells))).astype(np.float32) * 50
        boxes, scores, classes = UltralyticsDecoder(input_size)([out])
        assert len(boxes) == len(cells)
        for a in range(len(cells)):
            cx, cy, w, h = out[:4, a].astype(np.float64)
            np.testing.assert_allclose(boxes[a], [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], rtol=1e-6, atol=1e-5)
            score, label = _best(out[4:, a].tolist())
            assert scores[a] == pytest.approx(score) and classes[a] == label


class TestUltralyticsDecoder:
    def test_hand_built_columns(self):
        decoder = UltralyticsDecoder((32, 32))  # 16 + 4 + 1 = 21 anchors; 3 classes
        out = np.zeros((7, 21), dtype=np.float32)
        out[:, 5] = [10.0, 12.0, 4.0, 6.0, 0.1, 0.6, 0.3]  # cx, cy, w, h, class scores
        boxes, scores, classes = decoder([out])
        np.testing.assert_allclose(boxes[5], [8.0, 9.0, 12.0, 15.0])
        assert scores[5] == pytest.approx(0.6) and classes[5] == 1
        assert np.delete(scores, 5).max() == 0.0


@pytest.mark.parametrize("name", DECODERS.names())
def test_every_decoder_checks_its_shapes(name):
    """Registry-wide: the declared shapes a decoder expects pass its own check; one wrong dim fails it."""
    decoder = DECODERS.get(name)((64, 96))
    expected = [tuple(1 if d == "B" else d for d in shape) for shape in decoder.expected_outputs(80)]
    assert decoder.check_outputs(expected) == 80
    assert decoder.check_outputs([("batch", *shape[1:]) for shape in expected]) == 80  # dynamic batch
    # one more anchor (and one more class, so that no decoder can read the change as a class count)
    wrong = [(*expected[0][:-2], expected[0][-2] + 1, expected[0][-1] + 1), *expected[1:]]
    with pytest.raises(ValueError, match=rf"model.onnx: decoder '{name}' expects .* the model has"):
        decoder.check_outputs(wrong, where="model.onnx")
    assert set(DECODERS.get(name).preprocessing) == {"letterbox", "pad_value", "bgr_to_rgb", "mean", "std"}


@pytest.mark.parametrize("name", DECODERS.names())
@pytest.mark.parametrize("options, error, message", [
    # a zero stride divided the input size: ZeroDivisionError
    ({"strides": [0, 16, 32]}, ValueError, r"^strides\[0\] must be an integer >= 1, got 0$"),
    # floats were truncated: 8.9 read as 8
    ({"strides": [8.9, 16.2, 32.7]}, TypeError, r"^strides\[0\] must be an integer, got float: 8\.9$"),
    ({"strides": "8,16,32"}, TypeError, r"^strides must be a list of integers, got str: '8,16,32'$"),
    ({"strides": []}, ValueError, r"^strides must list the stride of each level \(integers >= 1\), got \[\]$"),
])
def test_every_decoder_checks_its_strides(name, options, error, message):
    with pytest.raises(error, match=message):
        DECODERS.get(name)((32, 32), **options)


@pytest.mark.parametrize("reg_max, error, message", [
    (7.9, TypeError, r"^reg_max must be an integer, got float: 7\.9$"),  # was read as 7
    (-1, ValueError, r"^reg_max must be an integer >= 0, got -1$"),
])
def test_nanodet_checks_reg_max(reg_max, error, message):
    with pytest.raises(error, match=message):
        NanodetGflDecoder((32, 32), reg_max=reg_max)


def test_unknown_decoder_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown ONNX decoder 'yolo_x'.*nanodet_gfl, ultralytics, yolox"):
        DECODERS.get("yolo_x")


# ----------------------------------------------------------------------------------------------- letterbox
class TestLetterbox:
    def test_center_values(self):
        box = Letterbox.fit((480, 640), (416, 416), "center")
        assert box.scale == pytest.approx(0.65) and box.resized == (312, 416)
        assert (box.left, box.top) == (0, 52)
        np.testing.assert_allclose(box.to_input(np.array([[0, 0, 640, 480]])), [[0, 52, 416, 364]], atol=1e-4)

    def test_top_left_values(self):
        box = Letterbox.fit((333, 500), (416, 416), "top_left")
        assert (
            box.scale == pytest.approx(0.832) and box.resized == (277, 416) and (box.left, box.top) == (0, 0)
        )
        # mapped by the gains of the rounded resize, 416 / 500 in x and 277 / 333 (not 0.832) in y
        np.testing.assert_allclose(
            box.to_image(np.array([[41.6, 2770 / 333, 416, 277]])), [[50, 10, 500, 333]], atol=1e-3
        )
        np.testing.assert_allclose(box.to_input(np.array([[50, 10, 500, 333]])), [[41.6, 2770 / 333, 416, 277]], atol=1e-3)

    @pytest.mark.parametrize("mode", ["top_left", "center"])
    @pytest.mark.parametrize("image_size", [(480, 640), (640, 427), (100, 100), (37, 411)])
    def test_round_trip(self, mode, image_size):
        box = Letterbox.fit(image_size, (416, 320), mode)
        rng = np.random.default_rng(0)
        xy = rng.uniform(0, 1, (50, 2, 2)) * np.array(image_size[::-1])
        boxes = np.concatenate([xy.min(axis=1), xy.max(axis=1)], axis=1).astype(np.float32)
        there = box.to_input(boxes)
        assert (
            there.min() >= -1e-3
            and (there[:, 0::2] <= 320 + 1e-3).all()
            and (there[:, 1::2] <= 416 + 1e-3).all()
        )
        np.testing.assert_allclose(box.to_image(there), boxes, rtol=1e-5, atol=1e-3)

    def test_apply_pastes_on_the_padding(self):
        image = np.full((64, 128, 3), 7, dtype=np.uint8)
        box = Letterbox.fit(image.shape[:2], (32, 32), "center")  # 0.25 → 16x32 at top 8
        canvas = box.apply(image, (32, 32), 114.0)
        assert canvas.shape == (32, 32, 3) and canvas.dtype == np.float32
        assert (canvas[8:24] == 7).all() and (canvas[:8] == 114).all() and (canvas[24:] == 114).all()

    def test_unknown_mode(self):
        with pytest.raises(ValueError, match="letterbox must be 'top_left' or 'center', got 'centre'"):
            Letterbox.fit((10, 10), (32, 32), "centre")  # type: ignore[arg-type]


# -------------------------------------------------------------------- the detector on a stand-in session
class FakeSession:
    """What OnnxDetector uses of ``onnxruntime.InferenceSession``; ``run`` returns fixed arrays."""

    def __init__(self, input_shape, outputs, names=None):
        self.input_shape, self.outputs, self.names, self.feeds = input_shape, outputs, names, []

    def get_inputs(self):
        return [SimpleNamespace(name="images", shape=self.input_shape)]

    def get_outputs(self):
        return [SimpleNamespace(name=f"out{i}", shape=list(o.shape)) for i, o in enumerate(self.outputs)]

    def get_modelmeta(self):
        return SimpleNamespace(custom_metadata_map={"names": repr(self.names)} if self.names else {})

    def get_providers(self):
        return ["CPUExecutionProvider"]

    def run(self, names, feeds):
        self.feeds.append(feeds)
        batch = next(iter(feeds.values())).shape[0]
        return [np.repeat(o, batch, axis=0) for o in self.outputs]


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """``make(input_shape, outputs, names=None) -> path``: OnnxDetector on that path gets a FakeSession."""
    made = {}

    def make(input_shape, outputs, names=None):
        path = tmp_path / "fake.onnx"
        path.write_bytes(b"not a real model")
        made["session"] = FakeSession(input_shape, outputs, names)
        return path

    fake_ort = SimpleNamespace(
        SessionOptions=lambda: SimpleNamespace(),
        get_available_providers=lambda: ["CPUExecutionProvider"],
        InferenceSession=lambda path, sess_options=None, providers=None: made["session"],
    )
    monkeypatch.setattr(onnx_adapter, "import_onnxruntime", lambda: fake_ort)
    make.made = made
    return make


def yolox_rows(num_classes=80):
    """YOLOX output [1, 21, 5 + C] for a 32x32 input: two boxes of class 0 (person) and 2 (car)."""
    rows = np.zeros((1, 21, 5 + num_classes), dtype=np.float32)
    rows[0, 9, :5] = [0.5, 0.25, np.log(2.0), 0.0, 0.5]  # input box [4, 14, 20, 22]
    rows[0, 9, 5 + 0] = 0.8
    rows[0, 20, :5] = [0.5, 0.5, 0.0, 0.0, 1.0]  # input box [0, 0, 32, 32]
    rows[0, 20, 5 + 2] = 0.9
    rows[0, 10, :5] = [0.5, 0.25, np.log(2.0), 0.0, 0.45]  # row 9's box one cell right: [12, 14, 28, 22]
    rows[0, 10, 5 + 0] = 0.8
    return rows


class TestOnnxDetector:
    def test_known_output_to_image_pixels(self, fake_model):
        path = fake_model([1, 3, 32, 32], [yolox_rows()])
        detector = OnnxDetector(path, "yolox", conf=0.3)
        assert detector.name == "fake" and detector.input_size == (32, 32)
        image = np.zeros((64, 128, 3), dtype=np.uint8)  # scale 0.25, top-left: input px / 0.25
        (det,) = detector([image])
        assert det.image_size == (64, 128)
        order = det.scores.argsort(descending=True)
        torch.testing.assert_close(det.scores[order], torch.tensor([0.9, 0.4, 0.36]))
        assert det.labels[order].tolist() == [3, 1, 1]  # COCO ids of car, person
        expected = torch.tensor(
            [[0.0, 0.0, 128.0, 64.0], [16.0, 56.0, 80.0, 64.0], [48.0, 56.0, 112.0, 64.0]]
        )
        torch.testing.assert_close(det.boxes[order], expected)  # clipped to the image (y 88 → 64)

    def test_nms_per_class_and_max_det(self, fake_model):
        rows = yolox_rows()
        rows[0, 10, 0] = -0.5  # row 10 (one cell right of row 9) now gives row 9's box: NMS keeps the better
        path = fake_model([1, 3, 32, 32], [rows])
        (det,) = OnnxDetector(path, "yolox", conf=0.3)([np.zeros((32, 32, 3), np.uint8)])
        assert sorted(det.scores.tolist()) == pytest.approx([0.4, 0.9])
        (det,) = OnnxDetector(path, "yolox", conf=0.3, max_det=1)([np.zeros((32, 32, 3), np.uint8)])
        assert det.scores.tolist() == pytest.approx([0.9])

    @pytest.mark.parametrize("decoder", ["yolox", "ultralytics"])
    def test_nms_runs_on_boxes_before_clipping(self, fake_model, decoder):
        # 32x32 input, 64x128 image: the image fills input rows 0-16 (top-left) or 8-24 (centred). Two
        # persons, A (input height 32) reaching far past the image's bottom edge and B (height 8) inside
        # it: IoU 0.25 as decoded, but one box once clipped. The families run NMS first: both are kept.
        top = 0 if decoder == "yolox" else 8
        if decoder == "yolox":
            out = np.zeros((1, 21, 85), dtype=np.float32)
            out[0, 16 + 2, :6] = [0.5, 0.5, 0.0, np.log(2.0), 1.0, 0.8]  # stride 16, cell (0, 1): [0, 8, 16, 40]
            out[0, 5, :6] = [0.0, 0.5, np.log(2.0), 0.0, 1.0, 0.7]  # stride 8, cell (1, 1): [0, 8, 16, 16]
        else:
            out = np.zeros((1, 84, 21), dtype=np.float32)
            out[0, :5, 0] = [8.0, 24.0 + top, 16.0, 32.0, 0.8]  # [0, 16, 16, 48]
            out[0, :5, 1] = [8.0, 12.0 + top, 16.0, 8.0, 0.7]  # [0, 16, 16, 24]
        path = fake_model([1, 3, 32, 32], [out])
        (det,) = OnnxDetector(path, decoder, conf=0.3, iou=0.5)([np.zeros((64, 128, 3), np.uint8)])
        assert sorted(det.scores.tolist()) == pytest.approx([0.7, 0.8])
        torch.testing.assert_close(det.boxes, torch.tensor([[0.0, 32.0, 64.0, 64.0]] * 2))  # input / 0.25

    def test_preprocessing_values(self, fake_model):
        path = fake_model([1, 3, 32, 32], [yolox_rows()])
        image = np.zeros((16, 32, 3), dtype=np.uint8)
        image[..., 0], image[..., 2] = 10, 200  # B, R
        detector = OnnxDetector(
            path,
            "yolox",
            letterbox="center",
            pad_value=0,
            bgr_to_rgb=True,
            mean=[1, 2, 3],
            std=[2, 4, 5],
            batch=2,
        )
        x, box = detector.preprocess(image)
        assert x.shape == (3, 32, 32) and x.dtype == np.float32 and (box.left, box.top) == (0, 8)
        # channel 0 is R after the swap: (200 - 1) / 2; padding rows: (0 - mean) / std
        assert x[0, 8, 0] == pytest.approx(99.5) and x[2, 8, 0] == pytest.approx(1.4)
        assert x[0, 0, 0] == pytest.approx(-0.5) and x[1, 31, 31] == pytest.approx(-0.5)
        detector([image, image])
        fed = detector.session.feeds
        assert len(fed) == 2 and fed[0]["images"].shape == (1, 3, 32, 32)  # fixed batch 1: one by one

    def test_a_member_cached_at_its_conf_keeps_the_boxes_it_kept_live(self, fake_model):
        """The live adapters keep scores above conf; a cache holds them rounded (5 decimals), so a score just
        above conf is saved as conf itself: read back at that conf, the cached member must keep it."""
        from detens.adapters.precomputed import PrecomputedDetector
        from detens.coco import detections_to_coco

        conf = 0.001
        scores = [0.0009996, conf, 0.0010004, 0.3]  # below, on (dropped live: float32(0.001) is not above it), above
        out = np.zeros((1, 84, 21), dtype=np.float32)
        for i, score in enumerate(scores):
            out[0, :4, i] = [4.0 + 8 * i, 16.0, 4.0, 4.0]  # apart: NMS keeps each
            out[0, 4, i] = score
        path = fake_model([1, 3, 32, 32], [out])
        (live,) = OnnxDetector(path, "ultralytics", conf=conf)([np.zeros((32, 32, 3), np.uint8)])
        assert sorted(live.scores.tolist()) == pytest.approx([0.0010004, 0.3])
        saved = detections_to_coco(live, image_id=1)
        assert sorted(r["score"] for r in saved) == [conf, 0.3]  # 0.0010004 rounds onto conf
        images = [{"id": 1, "file_name": "a.jpg", "height": 32, "width": 32}]
        (cached,) = PrecomputedDetector(saved, images, conf=conf)(["a.jpg"])
        torch.testing.assert_close(cached.boxes, live.boxes)
        # a saved score below conf (from a cache made at a lower conf) is dropped, one above it kept
        lower = [{**saved[0], "score": 0.00099}, {**saved[1], "score": 0.00101}]
        (cached,) = PrecomputedDetector(lower, images, conf=conf)(["a.jpg"])
        assert cached.scores.tolist() == pytest.approx([0.00101])

    def test_family_defaults(self, fake_model):
        path = fake_model([1, 3, 32, 32], [np.zeros((1, 84, 21), np.float32)])
        detector = OnnxDetector(path, "ultralytics")
        assert (detector.letterbox, detector.pad_value, detector.bgr_to_rgb) == ("center", 114.0, True)
        assert detector.std.tolist() == [255.0, 255.0, 255.0]

    def test_class_map_and_categories(self, fake_model):
        path = fake_model([1, 3, 32, 32], [yolox_rows(3)], names={0: "person", 1: "dog", 2: "car"})
        image = np.zeros((32, 32, 3), np.uint8)
        (det,) = OnnxDetector(path, "yolox", conf=0.3, class_map=[7, 8, 9])([image])
        assert sorted(det.labels.tolist()) == [7, 7, 9]
        (det,) = OnnxDetector(path, "yolox", conf=0.3, categories={5: "car", 6: "truck"})([image])
        assert det.labels.tolist() == [5]  # by name; person and dog have no category and are dropped
        with pytest.raises(ValueError, match="model has 3 classes .*not the 80 COCO classes"):
            OnnxDetector(path, "yolox")

    def test_a_dynamic_class_count_first_run_from_threads(self, fake_model, monkeypatch):
        """A model whose outputs leave the class count dynamic gets its label lookup at its first run; a run in
        another thread that saw the count there went on to a lookup not yet made (AttributeError on None)."""
        import threading
        from concurrent.futures import ThreadPoolExecutor

        path = fake_model([1, 3, 32, 32], [yolox_rows()])
        session = fake_model.made["session"]
        session.get_outputs = lambda: [SimpleNamespace(name="out0", shape=["batch", 21, "attributes"])]
        build_lookup = OnnxDetector._build_lookup

        def slow_build_lookup(*args):  # long enough for another run to start meanwhile
            time.sleep(0.2)
            return build_lookup(*args)

        monkeypatch.setattr(OnnxDetector, "_build_lookup", slow_build_lookup)
        image = np.zeros((64, 128, 3), np.uint8)
        expected = OnnxDetector(path, "yolox", conf=0.3)([image])[0]
        detector = OnnxDetector(path, "yolox", conf=0.3)
        assert detector.num_classes == -1 and detector.lookup is None
        together = threading.Barrier(4)

        def first_run(_: int):
            together.wait(timeout=60)
            return detector([image])[0]

        with ThreadPoolExecutor(4) as pool:
            for det in pool.map(first_run, range(4), timeout=60):
                assert torch.equal(det.boxes, expected.boxes) and det.labels.tolist() == expected.labels.tolist()

    def test_classes_outside_the_label_space_go_before_nms_and_max_det(self, fake_model):
        rows = yolox_rows(3)  # persons 0.4 at [4, 14, 20, 22] and 0.36, a car 0.9 over the whole input
        rows[0, 10, 0], rows[0, 10, 5 + 0], rows[0, 10, 5 + 1] = -0.5, 0.0, 0.95  # a dog 0.4275 on the person 0.4
        path = fake_model([1, 3, 32, 32], [rows], names={0: "person", 1: "dog", 2: "car"})
        image = np.zeros((32, 32, 3), np.uint8)
        for agnostic in (False, True):  # the car takes no place; the dog suppresses no person
            (det,) = OnnxDetector(
                path, "yolox", conf=0.3, max_det=1, agnostic_nms=agnostic, categories={1: "person"}
            )([image])
            assert det.labels.tolist() == [1] and det.scores.tolist() == pytest.approx([0.4]), agnostic
        (det,) = OnnxDetector(path, "yolox", conf=0.3, agnostic_nms=True, class_map=[1, 18, 3])([image])
        assert sorted(det.labels.tolist()) == [3, 18]  # every class kept: the dog suppresses the person

    def test_short_class_map(self, fake_model):
        path = fake_model([1, 3, 32, 32], [yolox_rows()])
        with pytest.raises(ValueError, match="class_map lists 79 category ids but the model has 80 classes"):
            OnnxDetector(path, "yolox", class_map=list(COCO_CATEGORY_IDS[:79]))

    def test_output_shape_mismatch_names_file_and_shapes(self, fake_model):
        path = fake_model([1, 3, 32, 32], [np.zeros((1, 84, 21), np.float32)])
        with pytest.raises(
            ValueError,
            match=r"fake\.onnx: decoder 'yolox' expects 1 output\(s\) of shape \[B, 21, 5\+C\].*\[1, 84, 21\]",
        ):
            OnnxDetector(path, "yolox")

    def test_input_shape_mismatch(self, fake_model):
        path = fake_model([1, 3, 32, 32], [yolox_rows()])
        with pytest.raises(
            ValueError, match=r"fake\.onnx: expected the input of shape \[B, 3, 64, 64\].*\[1, 3, 32, 32\]"
        ):
            OnnxDetector(path, "yolox", input_size=(64, 64))
        path = fake_model(["batch", 3, "height", "width"], [yolox_rows()])
        with pytest.raises(ValueError, match="no fixed height and width; pass input_size"):
            OnnxDetector(path, "yolox")
        assert OnnxDetector(path, "yolox", input_size=[32, 32]).input_size == (32, 32)

    @pytest.mark.parametrize(
        "input_size, error, message",
        [
            (32, TypeError, r"input_size must be two positive integers \(height, width\), got int: 32"),
            ("32x32", TypeError, r"input_size must be two positive integers \(height, width\), got str: '32x32'"),
            ((32.0, 32), TypeError, "input_size height must be an integer, got float: 32.0"),
            ([32, True], TypeError, "input_size width must be an integer, got bool: True"),
            ((32,), ValueError, r"input_size must be two positive integers \(height, width\), got \(32,\)"),
            ((0, 32), ValueError, "input_size height must be an integer >= 1, got 0"),
        ],
    )
    def test_input_size_errors_are_named_before_the_model_is_read(self, tmp_path, input_size, error, message):
        with pytest.raises(error, match=message):
            OnnxDetector(tmp_path / "missing.onnx", "yolox", input_size=input_size)
        for name in DECODERS.names():
            with pytest.raises(error, match=message):
                DECODERS.get(name)(input_size)

    def test_numpy_integer_input_sizes_are_the_python_ints_they_hold(self, fake_model):
        path = fake_model(["batch", 3, "height", "width"], [yolox_rows()])
        image = np.zeros((64, 128, 3), dtype=np.uint8)
        (expected,) = OnnxDetector(path, "yolox", conf=0.3, input_size=(32, 32))([image])
        for input_size in (np.array([32, 32]), (np.int64(32), np.int32(32)), torch.Size([32, 32])):
            detector = OnnxDetector(path, "yolox", conf=0.3, input_size=input_size, max_det=np.int64(300))
            assert detector.input_size == (32, 32) and all(type(s) is int for s in detector.input_size)
            assert detector.decoder.input_size == (32, 32) and type(detector.max_det) is int
            (det,) = detector([image])
            assert len(det) == 3 and torch.equal(det.boxes, expected.boxes) and torch.equal(det.scores, expected.scores)
            assert torch.equal(det.labels, expected.labels)

    def test_argument_errors(self, fake_model):
        path = fake_model([1, 3, 32, 32], [yolox_rows()])
        with pytest.raises(ValueError, match="unknown ONNX decoder 'yolov8'.*valid names"):
            OnnxDetector(path, "yolov8")
        with pytest.raises(ValueError, match=r"mean must have 3 values"):
            OnnxDetector(path, "yolox", mean=[0, 0])
        with pytest.raises(
            FileNotFoundError,
            match=r"(?s)missing.onnx' not found.*must be on disk\)\. Pass an existing path or",
        ):
            OnnxDetector(path.parent / "missing.onnx", "yolox")

    @pytest.mark.parametrize("decoder, options, error, message", [
        ("yolox", {"strides": [0, 16, 32]}, ValueError, r"^decoder_options\.strides\[0\] must be an integer >= 1, got 0$"),
        ("ultralytics", {"strides": [8.9, 16.2, 32.7]}, TypeError,
         r"^decoder_options\.strides\[0\] must be an integer, got float: 8\.9$"),
        ("yolox", {"strides": "8,16,32"}, TypeError,
         r"^decoder_options\.strides must be a list of integers, got str: '8,16,32'$"),
        ("nanodet_gfl", {"reg_max": 7.9}, TypeError, r"^decoder_options\.reg_max must be an integer, got float: 7\.9$"),
        ("nanodet_gfl", {"reg_max": -1}, ValueError, r"^decoder_options\.reg_max must be an integer >= 0, got -1$"),
        ("yolox", [1], TypeError,
         r"^decoder_options must be a dict of options of the 'yolox' decoder \(strides\), got list: \[1\]$"),
        ("yolox", {"foo": 1}, ValueError,
         r"^decoder_options\.foo is not an option of the 'yolox' decoder; its options: strides$"),
        ("nanodet_gfl", {"strides": [8, 16, 32], "regmax": 7}, ValueError,
         r"^decoder_options\.regmax is not an option of the 'nanodet_gfl' decoder; its options: strides, reg_max$"),
    ])
    def test_decoder_options_are_named_before_the_model_is_read(self, tmp_path, decoder, options, error, message):
        with pytest.raises(error, match=message):
            OnnxDetector(tmp_path / "missing.onnx", decoder, decoder_options=options)

    def test_decoder_options_reach_the_decoder(self, fake_model):
        path = fake_model([1, 3, 32, 32], [np.zeros((1, 84, 20), np.float32)])  # 16 + 4 anchors
        detector = OnnxDetector(path, "ultralytics", decoder_options={"strides": np.array([8, 16])})
        assert detector.decoder.strides == (8, 16) and all(type(s) is int for s in detector.decoder.strides)

    @pytest.mark.parametrize("kwargs, error, message", [
        ({"bgr_to_rgb": "false"}, TypeError, r"^bgr_to_rgb must be True or False, got str: 'false'$"),  # was True
        ({"bgr_to_rgb": 0}, TypeError, r"^bgr_to_rgb must be True or False, got int: 0$"),
        ({"agnostic_nms": "no"}, TypeError, r"^agnostic_nms must be True or False, got str: 'no'$"),  # was truthy
        ({"pad_value": math.nan}, ValueError, r"^pad_value must be a finite number, got nan$"),
        ({"pad_value": "114"}, TypeError, r"^pad_value must be a number, got str: '114'$"),
        ({"mean": [math.nan, 0, 0]}, ValueError, r"^mean\[0\] must be a finite number, got nan$"),
        ({"mean": 5}, TypeError, r"^mean must be a list of numbers, got int: 5$"),
        ({"mean": "0,0,0"}, TypeError, r"^mean must be a list of numbers, got str: '0,0,0'$"),
        ({"std": [math.inf] * 3}, ValueError, r"^std\[0\] must be a positive number, got inf$"),
        ({"std": [1, 0, 1]}, ValueError, r"^std\[1\] must be a positive number, got 0$"),
        ({"std": [1, 1]}, ValueError, r"^std must have 3 values \(one per channel\), got \[1\.0, 1\.0\]$"),
        ({"iou": None}, TypeError, r"^iou must be a number in \(0, 1\], the IoU threshold of the NMS after the decoder"),
    ])
    def test_preprocessing_and_flag_errors_are_named_before_the_model_is_read(self, tmp_path, kwargs, error, message):
        with pytest.raises(error, match=message):
            OnnxDetector(tmp_path / "missing.onnx", "yolox", **kwargs)

    def test_a_dynamic_input_needs_sides_its_largest_stride_divides(self, fake_model):
        # onnxruntime failed at the first image, naming a Concat node: an FPN joins levels of every stride
        path = fake_model(["batch", 3, "height", "width"], [yolox_rows()])
        with pytest.raises(ValueError, match=re.escape(
                f"{path}: input_size [40, 32] does not fit the model: its input height is dynamic, and must be a "
                "multiple of its largest stride, 32 (decoder 'yolox', strides [8, 16, 32]); e.g. input_size [64, 32]")):
            OnnxDetector(path, "yolox", input_size=(40, 32))
        with pytest.raises(ValueError, match=r"its input height and width are dynamic, .* of its largest stride, 16 "
                                             r"\(decoder 'yolox', strides \[8, 16\]\); e.g. input_size \[48, 32\]$"):
            OnnxDetector(path, "yolox", input_size=(40, 30), decoder_options={"strides": [8, 16]})
        path = fake_model([1, 3, 40, 32], [np.zeros((1, 5 * 4 + 3 * 2 + 2, 85), np.float32)])
        assert OnnxDetector(path, "yolox").input_size == (40, 32)  # a fixed size is the model's own

    def test_a_failed_run_names_the_file_and_input_size(self, fake_model):
        path = fake_model(["batch", 3, "height", "width"], [yolox_rows()])
        detector = OnnxDetector(path, "yolox", input_size=(32, 32))

        def fail(names, feeds):
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Concat node")

        detector.session.run = fail
        with pytest.raises(ValueError, match=re.escape(
                f"{path}: onnxruntime could not run the model on input_size [32, 32] (1 image(s)): RuntimeError: "
                "[ONNXRuntimeError] : 1 : FAIL")):
            detector([np.zeros((32, 32, 3), np.uint8)])

    @pytest.mark.parametrize("categories", [
        [{"id": 5, "name": "car", "supercategory": "vehicle"}, {"id": 6, "name": "truck"}],  # a COCO categories list
        {"images": [], "annotations": [], "categories": [{"id": 5, "name": "car"}, {"id": 6, "name": "truck"}]},
        {"5": "car", "6": "truck"},  # JSON keys: "5" was kept as a string, and no label matched it
    ], ids=["COCO list", "annotation dict", "string keys"])
    def test_categories_in_every_coco_form(self, fake_model, categories):
        path = fake_model([1, 3, 32, 32], [yolox_rows(3)], names={0: "person", 1: "dog", 2: "car"})
        detector = OnnxDetector(path, "yolox", conf=0.3, categories=categories)
        assert detector.categories == {5: "car", 6: "truck"}
        (det,) = detector([np.zeros((32, 32, 3), np.uint8)])
        assert det.labels.tolist() == [5]

    @pytest.mark.parametrize("categories, error, message", [
        ("instances.json", TypeError, r"^categories must be \{id: name\}, a COCO 'categories' list or a COCO "
                                      r"annotation dict, got str: 'instances\.json'$"),
        ({5.5: "car"}, TypeError, r"^categories key 5\.5 must be an integer, got float: 5\.5$"),
        ({"car": 5}, TypeError, r"^categories key 'car' must be an integer, got str: 'car'$"),
        ({-1: "car"}, ValueError, r"^categories key -1 must be an integer in \[0, 2147483647\], got -1$"),
        ({5: "car", "5": "auto"}, ValueError, r"^categories give category id 5 twice: key 5 and key '5'$"),
        ([{"id": 5}], ValueError, r"^categories\[0\] must be a COCO category \{'id': \.\.\., 'name': \.\.\.\}"),
        ([{"id": "5", "name": "car"}], TypeError, r"^categories\[0\]\.id must be an integer, got str: '5'$"),
    ])
    def test_bad_categories_are_named_before_the_model_is_read(self, tmp_path, categories, error, message):
        with pytest.raises(error, match=message):
            OnnxDetector(tmp_path / "missing.onnx", "yolox", categories=categories)

    def test_onnxruntime_missing(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "onnxruntime", None)
        with pytest.raises(ImportError, match=r"pip install 'detens\[onnx\]'"):
            onnx_adapter.import_onnxruntime()


def test_select_providers():
    cpu, cuda = "CPUExecutionProvider", "CUDAExecutionProvider"
    assert select_providers(None, None, [cpu]) == [cpu]
    assert select_providers(None, None, [cuda, cpu]) == [cuda, cpu]
    assert select_providers(None, "cpu", [cuda, cpu]) == [cpu]
    assert select_providers(None, "cuda:1", [cuda, cpu]) == [(cuda, {"device_id": 1}), cpu]
    with pytest.raises(ValueError, match="install onnxruntime-gpu"):
        select_providers(None, "cuda", [cpu])
    with pytest.raises(ValueError, match=r"\['TensorrtExecutionProvider'\] are not available"):
        select_providers(["TensorrtExecutionProvider"], None, [cpu])


# ------------------------------------------------------------------------------------------------- config
def onnx_member(**extra):
    return {"type": "onnx", "weights": "yolox_nano_onnx/yolox_nano.onnx", "decoder": "yolox", **extra}


def test_onnx_is_an_adapter_type():
    assert "onnx" in ADAPTERS


@pytest.mark.parametrize(
    "member, fragment",
    [
        ({"type": "onnx", "weights": "m.onnx"}, "needs 'weights' .* and 'decoder'"),
        (onnx_member(decoder="yolo"), "unknown ONNX decoder 'yolo'"),
        (onnx_member(decodr="yolox"), r"unknown key 'decodr'.*Did you mean 'decoder'"),
        (onnx_member(letterbox="centre"), "is not one of 'top_left', 'center'"),
        (onnx_member(imgsz=416), "remove 'imgsz'"),
        (onnx_member(input_size=[416]), r"input_size must be \[height, width\]"),
        (onnx_member(std=[1, 1]), "std must have 3 values"),
        (onnx_member(half=True), "'half' is not used by type 'onnx'"),
        ({"weights": "x.pt", "decoder": "yolox"}, "'decoder' is not used by type 'ultralytics'"),
        (
            {"type": "precomputed", "results": "r.json", "class_map": [1, 2]},
            "precomputed' needs class_map as",
        ),
    ],
)
def test_invalid_onnx_members(member, fragment):
    with pytest.raises((ValueError, TypeError), match=fragment):
        ensemble_config_from_dict({"models": [member]})


@pytest.mark.parametrize("config", ["coco_diverse.yaml", "coco_all6.yaml"])
def test_shipped_configs_repeat_the_metadata(config):
    models = {m.name: m for m in load_ensemble_config(REPO / "detens" / "configs" / "ensembles" / config).models}
    yolox, nanodet = models["yolox_nano"], models["nanodet_m"]
    assert (yolox.decoder, yolox.input_size, yolox.letterbox, yolox.pad_value) == (
        "yolox",
        [416, 416],
        "top_left",
        114,
    )
    assert (yolox.bgr_to_rgb, yolox.mean, yolox.std, yolox.iou) == (False, [0, 0, 0], [1, 1, 1], 0.65)
    assert (nanodet.decoder, nanodet.letterbox, nanodet.pad_value, nanodet.bgr_to_rgb) == (
        "nanodet_gfl",
        "center",
        0,
        False,
    )
    assert nanodet.mean == [103.53, 116.28, 123.675] and nanodet.std == [57.375, 57.12, 58.395]


# ---------------------------------------------------------------------------------- the shipped models
def person_images(count: int = 2) -> list[tuple[Path, tuple[int, int], torch.Tensor]]:
    """The first images (by id) with a large person, their size and their person boxes (xyxy)."""
    data = json.loads((DATA / "instances_val2017.json").read_text())
    people: dict[int, list[list[float]]] = {}
    for ann in data["annotations"]:
        if ann["category_id"] == 1 and not ann["iscrowd"]:
            x, y, w, h = ann["bbox"]
            people.setdefault(ann["image_id"], []).append([x, y, x + w, y + h])
    large = {
        ann["image_id"] for ann in data["annotations"] if ann["category_id"] == 1 and ann["area"] > 20000
    }
    images = {img["id"]: img for img in data["images"]}
    chosen = sorted(large)[:count]
    return [
        (
            DATA / "images" / images[i]["file_name"],
            (images[i]["height"], images[i]["width"]),
            torch.tensor(people[i]),
        )
        for i in chosen
    ]


@needs_shared
@pytest.mark.slow
@pytest.mark.parametrize("name", ["yolox_nano", "nanodet_m"])
def test_shipped_model_finds_the_person(name):
    config = load_ensemble_config(REPO / "detens" / "configs" / "ensembles" / "coco_all6.yaml")
    (model,) = [m for m in config.models if m.name == name]
    detector = build_detector(model, config)  # the YAML member, through the adapter registry
    assert isinstance(detector, OnnxDetector)
    chosen = person_images()
    results = detector([str(path) for path, _, _ in chosen])
    for det, (path, (height, width), people) in zip(results, chosen, strict=True):
        assert det.image_size == (height, width) and 0 < len(det) <= 300
        assert (
            (det.boxes >= 0).all()
            and (det.boxes[:, 0::2] <= width).all()
            and (det.boxes[:, 1::2] <= height).all()
        )
        assert (det.scores > 0.001).all() and set(det.labels.tolist()) <= set(COCO_CATEGORY_IDS)
        best = det[det.scores.argmax().item()]
        assert best.labels.item() == 1 and best.scores.item() > 0.5, path.name  # a person, confidently
        persons = det[det.labels == 1]
        confident = persons[persons.scores > 0.3]
        assert box_iou(confident.boxes, people).max() > 0.7, path.name


@needs_shared
def test_shipped_models_reject_the_other_decoder():
    with pytest.raises(
        ValueError, match=r"yolox_nano\.onnx: decoder 'nanodet_gfl' expects 6 output\(s\).*\[1, 3549, 85\]"
    ):
        OnnxDetector(YOLOX, "nanodet_gfl")
    with pytest.raises(
        ValueError, match=r"nanodet_m\.onnx: decoder 'yolox' expects 1 output\(s\).*the model has 6"
    ):
        OnnxDetector(NANODET, "yolox")
    with pytest.raises(ValueError, match=r"yolox_nano\.onnx: expected the input of shape \[B, 3, 320, 320\]"):
        OnnxDetector(YOLOX, "yolox", input_size=(320, 320))


# ------------------------------------------------------------------- a real `yolo export format=onnx` file
@pytest.fixture(scope="module")
def ultralytics_onnx_export(tmp_path_factory):
    """A YOLOv8n built from its YAML and exported by Ultralytics itself (``format=onnx``, 320x320). Its
    weights are re-drawn (He-normal, batch norms reset) so that the untrained network's boxes and scores
    vary from anchor to anchor and hundreds of boxes pass ``conf``: every step after the network
    (letterbox, decoding, NMS, back to image pixels) is exercised."""
    pytest.importorskip("onnx", reason="exporting needs the onnx package (pip install onnx)")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("YOLO_AUTOINSTALL", "false")
        monkeypatch.setenv("YOLO_OFFLINE", "1")
        from ultralytics import YOLO

        torch.manual_seed(0)
        model = YOLO("yolov8n.yaml", task="detect")
        with torch.no_grad():
            for module in model.model.modules():
                if isinstance(module, torch.nn.Conv2d) and module.weight.requires_grad:  # not the fixed DFL
                    torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                    if module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, torch.nn.BatchNorm2d):
                    module.reset_parameters()
            for branch in model.model.model[-1].cv3:
                branch[-1].bias.fill_(-2.0)  # class scores around 0.1
        model.model.pt_path = str(tmp_path_factory.mktemp("ultralytics_export") / "yolov8n_random.pt")
        return Path(model.export(format="onnx", imgsz=320, simplify=False, dynamic=False, verbose=False))


def assert_same_detections(mine, reference, score_tol=1e-4, box_tol=0.05):
    """The same boxes, scores and labels, paired by content (near-ties in score make ranks ambiguous)."""
    assert mine.image_size == reference.image_size and len(mine) == len(reference)
    same = (
        (mine.labels[:, None] == reference.labels[None, :])
        & ((mine.scores[:, None] - reference.scores[None, :]).abs() < score_tol)
        & ((mine.boxes[:, None, :] - reference.boxes[None, :, :]).abs().amax(-1) < box_tol)
    )  # [D_mine, D_reference]
    assert same.any(0).all() and same.any(1).all()
    assert len(set(same.float().argmax(1).tolist())) == len(reference)  # a one-to-one pairing


def _asset_images():
    from ultralytics.utils import ASSETS

    return [str(ASSETS / "bus.jpg"), str(ASSETS / "zidane.jpg")]


@pytest.mark.slow
def test_ultralytics_export_decodes_as_ultralytics_does(ultralytics_onnx_export):
    from detens.adapters.ultralytics import UltralyticsDetector

    ours = OnnxDetector(ultralytics_onnx_export, "ultralytics", conf=0.01, iou=0.7, max_det=300)
    theirs = UltralyticsDetector(ultralytics_onnx_export, conf=0.01, iou=0.7, imgsz=320, max_det=300, device="cpu")
    for mine, reference in zip(ours(_asset_images()), theirs(_asset_images()), strict=True):
        assert len(reference) > 50  # the re-drawn weights make plenty of boxes
        assert_same_detections(mine, reference)


YOLO11N_OPENVINO = SHARED_MODELS / "yolo11n_int8_openvino_model" / "yolo11n.xml"


def rebuild_from_openvino(xml: Path, yaml_name: str):
    """An Ultralytics model built from ``yaml_name`` carrying the weights of an Ultralytics OpenVINO export.

    The export keeps PyTorch's module paths in its operation names (``__module.model.0.conv/aten::_convolution/
    Convolution``); each (group) convolution's weight sub-graph (int8 constants, convert, scale) is folded
    by OpenVINO into float weights, and its bias is the constant of the ``Add`` after it. The result is
    the export's network in float (its int8-rounded weights, unquantized activations), batch norms fused."""
    import re

    import openvino as ov
    from ultralytics import YOLO

    core = ov.Core()

    def fold(output):
        return np.array(core.compile_model(ov.Model([output], [], "fold"), "CPU")({})[0])

    params = {}
    for op in core.read_model(xml).get_ordered_ops():
        found = re.fullmatch(r"__module\.(.+)/aten::_convolution/(?:Group)?Convolution", op.get_friendly_name())
        if found is None or op.get_type_name() not in ("Convolution", "GroupConvolution"):
            continue
        params[found.group(1) + ".weight"] = fold(op.input_value(1))
        for target in op.output(0).get_target_inputs():
            add = target.get_node()
            if add.get_type_name() == "Add":
                (bias,) = [add.input_value(i) for i in range(2) if add.input_value(i).get_node() is not op]
                params[found.group(1) + ".bias"] = fold(bias)
    model = YOLO(yaml_name, task="detect")
    model.model.fuse()
    convolutions = [n for n, m in model.model.named_modules() if isinstance(m, torch.nn.Conv2d) and ".dfl" not in n]
    assert not [n for n in convolutions if n + ".weight" not in params], "a convolution is not in the export"
    state = model.model.state_dict()
    folded = {k: torch.from_numpy(v).reshape(state[k].shape).to(state[k].dtype) for k, v in params.items()}
    model.model.load_state_dict({**state, **folded})
    metadata = yaml.safe_load((xml.parent / "metadata.yaml").read_text())
    model.model.names = {int(k): v for k, v in metadata["names"].items()}
    return model


@pytest.fixture(scope="module")
def real_ultralytics_onnx_export(tmp_path_factory):
    """YOLO11n with the shipped OpenVINO export's weights, exported by Ultralytics (``format=onnx``, 640)."""
    if not YOLO11N_OPENVINO.is_file():
        pytest.skip(f"needs {YOLO11N_OPENVINO}")
    pytest.importorskip("onnx", reason="exporting needs the onnx package (pip install onnx)")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("YOLO_AUTOINSTALL", "false")
        monkeypatch.setenv("YOLO_OFFLINE", "1")
        model = rebuild_from_openvino(YOLO11N_OPENVINO, "yolo11n.yaml")
        model.model.pt_path = str(tmp_path_factory.mktemp("yolo11n_export") / "yolo11n_rebuilt.pt")
        return Path(model.export(format="onnx", imgsz=640, simplify=False, dynamic=False, verbose=False))


@needs_shared
@pytest.mark.slow
def test_real_ultralytics_export_on_coco_images(real_ultralytics_onnx_export):
    from detens.adapters.ultralytics import UltralyticsDetector

    chosen = person_images(count=6)
    images = [str(path) for path, _, _ in chosen]
    ours = OnnxDetector(real_ultralytics_onnx_export, "ultralytics", conf=0.001, iou=0.7, max_det=300)
    theirs = UltralyticsDetector(real_ultralytics_onnx_export, conf=0.001, iou=0.7, max_det=300, device="cpu")
    for mine, reference, (_, _, people) in zip(ours(images), theirs(images), chosen, strict=True):
        # both map boxes back with each axis's gain of the rounded resize (426 / 333 rows, not 640 / 500)
        assert_same_detections(mine, reference, box_tol=0.05)
        persons = mine[(mine.labels == 1) & (mine.scores > 0.5)]
        assert box_iou(persons.boxes, people).max() > 0.8  # the real weights find the people
