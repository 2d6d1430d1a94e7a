"""Image sources: list the images of a file, folder or glob, and read them with OpenCV.

Images are BGR ``uint8`` arrays ``[H, W, 3]`` (OpenCV's layout), which is what every detens detector
takes. An unreadable or corrupt file raises :class:`ImageReadError` naming the file, so that a caller
processing a folder can report it and go on.
"""

from __future__ import annotations

import glob
import io
import logging
import os
import sys
import tempfile
import warnings
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import cv2
import numpy as np

from detens.checks import check_flag
from detens.io import home_expanded, path_as_written, special_file_kind

__all__ = ["IMAGE_EXTENSIONS", "ImageReadError", "ImageSizeError", "list_images", "read_image", "as_bgr", "is_image_file"]

logger = logging.getLogger(__name__)

#: File extensions (lower case, with the dot) that OpenCV's ``imread`` decodes. GIF needs OpenCV 4.11 or
#: later; an older one reports a GIF as unreadable, which beats leaving it out of a folder without a word.
IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {
        ".gif",
        ".bmp",
        ".dib",
        ".jpg",
        ".jpeg",
        ".jpe",
        ".jfif",
        ".jp2",
        ".png",
        ".webp",
        ".avif",
        ".pbm",
        ".pgm",
        ".ppm",
        ".pxm",
        ".pnm",
        ".pfm",
        ".sr",
        ".ras",
        ".tif",
        ".tiff",
        ".exr",
        ".hdr",
        ".pic",
    }
)

_GLOB_CHARS = frozenset("*?[")
# a file given by name that is one of these is told apart from a corrupt image
_VIDEO_EXTENSIONS = frozenset({".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv"})
#: Image formats that hold several pages or frames, of which OpenCV decodes the first, and what they hold.
_MULTI_FRAME_KINDS = {".tif": "pages", ".tiff": "pages", ".gif": "frames"}


class ImageReadError(OSError):
    """An image file that is missing, unreadable or not decodable; the message names the file."""


class ImageSizeError(ImageReadError):
    """An image whose stored pixels are not the size its annotations give it (a resized copy, or a photo
    that the annotation tool turned upright by its EXIF tag): boxes found on it would not be in the
    annotations' coordinates. Skipped and reported as an unreadable image is."""


def is_image_file(path: str | Path) -> bool:
    """Whether ``path`` has an extension OpenCV reads (the file itself is not opened)."""
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def _is_glob(pattern: str) -> bool:
    return any(c in _GLOB_CHARS for c in pattern)


def _is_file_or_broken_link(path: Path) -> bool:
    """A file, or a link to nothing: listed, so that reading it reports the missing target (a folder of
    links into storage that is not mounted would otherwise give no images, and a run over none). A file
    includes a pipe or a device named like an image: listed, reading it reports it as no regular file,
    where leaving it out would lose it without a word."""
    return path.is_file() or special_file_kind(path) is not None or (path.is_symlink() and not path.exists())


def _folder_images(root: Path, recursive: bool) -> Iterator[Path]:
    """The image files in ``root`` (and below it when ``recursive``), hidden files and folders skipped.

    Linked folders are followed, as a glob's ``**`` follows them: a dataset folder often links its parts
    in (``data/val2017 -> /datasets/coco/val2017``), and skipping them would lose those images silently.
    A link back to a folder above it is not followed, or the walk would never end. A folder that cannot be
    listed (no permission), and a link to nothing that is not named like an image (maybe a linked folder on
    storage that is not mounted), are logged as warnings: their images would otherwise be missing without
    a word.
    """

    def unlisted(err: OSError) -> None:
        logger.warning("cannot list the folder %s (%s): its images are left out", err.filename, err.strerror or err)

    above = {os.fspath(root): frozenset({os.path.realpath(root)})}  # each folder → the real folders down to it
    for folder, dirs, files in os.walk(root, onerror=unlisted, followlinks=True):
        chain = above.pop(folder)
        kept = []
        for name in dirs if recursive else []:
            real = os.path.realpath(os.path.join(folder, name))
            if name.startswith(".") or real in chain:
                continue
            above[os.path.join(folder, name)] = chain | {real}
            kept.append(name)
        dirs[:] = kept
        for name in files:
            candidate = Path(folder, name)
            if name.startswith("."):
                continue
            if is_image_file(candidate) and _is_file_or_broken_link(candidate):
                yield candidate
            elif recursive and candidate.is_symlink() and not candidate.exists():
                logger.warning("%s links to %s, which does not exist: left out", candidate, os.readlink(candidate))


def _through_a_loop(path: Path, fixed: int, real_folders: dict[str, str]) -> bool:
    """Whether ``path``, matched by a glob, passes twice through one real folder below the pattern's first
    ``fixed`` parts (those without wildcards, which may hold ``..`` on purpose): ``**`` follows a link back to
    a folder above it (``a/up -> ..``) until the path is too long, matching each image below it once per
    lap, where a folder source lists them once. ``real_folders`` caches each folder's real path."""
    seen = set()
    for folder in [f for f in reversed(path.parents) if len(f.parts) >= fixed]:
        key = os.fspath(folder)
        real = real_folders.get(key)
        if real is None:
            real = real_folders[key] = os.path.realpath(key)
        if real in seen:
            return True
        seen.add(real)
    return False


def list_images(source: str | Path | Iterable[str | Path], recursive: bool = True) -> list[Path]:
    """The image files of ``source``, sorted.

    Args:
        source: an image file (kept whatever its extension, so a bad file is reported when read; a pipe or a
            device too, reported as no regular file), a folder
            (searched recursively for files with an :data:`IMAGE_EXTENSIONS` extension, linked folders
            followed; hidden files and folders are skipped), a glob pattern (``"data/**/*.jpg"``), or a list of these.
        recursive (bool): search folders recursively and let ``**`` in a glob match any depth.

    Returns:
        list[Path]: sorted, without duplicates. An empty folder gives an empty list.

    Raises:
        FileNotFoundError: ``source`` is neither an existing file, a folder nor a glob.
        ValueError: ``source`` is an empty string.
        TypeError: ``source`` or an entry of its list is none of these (None, a number), or ``recursive`` is
            no bool.
    """
    recursive = check_flag(recursive, "recursive")
    if isinstance(source, (str, Path)):
        sources = [source]
    elif isinstance(source, Iterable) and not isinstance(source, bytes):
        sources = list(source)
    else:
        raise TypeError(
            f"image source must be a path, a glob pattern or a list of them, got {type(source).__name__}: {source!r}"
        )
    found: set[Path] = set()
    for i, item in enumerate(sources):
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(
                f"image source[{i}] must be a path or a glob pattern, got {type(item).__name__}: {item!r}"
            )
        if isinstance(item, str) and not item:
            # Path("") is the current folder: an unset variable in `--source "$IMAGES"` would run on it
            raise ValueError("image source is an empty string; give a file, a folder or a glob pattern")
        path = path_as_written(item)
        if path.is_file() or special_file_kind(path) is not None:  # reading a pipe or a device reports it
            found.add(path)
        elif path.is_dir():
            found.update(_folder_images(path, recursive))
        elif _is_glob(str(item)):
            pattern = home_expanded(item)
            fixed = next((n for n, part in enumerate(Path(pattern).parts) if _is_glob(part)), 0)
            real_folders: dict[str, str] = {}
            for match in glob.glob(pattern, recursive=recursive):
                candidate = Path(match)
                if (
                    is_image_file(candidate)
                    and _is_file_or_broken_link(candidate)
                    and not _through_a_loop(candidate, fixed, real_folders)
                ):
                    found.add(candidate)
        else:
            raise FileNotFoundError(
                f"image source not found: {str(item)!r} is not a file, a folder or a glob pattern"
            )
    return sorted(found)


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_damage(data: bytes) -> str | None:
    """Why the PNG file ``data`` cannot be whole, read from its chunks (None: not a PNG, or its chunks are
    whole up to IEND, the last one of every PNG, and the CRC of each critical chunk before it holds).

    libpng refuses the same files, and prints its own line on the process's stderr when it does; ancillary
    chunks and IEND's CRC are left to it, as it reads an image past a bad one.
    """
    if not data.startswith(_PNG_SIGNATURE):
        return None
    view = memoryview(data)
    position = len(_PNG_SIGNATURE)
    while position + 12 <= len(data):  # length (4), type (4), data, CRC (4)
        length = int.from_bytes(view[position:position + 4], "big")
        kind = bytes(view[position + 4:position + 8])
        end = position + 12 + length
        if end > len(data):
            return f"truncated (it ends inside its {kind.decode('latin-1')} chunk)"
        if kind == b"IEND":  # its CRC is not checked: libpng reads an image past a bad one
            return None
        if kind[:1].isupper() and zlib.crc32(view[position + 4:end - 4]) != int.from_bytes(view[end - 4:end], "big"):
            return f"corrupt (the checksum of its {kind.decode('latin-1')} chunk does not match its bytes)"
        position = end
    return "truncated (it ends before its IEND chunk, which ends every PNG)"


#: How a viewer shows an image of each EXIF orientation other than 1 (as stored).
_EXIF_ORIENTATIONS = {
    2: "mirrored left to right",
    3: "turned 180°",
    4: "mirrored top to bottom",
    5: "mirrored across its main diagonal",
    6: "turned 90° clockwise",
    7: "mirrored across its other diagonal",
    8: "turned 90° counter-clockwise",
}


def _header_facts(data: bytes, frames: bool) -> tuple[int, int | None]:
    """The pages or frames (counted only where ``frames``, else 1) and the EXIF orientation tag (None:
    none) of the image file ``data``, as Pillow reads them from its header; (1, None) where Pillow
    cannot tell."""
    try:
        from PIL import Image
    except ImportError:  # Pillow comes with ultralytics and matplotlib: absent, nothing is said
        return 1, None
    try:
        with warnings.catch_warnings():
            # OpenCV decoded it already: Pillow's alarm at its pixel count would only repeat OpenCV's limit
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                orientation = image.getexif().get(0x0112)
                count = int(getattr(image, "n_frames", 1)) if frames else 1
    except Exception:  # a file OpenCV decoded but Pillow refuses (or its EXIF): nothing to say of it
        return 1, None
    return count, orientation if isinstance(orientation, int) else None


_JPEG_SIGNATURE = b"\xff\xd8\xff"
#: How libjpeg begins the warnings it prints for data it could only partly decode.
_JPEG_DAMAGE = ("Corrupt JPEG data", "Premature end of JPEG file")


def _decode(data: np.ndarray, jpeg: bool) -> tuple[np.ndarray | None, str | None]:
    """``cv2.imdecode`` of the file's bytes, as stored (no EXIF rotation), and for a JPEG libjpeg's first
    warning of damaged data (None: none).

    libjpeg prints those warnings on the process's stderr and decodes what it can; OpenCV returns the
    image without a word. The stderr file descriptor is therefore pointed at a temporary file during the
    decode (detens reads images on one thread), and what else was written there is written back.
    """
    flags = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION  # OpenCV turns images upright unless told not to
    if not jpeg:
        return cv2.imdecode(data, flags), None
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                image = cv2.imdecode(data, flags)
            finally:
                os.dup2(saved, 2)
            captured.seek(0)
            text = captured.read().decode("utf-8", errors="replace")
    finally:
        os.close(saved)
    lines = text.splitlines()
    damage = next((line.strip() for line in lines if line.startswith(_JPEG_DAMAGE)), None)
    others = [line for line in lines if not line.startswith(_JPEG_DAMAGE)]
    if others:
        sys.stderr.write("\n".join(others) + "\n")
    return image, damage


def read_image(
    path: str | Path, expected_size: tuple[int, int] | None = None, notes: list[str] | None = None
) -> np.ndarray:
    """Read an image as BGR ``uint8`` ``[H, W, 3]``.

    Grayscale and 16-bit images are converted; the alpha channel is dropped. Unlike ``cv2.imread`` this
    reads paths with any characters (it decodes the bytes), and never returns ``None``. Of a TIFF of
    several pages or an animated GIF, the first page or frame is read, with a warning.

    The pixels are those stored in the file: an EXIF orientation tag is not applied, with a warning. COCO
    annotations, and the ``width``/``height`` of their images, describe the stored pixels, so boxes found
    on an image that OpenCV had turned upright would land elsewhere than its ground truth (and off its
    recorded size).

    Args:
        path (str | Path): the image file.
        expected_size (tuple[int, int] | None): ``(height, width)`` its annotations give it, checked
            against the stored pixels; None: not checked.
        notes (list[str] | None): the warnings logged of the file (one only partly decoded, of several
            pages, with an orientation tag not applied) are appended here too, for a run's summary.

    Raises:
        ImageReadError: the file is missing, unreadable, not a regular file (a pipe, a device), empty, a
            truncated or corrupt PNG (told apart before libpng, which would print its own line on stderr), or
            not a decodable image.
        ImageSizeError: its pixels are not ``expected_size``.
    """
    path = Path(path)
    special = special_file_kind(path)
    if special is not None:  # reading would wait for a writer (a pipe) or never end (/dev/zero)
        raise ImageReadError(f"cannot read image {str(path)!r}: it is not a regular file ({special})")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ImageReadError(f"cannot read image {str(path)!r}: {err.strerror or err}") from err
    if not raw:
        raise ImageReadError(f"cannot read image {str(path)!r}: the file is empty")
    damage = _png_damage(raw)
    if damage is not None:
        raise ImageReadError(f"cannot read image {str(path)!r}: the PNG file is {damage}")
    if raw[:2] in (b"PF", b"Pf") and raw[2:3].isspace():
        # OpenCV casts its floats to bytes: an image of 0..1 became one of 0 and 1, fused as near black
        raise ImageReadError(
            f"cannot read image {str(path)!r}: it is a PFM file of float pixels, whose range (0..1 or 0..255) "
            "the file does not give; convert it to PNG or JPEG"
        )
    data = np.frombuffer(raw, dtype=np.uint8)
    try:
        image, jpeg_damage = _decode(data, raw.startswith(_JPEG_SIGNATURE))
    except cv2.error as err:  # a header OpenCV refuses, e.g. more pixels than its limit allows
        reason = (err.err or str(err)).strip().splitlines()[0]
        limit = " (OpenCV's limit on pixels is the OPENCV_IO_MAX_IMAGE_PIXELS variable)" if "PIXELS" in reason else ""
        raise ImageReadError(f"cannot read image {str(path)!r}: OpenCV refused to decode it: {reason}{limit}") from None
    if image is None or image.size == 0:
        if path.suffix.lower() in _VIDEO_EXTENSIONS:
            raise ImageReadError(
                f"cannot read image {str(path)!r}: it is a video, and detens fuses images (extract its frames "
                f"first, e.g. ffmpeg -i {path.name} frames/%06d.jpg)"
            )
        raise ImageReadError(
            f"cannot read image {str(path)!r}: OpenCV could not decode it (corrupt, truncated or not an image)"
        )
    warnings_of_file = []
    if jpeg_damage is not None:
        # read all the same: some encoders leave such bytes in files whose pixels are whole
        warnings_of_file.append(f"{jpeg_damage} (libjpeg); read as decoded, parts of the image may be damaged")
    kind = _MULTI_FRAME_KINDS.get(path.suffix.lower())
    frames, orientation = _header_facts(raw, frames=kind is not None)
    if frames > 1:
        warnings_of_file.append(
            f"it holds {frames} {kind}; only the first is read (split it into one file each to use them all)"
        )
    if orientation in _EXIF_ORIENTATIONS:
        warnings_of_file.append(
            f"its EXIF orientation tag ({orientation}: viewers show it {_EXIF_ORIENTATIONS[orientation]}) is not "
            "applied: it is read, fused and drawn as stored, and its boxes are in the stored pixels (turn it "
            "upright first, e.g. with PIL.ImageOps.exif_transpose, to detect it as it is seen)"
        )
    for text in warnings_of_file:
        logger.warning("%s: %s", path, text)
    if notes is not None:
        notes.extend(warnings_of_file)
    if expected_size is not None and tuple(image.shape[:2]) != tuple(expected_size):
        (height, width), (expected_height, expected_width) = image.shape[:2], expected_size
        raise ImageSizeError(
            f"image {str(path)!r} is {width}x{height} pixels (width x height) but its annotations give it "
            f"{expected_width}x{expected_height}, so boxes found on it would not be in their coordinates (a "
            "resized copy, or a photo turned upright by its EXIF tag when it was annotated?)"
        )
    return image


def as_bgr(image: np.ndarray, where: str = "image") -> np.ndarray:
    """Check a numpy image and bring it to BGR ``uint8`` ``[H, W, 3]`` (gray and BGRA are converted).

    Raises:
        TypeError, ValueError: not a numpy array, or a shape/dtype that is not an image.
    """
    if not isinstance(image, np.ndarray):
        raise TypeError(
            f"{where} must be a numpy array (BGR, as cv2.imread gives) or a path, got {type(image).__name__}"
        )
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    if image.ndim != 2 and (image.ndim != 3 or image.shape[2] not in (3, 4)):
        raise ValueError(f"{where} must have shape [H, W, 3] (BGR), got {list(image.shape)}")
    # checked before cv2.cvtColor, which raises its own cryptic error for an empty array or another dtype
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"{where} is empty: shape {list(image.shape)}")
    if np.issubdtype(image.dtype, np.floating):
        raise TypeError(
            f"{where} has dtype {image.dtype}; pass uint8 BGR in 0..255 (float images are ambiguous: 0..1 or 0..255)"
        )
    if image.dtype not in (np.uint8, np.uint16):
        raise TypeError(f"{where} must be uint8 BGR, got dtype {image.dtype}")
    if image.ndim == 2:
        image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    elif image.shape[2] == 4:
        image = cv2.cvtColor(image, cv2.COLOR_BGRA2BGR)
    if image.dtype == np.uint16:
        image = (image // 257).astype(np.uint8)
    return image
