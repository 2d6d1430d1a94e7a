from __future__ import annotations

import os

import cv2
import numpy as np
import pytest

from detens.sources import ImageReadError, ImageSizeError, as_bgr, list_images, read_image


def _write_png(path, shape=(12, 16, 3), value=100):
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, data = cv2.imencode(".png", np.full(shape, value, dtype=np.uint8))
    assert ok
    path.write_bytes(data.tobytes())
    return path


@pytest.fixture
def tree(tmp_path):
    _write_png(tmp_path / "b.png")
    _write_png(tmp_path / "a with space.PNG")
    _write_png(tmp_path / "sub" / "deeper" / "c.jpg")
    _write_png(tmp_path / ".hidden" / "d.png")
    _write_png(tmp_path / ".e.png")
    (tmp_path / "notes.txt").write_text("not an image")
    return tmp_path


class TestListImages:
    def test_folder_is_recursive_sorted_and_filtered(self, tree):
        found = list_images(tree)
        assert [p.relative_to(tree).as_posix() for p in found] == [
            "a with space.PNG",
            "b.png",
            "sub/deeper/c.jpg",
        ]

    def test_not_recursive(self, tree):
        assert [p.name for p in list_images(tree, recursive=False)] == ["a with space.PNG", "b.png"]

    def test_single_file_is_kept_whatever_its_extension(self, tree):
        assert list_images(tree / "notes.txt") == [tree / "notes.txt"]

    def test_glob(self, tree):
        assert [p.name for p in list_images(str(tree / "**" / "*.jpg"))] == ["c.jpg"]
        assert [p.name for p in list_images(str(tree / "*.png"))] == ["b.png"]  # glob is case-sensitive

    def test_list_of_sources_without_duplicates(self, tree):
        found = list_images([tree / "b.png", tree, str(tree / "*.png")])
        assert len(found) == 3

    def test_a_source_entry_or_recursive_of_the_wrong_type_is_refused_naming_it(self, tree):
        """A string for recursive was taken as True; an entry of no path type met pathlib's TypeError, which
        named neither the argument nor the entry."""
        with pytest.raises(TypeError, match=r"^recursive must be True or False, got str: 'no'$"):
            list_images(tree, recursive="no")
        with pytest.raises(TypeError, match=r"^image source\[1\] must be a path or a glob pattern, got int: 5$"):
            list_images([tree, 5])
        with pytest.raises(TypeError, match=r"^image source\[0\] must be a path or a glob pattern, got NoneType"):
            list_images([None])

    def test_missing_source_is_an_error(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="nope"):
            list_images(tmp_path / "nope")

    def test_linked_folders_are_followed_and_a_loop_ends(self, tree, tmp_path_factory):
        elsewhere = tmp_path_factory.mktemp("elsewhere")
        _write_png(elsewhere / "linked.png")
        try:
            os.symlink(elsewhere, tree / "val", target_is_directory=True)  # a dataset's part linked in
            os.symlink(tree, tree / "sub" / "up", target_is_directory=True)  # a link back up the tree
        except (OSError, NotImplementedError):
            pytest.skip("no symbolic links here")
        assert [p.relative_to(tree).as_posix() for p in list_images(tree)] == [
            "a with space.PNG",
            "b.png",
            "sub/deeper/c.jpg",
            "val/linked.png",
        ]
        # a glob's ** follows the loop lap after lap: each image is listed once, as by the folder source
        assert [p.relative_to(tree).as_posix() for p in list_images(str(tree / "**" / "*.*"))] == [
            "a with space.PNG",
            "b.png",
            "sub/deeper/c.jpg",
            "val/linked.png",
        ]
        # a ".." the pattern's folders hold on purpose is no loop
        again = str(tree / "sub" / ".." / "sub" / "**" / "*.jpg")
        assert list_images(again) == [tree / "sub" / ".." / "sub" / "deeper" / "c.jpg"]

    @pytest.mark.parametrize("source", ["", ["b.png", ""]])
    def test_an_empty_string_is_not_the_current_folder(self, tree, monkeypatch, source):
        monkeypatch.chdir(tree)
        with pytest.raises(ValueError, match="empty string"):
            list_images(source)

    def test_a_broken_link_is_listed_and_its_read_names_it(self, tmp_path):
        try:
            os.symlink(tmp_path / "storage" / "a.jpg", tmp_path / "a.jpg")  # storage not mounted
        except (OSError, NotImplementedError):
            pytest.skip("no symbolic links here")
        assert list_images(tmp_path) == [tmp_path / "a.jpg"]
        assert list_images(str(tmp_path / "*.jpg")) == [tmp_path / "a.jpg"]
        with pytest.raises(ImageReadError, match="a.jpg"):
            read_image(tmp_path / "a.jpg")

    def test_a_pipe_named_like_an_image_is_listed_and_its_read_says_what_it_is(self, tmp_path, named_pipe):
        """Left out, it would be missing from the run without a word; read, it would wait for a writer."""
        (tmp_path / "b.jpg").write_bytes(b"")
        pipe = named_pipe(tmp_path / "a.jpg")
        assert list_images(tmp_path) == [pipe, tmp_path / "b.jpg"]
        assert list_images(str(tmp_path / "*.jpg")) == [pipe, tmp_path / "b.jpg"]
        assert list_images(pipe) == [pipe]  # given by name: no "image source not found"
        with pytest.raises(ImageReadError, match=r"^cannot read image '.*a\.jpg': it is not a regular file \(a pipe\)$"):
            read_image(pipe)

    def test_a_folder_that_cannot_be_listed_is_a_warning(self, tree, monkeypatch, caplog):
        locked = tree / "sub" / "deeper"
        scandir = os.scandir

        def no_permission(path="."):  # as for a folder without read permission (root reads any)
            if os.fspath(path) == os.fspath(locked):
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return scandir(path)

        monkeypatch.setattr(os, "scandir", no_permission)
        with caplog.at_level("WARNING", logger="detens.sources"):
            assert [p.name for p in list_images(tree)] == ["a with space.PNG", "b.png"]
        assert f"cannot list the folder {locked} (Permission denied): its images are left out" in caplog.text

    def test_a_link_to_a_missing_folder_is_a_warning(self, tree, caplog):
        try:
            os.symlink(tree / "storage" / "val2017", tree / "val2017", target_is_directory=True)  # not mounted
        except (OSError, NotImplementedError):
            pytest.skip("no symbolic links here")
        with caplog.at_level("WARNING", logger="detens.sources"):
            assert len(list_images(tree)) == 3
        assert f"{tree / 'val2017'} links to {tree / 'storage' / 'val2017'}, which does not exist" in caplog.text

    def test_a_gif_is_listed(self, tmp_path):
        (tmp_path / "anim.gif").write_bytes(b"GIF89a")  # listing looks at names only
        assert list_images(tmp_path) == [tmp_path / "anim.gif"]

    def test_empty_folder_gives_empty_list(self, tmp_path):
        assert list_images(tmp_path) == []


class TestReadImage:
    def test_reads_bgr_uint8_with_spaces_and_unicode(self, tmp_path):
        path = _write_png(tmp_path / "ä b ç.png", shape=(5, 7, 3), value=9)
        image = read_image(path)
        assert image.shape == (5, 7, 3) and image.dtype == np.uint8 and int(image[0, 0, 0]) == 9

    def test_gray_and_alpha_become_bgr(self, tmp_path):
        assert read_image(_write_png(tmp_path / "g.png", shape=(4, 4))).shape == (4, 4, 3)
        assert read_image(_write_png(tmp_path / "a.png", shape=(4, 4, 4))).shape == (4, 4, 3)

    @pytest.mark.parametrize(
        "content, fragment",
        [
            (b"", "empty"),
            (b"\xff\xd8\xff\xe0 definitely not a jpeg", "could not decode"),
            (None, "cannot read"),
        ],
    )
    def test_unreadable_files_name_the_file(self, tmp_path, content, fragment):
        path = tmp_path / "broken file.jpg"
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(ImageReadError, match=fragment) as info:
            read_image(path)
        assert "broken file.jpg" in str(info.value)

    def test_a_device_is_not_read_to_its_end(self):
        """/dev/zero has no end: read whole, it took memory until a MemoryError."""
        if not os.path.exists("/dev/zero"):
            pytest.skip("no /dev/zero here")
        with pytest.raises(ImageReadError, match=r"^cannot read image '/dev/zero': it is not a regular file \(a character device\)$"):
            read_image("/dev/zero")

    @staticmethod
    def _tagged_jpeg(path, orientation: int, with_orientation_tag) -> np.ndarray:
        """Write a 100x40 JPEG with an EXIF orientation tag to ``path``; its pixels as OpenCV decodes them untagged."""
        stored = np.zeros((40, 100, 3), np.uint8)
        stored[:, :10] = 255  # a bright band on the left, to see a rotation
        ok, encoded = cv2.imencode(".jpg", stored)
        assert ok
        path.write_bytes(with_orientation_tag(encoded.tobytes(), orientation))
        return cv2.imdecode(encoded, cv2.IMREAD_COLOR)

    def test_exif_orientation_is_not_applied_with_a_warning(self, tmp_path, caplog, with_orientation_tag):
        """COCO annotations describe the stored pixels: a JPEG tagged "rotate 90°" reads as stored, and says so
        (a phone photo stored sideways was fused sideways without a word)."""
        tagged = tmp_path / "tagged.jpg"
        plain = self._tagged_jpeg(tagged, 6, with_orientation_tag)
        assert cv2.imdecode(np.fromfile(tagged, np.uint8), cv2.IMREAD_COLOR).shape == (100, 40, 3)  # the tag is read
        notes = ["kept"]
        with caplog.at_level("WARNING", logger="detens.sources"):
            image = read_image(tagged, notes=notes)
        assert image.shape == (40, 100, 3)
        np.testing.assert_array_equal(image, plain)
        warning = ("its EXIF orientation tag (6: viewers show it turned 90° clockwise) is not applied: it is read, "
                   "fused and drawn as stored, and its boxes are in the stored pixels (turn it upright first, e.g. "
                   "with PIL.ImageOps.exif_transpose, to detect it as it is seen)")
        assert caplog.messages == [f"{tagged}: {warning}"]
        assert notes == ["kept", warning]  # appended to, for a run's summary

    @pytest.mark.parametrize("orientation", [1, 0, 9])
    def test_an_upright_or_meaningless_orientation_tag_is_read_without_a_word(self, tmp_path, caplog, orientation,
                                                                              with_orientation_tag):
        tagged = tmp_path / "tagged.jpg"
        plain = self._tagged_jpeg(tagged, orientation, with_orientation_tag)
        notes: list[str] = []
        with caplog.at_level("WARNING", logger="detens.sources"):
            np.testing.assert_array_equal(read_image(tagged, notes=notes), plain)
        assert caplog.messages == [] and notes == []

    @pytest.mark.parametrize("kept", [40, 0.5, -13])
    def test_truncated_png_is_named_without_libpng_on_stderr(self, tmp_path, capfd, kept):
        """Cut anywhere before its IEND chunk (the last 12 bytes), a PNG is refused before libpng, which
        would print its own line to the process's stderr, reads it."""
        data = _write_png(tmp_path / "full.png", shape=(64, 64, 3)).read_bytes()
        cut = tmp_path / "cut.png"
        cut.write_bytes(data[: int(len(data) * kept) if isinstance(kept, float) else kept])
        capfd.readouterr()
        with pytest.raises(ImageReadError, match=r"cut\.png.*PNG file is truncated"):
            read_image(cut)
        assert capfd.readouterr().err == ""

    def test_a_png_with_a_damaged_critical_chunk_is_named_without_libpng_on_stderr(self, tmp_path, capfd):
        data = bytearray(_write_png(tmp_path / "full.png", shape=(64, 64, 3)).read_bytes())
        data[data.index(b"IDAT") + 8] ^= 0xFF  # a byte of the image data: its chunk's CRC no longer holds
        damaged = tmp_path / "damaged.png"
        damaged.write_bytes(bytes(data))
        capfd.readouterr()
        with pytest.raises(ImageReadError, match=r"damaged\.png.*corrupt.*IDAT"):
            read_image(damaged)
        assert capfd.readouterr().err == ""

    def test_a_png_with_a_damaged_ancillary_chunk_still_reads(self, tmp_path):
        """libpng reads past a bad text chunk (it is not part of the image), so the check leaves it to libpng."""
        data = _write_png(tmp_path / "full.png", shape=(6, 8, 3), value=7).read_bytes()
        after_header = 8 + 12 + int.from_bytes(data[8:12], "big")
        text = b"Comment\x00hello"
        bad_text_chunk = len(text).to_bytes(4, "big") + b"tEXt" + text + b"\x00\x00\x00\x00"
        path = tmp_path / "text.png"
        path.write_bytes(data[:after_header] + bad_text_chunk + data[after_header:])
        image = read_image(path)
        assert image.shape == (6, 8, 3) and int(image[0, 0, 0]) == 7

    def test_a_png_whose_iend_checksum_is_wrong_still_reads(self, tmp_path):
        """IEND carries no data, and libpng (through OpenCV) decodes the image before it reads its CRC."""
        path = _write_png(tmp_path / "end.png", shape=(6, 8, 3), value=7)
        path.write_bytes(path.read_bytes()[:-4] + b"\x00\x00\x00\x00")
        assert cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR) is not None
        assert read_image(path).shape == (6, 8, 3)

    def test_a_png_with_bytes_after_its_iend_chunk_still_reads(self, tmp_path):
        path = _write_png(tmp_path / "trailing.png", shape=(6, 8, 3), value=7)
        path.write_bytes(path.read_bytes() + b"\x00" * 100)
        assert read_image(path).shape == (6, 8, 3)


class TestAsBgr:
    def test_conversions(self):
        assert as_bgr(np.zeros((3, 4), np.uint8)).shape == (3, 4, 3)
        assert as_bgr(np.zeros((3, 4, 1), np.uint8)).shape == (3, 4, 3)
        assert as_bgr(np.zeros((3, 4, 4), np.uint8)).shape == (3, 4, 3)
        sixteen = as_bgr(np.full((2, 2, 3), 65535, np.uint16))
        assert sixteen.dtype == np.uint8 and int(sixteen.max()) == 255

    @pytest.mark.parametrize(
        "image, error, fragment",
        [
            ("x", TypeError, "numpy array"),
            (np.zeros((3, 4, 2), np.uint8), ValueError, r"\[H, W, 3\]"),
            (np.zeros((0, 4, 3), np.uint8), ValueError, "empty"),
            (np.zeros((3, 4, 3), np.float32), TypeError, "float"),
            # gray and BGRA are converted by OpenCV, which must not see what it cannot convert
            (np.zeros((3, 4), np.float64), TypeError, "float"),
            (np.zeros((3, 4, 4), np.int64), TypeError, "uint8"),
            (np.zeros((3, 4), bool), TypeError, "uint8"),
            (np.zeros((0, 4), np.uint8), ValueError, "empty"),
            (np.zeros((3, 0, 4), np.uint8), ValueError, "empty"),
        ],
    )
    def test_rejects(self, image, error, fragment):
        with pytest.raises(error, match=fragment):
            as_bgr(image)


def test_a_header_opencv_refuses_is_an_image_read_error(tmp_path):
    """A JPEG whose header claims 60000 x 60000 pixels: OpenCV raises its own error, not None."""
    ok, encoded = cv2.imencode(".jpg", np.full((8, 8, 3), 127, np.uint8))
    assert ok
    data = bytearray(encoded.tobytes())
    sof = data.index(b"\xff\xc0")  # baseline frame header: marker, length (2), precision (1), height, width
    data[sof + 5:sof + 9] = (60000).to_bytes(2, "big") * 2
    path = tmp_path / "huge.jpg"
    path.write_bytes(bytes(data))
    with pytest.raises(cv2.error):
        cv2.imdecode(np.frombuffer(bytes(data), np.uint8), cv2.IMREAD_COLOR)
    with pytest.raises(ImageReadError, match=r"huge\.jpg.*OpenCV refused to decode it.*OPENCV_IO_MAX_IMAGE_PIXELS"):
        read_image(path)


def test_an_image_not_of_its_annotated_size_is_refused_naming_both_sizes(tmp_path):
    path = tmp_path / "wide.png"
    cv2.imwrite(str(path), np.zeros((30, 50, 3), np.uint8))
    assert read_image(path, (30, 50)).shape == (30, 50, 3)
    assert read_image(path, [30, 50]).shape == (30, 50, 3)  # as a JSON row gives it
    for annotated, says in (((50, 30), "give it 30x50"), ((60, 100), "give it 100x60")):
        with pytest.raises(ImageSizeError) as refused:
            read_image(path, annotated)
        assert isinstance(refused.value, ImageReadError)  # skipped and reported as an unreadable image is
        assert f"image {str(path)!r} is 50x30 pixels (width x height) but its annotations {says}," in str(refused.value)


def test_a_video_given_as_an_image_is_named_a_video(tmp_path):
    path = tmp_path / "clip.MP4"
    path.write_bytes(b"\x00\x00\x00\x20ftypisom" + b"\x00" * 64)  # an MP4 header OpenCV's image decoders refuse
    with pytest.raises(ImageReadError) as refused:
        read_image(path)
    assert str(refused.value) == (
        f"cannot read image {str(path)!r}: it is a video, and detens fuses images (extract its frames first, "
        "e.g. ffmpeg -i clip.MP4 frames/%06d.jpg)"
    )


@pytest.mark.parametrize("suffix, kind", [(".tiff", "pages"), (".gif", "frames")])
def test_of_several_pages_or_frames_the_first_is_read_with_a_warning(tmp_path, caplog, suffix, kind):
    """They were read as their first page without a word: the others' objects were never looked at."""
    from PIL import Image

    first = Image.fromarray(np.full((8, 12, 3), 200, np.uint8))
    second = Image.fromarray(np.zeros((8, 12, 3), np.uint8))
    several, one = tmp_path / f"several{suffix}", tmp_path / f"one{suffix}"
    first.save(several, save_all=True, append_images=[second])
    first.save(one)
    with caplog.at_level("WARNING", logger="detens.sources"):
        image = read_image(several)
    assert image.shape == (8, 12, 3) and int(image.mean()) > 150  # the first page's pixels
    assert caplog.messages == [f"{several}: it holds 2 {kind}; only the first is read (split it into one file each "
                               "to use them all)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="detens.sources"):
        read_image(one)
    assert caplog.messages == []


def _scrambled_jpeg() -> bytes:
    """A JPEG whose entropy-coded data is scrambled in the middle: libjpeg decodes it, with a warning."""
    rng = np.random.default_rng(0)
    image = cv2.GaussianBlur(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8), (7, 7), 0)
    data = bytearray(cv2.imencode(".jpg", image)[1].tobytes())
    for i in range(len(data) // 2, len(data) // 2 + 200):
        data[i] = (data[i] * 7 + 3) % 256
    return bytes(data)


def test_a_jpeg_libjpeg_decodes_only_in_part_is_read_with_a_warning(tmp_path, caplog, capfd):
    """OpenCV returned such an image without a word; libjpeg's own line went to the process's stderr."""
    damaged, whole = tmp_path / "damaged.jpg", tmp_path / "whole.jpg"
    damaged.write_bytes(_scrambled_jpeg())
    cv2.imwrite(str(whole), np.full((16, 16, 3), 90, np.uint8))
    with caplog.at_level("WARNING", logger="detens.sources"):
        assert read_image(damaged).shape == (96, 128, 3)
    (message,) = caplog.messages
    assert message.startswith(f"{damaged}: Corrupt JPEG data") and message.endswith(
        " (libjpeg); read as decoded, parts of the image may be damaged")
    caplog.clear()
    with caplog.at_level("WARNING", logger="detens.sources"):
        assert read_image(whole).shape == (16, 16, 3)
    assert caplog.messages == []
    assert "Corrupt JPEG" not in capfd.readouterr().err  # caught, not printed as well


def test_a_pfm_file_of_float_pixels_is_refused_not_read_as_near_black(tmp_path):
    path = tmp_path / "image.pfm"
    cv2.imwrite(str(path), np.full((8, 12, 3), 0.5, np.float32))
    assert list_images(tmp_path) == [path]  # listed, so reported rather than left out without a word
    with pytest.raises(ImageReadError, match=r"image\.pfm'?: it is a PFM file of float pixels, whose range \(0\.\.1 or "
                                             r"0\.\.255\) the file does not give; convert it to PNG or JPEG$"):
        read_image(path)


def test_a_jfif_file_is_listed_and_read_as_the_jpeg_it_is(tmp_path):
    cv2.imwrite(str(tmp_path / "photo.jpg"), np.full((8, 12, 3), 90, np.uint8))
    (tmp_path / "photo.jpg").rename(tmp_path / "photo.jfif")
    assert list_images(tmp_path) == [tmp_path / "photo.jfif"]
    assert read_image(tmp_path / "photo.jfif").shape == (8, 12, 3)


def test_a_folder_named_tilde_written_from_the_working_directory_is_not_the_home_folder(tmp_path, monkeypatch):
    """``./~/a.png`` is an image in a folder named ``~`` (``Path`` drops the ``./``, and read so it was the home
    folder's); ``~/b.png`` is still the home folder's."""
    home, work = tmp_path / "home", tmp_path / "work"
    _write_png(work / "~" / "a.png")
    _write_png(home / "b.png")
    _write_png(home / "a.png")  # what the home folder has under the name: never listed for ./~/
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    for source in ("./~", "./~/a.png", "./~/*.png", ["./~/a.png", "./~"]):
        assert [p.absolute() for p in list_images(source)] == [work / "~" / "a.png"], source
    assert [p.absolute() for p in list_images("~")] == [home / "a.png", home / "b.png"]
    assert [p.absolute() for p in list_images("~/b.png")] == [home / "b.png"]
