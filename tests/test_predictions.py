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


@pytest.mark.parametrize("result, error, message", [
    # before, results given to the constructor went unchecked: 1.5 became class 1 and True class 1
    ({"category_id": 1.5}, ValueError, r"^results of 'b'\[0\]\.category_id must be an integer, got 1\.5$"),
    ({"category_id": True}, ValueError, r"^results of 'b'\[0\]\.category_id must be an integer, got True$"),
    ({"score": 2}, ValueError, r"^results of 'b'\[0\]\.score must be in \[0, 1\]"),
    ({"score": "0.9"}, ValueError, r"^results of 'b'\[0\]\.score must be a finite number, got '0\.9'$"),
    ({"bbox": [1, 2, 3, 4, 5]}, ValueError, r"^results of 'b'\[0\]\.bbox must be 4 finite numbers"),
    ({"image_id": None}, ValueError, r"^results of 'b'\[0\]\.image_id must be an integer, got None$"),
])
def test_results_given_unchecked_are_checked_naming_the_model(result, error, message):
    gt = CocoGroundTruth(GT)
    with pytest.raises(error, match=message):
        EnsemblePredictions(["a", "b"], [RESULTS, [{**RESULTS[0], **result}]], gt)
    with pytest.raises(TypeError, match=r"^results of 'a' must be a list of result dicts, got a dict$"):
        EnsemblePredictions(["a"], [RESULTS[0]], gt)
    # checked results are taken as they are: what from_folder gives after load_coco_results
    assert len(EnsemblePredictions(["a"], [RESULTS], gt, validated=True).per_model(1)[0]) == 1


def test_the_ground_truth_may_be_given_as_evaluate_coco_takes_it(tmp_path):
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(GT), encoding="utf-8")
    for gt in (GT, path, str(path), CocoGroundTruth(GT)):
        predictions = EnsemblePredictions(["a"], [RESULTS], gt)
        assert isinstance(predictions.gt, CocoGroundTruth) and predictions.gt.image_ids == [1]
    with pytest.raises(TypeError, match=r"ground truth must be a COCO annotation file path, a dict, .* got int"):
        EnsemblePredictions(["a"], [RESULTS], 5)


def test_from_folder_takes_the_ground_truth_as_the_constructor_does(tmp_path):
    """Given a path or a dict, it stopped at an AttributeError ('str' object has no attribute 'image_ids')."""
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps(RESULTS), encoding="utf-8")
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(GT), encoding="utf-8")
    for gt in (GT, path, str(path), CocoGroundTruth(GT)):
        predictions = EnsemblePredictions.from_folder(folder, gt)
        assert isinstance(predictions.gt, CocoGroundTruth) and predictions.gt.image_ids == [1]
        assert len(predictions.per_model(1)[0]) == 1
    with pytest.raises(TypeError, match=r"ground truth must be a COCO annotation file path, a dict, .* got int"):
        EnsemblePredictions.from_folder(folder, 5)


@pytest.mark.parametrize("names, error, message", [
    ([], ValueError, r"^model_names must name at least one model, got \[\]$"),
    (["", "b"], ValueError, r"^model_names\[0\] is empty: a model's name must be a non-empty string$"),
    ([1, "b"], TypeError, r"^model_names\[0\] must be a model's name, a string, got int: 1$"),
    (["a", "a"], ValueError, r"^model_names must name each model once, got \['a'\] more than once: \['a', 'a'\]$"),
])
def test_member_names_are_checked_where_an_ensemble_is_made_or_narrowed(names, error, message):
    gt = CocoGroundTruth(GT)
    with pytest.raises(error, match=message):
        EnsemblePredictions(names, [RESULTS] * len(names), gt)
    predictions = EnsemblePredictions(["a", "b"], [RESULTS, RESULTS], gt)
    # select made an ensemble of "a" twice, which every fixed fuser then counted twice
    with pytest.raises(error, match=message.replace("model_names", "models")):
        predictions.select(names)
    assert predictions.select(["b"]).model_names == ["b"]


def test_an_image_id_that_is_no_integer_is_refused_not_truncated_or_missed():
    predictions = EnsemblePredictions(["a"], [RESULTS], CocoGroundTruth(GT))
    assert len(predictions.per_model(1)[0]) == 1 and len(predictions.per_model(1.0)[0]) == 1
    with pytest.raises(TypeError, match=r"^image_id must be an integer, got str: '1'$"):
        predictions.per_model("1")  # found nothing, and answered an empty image
    with pytest.raises(ValueError, match=r"^image_id must be a whole number, got 1\.7$"):
        predictions.gt.image_size(1.7)  # image 1's size
    with pytest.raises(TypeError, match=r"^image_id must be an integer, got bool: True$"):
        predictions.gt.image_size(True)
    with pytest.raises(KeyError, match=r"image_id 2 is not in the ground truth \(1 images\)"):
        predictions.per_model(2)


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
    with pytest.raises(ValueError, match=r"predictions of 'coco80' \(.*coco80\.json\) use category ids that the ground truth does not "
                                         r"define: 3 \(the ground truth's: 1\)"):
        EnsemblePredictions.from_folder(tmp_path, gt)
    with pytest.raises(ValueError, match=r"predictions of 'b' use category ids that the ground truth does not define: 3 "):
        EnsemblePredictions(["a", "b"], [RESULTS, foreign], gt)
    assert EnsemblePredictions.from_folder(tmp_path, gt, models=["good"]).model_names == ["good"]
def test_category_ids_the_ground_truth_lacks_are_refused_when_loaded(tmp_path, capsys):
    """COCO ids under a dataset of one's own: a theta head without a matching-IoU search, or a calibration
    head, never scores while it fits, and was written as if trained on the dataset."""
    gt = {**GT, "categories": [{"id": 1, "name": "human"}, {"id": 5, "name": "vehicle"}]}
    coco = [*RESULTS, {**RESULTS[0], "category_id": 3}, {**RESULTS[0], "category_id": 62}]
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("a", "b"):
        (cache / f"{name}.json").write_text(json.dumps(coco), encoding="utf-8")
    with pytest.raises(ValueError, match=r"predictions of 'a' \(.*a\.json\) use category ids that the ground truth does not "
                                         r"define: 3, 62 \(the ground truth's: 1, 5\); .*class_map"):
        EnsemblePredictions.from_folder(cache, CocoGroundTruth(gt))
    (tmp_path / "gt.json").write_text(json.dumps(gt), encoding="utf-8")
    from detens.cli import train as train_cli

    for head in ("theta", "calibration"):
        out = tmp_path / f"{head}.json"
        options = ["--set", "match_iou_grid=[]"] if head == "theta" else []
        code = train_cli.main(["--gt", str(tmp_path / "gt.json"), "--predictions", str(cache), "--head", head,
                               "--quiet", "--out", str(out), *options])
        err = capsys.readouterr().err
        assert code == 2 and err.count("error:") == 1 and "use category ids that the ground truth" in err
        assert not out.exists()


def test_train_says_how_many_images_without_annotations_it_leaves_out(tmp_path, capsys):
    images = [{"id": i, "width": 100, "height": 80, "file_name": f"{i}.jpg"} for i in (1, 2, 3)]
    gt = {**GT, "images": images, "annotations": [*GT["annotations"], {**GT["annotations"][0], "id": 2, "image_id": 2}]}
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("a", "b"):
        results = [{**RESULTS[0], "image_id": i} for i in (1, 2, 3)]
        (cache / f"{name}.json").write_text(json.dumps(results), encoding="utf-8")
    (tmp_path / "gt.json").write_text(json.dumps(gt), encoding="utf-8")
    from detens.cli import train as train_cli

    args = ["--gt", str(tmp_path / "gt.json"), "--predictions", str(cache), "--head", "calibration"]
    assert train_cli.main([*args, "--out", str(tmp_path / "h.json")]) == 0
    err = capsys.readouterr().err
    assert f"1 of the 3 images of {tmp_path / 'gt.json'} have no annotation and are not trained on" in err
    (tmp_path / "ids.txt").write_text("1\n2\n3\n")
    assert train_cli.main([*args, "--out", str(tmp_path / "h2.json"), "--images-from", str(tmp_path / "ids.txt")]) == 0
    assert "have no annotation" not in capsys.readouterr().err


def test_a_file_given_for_the_folder_is_named_as_one(tmp_path):
    (tmp_path / "yolo.json").write_text(json.dumps(RESULTS), encoding="utf-8")
    with pytest.raises(NotADirectoryError, match=r"^prediction folder expected, got a file: .*yolo\.json"):
        EnsemblePredictions.from_folder(tmp_path / "yolo.json", CocoGroundTruth(GT))
    with pytest.raises(FileNotFoundError, match=r"^prediction folder not found: "):
        EnsemblePredictions.from_folder(tmp_path / "none", CocoGroundTruth(GT))


def test_a_model_without_any_detection_is_warned_of_and_kept(tmp_path, caplog):
    """An empty results file is valid (the member finds nothing) but almost always a broken export or tool."""
    gt = CocoGroundTruth(GT)
    (tmp_path / "good.json").write_text(json.dumps(RESULTS), encoding="utf-8")
    (tmp_path / "broken.json").write_text("[]", encoding="utf-8")
    with caplog.at_level("WARNING", logger="detens.predictions"):
        predictions = EnsemblePredictions.from_folder(tmp_path, gt)
    assert predictions.model_names == ["broken", "good"]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [f"{tmp_path}: broken.json holds no detection on the image: check the model (its export, "
                      "its class_map) and the tool that wrote the file"], warned


def test_train_says_why_a_member_without_detections_cannot_be_fitted_as_evaluate_does(tmp_path, capsys):
    """deep calibrates by default: train said only that a calibration curve needs the member's scores, for a
    head the user never asked to calibrate; evaluate says which option asks for it."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "a.json").write_text(json.dumps(RESULTS), encoding="utf-8")
    (cache / "b.json").write_text("[]", encoding="utf-8")
    (tmp_path / "gt.json").write_text(json.dumps(GT), encoding="utf-8")
    from detens.cli import train as train_cli

    out = tmp_path / "deep.json"
    code = train_cli.main(["--gt", str(tmp_path / "gt.json"), "--predictions", str(cache), "--head", "deep",
                           "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and not out.exists(), err
    assert ("error: deep calibrates every member's scores before it is fitted (calibrate: true; false fits it on "
            "the raw scores): model 'b' has no detection") in err


def test_a_cache_members_finished_images_are_its_numbered_records_not_its_settings(tmp_path):
    from detens.predictions import CACHE_PARTIAL, finished_image_records

    member = tmp_path / CACHE_PARTIAL / "a"
    assert list(finished_image_records(member)) == []  # no folder yet: nothing finished
    member.mkdir(parents=True)
    (member / "_settings.json").write_text("{}")
    assert list(finished_image_records(member)) == []
    for name in ("7.json", "12.json"):
        (member / name).write_text("{}")
    assert sorted(p.name for p in finished_image_records(member)) == ["12.json", "7.json"]
