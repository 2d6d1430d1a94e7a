"""``detens.io.output_stems``: one distinct output stem per input file, on any file system."""

from __future__ import annotations

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
