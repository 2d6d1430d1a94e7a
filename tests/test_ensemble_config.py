from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from detens.adapters import ADAPTERS, build_detector, build_ensemble, declared_member_names, member_weights
from detens.coco import load_coco_gt
from detens.ensemble_config import (
    EnsembleConfig,
    FusionConfig,
    ModelConfig,
    OutputConfig,
    check_member_name,
    ensemble_config_from_dict,
    load_ensemble_config,
    save_ensemble_config,
    with_absolute_paths,
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "detens" / "configs" / "ensembles").glob("*.yaml"))
KEY_LINE = re.compile(r"^\s*#?\s*(?:-\s+)?([a-z_]+):(.*)$")


def minimal(**extra):
    return {"models": [{"weights": "yolov8n_int8_tflite/yolov8n_int8.tflite"}], **extra}


def test_adapter_types():
    assert ADAPTERS.names() == ["onnx", "precomputed", "torchvision", "ultralytics"]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_load(path):
    config = load_ensemble_config(path)
    assert config.models and config.fusion.method
    assert len(member_weights(config)) == sum(max(1, len(m.tta)) for m in config.models)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_a_copy_of_a_shipped_config_finds_the_same_files(path, tmp_path):
    """Users copy a shipped YAML to edit it: its head must not be a path that exists only in the package."""
    copy = tmp_path / path.name
    copy.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    shipped, copied = load_ensemble_config(path), load_ensemble_config(copy)
    assert copied.fusion.head == shipped.fusion.head
    assert shipped.fusion.head is None or Path(shipped.fusion.head).is_file()


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_key_is_documented(path):
    """Each key used in a shipped YAML carries `# (type) meaning` at least once in that file."""
    documented, used = set(), set()
    for line in path.read_text().splitlines():
        match = KEY_LINE.match(line)
        if not match:
            continue
        key, rest = match.groups()
        if not line.lstrip().startswith("#"):
            used.add(key)
        if re.search(r"#\s*\([^)]+\)\s*\S", rest):
            documented.add(key)
    assert used <= documented, sorted(used - documented)


def test_reference_config_documents_every_field():
    """coco_yolo3.yaml documents every key of every config dataclass (the others refer to it)."""
    text = (REPO / "detens" / "configs" / "ensembles" / "coco_yolo3.yaml").read_text()
    documented = {
        m.group(1) for line in text.splitlines() if (m := KEY_LINE.match(line)) and "# (" in m.group(2)
    }
    fields = {
        f.name
        for cls in (EnsembleConfig, ModelConfig, FusionConfig, OutputConfig)
        for f in dataclasses.fields(cls)
    }
    assert fields <= documented, sorted(fields - documented)


def test_tta_config_members():
    config = load_ensemble_config(REPO / "detens" / "configs" / "ensembles" / "coco_yolo4_tta.yaml")
    assert [m.name for m in config.models] == ["yolov8n", "yolo11n", "yolo26n", "yolov5nu"]
    assert member_weights(config) == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5]


@pytest.mark.parametrize(
    "data, fragment",
    [
        (minimal(imgszz=320), r"unknown key 'imgszz'.*Did you mean 'imgsz'"),
        (
            {"models": [{"wieghts": "x.pt"}]},
            r"unknown key 'wieghts' in .*models\[0\].*Did you mean 'weights'",
        ),
        (minimal(fusion={"metod": "nms"}), r"unknown key 'metod'.*Did you mean 'method'"),
        (minimal(output={"vis_cof": 0.3}), r"Did you mean 'vis_conf'"),
        (
            {"models": [{"type": "ultralytic", "weights": "x.pt"}]},
            r"unknown adapter type 'ultralytic'.*Did you mean 'ultralytics'",
        ),
        (minimal(conf="high"), "expected a number"),
        (minimal(conf=1.5), r"conf must be in \[0, 1\]"),
        ({"models": []}, "at least one"),
        ({"models": [{"type": "ultralytics"}]}, "needs 'weights'"),
        (
            {"models": [{"type": "ultralytics", "weights": "x.pt", "arch": "ssd300_vgg16"}]},
            "'arch' is not used by type 'ultralytics'",
        ),
        ({"models": [{"type": "torchvision"}]}, "needs 'arch'"),
        ({"models": [{"type": "precomputed", "results": "r.json", "tta": ["hflip"]}]}, "cannot be augmented"),
        ({"models": [{"type": "precomputed", "results": "r.json", "half": True}]}, "'half' is not used"),
        ({"models": [{"weights": "x.pt", "tta": ["rotate"]}]}, "unknown view 'rotate'"),
        # refused with the config, not only when its detectors are built (without naming the YAML)
        ({"models": [{"weights": "x.pt", "tta": ["hflip", "HFLIP"]}]}, r"views repeat \['hflip'\]"),
        ({"models": [{"weights": "a.pt", "name": "m"}, {"weights": "b.pt", "name": "m"}]}, "unique"),
        # a member's name is the stem of its files (per_model/<name>.json, partial/<name>/)
        ({"models": [{"weights": "a.pt", "name": "v8/x"}]}, r"model name 'v8/x' cannot name the member's files"),
        ({"models": [{"weights": "a.pt", "name": "../../escaped"}]}, "cannot name the member's files"),
        ({"models": [{"weights": "a.pt", "name": "..\\up"}]}, "cannot name the member's files"),
        ({"models": [{"weights": "a.pt", "name": ".hidden"}]}, "not start with '.'"),
        ({"models": [{"weights": "a.pt", "name": ""}]}, "must be non-empty"),
        ({"models": [{"weights": "a.pt", "name": "a\x00b"}]}, "control characters"),
        (minimal(output={"vis_conf": 2.0}), r"vis_conf must be in \[0, 1\]"),
        (minimal(fusion={"head": " "}), r"fusion.head must be a head file or a shipped head's name, got ' '"),
        (minimal(weights_dir=""), r"weights_dir must be a folder, got ''; leave it out \(null\) for none"),
        (minimal(dataset=" "), r"dataset must be a COCO annotation file, got ' '; leave it out \(null\) for none"),
        ({"models": [{"weights": "a.pt", "class_map": {}}]}, "class_map is empty, so every box would be dropped"),
        ({"models": [{"weights": "a.pt", "class_map": []}]}, "class_map is empty"),
        ({"models": [{"type": "precomputed", "results": "r.json", "class_map": {}}]}, "class_map is empty"),
        ({"models": [{"weights": "a.pt", "class_map": {1: 2, "1": 3}}]}, "class_map gives class 1 twice, as 1 and '1'"),
        ({"models": [{"weights": "a.pt", "class_map": {"7": 2, "person": 1, "07": 3}}]}, "class 7 twice, as '7' and '07'"),
        ({"models": [{"weights": "a.pt", "imgsz": -640}]}, r"model 'a.pt': imgsz must be >= 32, got -640"),
        ({"models": [{"weights": "a.pt", "max_det": 0}]}, r"model 'a.pt': max_det must be >= 1, got 0"),
        ({"models": [{"weights": "a.pt", "batch": -1}]}, r"model 'a.pt': batch must be >= 1, got -1"),
        ({"models": [{"type": "torchvision", "arch": "ssd300_vgg16", "imgsz": 16}]}, "imgsz must be >= 32, got 16"),
        ({"models": [{"weights": "a.pt", "weight": float("nan")}]}, r"models\[0\]\.weight: expected a finite number"),
        ({"models": [{"weights": "a.pt", "weight": float("inf")}]}, r"models\[0\]\.weight: expected a finite number"),
        (
            {"models": [{"type": "onnx", "weights": "a.onnx", "decoder": "yolox", "mean": [0, float("nan"), 0]}]},
            r"models\[0\]\.mean\[1\]: expected a finite number",
        ),
    ],
)
def test_invalid_configs(data, fragment):
    with pytest.raises((ValueError, TypeError), match=fragment):
        ensemble_config_from_dict(data)


@pytest.mark.parametrize("key", [-1, "-3"])
def test_a_negative_class_index_in_a_class_map_is_refused_with_the_yaml_before_any_model_loads(tmp_path, key):
    """No model has it, which the YAML alone shows: the model need not load (seconds) to find it."""
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({"models": [{"weights": "nowhere.pt", "name": "v8", "class_map": {key: 1, 0: 1}}]}))
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: model 'v8': class_map key {re.escape(repr(key))} is "
                                         "a negative class index; a model's classes are numbered from 0$"):
        load_ensemble_config(path)


def test_a_saved_predictions_class_map_keyed_by_class_names_is_refused_at_load():
    """A model's class_map may name its classes; a results file has category ids only. Checked when the
    config is read, where the label-space check of the ids said only that a class name's id was misplaced."""
    member = {"type": "precomputed", "results": "r.json", "name": "saved", "class_map": {"1": 0, "person": 0}}
    with pytest.raises(ValueError, match=re.escape(
            "ensemble config: model 'saved': class_map key 'person' is a class name, but saved predictions have "
            "no class names: their class_map is keyed by the category_id values of the results file")):
        ensemble_config_from_dict({"models": [member]})
    # saved ids as JSON and YAML give them are the map's keys
    member["class_map"] = {"1": 0, 3: 1}
    assert ensemble_config_from_dict({"models": [member]}).models[0].class_map == {"1": 0, 3: 1}


def test_member_names_of_views_are_file_names():
    config = ensemble_config_from_dict({"models": [
        {"weights": "a.pt", "name": "yolo11n", "tta": ["identity", "hflip", "scale=0.83", "tiles=2x2+overlap=0.3"]},
        {"weights": "b.pt", "name": "v8 n_1.2-x"},
    ]})
    assert declared_member_names(config) == [
        "yolo11n", "yolo11n|hflip", "yolo11n|scale=0.83", "yolo11n|tiles=2x2+overlap=0.3", "v8 n_1.2-x"]
    for name in declared_member_names(config):
        assert check_member_name(name) == name


def test_overrides_and_round_trip(tmp_path):
    path = REPO / "detens" / "configs" / "ensembles" / "coco_yolo3.yaml"
    config = load_ensemble_config(
        path, {"fusion.method": "nms", "conf": 0.3, "output.vis": False, "device": None}
    )
    assert config.fusion.method == "nms" and config.conf == 0.3 and config.output.vis is False
    assert config.fusion.head == str((REPO / "detens" / "configs" / "heads" / "coco_yolo3_deep.json").resolve())  # kept, resolved next to the YAML
    save_ensemble_config(config, tmp_path / "resolved.yaml")
    assert load_ensemble_config(tmp_path / "resolved.yaml") == config
    with pytest.raises(ValueError, match="Did you mean 'method'"):
        load_ensemble_config(path, {"fusion.metod": "nms"})


def test_a_value_out_of_range_names_the_file_or_the_values_given_over_it(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(minimal(conf=5)))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: conf must be in \[0, 1\], got 5"):
        load_ensemble_config(path)
    path.write_text(yaml.safe_dump(minimal()))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} \(with conf=5\): conf must be in \[0, 1\]"):
        load_ensemble_config(path, per_model={"conf": 5, "imgsz": None})
    assert load_ensemble_config(path, per_model={"conf": 0.5}).conf == 0.5
    # the file's own mistake is the file's, whatever else is given over it; a value given over it mends it
    path.write_text(yaml.safe_dump(minimal(conf=5)))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: conf must be in \[0, 1\], got 5"):
        load_ensemble_config(path, {"fusion.method": "nms"}, per_model={"imgsz": 320})
    assert load_ensemble_config(path, per_model={"conf": 0.5}).conf == 0.5
    # a nested section's own check names the file once, and its own place in it
    path.write_text(yaml.safe_dump(minimal(output={"vis_conf": 3})))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: output\.vis_conf must be in \[0, 1\], got 3"):
        load_ensemble_config(path)
    path.write_text(yaml.safe_dump({"models": [{"weights": "a.pt", "name": "a", "weight": -1}]}))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: model 'a': weight must be >= 0, got -1"):
        load_ensemble_config(path)


@pytest.mark.parametrize("key, value, low", [("imgsz", 0, 32), ("imgsz", 31, 32), ("batch", 0, 1), ("max_det", -1, 1)])
def test_an_ensemble_value_below_its_bound_is_named_alone(tmp_path, key, value, low):
    """One message for imgsz, batch and max_det made the user find which of three values was wrong."""
    with pytest.raises(ValueError, match=rf"^ensemble config: {key} must be >= {low}, got {value}$"):
        ensemble_config_from_dict(minimal(**{key: value}))
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(minimal()))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} \(with {key}={value}\): {key} must be >= {low}, got {value}$"):
        load_ensemble_config(path, per_model={key: value})


def test_strings_that_read_as_numbers_survive_the_round_trip(tmp_path):
    from detens.jobs.fuse import check_resume

    # a plain YAML 1.1 dumper writes "1e3" bare, which the loader reads back as the number 1000.0
    config = ensemble_config_from_dict(
        {"name": "1e3", "models": [{"weights": "2E-5", "name": "1.5e3"}, {"weights": ".5e3", "name": "b"}]}
    )
    save_ensemble_config(config, tmp_path / "config.yaml")
    assert load_ensemble_config(tmp_path / "config.yaml") == config
    (tmp_path / "predictions.json").write_text("[]")
    check_resume(tmp_path, config, overwrite=False)  # the same config: no "different config" refusal


def test_model_settings_fall_back_to_the_defaults():
    config = ensemble_config_from_dict(minimal(conf=0.2, imgsz=320))
    model = config.models[0]
    assert config.setting(model, "conf") == 0.2 and config.setting(model, "imgsz") == 320
    model.conf = 0.5
    assert config.setting(model, "conf") == 0.5


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ModelConfig(weights="x.pt", imgsz="640"), r"model 'x.pt': imgsz must be an integer, got str: '640'"),
        (lambda: ModelConfig(weights="x.pt", batch=2.0), r"model 'x.pt': batch must be an integer, got float"),
        (lambda: ModelConfig(weights="x.pt", conf="0.3"), r"model 'x.pt': conf must be a number, got str"),
        (lambda: ModelConfig(weights="x.pt", weight=None), r"model 'x.pt': weight must be a number, got NoneType"),
        (lambda: EnsembleConfig(models=[ModelConfig(weights="x.pt")], max_det="300"), r"^max_det must be an integer"),
        (lambda: EnsembleConfig(models=[ModelConfig(weights="x.pt")], iou=True), r"^iou must be a number, got bool"),
    ],
)
def test_configs_made_in_python_name_a_setting_of_another_kind(make, message):
    """A YAML file's values are type-checked as they are read; a config made in Python is checked by its
    dataclass, which names the setting instead of failing in a comparison."""
    with pytest.raises(TypeError, match=message):
        make()


def test_numpy_numbers_in_configs_made_in_python_are_the_python_numbers_they_hold():
    import numpy as np

    model = ModelConfig(weights="x.pt", imgsz=np.int64(320), conf=np.float32(0.25), weight=np.int32(2))
    config = EnsembleConfig(models=[model], batch=np.int16(4), iou=np.float64(0.6))
    assert (model.imgsz, model.conf, model.weight, config.batch, config.iou) == (320, 0.25, 2.0, 4, 0.6)
    assert [type(v) for v in (model.imgsz, model.conf, model.weight, config.batch, config.iou)] == [
        int, float, float, int, float
    ]
    assert ensemble_config_from_dict(dataclasses.asdict(config)) == config


def test_build_precomputed_ensemble(tmp_path):
    """A whole ensemble from a dict, without running any detector: saved predictions of two 'models'."""
    images = [{"id": 1, "file_name": "a.jpg", "height": 10, "width": 20}]
    for name, score in (("one", 0.9), ("two", 0.6)):
        results = [{"image_id": 1, "category_id": 3, "bbox": [1, 2, 5, 4], "score": score}]
        (tmp_path / f"{name}.json").write_text(json.dumps({"images": images, "results": results}))
    config = {
        "models": [
            {"type": "precomputed", "results": str(tmp_path / "one.json")},
            {"type": "precomputed", "results": str(tmp_path / "two.json"), "name": "second", "weight": 2},
        ]
    }
    members = build_ensemble(config)
    assert [m.name for m in members] == ["one", "second"]
    assert member_weights(ensemble_config_from_dict(config)) == [1.0, 2.0]
    (a,), (b,) = (m([tmp_path / "a.jpg"]) for m in members)
    assert (
        a.boxes.tolist() == [[1.0, 2.0, 6.0, 6.0]]
        and a.image_size == (10, 20)
        and float(b.scores[0]) == pytest.approx(0.6)
    )
    single = build_detector({"type": "precomputed", "results": str(tmp_path / "two.json")})
    assert single.name == "two"
    same = dict(config, models=[config["models"][0], dict(config["models"][0])])
    with pytest.raises(ValueError, match="different names"):
        build_ensemble(same)
    # members read earlier are used as they are
    assert build_ensemble(config, built={1: single})[1] is single
    with pytest.raises(ValueError, match=r"built names models \[2\], but the config has models 0..1"):
        build_ensemble(config, built={2: single})


BROKEN_MEMBERS = [
    # (case, the member, the error, its message after the member's label)
    ("ONNX decoder stride", {"type": "onnx", "weights": "nanodet_m.onnx", "decoder": "nanodet_gfl",
                             "options": {"decoder_options": {"strides": [8, 0, 32]}}},
     ValueError, "decoder_options.strides[1] must be an integer >= 1, got 0"),
    ("ONNX decoder option", {"type": "onnx", "weights": "nanodet_m.onnx", "decoder": "nanodet_gfl",
                             "options": {"decoder_options": {"stridez": [8, 16, 32]}}},
     ValueError, "decoder_options.stridez is not an option of the 'nanodet_gfl' decoder; its options: strides, reg_max"),
    ("ONNX std", {"type": "onnx", "weights": "nanodet_m.onnx", "decoder": "nanodet_gfl", "std": [57.4, 0, 58.4]},
     ValueError, "std[1] must be a positive number, got 0.0"),
    ("torchvision builder argument", {"type": "torchvision", "arch": "fasterrcnn_mobilenet_v3_large_320_fpn",
                                      "options": {"box_score_thresh2": 0.1}},
     TypeError, "'box_score_thresh2' is no argument of torchvision's 'fasterrcnn_mobilenet_v3_large_320_fpn'"),
    ("argument of no detector", {"type": "precomputed", "results": "saved.json", "images": "images.json",
                                 "options": {"foo": 1}},
     ValueError, "options.foo is not an argument of PrecomputedDetector"),
    ("class_map outside the label space", {"type": "precomputed", "results": "saved.json", "images": "images.json",
                                           "class_map": {1: 999}},
     ValueError, "class_map[1] = 999 is not one of the 80 category ids of COCO"),
]


@pytest.mark.parametrize("case, member, error, message", BROKEN_MEMBERS, ids=[c[0] for c in BROKEN_MEMBERS])
def test_a_member_an_adapter_refuses_is_named_with_the_config_file(tmp_path, case, member, error, message):
    """The adapters' refusals named the option alone: among six members, which one had it was left to guess."""
    (tmp_path / "saved.json").write_text("[]")
    (tmp_path / "images.json").write_text(json.dumps({"a.jpg": 1}))
    saved = {"type": "precomputed", "results": "saved.json", "images": "images.json"}
    # built in order: the members before the broken one are built, the one after is not reached
    models = [{**saved, "name": "first"}, {**member, "name": "broken"}, {**saved, "name": "last"}]
    path = tmp_path / "six.yaml"
    path.write_text(yaml.safe_dump({"models": models}))
    config = load_ensemble_config(path)
    named = "^" + re.escape(f"{path}: model 'broken': {message}")
    with pytest.raises(error, match=named):
        build_ensemble(config)
    # the file is named from a copy made for workers elsewhere too; a config built in Python names none
    from detens.ensemble_config import with_absolute_paths

    with pytest.raises(error, match=named):
        build_ensemble(with_absolute_paths(config))
    python_config = ensemble_config_from_dict({"models": [{**member, "name": "broken"}]})
    with pytest.raises(error, match="^" + re.escape(f"model 'broken': {message}")):
        build_ensemble(python_config)


def test_a_members_refusal_keeps_its_type_and_names_an_unnamed_member_once(monkeypatch):
    """A caller that catches the adapter's own error (an UnknownImageError is a KeyError) still does, and an
    adapter's message that starts with the name the label shows does not repeat it."""
    from detens.adapters.precomputed import UnknownImageError

    def refuse(model, ensemble, categories):
        raise UnknownImageError("no saved predictions for 'a.jpg'")

    monkeypatch.setitem(ADAPTERS._items, "precomputed", refuse)
    with pytest.raises(KeyError) as caught:
        build_detector({"type": "precomputed", "results": "saved.json", "name": "saved"})
    assert isinstance(caught.value, UnknownImageError)
    assert str(caught.value) == "model 'saved': no saved predictions for 'a.jpg'"
    # an unnamed torchvision member is shown by its architecture, which the adapter names its messages by
    member = {"type": "torchvision", "arch": "fasterrcnn_mobilenet_v3_large_320_fpn", "options": {"a_typo": 1}}
    with pytest.raises(TypeError, match=r"^model 'fasterrcnn_mobilenet_v3_large_320_fpn': 'a_typo' is no argument"):
        build_detector(member)


def test_a_members_bad_flag_in_a_config_made_in_python_is_named():
    """Such a config is not type-checked as a YAML file is: the adapter's refusal is the first word."""
    model = ModelConfig(type="onnx", weights="m.onnx", decoder="yolox", name="yolox_nano", bgr_to_rgb="false")
    with pytest.raises(TypeError, match=r"^model 'yolox_nano': bgr_to_rgb must be True or False, got str: 'false'$"):
        build_detector(model)


@pytest.mark.slow
def test_build_ensemble_checks_class_maps_before_any_model_loads(tmp_path):
    from detens.adapters import check_class_maps

    # weights found nowhere: building the member would fail on them, the class_map is named first
    config = minimal()
    config["models"][0].update(weights="nowhere.pt", name="v8", class_map={0: 1, "bus": 999})
    message = (r"^model 'v8': class_map\['bus'\] = 999 is not one of the 80 category ids of COCO \(the config names "
               r"no dataset\): 1-11, 13-25, 27, 28, .*; map the classes onto those ids$")
    with pytest.raises(ValueError, match=message):
        build_ensemble(config)
    dataset = tmp_path / "gt.json"
    dataset.write_text(json.dumps({"images": [], "annotations": [], "categories": [{"id": 1, "name": "person"},
                                                                                  {"id": 999, "name": "bus"}]}))
    check_class_maps({**config, "dataset": str(dataset)}, {1: "person", 999: "bus"})
    with pytest.raises(ValueError, match=r"class_map\['bus'\] = 999 is not one of the 2 category ids of the dataset"):
        check_class_maps({**config, "dataset": str(dataset)}, {1: "person", 2: "bus"})


def test_class_names_mapped_onto_other_coco_classes_without_a_dataset_are_warned_of(tmp_path, caplog):
    """Without ``dataset:`` the label space is COCO's: a dataset's own ids in a class_map would be written as
    COCO's classes ("car" onto a dataset's 2 is COCO's "bicycle")."""
    from detens.adapters import build_detector

    member = build_detector({**minimal()["models"][0], "name": "v8"})  # loaded once, given to every build below
    config = minimal()
    config["models"][0].update(name="v8", class_map={"car": 2, "person": 1, "motorbike": 4, 0: 1})
    with caplog.at_level("WARNING", logger="detens.adapters"):
        build_ensemble(config, built={0: member})
    warned = [r.getMessage() for r in caplog.records if r.name == "detens.adapters"]
    assert warned == ["model 'v8': its class_map maps 'car' onto 2 ('bicycle' in COCO), and "
                      "the config gives no dataset, so the label space is COCO's and those are the names written; if "
                      "the ids are a dataset's own, give its annotation file as dataset:"], warned
    caplog.clear()
    config["models"][0]["class_map"] = {"car": 3, "MotorBike": 4, "traffic_light": 10}  # COCO's own names, spelled otherwise
    with caplog.at_level("WARNING", logger="detens.adapters"):
        build_ensemble(config, built={0: member})
    dataset = tmp_path / "gt.json"
    dataset.write_text(json.dumps({"images": [], "annotations": [], "categories": [{"id": 2, "name": "automobile"}]}))
    with caplog.at_level("WARNING", logger="detens.adapters"):
        build_ensemble({**config, "dataset": str(dataset), "models": [{**config["models"][0], "class_map": {"car": 2}}]},
                       built={0: member})
    assert [r for r in caplog.records if r.name == "detens.adapters"] == []


class LoadedYolo:
    """A stand-in for a loaded COCO YOLO member: its name and its 80 class names by index."""

    def __init__(self, name: str) -> None:
        from detens.labels import COCO_NAMES

        self.name = name
        self.model_names = dict(enumerate(COCO_NAMES))

    def __call__(self, images):  # pragma: no cover - never run
        raise AssertionError("not run")


def dataset_of(path: Path, names: dict[int, str]) -> str:
    path.write_text(json.dumps({"images": [], "annotations": [], "categories": [
        {"id": c, "name": n} for c, n in names.items()]}))
    return str(path)


def class_map_warnings(caplog, config: dict, loaded: bool = True) -> list[str]:
    """The warnings of building ``config`` (its members stood in for by loaded YOLOs, or not loaded)."""
    from detens.adapters import warn_of_class_map_slips

    caplog.clear()
    with caplog.at_level("WARNING", logger="detens.adapters"):
        if loaded:
            build_ensemble(config, built={i: LoadedYolo(m["name"]) for i, m in enumerate(config["models"])})
        else:
            config = ensemble_config_from_dict(config)
            warn_of_class_map_slips(config, load_coco_gt(config.dataset).category_names)
    return [r.getMessage() for r in caplog.records if r.name == "detens.adapters"]


def members(*class_maps: dict) -> list[dict]:
    return [{"weights": f"{name}.pt", "name": name, "class_map": class_map}
            for name, class_map in zip(("v8", "v11", "v26"), class_maps, strict=False)]


@pytest.mark.parametrize("loaded", [True, False], ids=["built", "before-loading"])
def test_members_that_map_one_class_onto_different_ids_are_warned_of_once(tmp_path, caplog, loaded):
    """A class_map copied to every member and edited in one: each member's boxes of one class are fused and
    scored as different classes (halving the mAP), whatever the members' own names of the ids."""
    dataset = dataset_of(tmp_path / "gt.json", {10: "pedestrian", 20: "vehicle", 30: "hound"})
    right = {"person": 10, "car": 20, "truck": 20, "dog": 30}
    slipped = {"person": 10, "car": 30, "truck": 30, "dog": 20}
    config = {"dataset": dataset, "models": members(slipped, right, {**right, "Car": 20})}
    assert class_map_warnings(caplog, config, loaded) == [
        "the members' class_maps map a class onto different ids: 'car' onto 30 (v8) and 20 (v11, v26); 'truck' onto "
        "30 (v8) and 20 (v11, v26); 'dog' onto 20 (v8) and 30 (v11, v26); their boxes of one class would be fused and "
        "scored as different classes: map it onto one id in every member"]
    # one class under another spelling or by its index is the same class; the index is read once loaded
    by_index = {0: 10, 2: 20, 7: 20, 16: 30}
    config["models"] = members(right, by_index, {"Person": 10, "CAR": 20, "dog": 30})
    assert class_map_warnings(caplog, config, loaded) == []
    config["models"] = members(right, {**by_index, 2: 30})
    expected = ["the members' class_maps map a class onto different ids: 'car' onto 20 (v8) and 30 (v11); their "
                "boxes of one class would be fused and scored as different classes: map it onto one id in every member"]
    assert class_map_warnings(caplog, config, loaded) == (expected if loaded else [])
    # different classes onto one id are a merge, and a class one member alone maps is no disagreement
    config["models"] = members({"car": 20, "truck": 20, "person": 10, "dog": 30}, {"car": 20, "bus": 20, "person": 10})
    assert class_map_warnings(caplog, config, loaded) == []


@pytest.mark.parametrize("loaded", [True, False], ids=["built", "before-loading"])
def test_a_class_mapped_onto_the_dataset_id_of_another_of_its_classes_is_warned_of(tmp_path, caplog, loaded):
    """With ``dataset:`` a class_map renames (car onto "vehicle"); mapping a class onto the id the dataset names
    after another class of the model (person onto "dog") is the slip that the COCO label space is checked for."""
    swapped = dataset_of(tmp_path / "swapped.json", {10: "dog", 20: "person", 30: "car"})
    config = {"dataset": swapped, "models": members({"person": 10, "car": 20, "dog": 30})}
    assert class_map_warnings(caplog, config, loaded) == [
        "model 'v8': its class_map maps 'person' onto 10 ('dog' in the dataset), 'car' onto 20 ('person' in the "
        "dataset), 'dog' onto 30 ('car' in the dataset): the dataset names those ids after other classes of the "
        "model, so its boxes of one class would be written as another; map each class onto the id of its own"]
    trucks = dataset_of(tmp_path / "trucks.json", {10: "pedestrian", 20: "truck"})
    config = {"dataset": trucks, "models": members({"person": 10, "car": 20})}
    # "truck" is a class of the model once it is loaded: its cars written as trucks
    assert class_map_warnings(caplog, config, loaded) == ([
        "model 'v8': its class_map maps 'car' onto 20 ('truck' in the dataset): the dataset names those ids after "
        "other classes of the model, so its boxes of one class would be written as another; map each class onto "
        "the id of its own"] if loaded else [])
    # renamed, or merged with the class the id is named after: what a class_map is for
    config["models"] = members({"person": 10, "car": 20, "truck": 20})
    assert class_map_warnings(caplog, config, loaded) == []
    renamed = dataset_of(tmp_path / "renamed.json", {10: "pedestrian", 20: "vehicle"})
    assert class_map_warnings(caplog, {"dataset": renamed, "models": members({"person": 10, "car": 20})}, loaded) == []


@pytest.mark.parametrize("loaded", [True, False], ids=["built", "before-loading"])
def test_a_category_that_no_members_class_map_gives_is_warned_of(tmp_path, caplog, loaded):
    """Mapping by name warns of a category no class of the model is named after; explicit class_maps that all
    leave a category out give it no box either, said in the same words."""
    dataset = dataset_of(tmp_path / "gt.json", {10: "pedestrian", 20: "vehicle", 30: "hound", 40: "cat"})
    config = {"dataset": dataset, "models": members({"person": 10, "car": 20}, {0: 10})}
    assert class_map_warnings(caplog, config, loaded) == [
        "no member's class_map maps a class onto the categories ['hound', 'cat'] of the label space, so no member "
        "gives them a box; if a model has them, map them in its class_map"]
    config["models"][1]["class_map"] = {0: 10, "dog": 30, "cat": 40}
    assert class_map_warnings(caplog, config, loaded) == []
    # a member matched to the dataset by name says which categories it gives no box
    config["models"] = [*members({"person": 10}), {"weights": "v26.pt", "name": "v26"}]
    assert class_map_warnings(caplog, config, loaded) == []
    # COCO's label space is not expected to be covered whole
    assert class_map_warnings(caplog, {"models": members({"person": 1})}) == []


def test_a_class_name_the_model_lacks_is_refused_without_the_coco_warning_first(caplog):
    """The warning of names mapped onto other COCO classes reads a misspelt name as a dataset's own class;
    the model's refusal of the name is what the user needs, alone."""
    config = minimal()
    config["models"][0].update(name="v8", class_map={"persn": 1})
    with caplog.at_level("WARNING", logger="detens.adapters"), pytest.raises(
        ValueError, match="class_map names class 'persn', which the model does not have"
    ):
        build_ensemble(config)
    assert [r.getMessage() for r in caplog.records if r.name == "detens.adapters"] == []


def test_build_tta_ensemble_runs():
    members = build_ensemble(REPO / "detens" / "configs" / "ensembles" / "coco_yolo4_tta.yaml")
    assert [m.name for m in members] == [
        "yolov8n", "yolo11n", "yolo11n|hflip", "yolo26n", "yolo26n|hflip", "yolo26n|scale=0.83", "yolov5nu",
    ]  # fmt: skip
    from ultralytics.utils import ASSETS

    for member in members:
        (det,) = member([Path(ASSETS) / "bus.jpg"])
        assert det.image_size == (1080, 810) and det.source == member.name
        assert 6 in det[det.scores > 0.25].labels.tolist()  # everyone sees the bus


@pytest.mark.slow
def test_tiled_ensemble_fuses_with_its_shipped_head():
    """coco_yolo3_tiles: six members (each model whole and on 2x2 tiles, merged at the config's iou and
    max_det), fused on bus.jpg by the shipped deep head, which names the same six members."""
    import detens
    from detens.adapters.augmented import AugmentedView

    path = REPO / "detens" / "configs" / "ensembles" / "coco_yolo3_tiles.yaml"
    config = load_ensemble_config(path)
    members = build_ensemble(config)
    names = ["yolov8n", "yolov8n|tiles=2x2", "yolo11n", "yolo11n|tiles=2x2", "yolo26n", "yolo26n|tiles=2x2"]
    assert [m.name for m in members] == names
    tiled = [m for m in members if isinstance(m, AugmentedView)]
    assert [(m.merge_iou, m.max_det) for m in tiled] == [(config.iou, config.max_det)] * 3
    from ultralytics.utils import ASSETS

    per_model = [member([Path(ASSETS) / "bus.jpg"])[0] for member in members]
    head = json.loads(Path(config.fusion.head).read_text())
    assert sorted(head["model_names"]) == sorted(names)
    fused = detens.fuse(per_model, method=config.fusion.method, head=config.fusion.head)
    assert fused.image_size == (1080, 810)
    confident = fused[fused.scores > 0.5]
    assert 6 in confident.labels.tolist() and confident.labels.tolist().count(1) >= 3  # the bus, its people


def test_yaml_is_plain_yaml():
    for path in CONFIGS:
        assert isinstance(yaml.safe_load(path.read_text()), dict)


def test_flags_for_every_model_reach_torchvision_members(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"weights": "a.pt", "name": "yolo"},
        {"type": "torchvision", "arch": "fasterrcnn_resnet50_fpn_v2", "name": "frcnn", "iou": 0.6, "imgsz": 800},
    ]}))
    own = load_ensemble_config(path)
    assert (own.models[1].iou, own.models[1].imgsz) == (0.6, 800) and own.setting(own.models[0], "iou") == 0.7
    flagged = load_ensemble_config(path, per_model={"iou": 0.5, "imgsz": 1024, "conf": None})
    yolo, frcnn = flagged.models
    assert (frcnn.iou, frcnn.imgsz) == (0.5, 1024)  # the architecture reads only its own values
    assert (yolo.iou, yolo.imgsz) == (None, None) and (flagged.setting(yolo, "iou"), flagged.setting(yolo, "imgsz")) == (0.5, 1024)
    assert flagged.setting(frcnn, "conf") == flagged.conf  # a flag not given changes nothing


def test_a_flag_for_every_model_names_the_members_that_do_not_read_it(tmp_path, caplog):
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"weights": "a.pt", "name": "yolo"},
        {"type": "onnx", "weights": "b.onnx", "decoder": "yolox", "name": "yolox", "input_size": [416, 416]},
        {"type": "precomputed", "results": "c.json", "images": "images", "name": "saved"},
    ]}))
    with caplog.at_level(logging.WARNING, logger="detens.ensemble_config"):
        load_ensemble_config(path, per_model={"conf": 0.1})
        assert not caplog.records  # every member reads conf
        config = load_ensemble_config(path, per_model={"imgsz": 320, "iou": 0.5, "device": "cpu", "batch": 4})
    assert config.setting(config.models[0], "imgsz") == 320 and config.models[1].input_size == [416, 416]
    assert sorted(r.getMessage() for r in caplog.records) == [
        "batch 4, given for every model, is not used by 'saved' (type 'precomputed': its predictions were made earlier)",
        "device cpu, given for every model, is not used by 'saved' (type 'precomputed': its predictions were made earlier)",
        "imgsz 320, given for every model, is not used by 'saved' (type 'precomputed': its predictions were made earlier)",
        "imgsz 320, given for every model, is not used by 'yolox' (type 'onnx': it runs at its input_size)",
        "iou 0.5, given for every model, is not used by 'saved' (type 'precomputed': its predictions were made earlier)",
    ]


def test_shipped_names_leave_out_the_side_files_of_a_training_run(tmp_path, monkeypatch):
    """A head's ``.log.json`` beside it is not a shipped name, and cannot be loaded as a head by name."""
    from detens import packaged

    heads = tmp_path / "heads"
    heads.mkdir()
    for name in ("a.json", "a.json.log.json", "a.json.config.yaml", "b.safetensors", "b.json", "c.safetensors"):
        (heads / name).write_text("{}")
    monkeypatch.setattr(packaged, "CONFIG_ROOT", tmp_path)
    assert packaged.packaged_names("heads") == ["a", "b", "c"]
    assert packaged.find_packaged("a", "heads") == heads / "a.json"
    assert packaged.find_packaged("b", "heads") == heads / "b.json"  # the first suffix of the kind wins
    assert packaged.find_packaged("b.safetensors", "heads") == heads / "b.safetensors"
    assert packaged.find_packaged("c", "heads") == heads / "c.safetensors"
    with pytest.raises(ValueError, match="head file: expected a file or a shipped name, got ''"):
        packaged.find_packaged("", "heads")  # not looked up as the working directory
    with pytest.raises(TypeError, match=r"^head file: expected a file \(str or Path\) or a shipped name, got int: 5$"):
        packaged.find_packaged(5, "heads")  # pathlib's own message named neither the head nor what it takes
    with pytest.raises(FileNotFoundError, match=r"'a.json.log' not found.*\(shipped: a, b, c\)"):
        packaged.find_packaged("a.json.log", "heads")
    with pytest.raises(FileNotFoundError, match=r"'c.json' not found"):
        packaged.find_packaged("c.json", "heads")
    with pytest.raises(FileNotFoundError, match=rf"'{heads}' not found: a folder, not a file \({heads}\)"):
        packaged.find_packaged(heads, "heads")


@pytest.mark.parametrize("kind, what", [("ensembles", "ensemble config"), ("train", "training config"),
                                        ("heads", "head file")])
def test_a_pipe_given_for_a_config_or_a_head_is_named_as_no_regular_file(tmp_path, named_pipe, kind, what):
    """``--config <(...)`` is a pipe: there, but read once only (the YAML reader is refused it too)."""
    from detens import packaged
    from detens.config import read_yaml_file

    pipe = named_pipe(tmp_path / "given.yaml")
    refusal = rf"^{what} {pipe} is not a regular file \(a pipe\); save its content to a file and give that file's path$"
    with pytest.raises(ValueError, match=refusal):
        packaged.find_packaged(str(pipe), kind)
    with pytest.raises(ValueError, match=refusal):
        read_yaml_file(pipe, what)


def test_a_yaml_head_is_the_file_beside_it_else_a_shipped_head(tmp_path, monkeypatch):
    from detens.packaged import CONFIG_ROOT

    shipped = CONFIG_ROOT / "heads"
    (tmp_path / "cfg").mkdir()
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")

    def head_of(head):
        path = tmp_path / "cfg" / "e.yaml"
        path.write_text(yaml.safe_dump(minimal(fusion={"method": "deep", "head": head})))
        return load_ensemble_config(path).fusion.head

    assert head_of("coco_yolo3_deep") == str(shipped / "coco_yolo3_deep.json")  # as --head takes it
    assert head_of("coco_yolo3_theta.json") == str(shipped / "coco_yolo3_theta.json")
    # a file beside the YAML wins over a shipped head; the working directory's is not looked at
    (tmp_path / "cfg" / "coco_yolo3_deep.json").write_text("{}")
    (tmp_path / "run" / "coco_yolo3_theta.json").write_text("{}")
    assert head_of("coco_yolo3_deep.json") == str(tmp_path / "cfg" / "coco_yolo3_deep.json")
    assert head_of("coco_yolo3_theta.json") == str(shipped / "coco_yolo3_theta.json")
    # neither: the path beside the YAML, named when the head is loaded (a flag may replace it first)
    assert head_of("nothing.json") == str(tmp_path / "cfg" / "nothing.json")
    assert head_of("sub/coco_yolo3_deep") == str(tmp_path / "cfg" / "sub" / "coco_yolo3_deep")
    with pytest.raises(ValueError, match="fusion.head must be a head file or a shipped head's name, got ''"):
        head_of("")  # not the YAML's folder


def test_a_relative_weights_dir_is_looked_up_beside_the_yaml(tmp_path, monkeypatch):
    from detens.adapters.weights import ENV_VAR, resolve_model_weights

    monkeypatch.delenv(ENV_VAR, raising=False)
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere" / "deep"
    for folder in (project / "cfg", project / "models" / "mine", elsewhere):
        folder.mkdir(parents=True)
    (project / "models" / "mine" / "v8.onnx").write_text("weights")
    path = project / "cfg" / "wd.yaml"
    path.write_text(yaml.safe_dump({"weights_dir": "../models", "models": [{"weights": "mine/v8.onnx", "name": "v8"}]}))
    for cwd in (project / "cfg", elsewhere):  # found from either: the YAML's folder is the second place looked
        monkeypatch.chdir(cwd)
        config = load_ensemble_config(path)
        assert Path(config.weights_dir).resolve() == project / "models"
        assert resolve_model_weights(config.models[0], config.weights_dir).value.endswith("models/mine/v8.onnx")
    # a command line's folder is the working directory's, as its other paths are
    config = load_ensemble_config(path, {"weights_dir": "../models"})
    assert config.weights_dir == "../models"
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path / 'elsewhere' / 'models' / 'mine' / 'v8.onnx'} \(weights "
                                                rf"folder; {tmp_path / 'elsewhere' / 'models'} does not exist\)"):
        resolve_model_weights(config.models[0], config.weights_dir)


def _yaml_naming_files(folder: Path) -> Path:
    """An ensemble YAML in ``folder`` that names every kind of file by a relative path."""
    config = {
        "dataset": "gt.json", "weights_dir": "models",
        "models": [{"type": "onnx", "weights": "w.onnx", "decoder": "yolox", "name": "o"},
                   {"type": "precomputed", "results": "r.json", "images": "i.json", "name": "p"}],
        "fusion": {"method": "theta", "head": "h.json", "params": {"calibration": "cal.json"}},
    }
    path = folder / "e.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


_NAMED = ("gt.json", "models", "w.onnx", "r.json", "i.json", "h.json", "cal.json")


def _named_files(config):
    return [config.dataset, config.weights_dir, config.models[0].weights, config.models[1].results,
            config.models[1].images, config.fusion.head, config.fusion.params["calibration"]]


def test_every_relative_path_of_a_yaml_is_beside_it_wherever_the_command_runs(tmp_path, monkeypatch):
    """The working directory's files of the same names, which earlier versions looked at first (and not at
    all for fusion.params.calibration), are not looked at."""
    cfg, run = tmp_path / "cfg", tmp_path / "run"
    for folder in (cfg, run):
        folder.mkdir()
        for name in _NAMED:
            (folder / name).mkdir() if name == "models" else (folder / name).write_text(folder.name)
    path = _yaml_naming_files(cfg)
    monkeypatch.chdir(run)
    assert _named_files(load_ensemble_config(path)) == [str(cfg / name) for name in _NAMED]
    monkeypatch.chdir(tmp_path)  # a relative path to the YAML: its folder is relative too
    assert _named_files(load_ensemble_config("cfg/e.yaml")) == [str(cfg / name) for name in _NAMED]
    # run from the YAML's folder, the paths mean the same either way: kept as written, so that the runs
    # that recorded them (detens cache's settings, detens fuse's config.yaml) resume
    monkeypatch.chdir(cfg)
    config = load_ensemble_config("e.yaml")
    assert _named_files(config)[:5] + _named_files(config)[6:] == [n for n in _NAMED if n != "h.json"]
    assert config.fusion.head == str(cfg / "h.json")  # as it always was


def test_a_relative_path_found_only_from_the_working_directory_is_refused_naming_both(tmp_path, monkeypatch):
    from detens.packaged import CONFIG_ROOT

    cfg, run = tmp_path / "cfg", tmp_path / "run"
    for folder in (cfg, run):
        folder.mkdir()
    monkeypatch.chdir(run)
    path = _yaml_naming_files(cfg)
    # nothing anywhere: made absolute beside the YAML, so that what reads it names that path; the weights
    # and a head keep their other meanings (a name in the weights folders, a shipped head)
    config = load_ensemble_config(path)
    assert config.dataset == str(cfg / "gt.json") and config.models[1].results == str(cfg / "r.json")
    assert config.models[0].weights == "w.onnx" and config.fusion.params["calibration"] == str(cfg / "cal.json")
    # a calibration head too, which earlier versions looked for in the working directory alone
    for where, name in (("dataset", "gt.json"), ("weights_dir", "models"), ("models[0].weights", "w.onnx"),
                        ("models[1].results", "r.json"), ("models[1].images", "i.json"),
                        ("fusion.params.calibration", "cal.json")):
        (run / name).mkdir() if name == "models" else (run / name).write_text("here")
        with pytest.raises(ValueError) as refused:
            load_ensemble_config(path)
        # weights may also be a name in a weights folder: a shipped config's user passes the folder
        folder = "; or, for a name relative to a weights folder, pass the folder that holds it (--weights-dir, " \
                 "$DETENS_WEIGHTS)" if where.endswith("weights") else ""
        assert str(refused.value) == (
            f"{path}: {where} {name!r} is relative to the YAML's folder, where there is no {cfg / name}; the "
            f"{'folder' if name == 'models' else 'file'} {run / name} in the working directory is not looked at "
            "(a YAML means the same files wherever the command runs): give its path relative to the YAML, or "
            f"an absolute path{folder}"
        )
        shutil.rmtree(run / name) if name == "models" else (run / name).unlink()
    # weights named from inside their weights folder are that folder's: the same file either way
    (run / "w.onnx").write_text("here")
    monkeypatch.setenv("DETENS_WEIGHTS", str(run))
    assert load_ensemble_config(path).models[0].weights == "w.onnx"
    monkeypatch.setenv("DETENS_WEIGHTS", str(tmp_path / "other"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "w.onnx").write_text("other")  # another file of that name: which one is meant?
    with pytest.raises(ValueError, match=r"models\[0\].weights 'w.onnx' is relative to the YAML's folder"):
        load_ensemble_config(path)
    monkeypatch.delenv("DETENS_WEIGHTS")
    (run / "w.onnx").unlink()
    # a shipped head's name is that head, as for fusion.head, whatever the working directory holds
    (run / "coco_yolo3_theta.json").write_text("here")
    path.write_text(yaml.safe_dump({"models": [{"weights": "yolo11n.pt"}],
                                    "fusion": {"params": {"calibration": "coco_yolo3_theta.json"}}}))
    config = load_ensemble_config(path)
    assert config.fusion.params["calibration"] == str(CONFIG_ROOT / "heads" / "coco_yolo3_theta.json")
    # upstream weights that Ultralytics downloaded into the working directory are found there, as upstream
    (run / "yolo11n.pt").write_text("downloaded")
    assert load_ensemble_config(path).models[0].weights == "yolo11n.pt"
    # absolute paths and ~ are taken as they are
    home = tmp_path / "home"
    (home / "gt.json").parent.mkdir()
    monkeypatch.setenv("HOME", str(home))
    path.write_text(yaml.safe_dump({"dataset": "~/gt.json", "models": [{"type": "precomputed", "results": str(run / "r.json")}]}))
    config = load_ensemble_config(path)
    assert config.dataset == "~/gt.json" and config.models[0].results == str(run / "r.json")


def test_a_shipped_configs_weights_in_the_working_directory_are_refused_saying_how_to_use_them(tmp_path, monkeypatch):
    """A wheel's user who runs a shipped config from the folder of its weights (found there by earlier
    versions) cannot edit the YAML: the message says to name that folder as a weights folder, and names
    the working directory's entry as it is there, not the target of a link."""
    import detens.adapters.weights as weights

    monkeypatch.delenv("DETENS_WEIGHTS", raising=False)
    monkeypatch.setattr(weights, "shared_models_above", lambda start=None: None)  # no weights folder: a wheel's
    monkeypatch.setattr(weights, "repository_weights_dir", lambda: None)
    shipped = load_ensemble_config("coco_yolo3")
    name = shipped.models[0].weights  # yolov8n_int8_tflite/yolov8n_int8.tflite: a name in a weights folder
    elsewhere = tmp_path / "downloads" / name
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_text("weights")
    run = tmp_path / "run"
    (run / name).parent.mkdir(parents=True)
    (run / name).symlink_to(elsewhere)
    monkeypatch.chdir(run)
    with pytest.raises(ValueError) as refused:
        load_ensemble_config("coco_yolo3")
    message = str(refused.value)
    assert f"models[0].weights {name!r} is relative to the YAML's folder" in message
    assert f"the file {run / name} in the working directory is not looked at" in message, message
    assert message.endswith("; or, for a name relative to a weights folder, pass the folder that holds it "
                            "(--weights-dir, $DETENS_WEIGHTS)"), message
    assert load_ensemble_config("coco_yolo3", {"weights_dir": "."}).models[0].weights == name  # --weights-dir .


def test_a_yaml_calibration_beside_it_fuses_from_another_working_directory(tmp_path, monkeypatch, capsys):
    """``detens fuse`` with a calibration head named beside the YAML: an earlier version looked for it in the
    working directory."""
    import torch
    from ultralytics.utils import ASSETS

    from detens.cli import fuse as fuse_tool
    from detens.heads import CalibrationHead

    cfg, run, source = tmp_path / "cfg", tmp_path / "run", tmp_path / "src"
    for folder in (cfg, run, source):
        folder.mkdir()
    shutil.copy(Path(ASSETS) / "bus.jpg", source / "a.jpg")
    box = {"image_id": 1, "category_id": 6, "bbox": [20.0, 230.0, 780.0, 520.0], "score": 0.9}
    (cfg / "saved.json").write_text(json.dumps([box]))
    (cfg / "images.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}]}))
    halved = (torch.tensor([0.0, 1.0], dtype=torch.float64), torch.tensor([0.0, 0.5], dtype=torch.float64))
    CalibrationHead(["saved", "twin"], {"saved": halved, "twin": halved}).save(cfg / "cal.json")
    member = {"type": "precomputed", "results": "saved.json", "images": "images.json"}
    (cfg / "e.yaml").write_text(yaml.safe_dump({
        "models": [{**member, "name": "saved"}, {**member, "name": "twin"}],
        "fusion": {"method": "wbf", "params": {"calibration": "cal.json"}},
    }))
    monkeypatch.chdir(run)
    code = fuse_tool.main(["--config", str(cfg / "e.yaml"), "--source", str(source), "--out", "o", "--quiet",
                           "--no-vis"])
    assert code == 0, capsys.readouterr().err
    fused = json.loads((run / "o" / "predictions.json").read_text())
    assert [round(r["score"], 3) for r in fused] == [0.45]  # the calibration ran

    # rewritten in place, the calibration no longer made the results: the run is not resumed over them
    capsys.readouterr()
    quarter = (torch.tensor([0.0, 1.0], dtype=torch.float64), torch.tensor([0.0, 0.25], dtype=torch.float64))
    CalibrationHead(["saved", "twin"], {"saved": quarter, "twin": quarter}).save(cfg / "cal.json")
    code = fuse_tool.main(["--config", str(cfg / "e.yaml"), "--source", str(source), "--out", "o", "--quiet",
                           "--no-vis"])
    assert code == 2 and "cal.json changed since the earlier run" in capsys.readouterr().err
    assert json.loads((run / "o" / "predictions.json").read_text()) == fused


def test_the_config_a_run_saves_loads_as_the_same_config_from_the_same_working_directory(tmp_path, monkeypatch,
                                                                                         capsys):
    """Run from the YAML's folder, its relative paths are kept as written (they mean the same from there);
    the saved config.yaml, whose relative paths would be read beside it, names them absolutely. A folder
    whose config.yaml an earlier version wrote with the paths as given still resumes."""
    from ultralytics.utils import ASSETS

    from detens.cli import fuse as fuse_tool
    from detens.config import save_yaml_config
    from detens.ensemble_config import with_absolute_paths

    cfg, source = tmp_path / "cfg", tmp_path / "src"
    for folder in (cfg, source):
        folder.mkdir()
    shutil.copy(Path(ASSETS) / "bus.jpg", source / "a.jpg")
    shutil.copy(Path(ASSETS) / "zidane.jpg", source / "b.jpg")
    box = {"category_id": 6, "bbox": [20.0, 230.0, 780.0, 520.0], "score": 0.9}
    (cfg / "saved.json").write_text(json.dumps([{"image_id": 1, **box}, {"image_id": 2, **box}]))
    (cfg / "images.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"},
                                                            {"id": 2, "file_name": "b.jpg"}]}))
    member = {"type": "precomputed", "results": "saved.json", "images": "images.json"}
    (cfg / "e.yaml").write_text(yaml.safe_dump({"models": [{**member, "name": "one"}, {**member, "name": "two"}],
                                                "fusion": {"method": "wbf"}}))
    monkeypatch.chdir(cfg)
    config = load_ensemble_config("e.yaml", {"output.vis": False})  # as the runs below resolve it
    assert config.models[0].results == "saved.json"  # kept as written

    def fuse(config_path, out, images):
        capsys.readouterr()
        code = fuse_tool.main(["--config", config_path, "--source", str(images), "--out", out, "--quiet", "--no-vis"])
        assert code == 0, capsys.readouterr().err

    fuse("e.yaml", "runs/a", source / "a.jpg")
    assert load_ensemble_config("runs/a/config.yaml") == with_absolute_paths(config)
    fuse("runs/a/config.yaml", "runs/b", source / "a.jpg")
    fuse("e.yaml", "runs/a", source)  # resumes over the absolute paths it saved
    assert json.loads((cfg / "runs" / "a" / "summary.json").read_text())["resumed"] == 1

    fuse("e.yaml", "runs/old", source / "a.jpg")
    save_yaml_config(config, cfg / "runs" / "old" / "config.yaml")  # as earlier versions saved it
    fuse("e.yaml", "runs/old", source)
    assert json.loads((cfg / "runs" / "old" / "summary.json").read_text())["resumed"] == 1


def test_shipped_head_names_are_the_heads():
    from detens.packaged import packaged_names

    assert packaged_names("heads") == ["coco_yolo3_deep", "coco_yolo3_theta", "coco_yolo3_tiles_deep"]


def test_with_absolute_paths_makes_existing_relative_files_absolute(tmp_path, monkeypatch):
    from detens.ensemble_config import EnsembleConfig, FusionConfig, ModelConfig, with_absolute_paths

    monkeypatch.chdir(tmp_path)
    for name in ("w.onnx", "r.json", "i.json", "gt.json", "head.json", "cal.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "weights").mkdir()
    fusion = FusionConfig(method="theta", head="head.json", params={"calibration": "cal.json", "iou_thr": 0.5})
    config = EnsembleConfig(
        weights_dir="weights", dataset="gt.json", fusion=fusion,
        models=[ModelConfig(weights="yolo11n.pt", name="a"),  # a download name: not a file here
                ModelConfig(type="precomputed", results="r.json", images="i.json", name="b"),
                ModelConfig(weights=str(tmp_path / "w.onnx"), name="c")],
    )
    absolute = with_absolute_paths(config)
    assert absolute.weights_dir == str(tmp_path / "weights") and absolute.dataset == str(tmp_path / "gt.json")
    assert absolute.fusion.head == str(tmp_path / "head.json") and absolute.fusion.method == "theta"
    assert absolute.fusion.params == {"calibration": str(tmp_path / "cal.json"), "iou_thr": 0.5}
    assert [m.weights for m in absolute.models] == ["yolo11n.pt", None, str(tmp_path / "w.onnx")]
    assert (absolute.models[1].results, absolute.models[1].images) == (str(tmp_path / "r.json"), str(tmp_path / "i.json"))
    assert config.models[1].results == "r.json"  # the caller's config is left as it was
    assert with_absolute_paths(config.models[1]).results == str(tmp_path / "r.json")


PATH_KEYS = [("config", key) for key in ("dataset", "weights_dir")] + [
    ("member", key) for key in ("weights", "results", "images")
]


@pytest.mark.parametrize("where, key", PATH_KEYS, ids=[f"{w}.{k}" for w, k in PATH_KEYS])
def test_each_path_key_is_read_beside_the_yaml_made_absolute_and_compared_by_its_real_path(
    tmp_path, monkeypatch, where, key
):
    """Each key that names a file or folder is found beside the YAML, saved absolute and compared through
    links alike: a key one of them left out would be read from the working directory, or refuse a resume."""
    from detens.ensemble_config import (
        ENSEMBLE_PATH_KEYS,
        MODEL_PATH_KEYS,
        with_absolute_paths,
        with_real_paths,
    )

    # a key added to either is added here too, and so checked by each of the three
    assert [("config", k) for k in ENSEMBLE_PATH_KEYS] + [("member", k) for k in MODEL_PATH_KEYS] == PATH_KEYS
    folder = tmp_path / "cfg"
    folder.mkdir()
    if key == "weights_dir":
        (folder / "target").mkdir()
    else:
        (folder / "target").write_text("{}")
    (folder / "link").symlink_to(folder / "target")
    member = {"weights": "yolo11n.pt"} if key == "weights" else {"type": "precomputed", "results": "r.json", "images": "i.json"}
    data = {"models": [{**member, key: "target"} if where == "member" else member], "fusion": {"method": "wbf"}}
    if where == "config":
        data[key] = "target"
    (folder / "e.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    config = load_ensemble_config(folder / "e.yaml")
    holder = config.models[0] if where == "member" else config
    assert getattr(holder, key) == str(folder / "target")  # beside the YAML, not in the working directory

    monkeypatch.chdir(folder)
    if where == "member":
        relative = ModelConfig(**{**member, key: "target"})
    else:
        relative = EnsembleConfig(models=[ModelConfig(**member)], **{key: "target"})
    assert getattr(with_absolute_paths(relative), key) == str(folder / "target")

    linked = {**data, key: "link"} if where == "config" else {**data, "models": [{**member, key: "link"}]}
    assert with_real_paths(linked) == with_real_paths(data)
    assert with_real_paths(linked) != linked


def test_ray_engines_hand_the_actors_absolute_paths(tmp_path, monkeypatch):
    """Actors of a cluster started elsewhere do not share this process's working directory."""
    from detens.engines import ray_cache, ray_fuse
    from detens.ensemble_config import EnsembleConfig, ModelConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.json").write_text("[]")
    seen = []

    def fake_map_on_actors(items, actor, kwargs, batch_size, options):
        seen.append((items, kwargs))
        return iter(())

    monkeypatch.setattr(ray_cache, "map_on_actors", fake_map_on_actors)
    monkeypatch.setattr(ray_fuse, "map_on_actors", fake_map_on_actors)
    model = ModelConfig(type="precomputed", results="r.json", name="b")
    config = EnsembleConfig(models=[model])
    list(ray_cache.detect_on_ray(model, config, None, {"b": [1]}, lambda i: "images/1.jpg", 1, None))
    list(ray_fuse.fuse_on_ray([("1.jpg", "1", "images/1.jpg")], config, {1: "x"}, [1], None))
    (cache_items, cache_kwargs), (fuse_items, fuse_kwargs) = seen
    assert cache_items[0]["path"] == fuse_items[0]["path"] == str(tmp_path / "images" / "1.jpg")
    assert cache_kwargs["model"].results == str(tmp_path / "r.json")
    assert cache_kwargs["ensemble"].models[0].results == fuse_kwargs["config"].models[0].results == str(tmp_path / "r.json")


def test_ray_engines_name_missing_weights_before_starting_actors(tmp_path, monkeypatch):
    from detens.adapters.weights import WeightsNotFoundError
    from detens.engines import ray_cache, ray_fuse
    from detens.ensemble_config import EnsembleConfig, ModelConfig

    monkeypatch.chdir(tmp_path)
    started = []
    monkeypatch.setattr(ray_cache, "map_on_actors", lambda *args: started.append(args) or iter(()))
    monkeypatch.setattr(ray_fuse, "map_on_actors", lambda *args: started.append(args) or iter(()))
    typo = ModelConfig(weights="yolo11n_TYPO.tflite", name="typo")
    config = EnsembleConfig(models=[ModelConfig(type="precomputed", results="r.json", name="b"), typo])
    with pytest.raises(WeightsNotFoundError, match=r"model 'typo': weights 'yolo11n_TYPO.tflite' not found"):
        list(ray_cache.detect_on_ray(typo, config, None, {"typo": [1]}, lambda i: "1.jpg", 1, None))
    with pytest.raises(WeightsNotFoundError, match=r"model 'typo'"):
        list(ray_fuse.fuse_on_ray([("1.jpg", "1", "1.jpg")], config, {1: "x"}, [1], None))
    config.source = Path("e.yaml")  # read from a YAML: the refusal leads with it, as the member's others do
    with pytest.raises(WeightsNotFoundError, match=r"^e.yaml: model 'typo': weights 'yolo11n_TYPO.tflite' not found"):
        list(ray_cache.detect_on_ray(typo, config, None, {"typo": [1]}, lambda i: "1.jpg", 1, None))
    assert started == []


def test_ready_for_actors_checks_weights_and_makes_paths_absolute(tmp_path, monkeypatch):
    """The one set-up of both Ray engines before they start actors."""
    from detens.adapters.weights import WeightsNotFoundError
    from detens.engines.ray_cache import ready_for_actors
    from detens.ensemble_config import EnsembleConfig, ModelConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.onnx").write_text("onnx")
    (tmp_path / "weights").mkdir()
    onnx = ModelConfig(type="onnx", weights="w.onnx", decoder="yolox", name="o")
    typo = ModelConfig(weights="yolo11n_TYPO.tflite", name="typo")
    config = EnsembleConfig(weights_dir="weights", models=[onnx, typo])
    ready, (model,) = ready_for_actors(config, [onnx])  # the other member's weights are not checked
    assert model.weights == ready.models[0].weights == str(tmp_path / "w.onnx")
    assert ready.weights_dir == str(tmp_path / "weights") and config.models[0].weights == "w.onnx"
    with pytest.raises(WeightsNotFoundError, match=r"model 'typo'"):
        ready_for_actors(config, config.models)


def test_ray_gpus_that_no_node_has_are_named(caplog):
    from detens.engines.ray_cache import check_gpus

    check_gpus(0.0, 0.0, None)
    check_gpus(1.0, 2.0, None)
    check_gpus(0.5, 1.0, "auto")
    with pytest.raises(ValueError, match="each actor asks for 1 GPU but the Ray cluster has 0; .*--gpus-per-actor 0"):
        check_gpus(1.0, 0.0, None)
    with caplog.at_level("WARNING", logger="detens.ray"):
        check_gpus(1.0, 0.0, "auto")  # an autoscaler may add a GPU node
    assert "unless the cluster adds GPU nodes" in caplog.text


@pytest.mark.parametrize("spelling", ["..", "link"])
def test_fuse_and_cache_resume_a_yaml_run_from_another_working_directory(tmp_path, monkeypatch, capsys, spelling):
    """Run from the YAML's folder its paths are kept as written, elsewhere made absolute: a path through
    ``..`` or a linked folder (fuse) or any relative one (cache, whose settings record the paths) was then
    "a different config" and the same command refused the folder it had written."""
    from ultralytics.utils import ASSETS

    from detens.cli import main

    cfg, elsewhere, source = tmp_path / "cfg", tmp_path / "elsewhere", tmp_path / "src"
    for folder in (cfg / "data", elsewhere, source):
        folder.mkdir(parents=True)
    shutil.copy(Path(ASSETS) / "bus.jpg", source / "a.jpg")
    box = {"image_id": 1, "category_id": 6, "bbox": [20.0, 230.0, 780.0, 520.0], "score": 0.9}
    (cfg / "data" / "saved.json").write_text(json.dumps([box]))
    (cfg / "data" / "images.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}]}))
    (tmp_path / "gt.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg", "width": 810, "height": 1080}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 6, "bbox": [20, 230, 780, 520], "area": 405600,
                         "iscrowd": 0}],
        "categories": [{"id": 6, "name": "bus"}],
    }))
    if spelling == "link":
        os.symlink(cfg / "data", cfg / "linked")
        folder = "linked"
    else:
        folder = "../cfg/data"
    member = {"type": "precomputed", "results": f"{folder}/saved.json", "images": f"{folder}/images.json"}
    (cfg / "e.yaml").write_text(yaml.safe_dump({"models": [{**member, "name": "saved"}], "fusion": {"method": "wbf"}}))
    fuse = ["fuse", "--source", str(source), "--out", str(tmp_path / "fused"), "--quiet", "--no-vis"]
    cache = ["cache", "--images", str(source), "--gt", str(tmp_path / "gt.json"), "--out", str(tmp_path / "cache"),
             "--quiet"]
    for command in (fuse, cache):
        for working_directory, config in ((cfg, "e.yaml"), (elsewhere, str(cfg / "e.yaml"))):
            monkeypatch.chdir(working_directory)
            assert main([*command, "--config", config]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "fused" / "summary.json").read_text())["resumed"] == 1
    assert json.loads((tmp_path / "cache" / "saved.json").read_text()) == [box]


def test_a_folder_named_tilde_written_from_its_parent_is_not_the_home_folder(tmp_path, monkeypatch):
    """``./~/c.yaml`` is the config in a folder named ``~`` of the working directory, and a YAML's ``./~/gt.json``
    the file in a folder named ``~`` beside the YAML: ``Path`` drops the ``./``, and read so they were the home
    folder's. ``~/c.yaml`` is still the home folder's."""
    home, work, cfg = tmp_path / "home", tmp_path / "work", tmp_path / "cfg"
    for folder in (home, work / "~", cfg / "~"):
        folder.mkdir(parents=True)
        (folder / "r.json").write_text("[]")
        (folder / "gt.json").write_text("{}")
        (folder / "cal.json").write_text("{}")
        (folder / "c.yaml").write_text(yaml.safe_dump({"models": [{"type": "precomputed", "results": "r.json"}]}))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert load_ensemble_config("./~/c.yaml").models[0].results == str(work / "~" / "r.json")
    assert load_ensemble_config("~/c.yaml").models[0].results == str(home / "r.json")
    # what a worker elsewhere is sent: the working directory's ./~/r.json made absolute, ~/r.json left to it
    for results, sent in (("./~/r.json", str(work / "~" / "r.json")), ("~/r.json", "~/r.json")):
        assert with_absolute_paths(ModelConfig(type="precomputed", results=results)).results == sent
    (cfg / "e.yaml").write_text(yaml.safe_dump({
        "dataset": "./~/gt.json", "models": [{"type": "precomputed", "results": "./~/r.json"}],
        "fusion": {"head": "./~/h.json", "params": {"calibration": "./~/cal.json"}},
    }))
    (home / "h.json").write_text("{}")  # not beside the YAML either: named where it was looked for
    config = load_ensemble_config(cfg / "e.yaml")
    assert (config.dataset, config.models[0].results, config.fusion.params["calibration"], config.fusion.head) == (
        str(cfg / "~" / "gt.json"), str(cfg / "~" / "r.json"), str(cfg / "~" / "cal.json"), str(cfg / "~" / "h.json"))
