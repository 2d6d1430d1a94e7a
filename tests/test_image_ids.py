"""``detens fuse``'s image ids (``images.json``): every image its own, the dataset's where it has the image."""

from __future__ import annotations

import json

import pytest

from detens.jobs.fuse import image_ids


@pytest.fixture
def dataset(tmp_path):
    """A COCO dataset of ``a.jpg`` (1), ``val/b.jpg`` (5), ``x/c.jpg`` (7) and ``y/c.jpg`` (8)."""
    files = {"a.jpg": 1, "val/b.jpg": 5, "x/c.jpg": 7, "y/c.jpg": 8}
    path = tmp_path / "gt.json"
    path.write_text(json.dumps({
        "images": [{"id": i, "file_name": f, "height": 10, "width": 10} for f, i in files.items()],
        "annotations": [], "categories": [{"id": 1, "name": "thing"}],
    }))
    return str(path)


def test_without_a_dataset_new_images_follow_the_earlier_ones():
    assert image_ids(["p.jpg", "q.jpg"], None) == {"p.jpg": 1, "q.jpg": 2}
    assert image_ids(["p.jpg", "q.jpg", "r.jpg"], None, fixed={"p.jpg": 1, "q.jpg": 2}) == {
        "p.jpg": 1, "q.jpg": 2, "r.jpg": 3}


def test_images_of_the_dataset_get_its_ids_by_path_then_by_base_name(dataset):
    assert image_ids(["a.jpg", "val/b.jpg", "sub/a.jpg"], dataset) == {"a.jpg": 1, "val/b.jpg": 5, "sub/a.jpg": 9}
    assert image_ids(["sub/a.jpg", "b.jpg"], dataset) == {"sub/a.jpg": 1, "b.jpg": 5}


def test_a_resumed_run_numbers_new_images_after_the_earlier_runs(dataset):
    first = image_ids(["new1.jpg"], dataset)
    assert first == {"new1.jpg": 9}  # after the dataset's largest id
    assert image_ids(["new1.jpg", "new2.jpg"], dataset, fixed=first) == {"new1.jpg": 9, "new2.jpg": 10}


def test_a_dataset_id_an_earlier_run_gave_out_is_not_given_again(dataset):
    # the earlier run matched train/a.jpg to a.jpg by base name; val/a.jpg is another file
    ids = image_ids(["train/a.jpg", "val/a.jpg"], dataset, fixed={"train/a.jpg": 1})
    assert ids == {"train/a.jpg": 1, "val/a.jpg": 9}


@pytest.mark.parametrize("names, named", [
    (["train/a.jpg", "val/a.jpg"], "'train/a.jpg', 'val/a.jpg' (relative to --source) and its 'a.jpg'"),
    (["c.jpg"], "'c.jpg' (relative to --source) and its 'x/c.jpg', 'y/c.jpg'"),
])
def test_a_base_name_shared_on_either_side_is_refused(dataset, names, named):
    with pytest.raises(ValueError, match="cannot tell which file is which image of the dataset") as raised:
        image_ids(names, dataset)
    assert named in str(raised.value) and "base name" in str(raised.value)
