"""``detens.io.output_stems``: one distinct output stem per input file, on any file system."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detens.io import output_stems


@pytest.mark.parametrize(
    "names, expected",
    [
        (["a.jpg", "a.png", "b.jpg", "s/a.jpg", "noext"],
         {"a.jpg": "a_jpg", "a.png": "a_png", "b.jpg": "b", "s/a.jpg": "s/a", "noext": "noext"}),
        # the same stem and extension but for case: one got the other's labels/ and vis/ files
        (["a.jpg", "a.JPG"], {"a.JPG": "a_jpg", "a.jpg": "a_jpg_2"}),
        # a name whose own stem is another's disambiguated one
        (["a.jpg", "a.png", "a_jpg.bmp"], {"a_jpg.bmp": "a_jpg", "a.jpg": "a_jpg_2", "a.png": "a_png"}),
        # stems that differ only in case clash on case-insensitive file systems
        (["A.jpg", "a.png"], {"A.jpg": "A_jpg", "a.png": "a_png"}),
        (["a", "a.jpg"], {"a": "a", "a.jpg": "a_jpg"}),
        (["x.tar.gz", "x.tar"], {"x.tar.gz": "x.tar", "x.tar": "x"}),
    ],
)
def test_output_stems(names, expected):
    assert output_stems(names) == expected


def test_listing_order_does_not_change_the_stems():
    names = ["a.jpg", "a.JPG", "a.Jpg", "b/a.png", "b/A.PNG"]
    assert output_stems(names) == output_stems(names[::-1])


def test_a_name_given_twice_is_an_error():
    with pytest.raises(ValueError, match=r"\['a.jpg'\] more than once"):
        output_stems(["a.jpg", "b.jpg", "a.jpg"])


part = st.text(alphabet="aAbB_.", min_size=1, max_size=4).filter(lambda s: s not in (".", ".."))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.lists(part, min_size=1, max_size=2).map("/".join), unique=True, max_size=12))
def test_stems_are_distinct_ignoring_case(names):
    stems = output_stems(names)
    assert list(stems) == names
    folded = [s.casefold() for s in stems.values()]
    assert len(set(folded)) == len(folded)
    for name, stem in stems.items():  # a stem is the name's own path without its extension, maybe extended
        base = str(PurePosixPath(name).with_suffix("")) if PurePosixPath(name).suffix else name
        assert stem.startswith(base)


@pytest.mark.parametrize(
    "names, expected",
    [
        # x.png's vis/x.jpg would be the folder of x.jpg/a.png's vis/x.jpg/a.jpg
        (["x.png", "x.jpg/a.png"], {"x.png": "x_png", "x.jpg/a.png": "x.jpg/a"}),
        # its labels/x.txt, the folder of x.txt/b.png's labels/x.txt/b.txt; also ignoring case
        (["x.png", "X.TXT/b.png"], {"x.png": "x_png", "X.TXT/b.png": "X.TXT/b"}),
        # deeper, and the extended stem avoids a folder too
        (["s/x.png", "s/x.jpg/a.png", "s/x_png.txt/c.png"],
         {"s/x.png": "s/x_png_2", "s/x.jpg/a.png": "s/x.jpg/a", "s/x_png.txt/c.png": "s/x_png.txt/c"}),
        # a name without an extension
        (["x", "x.jpg/a.png"], {"x": "x_2", "x.jpg/a.png": "x.jpg/a"}),
        # a folder named like a stem, not like a file: no clash (labels/x.txt beside labels/x/)
        (["x.png", "x/a.png"], {"x.png": "x", "x/a.png": "x/a"}),
    ],
)
def test_no_file_is_at_the_path_of_a_folder(names, expected):
    stems = output_stems(names, suffixes=(".txt", ".jpg"))
    assert stems == expected
    assert output_stems(names[::-1], suffixes=(".txt", ".jpg")) == expected


def test_an_earlier_stem_keeps_its_name_and_the_new_ones_avoid_its_files():
    assert output_stems(["x.png", "x.jpg/a.png"], {"x.jpg/a.png": "x.jpg/a"}, (".txt", ".jpg")) == {
        "x.png": "x_png", "x.jpg/a.png": "x.jpg/a"}


def test_an_earlier_file_where_a_new_folder_must_go_is_an_error():
    with pytest.raises(ValueError, match=r"'x.png' has the output stem 'x' from an earlier run, and its file "
                                         r"'x.jpg' is where the outputs of 'x.jpg/a.png' need a folder"):
        output_stems(["x.png", "x.jpg/a.png"], {"x.png": "x"}, (".txt", ".jpg"))


dotted = st.text(alphabet="ab.", min_size=1, max_size=4).filter(lambda s: s not in (".", ".."))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.lists(dotted, min_size=1, max_size=3).map("/".join), unique=True, max_size=12))
def test_output_files_and_folders_never_share_a_path(names):
    """The files ``<stem>.a`` and ``<stem>.b`` of every name, and the folders that hold them, are distinct
    paths (ignoring case), as a file system needs them."""
    stems = output_stems(names, suffixes=(".a", ".b"))
    for suffix in (".a", ".b"):
        files = [f"{stem}{suffix}".casefold() for stem in stems.values()]
        folders = {str(p).casefold() for stem in stems.values() for p in PurePosixPath(stem).parents}
        assert len(set(files)) == len(files) and not set(files) & folders


@pytest.mark.parametrize(
    "names",
    [
        ["b" * 250 + ".jpg", "b" * 250 + ".png", "short.jpg"],  # b…b_jpg.txt: 258 bytes
        ["c" * 255, "sub/" + "c" * 255],  # no extension: c…c.txt, 259 bytes
        ["画" * 83 + ".jpg", "画" * 83 + ".png"],  # 253 bytes; 83 characters, 257 bytes with _jpg.txt
        ["d" * 250 + ".jpg", "D" * 250 + ".JPG", "d" * 250 + ".Jpg"],  # told apart ignoring case, then cut
    ],
)
def test_a_stem_whose_files_would_have_too_long_a_name_is_cut_short_the_same_each_time(tmp_path, names):
    """Linux takes a name of at most 255 bytes: a run could write no file of such an image."""
    suffixes = (".txt", ".jpg")
    stems = output_stems(names, suffixes=suffixes)
    assert stems == output_stems(names[::-1], suffixes=suffixes)
    assert len({stem.casefold() for stem in stems.values()}) == len(names)
    for name, stem in stems.items():
        if name == "short.jpg":
            assert stem == "short"  # it fits: as before
            continue
        assert PurePosixPath(stem).parent == PurePosixPath(name).parent
        start, digest = PurePosixPath(stem).name.split("~")
        assert PurePosixPath(name).name.startswith(start) and re.fullmatch("[0-9a-f]{12}", digest)
        for suffix in suffixes:  # the file system takes every file of it
            (tmp_path / f"{stem}{suffix}").parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / f"{stem}{suffix}").write_text("x")
