"""Detectors and ensembles called from several threads at once give what they give called one call at a time."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch

from detens.adapters.weights import repository_weights_dir
from detens.detections import Detections
from detens.sources import read_image

SHARED_MODELS = repository_weights_dir()  # ../shared/models next to the repository, as detens finds it
COCO_IMAGES = SHARED_MODELS.parent / "data" / "coco_val2017_206" / "images"
THREADS = 4
TIMEOUT_S = 120  # a call that waits for ever fails the test instead of hanging it


def images(count: int) -> list[np.ndarray]:
    return [read_image(path) for path in sorted(COCO_IMAGES.glob("*.jpg"))[:count]]


def assert_same(got: Detections, expected: Detections, where: str) -> None:
    assert got.image_size == expected.image_size, where
    assert torch.equal(got.boxes, expected.boxes), where
    assert torch.equal(got.scores, expected.scores), where
    assert torch.equal(got.labels, expected.labels), where


def assert_threads_agree(calls: dict[str, Callable[[np.ndarray], Detections]], inputs: Sequence[np.ndarray],
                         rounds: int = 3) -> None:
    """Every call of ``calls`` on every image of ``inputs``, from ``THREADS`` threads at once (each round
    in another order), is exactly what the same call gave on that image alone beforehand."""
    expected = {name: [call(image) for image in inputs] for name, call in calls.items()}
    jobs = [(name, b) for name in calls for b in range(len(inputs))]
    with ThreadPoolExecutor(THREADS) as pool:
        for r in range(rounds):
            order = jobs[r % len(jobs):] + jobs[: r % len(jobs)]
            futures = [(name, b, pool.submit(calls[name], inputs[b])) for name, b in order]
            for name, b, future in futures:
                assert_same(future.result(timeout=TIMEOUT_S), expected[name][b], f"round {r}: {name} on image {b}")


def on_one_image(detector: Any) -> Callable[[np.ndarray], Detections]:
    """``detector`` (or an Ensemble) called on a list of one image, its Detections of that image."""
    return lambda image: detector([image])[0]


# ------------------------------------------------------------------------------------------- torchvision
def test_a_torchvision_detector_from_threads(jittered):
    """The adapter swaps the model's post-processing for its own while the model runs (its max_det counts
    the label space's boxes only). Two calls at once: the call that ended first took the swap away from the
    other, still running, which cut its boxes before the label space, and the model was left with the
    first call's post-processing. A hook on the model's head starts the second call while the first runs, and
    holds each until the other changes the model, so that the outcome does not depend on timing."""
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    from detens.adapters.torchvision import TorchvisionDetector

    torch.manual_seed(0)
    model = jittered(ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None))
    own_max_det = model.detections_per_img
    detector = TorchvisionDetector(model, conf=0.001, max_det=5, categories={1: "person", 3: "car", 62: "chair"})
    image = images(1)[0]
    expected = detector([image])[0]
    calls = itertools.count()
    first_call_running = threading.Event()

    def wait_for_the_other_call(module: torch.nn.Module, inputs: Any) -> None:
        # each of the two calls waits, up to a second, for the post-processing to change under it: the second
        # call swapping in its own, then the first one putting the model's back; one call at a time, in vain
        call = next(calls)
        if call < 2:
            first_call_running.set()
            swapped_in = vars(model).get("postprocess_detections")
            deadline = time.monotonic() + 1.0
            while vars(model).get("postprocess_detections") is swapped_in and time.monotonic() < deadline:
                time.sleep(0.005)

    model.head.register_forward_pre_hook(wait_for_the_other_call)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(detector, [image])]
        assert first_call_running.wait(TIMEOUT_S)
        futures.append(pool.submit(detector, [image]))  # begins while the first call runs
        for n, future in enumerate(futures):
            assert_same(future.result(timeout=TIMEOUT_S)[0], expected, f"call {n}")
    assert model.detections_per_img == own_max_det and "postprocess_detections" not in vars(model)  # as it was


def test_a_model_lock_is_one_per_model_object_hashable_or_not_and_goes_with_it():
    import gc

    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    from detens.adapters import _base
    from detens.adapters.torchvision import TorchvisionDetector

    class EqualByContent(type(ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3))):
        def __eq__(self, other):  # __eq__ without __hash__: instances cannot be dict keys
            return self is other

    model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3)
    model.__class__ = EqualByContent
    with pytest.raises(TypeError):
        hash(model)
    assert _base.model_lock(model) is _base.model_lock(model)
    assert _base.model_lock(model) is not _base.model_lock(torch.nn.Linear(1, 1))
    key = id(model)
    del model
    gc.collect()
    assert key not in _base._MODEL_LOCKS  # not kept for another object that takes the id
    detector = TorchvisionDetector(ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None), conf=0.5)
    assert len(detector(images(1))) == 1 and id(detector.model) in _base._MODEL_LOCKS  # a call takes its lock


def test_torchvision_detectors_that_share_one_model_from_threads(jittered):
    """Each detector sets its options on the model for the length of its call, under the model's lock: two
    detectors of one model, called from several threads, each give what a detector of its own copy gives."""
    import copy

    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    from detens.adapters.torchvision import TorchvisionDetector

    torch.manual_seed(0)
    model = jittered(fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None))
    options = {
        "loose": {"conf": 0.001, "max_det": 100},
        "strict": {"conf": 0.2, "iou": 0.3, "max_det": 50, "imgsz": 256},
    }
    inputs = images(2)
    calls = {name: on_one_image(TorchvisionDetector(model, **kwargs, name=name)) for name, kwargs in options.items()}
    copies = {name: TorchvisionDetector(copy.deepcopy(model), **kwargs) for name, kwargs in options.items()}
    for b, image in enumerate(inputs):
        alone = {name: detector([image])[0] for name, detector in copies.items()}
        assert 0 < len(alone["strict"]) < len(alone["loose"])  # the options make a difference here
        for name, call in calls.items():
            assert_same(call(image), alone[name], f"{name} on image {b}")
    assert_threads_agree(calls, inputs, rounds=2)


# ------------------------------------------------------------------------------------------- Ultralytics
@pytest.mark.slow
def test_ultralytics_detectors_that_share_one_loaded_model_from_threads():
    """Ultralytics' predict hands each call's options to the model's predictor while another call may be
    running: two detectors of one loaded model, with other options, gave each other's boxes."""
    from ultralytics import YOLO

    from detens.adapters.ultralytics import UltralyticsDetector

    model = YOLO(str(SHARED_MODELS / "yolov8n_int8_tflite" / "yolov8n_int8.tflite"), task="detect")
    everything = UltralyticsDetector(model, conf=0.001, name="everything")
    confident = UltralyticsDetector(model, conf=0.5, iou=0.3, max_det=20, name="confident")
    assert_threads_agree({"everything": on_one_image(everything), "confident": on_one_image(confident)}, images(3))


@pytest.mark.slow
def test_an_ultralytics_pytorch_model_first_called_from_threads():
    """A PyTorch model has no predictor until its first call: calls from several threads at once met the one
    that another thread was making, not set up yet, which then loaded the model's file anew, or, for a model
    without one (built from a model YAML here), failed (TypeError: model='yolov8n.yaml' is not a supported
    model format)."""
    from ultralytics import YOLO

    from detens.adapters.ultralytics import UltralyticsDetector

    inputs = images(THREADS)
    for _ in range(3):  # the first calls of a new model each time
        detector = UltralyticsDetector(YOLO("yolov8n.yaml"), conf=0.0, imgsz=160, max_det=20, device="cpu")
        together = threading.Barrier(THREADS)

        def call(image: np.ndarray, detector: UltralyticsDetector = detector,
                 together: threading.Barrier = together) -> Detections:
            together.wait(timeout=TIMEOUT_S)
            return detector([image])[0]

        with ThreadPoolExecutor(THREADS) as pool:
            got = [f.result(timeout=TIMEOUT_S) for f in [pool.submit(call, image) for image in inputs]]
        for b, image in enumerate(inputs):
            assert_same(got[b], detector([image])[0], f"image {b}")


# ---------------------------------------------------------------------------------------------- Ensemble
@pytest.mark.slow
@pytest.mark.parametrize(
    "config, fusion",
    [
        ("coco_yolo3", {"head": "coco_yolo3_deep"}),  # TFLite and OpenVINO YOLOs, the shipped deep head
        ("coco_diverse", {"method": "wbf", "iou_thr": 0.55}),  # a TFLite YOLO, YOLOX and NanoDet in onnxruntime
    ],
)
def test_a_shipped_ensemble_from_threads(config, fusion):
    """One Ensemble of the shipped members, built once and called from several threads (as a threaded web
    server calls it), fuses every image as a call on it alone does; each member alone does as well."""
    import detens

    members = detens.build_ensemble(config)
    ensemble = detens.Ensemble(members, **fusion)
    calls = {"ensemble": on_one_image(ensemble)} | {member.name: on_one_image(member) for member in members}
    assert_threads_agree(calls, images(2), rounds=2)
