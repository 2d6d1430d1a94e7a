"""detens inside existing pipelines: conversions, fuse_results (real Ultralytics models), TorchvisionFusion
(real torchvision architectures) and Ensemble."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import detens
from detens.convert import (
    coco_category_ids_for,
    detections_to_results,
    detections_to_torchvision,
    invert_category_ids,
    results_to_detections,
    torchvision_to_detections,
)
from detens.detections import Detections
from detens.labels import COCO_CATEGORY_IDS, COCO_ID_TO_NAME, COCO_NAMES
from detens.pipeline import Ensemble, TorchvisionFusion, fuse_results

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MODELS = {
    "yolov8n_int8": SHARED / "models" / "yolov8n_int8_tflite" / "yolov8n_int8.tflite",
    "yolo11n_int8": SHARED / "models" / "yolo11n_int8_openvino_model",
}
COCO_IMAGES = SHARED / "data" / "coco_val2017_206" / "images"
COCO80 = dict(enumerate(COCO_NAMES))
METHOD = "wbf"


def make_results(boxes, conf, cls, shape=(480, 640), path="image0.jpg", names=None):
    """A real Ultralytics Results built from tensors, as a model's postprocess builds it."""
    from ultralytics.engine.results import Results

    data = torch.cat(
        [
            torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 4),
            torch.as_tensor(conf, dtype=torch.float32)[:, None],
            torch.as_tensor(cls, dtype=torch.float32)[:, None],
        ],
        dim=1,
    )
    image = np.zeros((*shape, 3), dtype=np.uint8)
    return Results(orig_img=image, path=path, names=COCO80 if names is None else names, boxes=data)


def random_boxes(seed, k, shape=(480, 640)):
    g = torch.Generator().manual_seed(seed)
    height, width = shape
    xy = torch.rand(k, 2, generator=g) * torch.tensor([width * 0.8, height * 0.8])
    wh = torch.rand(k, 2, generator=g) * torch.tensor([width * 0.2, height * 0.2]) + 1
    return torch.cat([xy, xy + wh], 1), torch.rand(k, generator=g), torch.randint(0, 80, (k,), generator=g)


#: A dataset's own classes, whose ids are COCO's person and bicycle.
OWN_CLASSES = {1: "vehicle", 2: "dog"}


def per_class_head(label_space: dict[int, str]) -> detens.ThetaHead:
    """A Θ head of models a and b with per-class parameters for the ids of ``label_space``, which it records
    as the label space it was trained on."""
    head = detens.ThetaHead(["a", "b"], per_class=True, class_ids=sorted(label_space))
    head.label_space = dict(label_space)
    return head


def trained_on_other_classes(label_space: str) -> str:
    """The start of the refusal of a head of :data:`OWN_CLASSES` in COCO's ids, which ``label_space`` (a
    regular expression) names."""
    return (r"^the head was trained on a label space whose category ids name other classes than in "
            rf"{label_space}: 1 is 'vehicle' in the head but 'person' there")


# ------------------------------------------------------------------------------------------ conversions
class TestConversions:
    @pytest.mark.parametrize("seed", range(4))
    def test_results_round_trip_is_exact(self, seed):
        boxes, conf, cls = random_boxes(seed, 30)
        result = make_results(boxes, conf, cls)
        det = results_to_detections(result, COCO_CATEGORY_IDS, source="m")
        assert det.image_size == (480, 640) and det.source == "m"
        assert torch.equal(det.boxes, boxes) and torch.equal(det.scores, conf)
        assert torch.equal(det.labels, torch.tensor(COCO_CATEGORY_IDS)[cls])
        back = detections_to_results(det, result, COCO_CATEGORY_IDS)
        assert torch.equal(back.boxes.data, result.boxes.data)
        assert (
            back.orig_shape == result.orig_shape and back.path == result.path and back.names == result.names
        )

    def test_results_class_indices_kept_without_map(self):
        boxes, conf, cls = random_boxes(9, 5)
        det = results_to_detections(make_results(boxes, conf, cls))
        assert torch.equal(det.labels, cls)

    def test_results_empty(self):
        result = make_results(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0))
        det = results_to_detections(result, COCO_CATEGORY_IDS)
        assert len(det) == 0 and det.image_size == (480, 640)
        assert detections_to_results(det, result, COCO_CATEGORY_IDS).boxes.data.shape == (0, 6)

    def test_results_errors(self):
        result = make_results(*random_boxes(1, 3))
        with pytest.raises(ValueError, match="no entry in category_ids"):
            results_to_detections(result, COCO_CATEGORY_IDS[:2])
        det = Detections([[0.0, 0.0, 5.0, 5.0]], [0.5], [1], (10, 10))
        with pytest.raises(ValueError, match="size"):
            detections_to_results(det, result)
        det = Detections([[0.0, 0.0, 5.0, 5.0]], [0.5], [12], (480, 640))  # 12 is not a COCO category id
        with pytest.raises(ValueError, match=r"labels \[12\]"):
            detections_to_results(det, result, COCO_CATEGORY_IDS)
        # the Results' float32 data would hold 2**24 for 2**24 + 1: another class, with no error
        large = make_results(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0), names={0: "a", 2**24 + 1: "z"})
        det = Detections([[0.0, 0.0, 5.0, 5.0]], [0.5], [2**24 + 1], (480, 640))
        with pytest.raises(ValueError, match=r"class index 16777217 is above 16777216: .* as float32 numbers"):
            detections_to_results(det, large)
        # float16 holds whole numbers up to 2048 exactly
        det = Detections([[0.0, 0.0, 5.0, 5.0]], [0.5], [2049], (480, 640))
        half = make_results(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0), names={0: "a", 2049: "z"})
        with pytest.raises(ValueError, match=r"class index 2049 is above 2048: .* as float16 numbers"):
            detections_to_results(det, half, dtype=torch.float16)
        assert detections_to_results(det, half).boxes.cls.tolist() == [2049.0]
        with pytest.raises(TypeError, match="dtype must be a floating torch.dtype, got torch.int64"):
            detections_to_results(det, half, dtype=torch.int64)

    @pytest.mark.parametrize("cls", [2.5, -1.0, float("nan")])
    def test_results_class_index_must_be_a_whole_number(self, cls):
        # 2.4 or 2.5 was rounded to class 2 without a word
        result = make_results([[0.0, 0.0, 5.0, 5.0], [1.0, 1.0, 6.0, 6.0]], [0.5, 0.6], [1.0, cls])
        with pytest.raises(ValueError, match=f"box 1 has class index {cls}; class indices are integers >= 0"):
            results_to_detections(result)
        with pytest.raises(ValueError, match="box 1 has class index"):
            fuse_results([[result], [result]])

    @pytest.mark.parametrize(
        "category_ids, error, fragment",
        [
            ([1, 2.5, 3], ValueError, r"category_ids\[1\] must be a whole number, got 2.5"),
            (np.array([1.0, 2.0, 3.5]), ValueError, r"category_ids\[2\] must be a whole number, got 3.5"),
            ({0: 1, 1: 2.5, 2: 3}, ValueError, r"category_ids\[1\] must be a whole number, got 2.5"),
            ({0: 1, 1.5: 2, 2: 3}, ValueError, r"category_ids key must be a whole number, got 1.5"),
            ([1, float("nan"), 3], ValueError, r"category_ids\[1\] must be a whole number, got nan"),
            ([1, -2, 3], ValueError, r"category_ids\[1\] must be an integer in \[0, 2147483647\], got -2"),
            ([1, 2**31, 3], ValueError, r"category_ids\[1\] must be an integer in \[0, 2147483647\]"),
            ({-1: 1, 0: 2}, ValueError, r"category_ids key must be an integer >= 0, got -1"),
            ([1, "2", 3], TypeError, r"category_ids\[1\] must be an integer, got str: '2'"),
            ([1, True, 3], TypeError, r"category_ids\[1\] must be an integer, got bool"),
            ("123", TypeError, "category_ids must be a list of category ids"),
        ],
    )
    def test_category_ids_that_are_no_whole_numbers_are_named(self, category_ids, error, fragment):
        """2.5 was truncated to the id 2 without a word; ids follow the label rules of Detections."""
        result = make_results([[0.0, 0.0, 5.0, 5.0], [1.0, 1.0, 6.0, 6.0]], [0.5, 0.6], [0.0, 2.0])
        det = Detections([[0.0, 0.0, 5.0, 5.0]], [0.5], [1], (480, 640))
        for call in (lambda: results_to_detections(result, category_ids), lambda: invert_category_ids(category_ids),
                     lambda: detections_to_results(det, result, category_ids)):
            with pytest.raises(error, match=fragment):
                call()

    @pytest.mark.parametrize(
        "category_ids",
        [
            [7.0, 1.0, 90.0],  # whole floats, as Detections takes labels
            np.array([7, 1, 90], dtype=">i8"),
            np.array([7.0, 1.0, 90.0], dtype=np.float32),
            torch.tensor([7, 1, 90]),
            {0: np.int64(7), np.int32(1): 1, 2.0: 90},
            {10**12: 5, 0: 7, 1: 1, 2: 90},  # a class index far beyond the others needs no table that long
        ],
    )
    def test_category_ids_map_like_a_plain_loop(self, category_ids):
        classes = [2.0, 0.0, 1.0, 2.0]
        result = make_results([[0.0, 0.0, 5.0, 5.0]] * 4, [0.5, 0.6, 0.7, 0.8], classes)
        pairs = category_ids.items() if isinstance(category_ids, dict) else enumerate(category_ids)
        table = {int(index): int(label) for index, label in pairs}
        det = results_to_detections(result, category_ids)
        assert det.labels.dtype == torch.int64 and det.labels.tolist() == [table[int(c)] for c in classes]
        back = detections_to_results(det, result, category_ids)
        assert torch.equal(back.boxes.data, result.boxes.data)

    def test_results_as_big_endian_numpy(self):
        """Results.numpy() of boxes in the other byte order: the same detections as the native ones."""
        result = make_results(*random_boxes(3, 6))
        native = results_to_detections(result, COCO_CATEGORY_IDS)
        flipped = result.numpy()
        flipped.boxes.data = flipped.boxes.data.astype(">f4")
        det = results_to_detections(flipped, COCO_CATEGORY_IDS)
        for name in ("boxes", "scores", "labels"):
            assert torch.equal(getattr(det, name), getattr(native, name)), name

    def test_coco_category_ids_only_for_coco_names(self):
        assert coco_category_ids_for(COCO80) == COCO_CATEGORY_IDS
        assert coco_category_ids_for({0: "cat", 1: "dog"}) is None
        assert coco_category_ids_for(dict(enumerate(reversed(COCO_NAMES)))) is None

    @pytest.mark.parametrize("category_ids", [COCO_CATEGORY_IDS, list(COCO_CATEGORY_IDS), {3: 7, 0: 1, 9: 2}, []])
    def test_invert_category_ids_matches_a_plain_loop(self, category_ids):
        pairs = category_ids.items() if isinstance(category_ids, dict) else enumerate(category_ids)
        expected = {}
        for index, label in pairs:
            expected[label] = index
        assert invert_category_ids(category_ids) == expected

    def test_invert_category_ids_refuses_two_classes_for_one_label(self):
        with pytest.raises(ValueError, match="category_ids maps classes 3 and 9 to one label 7"):
            invert_category_ids({3: 7, 9: 7})

    @pytest.mark.parametrize("k", [0, 1, 57])
    def test_torchvision_round_trip_is_exact(self, k):
        boxes, scores, labels = random_boxes(k, k)
        output = {"boxes": boxes, "scores": scores, "labels": labels + 1}
        det = torchvision_to_detections(output, torch.Size([480, 640]), source="frcnn")
        assert det.image_size == (480, 640) and det.source == "frcnn"
        back = detections_to_torchvision(det)
        assert set(back) == {"boxes", "scores", "labels"}
        for key in back:
            assert back[key].dtype == output[key].dtype and torch.equal(back[key], output[key]), key

    @pytest.mark.parametrize(
        "args, error, message",
        [((torch.int32,), TypeError, "dtype must be a floating torch.dtype"),  # would turn every score into 0
         (("float16",), TypeError, "dtype must be a floating torch.dtype"),
         ((torch.float16,), None, None)],
    )
    def test_detections_to_torchvision_dtype(self, args, error, message):
        det = torchvision_to_detections(
            {"boxes": torch.tensor([[1.0, 2, 30, 40]]), "scores": torch.tensor([0.9]), "labels": torch.tensor([3])}, (48, 64)
        )
        if error is None:
            back = detections_to_torchvision(det, *args)
            assert back["boxes"].dtype == back["scores"].dtype == args[0]
            assert back["scores"].tolist() == pytest.approx([0.9], abs=1e-3)
        else:
            with pytest.raises(error, match=message):
                detections_to_torchvision(det, *args)
        with pytest.raises(TypeError, match="det must be Detections, got dict"):
            detections_to_torchvision({"boxes": det.boxes})

    def test_torchvision_errors(self):
        with pytest.raises(ValueError, match=r"lacks \['labels'\]"):
            torchvision_to_detections({"boxes": torch.zeros(0, 4), "scores": torch.zeros(0)}, (4, 4))
        empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)}
        with pytest.raises(ValueError, match=r"got shape \[480, 640, 3\], which looks like \[H, W, C\]"):
            torchvision_to_detections(empty, torch.zeros(480, 640, 3))

    @pytest.mark.parametrize("image, size", [
        (torch.zeros(3, 480, 640), (480, 640)),
        (torch.zeros(2, 1, 480, 640), (480, 640)),
        (torch.zeros(480, 640), (480, 640)),
        (torch.zeros(3, 100, 3), (100, 3)),  # a narrow image, channels first
        (np.zeros((480, 640, 3), np.uint8), (480, 640)),
    ])
    def test_image_size_from_an_image(self, image, size):
        empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)}
        assert torchvision_to_detections(empty, image).image_size == size


# ---------------------------------------------------------------------------------------- Ultralytics
@pytest.fixture(scope="module")
def yolo_models():
    from ultralytics import YOLO

    for path in MODELS.values():
        assert path.exists(), f"shared model missing: {path}"
    return {name: YOLO(str(path), task="detect") for name, path in MODELS.items()}


@pytest.fixture(scope="module")
def yolo_results(yolo_models):
    from ultralytics.utils import ASSETS

    images = [str(ASSETS / "bus.jpg"), str(ASSETS / "zidane.jpg")]
    return [model(images, verbose=False) for model in yolo_models.values()]


@pytest.mark.slow
class TestFuseResults:
    def test_equals_detens_fuse_and_keeps_working(self, yolo_results, tmp_path):
        fused = fuse_results(yolo_results, method=METHOD, iou_thr=0.55, model_names=list(MODELS))
        assert len(fused) == 2
        for b, result in enumerate(fused):
            first = yolo_results[0][b]
            per_model = [
                results_to_detections(r[b], COCO_CATEGORY_IDS, source=n)
                for r, n in zip(yolo_results, MODELS, strict=True)
            ]
            assert all(len(d) for d in per_model), "the models find objects in the bundled images"
            expected = detens.fuse(per_model, method=METHOD, iou_thr=0.55)
            assert len(expected) > 0
            assert torch.equal(result.boxes.xyxy, expected.boxes)
            assert torch.equal(result.boxes.conf, expected.scores)
            expected_cls = torch.tensor(
                [COCO_CATEGORY_IDS.index(int(c)) for c in expected.labels], dtype=torch.float32
            )
            assert torch.equal(result.boxes.cls, expected_cls)
            assert (
                result.names == first.names
                and result.path == first.path
                and result.orig_shape == first.orig_shape
            )

            image = result.plot()
            assert (
                isinstance(image, np.ndarray)
                and image.shape == first.orig_img.shape
                and image.dtype == np.uint8
            )
            assert not np.array_equal(image, first.orig_img)  # boxes were drawn
            txt = Path(result.save_txt(tmp_path / f"{b}.txt", save_conf=True))
            assert len(txt.read_text().splitlines()) == len(expected)
            rows = json.loads(result.to_json())
            assert [row["name"] for row in rows] == [first.names[int(c)] for c in expected_cls]

        names = {fused[0].names[int(c)] for c in fused[0].boxes.cls}
        assert {"bus", "person"} <= names  # bus.jpg: a bus and people

    def test_an_image_read_from_its_file_by_one_model_and_given_as_an_array_to_another(self, yolo_models):
        import cv2
        from ultralytics.utils import ASSETS

        path = str(ASSETS / "bus.jpg")
        first, second = yolo_models.values()
        from_file, from_array = first(path, verbose=False), second(cv2.imread(path), verbose=False)
        assert from_array[0].path == "image0.jpg"  # Ultralytics' name for an array
        fused = fuse_results([from_file, from_array], method=METHOD, model_names=list(MODELS))
        both_from_file = fuse_results([from_file, second(path, verbose=False)], method=METHOD, model_names=list(MODELS))
        assert fused[0].path == path and torch.equal(fused[0].boxes.data, both_from_file[0].boxes.data)

    def test_errors(self, yolo_results):
        a, b = yolo_results
        with pytest.raises(ValueError, match=r"different numbers of Results \[2, 1\]"):
            fuse_results([a, b[:1]], method=METHOD)
        with pytest.raises(ValueError, match="different images"):
            fuse_results([a, b[::-1]], method=METHOD)
        with pytest.raises(ValueError, match="unknown fusion method 'wfb'"):
            fuse_results([a, b], method="wfb")
        with pytest.raises(TypeError, match="takes no parameter \\['iou_threshold'\\]"):
            fuse_results([a, b], method=METHOD, iou_threshold=0.5)
        with pytest.raises(ValueError, match="model_names has 1 names for 2 models"):
            fuse_results([a, b], method=METHOD, model_names=["x"])
        assert fuse_results([[], []], method=METHOD) == []
        # no image to fuse checks the values as a call with images does: a mistake is not found later
        for options, message in (({"iou_thr": 5}, r"iou_thr must be in \[0, 1\), got 5"),
                                 ({"max_det": 0}, "max_det must be an integer >= 1, got 0")):
            with pytest.raises(ValueError, match=message):
                fuse_results([[], []], method=METHOD, **options)
            with pytest.raises(ValueError, match=message):
                fuse_results([a, b], method=METHOD, **options)
        with pytest.raises(ValueError, match=r"^the head was trained for 3 models \['yolov8n', 'yolo11n', 'yolo26n'\] but 2 "
                                             r"lists of Results were given: pass one per model of the head, with "
                                             r"model_names=\[\.\.\.\] naming them in that order$"):
            fuse_results([[], []], method="theta", head="coco_yolo3_theta")
        with pytest.raises(ValueError, match=r"^the head was trained for 3 models .* but 2 lists of Results were given"):
            fuse_results([a, b], method="deep", head="coco_yolo3_deep")


class TestFuseResultsSynthetic:
    def test_a_head_of_several_models_needs_their_names(self, lopsided_theta_head):
        """Results carry no model name: in the head's own order, each model's weights would go to another
        model's boxes (the shipped heads store their models sorted, not in the configs' order)."""
        r1 = make_results(*random_boxes(0, 5))
        r2 = make_results(*random_boxes(1, 5))
        head, path = lopsided_theta_head(["m1", "m2"])
        for given in (head, path):
            with pytest.raises(ValueError, match=r"^the head is for models \['m1', 'm2'\], and Ultralytics Results carry "
                                                 r"no model name: pass model_names=\[\.\.\.\]"):
                fuse_results([[r1], [r2]], method="theta", head=given)
        fused = fuse_results([[r1], [r2]], method="theta", head=head, model_names=["m2", "m1"])[0]
        d1, d2 = (results_to_detections(r) for r in (r1, r2))
        expected = detens.fuse([d2.with_source("m1"), d1.with_source("m2")], method="theta", head=head)
        torch.testing.assert_close(fused.boxes.xyxy, expected.boxes)
        torch.testing.assert_close(fused.boxes.conf, expected.scores)
        # a calibration head is placed by the same names
        from detens.heads import CalibrationHead

        with pytest.raises(ValueError, match=r"^the calibration is for models \['m1', 'm2'\]"):
            fuse_results([[r1], [r2]], method="wbf", calibration=CalibrationHead(["m1", "m2"]))
        # one model's head is no question of order
        assert len(fuse_results([[r1]], method="theta", head=detens.ThetaHead(["m1"]))[0]) == 5

    def test_half_precision_results_give_half_precision_fused_results(self):
        """As a half-precision model's own Results, and as TorchvisionFusion keeps the models' dtype."""
        full = [make_results(*random_boxes(seed, 6)) for seed in (0, 1)]
        half = [make_results(*random_boxes(seed, 6)) for seed in (0, 1)]
        for r in half:
            r.boxes.data = r.boxes.data.half()
        fused_full = fuse_results([[r] for r in full], method=METHOD)[0]
        fused_half = fuse_results([[r] for r in half], method=METHOD)[0]
        assert fused_full.boxes.data.dtype == torch.float32 and fused_half.boxes.data.dtype == torch.float16
        assert len(fused_half) == len(fused_full) > 0
        # fused from the half-precision values, then rounded to float16
        torch.testing.assert_close(fused_half.boxes.xyxy.float(), fused_full.boxes.xyxy, atol=0.5, rtol=2e-3)
        assert fused_half.boxes.cls.tolist() == fused_full.boxes.cls.tolist()

    def test_different_images_of_one_size_in_another_order_are_refused(self):
        """In-memory images are named image0.jpg, image1.jpg, ... by their place in the batch: two images of
        one size given to the models in different orders share names, not pixels."""
        first, second = make_results(*random_boxes(0, 3)), make_results(*random_boxes(1, 3))
        second.orig_img = second.orig_img + 1  # another image of the same size, under the same name
        with pytest.raises(ValueError, match=r"^image 0: the models' Results are of different images of one size, "
                                             r"each named 'image0.jpg'"):
            fuse_results([[first], [second]], method=METHOD)
        same = make_results(*random_boxes(1, 3))  # the same pixels in another array: one image
        assert len(fuse_results([[first], [same]], method=METHOD)) == 1

    def test_one_image_as_a_file_to_one_model_and_as_an_array_to_another_is_one_image(self):
        """Ultralytics names an array ``image0.jpg``: the same pixels are the same image, named by its file."""
        from_file = make_results(*random_boxes(0, 3), path="photos/bus.jpg")
        from_array = make_results(*random_boxes(1, 3), path="image0.jpg")
        for column in ([from_file, from_array], [from_array, from_file]):
            fused = fuse_results([[r] for r in column], method=METHOD)[0]
            assert fused.path == "photos/bus.jpg" and len(fused.boxes) == len(
                detens.fuse([results_to_detections(r) for r in column], METHOD))
        other_pixels = make_results(*random_boxes(1, 3), path="image0.jpg")
        other_pixels.orig_img = other_pixels.orig_img + 1
        without_pixels = make_results(*random_boxes(1, 3), path="image0.jpg")
        without_pixels.orig_img = None
        another_file = make_results(*random_boxes(1, 3), path="photos/car.jpg")
        for odd in (other_pixels, without_pixels):
            with pytest.raises(ValueError, match=r"describe different images .*path \['photos/bus.jpg', 'image0.jpg'\]"):
                fuse_results([[from_file], [odd]], method=METHOD)
        with pytest.raises(ValueError, match=r"describe different images"):  # two files: never one image
            fuse_results([[from_file], [from_array], [another_file]], method=METHOD)

    def test_results_of_another_task_are_named_so(self):
        from ultralytics.engine.results import Results

        detected = make_results(*random_boxes(0, 3))
        classified = Results(orig_img=detected.orig_img, path="image0.jpg", names=COCO80, probs=torch.rand(80))
        with pytest.raises(TypeError, match=r"^per_model_results\[1\]\[0\] is not an Ultralytics detection Results: "
                                            r"Results \(it holds probs and no boxes: the Results of a model of another "
                                            r"task\)$"):
            fuse_results([[detected], [classified]], method=METHOD)
        with pytest.raises(TypeError, match=r"^per_model_results\[1\]\[0\] is not an Ultralytics detection Results: "
                                            r"dict$"):
            fuse_results([[detected], [{"boxes": None}]], method=METHOD)
        # the one-image converter says the same of what is no Results, and names a Results of another task
        with pytest.raises(TypeError, match=r"^results_to_detections needs an Ultralytics Results, got NoneType$"):
            results_to_detections(None)
        with pytest.raises(TypeError, match=r"^results_to_detections needs a detection Results with \.boxes; got a "
                                            r"non-detection Results$"):
            results_to_detections(classified)

    def test_same_image_different_path(self):
        r1 = make_results(*random_boxes(0, 3), path="a.jpg")
        r2 = make_results(*random_boxes(1, 3), path="b.jpg")
        with pytest.raises(ValueError, match=r"path \['a.jpg', 'b.jpg'\]"):
            fuse_results([[r1], [r2]], method=METHOD)

    def test_different_class_names(self):
        r1 = make_results(*random_boxes(0, 3))
        r2 = make_results(*random_boxes(1, 3), names={**COCO80, 0: "pedestrian"})
        with pytest.raises(
            ValueError,
            match=r"different class names: only in model 0: \['person'\], only in model 1: \['pedestrian'\]",
        ):
            fuse_results([[r1], [r2]], method=METHOD)

    def test_classes_are_matched_by_name(self):
        # Model 2 numbers the same classes in reverse order: its class 79 is model 1's class 0.
        boxes = torch.tensor([[10.0, 10.0, 100.0, 200.0], [300.0, 50.0, 400.0, 150.0]])
        r1 = make_results(boxes, [0.9, 0.8], [0, 5])
        reversed_names = {79 - i: name for i, name in COCO80.items()}
        r2 = make_results(boxes + 2, [0.7, 0.6], [79, 74], names=reversed_names)
        fused = fuse_results([[r1], [r2]], method=METHOD)[0]
        assert len(fused) == 2  # each object matched across the models, none left alone
        assert sorted(fused.boxes.cls.tolist()) == [0.0, 5.0]
        assert fused.names == COCO80

    def test_results_given_to_fuse_are_pointed_to_fuse_results(self):
        r = make_results(*random_boxes(0, 3))
        with pytest.raises(TypeError, match=r"per_model\[0\] must be Detections, got Results: fuse Ultralytics "
                                            r"Results with detens.fuse_results \(one list of Results per model\)"):
            detens.fuse([r, r])

    def test_one_results_per_model_instead_of_a_list_is_an_error(self):
        r1 = make_results(*random_boxes(0, 3))
        r2 = make_results(*random_boxes(1, 3))
        with pytest.raises(TypeError, match=r"per_model_results\[0\] must be model 0's list of Results.*got Results"):
            fuse_results([r1, r2], method=METHOD)  # each box would have been read as an image
        assert len(fuse_results([[r1], [r2]], method=METHOD)) == 1

    def test_model_names_as_one_string_are_refused_not_split_into_characters(self):
        r1 = make_results(*random_boxes(0, 3))
        r2 = make_results(*random_boxes(1, 3))
        with pytest.raises(TypeError, match=r"model_names must be a list with one name per model, got str: 'ab'"):
            fuse_results([[r1], [r2]], method=METHOD, model_names="ab")
        with pytest.raises(TypeError, match=r"model_names must be a list with one name per model, got str: 'ab'"):
            TorchvisionFusion(method=METHOD, model_names="ab")
        fused = fuse_results([[r1], [r2]], method=METHOD, model_names=("a", "b"))[0]
        assert len(fused) == len(fuse_results([[r1], [r2]], method=METHOD)[0])

    @pytest.mark.parametrize("names, error, message", [
        ([1, 2], TypeError, r"^model_names\[0\] must be a model's name, a string, got int: 1$"),
        (["a", ""], ValueError, r"^model_names\[1\] is empty: a model's name must be a non-empty string$"),
    ])
    def test_model_names_that_are_no_names_are_refused_alike_everywhere(self, names, error, message):
        """Integers were turned into the strings "1", "2" by two entry points, and by detens.fuse refused as a
        Detections' source, a name the caller never gave."""
        r1 = make_results(*random_boxes(0, 3))
        r2 = make_results(*random_boxes(1, 3))
        det = results_to_detections(r1)
        with pytest.raises(error, match=message):
            fuse_results([[r1], [r2]], method=METHOD, model_names=names)
        with pytest.raises(error, match=message):
            TorchvisionFusion(method=METHOD, model_names=names)
        with pytest.raises(error, match=message):
            detens.fuse([det, det], method=METHOD, model_names=names)

    def test_a_head_trained_on_another_label_space_is_refused_as_ensemble_refuses_it(self):
        """COCO models' Results are fused in COCO's ids: a per-class head fitted on a dataset's 0, 1, 2
        (pedestrian, vehicle, dog) would fuse COCO's person with its vehicle row; a custom model's class indices
        are its label space, named by its Results.names."""
        from detens.heads import CalibrationHead

        r1, r2 = make_results(*random_boxes(0, 5)), make_results(*random_boxes(1, 5))
        head = per_class_head(OWN_CLASSES)
        with pytest.raises(ValueError, match=trained_on_other_classes(
                r"the label space of the models' Results.names \(COCO's ids for COCO's 80 classes\)")
                + r", 2 is 'dog' in the head but 'bicycle' there"):
            fuse_results([[r1], [r2]], method="theta", head=head, model_names=["a", "b"])
        curve = (torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0]))
        calibration = CalibrationHead(["a", "b"], {"a": curve, "b": curve}, class_curves={"b": {2: curve}},
                                      per_class=True)
        calibration.label_space = OWN_CLASSES
        with pytest.raises(ValueError, match=r"^the calibration was trained on a label space .* 2 is 'dog'"):
            fuse_results([[r1], [r2]], method="wbf", calibration=calibration, model_names=["a", "b"])
        unnamed = detens.ThetaHead(["a", "b"], per_class=True, class_ids=[0, 1, 2])  # no names: ids alone
        with pytest.raises(ValueError, match=r"^the head has per-class parameters for category ids 0, which are not "
                                             r"among the 80 category ids of the label space of the models' "):
            fuse_results([[r1], [r2]], method="theta", head=unnamed, model_names=["a", "b"])
        # models of those classes, by index: their own label space
        names = {0: "pedestrian", 1: "Vehicle", 2: "dog"}
        c1, c2 = (make_results([[0.0, 0.0, 50.0, 50.0]], [0.9], [1], names=names) for _ in range(2))
        assert fuse_results([[c1], [c2]], method="theta", head=head, model_names=["a", "b"])[0].boxes.cls.tolist() == [1.0]
        with pytest.raises(ValueError, match=r"1 is 'person' in the head but 'Vehicle' there"):
            fuse_results([[c1], [c2]], method="theta", head=per_class_head({1: "person"}), model_names=["a", "b"])

    def test_custom_class_names_use_indices(self):
        names = {0: "cat", 1: "dog"}
        r1 = make_results([[0.0, 0.0, 50.0, 50.0]], [0.9], [1], names=names)
        r2 = make_results([[1.0, 1.0, 51.0, 51.0]], [0.8], [1], names=names)
        fused = fuse_results([[r1], [r2]], method=METHOD)[0]
        assert fused.boxes.cls.tolist() == [1.0] and fused.names == names


# ---------------------------------------------------------------------------------------- torchvision
@pytest.fixture(scope="module")
def torchvision_models():
    from torchvision.models.detection import (
        fasterrcnn_mobilenet_v3_large_320_fpn,
        ssdlite320_mobilenet_v3_large,
    )

    torch.manual_seed(0)
    # Untrained weights: box_score_thresh=0 keeps Faster R-CNN's (near-uniform) detections.
    models = [
        fasterrcnn_mobilenet_v3_large_320_fpn(
            weights=None, weights_backbone=None, box_score_thresh=0.0
        ).eval(),
        ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None).eval(),
    ]
    images = [torch.rand(3, 240, 320), torch.rand(3, 300, 200)]
    return models, images


@pytest.fixture(scope="module")
def torchvision_outputs(torchvision_models):
    models, images = torchvision_models
    with torch.no_grad():
        outputs = [model(images) for model in models]
    return outputs, images


class TestTorchvisionFusion:
    def test_a_head_trained_on_another_label_space_is_refused_unless_label_space_gives_it(self):
        """torchvision's COCO models predict COCO's ids: a per-class head fitted on a dataset's 1, 2 (vehicle,
        dog) would fuse COCO's person and bicycle with those rows; models trained on those classes say so."""
        head = per_class_head(OWN_CLASSES)
        with pytest.raises(ValueError, match=trained_on_other_classes(
                r"COCO's category ids \(what torchvision's COCO models predict; label_space= gives others\)")):
            TorchvisionFusion(method="theta", head=head, model_names=["a", "b"])
        with pytest.raises(ValueError, match=r"^the head has per-class parameters for category ids 2, which are not "
                                             r"among the 2 category ids of label_space: 1, 3"):
            TorchvisionFusion(method="theta", head=head, model_names=["a", "b"], label_space={1: "vehicle", 3: "dog"})
        with pytest.raises(TypeError, match=r"^label_space must map category ids to names, got str"):
            TorchvisionFusion(method="wbf", label_space="coco")
        fusion = TorchvisionFusion(method="theta", head=head, model_names=["a", "b"], label_space=OWN_CLASSES)
        output = {"boxes": torch.tensor([[0.0, 0.0, 50.0, 50.0]]), "scores": torch.tensor([0.9]),
                  "labels": torch.tensor([2])}
        assert fusion([[output], [output]], [(100, 100)])[0]["labels"].tolist() == [2]
        # COCO's classes, or a head without per-class parameters, in any label space
        coco_head = per_class_head({1: "person", 2: "bicycle"})
        assert TorchvisionFusion(method="theta", head=coco_head, model_names=["a", "b"]).head is coco_head
        assert TorchvisionFusion(method="theta", head=detens.ThetaHead(["a"]), label_space={7: "x"}).head is not None

    @pytest.mark.parametrize("head", ["coco_yolo3_deep", "coco_yolo3_theta"])
    def test_a_shipped_head_fuses_inside_autocast_as_outside(self, head):
        # detectors run under autocast, and their outputs fused in the same region, as a pipeline writes it
        generator = torch.Generator().manual_seed(0)
        centers = torch.rand(40, 2, generator=generator) * 500
        outputs = []
        for _ in range(3):
            corners = centers + torch.randn(40, 2, generator=generator) * 4
            boxes = torch.cat([corners, corners + 20 + torch.rand(40, 2, generator=generator) * 80], 1)
            outputs.append([{"boxes": boxes, "scores": torch.rand(40, generator=generator),
                             "labels": torch.randint(1, 6, (40,), generator=generator)}])
        fusion = TorchvisionFusion(head=head, model_names=["yolov8n", "yolo11n", "yolo26n"])
        expected = fusion(outputs, [(640, 640)])[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = fusion(outputs, [(640, 640)])[0]
        assert all(torch.equal(got[key], expected[key]) for key in ("boxes", "scores", "labels"))

    def test_real_architectures(self, torchvision_outputs):
        outputs, images = torchvision_outputs
        assert all(len(o["boxes"]) for model in outputs for o in model), "both models output boxes"
        fusion = TorchvisionFusion(method=METHOD, iou_thr=0.55).eval()
        with torch.no_grad():
            fused = fusion(outputs, [img.shape[-2:] for img in images])
        assert len(fused) == len(images)
        for b, (out, image) in enumerate(zip(fused, images, strict=True)):
            per_model = [torchvision_to_detections(model[b], image.shape[-2:]) for model in outputs]
            expected = detens.fuse(per_model, method=METHOD, iou_thr=0.55)
            assert set(out) == {"boxes", "scores", "labels"}
            assert out["boxes"].dtype == torch.float32 and out["labels"].dtype == torch.int64
            assert len(out["boxes"]) > 0
            for key, value in detections_to_torchvision(expected).items():
                assert torch.equal(out[key], value), key
            height, width = image.shape[-2:]
            assert (out["boxes"][:, 2] <= width).all() and (out["boxes"][:, 3] <= height).all()

    @pytest.mark.parametrize("method", ["wbf", "nms", "soft_nms", "mean"])
    def test_outputs_computed_with_grad(self, torchvision_models, torchvision_outputs, method):
        # a model called without torch.no_grad() returns boxes and scores that require grad
        models, images = torchvision_models
        with_grad = [models[0](images), torchvision_outputs[0][1]]
        assert with_grad[0][0]["boxes"].requires_grad
        fusion = TorchvisionFusion(method=method)
        fused = fusion(with_grad, images)
        expected = fusion([torchvision_outputs[0][0], torchvision_outputs[0][1]], images)
        for got, want in zip(fused, expected, strict=True):
            assert torch.allclose(got["boxes"], want["boxes"]) and torch.allclose(got["scores"], want["scores"])

    def test_image_tensors_as_sizes(self, torchvision_outputs):
        outputs, images = torchvision_outputs
        fusion = TorchvisionFusion(method=METHOD)
        by_size = fusion(outputs, [tuple(img.shape[-2:]) for img in images])
        by_image = fusion(outputs, images)
        by_tensor = fusion(outputs, torch.tensor([list(img.shape[-2:]) for img in images]))
        for a, b, c in zip(by_size, by_image, by_tensor, strict=True):
            assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)

    def test_empty_outputs(self):
        empty = {
            "boxes": torch.zeros(0, 4),
            "scores": torch.zeros(0),
            "labels": torch.zeros(0, dtype=torch.int64),
        }
        one = {
            "boxes": torch.tensor([[1.0, 2.0, 30.0, 40.0]]),
            "scores": torch.tensor([0.6]),
            "labels": torch.tensor([3]),
        }
        fusion = TorchvisionFusion(method=METHOD).eval()
        fused = fusion([[empty, empty], [empty, one]], [(50, 60), (50, 60)])
        assert fused[0]["boxes"].shape == (0, 4) and fused[0]["scores"].shape == (0,)
        assert fused[0]["labels"].dtype == torch.int64
        assert fused[1]["labels"].tolist() == [3] and fused[1]["boxes"].shape == (1, 4)
        assert fusion([[], []], []) == []

    def test_image_sizes_of_width_and_height_are_refused_not_clipped_to(self):
        output = {"boxes": torch.tensor([[10.0, 5.0, 30.0, 40.0], [70.0, 5.0, 90.0, 40.0]]),
                  "scores": torch.tensor([0.6, 0.5]), "labels": torch.tensor([3, 3])}
        fusion = TorchvisionFusion(method=METHOD).eval()
        assert len(fusion([[output], [output]], [(50, 100)])[0]["boxes"]) == 2
        with pytest.raises(ValueError, match="^" + re.escape(
            "per_model_outputs[0][0] (model 0's output for image 0): box 1 [70.0, 5.0, 90.0, 40.0] starts beyond "
            "the 50x100 (width x height) image that image_size=(100, 50) gives; image_size is (height, width)"
        )):
            fusion([[output], [output]], [(100, 50)])
        # a portrait image's sides swapped: every box starts inside, the tall one ends past the height given
        tall = {"boxes": torch.tensor([[10.0, 5.0, 30.0, 40.0], [20.0, 30.0, 45.0, 95.0]]),
                "scores": torch.tensor([0.6, 0.5]), "labels": torch.tensor([3, 3])}
        assert len(fusion([[tall], [tall]], [(100, 50)])[0]["boxes"]) == 2
        with pytest.raises(ValueError, match=re.escape(
            "box 1 [20.0, 30.0, 45.0, 95.0] ends past the 100x50 (width x height) image that image_size=(50, 100) gives"
        )):
            fusion([[tall], [tall]], [(50, 100)])

    @pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
    def test_torchscript_is_refused_by_name_alone_or_inside_a_model(self):
        class Detector(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fusion = TorchvisionFusion(method=METHOD)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x

        for module in (TorchvisionFusion(method=METHOD), Detector()):
            with pytest.raises(TypeError, match=r"TorchvisionFusion cannot be compiled by torch.jit.script.*Script or "
                                                r"export the detectors alone, and call the fusion on their outputs"):
                torch.jit.script(module)

    def test_errors(self, torchvision_outputs):
        outputs, images = torchvision_outputs
        fusion = TorchvisionFusion(method=METHOD)
        with pytest.raises(TypeError, match="image_size must hold integers"):
            fusion(outputs, [(240.5, 320), (300, 200)])  # was truncated to 240
        with pytest.raises(ValueError, match=r"different numbers of outputs \[2, 1\]"):
            fusion([outputs[0], outputs[1][:1]], images)
        with pytest.raises(ValueError, match="got 1 image sizes for 2 images"):
            fusion(outputs, images[:1])
        with pytest.raises(ValueError, match="unknown fusion method"):
            TorchvisionFusion(method="nope")
        with pytest.raises(ValueError, match="image_sizes\\[0\\] must be \\(height, width\\)"):
            fusion(outputs, [240, 320])
        with pytest.raises(ValueError, match="must be positive"):
            fusion(outputs, [(0, 320), (300, 200)])
        with pytest.raises(TypeError, match="image_sizes must be a list with the \\(height, width\\) of each image, got NoneType"):
            fusion(outputs, None)

    @pytest.mark.parametrize("options, error, message", [
        ({"model_names": ["a", "b"], "iou_thr": 5}, ValueError, r"iou_thr must be in \[0, 1\), got 5"),
        ({"model_names": ["a", "b"], "weights": [1, 2, 3]}, ValueError,
         r"weights must hold one number per model \(2\), got 3"),
        ({"model_names": ["a", "b"], "method": "soft_nms", "sigma": "0.5"}, TypeError, "sigma must be a number"),
        ({"model_names": ["a", "b"], "method": "theta", "head": detens.ThetaHead(["a", "c"])}, ValueError,
         r"their sources are \['a', 'b'\] but this head is for models \['a', 'c'\]"),
        ({"method": "theta", "head": detens.ThetaHead(["a"]), "iou_thr": -1}, ValueError,
         r"iou_thr must be in \[0, 1\), got -1"),  # the head tells the number of models
        ({"weights": [1, 2], "iou_thr": 5}, ValueError, r"iou_thr must be in \[0, 1\), got 5"),  # so do the weights
        ({"method": "vote", "weights": [1, 2], "min_votes": 3}, ValueError, r"min_votes"),
    ], ids=["iou_thr", "weights", "sigma", "head", "head models", "weights tell", "votes of the weights' models"])
    def test_parameter_values_are_checked_when_the_models_are_known(self, options, error, message):
        with pytest.raises(error, match=message):
            TorchvisionFusion(**{"method": "wbf", **options})

    @pytest.mark.parametrize("options, error, message", [
        ({"iou_thr": 5}, ValueError, r"iou_thr must be in \[0, 1\), got 5"),
        ({"method": "vote", "iou_thr": 1}, ValueError, r"iou_thr must be in \[0, 1\), got 1"),
        ({"conf_type": "mean"}, ValueError, r"conf_type must be one of avg, max"),
        ({"method": "soft_nms", "sigma": "0.5"}, TypeError, "sigma must be a number"),
    ], ids=["iou_thr", "vote iou_thr", "conf_type", "sigma"])
    def test_values_that_hold_for_any_number_of_models_are_checked_without_the_models(self, options, error, message):
        with pytest.raises(error, match=message):
            TorchvisionFusion(**{"method": "wbf", **options})

    def test_min_votes_is_checked_on_the_first_call_when_the_models_are_unknown(self):
        fusion = TorchvisionFusion(method="vote", min_votes=3)  # at most one vote per model: 3 or more models
        empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)}
        with pytest.raises(ValueError, match=r"min_votes must be an integer in \[1, 2\], got 3"):
            fusion([[empty], [empty]], [(50, 60)])
        with pytest.raises(ValueError, match=r"min_votes must be an integer in \[1, 2\], got 3"):
            fusion([[], []], [])  # no image: checked all the same
        assert len(fusion([[empty], [empty], [empty]], [(50, 60)])[0]["boxes"]) == 0

    def test_numpy_images_as_sizes_and_one_dict_per_model(self):
        one = {"boxes": torch.tensor([[100.0, 50.0, 600.0, 400.0]]), "scores": torch.tensor([0.9]),
               "labels": torch.tensor([3])}
        fusion = TorchvisionFusion(method=METHOD)
        by_size = fusion([[one], [one]], [(480, 640)])
        by_array = fusion([[one], [one]], [np.zeros((480, 640, 3), np.uint8)])  # OpenCV's [H, W, C]
        by_tensor = fusion([[one], [one]], torch.tensor([[480, 640]]))  # one Tensor[B, 2] of the sizes
        assert len(by_size[0]["boxes"]) == 1 and torch.equal(by_size[0]["boxes"], by_array[0]["boxes"])
        assert torch.equal(by_size[0]["boxes"], by_tensor[0]["boxes"])
        with pytest.raises(ValueError, match=r"image_sizes\[0\]: a numpy image must be \[H, W\] or \[H, W, C\]"):
            fusion([[one], [one]], [np.zeros((3, 480, 640), np.uint8)])
        # an image's whole shape is no size: the message says what to pass instead
        with pytest.raises(ValueError, match=r"^image_sizes\[0\] must be \(height, width\) or an image tensor "
                                             r"\[C, H, W\], got torch.Size\(\[3, 480, 640\]\); for an image's shape "
                                             r"pass image.shape\[-2:\], or the image tensor itself$"):
            fusion([[one], [one]], [torch.zeros(3, 480, 640).shape])
        with pytest.raises(TypeError, match=r"per_model_outputs\[0\] must be model 0's list of output dicts.*got dict"):
            fusion([one, one], [(480, 640)])

    @pytest.mark.parametrize("convert", [
        lambda v: np.array(v, np.float64), lambda v: np.array(v, np.float32), list, lambda v: torch.tensor(v).long(),
    ], ids=["numpy float64", "numpy float32", "list", "int64 tensor"])
    def test_numpy_and_list_outputs_fuse_to_float32_tensors(self, convert):
        boxes, scores = [[10, 10, 50, 50], [12, 11, 50, 52]], [0.9, 0.7]
        outputs = [[{"boxes": convert([box]), "scores": np.array([score]), "labels": convert([3])}]
                   for box, score in zip(boxes, scores, strict=True)]
        as_tensors = [[{"boxes": torch.tensor([box], dtype=torch.float32), "scores": torch.tensor([score]),
                        "labels": torch.tensor([3])}] for box, score in zip(boxes, scores, strict=True)]
        fusion = TorchvisionFusion(method=METHOD)
        fused, expected = fusion(outputs, [(100, 200)]), fusion(as_tensors, [(100, 200)])
        assert fused[0]["boxes"].dtype == fused[0]["scores"].dtype == torch.float32
        assert all(torch.equal(fused[0][k], expected[0][k]) for k in expected[0])

    def test_a_head_of_several_models_needs_their_names(self):
        with pytest.raises(ValueError, match=r"^the head is for models \['frcnn', 'ssd'\], and torchvision's output "
                                             r"dicts carry no model name: pass model_names=\[\.\.\.\]"):
            TorchvisionFusion(method="theta", head=detens.ThetaHead(["frcnn", "ssd"]))

    def test_theta_head_is_a_submodule(self):
        head = detens.ThetaHead(["frcnn", "ssd"])
        fusion = TorchvisionFusion(method="theta", head=head, model_names=["ssd", "frcnn"])
        assert any(m is head for m in fusion.modules())
        one = {
            "boxes": torch.tensor([[1.0, 2.0, 30.0, 40.0]]),
            "scores": torch.tensor([0.6]),
            "labels": torch.tensor([3]),
        }
        fused = fusion([[one], [one]], [(50, 60)])
        torch.testing.assert_close(fused[0]["boxes"], one["boxes"])

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    def test_cuda_in_cuda_out(self, torchvision_outputs):
        outputs, images = torchvision_outputs
        cuda = [[{k: v.cuda() for k, v in o.items()} for o in model] for model in outputs]
        fused = TorchvisionFusion(method=METHOD).cuda()(cuda, images)
        cpu = TorchvisionFusion(method=METHOD)(outputs, images)
        for a, b in zip(fused, cpu, strict=True):
            assert all(v.is_cuda for v in a.values())
            torch.testing.assert_close(a["boxes"].cpu(), b["boxes"], atol=1e-3, rtol=0)


# ---------------------------------------------------------------------------------------------- Ensemble
class FixedDetector:
    """A detector that returns given Detections (the protocol: callable + name)."""

    def __init__(self, name, detections):
        self.name = name
        self.detections = detections
        self.calls = 0

    def __call__(self, images):
        self.calls += 1
        return [self.detections[i % len(self.detections)] for i in range(len(images))]


class YoloDetector:
    """A real Ultralytics model as a detens detector (COCO class indices → COCO category ids)."""

    def __init__(self, name, model):
        self.name = name
        self.model = model

    def __call__(self, images):
        return [
            results_to_detections(r, COCO_CATEGORY_IDS, self.name)
            for r in self.model(list(images), verbose=False)
        ]


class TestEnsemble:
    def test_detectors_in_different_label_spaces_are_refused(self):
        """Fused by id, one model's class would be merged with another's: COCO's 10 (traffic light) with a
        dataset's 10 (pedestrian)."""
        coco = FixedDetector("coco", [Detections.empty((10, 10))])
        coco.categories = {1: "person", 10: "traffic light", 20: "sheep"}
        own = FixedDetector("own", [Detections.empty((10, 10))])
        own.categories = {10: "pedestrian", 20: "automobile", 30: "doggo"}
        with pytest.raises(ValueError, match=r"^the detectors are in different label spaces: 10 is 'traffic light' "
                                             r"in 'coco' but 'pedestrian' in 'own', 20 is 'sheep' in 'coco' but "
                                             r"'automobile' in 'own'; give them one"):
            Ensemble([coco, FixedDetector("plain", []), own])  # one that declares none is not compared
        alike = FixedDetector("alike", [Detections.empty((10, 10))])
        alike.categories = {1: "Person", 10: "traffic_light", 40: "bottle"}  # spelled otherwise, or other ids
        assert Ensemble([coco, alike]).names == ["coco", "alike"]

    def test_a_head_trained_on_another_label_space_is_refused_when_built(self):
        """Its per-class parameters of 1, 2, 3 (pedestrian, automobile, hound) would fuse COCO's person,
        bicycle and car, as ``detens fuse`` refuses."""
        from detens.heads.calibration import CalibrationHead

        own_classes = {1: "pedestrian", 2: "automobile", 3: "hound"}
        head = detens.ThetaHead(["a", "b"], per_class=True, class_ids=[1, 2, 3])
        head.label_space = own_classes
        coco = [FixedDetector(name, [Detections.empty((10, 10))]) for name in ("a", "b")]
        for detector in coco:
            detector.categories = dict(COCO_ID_TO_NAME)
        with pytest.raises(ValueError, match=r"^the head was trained on a label space whose category ids name other "
                                             r"classes than in the detectors' label space: 1 is 'pedestrian' in the "
                                             r"head but 'person' there"):
            Ensemble(coco, method="theta", head=head)
        curve = (torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0]))
        calibration = CalibrationHead(["a", "b"], {"a": curve, "b": curve}, class_curves={"b": {2: curve}},
                                      per_class=True)
        calibration.label_space = own_classes
        with pytest.raises(ValueError, match=r"^the calibration was trained on a label space .* 2 is 'automobile'"):
            Ensemble(coco, method="wbf", calibration=calibration)
        # the detectors' own label space, a head without per-class parameters, or detectors that declare none
        for detector in coco:
            detector.categories = dict(own_classes)
        assert Ensemble(coco, method="theta", head=head).names == ["a", "b"]
        agnostic = detens.ThetaHead(["a", "b"])
        agnostic.label_space = own_classes
        silent = [FixedDetector(name, [Detections.empty((10, 10))]) for name in ("a", "b")]
        assert Ensemble(silent, method="theta", head=head).names == ["a", "b"]
        for detector in coco:
            detector.categories = dict(COCO_ID_TO_NAME)
        assert Ensemble(coco, method="theta", head=agnostic).names == ["a", "b"]
        # one detector declaring COCO and one declaring nothing: the ids it gives are compared by name
        with pytest.raises(ValueError, match=r"1 is 'pedestrian' in the head but 'person' there"):
            Ensemble([coco[0], silent[1]], method="theta", head=head)

    def test_fuses_like_detens_fuse(self):
        a = Detections(
            *random_boxes(0, 20)[:2], torch.tensor(COCO_CATEGORY_IDS)[random_boxes(0, 20)[2]], (480, 640)
        )
        b = Detections(a.boxes + 3, a.scores * 0.9, a.labels, (480, 640))
        ens = Ensemble([FixedDetector("a", [a]), FixedDetector("b", [b])], method=METHOD, iou_thr=0.6)
        image = np.zeros((480, 640, 3), dtype=np.uint8)
        fused = ens([image, image])
        assert len(fused) == 2
        expected = detens.fuse([a.with_source("a"), b.with_source("b")], method=METHOD, iou_thr=0.6)
        for det in fused:
            assert torch.equal(det.boxes, expected.boxes) and torch.equal(det.labels, expected.labels)
        assert ens([]) == []
        capped = Ensemble([FixedDetector("a", [a]), FixedDetector("b", [b])], method=METHOD, iou_thr=0.6, max_det=5)
        assert len(expected) > 5 and torch.equal(capped([image])[0].boxes, expected.boxes[:5])

    def test_errors(self):
        a = Detections.empty((10, 10))
        with pytest.raises(ValueError, match="unique"):
            Ensemble([FixedDetector("a", [a]), FixedDetector("a", [a])])
        with pytest.raises(ValueError, match="unknown fusion method"):
            Ensemble([FixedDetector("a", [a])], method="wbff")
        with pytest.raises(ValueError, match="non-empty list"):
            Ensemble([])
        ens = Ensemble(
            [FixedDetector("a", [a]), FixedDetector("b", [Detections.empty((10, 12))])], method=METHOD
        )
        with pytest.raises(ValueError, match="disagree on its size"):
            ens(["x.jpg"])

        class Short(FixedDetector):
            def __call__(self, images):
                return []

        with pytest.raises(ValueError, match="returned 0 Detections for 1 images"):
            Ensemble([Short("s", [a])], method=METHOD)(["x.jpg"])

    @pytest.mark.parametrize("images", [None, 3])
    def test_images_of_another_type_are_named(self, images):
        ens = Ensemble([FixedDetector("a", [Detections.empty((10, 10))])], method=METHOD)
        with pytest.raises(TypeError, match=f"images must be a list of paths or BGR numpy arrays, got {type(images).__name__}"):
            ens(images)
        with pytest.raises(TypeError, match=f"image source must be a path, a glob pattern or a list of them, got {type(images).__name__}"):
            ens.predict(images)

    def test_boxes_carry_the_member_name_the_head_was_checked_against(self):
        # detectors whose Detections name other sources: their names, not the sources, place them in the head
        a = Detections([[10.0, 20.0, 110.0, 220.0]], [0.9], [1], (480, 640))
        b = Detections([[30.0, 20.0, 130.0, 220.0]], [0.6], [1], (480, 640))
        head = detens.ThetaHead(["a", "b"])
        with torch.no_grad():
            head.theta.copy_(torch.tensor([0.9, 0.1]))
        detectors = [FixedDetector("b", [b.with_source("a")]), FixedDetector("a", [a.with_source("b")])]
        fused = Ensemble(detectors, method="theta", head=head)([np.zeros((480, 640, 3), np.uint8)])[0]
        expected = detens.fuse([a.with_source("a"), b.with_source("b")], method="theta", head=head)
        assert torch.equal(fused.boxes, expected.boxes) and torch.equal(fused.scores, expected.scores)
        assert fused.boxes[0, 0] == pytest.approx(0.9 * 10 + 0.1 * 30, abs=1e-4)

    def test_an_augmented_detector_adds_a_member_per_view(self):
        from detens.adapters import AugmentedDetector

        a = Detections([[10.0, 20.0, 110.0, 220.0]], [0.9], [1], (480, 640))
        views = AugmentedDetector(FixedDetector("a", [a]), ["identity", "hflip"])
        ens = Ensemble([views, FixedDetector("b", [a])], method=METHOD)
        assert ens.names == ["a", "a|hflip", "b"]
        image = np.zeros((480, 640, 3), np.uint8)
        per_model = ens.run_detectors([image])
        assert [m[0].source for m in per_model] == ens.names
        assert torch.equal(per_model[1][0].boxes, torch.tensor([[530.0, 20.0, 630.0, 220.0]]))  # mirrored back
        assert len(ens([image])[0]) == 2  # the box and its mirror image do not overlap

    @pytest.mark.parametrize("options, error, message", [
        ({"iou_thr": 5}, ValueError, r"iou_thr must be in \[0, 1\), got 5"),
        ({"weights": [1, 2, 3]}, ValueError, r"weights must hold one number per model \(2\), got 3"),
        ({"method": "soft_nms", "sigma": "0.5"}, TypeError, "sigma must be a number, got str"),
        ({"method": "theta", "head": detens.ThetaHead(["a", "c"])}, ValueError,
         r"their sources are \['a', 'b'\] but this head is for models \['a', 'c'\]"),
        ({"max_det": 0}, ValueError, r"max_det must be an integer >= 1, got 0"),
    ], ids=["iou_thr", "weights", "sigma", "head", "max_det"])
    def test_parameter_values_are_checked_before_any_detector_runs(self, options, error, message):
        a = Detections.empty((10, 10))
        detectors = [FixedDetector("a", [a]), FixedDetector("b", [a])]
        with pytest.raises(error, match=message):
            Ensemble(detectors, **{"method": "wbf", **options})
        assert [d.calls for d in detectors] == [0, 0]

    def test_a_shipped_head_goes_by_name(self):
        a = Detections([[10.0, 20.0, 110.0, 220.0]], [0.9], [1], (480, 640))
        detectors = [FixedDetector(name, [a]) for name in ("yolo26n", "yolov8n", "yolo11n")]
        ens = Ensemble(detectors, method="theta", head="coco_yolo3_theta")
        expected = detens.fuse([a.with_source(d.name) for d in detectors], method="theta", head="coco_yolo3_theta")
        fused = ens([np.zeros((480, 640, 3), np.uint8)])[0]
        assert torch.equal(fused.boxes, expected.boxes) and torch.equal(fused.scores, expected.scores)
        with pytest.raises(FileNotFoundError, match=r"head file 'coco_yolo3_thet' not found: no such file .* not a "
                                                    r"shipped name \(shipped: coco_yolo3_deep, coco_yolo3_theta, "):
            Ensemble(detectors, method="theta", head="coco_yolo3_thet")
        assert [d.calls for d in detectors] == [1, 1, 1]

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    def test_a_head_on_the_gpu_is_checked_on_its_device(self):
        a = Detections([[10.0, 20.0, 110.0, 220.0]], [0.9], [1], (480, 640)).to("cuda")
        ens = Ensemble([FixedDetector("a", [a]), FixedDetector("b", [a])], method="theta",
                       head=detens.ThetaHead(["a", "b"]).cuda())
        assert ens([np.zeros((480, 640, 3), np.uint8)])[0].device.type == "cuda"

    def test_every_entry_point_takes_head_types_and_calibration(self, tmp_path):
        from detens import DeepEnsembleHead
        from detens.heads import CalibrationHead

        a = Detections([[10.0, 20.0, 110.0, 220.0]], [0.9], [1], (480, 640))
        b = Detections([[14.0, 22.0, 112.0, 226.0]], [0.6], [1], (480, 640))
        DeepEnsembleHead(["a", "b"]).save(tmp_path / "deep.json")
        curve = (torch.tensor([0.0, 1.0]), torch.tensor([0.2, 0.7]))  # score -> expected IoU, both models
        CalibrationHead(["a", "b"], {"a": curve, "b": curve}).save(tmp_path / "calibration.json")
        options = {"method": "deep", "head": tmp_path / "deep.json", "calibration": tmp_path / "calibration.json"}
        expected = detens.fuse([a.with_source("a"), b.with_source("b")], **options)
        ens = Ensemble([FixedDetector("b", [b]), FixedDetector("a", [a])], **options)
        fused = ens([np.zeros((480, 640, 3), np.uint8)])[0]
        assert torch.equal(fused.boxes, expected.boxes) and torch.equal(fused.scores, expected.scores)
        outputs = [[{"boxes": d.boxes, "scores": d.scores, "labels": d.labels}] for d in (a, b)]
        fused = TorchvisionFusion(model_names=["a", "b"], **options)(outputs, [(480, 640)])[0]
        assert torch.equal(fused["boxes"], expected.boxes) and torch.equal(fused["scores"], expected.scores)
        with pytest.raises(ValueError, match="method 'selection' was given a 'deep' head"):
            Ensemble([FixedDetector("a", [a]), FixedDetector("b", [b])], method="selection", head=tmp_path / "deep.json")

    @pytest.mark.slow
    def test_predict_over_a_glob_with_real_models(self, yolo_models):
        from detens.sources import list_images, read_image

        ens = Ensemble([YoloDetector(n, m) for n, m in yolo_models.items()], method=METHOD, iou_thr=0.55)
        pattern = str(COCO_IMAGES / "00000000013*.jpg")
        paths = list_images(pattern)
        assert len(paths) >= 1
        fused = ens.predict(pattern, batch_size=2)
        assert len(fused) == len(paths)
        direct = ens([read_image(p) for p in paths])
        for det, ref, path in zip(fused, direct, paths, strict=True):
            assert det.image_size == read_image(path).shape[:2]
            assert torch.equal(det.boxes, ref.boxes) and torch.equal(det.scores, ref.scores)
        streamed = list(ens.predict(paths, stream=True))
        assert len(streamed) == len(paths)


def test_ensemble_predict_with_precomputed_detectors(tmp_path):
    """``Ensemble.predict`` reads each image once and still gives saved-prediction members its path."""
    import cv2

    from detens.adapters import PrecomputedDetector

    (tmp_path / "images").mkdir()
    sizes = {"a.jpg": (48, 64), "b.png": (30, 40)}
    for file_name, (height, width) in sizes.items():
        cv2.imwrite(str(tmp_path / "images" / file_name), np.full((height, width, 3), 90, dtype=np.uint8))
    images = {"a.jpg": 1, "b.png": 2}
    first = [
        {"image_id": 1, "category_id": 1, "bbox": [2.0, 3.0, 20.0, 10.0], "score": 0.9},
        {"image_id": 2, "category_id": 3, "bbox": [1.0, 1.0, 8.0, 8.0], "score": 0.6},
    ]
    second = [{"image_id": 1, "category_id": 1, "bbox": [3.0, 3.0, 20.0, 11.0], "score": 0.7}]
    members = [
        PrecomputedDetector(first, images, name="first"),
        PrecomputedDetector(second, images, name="second"),
    ]
    ens = Ensemble(members, method=METHOD, iou_thr=0.55)
    fused = ens.predict(tmp_path / "images")  # a.jpg, b.png
    assert [det.image_size for det in fused] == [sizes["a.jpg"], sizes["b.png"]]
    paths = [tmp_path / "images" / "a.jpg", tmp_path / "images" / "b.png"]
    expected = ens(paths)  # the detectors read the files themselves
    for det, ref in zip(fused, expected, strict=True):
        assert torch.equal(det.boxes, ref.boxes) and torch.equal(det.scores, ref.scores)
    assert len(fused[0]) == 1 and len(fused[1]) == 1  # the two boxes on a.jpg fused into one
    per_model = ens.run_detectors([np.zeros((48, 64, 3), np.uint8)], [paths[0]])
    assert [len(per_model[n][0]) for n in range(2)] == [1, 1]
    with pytest.raises(ValueError, match="got 2 paths for 1 images"):
        ens.run_detectors([np.zeros((48, 64, 3), np.uint8)], paths)


def test_ensemble_predict_over_no_images_answers_empty_and_warns(tmp_path, caplog):
    """No images is a normal answer, and a warning: a mistyped folder or glob pattern looks the same."""
    from detens.adapters import PrecomputedDetector

    ens = Ensemble([PrecomputedDetector([], {"a.jpg": 1}, name="saved")], method=METHOD)
    with caplog.at_level("WARNING", logger="detens.pipeline"):
        assert list(ens.predict(tmp_path)) == []
        assert list(ens.predict(str(tmp_path / "*.jpg"), stream=True)) == []
    assert [r.getMessage() for r in caplog.records if r.name == "detens.pipeline"] == [
        f"no image files in {source!r}: nothing to predict (see detens.sources.IMAGE_EXTENSIONS)"
        for source in (tmp_path, str(tmp_path / "*.jpg"))
    ]


# ------------------------------------------------------------------------------- unreadable images, predict
class ImageSizeDetector:
    """One box over the whole image: its Detections show which image it was given."""

    name = "whole"

    def __call__(self, images):
        return [
            Detections([[0.0, 0.0, float(w), float(h)]], [0.5], [1], (h, w), self.name)
            for h, w in (image.shape[:2] for image in images)
        ]


@pytest.fixture
def folder_with_bad_images(tmp_path):
    """Two real COCO images, a real JPEG cut in half and a text file named .jpg, in file-name order."""
    real = sorted(COCO_IMAGES.glob("*.jpg"))[:2]
    assert len(real) == 2, f"shared images missing in {COCO_IMAGES}"
    folder = tmp_path / "images"
    folder.mkdir()
    good = [folder / "a_good.jpg", folder / "d_good.jpg"]
    for source, target in zip(real, good, strict=True):
        target.write_bytes(source.read_bytes())
    truncated = folder / "b_truncated.jpg"
    data = real[0].read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    not_image = folder / "c_not an image.jpg"
    not_image.write_text("this is not a jpeg")
    return folder, good, [truncated, not_image]


class TestPredictUnreadableImages:
    @pytest.mark.parametrize("batch_size", [1, 2, 8])
    def test_skips_reports_and_records(self, folder_with_bad_images, batch_size, caplog):
        from detens.pipeline import PredictionList
        from detens.sources import read_image

        folder, good, bad = folder_with_bad_images
        ens = Ensemble([ImageSizeDetector()], method=METHOD)
        with caplog.at_level("WARNING", logger="detens.pipeline"):
            fused = ens.predict(folder, batch_size=batch_size)
        assert isinstance(fused, PredictionList) and isinstance(fused, list)
        assert fused.paths == good and list(fused.skipped) == bad
        assert [det.image_size for det in fused] == [read_image(p).shape[:2] for p in good]
        assert "could not decode" in fused.skipped[bad[0]] and "b_truncated.jpg" in fused.skipped[bad[0]]
        for path in bad:
            assert any(path.name in r.getMessage() and r.levelname == "WARNING" for r in caplog.records), path

    def test_stream_fills_paths_and_skipped_as_it_goes(self, folder_with_bad_images):
        from detens.pipeline import PredictionStream

        folder, good, bad = folder_with_bad_images
        stream = Ensemble([ImageSizeDetector()], method=METHOD).predict(folder, batch_size=1, stream=True)
        assert isinstance(stream, PredictionStream)
        assert stream.paths == [] and stream.skipped == {}  # nothing read before iterating
        first = next(stream)
        assert stream.paths == good[:1] and stream.skipped == {} and len(first) == 1
        rest = list(stream)
        assert len(rest) == 1 and stream.paths == good and list(stream.skipped) == bad

    @pytest.mark.parametrize("stream", [False, True])
    def test_raise_stops_at_the_first_unreadable_image(self, folder_with_bad_images, stream):
        from detens.sources import ImageReadError

        folder, _, _ = folder_with_bad_images
        ens = Ensemble([ImageSizeDetector()], method=METHOD)
        with pytest.raises(ImageReadError, match="b_truncated.jpg"):
            list(ens.predict(folder, stream=stream, on_error="raise"))

    def test_every_image_unreadable(self, folder_with_bad_images):
        _, _, bad = folder_with_bad_images
        fused = Ensemble([ImageSizeDetector()], method=METHOD).predict(bad)
        assert fused == [] and fused.paths == [] and list(fused.skipped) == bad

    @pytest.mark.parametrize(
        "kwargs, error, fragment",
        [
            ({"on_error": "ignore"}, ValueError, r"on_error must be one of \['skip', 'raise'\], got 'ignore'"),
            ({"on_error": None}, ValueError, "on_error must be one of"),
            ({"batch_size": 0}, ValueError, "batch_size must be an integer >= 1, got 0"),
            ({"batch_size": np.int64(-2)}, ValueError, "batch_size must be an integer >= 1"),
            ({"batch_size": True}, TypeError, "batch_size must be an integer, got bool: True"),
            ({"batch_size": np.bool_(True)}, TypeError, "batch_size must be an integer, got bool"),
            ({"batch_size": 2.0}, TypeError, "batch_size must be an integer, got float: 2.0"),
            ({"batch_size": np.float32(2)}, TypeError, "batch_size must be an integer, got float32"),
            ({"batch_size": "2"}, TypeError, "batch_size must be an integer, got str: '2'"),
            ({"stream": "no"}, TypeError, "stream must be True or False, got str: 'no'"),
            ({"stream": 1}, TypeError, "stream must be True or False, got int: 1"),
        ],
    )
    def test_bad_arguments(self, folder_with_bad_images, kwargs, error, fragment):
        folder, _, _ = folder_with_bad_images
        with pytest.raises(error, match=fragment):
            Ensemble([ImageSizeDetector()], method=METHOD).predict(folder, **kwargs)

    @pytest.mark.parametrize("batch_size", [np.int64(2), np.int32(1), np.uint8(8), torch.tensor(2)])
    @pytest.mark.parametrize("stream", [False, np.bool_(True)])
    def test_numpy_integers_are_batch_sizes(self, folder_with_bad_images, batch_size, stream):
        """A batch size computed with numpy (or torch) is the same as the int it holds."""
        folder, _, _ = folder_with_bad_images
        ens = Ensemble([ImageSizeDetector()], method=METHOD)
        got = ens.predict(folder, batch_size=batch_size, stream=stream)
        reference = ens.predict(folder, batch_size=int(batch_size))
        assert [d.image_size for d in got] == [d.image_size for d in reference]
        assert got.paths == reference.paths and got.skipped == reference.skipped


# ---------------------------------------------------------------------------------- loaded models as members
class TestEnsembleOfLoadedModels:
    @pytest.mark.slow
    def test_yolo_instances_fuse_like_their_adapters(self, folder_with_bad_images):
        from ultralytics import YOLO

        from detens.adapters import UltralyticsDetector

        folder, good, bad = folder_with_bad_images
        loaded = Ensemble([YOLO(str(path), task="detect") for path in MODELS.values()], method=METHOD)
        assert loaded.names == list(MODELS)  # named after their files
        assert all(isinstance(d, UltralyticsDetector) for d in loaded.detectors)
        by_path = Ensemble([UltralyticsDetector(path) for path in MODELS.values()], method=METHOD)
        fused, expected = loaded.predict(folder), by_path.predict(folder)
        assert fused.paths == good and list(fused.skipped) == bad
        assert all(len(det) for det in fused)
        for det, ref in zip(fused, expected, strict=True):
            assert torch.equal(det.boxes, ref.boxes) and torch.equal(det.scores, ref.scores)
            assert torch.equal(det.labels, ref.labels)

    def test_torchvision_modules_are_wrapped(self):
        from torchvision.models.detection import (
            fasterrcnn_mobilenet_v3_large_320_fpn,
            ssdlite320_mobilenet_v3_large,
        )

        from detens.adapters import TorchvisionDetector

        torch.manual_seed(0)
        frcnn = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None)
        ssd = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
        named = TorchvisionDetector(ssd, name="ssdlite")
        ens = Ensemble([frcnn, named], method=METHOD)
        assert ens.names == ["FasterRCNN", "ssdlite"]
        assert isinstance(ens.detectors[0], TorchvisionDetector) and ens.detectors[0].model is frcnn
        assert ens.detectors[1] is named
        image = np.random.default_rng(0).integers(0, 255, (120, 160, 3), dtype=np.uint8)
        (fused,) = ens([image])
        per_model = [d([image])[0] for d in ens.detectors]
        assert all(len(d) for d in per_model), "both untrained models output boxes at conf 0.001"
        expected = detens.fuse(per_model, method=METHOD)
        assert fused.image_size == (120, 160)
        assert torch.equal(fused.boxes, expected.boxes) and torch.equal(fused.scores, expected.scores)

    @pytest.mark.parametrize(
        "member, fragment",
        [
            (3, r"detectors\[1\] must be a detector .* got int"),
            ("model.pt", r"detectors\[1\] must be a detector .* got str"),
            (None, r"detectors\[1\] must be a detector .* got NoneType"),
        ],
    )
    def test_rejects_what_is_neither_detector_nor_model(self, member, fragment):
        with pytest.raises(TypeError, match=fragment):
            Ensemble([FixedDetector("a", [Detections.empty((10, 10))]), member])

    def test_same_model_twice_needs_names(self):
        from torchvision.models.detection import ssdlite320_mobilenet_v3_large

        model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
        with pytest.raises(ValueError, match=r"got \[.SSD., .SSD.\].*name="):
            Ensemble([model, model])
