"""``detens.predictions``: saved per-model predictions, loaded and selected by model name."""

from __future__ import annotations

import json

import pytest

from detens.coco import CocoGroundTruth
from detens.predictions import EnsemblePredictions

GT = {
    "images": [{"id": 1, "width": 100, "height": 80, "file_name": "1.jpg"}],
    "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 30, 40], "area": 1200, "iscrowd": 0}],
    "categories": [{"id": 1, "name": "a"}],
}
RESULTS = [{"image_id": 1, "category_id": 1, "bbox": [1, 2, 30, 40], "score": 0.9}]


def test_one_model_name_as_a_string_is_refused_not_spelled_out(tmp_path):
    gt = CocoGroundTruth(GT)
    (tmp_path / "yolo.json").write_text(json.dumps(RESULTS), encoding="utf-8")
    with pytest.raises(TypeError, match=r"models must be a list of model names, got the string 'yolo'"):
        EnsemblePredictions.from_folder(tmp_path, gt, models="yolo")
    with pytest.raises(TypeError, match=r"model_names .* the string 'ab'"):
        EnsemblePredictions("ab", [RESULTS, RESULTS], gt)
    predictions = EnsemblePredictions.from_folder(tmp_path, gt, models=["yolo"])
    assert predictions.model_names == ["yolo"]
    with pytest.raises(TypeError, match="the string 'yolo'"):
        predictions.select("yolo")


def test_hidden_json_files_are_not_taken_for_models(tmp_path):
    """Copied to some disks, macOS writes ``._<name>.json`` beside each file: not a model's results."""
    (tmp_path / "yolo.json").write_text(json.dumps(RESULTS), encoding="utf-8")
    (tmp_path / "._yolo.json").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    assert EnsemblePredictions.from_folder(tmp_path, CocoGroundTruth(GT)).model_names == ["yolo"]


def test_a_category_the_ground_truth_lacks_is_refused_naming_the_model(tmp_path):
    """Caught on loading, not at the first COCO evaluation, which names no model and comes after fitting."""
    gt = CocoGroundTruth(GT)
    foreign = [*RESULTS, {"image_id": 1, "category_id": 3, "bbox": [5, 5, 10, 10], "score": 0.5}]
    (tmp_path / "good.json").write_text(json.dumps(RESULTS), encoding="utf-8")
    (tmp_path / "coco80.json").write_text(json.dumps(foreign), encoding="utf-8")
    with pytest.raises(ValueError, match=r"predictions of 'coco80' \(.*coco80\.json\) use category ids \[3\] .* categories: \[1\]"):
        EnsemblePredictions.from_folder(tmp_path, gt)
    with pytest.raises(ValueError, match=r"predictions of 'b' use category ids \[3\]"):
        EnsemblePredictions(["a", "b"], [RESULTS, foreign], gt)
    assert EnsemblePredictions.from_folder(tmp_path, gt, models=["good"]).model_names == ["good"]
