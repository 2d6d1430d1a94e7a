"""Detector adapters on real images: Ultralytics (every Ultralytics model in ../shared/models and a local
.pt), torchvision (real architectures, state dicts saved and loaded by path), max_det counted among the
label space's classes only (Ultralytics, ONNX, torchvision), saved predictions, and test-time views."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
import yaml
from torchvision.ops import box_iou

from detens.adapters import AugmentedDetector, PrecomputedDetector, View, build_detector, detect_loaded
from detens.adapters.augmented import AugmentedView
from detens.adapters.weights import repository_weights_dir
from detens.coco import detections_to_coco
from detens.detections import Detections
from detens.ensemble_config import EnsembleConfig, ModelConfig
from detens.labels import COCO_CATEGORY_IDS
from detens.sources import ImageReadError, read_image

ultralytics = pytest.importorskip("ultralytics")
from ultralytics.utils import ASSETS  # noqa: E402

BUS = Path(ASSETS) / "bus.jpg"
ZIDANE = Path(ASSETS) / "zidane.jpg"
SHARED_MODELS = repository_weights_dir()  # ../shared/models next to the repository, as detens finds it
PERSON, BUS_ID = 1, 6  # COCO category ids
# Objects in bus.jpg (xyxy pixels; the consensus of the models in ../shared/models and YOLOX's metadata).
BUS_BOX = [13.0, 230.0, 800.0, 740.0]
PERSON_BOXES = [[50.0, 397.0, 240.0, 903.0], [221.0, 405.0, 345.0, 858.0], [670.0, 390.0, 810.0, 878.0]]


def ultralytics_models() -> list[Path]:
    """Every Ultralytics export in ../shared/models (its metadata.yaml says author: Ultralytics)."""
    found = []
    if not SHARED_MODELS.is_dir():
        return found
    for folder in sorted(SHARED_MODELS.iterdir()):
        meta = folder / "metadata.yaml"
        if not meta.is_file() or yaml.safe_load(meta.read_text()).get("author") != "Ultralytics":
            continue
        if any(folder.glob("*.xml")):  # an OpenVINO export is the folder itself
            found.append(folder)
        else:
            found.extend(
                f for f in sorted(folder.iterdir()) if f.suffix in {".tflite", ".onnx", ".pt", ".engine"}
            )
    return found


MODELS = ultralytics_models()


def test_shared_models_are_there():
    assert SHARED_MODELS.is_dir(), f"the tests need the real detectors in {SHARED_MODELS}"
    assert len(MODELS) >= 4, MODELS


def test_importing_detens_adapters_is_light():
    code = (
        "import sys, detens, detens.adapters, detens.adapters.ultralytics, detens.adapters.torchvision, "
        "detens.adapters.precomputed, detens.adapters.augmented, detens.sources, detens.ensemble_config\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('ultralytics', 'onnxruntime', 'openvino', 'albumentations')"
        " or m.startswith('torchvision.models')]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def assert_valid(det: Detections, image_size: tuple[int, int]) -> None:
    assert isinstance(det, Detections) and det.image_size == image_size and det.device.type == "cpu"
    assert det.boxes.dtype == torch.float32 and det.labels.dtype == torch.int64
    if len(det):
        assert set(det.labels.tolist()) <= set(COCO_CATEGORY_IDS)
        assert float(det.scores.min()) >= 0 and float(det.scores.max()) <= 1


def assert_finds_bus_and_people(det: Detections) -> None:
    """The bus and the three people standing in bus.jpg, each found with IoU >= 0.6."""
    confident = det[det.scores >= 0.25]
    buses = confident[confident.labels == BUS_ID]
    people = confident[confident.labels == PERSON]
    assert len(buses) >= 1, confident.labels.tolist()
    assert float(box_iou(torch.tensor([BUS_BOX]), buses.boxes).max()) >= 0.6
    assert len(people) >= 3
    best = box_iou(torch.tensor(PERSON_BOXES), people.boxes).max(dim=1).values
    assert (best >= 0.6).all(), best


# ------------------------------------------------------------------------------------------- Ultralytics
@pytest.fixture(scope="module", params=MODELS, ids=[p.name for p in MODELS])
def yolo(request):
    from detens.adapters.ultralytics import UltralyticsDetector

    return UltralyticsDetector(request.param, conf=0.001)


@pytest.mark.slow
class TestUltralyticsSharedModels:
    def test_bus_jpg(self, yolo):
        det = yolo([BUS])[0]
        assert_valid(det, (1080, 810))
        assert_finds_bus_and_people(det)
        assert det.source == yolo.name

    def test_batch_of_path_and_array(self, yolo):
        bus, zidane = yolo([BUS, cv2.imread(str(ZIDANE))])
        assert_valid(bus, (1080, 810))
        assert_valid(zidane, (720, 1280))
        assert int((zidane[zidane.scores >= 0.25].labels == PERSON).sum()) >= 2
        again = yolo([BUS])[0]  # batches give the same answer as single calls
        torch.testing.assert_close(bus.boxes, again.boxes)

    def test_blank_image_gives_valid_detections(self, yolo):
        det = yolo(np.full((200, 300, 3), 114, np.uint8))[0]
        assert_valid(det, (200, 300))
        assert len(det) == 0 or float(det.scores.max()) < 0.25

    def test_loaded_model_gives_the_same_detections(self, yolo):
        from ultralytics import YOLO

        from detens.adapters.ultralytics import UltralyticsDetector

        model = YOLO(yolo.resolved.value, task="detect")
        loaded = UltralyticsDetector(model)
        assert loaded.model is model and loaded.name == yolo.name  # named after the file it was loaded from
        got, expected = loaded([BUS])[0], yolo([BUS])[0]
        assert len(got) > 0 and got.source == yolo.name
        assert torch.equal(got.boxes, expected.boxes) and torch.equal(got.scores, expected.scores)
        assert torch.equal(got.labels, expected.labels)


@pytest.fixture(scope="module")
def v8():
    from detens.adapters.ultralytics import UltralyticsDetector

    return UltralyticsDetector("yolov8n_int8_tflite/yolov8n_int8.tflite", conf=0.25, batch=2)


class TestUltralyticsOptions:
    def test_name_weights_and_fixed_size_export(self, v8):
        assert v8.name == "yolov8n_int8"
        assert Path(v8.resolved.value) == SHARED_MODELS / "yolov8n_int8_tflite" / "yolov8n_int8.tflite"
        assert len(v8.model_names) == 80 and v8.model_names[0] == "person"

    def test_categories_map_by_name(self, v8):
        from detens.adapters.ultralytics import UltralyticsDetector

        mapped = UltralyticsDetector(
            "yolov8n_int8_tflite/yolov8n_int8.tflite",
            conf=0.25,
            categories={10: "Person", 20: "bus", 30: "motorbike"},
        )
        det = mapped([BUS])[0]
        assert set(det.labels.tolist()) == {10, 20}
        plain = v8([BUS])[0]
        assert len(det) == int(((plain.labels == PERSON) | (plain.labels == BUS_ID)).sum())

    def test_classes_mapped_onto_one_id_keep_every_box(self):
        from detens.adapters.ultralytics import UltralyticsDetector

        merged = UltralyticsDetector(
            "yolov8n_int8_tflite/yolov8n_int8.tflite", conf=0.001, class_map={"car": 1, "truck": 1, "bus": 1}
        )
        plain = UltralyticsDetector("yolov8n_int8_tflite/yolov8n_int8.tflite", conf=0.001)
        det, reference = merged([BUS])[0], plain([BUS])[0]
        vehicles = reference[torch.isin(reference.labels, torch.tensor([3, 6, 8]))]
        assert set(vehicles.labels.tolist()) == {3, 6, 8}  # boxes of the three classes, some of them overlapping
        assert set(det.labels.tolist()) == {1}
        # relabelled, not suppressed again: the boxes of every merged class, as the detector gave them
        expected = sorted(zip(vehicles.scores.tolist(), vehicles.boxes.tolist(), strict=True))
        assert sorted(zip(det.scores.tolist(), det.boxes.tolist(), strict=True)) == expected
        assert float(box_iou(det.boxes, det.boxes).fill_diagonal_(0).max()) > 0.5

    @pytest.mark.parametrize("class_map, error, fragment", [
        ({"bus": 1.9}, TypeError, r"class_map\['bus'\] must be an integer, got float"),
        ({5: -1}, ValueError, r"class_map\[5\] must be an integer in \[0, 2147483647\], got -1"),
        ({5: 2**40}, ValueError, r"class_map\[5\] must be an integer in"),
        ({0.7: 5}, TypeError, r"class_map key 0.7 must be an integer, got float"),
        ({"bus": "person"}, TypeError, r"class_map\['bus'\] must be an integer, got str"),
        ([1.0] * 80, TypeError, r"class_map\[0\] must be an integer, got float"),
    ])
    def test_bad_class_map_is_named(self, class_map, error, fragment):
        from detens.adapters._labels import build_label_lookup

        names = [f"class{i}" for i in range(79)] + ["bus"]
        with pytest.raises(error, match=fragment):
            build_label_lookup(names, default="coco80", class_map=class_map, where="v8")

    @pytest.mark.parametrize("class_map, fragment", [
        ({"bus": 6, 79: 5}, r"maps class 79 \('bus'\) twice, as 'bus' and 79"),
        ({"motorbike": 4, "motorcycle": 3}, r"maps class 3 \('motorcycle'\) twice, as 'motorbike' and 'motorcycle'"),
        ({1: 2, "1": 3}, r"maps class 1 \('class1'\) twice, as 1 and '1'"),
    ])
    def test_a_class_mapped_twice_is_refused(self, class_map, fragment):
        """Each key of a class map is a promise about one class: a second key for it would win unseen."""
        from detens.adapters._labels import build_label_lookup

        names = ["class0", "class1", "class2", "motorcycle"] + [f"class{i}" for i in range(4, 79)] + ["bus"]
        with pytest.raises(ValueError, match=fragment):
            build_label_lookup(names, default="coco80", class_map=class_map, where="v8")

    @pytest.mark.parametrize("given, suggested", [("persn", " Did you mean 'person'?"),
                                                  ("Trafic_Light", " Did you mean 'traffic light'?"),
                                                  ("zebra crossing", "")])
    def test_a_class_name_the_model_lacks_is_refused_with_the_closest_name(self, given, suggested):
        """Names are compared as the class map reads them (case and ``_`` aside), and shown as the model has them."""
        from detens.adapters._labels import build_label_lookup
        from detens.labels import COCO_NAMES

        with pytest.raises(ValueError) as refused:
            build_label_lookup(COCO_NAMES, default="coco80", class_map={given: 1}, where="v8")
        assert str(refused.value) == (f"v8: class_map names class {given!r}, which the model does not have "
                                      f"({list(COCO_NAMES[:10])}...).{suggested}")

    def test_a_saved_category_id_mapped_twice_is_refused(self):
        from detens.adapters._labels import check_category_id_map

        assert check_category_id_map({"1": 2, 3: 4}, "saved") == {1: 2, 3: 4}
        with pytest.raises(ValueError, match=r"^saved: class_map gives saved category id 1 twice \(1 and '1'\)"):
            check_category_id_map({1: 2, "1": 3}, "saved")

    def test_a_label_space_difference_is_worded_alike_whichever_side_lacks_the_id(self):
        """Every refusal and warning of two label spaces names each differing id in these words."""
        from detens.adapters._labels import describe_label_space_difference, label_space_differences

        differences = label_space_differences({1: "person", 2: "car", 3: "dog"}, {1: "Person", 2: "truck", 4: "cat"})
        assert [describe_label_space_difference(d, "in the head", "there") for d in differences] == [
            "2 is 'car' in the head but 'truck' there", "3 is 'dog' in the head and no category there",
            "4 is no category in the head but 'cat' there"]

    def test_a_label_space_naming_two_categories_alike_is_not_matched_by_name(self):
        from detens.adapters._labels import build_label_lookup

        names = ["person", "motorcycle"]
        with pytest.raises(ValueError, match=r"names categories 4 and 9 alike \('motorbike'\).*class_map="):
            build_label_lookup(names, default="coco80", categories={1: "person", 4: "Motorcycle", 9: "motorbike"})
        assert build_label_lookup(names, default="coco80", categories={1: "person", 4: "motorcycle"}).tolist() == [1, 4]

    def test_categories_no_class_is_named_as_are_a_warning(self, caplog):
        """A dataset that names some classes as the model does and others its own way: those others would get
        no box at all, and mAP would count them as missed, with only an INFO line about the model's classes."""
        from detens.adapters._labels import build_label_lookup

        names = ["person", "car", "dog"]
        with caplog.at_level(logging.WARNING, logger="detens.adapters._labels"):
            lookup = build_label_lookup(names, default="coco80", categories={10: "person", 20: "automobile",
                                                                             30: "doggo"}, where="v8")
        assert lookup.tolist() == [10, -1, -1]
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warned == ["v8: no class of the model has the name of the categories ['automobile', 'doggo'] of the "
                          "label space, so it gives them no box; if it has them under other names, give the model a "
                          "class_map, {model class index or name: category id} (the member's class_map: key in an "
                          "ensemble YAML, class_map= in Python)"], warned
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="detens.adapters._labels"):
            build_label_lookup(names, default="coco80", categories={1: "person", 3: "car"})  # a subset: all seen
            build_label_lookup(names, default="coco80", categories={1: "person", 2: "auto"}, class_map={"car": 2})
        assert not caplog.records

    def test_class_map_ids_outside_the_categories_are_named(self):
        from detens.adapters._labels import build_label_lookup

        names, categories = ["person", "bus"], {1: "person", 2: "bus"}
        with pytest.raises(ValueError, match=r"^v8: class_map\[0\] = 7 is not one of the 2 category ids of the label "
                                             r"space: 1, 2; neither are class_map\['bus'\] = 6; map the classes"):
            build_label_lookup(names, default="coco80", categories=categories, class_map={0: 7, "bus": 6}, where="v8")
        with pytest.raises(ValueError, match=r"^v8: class_map\[1\] = 999 is not one of the 2 category ids"):
            build_label_lookup(names, default="coco80", categories=categories, class_map=[1, 999], where="v8")
        lookup = build_label_lookup(names, default="coco80", categories=categories, class_map={"bus": 2})
        assert lookup.tolist() == [-1, 2]
        # without categories the label space is the caller's: the ids are not compared with any
        assert build_label_lookup(names, default="coco80", class_map={"bus": 999}).tolist() == [-1, 999]

    def test_class_map(self):
        from detens.adapters.ultralytics import UltralyticsDetector

        det = UltralyticsDetector("yolov8n_int8_tflite/yolov8n_int8.tflite", conf=0.25, class_map={"bus": 1})(
            [BUS]
        )[0]
        assert det.labels.tolist() == [1]

    def test_fixed_size_export_warns_when_imgsz_is_not_its_size(self, caplog):
        from detens.adapters.ultralytics import UltralyticsDetector

        with caplog.at_level(logging.WARNING):
            UltralyticsDetector("yolov8n_int8_tflite/yolov8n_int8.tflite", imgsz=640)
            assert not [r for r in caplog.records if "imgsz" in r.getMessage()]
            UltralyticsDetector("yolov8n_int8_tflite/yolov8n_int8.tflite", imgsz=320)
        assert "yolov8n_int8: a fixed-size export, it runs at 640x640 (height x width); imgsz 320 is not used" in caplog.text

    def test_unreadable_image_names_the_file(self, v8, tmp_path):
        bad = tmp_path / "corrupt image.jpg"
        bad.write_bytes(b"not a jpeg")
        with pytest.raises(ImageReadError, match="corrupt image.jpg"):
            v8([BUS, bad])

    @pytest.mark.parametrize(
        "kwargs, fragment", [({"conf": 2.0}, "conf"), ({"imgsz": 0}, "imgsz"), ({"max_det": 0}, "max_det")]
    )
    def test_bad_arguments(self, kwargs, fragment):
        from detens.adapters.ultralytics import UltralyticsDetector

        with pytest.raises(ValueError, match=fragment):
            UltralyticsDetector("yolov8n_int8_tflite/yolov8n_int8.tflite", **kwargs)


    @pytest.mark.parametrize(
        "kwargs, message",
        [
            ({"imgsz": 640.0}, "imgsz must be an integer, got float: 640.0"),
            ({"imgsz": True}, "imgsz must be an integer, got bool: True"),
            ({"imgsz": "640"}, "imgsz must be an integer, got str: '640'"),
            ({"batch": 2.0}, "batch must be an integer, got float: 2.0"),
            ({"batch": True}, "batch must be an integer, got bool: True"),
            ({"max_det": 300.0}, "max_det must be an integer, got float: 300.0"),
        ],
    )
    def test_integer_options_of_another_type_are_a_type_error(self, kwargs, message):
        from detens.adapters.ultralytics import UltralyticsDetector

        with pytest.raises(TypeError, match=message):
            UltralyticsDetector("yolov8n_int8_tflite/yolov8n_int8.tflite", **kwargs)

    def test_iou_none_is_refused_before_the_model_loads(self, monkeypatch):
        # None is torchvision's "the model's own"; Ultralytics' NMS takes a number, and float(None) failed
        # after the model was read, naming no option
        from detens.adapters import ultralytics
        from detens.adapters.ultralytics import UltralyticsDetector

        monkeypatch.setattr(ultralytics, "load_yolo", lambda resolved: pytest.fail("the model was loaded"))
        with pytest.raises(TypeError, match=r"^iou must be a number in \(0, 1\], the IoU threshold of Ultralytics' "
                                            r"NMS, got None$"):
            UltralyticsDetector("yolov8n_int8_tflite/yolov8n_int8.tflite", iou=None)

    def test_numpy_integer_options_detect_as_python_ints(self, v8):
        from detens.adapters.ultralytics import UltralyticsDetector

        detector = UltralyticsDetector(
            "yolov8n_int8_tflite/yolov8n_int8.tflite", conf=0.25, imgsz=np.int64(640), max_det=np.int32(300),
            batch=np.int64(2),
        )
        assert detector.batch == 2 and type(detector.batch) is int
        assert all(type(detector.predict_args[key]) is int for key in ("imgsz", "max_det"))
        got, expected = detector([BUS, ZIDANE]), v8([BUS, ZIDANE])
        for g, e in zip(got, expected, strict=True):
            assert len(g) > 0 and torch.equal(g.boxes, e.boxes) and torch.equal(g.scores, e.scores)
            assert torch.equal(g.labels, e.labels)


class TestUltralyticsLoadedModel:
    def test_task_guessed_and_explicit_name(self):
        from ultralytics import YOLO

        from detens.adapters.ultralytics import UltralyticsDetector

        model = YOLO(str(SHARED_MODELS / "yolov8n_int8_tflite" / "yolov8n_int8.tflite"))  # no task given
        detector = UltralyticsDetector(model, conf=0.25, name="v8")
        assert detector.name == "v8" and detector.model is model
        det = detector([BUS])[0]
        assert_valid(det, (1080, 810))
        assert det.source == "v8" and BUS_ID in det.labels.tolist()

    @pytest.mark.parametrize(
        "make, error, fragment",
        [
            (lambda: 3, TypeError, r"path \(str or os.PathLike\) or a loaded ultralytics.YOLO model, got int$"),
            (lambda: None, TypeError, "got NoneType$"),
            (lambda: torch.nn.Linear(2, 2), TypeError, "got torch.nn.modules.linear.Linear$"),
            (
                lambda: __import__("torchvision").models.detection.ssdlite320_mobilenet_v3_large(
                    weights=None, weights_backbone=None
                ),
                TypeError,
                "got torchvision.models.detection.ssd.SSD; a torchvision detection model goes to TorchvisionDetector",
            ),
            (
                lambda: __import__("ultralytics").YOLO("yolov8n-cls.yaml"),  # built offline, untrained
                ValueError,
                "got a 'classify' model",
            ),
        ],
        ids=["int", "None", "nn.Module", "torchvision", "classify"],
    )
    def test_rejects(self, make, error, fragment):
        from detens.adapters.ultralytics import UltralyticsDetector

        with pytest.raises(error, match=fragment):
            UltralyticsDetector(make())


@pytest.mark.slow
@pytest.mark.parametrize("model_yaml", ["yolov8n.yaml", "yolo26n.yaml"])
def test_ultralytics_pt_built_locally(tmp_path, model_yaml):
    """The .pt path: an untrained model built from a model YAML (offline), saved, loaded back by path."""
    from ultralytics import YOLO

    from detens.adapters.ultralytics import UltralyticsDetector

    path = tmp_path / f"{Path(model_yaml).stem}_untrained.pt"
    YOLO(model_yaml).save(path)
    detector = UltralyticsDetector(path, conf=0.0, imgsz=160, max_det=20, device="cpu")
    assert detector.name == path.stem and len(detector.model_names) == 80
    bus, zidane = detector([BUS, ZIDANE])
    assert_valid(bus, (1080, 810))
    assert_valid(zidane, (720, 1280))
    assert 0 < len(bus) <= 20  # untrained scores are tiny but conf=0 keeps them
    assert bool((bus.boxes[:, 2:] <= torch.tensor([810.0, 1080.0]) + 1e-3).all())


# ------------------------------------------------------------------------------------------- torchvision
UNCUT = 100_000  # a torchvision model's max detections that keeps every box its NMS keeps


def _reference_model(arch: str, conf: float, max_det: int, **kwargs):
    """The torchvision model built directly, with the score threshold and max detections as builder arguments."""
    from torchvision.models import get_model

    if arch.startswith(("fasterrcnn", "maskrcnn", "keypointrcnn")):
        kwargs.update(box_score_thresh=conf, box_detections_per_img=max_det)
    else:
        kwargs.update(score_thresh=conf, detections_per_img=max_det)
    return get_model(arch, weights=None, weights_backbone=None, **kwargs).eval()


TORCHVISION_ARCHS = [
    pytest.param("fasterrcnn_mobilenet_v3_large_320_fpn", {}, id="fasterrcnn_mobilenet_v3_large_320_fpn"),
    pytest.param("ssdlite320_mobilenet_v3_large", {}, id="ssdlite320_mobilenet_v3_large"),
    pytest.param(
        "retinanet_resnet50_fpn", {"imgsz": 320}, id="retinanet_resnet50_fpn", marks=pytest.mark.slow
    ),
    pytest.param("fcos_resnet50_fpn", {"imgsz": 320}, id="fcos_resnet50_fpn", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("arch, options", TORCHVISION_ARCHS)
def test_torchvision_state_dict_by_path(tmp_path, arch, options):
    """A real architecture (untrained), its state dict saved and loaded by path, gives the model's own output."""
    from detens.adapters.torchvision import TorchvisionDetector

    torch.manual_seed(0)
    imgsz = options.get("imgsz")
    size_kwargs = {"min_size": imgsz, "max_size": imgsz} if imgsz else {}
    reference = _reference_model(arch, conf=0.001, max_det=UNCUT, **size_kwargs)
    path = tmp_path / f"{arch}.pth"
    torch.save(reference.state_dict(), path)

    detector = TorchvisionDetector(arch, weights=path, conf=0.001, max_det=100, device="cpu", **options)
    assert detector.name == arch and detector.weights_source == str(path)
    if imgsz:  # the big ResNet-50 models: one image is enough
        (bus,) = detector([BUS])
    else:
        bus, zidane = detector([BUS, ZIDANE])
        assert_valid(zidane, (720, 1280))
    assert_valid(bus, (1080, 810))
    assert len(bus) > 0

    assert_same_as_reference(bus, reference, max_det=100)


def run_torchvision(model: torch.nn.Module) -> Detections:
    """The torchvision ``model``'s own output on bus.jpg, labels as it predicts them."""
    rgb = torch.from_numpy(read_image(BUS)[:, :, ::-1].copy()).permute(2, 0, 1).float() / 255
    with torch.inference_mode():
        output = model([rgb])[0]
    return Detections(output["boxes"], output["scores"], output["labels"], (1080, 810))


def assert_close_detections(got: Detections, expected: Detections, where: str = "") -> None:
    for field in ("boxes", "scores", "labels"):
        torch.testing.assert_close(getattr(got, field), getattr(expected, field),
                                   msg=lambda message, field=field: f"{where} {field}: {message}")


def assert_same_as_reference(bus: Detections, reference: torch.nn.Module, max_det: int) -> None:
    """``bus`` (a detector's Detections of bus.jpg) is what the torchvision model ``reference`` outputs (built with
    ``UNCUT`` max detections): its boxes of COCO categories, the first ``max_det`` (an untrained model's "N/A" ids
    are dropped before they take a place)."""
    expected = run_torchvision(reference)
    expected = expected[torch.isin(expected.labels, torch.tensor(COCO_CATEGORY_IDS))][:max_det]
    assert len(expected) > 0
    assert_close_detections(bus, expected)


@pytest.mark.parametrize(
    "arch, class_name",
    [("fasterrcnn_mobilenet_v3_large_320_fpn", "FasterRCNN"), ("ssdlite320_mobilenet_v3_large", "SSD")],
)
def test_torchvision_built_model(arch, class_name):
    """A model built by the caller gives the model's own output with the detector's options; it is put in
    eval() mode and keeps its own thresholds."""
    from torchvision.models import get_model

    from detens.adapters.torchvision import TorchvisionDetector

    torch.manual_seed(0)
    reference = _reference_model(arch, conf=0.001, max_det=UNCUT)
    model = get_model(arch, weights=None, weights_backbone=None)  # its own thresholds: 0.05 / 0.001 and 100 / 300
    model.load_state_dict(reference.state_dict())
    holder = model.roi_heads if hasattr(model, "roi_heads") else model
    own = (holder.score_thresh, holder.detections_per_img)
    detector = TorchvisionDetector(model, conf=0.001, max_det=100)
    assert detector.name == class_name and detector.arch == class_name and detector.model is model
    assert detector.device == torch.device("cpu") and detector.weights_source is None
    assert not model.training and (holder.score_thresh, holder.detections_per_img) == own
    bus = detector([BUS])[0]
    assert (holder.score_thresh, holder.detections_per_img) == own
    assert_valid(bus, (1080, 810))
    assert_same_as_reference(bus, reference, max_det=100)
    assert TorchvisionDetector(model, name="mine").name == "mine"


LOOSE = {"conf": 0.001, "max_det": 100}
STRICT = {"conf": 0.2, "iou": 0.3, "max_det": 50, "imgsz": 256}


def test_torchvision_detectors_that_share_one_model_each_run_with_their_own_options(jittered):
    """The options were set on the model when a detector was built: the detector built first then ran with
    those of the one built last."""
    import copy

    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    from detens.adapters.torchvision import TorchvisionDetector

    torch.manual_seed(0)
    model = jittered(fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None))
    loose_alone = TorchvisionDetector(copy.deepcopy(model), **LOOSE)([BUS])[0]
    strict_alone = TorchvisionDetector(copy.deepcopy(model), **STRICT)([BUS])[0]
    assert len(strict_alone) < len(loose_alone) == LOOSE["max_det"]  # the options make a difference here

    loose = TorchvisionDetector(model, **LOOSE, name="loose")
    strict = TorchvisionDetector(model, **STRICT, name="strict")
    for detector, alone in ((loose, loose_alone), (strict, strict_alone), (loose, loose_alone)):
        det = detector([BUS])[0]
        assert_valid(det, (1080, 810))
        assert_close_detections(det, alone, detector.name)


def test_torchvision_detector_leaves_the_models_own_settings(jittered):
    """A model the caller still calls directly behaves as before it was given to a detector: the detector's
    options are the model's during its calls only, a call that raises included."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    from detens.adapters.torchvision import TorchvisionDetector

    torch.manual_seed(0)
    model = jittered(fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None)).eval()
    holder, transform = model.roi_heads, model.transform

    def settings() -> tuple[Any, ...]:
        return (holder.score_thresh, holder.nms_thresh, holder.detections_per_img, transform.min_size,
                transform.max_size)

    own = settings()
    direct = run_torchvision(model)
    detector = TorchvisionDetector(model, **STRICT)
    assert settings() == own

    during_calls = []
    recording = model.backbone.register_forward_pre_hook(lambda *_: during_calls.append(settings()))
    detector([BUS])
    recording.remove()
    assert [(s[0], s[1], s[3], s[4]) for s in during_calls] == [(0.2, 0.3, (256,), 256)]
    assert settings() == own and "postprocess_detections" not in vars(holder)

    def fail(*_: Any) -> None:
        raise RuntimeError("the forward pass failed")

    failing = model.backbone.register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="the forward pass failed"):
        detector([BUS])
    failing.remove()
    assert settings() == own and "postprocess_detections" not in vars(holder)

    assert_close_detections(run_torchvision(model), direct)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torchvision_built_model_stays_on_its_device():
    from detens.adapters.torchvision import TorchvisionDetector

    model = _reference_model("ssdlite320_mobilenet_v3_large", 0.001, 50).cuda()
    detector = TorchvisionDetector(model)
    assert detector.device.type == "cuda" and next(model.parameters()).is_cuda
    det = detector([BUS])[0]
    assert_valid(det, (1080, 810))  # Detections come back on the CPU, as from every adapter
    assert len(det) > 0


@pytest.mark.parametrize(
    "arch, kwargs, num_classes",
    [
        ("fasterrcnn_mobilenet_v3_large_320_fpn", {}, 91),
        ("fasterrcnn_mobilenet_v3_large_320_fpn", {"num_classes": 5}, 5),
        ("ssdlite320_mobilenet_v3_large", {"num_classes": 7}, 7),
        ("retinanet_resnet50_fpn", {"num_classes": 3}, 3),
        ("fcos_resnet50_fpn", {"num_classes": 4}, 4),
    ],
)
def test_torchvision_built_model_classes(arch, kwargs, num_classes):
    """The label lookup covers the classes the built model has (read from its classification layer)."""
    from torchvision.models import get_model

    from detens.adapters.torchvision import TorchvisionDetector

    model = get_model(arch, weights=None, weights_backbone=None, **kwargs)
    if num_classes == 91:  # COCO: category ids as predicted, background and "N/A" dropped
        detector = TorchvisionDetector(model)
        assert detector.lookup.numel() == num_classes
        assert detector.lookup[1] == 1 and detector.lookup[0] == -1 and detector.lookup[12] == -1
        # by index, as a class_map's index keys are read when class_maps are compared by class
        assert (detector.model_names[1], detector.model_names[12], len(detector.model_names)) == ("person", "N/A", 91)
        return
    # its own classes: its labels are no COCO ids, so the dataset's categories are needed to read them
    with pytest.raises(ValueError, match=rf"has {num_classes} classes \(background included\), not the 91 of "
                                         r"torchvision's COCO models, so its labels are no COCO category ids"):
        TorchvisionDetector(model)
    categories = {label: f"class {label}" for label in range(1, num_classes)}
    detector = TorchvisionDetector(model, categories=categories)
    assert detector.lookup.tolist() == [-1, *range(1, num_classes)] and detector.categories == categories
    with pytest.raises(ValueError, match=rf"labels 1-{num_classes - 1} are taken as category ids of categories=, "
                                         rf"which lacks {num_classes - 1}: give a class_map"):
        TorchvisionDetector(model, categories={label: f"c{label}" for label in range(1, num_classes - 1)})
    detector = TorchvisionDetector(model, class_map={1: 7})  # said explicitly: onto COCO's 7, the rest dropped
    assert detector.lookup.tolist() == [-1, 7, *[-1] * (num_classes - 2)]


@pytest.mark.parametrize(
    "make, kwargs, error, fragment",
    [
        (lambda: 3, {}, TypeError, "builder name .* or a built torchvision detection model .*, got int$"),
        (
            lambda: torch.nn.Linear(2, 2),
            {},
            TypeError,
            "got an nn.Module that is not a torchvision detection model: torch.nn.modules.linear.Linear$",
        ),
        (
            lambda: __import__("ultralytics").YOLO("yolov8n.yaml"),
            {},
            TypeError,
            "ultralytics.models.yolo.model.YOLO; an Ultralytics model goes to UltralyticsDetector",
        ),
        (lambda: "SSD", {}, ValueError, "unknown torchvision detection architecture 'SSD'"),
        (
            lambda: _reference_model("ssdlite320_mobilenet_v3_large", 0.001, 10),
            {"weights": "mine.pth"},
            ValueError,
            "weights='mine.pth' is for a builder name; a built SSD keeps its own weights",
        ),
        (
            lambda: _reference_model("ssdlite320_mobilenet_v3_large", 0.001, 10),
            {"min_size": 300},
            TypeError,
            r"\['min_size'\] are torchvision builder arguments",
        ),
    ],
    ids=["int", "nn.Module", "ultralytics", "class name", "weights", "builder kwargs"],
)
def test_torchvision_rejects(make, kwargs, error, fragment):
    from detens.adapters.torchvision import TorchvisionDetector

    with pytest.raises(error, match=fragment):
        TorchvisionDetector(make(), **kwargs)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"imgsz": 320.0}, TypeError, "imgsz must be an integer, got float: 320.0"),
        ({"imgsz": False}, TypeError, "imgsz must be an integer, got bool: False"),
        ({"imgsz": 16}, ValueError, "imgsz must be an integer >= 32, got 16"),
        ({"batch": 1.0}, TypeError, "batch must be an integer, got float: 1.0"),
        ({"batch": 0}, ValueError, "batch must be an integer >= 1, got 0"),
        ({"num_classes": 5.0}, TypeError, "num_classes must be an integer, got float: 5.0"),
        ({"num_classes": "5"}, TypeError, "num_classes must be an integer, got str: '5'"),
        ({"num_classes": 0}, ValueError, "num_classes must be an integer >= 1, got 0"),
    ],
)
def test_torchvision_integer_options_are_checked_before_building(monkeypatch, kwargs, error, message):
    from torchvision import models

    from detens.adapters.torchvision import TorchvisionDetector

    monkeypatch.setattr(models, "get_model", lambda *a, **k: pytest.fail("built before its options were checked"))
    with pytest.raises(error, match=message):
        TorchvisionDetector("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None, **kwargs)


def test_torchvision_builder_arguments_are_checked_before_building(monkeypatch):
    """torchvision's builders pass unknown names on to the model's transform, which drops them: a misspelled
    min_size left the model at its own size, unseen."""
    from torchvision import models

    from detens.adapters.torchvision import TorchvisionDetector

    with monkeypatch.context() as patched:
        patched.setattr(models, "get_model", lambda *a, **k: pytest.fail("built before its arguments were checked"))
        with pytest.raises(TypeError, match=r"^fasterrcnn_mobilenet_v3_large_320_fpn: 'min_szie' is no argument of "
                                            r"torchvision's 'fasterrcnn_mobilenet_v3_large_320_fpn' \(its builder, "
                                            r"model and transform\); valid: .*\bmin_size, .*\. Did you mean "
                                            r"'min_size'\?$"):
            TorchvisionDetector("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None, min_szie=300)
        with pytest.raises(TypeError, match=r"^v: 'foo', 'bar' are no arguments of torchvision's 'ssdlite320_mobilenet"
                                            r"_v3_large' .*valid: detections_per_img, .*\bnorm_layer\b"):
            TorchvisionDetector("ssdlite320_mobilenet_v3_large", weights=None, name="v", foo=1, bar=2)
        with pytest.raises(TypeError, match=r"'min_szie' is no argument of torchvision's 'fasterrcnn_mobilenet"):
            build_detector({"type": "torchvision", "arch": "fasterrcnn_mobilenet_v3_large_320_fpn", "name": "frcnn",
                            "options": {"min_szie": 300}})
    # the builder's own, the model class's and the transform's are taken
    detector = TorchvisionDetector("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None, min_size=300,
                                   progress=False, rpn_pre_nms_top_n_test=100, size_divisible=16)
    transform = detector.model.transform
    assert (transform.min_size, transform.size_divisible, detector.model.rpn._pre_nms_top_n["testing"]) == ((300,), 16, 100)


def test_torchvision_weights_backbone_is_passed_to_the_builder(tmp_path):
    """A builder argument like any other: with weights=None or a state-dict file it stopped at torchvision's
    "get_model() got multiple values for keyword argument 'weights_backbone'"."""
    from detens.adapters.torchvision import TorchvisionDetector

    arch = "ssdlite320_mobilenet_v3_large"
    untrained = TorchvisionDetector(arch, weights=None, weights_backbone=None, device="cpu")
    path = tmp_path / "ssd.pt"
    torch.save(untrained.model.state_dict(), path)
    loaded = TorchvisionDetector(arch, weights=path, weights_backbone=None, device="cpu")
    assert loaded.weights_source == str(path)
    for key, value in untrained.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value), key


@pytest.mark.parametrize("built", [False, True], ids=["by name", "built"])
def test_torchvision_keypoint_rcnn_predicts_persons(built):
    """torchvision's Keypoint R-CNN weights have two classes, "no person" (the background) and person: a
    built model was refused as one of 2 classes, not COCO's 91; by name, "no person" was category 0."""
    from torchvision.models.detection import keypointrcnn_resnet50_fpn

    from detens.adapters.torchvision import TorchvisionDetector

    arch = keypointrcnn_resnet50_fpn(weights=None, weights_backbone=None) if built else "keypointrcnn_resnet50_fpn"
    kwargs = {} if built else {"weights": None}
    assert TorchvisionDetector(arch, **kwargs).lookup.tolist() == [-1, PERSON]
    assert TorchvisionDetector(arch, categories={7: "person", 8: "car"}, **kwargs).lookup.tolist() == [-1, 7]


@pytest.mark.parametrize("categories", [
    [{"id": 1, "name": "person", "supercategory": "person"}, {"id": 2, "name": "bus"}],
    {"info": {}, "images": [], "categories": [{"id": 1, "name": "person"}, {"id": 2, "name": "bus"}]},
    {"1": "person", "2": "bus"},
], ids=["COCO list", "annotation dict", "string keys"])
def test_torchvision_categories_in_every_coco_form(categories):
    from detens.adapters.torchvision import TorchvisionDetector

    detector = TorchvisionDetector("ssdlite320_mobilenet_v3_large", weights=None, categories=categories)
    assert detector.categories == {1: "person", 2: "bus"}
    assert detector.lookup[PERSON] == 1 and detector.lookup[BUS_ID] == 2 and (detector.lookup >= 0).sum() == 2


def test_torchvision_numpy_integer_options_are_the_python_ints_they_hold():
    from detens.adapters.torchvision import TorchvisionDetector

    options = {"imgsz": 320, "max_det": 50, "batch": 2, "num_classes": 5, "class_map": {k: k for k in range(1, 5)}}
    expected = TorchvisionDetector("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None, **options)
    detector = TorchvisionDetector(
        "fasterrcnn_mobilenet_v3_large_320_fpn", weights=None,
        **{k: v if k == "class_map" else np.int64(v) for k, v in options.items()}
    )
    transform = detector.model.transform
    seen = []  # the input size the model runs at, set for the length of a call
    transform.register_forward_pre_hook(lambda *_: seen.append((transform.min_size, transform.max_size)))
    detector([np.zeros((64, 64, 3), np.uint8)])
    assert seen == [((320,), 320)] and type(seen[0][1]) is int
    assert (detector.batch, detector.max_det, detector.imgsz) == (2, 50, 320)
    assert all(type(v) is int for v in (detector.batch, detector.max_det, detector.imgsz))
    assert detector.lookup.tolist() == expected.lookup.tolist() == [-1, 1, 2, 3, 4]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_torchvision_model_in_half_precision_on_the_cpu_is_refused_naming_why(dtype):
    """torchvision's CPU NMS has no float16 kernel: the first image would fail with torch's own message."""
    from torchvision.models import get_model

    from detens.adapters.torchvision import TorchvisionDetector

    model = get_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None, weights_backbone=None).to(dtype)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ValueError, match=rf"^FasterRCNN: the model is in {name}, which torchvision's detection ops "
                                         r"\(NMS, RoI pooling\) do not run on the CPU: give device='cuda' for a GPU, or "
                                         r"the model in float32 \(model\.float\(\)\)$"):
        TorchvisionDetector(model, device="cpu")
    assert TorchvisionDetector(model.float(), device="cpu").input_dtype == torch.float32


@pytest.mark.parametrize("device, fragment", [
    ("cuda", "yolov8n: device is 'cuda' but no CUDA device is available on this machine"),
    ("cuda:1", "yolov8n: device is 'cuda:1' but no CUDA device is available"),
    ("0", "yolov8n: device '0', a CUDA index, is 'cuda:0' but no CUDA device is available"),
    ("0,1", "yolov8n: device '0,1', a CUDA index, is 'cuda:0' but no CUDA device is available"),
    ("gpu", "yolov8n: device must be a torch device: cpu, cuda or cuda:<index>, got 'gpu'"),
])
def test_ultralytics_device_this_machine_lacks_is_refused_before_loading(monkeypatch, device, fragment):
    """Ultralytics itself would say so only at the first prediction, as a failure to load the weights."""
    from detens.adapters import ultralytics as adapter

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(adapter, "load_yolo", lambda resolved: pytest.fail("loaded before the device was checked"))
    with pytest.raises(ValueError, match=re.escape(fragment)):
        adapter.UltralyticsDetector("yolov8n_int8_tflite/yolov8n_int8.tflite", name="yolov8n", device=device)


@pytest.mark.parametrize("built", [False, True], ids=["builder name", "built model"])
def test_torchvision_device_this_machine_lacks_is_refused_before_building(monkeypatch, built):
    from detens.adapters import torchvision as adapter

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(adapter.TorchvisionDetector, "_build", lambda *a, **k: pytest.fail("built first"))
    arch = "ssdlite320_mobilenet_v3_large"
    model = _reference_model(arch, 0.001, 10) if built else arch
    with pytest.raises(ValueError, match=r"ssd: device is 'cuda' but no CUDA device is available on this machine"):
        adapter.TorchvisionDetector(model, weights=None, name="ssd", device="cuda")


@pytest.fixture(scope="module")
def state():
    """The state dict of an untrained SSDlite."""
    torch.manual_seed(1)
    return _reference_model(TestTorchvisionLoading.ARCH, 0.001, 50).state_dict()


class TestTorchvisionLoading:
    ARCH = "ssdlite320_mobilenet_v3_large"

    def test_checkpoint_dict_and_safetensors(self, tmp_path, state):
        from safetensors.torch import save_file

        from detens.adapters.torchvision import TorchvisionDetector

        torch.save({"model": state, "epoch": 3}, tmp_path / "ckpt.pth")
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "w.safetensors"))
        a = TorchvisionDetector(self.ARCH, weights=tmp_path / "ckpt.pth", max_det=50, device="cpu")([BUS])[0]
        b = TorchvisionDetector(self.ARCH, weights=tmp_path / "w.safetensors", max_det=50, device="cpu")(
            [BUS]
        )[0]
        torch.testing.assert_close(a.boxes, b.boxes)
        assert len(a) > 0

    def test_weights_relative_to_weights_dir(self, tmp_path, state, monkeypatch):
        from detens.adapters.torchvision import TorchvisionDetector

        monkeypatch.setenv("DETENS_WEIGHTS", str(tmp_path))
        torch.save(state, tmp_path / "mine.pth")
        assert TorchvisionDetector(self.ARCH, weights="mine.pth", device="cpu").weights_source == str(
            tmp_path / "mine.pth"
        )

    def test_wrong_state_dict(self, tmp_path):
        from detens.adapters.torchvision import TorchvisionDetector

        torch.save({"backbone.weight": torch.zeros(3)}, tmp_path / "bad.pth")
        with pytest.raises(ValueError, match="does not fit torchvision") as raised:
            TorchvisionDetector(self.ARCH, weights=tmp_path / "bad.pth", device="cpu")
        # one line, naming a few keys and how many: torch's own message lists every one of them
        message = str(raised.value)
        assert "\n" not in message and len(message) < 600, message
        assert re.search(r"missing keys: backbone\.features\.\S+, .*, \.\.\. \(\d{3} in all\); "
                         r"unexpected keys: backbone\.weight$", message), message

    def test_a_state_dict_of_other_shapes_names_them(self, tmp_path, state):
        from detens.adapters.torchvision import TorchvisionDetector

        torch.save(state, tmp_path / "ninety.pth")
        with pytest.raises(ValueError, match=r"with num_classes=3: other shapes: head\.classification_head\.\S+ "
                                             r"\[\d+(, \d+)*\] \(the model's: \[\d+"):
            TorchvisionDetector(self.ARCH, weights=tmp_path / "ninety.pth", device="cpu", num_classes=3)

    @pytest.mark.parametrize("name, content", [
        ("garbage.pth", lambda state: b"not a checkpoint" * 64),
        ("truncated.pth", "truncated"),
        ("garbage.safetensors", lambda state: b'{"a":'),
    ], ids=["not a torch file", "truncated", "not safetensors"])
    def test_unreadable_weights_file_is_a_value_error_naming_it(self, tmp_path, state, name, content):
        """A weights file that is damaged is the user's to replace: a ValueError naming it, as the CLI
        reports in one line, not torch's or safetensors' own exception without the path."""
        from detens.adapters.torchvision import TorchvisionDetector

        path = tmp_path / name
        if content == "truncated":
            torch.save(state, tmp_path / "whole.pth")
            path.write_bytes((tmp_path / "whole.pth").read_bytes()[:5000])
        else:
            path.write_bytes(content(state))
        with pytest.raises(ValueError, match=re.escape(repr(str(path))) + " could not be read as a state dict"):
            TorchvisionDetector(self.ARCH, weights=path, device="cpu")

    def test_unknown_arch_suggests(self):
        from detens.adapters.torchvision import TorchvisionDetector

        with pytest.raises(ValueError, match="Did you mean 'fasterrcnn_resnet50_fpn'"):
            TorchvisionDetector("fasterrcnn_resnet50", weights=None)

    def test_unknown_weights_name(self):
        from detens.adapters.torchvision import TorchvisionDetector

        with pytest.raises(ValueError, match="not a torchvision weights name"):
            TorchvisionDetector(self.ARCH, weights="IMAGENET_V7")

    def test_missing_weights_file(self):
        from detens.adapters.torchvision import TorchvisionDetector
        from detens.adapters.weights import WeightsNotFoundError

        with pytest.raises(WeightsNotFoundError, match="missing.pth"):
            TorchvisionDetector(self.ARCH, weights="missing.pth")

    def test_categories_by_name(self, tmp_path, state):
        from detens.adapters.torchvision import TorchvisionDetector

        torch.save(state, tmp_path / "w.pth")
        det = TorchvisionDetector(
            self.ARCH, weights=tmp_path / "w.pth", categories={7: "person", 8: "tv monitor"}, device="cpu"
        )
        assert set(det.lookup[det.lookup >= 0].tolist()) == {7, 8}
        assert set(det([BUS])[0].labels.tolist()) <= {7, 8}


# ------------------------------------------------------------------ max_det counts the label space's boxes
PEOPLE_AND_BAGS = {1: "person", 31: "handbag"}  # COCO ids and names: labels compare with an all-class run
K = 5  # the restricted members' max_det; bus.jpg's bus is among every model's 5 best boxes


def assert_best_of_kept(restricted: Detections, everything: Detections, categories: Mapping[int, str]) -> None:
    """The slow reference: ``restricted`` (a member limited to ``categories``, max_det ``K``) holds the ``K`` best
    boxes of ``everything`` (the same member over every class, uncut) whose label is one of ``categories``; boxes
    that tie at the cut may stand for each other."""
    ids = torch.tensor(list(categories))
    # a class outside ``categories`` is among the K best of every class: a cut before the lookup would show
    assert not torch.isin(everything.labels[everything.scores.topk(K).indices], ids).all()
    kept = everything[torch.isin(everything.labels, ids)]
    assert len(kept) > K

    def rows(det: Detections) -> set[tuple[float, int, tuple[float, ...]]]:
        return set(zip(det.scores.tolist(), det.labels.tolist(), map(tuple, det.boxes.tolist()), strict=True))

    assert len(restricted) == K and rows(restricted) <= rows(kept)  # K distinct boxes of the kept classes...
    best = kept.scores.sort(descending=True).values[:K]
    assert restricted.scores.sort(descending=True).values.tolist() == best.tolist()  # ...the best K


@pytest.mark.parametrize(
    "weights",
    [
        "yolov8n_int8_tflite/yolov8n_int8.tflite",
        "yolo26n_int8_tflite/yolo26n_int8.tflite",
        "yolo11n_int8_openvino_model",
    ],
    ids=["nms-tflite", "end2end-tflite", "nms-openvino"],
)
def test_ultralytics_max_det_counts_the_label_space_only(weights):
    from ultralytics import YOLO

    from detens.adapters.ultralytics import UltralyticsDetector

    model = YOLO(str(SHARED_MODELS / weights), task="detect")  # one loaded model for both: nothing carries over
    restricted = UltralyticsDetector(model, conf=0.001, max_det=K, categories=PEOPLE_AND_BAGS)([BUS])[0]
    everything = UltralyticsDetector(model, conf=0.001, max_det=1000)([BUS])[0]
    assert_best_of_kept(restricted, everything, PEOPLE_AND_BAGS)


def test_onnx_max_det_counts_the_label_space_only():
    from detens.adapters.onnx import OnnxDetector

    weights = SHARED_MODELS / "yolox_nano_onnx" / "yolox_nano.onnx"
    restricted = OnnxDetector(weights, "yolox", conf=0.001, max_det=K, categories=PEOPLE_AND_BAGS)([BUS])[0]
    everything = OnnxDetector(weights, "yolox", conf=0.001, max_det=1000)([BUS])[0]
    assert_best_of_kept(restricted, everything, PEOPLE_AND_BAGS)


@pytest.mark.parametrize("arch", ["fasterrcnn_mobilenet_v3_large_320_fpn", "ssdlite320_mobilenet_v3_large"])
def test_torchvision_max_det_counts_the_label_space_only(arch, jittered):
    """An untrained R-CNN (its boxes come from its RoI heads) and SSD (from the model itself), their weights
    jittered."""
    from torchvision.models import get_model

    from detens.adapters.torchvision import TorchvisionDetector

    torch.manual_seed(0)
    reference = jittered(_reference_model(arch, conf=0.001, max_det=UNCUT))
    model = get_model(arch, weights=None, weights_backbone=None)
    model.load_state_dict(reference.state_dict())
    own_max_det = (model.roi_heads if hasattr(model, "roi_heads") else model).detections_per_img
    categories = {1: "person", 3: "car", 62: "chair"}
    restricted = TorchvisionDetector(model, conf=0.001, max_det=K, categories=categories)([BUS])[0]
    assert_best_of_kept(restricted, run_torchvision(reference), categories)
    holder = model.roi_heads if hasattr(model, "roi_heads") else model
    assert holder.detections_per_img == own_max_det and "postprocess_detections" not in vars(holder)  # as it was


# ------------------------------------------------------------------------------------------- precomputed
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Real predictions of YOLOv8n on bus.jpg and zidane.jpg, saved as COCO results with a COCO image list."""
    from detens.adapters.ultralytics import UltralyticsDetector

    folder = tmp_path_factory.mktemp("saved")
    detector = UltralyticsDetector("yolov8n_int8_tflite/yolov8n_int8.tflite", conf=0.05)
    dets = detector([BUS, ZIDANE])
    results = detections_to_coco(dets[0], 11, decimals=None) + detections_to_coco(dets[1], 22, decimals=None)
    (folder / "yolov8n.json").write_text(json.dumps(results))
    gt = {
        "images": [
            {"id": 11, "file_name": "assets/bus.jpg", "height": 1080, "width": 810},
            {"id": 22, "file_name": "zidane.jpg", "height": 720, "width": 1280},
            {"id": 33, "file_name": "empty.jpg", "height": 10, "width": 10},
        ],
        "annotations": [],
        "categories": [{"id": 1, "name": "person"}],
    }
    (folder / "gt.json").write_text(json.dumps(gt))
    return folder, dets


class TestPrecomputed:
    def test_replays_by_file_name(self, saved):
        folder, dets = saved
        replay = PrecomputedDetector(folder / "yolov8n.json", folder / "gt.json")
        assert replay.name == "yolov8n"
        bus, zidane = replay([BUS, ZIDANE])
        for got, want in ((bus, dets[0]), (zidane, dets[1])):
            want = want.sort_by_score()
            torch.testing.assert_close(got.boxes, want.boxes)
            torch.testing.assert_close(got.scores, want.scores)
            assert got.labels.tolist() == want.labels.tolist() and got.image_size == want.image_size

    def test_own_images_come_before_the_default_images(self, saved, tmp_path):
        """A fuse output folder's predictions.json names its images in images.json beside it: those ids win
        over an ensemble's dataset, whose ids for the same files may differ."""
        folder, dets = saved
        (tmp_path / "predictions.json").write_text((folder / "yolov8n.json").read_text())
        (tmp_path / "images.json").write_text((folder / "gt.json").read_text())
        swapped = json.loads((folder / "gt.json").read_text())
        swapped["images"][0]["id"], swapped["images"][1]["id"] = 22, 11  # the same files, other ids
        (tmp_path / "other_dataset.json").write_text(json.dumps(swapped))
        replay = PrecomputedDetector(tmp_path / "predictions.json", default_images=tmp_path / "other_dataset.json")
        bus = replay([BUS])[0]
        torch.testing.assert_close(bus.boxes, dets[0].sort_by_score().boxes)
        # given explicitly, images are the user's word; the default is used when the results name none
        explicit = PrecomputedDetector(tmp_path / "predictions.json", tmp_path / "other_dataset.json")
        assert len(explicit([BUS])[0]) == len(dets[1])
        alone = PrecomputedDetector(folder / "yolov8n.json", default_images=folder / "gt.json")
        torch.testing.assert_close(alone([BUS])[0].boxes, dets[0].sort_by_score().boxes)
        model = ModelConfig(type="precomputed", results=str(tmp_path / "predictions.json"), name="fused")
        config = EnsembleConfig(dataset=str(tmp_path / "other_dataset.json"), models=[model])
        torch.testing.assert_close(build_detector(model, config, None)([BUS])[0].boxes, dets[0].sort_by_score().boxes)

    def test_ids_mapping_and_filters(self, saved):
        folder, dets = saved
        results = json.loads((folder / "yolov8n.json").read_text())
        replay = PrecomputedDetector(
            results, {"bus.jpg": 11, "zidane.jpg": 22}, name="v8", conf=0.5, max_det=2
        )
        bus = replay([BUS])[0]  # size read from the image: the mapping has none
        assert bus.image_size == (1080, 810) and len(bus) == 2 and float(bus.scores.min()) >= 0.5
        assert replay.name == "v8"

    def test_predictions_json_of_fuse_and_class_map(self, saved, tmp_path):
        folder, _ = saved
        predictions = {
            "images": json.loads((folder / "gt.json").read_text())["images"],
            "results": json.loads((folder / "yolov8n.json").read_text()),
        }
        (tmp_path / "predictions.json").write_text(json.dumps(predictions))
        replay = PrecomputedDetector(tmp_path / "predictions.json", class_map={6: 60})
        assert replay([BUS])[0].labels.tolist() == [60]
        assert len(replay([33])[0]) == 0  # an image id; no results → empty

    def test_results_list_with_images_json_beside(self, saved, tmp_path):
        folder, _ = saved
        (tmp_path / "predictions.json").write_text((folder / "yolov8n.json").read_text())
        with pytest.raises(ValueError) as unnamed:
            PrecomputedDetector(tmp_path / "predictions.json")
        assert str(unnamed.value) == (
            f"{tmp_path / 'predictions.json'}: COCO results do not name their images; give the member its images "
            "(the `images` key of a precomputed member in an ensemble YAML, images= in Python): a COCO annotation "
            "file, or a {file_name: image_id} mapping"
        )
        gt = json.loads((folder / "gt.json").read_text())
        (tmp_path / "images.json").write_text(json.dumps({**gt, "annotations": []}))
        replay = PrecomputedDetector(tmp_path / "predictions.json", class_map={6: 60})
        assert replay([BUS])[0].labels.tolist() == [60]

    def test_a_members_results_saved_by_fuse_find_the_runs_images(self, saved, tmp_path):
        """``detens fuse --save-per-model`` writes ``per_model/<name>.json`` below the run's images.json."""
        folder, _ = saved
        (tmp_path / "per_model").mkdir()
        (tmp_path / "per_model" / "yolov8n.json").write_text((folder / "yolov8n.json").read_text())
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "yolov8n.json").write_text((folder / "yolov8n.json").read_text())
        gt = json.loads((folder / "gt.json").read_text())
        (tmp_path / "images.json").write_text(json.dumps({**gt, "annotations": []}))
        replay = PrecomputedDetector(tmp_path / "per_model" / "yolov8n.json", class_map={6: 60})
        assert replay([BUS])[0].labels.tolist() == [60]
        with pytest.raises(ValueError, match="do not name their images"):  # only fuse's own layout is read so
            PrecomputedDetector(tmp_path / "other" / "yolov8n.json")

    def test_arrays_need_paths(self, saved):
        folder, _ = saved
        replay = PrecomputedDetector(folder / "yolov8n.json", folder / "gt.json")
        image = read_image(BUS)
        with pytest.raises(TypeError, match="file name"):
            replay([image])
        assert len(detect_loaded(replay, [image], [BUS])[0]) > 0
        with pytest.raises(ValueError, match="another image"):
            detect_loaded(replay, [read_image(ZIDANE)], [BUS])

    def test_unknown_image_and_missing_images(self, saved, tmp_path):
        folder, _ = saved
        replay = PrecomputedDetector(folder / "yolov8n.json", folder / "gt.json")
        with pytest.raises(KeyError, match="no saved predictions for"):
            replay([tmp_path / "other.jpg"])
        # a ValueError too, as the input contract says of every mistake, and its message is no quoted repr
        with pytest.raises(ValueError) as raised:
            replay([tmp_path / "other.jpg"])
        assert str(raised.value).startswith(f"yolov8n: no saved predictions for {str(tmp_path / 'other.jpg')!r}")
        with pytest.raises(ValueError, match="image id 123456789 is not among the"):
            replay.image_record(123456789)
        with pytest.raises(ValueError, match="images="):
            PrecomputedDetector(folder / "yolov8n.json")

    def test_results_of_other_images_are_named(self, caplog):
        results = [{"image_id": i, "category_id": 1, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5} for i in (7, 1000007)]
        with pytest.raises(ValueError, match=r"none of the results' 1 image ids \(\[1000007\]\) is among the 1 images"):
            PrecomputedDetector(results[1:], {"a.jpg": 7})
        with caplog.at_level(logging.WARNING):
            PrecomputedDetector(results, {"a.jpg": 7})
        assert "1 of the results' image ids are not among the 1 images (e.g. [1000007])" in caplog.text

    def test_results_without_a_detection_are_warned_about(self, tmp_path, caplog):
        (tmp_path / "saved.json").write_text("[]")
        with caplog.at_level(logging.WARNING):
            replay = PrecomputedDetector(tmp_path / "saved.json", [{"id": 7, "file_name": "a.jpg", "height": 80,
                                                                    "width": 100}], name="v8")
        assert f"{tmp_path / 'saved.json'} holds no detection: member v8 gives none on any image" in caplog.text
        assert len(replay(7)[0]) == 0  # a normal case all the same
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            PrecomputedDetector([{"image_id": 7, "category_id": 1, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5}],
                                {"a.jpg": 7})
        assert "holds no detection" not in caplog.text

    @pytest.mark.parametrize("images, error, message", [
        ({"a.jpg": 7.5}, TypeError, r"the image id of 'a\.jpg' in images \(\{file_name: image_id\}\) must be an integer, got float"),
        ({"a.jpg": "7"}, TypeError, "must be an integer, got str: '7'"),
        ({"a.jpg": None}, TypeError, "must be an integer, got NoneType"),
        ({"a.jpg": 7, "b.jpg": 7}, ValueError, "image id 7 is given to both 'a.jpg' and 'b.jpg'"),
        ([{"id": 7, "file_name": "a.jpg"}, {"id": 7, "file_name": "b.jpg"}], ValueError,
         "image id 7 is given to both 'a.jpg' and 'b.jpg'"),
        ([{"id": 7.0, "file_name": "a.jpg"}], TypeError, r"images\[0\]\.id must be an integer, got float"),
        # one file under two ids: its saved boxes were looked up under the last of them only
        ([{"id": 7, "file_name": "a.jpg"}, {"id": 8, "file_name": "a.jpg"}], ValueError,
         r"^images: 'a\.jpg' is listed under both image id 7 and 8; each image file needs one record$"),
    ], ids=["float", "str", "None", "two files", "two records", "record float", "one file twice"])
    def test_an_image_map_with_ids_that_are_no_image_ids_is_refused(self, images, error, message):
        results = [{"image_id": 7, "category_id": 1, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5}]
        with pytest.raises(error, match=message):
            PrecomputedDetector(results, images)

    def test_category_ids_outside_a_label_space_are_named(self, tmp_path):
        results = [{"image_id": 7, "category_id": c, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5}
                   for c in (1, 999, 12, 999, 3)]
        (tmp_path / "saved.json").write_text(json.dumps(results))
        replay = PrecomputedDetector(tmp_path / "saved.json", {"a.jpg": 7}, name="v8")
        with pytest.raises(ValueError) as err:
            replay.check_categories(COCO_CATEGORY_IDS, "COCO")
        assert str(err.value).startswith(
            f"{tmp_path / 'saved.json'} (member 'v8'): result 1 (image_id 7) has category_id 999, which is not one "
            "of the 80 category ids of COCO: 1-11, 13-25, 27, 28, 31-44, 46-65, 67, 70, 72-82, 84-90; neither are "
            "the saved ids [12]; give the member a class_map")
        replay.check_categories([1, 3, 12, 999])
        # ids the class_map leaves out are dropped on purpose; ids it maps are checked after the map
        PrecomputedDetector(results, {"a.jpg": 7}, class_map={1: 1, 3: 3}).check_categories([1, 3])
        with pytest.raises(ValueError, match=r"result 0 \(image_id 7\) has category_id 1 \(mapped to 5 by its "
                                             r"class_map\), which is not one of the 2 category ids of the label "
                                             r"space: 1, 3; correct its class_map"):
            PrecomputedDetector(results, {"a.jpg": 7}, class_map={1: 5, 3: 3}).check_categories([1, 3])

    def test_class_map_ids_outside_given_categories_are_named_at_once(self):
        results = [{"image_id": 7, "category_id": 1, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5}]
        categories = {1: "person", 2: "bus"}
        # saved id 6 is in no result: its mapped id is wrong all the same
        with pytest.raises(ValueError, match=r"^v8: class_map\[6\] = 60 is not one of the 2 category ids"):
            PrecomputedDetector(results, {"a.jpg": 7}, name="v8", class_map={1: 1, 6: 60}, categories=categories)
        PrecomputedDetector(results, {"a.jpg": 7}, name="v8", class_map={1: 1, 6: 2}, categories=categories)

    @pytest.mark.parametrize("options, error, fragment", [
        ({"max_det": -1}, ValueError, r"v8: max_det must be an integer >= 1, got -1"),
        ({"max_det": 2.5}, TypeError, r"v8: max_det must be an integer, got float"),
        ({"max_det": True}, TypeError, r"v8: max_det must be an integer, got bool"),
        ({"conf": "0.3"}, TypeError, r"v8: conf must be a number, got str"),
        ({"conf": 1.5}, ValueError, r"v8: conf must be in \[0, 1\], got 1.5"),
        ({"class_map": {1: 1.9}}, TypeError, r"v8: class_map\[1\] must be an integer, got float"),
        ({"class_map": {1: -7}}, ValueError, r"v8: class_map\[1\] must be an integer in \[0, 2147483647\]"),
        ({"class_map": {1: 2**40}}, ValueError, r"v8: class_map\[1\] must be an integer in"),
        ({"class_map": {0.7: 5}}, TypeError, r"v8: class_map key 0.7 must be an integer, got float"),
        ({"class_map": {"person": 5}}, TypeError,
         r"v8: class_map key 'person' is a class name, but saved predictions have no class names: their class_map "
         r"is keyed by the category_id values of the results file, \{saved category_id: category id\} such as"),
        ({"class_map": {"1.5": 5}}, TypeError, r"v8: class_map key '1.5' must be an integer, got str"),
        ({"class_map": [1, 2]}, TypeError, r"v8: class_map must be \{saved category_id: category_id\}, got list"),
    ])
    def test_bad_options_are_named(self, options, error, fragment):
        results = [{"image_id": 7, "category_id": 1, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5}]
        with pytest.raises(error, match=fragment):
            PrecomputedDetector(results, {"a.jpg": 7}, name="v8", **options)

    def test_a_category_id_no_label_can_be_is_refused_when_the_results_are_read(self, tmp_path):
        results = [{"image_id": 7, "category_id": c, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5} for c in (1, -1)]
        (tmp_path / "saved.json").write_text(json.dumps(results))
        with pytest.raises(ValueError, match=re.escape(
                f"{tmp_path / 'saved.json'}[1].category_id must be a category id in [0, 2147483647], got -1")):
            PrecomputedDetector(tmp_path / "saved.json", {"a.jpg": 7})

    @pytest.mark.parametrize("categories", [
        [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}],
        {"images": [], "categories": [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}]},
        {"1": "person", "3": "car"},
    ], ids=["COCO list", "annotation dict", "string keys"])
    def test_categories_in_every_coco_form(self, categories):
        results = [{"image_id": 7, "category_id": 1, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5}]
        replay = PrecomputedDetector(results, {"a.jpg": 7}, name="v8", class_map={1: 3}, categories=categories)
        assert replay.categories == {1: "person", 3: "car"}
        with pytest.raises(ValueError, match=r"^v8: class_map\[1\] = 2 is not one of the 2 category ids"):
            PrecomputedDetector(results, {"a.jpg": 7}, name="v8", class_map={1: 2}, categories=categories)

    def test_class_map_keys_may_be_digit_strings(self):
        results = [{"image_id": 7, "category_id": c, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5} for c in (1, 3)]
        replay = PrecomputedDetector(results, {"a.jpg": 7}, class_map={"3": 30})  # as JSON gives them
        assert replay.class_map == {3: 30}

    def test_missing_or_broken_files_are_named(self, saved, tmp_path):
        folder, _ = saved
        with pytest.raises(FileNotFoundError, match=r"COCO results file not found: .*nowhere\.json"):
            PrecomputedDetector(tmp_path / "nowhere.json", folder / "gt.json")
        with pytest.raises(FileNotFoundError, match=r"COCO annotation file not found: .*no_gt\.json"):
            PrecomputedDetector(folder / "yolov8n.json", tmp_path / "no_gt.json")
        (tmp_path / "broken.json").write_text('[{"image_id": 1,')
        with pytest.raises(ValueError, match=r"broken\.json is not valid JSON"):
            PrecomputedDetector(tmp_path / "broken.json", folder / "gt.json")


# ------------------------------------------------------------------------------------------- test-time views
VIEWS = ["hflip", "vflip", "scale=0.5", "scale=1.7", "hflip+scale=0.83", "hflip+vflip+scale=0.6"]


@pytest.mark.parametrize("spec", VIEWS)
def test_view_inverse_undoes_albumentations(spec):
    """Boxes moved by albumentations' own bbox transform come back exactly with View.invert_boxes."""
    import albumentations as A

    view = View.parse(spec)
    size = (37, 53)
    gen = torch.Generator().manual_seed(0)
    xy1 = torch.rand(20, 2, generator=gen) * torch.tensor([40.0, 25.0])
    wh = torch.rand(20, 2, generator=gen) * torch.tensor([12.0, 11.0]) + 1
    boxes = torch.cat([xy1, xy1 + wh], 1)  # [20, 4], inside the 53 x 37 image
    compose = A.Compose(
        view.transform(size).transforms, bbox_params=A.BboxParams(format="pascal_voc", label_fields=["ids"])
    )
    image = np.zeros((*size, 3), np.uint8)
    out = compose(image=image, bboxes=boxes.numpy(), ids=list(range(20)))
    assert out["image"].shape[:2] == (view.apply(image).shape[:2])
    moved = torch.as_tensor(np.asarray(out["bboxes"]), dtype=torch.float32)
    assert moved.shape == (20, 4)
    torch.testing.assert_close(view.invert_boxes(moved, size), boxes, atol=1e-3, rtol=0)


def test_view_images():
    image = np.random.default_rng(0).integers(0, 255, (20, 30, 3), dtype=np.uint8)
    np.testing.assert_array_equal(View.parse("hflip").apply(image), image[:, ::-1])
    np.testing.assert_array_equal(View.parse("vflip").apply(image), image[::-1])
    small = View.parse("scale=0.5").apply(image)
    assert small.shape == image.shape and (small[10:, :] == 114).all() and (small[:, 15:] == 114).all()
    assert View.parse("identity").apply(image) is image


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("rotate", "unknown view 'rotate'"),
        ("scale=0", "scale"),
        ("", "non-empty"),
        ({"flip": True}, "unknown view option"),
        ("scale=0.5+scale=0.8", "view 'scale=0.5\\+scale=0.8' gives scale twice"),
        ("hflip+hflip", "gives hflip twice"),
        ("tiles=2x2+overlap=0.2+tiles=3x3", "gives tiles twice"),
    ],
)
def test_bad_views(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        View.parse(spec)


@pytest.mark.parametrize("spec", [5, None, ["hflip"]])
def test_a_view_of_another_type_is_a_type_error(spec):
    with pytest.raises(TypeError, match=r"a view must be a string such as 'hflip' .*, got "):
        View.parse(spec)


@pytest.mark.slow
def test_flipped_view_agrees_with_plain_run():
    """On bus.jpg, each confident box of the plain run has a same-class box in the flipped view (mapped back) with IoU > 0.9."""
    from detens.adapters.ultralytics import UltralyticsDetector

    detector = UltralyticsDetector("yolo26n_int8_tflite/yolo26n_int8.tflite", conf=0.05)
    tta = AugmentedDetector(detector, ["identity", "hflip", "scale=0.83"])
    assert [m.name for m in tta.members] == ["yolo26n_int8", "yolo26n_int8|hflip", "yolo26n_int8|scale=0.83"]
    assert tta.members[0] is detector and isinstance(tta.members[1], AugmentedView)
    ((plain, flipped, smaller),) = tta([BUS])
    for det in (plain, flipped, smaller):
        assert_valid(det, (1080, 810))
    confident = plain[plain.scores >= 0.5]
    assert len(confident) >= 4
    for other, threshold in ((flipped, 0.9), (smaller, 0.8)):
        for box, label in zip(confident.boxes, confident.labels, strict=True):
            same = other[other.labels == label]
            assert len(same), f"class {int(label)} missing in {other.source}"
            iou = float(box_iou(box[None], same.boxes).max())
            assert iou > threshold, (other.source, box.tolist(), iou)
    # the flip really happened: the flipped view's raw boxes are mirrored
    raw = detector([cv2.flip(read_image(BUS), 1)])[0]
    mirrored = View.parse("hflip").invert_boxes(raw.boxes, (1080, 810))
    torch.testing.assert_close(
        Detections(mirrored, raw.scores, raw.labels, (1080, 810)).clip().boxes, flipped.boxes
    )


@pytest.mark.slow
def test_tiled_view_on_real_images():
    """YOLO26n on 2x2 tiles of bus.jpg and zidane.jpg: each confident box of the plain run that lies inside
    a tile, clear of its inner edges, is found again (same class, IoU > 0.7); the bus, which every tile
    cuts, is left to the plain run (no tiled box overlaps it by more than 0.5)."""
    from detens.adapters._tiles import cut_by_inner_edges
    from detens.adapters.ultralytics import UltralyticsDetector

    detector = UltralyticsDetector("yolo26n_int8_tflite/yolo26n_int8.tflite", conf=0.05)
    tta = AugmentedDetector(detector, ["identity", "tiles=2x2"])
    assert [m.name for m in tta] == ["yolo26n_int8", "yolo26n_int8|tiles=2x2"]
    checked = 0
    for path in (BUS, ZIDANE):
        ((plain, tiled),) = tta([path])
        assert_valid(tiled, plain.image_size)
        confident = plain[plain.scores >= 0.3]
        windows = tta.members[1].view.windows(plain.image_size)
        for box, label in zip(confident.boxes, confident.labels, strict=True):
            same = tiled[tiled.labels == label]
            best = float(box_iou(box[None], same.boxes).max()) if len(same) else 0.0
            clear = any(not cut_by_inner_edges(box[None], w, plain.image_size, margin=10.0)[0] and
                        box[0] >= w[0] and box[1] >= w[1] and box[2] <= w[2] and box[3] <= w[3] for w in windows)
            if clear:
                assert best > 0.7, (path.name, box.tolist(), best)
                checked += 1
            elif int(label) == BUS_ID:
                assert best <= 0.5, (path.name, box.tolist(), best)
    assert checked >= 2


def test_augmented_detector_rejects():
    class Fake:
        name = "fake"

        def __call__(self, images):
            return [Detections.empty(im.shape[:2], "fake") for im in images]

    with pytest.raises(ValueError, match="repeat"):
        AugmentedDetector(Fake(), ["hflip", "hflip"])
    with pytest.raises(TypeError, match=r"^detector must be a detector \(callable, with a name\), got int$"):
        AugmentedDetector(5, ["hflip"])
    with pytest.raises(TypeError, match=r"^views must be a list of views \('hflip', 'scale=0.83', ...\), got NoneType$"):
        AugmentedDetector(Fake(), None)
    with pytest.raises(TypeError, match=r"^model must be a ModelConfig or a mapping \(a YAML models entry\), got list$"):
        build_detector(["ultralytics"])
    tta = AugmentedDetector(Fake(), "vflip")
    assert [m.name for m in tta] == ["fake|vflip"]
    ((only,),) = tta([np.zeros((5, 6, 3), np.uint8)])
    assert only.image_size == (5, 6) and only.source == "fake|vflip"


@pytest.mark.slow
def test_readme_bring_your_detectors_snippet(monkeypatch):
    """The README's "Bring your detectors" Python snippet runs as written."""
    import re

    repo = Path(__file__).resolve().parents[1]
    text = (repo / "README.md").read_text(encoding="utf-8")
    section = re.split(r"^## ", text.split("## Bring your detectors", 1)[1], maxsplit=1, flags=re.MULTILINE)[
        0
    ]
    snippets = re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert len(snippets) == 1
    monkeypatch.chdir(repo)
    namespace: dict = {"__name__": "readme_adapters"}
    exec(compile(snippets[0], "README.md:bring-your-detectors", "exec"), namespace)
    assert len(namespace["fused"]) == 2 and all(len(d) > 0 for d in namespace["fused"])
    assert [len(d) for d in namespace["saved"](namespace["images"])] == [
        len(d) for d in namespace["yolo"](namespace["images"])
    ]


def test_an_empty_detector_name_is_refused_not_replaced_by_the_default():
    from detens.adapters import TorchvisionDetector, UltralyticsDetector

    results = [{"image_id": 7, "category_id": 1, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5}]
    makers = [
        lambda name: PrecomputedDetector(results, {"a.jpg": 7}, name=name),
        lambda name: UltralyticsDetector(MODELS[0], name=name),
        lambda name: TorchvisionDetector("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None, name=name),
    ]
    for make in makers:
        with pytest.raises(ValueError, match="detector name must not be empty"):
            make("")
        with pytest.raises(TypeError, match="detector name must be a str, got int: 3"):
            make(3)
    assert PrecomputedDetector(results, {"a.jpg": 7}, name="saved").name == "saved"


OPENVINO_MODELS = [m for m in MODELS if m.is_dir()]


@pytest.mark.skipif(len(OPENVINO_MODELS) < 2, reason="needs two OpenVINO exports in ../shared/models")
def test_a_ctrl_c_after_two_openvino_models_are_freed_in_loading_order_is_a_keyboard_interrupt():
    """OpenVINO puts back, as each model is freed, the thread's alternate signal stack of before its load:
    freed first to last, the thread is left on the first model's freed stack, and Python's SIGINT handler,
    which runs on it, crashed the process instead of raising KeyboardInterrupt (a Ctrl-C lost the run's
    summary). A fresh process: the crash would take the test session with it."""
    first, second = OPENVINO_MODELS[:2]
    code = f"""
import gc, signal
from detens.adapters import build_detector
from detens.adapters._signal_stack import current_signal_stack

signal.signal(signal.SIGINT, signal.default_int_handler)  # started in a background job, SIGINT is ignored

first = build_detector({{"type": "ultralytics", "weights": {str(first)!r}}})
second = build_detector({{"type": "ultralytics", "weights": {str(second)!r}}})
del first
gc.collect()
del second
gc.collect()
address, size = current_signal_stack()
print("stack", address != 0, size)
junk = [bytearray(1 << 16) for _ in range(2000)]  # what reuses the freed stack's memory, in a long run
try:
    signal.raise_signal(signal.SIGINT)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.splitlines()[-2:] == ["stack True 65536", "KeyboardInterrupt"], done.stdout


def test_a_members_options_are_arguments_of_its_detector_that_the_config_does_not_set(tmp_path):
    """They went straight into the constructor: "__init__() got an unexpected keyword argument 'foo'", naming
    neither the member nor its options."""
    from detens.adapters import _construct, build_detector
    from detens.ensemble_config import ModelConfig

    (tmp_path / "r.json").write_text("[]")
    (tmp_path / "i.json").write_text('{"a.jpg": 1}')
    member = {"type": "precomputed", "results": str(tmp_path / "r.json"), "images": str(tmp_path / "i.json"),
              "name": "saved"}
    with pytest.raises(ValueError, match=re.escape(
            "model 'saved': options.foo is not an argument of PrecomputedDetector; the arguments options may give "
            "it: none")):
        build_detector({**member, "options": {"foo": 1}})
    with pytest.raises(ValueError, match=re.escape(
            "model 'saved': options.conf is set by the config itself; give conf as a key of the model (or of the "
            "ensemble), not under options")):
        build_detector({**member, "options": {"conf": 0.5}})

    class Detector:
        def __init__(self, weights, conf=0.1, *, agnostic_nms=False):
            self.arguments = (weights, conf, agnostic_nms)

    model = ModelConfig(weights="w.pt", name="m", options={"agnostic_nms": True})
    assert _construct(Detector, model, "w.pt", conf=0.2).arguments == ("w.pt", 0.2, True)
    with pytest.raises(ValueError, match=r"options may give it: agnostic_nms$"):
        _construct(Detector, ModelConfig(weights="w.pt", name="m", options={"iou": 0.3}), "w.pt", conf=0.2)
