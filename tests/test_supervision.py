"""supervision interop: ``Detections.to_supervision`` / ``from_supervision`` round trips, a real Ultralytics
result through ``supervision.Detections.from_ultralytics``, and ``detens.fuse`` on ``supervision.Detections``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import detens
from detens.detections import Detections

sv = pytest.importorskip("supervision")

SIZE = (480, 640)
SHARED_MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


def random_detections(seed: int, k: int, size=SIZE, source: str | None = "model") -> Detections:
    g = torch.Generator().manual_seed(seed)
    height, width = size
    xy = torch.rand(k, 2, generator=g) * torch.tensor([width * 0.8, height * 0.8])
    wh = torch.rand(k, 2, generator=g) * torch.tensor([width * 0.2, height * 0.2]) + 1
    labels = torch.randint(1, 91, (k,), generator=g)
    return Detections(torch.cat([xy, xy + wh], 1), torch.rand(k, generator=g), labels, size, source)


def test_importing_and_fusing_without_supervision_does_not_import_it():
    code = (
        "import sys, detens, detens.detections, detens.interop.supervision\n"
        "d = detens.Detections([[0., 0., 5., 5.]], [0.5], [1], (10, 10))\n"
        "detens.fuse([d, d], method='wbf')\n"
        "assert 'supervision' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class TestRoundTrip:
    @pytest.mark.parametrize("k", [0, 1, 57])
    def test_detens_to_supervision_and_back_is_exact(self, k):
        det = random_detections(k, k)
        converted = det.to_supervision()
        assert isinstance(converted, sv.Detections) and len(converted) == k
        assert converted.xyxy.shape == (k, 4) and converted.xyxy.dtype == np.float32
        assert converted.confidence.dtype == np.float32 and converted.class_id.dtype == np.int64
        np.testing.assert_array_equal(converted.xyxy, det.boxes.numpy())
        np.testing.assert_array_equal(converted.confidence, det.scores.numpy())
        np.testing.assert_array_equal(converted.class_id, det.labels.numpy())
        back = Detections.from_supervision(converted, image_size=det.image_size, source=det.source)
        assert back.image_size == det.image_size and back.source == "model"
        assert back.boxes.dtype == torch.float32 and back.labels.dtype == torch.int64
        assert torch.equal(back.boxes, det.boxes)
        assert torch.equal(back.scores, det.scores)
        assert torch.equal(back.labels, det.labels)

    def test_supervision_to_detens_and_back(self):
        original = sv.Detections(
            xyxy=np.array([[10.5, 20.0, 110.0, 220.25], [300.0, 40.0, 380.0, 90.0]], dtype=np.float64),
            confidence=np.array([0.875, 0.25]),
            class_id=np.array([0, 79]),
        )
        det = Detections.from_supervision(original, (480, 640))
        assert det.source is None and det.image_size == (480, 640)
        back = det.to_supervision()
        np.testing.assert_array_equal(back.xyxy, original.xyxy)  # values exact in float32
        np.testing.assert_array_equal(back.confidence, original.confidence)
        np.testing.assert_array_equal(back.class_id, original.class_id)

    @pytest.mark.parametrize(
        "empty",
        [
            pytest.param(lambda: sv.Detections.empty(), id="Detections.empty"),
            pytest.param(lambda: sv.Detections(xyxy=np.zeros((0, 4))), id="no-confidence-no-class-id"),
        ],
    )
    def test_empty_supervision(self, empty):
        det = Detections.from_supervision(empty(), (30, 40), source="m")
        assert len(det) == 0 and det.boxes.shape == (0, 4) and det.image_size == (30, 40)
        assert det.labels.dtype == torch.int64 and det.source == "m"

    def test_empty_detens(self):
        converted = Detections.empty((30, 40)).to_supervision()
        assert len(converted) == 0 and converted.is_empty()
        assert converted.xyxy.shape == (0, 4) and converted.confidence.shape == (0,)
        assert converted.class_id.shape == (0,)

    def test_conversions_copy(self):
        det = random_detections(3, 4)
        boxes = det.boxes.clone()
        converted = det.to_supervision()
        converted.xyxy += 1  # supervision users edit arrays in place
        assert torch.equal(det.boxes, boxes)
        back = Detections.from_supervision(converted, det.image_size)
        converted.xyxy += 1
        assert torch.equal(back.boxes, boxes + 1)

    def test_class_names_fill_data(self):
        det = Detections([[0.0, 0.0, 5.0, 5.0], [1.0, 1.0, 4.0, 4.0]], [0.5, 0.6], [1, 3], (10, 10))
        converted = det.to_supervision(class_names={1: "person", 3: "car", 5: "bus"})
        assert converted.data["class_name"].tolist() == ["person", "car"]
        assert converted[1].data["class_name"].tolist() == ["car"]  # supervision indexes it with the boxes
        assert "class_name" not in det.to_supervision().data
        with pytest.raises(ValueError, match=r"class_names has no name for labels \[3\]"):
            det.to_supervision(class_names={1: "person"})
        as_list = det.to_supervision(class_names=["bg", "person", "bicycle", "car"])  # positions are labels
        assert as_list.data["class_name"].tolist() == ["person", "car"]
        with pytest.raises(TypeError, match="class_names must be keyed by integer labels, got the key '1'"):
            det.to_supervision(class_names={"1": "person", "3": "car"})
        with pytest.raises(TypeError, match="class_names must be a dict"):
            det.to_supervision(class_names="person")

    @pytest.mark.slow
    def test_real_ultralytics_result_through_supervision(self):
        """supervision's own from_ultralytics, then detens: the Results' boxes, scores and class indices."""
        from ultralytics import YOLO
        from ultralytics.utils import ASSETS

        model = YOLO(str(SHARED_MODELS / "yolov8n_int8_tflite" / "yolov8n_int8.tflite"), task="detect")
        result = model(str(ASSETS / "bus.jpg"), verbose=False)[0]
        assert len(result.boxes) > 0
        det = Detections.from_supervision(
            sv.Detections.from_ultralytics(result), image_size=result.orig_shape, source="yolov8n"
        )
        assert det.image_size == (1080, 810)
        torch.testing.assert_close(det.boxes, result.boxes.xyxy.float())
        torch.testing.assert_close(det.scores, result.boxes.conf.float())
        assert det.labels.tolist() == result.boxes.cls.long().tolist()  # class indices, kept as they are


class TestErrors:
    @pytest.mark.parametrize(
        "make, error, fragment",
        [
            (lambda: "boxes", TypeError, "takes a supervision.Detections, got str"),
            (lambda: random_detections(0, 2), TypeError, "takes a supervision.Detections, got Detections"),
            (
                lambda: sv.Detections(xyxy=np.ones((1, 4)), class_id=np.array([1])),
                ValueError,
                r"confidence is None for 1 boxes",
            ),
            (
                lambda: sv.Detections(xyxy=np.ones((2, 4)), confidence=np.array([0.5, 0.5])),
                ValueError,
                r"class_id is None for 2 boxes",
            ),
            (
                lambda: sv.Detections(
                    xyxy=np.ones((1, 4)), confidence=np.array([1.5]), class_id=np.array([1])
                ),
                ValueError,
                r"scores\[0\] = 1.5 is outside \[0, 1\]",
            ),
            (
                lambda: sv.Detections(
                    xyxy=np.ones((1, 4)), confidence=np.array([0.5]), class_id=np.array([-1])
                ),
                ValueError,
                r"labels\[0\] = -1 is not an integer class id in \[0, 2147483647\]",
            ),
        ],
    )
    def test_from_supervision_rejects(self, make, error, fragment):
        with pytest.raises(error, match=fragment):
            Detections.from_supervision(make(), (10, 10))

    @pytest.mark.parametrize("image_size", [(10,), (0, 10), "10x10"])
    def test_bad_image_size(self, image_size):
        with pytest.raises(ValueError, match="image_size"):
            Detections.from_supervision(sv.Detections.empty(), image_size)

    def test_to_supervision_rejects_other_objects(self):
        from detens.interop.supervision import to_supervision

        with pytest.raises(TypeError, match="takes a detens Detections, got dict"):
            to_supervision({"boxes": []})


class TestFuse:
    @pytest.mark.parametrize("method", ["wbf", "nms", "soft_nms", "mean", "vote"])
    def test_supervision_in_supervision_out(self, method):
        a = random_detections(0, 30, source=None)
        b = Detections(a.boxes + 2, a.scores * 0.9, a.labels, SIZE)
        expected = detens.fuse([a, b], method=method)
        assert len(expected) > 0
        fused = detens.fuse([a.to_supervision(), b.to_supervision()], method=method, image_size=SIZE)
        assert isinstance(fused, sv.Detections)
        np.testing.assert_array_equal(fused.xyxy, expected.boxes.numpy())
        np.testing.assert_array_equal(fused.confidence, expected.scores.numpy())
        np.testing.assert_array_equal(fused.class_id, expected.labels.numpy())

    def test_mixed_input_gives_detections(self):
        a = random_detections(1, 5, source="a")
        fused = detens.fuse([a, a.to_supervision()], image_size=SIZE)
        assert isinstance(fused, Detections)
        expected = detens.fuse([a, a.with_source(None)])
        assert torch.equal(fused.boxes, expected.boxes) and torch.equal(fused.scores, expected.scores)

    def test_class_names_are_kept(self):
        a = Detections([[10.0, 20.0, 110.0, 220.0]], [0.9], [0], SIZE)
        b = Detections([[12.0, 20.0, 110.0, 221.0], [300.0, 300.0, 400.0, 400.0]], [0.8, 0.5], [0, 2], SIZE)
        named_a = a.to_supervision({0: "person"})
        fused = detens.fuse([named_a, b.to_supervision({0: "person", 2: "car"})], image_size=SIZE)
        names = dict(zip(fused.class_id.tolist(), fused.data["class_name"].tolist(), strict=True))
        assert names == {0: "person", 2: "car"} and len(fused) == 2
        # names are kept only when every input names its boxes
        assert "class_name" not in detens.fuse([named_a, b.to_supervision()], image_size=SIZE).data
        with pytest.raises(ValueError, match=r"class_id 0 is 'person' in per_model\[0\] and 'cat' in per_model\[1\]"):
            detens.fuse([named_a, a.to_supervision({0: "cat"})], image_size=SIZE)
        # Ultralytics' class index of person (0) beside COCO's category id (1): each object would come out twice
        coco_ids = Detections(a.boxes + 1, a.scores, a.labels + 1, SIZE).to_supervision({1: "person"})
        with pytest.raises(ValueError, match=r"^class 'person' is class_id 0 in per_model\[0\] and 1 in per_model\[1\]: "
                                             r"fuse detections of one label space \(map the ids first: Ultralytics' "
                                             r"class indices, where person is 0, are not COCO's category ids"):
            detens.fuse([named_a, coco_ids], image_size=SIZE)
        with pytest.raises(ValueError, match=r"^class 'car' is class_id 3 in per_model\[0\] and 2 in per_model\[0\]"):
            car_twice = Detections(b.boxes, b.scores, torch.tensor([3, 2]), SIZE).to_supervision({3: "car", 2: "car"})
            detens.fuse([car_twice, car_twice], image_size=SIZE)

    def test_the_class_names_they_carry_check_a_head(self):
        from detens.heads.deep import DeepEnsembleHead

        a = Detections([[10.0, 20.0, 110.0, 220.0]], [0.9], [0], SIZE)
        b = Detections([[12.0, 20.0, 110.0, 221.0], [300.0, 300.0, 400.0, 400.0]], [0.8, 0.5], [0, 2], SIZE)
        head = DeepEnsembleHead(["a", "b"], class_ids=[0, 2, 5], class_embed=2, hidden=4, depth=1)
        head.label_space = {0: "cat", 2: "car", 5: "bus"}
        names = {0: "person", 2: "car"}
        with pytest.raises(ValueError, match=r"^the head was trained on a label space whose category ids name other "
                                             r"classes than in the detections' class names: 0 is 'cat' in the head "
                                             r"but 'person' there;.*Ultralytics class indices 0-79 for COCO's "
                                             r"category ids\), map their labels to the head's ids first; else "
                                             r"train one"):
            detens.fuse([a.to_supervision({0: "person"}), b.to_supervision(names)], "deep", head=head, image_size=SIZE,
                        model_names=["a", "b"])
        # they name the classes of this image only: the head's class 5, absent here, is no reason to refuse it
        head.label_space = {0: "Person", 2: "car", 5: "bus"}
        fused = detens.fuse([a.to_supervision({0: "person"}), b.to_supervision(names)], "deep", head=head,
                            image_size=SIZE, model_names=["a", "b"])
        assert isinstance(fused, sv.Detections) and len(fused) == 2
        # a label_space given is the whole label space, and is what is checked
        with pytest.raises(ValueError, match=r"category ids 5, which are not among the 2 category ids of label_space"):
            detens.fuse([a.to_supervision(), b.to_supervision()], "deep", head=head, image_size=SIZE, label_space=names,
                        model_names=["a", "b"])

    def test_a_head_of_several_models_needs_their_names(self, lopsided_theta_head):
        """supervision.Detections carry no model name: in the head's own order, each model's weights would go
        to another model's boxes."""
        a = Detections([[10.0, 20.0, 110.0, 220.0], [50.0, 60.0, 90.0, 100.0]], [0.9, 0.4], [0, 1], SIZE)
        b = Detections([[12.0, 20.0, 110.0, 221.0], [300.0, 300.0, 400.0, 400.0]], [0.8, 0.5], [0, 2], SIZE)
        head, path = lopsided_theta_head(["a", "b"])
        for given in (head, path):
            with pytest.raises(ValueError, match=r"^the head is for models \['a', 'b'\], and supervision.Detections "
                                                 r"carry no model name: pass model_names=\[\.\.\.\]"):
                detens.fuse([b.to_supervision(), a.to_supervision()], "theta", head=given, image_size=SIZE)
        fused = detens.fuse([b.to_supervision(), a.to_supervision()], "theta", head=head, image_size=SIZE,
                            model_names=["b", "a"])
        expected = detens.fuse([b.with_source("b"), a.with_source("a")], "theta", head=head)
        np.testing.assert_allclose(fused.xyxy, expected.boxes.numpy(), rtol=1e-6)
        np.testing.assert_allclose(fused.confidence, expected.scores.numpy(), rtol=1e-6)
        assert not np.allclose(  # in the head's order the weights would have gone to the other model's boxes
            detens.fuse([b.with_source("a"), a.with_source("b")], "theta", head=head).boxes.numpy(), fused.xyxy)

    @pytest.mark.parametrize("names, error, message", [
        ("ab", TypeError, r"model_names must be a list with one name per model, got str: 'ab'"),
        (["a"], ValueError, r"model_names names 1 models but per_model holds 2"),
        (["a", "c"], ValueError, r"per_model\[1\] comes from 'b', but model_names\[1\] is 'c'"),
    ])
    def test_model_names_must_name_each_model(self, names, error, message):
        a = Detections([[10.0, 20.0, 110.0, 220.0]], [0.9], [0], SIZE, source="a")
        b = Detections([[12.0, 20.0, 110.0, 221.0]], [0.8], [0], SIZE, source="b")
        with pytest.raises(error, match=message):
            detens.fuse([a, b], "wbf", model_names=names)
        assert detens.fuse([a, b], "wbf", model_names=["a", "b"]).boxes.shape == (1, 4)

    def test_all_empty(self):
        fused = detens.fuse([sv.Detections.empty(), sv.Detections.empty()], image_size=(20, 30))
        assert isinstance(fused, sv.Detections) and len(fused) == 0

    def test_frame_shape_as_image_size(self):
        frame = np.zeros((*SIZE, 3), np.uint8)
        a = random_detections(2, 4).to_supervision()
        fused = detens.fuse([a, a], image_size=frame.shape[:2])
        assert len(fused) == 4
        annotated = sv.BoxAnnotator().annotate(frame.copy(), fused)  # supervision takes the answer as is
        assert annotated.shape == frame.shape and annotated.any()

    def test_errors(self):
        a = random_detections(0, 3)
        with pytest.raises(ValueError, match=r"per_model\[1\] is a supervision.Detections.*pass image_size="):
            detens.fuse([a, a.to_supervision()])
        with pytest.raises(
            ValueError, match=r"image_size=\(10, 12\) but the Detections are of a \(480, 640\)"
        ):
            detens.fuse([a, a], image_size=(10, 12))
        with pytest.raises(ValueError, match="disagree on the image size"):
            detens.fuse([a, a.to_supervision()], image_size=(1000, 1000))

    def test_an_image_size_of_width_and_height_is_refused_not_clipped_to(self):
        """A landscape frame's (width, height) given as (height, width): boxes on its right would be cut to
        nothing at the new width, and the rest clipped, without a word."""
        frame_boxes = detens.Detections(
            torch.tensor([[10.0, 20.0, 60.0, 90.0], [500.0, 100.0, 630.0, 300.0]]), torch.tensor([0.9, 0.8]),
            torch.tensor([1, 2]), (480, 640),
        ).to_supervision()
        assert len(detens.fuse([frame_boxes, frame_boxes], image_size=(480, 640))) == 2
        with pytest.raises(ValueError) as swapped:
            detens.fuse([frame_boxes, frame_boxes], image_size=(640, 480))
        assert str(swapped.value) == (
            "per_model[0] (a supervision.Detections: its xyxy are the boxes, confidence the scores, class_id the "
            "labels): box 1 [500.0, 100.0, 630.0, 300.0] starts beyond the 480x640 (width x height) image that "
            "image_size=(640, 480) gives; image_size is (height, width) of the image the boxes were found on, e.g. "
            "image.shape[:2]"
        )
        portrait = detens.Detections(torch.tensor([[10.0, 20.0, 300.0, 600.0]]), torch.tensor([0.9]),
                                     torch.tensor([1]), (640, 480)).to_supervision()
        with pytest.raises(ValueError, match=r"box 0 \[10\.0, 20\.0, 300\.0, 600\.0\] ends past the 640x480 \(width x "
                                             r"height\) image that image_size=\(480, 640\) gives"):
            detens.fuse([portrait, portrait], image_size=(480, 640))

    @pytest.mark.parametrize("field, value, message", [
        ("class_id", [2.5, 1, 1], r"labels\[0\] = 2.5 is not an integer"),
        ("confidence", [1.5, 0.5, 0.5], r"scores\[0\] = 1.5 is outside \[0, 1\]"),
        ("xyxy", [[10.0, 2.0, 1.0, 20.0]] * 3, r"boxes\[0\] = \[10.0, 2.0, 1.0, 20.0\] has x2 < x1"),
    ])
    def test_a_bad_input_is_named_with_supervision_s_field_names(self, field, value, message):
        good = random_detections(0, 3).to_supervision()
        bad = random_detections(1, 3).to_supervision()
        setattr(bad, field, np.array(value, dtype=np.float32 if field != "class_id" else np.float64))
        prefix = r"per_model\[1\] \(a supervision.Detections: its xyxy are the boxes, confidence the scores, class_id the labels\): "
        with pytest.raises(ValueError, match=prefix + r"Detections\." + message):
            detens.fuse([good, bad], image_size=(480, 640))
