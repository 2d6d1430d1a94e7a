"""File I/O: atomic writes (a killed run never leaves a half-written output), checked JSON reads, and
unique output names for input files.

An atomic write goes through a hidden temporary file beside its target,
``.<name>.<random>.<host>-<pid>.tmp``, that names its writer: ``<host>`` (8 hex digits) stands for the
host and its pid namespace, ``<pid>`` for the writing process. A process killed mid-write (``kill -9``,
a crash of the machine) leaves that file behind; :func:`output_lock` removes the ones in a command's
output folder whose writer is known to be gone (see :func:`remove_stale_temporaries`). Files written as
one set (:func:`files_written_together`) go through a hidden temporary folder named the same way.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

__all__ = [
    "atomic_writer", "atomic_write_bytes", "atomic_write_text", "atomic_write_json", "atomic_json_list", "json_list_items", "check_writable_file", "check_writable_folder", "check_replaceable",
    "read_json_file", "parse_json", "output_stems", "output_lock", "LOCK_NAME", "remove_stale_temporaries", "lock_descriptor",
    "lock_holder_text", "run_folder", "names_a_folder", "check_file_path", "files_written_together", "HeldLock",
    "NAME_MAX_BYTES", "check_name_length", "name_bytes", "name_within_limit", "special_file_kind",
    "check_not_special_file", "home_expanded", "path_as_written",
]

logger = logging.getLogger("detens.io")

#: The lock file a command holds in its output folder while it writes there (see :func:`output_lock`).
LOCK_NAME = ".detens.lock"

_UMASK = os.umask(0)
os.umask(_UMASK)

# mkstemp's random part is 8 of these characters (never "-", which the writer's tag has)
_TEMPORARY = re.compile(r"^\..+\.[a-z0-9_]{8}\.(?P<host>[0-9a-f]{8})-(?P<pid>[1-9][0-9]*)\.tmp$", re.DOTALL)
# written before writers were named: only those of the files the commands write (JSON, YAML, labels,
# drawings), since nothing else in the name tells them from a user's own hidden file
_TEMPORARY_UNNAMED = re.compile(r"^\..+\.(?:json|yaml|txt|jpg)\.[a-z0-9_]{8}\.tmp$", re.DOTALL)
#: A temporary file untouched this long is left over whoever wrote it: a write takes seconds.
STALE_TEMPORARY_S = 24 * 3600
#: The longest name of one file or folder, in bytes (UTF-8), that file systems take: ext4, XFS, Btrfs and APFS
#: refuse a longer one, and a name within it has at most the 255 UTF-16 units that NTFS takes.
NAME_MAX_BYTES = 255


def name_bytes(name: str) -> int:
    """The length of the file name ``name`` as the file system stores it (UTF-8: a CJK character is 3 bytes)."""
    return len(os.fsencode(name))


def name_within_limit(name: str, suffix: str = "", prefix: str = "") -> str:
    """``prefix + name + suffix``, or, where that is longer than :data:`NAME_MAX_BYTES`, ``prefix``, the start of
    ``name``, ``~`` and 12 hex digits of a digest of ``name``, then ``suffix``, at most that long: a name the
    file system takes, always the same for ``name``, and another for another ``name``."""
    whole = f"{prefix}{name}{suffix}"
    if name_bytes(whole) <= NAME_MAX_BYTES:
        return whole
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
    room = NAME_MAX_BYTES - name_bytes(f"{prefix}~{digest}{suffix}")
    return f"{prefix}{_start_within(name, room)}~{digest}{suffix}"


def _start_within(text: str, size: int) -> str:
    """The longest start of ``text`` that is at most ``size`` bytes as a file name, cut between characters."""
    used = 0
    for at, character in enumerate(text):
        used += name_bytes(character)
        if used > size:
            return text[:at]
    return text


def home_expanded(value: str | os.PathLike[str]) -> str:
    """The path ``value`` with a leading ``~`` (or ``~user``) read as the home folder (``os.path.expanduser``):
    every path detens takes is read so, whatever wrote it. A shell expands ``~`` only at the start of an
    unquoted word, so ``--out=~/runs``, a quoted ``'~/runs'`` and a Python call's ``out="~/runs"`` reach
    detens as written, and taken as they are they would create a folder named ``~`` in the working directory.

    Only the text's first character counts: ``./~/h.json`` is the file in a folder named ``~`` in the working
    directory, which ``Path(value).expanduser()`` would read from the home folder (``Path`` drops the ``./``).
    A ``Path`` given has lost its ``./`` already (``Path("./~/h.json")`` is ``Path("~/h.json")``), so a leading
    ``~`` in it is the home folder too."""
    return os.path.expanduser(os.fspath(value))


def path_as_written(value: str | os.PathLike[str]) -> Path:
    """The path ``value`` (a leading ``~`` read as :func:`home_expanded` reads it) as a ``Path`` that names the
    same file wherever it is shown or given again. ``Path`` drops the ``./`` of ``./~/runs``, a folder named
    ``~`` in the working directory, and ``~/runs`` read again is the home folder's: such a path is made
    absolute. Every other path is kept as written."""
    path = Path(home_expanded(value))
    return path.absolute() if path.parts and path.parts[0].startswith("~") else path


def names_a_folder(value: str | os.PathLike[str]) -> bool:
    """Whether the path ``value``, as written, ends in a separator (``runs/``), which says it is a folder.
    ``Path`` and argparse's ``type=Path`` drop it (``Path("runs/")`` is ``runs``), so it is read from the text."""
    return isinstance(value, str) and value.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep))


def check_file_path(path: str | os.PathLike[str], what: str | None = "path") -> Path:
    """``path`` of a file to write, as a ``Path``: not one written as a folder (``"runs/"``), which ``Path``
    would turn into the file ``runs``.

    Raises:
        ValueError: naming ``what`` (None: a caller that names the option itself) and the path as given.
    """
    if names_a_folder(path):
        named = f"{what}: " if what is not None else ""
        raise ValueError(f"{named}expected a file path, got {path!r}: a path ending in {str(path)[-1]} names a folder")
    return Path(path)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and an atomic rename
    (:func:`atomic_writer`).

    Raises:
        IsADirectoryError: ``path`` is a folder (named in the message, not the temporary file).
        ValueError: ``path`` is written as a folder (``"runs/"``, see :func:`check_file_path`).
    """
    with atomic_writer(path) as file:
        file.write(data)


@contextlib.contextmanager
def atomic_writer(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file whose bytes become ``path`` when the block ends without an error, through a temporary
    file in the same folder and an atomic rename: ``path`` is never seen written in part, and an error or
    a Ctrl-C in the block leaves it as it was.

    Raises:
        IsADirectoryError: ``path`` is a folder (named in the message, not the temporary file).
        ValueError: ``path`` is written as a folder (``"runs/"``, see :func:`check_file_path`).
    """
    path = check_file_path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder; give the path of a file to write", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(**_temporary_name(path), dir=path.parent)
    except OSError as err:  # a folder this process may not write in: said of the file, not of its temporary
        raise _said_of(err, path) from err
    try:
        with os.fdopen(fd, "wb") as f:  # first, so that the descriptor is closed whatever fails next
            os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the file the usual permissions
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        # a full disk names no file, a refused rename the temporary one: say which file was not written
        if err.errno is not None and err.filename in (None, tmp):
            raise _said_of(err, path) from err
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _said_of(err: OSError, path: Path, doing: str = "writing") -> OSError:
    """``err`` (of its type and errno) said of ``path``: ``[Errno 28] No space left on device, writing: 'path'``."""
    return type(err)(err.errno, f"{err.strerror}, {doing}", str(path))


def _temporary_name(path: Path) -> dict[str, str]:
    """The ``prefix`` and ``suffix`` of a temporary file or folder for ``path`` (see the module)."""
    # the temporary name holds only the start of the file's: the whole, plus the random part, the writer's
    # tag and ".tmp", would pass the file system's limit on a name (255 bytes) for a name that itself fits
    hint = _start_within(path.name, 64)
    return {"prefix": f".{hint}.", "suffix": f".{_host_tag()}-{os.getpid()}.tmp"}


@functools.cache
def _host_tag() -> str:
    """8 hex digits for the processes that ``os.kill`` can see from this one: the host (its name and, where
    it has one, its machine id) and the pid namespace (containers on one host can share its name)."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/etc/machine-id").read_text(encoding="utf-8").strip())
    with contextlib.suppress(OSError, AttributeError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return hashlib.blake2s("\0".join(parts).encode("utf-8", "backslashreplace"), digest_size=4).hexdigest()


def _writer_is_gone(name: str) -> bool:
    """Whether the temporary file ``name`` was written by a process of this host that no longer runs."""
    match = _TEMPORARY.match(name)
    if match is None or match["host"] != _host_tag() or os.name != "posix":  # Windows' kill would kill
        return False
    try:
        os.kill(int(match["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # PermissionError: it runs, as another user
        return False
    return False  # it runs (or its pid was given to another process since: then the age rule applies)


def _is_stale_temporary(entry: os.DirEntry[str], now: float) -> bool:
    if entry.is_dir(follow_symlinks=False):  # a set of files (files_written_together) not yet in place
        if not _TEMPORARY.match(entry.name):
            return False
    elif not (_TEMPORARY.match(entry.name) or _TEMPORARY_UNNAMED.match(entry.name)):
        return False
    elif not entry.is_file(follow_symlinks=False):
        return False
    return _writer_is_gone(entry.name) or now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMPORARY_S


def remove_stale_temporaries(folder: str | Path, subfolders: Iterable[str] = ()) -> int:
    """Remove the temporary files of atomic writes that were cut short (their process killed), and the
    temporary folders of sets of files (:func:`files_written_together`), from ``folder`` and, searched
    through, its ``subfolders`` (names relative to it; one that does not exist or is no folder is passed
    over); returns how many.

    Safe while other processes write there, on this host or others (the shards of one ``detens cache``
    split): a temporary file goes when its writer, a process of this host, no longer runs, or when nothing
    touched it for a day (:data:`STALE_TEMPORARY_S`; a write takes seconds). The age is the only rule for
    a writer of another host, which cannot be asked, and for the files of versions that did not name
    their writer; it also clears a file whose writer's pid was given to another process since. What
    cannot be read or removed is left as it is: the run does not depend on it.
    """
    folder = Path(folder)
    now = time.time()
    removed = Counter()  # "file" / "folder" (a set of files) -> how many

    def visit(directory: Path, recursive: bool) -> None:
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError:  # gone, not a folder, unreadable
            return
        for entry in entries:
            with contextlib.suppress(OSError):  # FileNotFoundError: another run removed it first
                if _is_stale_temporary(entry, now):
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                        removed["folder"] += 1
                    else:
                        os.unlink(entry.path)
                        removed["file"] += 1
                elif recursive and entry.is_dir(follow_symlinks=False):
                    visit(Path(entry.path), True)

    visit(folder, False)
    for name in subfolders:
        visit(folder / name, True)
    if removed:
        counted = " and ".join(f"{n} temporary {kind}{'' if n == 1 else 's'}"
                               for kind, n in sorted(removed.items()))
        logger.info("removed %s in %s left by writes that were cut short (a killed run)", counted, folder)
    return removed.total()


@contextlib.contextmanager
def files_written_together(folder: str | Path) -> Iterator[Callable[[str], Path]]:
    """Write a set of files into ``folder`` as one: the block gets ``staged(name)``, the path where it writes
    the file ``name``, in a temporary folder beside them. When the block ends, each staged file replaces
    ``folder``'s file of its name, in the order their paths were asked for, and a name asked for but not
    written removes ``folder``'s file of that name (the set has none of it). If the block raises (a full
    disk), ``folder`` is left as it was.

    Only renames follow the writes: a failing write cannot leave files of two sets together, and a rename
    that fails (a permission changed meanwhile) puts back the files already replaced before the error
    goes on (each earlier file is kept as a hard link until the set is in place; one that cannot be
    linked stays replaced). Only a kill between two renames leaves files of both sets. The temporary
    folder is named as a temporary file (see the module), so that a set cut short by a kill is removed
    by a later call on ``folder`` (:func:`remove_stale_temporaries`), as this call does first.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(folder)
    try:
        stage = Path(tempfile.mkdtemp(**_temporary_name(folder / "files"), dir=folder))
    except OSError as err:  # said of the folder written in, not of the temporary one
        raise _said_of(err, folder, "writing in") from err
    names: list[str] = []

    def staged(name: str) -> Path:
        if Path(name).name != name:
            raise ValueError(f"a file of the set is named without folders, got {name!r}")
        names.append(name)
        return stage / name

    try:
        try:
            yield staged
            _move_into_place(stage, folder, list(dict.fromkeys(names)))
        except OSError as err:  # name the file of the set, not its staged copy (a refused rename's too)
            if err.filename is None or Path(err.filename).parent != stage or err.errno is None:
                raise
            raise type(err)(err.errno, err.strerror, str(folder / Path(err.filename).name)) from err
        except (ValueError, TypeError) as err:  # a refused file ("a broken head"), named the same way
            if len(err.args) == 1 and isinstance(err.args[0], str):
                err.args = (err.args[0].replace(str(stage), str(folder)),)
            raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _move_into_place(stage: Path, folder: Path, names: Sequence[str]) -> None:
    """Replace ``folder``'s file of each of ``names`` by ``stage``'s, in order (remove it where ``stage`` has
    none); if a rename fails, undo the ones before it and raise."""
    earlier = Path(tempfile.mkdtemp(dir=stage))  # a name no staged file has
    undo: list[tuple[str, bool | None]] = []  # (name, whether its earlier file is kept; None: there was none)
    try:
        for name in names:
            target = folder / name
            try:
                os.link(target, earlier / name, follow_symlinks=False)
                kept: bool | None = True
            except FileNotFoundError:
                kept = None
            except OSError:  # a folder, or a file system without hard links: replaced for good
                kept = False
            if (stage / name).exists():
                os.replace(stage / name, target)
            else:
                target.unlink(missing_ok=True)
            undo.append((name, kept))
    except OSError:
        for name, kept in reversed(undo):
            with contextlib.suppress(OSError):
                if kept:
                    os.replace(earlier / name, folder / name)
                elif kept is None:
                    (folder / name).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = None) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent))


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def json_list_items(text: str) -> Iterator[tuple[Any, int, int]]:
    """Each item of the JSON list ``text``, one at a time, with the span ``text[start:end]`` it was read from:
    a run's results (a box each) are read without holding them all as objects, and an item's text can be
    read again later from its span.

    Yields:
        tuple[Any, int, int]: ``(item, start, end)``.

    Raises:
        ValueError: ``text`` is not one JSON list (``json.JSONDecodeError`` where an item does not parse), as
            ``json.loads`` refuses it, or an item nests arrays or objects too deeply to be read; raised when the
            reading reaches the fault.
    """
    decoder = json.JSONDecoder()
    at = _JSON_SPACE.match(text).end()
    if not text.startswith("[", at):
        raise ValueError(f"expected a JSON list, found {text[at:at + 20]!r} at character {at}")
    at = _JSON_SPACE.match(text, at + 1).end()
    if not text.startswith("]", at):
        while True:
            try:
                item, end = decoder.raw_decode(text, at)
            except RecursionError:
                raise ValueError(f"the item at character {at} nests arrays or objects too deeply to be read") from None
            yield item, at, end
            at = _JSON_SPACE.match(text, end).end()
            if text.startswith(",", at):
                at = _JSON_SPACE.match(text, at + 1).end()
            elif text.startswith("]", at):
                break
            else:
                raise ValueError(f"expected ',' or ']' in a JSON list at character {at}")
    if _JSON_SPACE.match(text, at + 1).end() != len(text):
        raise ValueError(f"extra data after a JSON list at character {at + 1}")


@contextlib.contextmanager
def atomic_json_list(path: str | Path) -> Iterator[Callable[[Sequence[Any]], None]]:
    """``extend(items)``, called any number of times, writes a JSON list to ``path`` a part at a time: the
    same bytes as :func:`atomic_write_json` of the whole list, which a run's results (a box each) may be too
    many to hold in memory at once. Written as :func:`atomic_writer` writes: whole, when the block ends."""
    with atomic_writer(path) as file:
        opened = False

        def extend(items: Sequence[Any]) -> None:
            nonlocal opened
            if not items:
                return
            text = json.dumps(list(items))  # one call per part: json.dumps per item is several times slower
            file.write((", " if opened else "[").encode("utf-8") + text[1:-1].encode("utf-8"))
            opened = True

        yield extend
        file.write(b"]" if opened else b"[]")


class HeldLock:
    """The lock :func:`output_lock` holds, at ``path``: ``fd`` is its descriptor, None where nothing is held
    (no locks on the platform or the file system, or an output folder that is a file)."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path, self.fd = path, fd

    def held(self) -> bool:
        """Whether ``path`` is still the file this process locked (True where nothing is held). It is not when
        the folder was moved or deleted, or the file removed, while the run wrote there: another run may
        have locked a new file there since."""
        return self.fd is None or _is_locked_file(self.path, self.fd)

    def check(self) -> None:
        """Raise unless :meth:`held`: a run that goes on would write its outputs where they are lost (a
        folder of that name made anew) or mixed with another run's.

        Raises:
            ValueError: naming the lock file and the folder.
        """
        if not self.held():
            raise ValueError(
                f"the lock file {self.path} of this run is gone: {self.path.parent} was moved or deleted, or the "
                "file removed, while the run wrote there; the run stops rather than write outputs where they "
                "would be lost or mixed with another run's"
            )


def _is_locked_file(path: Path, fd: int) -> bool:
    """Whether the file at ``path`` is the one open as ``fd``."""
    try:
        found, held = os.stat(path), os.fstat(fd)
    except OSError:  # gone, or its folder
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


@contextlib.contextmanager
def output_lock(
    folder: str | Path, command: str, name: str = LOCK_NAME, outputs: Iterable[str] = (), output: str | None = None
) -> Iterator[HeldLock]:
    """Hold ``folder/<name>`` (``.detens.lock``) while ``command`` reads and writes the folder's outputs.

    Two runs on one output folder would each rebuild the outputs from their own view of the finished
    work (one removing what the other still counts on), and both report success over a corrupt result;
    the second is refused instead, naming the first. The lock is the kernel's (``flock``), released when
    its process ends however it ends, so a run killed with SIGKILL never blocks the next one; the file
    only names its holder (pid, host, command) for the message. A folder that does not exist is created,
    and removed again at the end if the command left it empty. Where the platform or the file system has
    no such locks, the command runs unlocked, as before.

    Once the lock is held, the temporary files that killed writers left in ``folder`` and in its
    subfolders ``outputs`` (those the command writes in, searched through) are removed; see
    :func:`remove_stale_temporaries`, which spares those of processes still writing (another shard's).

    ``output``: the one output file the lock (a ``name`` of its own) guards, named in the refusal, where
    the command writes one file of the folder (a report beside others) rather than the folder.

    Yields:
        HeldLock: the lock, which a long run checks (:meth:`HeldLock.check`) before it writes: its folder may
        be moved or deleted while it runs.

    Raises:
        ValueError: another process holds the lock, naming it.
        OSError: the lock file cannot be written (a full disk), naming it; the folder is left as it was.
    """
    folder = Path(folder)
    with run_folder(folder) as usable:
        if not usable:
            yield HeldLock(folder / name, None)
            return
        fd = _acquire(folder / name, command, output)
        try:
            remove_stale_temporaries(folder, outputs)
            yield HeldLock(folder / name, fd)
        finally:
            if fd is not None:
                # removed while still held: a process waiting on this file sees it is gone and retries; not
                # a file that is no longer this one (another run's, when this one's was removed)
                if _is_locked_file(folder / name, fd):
                    (folder / name).unlink(missing_ok=True)
                os.close(fd)


@contextlib.contextmanager
def run_folder(folder: Path) -> Iterator[bool]:
    """Create ``folder`` (and its missing parents) for a run, and remove again at the end those the run
    left empty. Yields False, creating nothing, when ``folder`` is a file: the command says so itself, with
    its own message.

    Raises:
        NotADirectoryError: a folder above ``folder`` is a file, naming it.
        FileNotFoundError: ``folder``, or a folder above it, is a symbolic link that leads nowhere, naming it
            and where it leads.
    """
    if folder.exists() and not folder.is_dir():
        yield False
        return
    if (broken := _broken_link(folder)) is not None:  # mkdir's own error says only "File exists"
        raise FileNotFoundError(f"{folder} cannot be created: {broken}")
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    above = next((p for p in folder.parents if p not in created), None)
    if above is not None and not above.is_dir():  # mkdir's own error names the folder, not the file in its way
        raise NotADirectoryError(f"{folder} cannot be created: {above} is a file, not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield True
    finally:
        for path in created:  # innermost first
            with contextlib.suppress(OSError):  # not empty: the command wrote there
                path.rmdir()


def _broken_link(path: Path) -> str | None:
    """What is wrong where ``path``, or one of the folders above it that do not exist, is a symbolic link that
    leads nowhere (to a path that does not exist, such as a storage not mounted, or round a loop of links);
    None where none is."""
    for link in (path, *path.parents):
        if link.exists():
            return None
        if link.is_symlink():
            try:
                os.stat(link)
            except OSError as err:
                leads = ("which leads round a loop of links: fix the link" if err.errno == errno.ELOOP
                         else "which does not exist: create it")
                return f"{link} is a symbolic link to {os.readlink(link)}, {leads}, or give another path"
    return None


def _acquire(path: Path, command: str, output: str | None = None) -> int | None:
    """The descriptor of ``path`` locked by this process, or None where locks are not available.

    Raises:
        ValueError: another process holds it.
        OSError: its holder's text cannot be written (a full disk), naming ``path``, which is removed.
    """
    try:
        fd = lock_descriptor(path, wait=False)
    except BlockingIOError:
        raise ValueError(_held_by(path, output)) from None
    if fd is None:
        return None
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
              "argv": sys.argv, "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(holder).encode("utf-8"))
    except OSError as err:
        # removed while held, as a release does: the run fails before its first result, and a folder it
        # created goes again (run_folder) only once empty
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)
        raise _said_of(err, path, "writing the lock file") from err
    return fd


def lock_descriptor(path: Path, wait: bool) -> int | None:
    """A descriptor of the file ``path`` (created if need be) that this process holds an exclusive ``flock``
    on, or None where the platform or the file system has no such locks.

    A holder removes the file as it lets go (:func:`output_lock`), so a lock taken on a file that is no
    longer at ``path`` is dropped and the one now there is locked instead.

    Raises:
        BlockingIOError: ``wait`` is False and another process holds it.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        return None
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:  # BlockingIOError: held; the others: a file system without locks (some mounts)
            os.close(fd)
            if isinstance(err, BlockingIOError) or err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def lock_holder_text(path: Path) -> str | None:
    """Who holds the lock at ``path`` as its file tells (``detens fuse (pid 12 on host, started ...)``), or
    None when the file is gone or does not say."""
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        return f"{holder['command']} (pid {holder['pid']} on {holder['host']}, started {holder['started']})"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _held_by(path: Path, output: str | None = None) -> str:
    """Who holds the lock at ``path`` (guarding the folder, or the one file ``output``), as far as its file
    tells."""
    who = lock_holder_text(path) or "another detens run"
    if output is not None:
        return (f"{output} is being written by {who}; two runs writing one output would spoil each other's "
                "results: wait for it to end, or give another output")
    return (f"{path.parent} is in use by {who}; two runs on one output folder would spoil each other's outputs: "
            "wait for it to end, or use another output folder")


def check_writable_file(path: str | Path, what: str) -> None:
    """Raise now, before the work whose result goes to ``path``, when it could not be written as a file.

    Args:
        what (str): names ``path`` in the message (``"--out"``).

    Raises:
        ValueError: ``path`` is a folder, its name is longer than a file system takes
            (:data:`NAME_MAX_BYTES`), a part of its folder is a file or a broken symbolic link, its
            nearest existing folder is not writable, or the file there may not be replaced
            (:func:`check_replaceable`).
    """
    path = Path(path)
    check_name_length(path, what)
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; give the path of a file")
    _check_writable_from(path.parent, path, what)
    check_replaceable(path, what)


def check_replaceable(path: Path, what: str, instead: str = "another path") -> None:
    """Raise now, before the work whose result goes to ``path``, when the file already there may be neither
    replaced, moved nor removed: marked immutable or append-only (``chattr +i`` / ``+a``, ``chflags uchg``),
    which the permission bits do not show and which holds for root too. Only the rename that ends the
    writing would find it, after the work, with the run's other files already written beside the old one.
    A file the user may not write is not told apart: the system answers that first, and then an
    append-only mark shows only at the rename.

    Args:
        what (str): names ``path`` in the message (``"--out"``, ``"the record"``).
        instead (str): what the message says to give instead (``"another --out"``).

    Raises:
        ValueError: naming ``what``, the path and why.
    """
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):  # nothing there yet, or a path no file can have: the writing names it
        return
    if not stat.S_ISREG(mode):  # a symbolic link is replaced itself, whatever it leads to
        return
    try:
        # opened for writing, not truncated: the file stays as it was. A read-only file refuses this with
        # EACCES and is replaced all the same (a rename asks its folder); only these marks give EPERM.
        os.close(os.open(path, os.O_WRONLY | getattr(os, "O_NONBLOCK", 0)))  # Windows has no O_NONBLOCK
    except OSError as err:
        if err.errno == errno.EPERM:
            raise ValueError(f"{what} {path} cannot be written: the file there may be neither replaced, moved nor "
                             f"removed ({err.strerror}: it is marked immutable or append-only, as lsattr shows); "
                             f"lift that mark, or give {instead}") from None


def check_name_length(path: Path, what: str, shorten: str | None = None) -> None:
    """Raise now, before the work whose result goes to ``path``, when its name is longer than a file system
    takes (:data:`NAME_MAX_BYTES`): only the rename that ends its writing would find it.

    Args:
        what (str): names ``path`` in the message (``"--out"``, ``"the record"``).
        shorten (str | None): what to give a shorter name, where ``path`` is named after it (``"--out"``);
            None: ``path`` itself.

    Raises:
        ValueError: naming ``what``, the path and the length of its name.
    """
    size = name_bytes(path.name)
    if size > NAME_MAX_BYTES:
        advice = f"give {shorten}, which it is named after, a shorter name" if shorten else "give a shorter name"
        raise ValueError(f"{what} {path} cannot be written: its name is {size} bytes long, and a file system "
                         f"takes at most {NAME_MAX_BYTES}; {advice}")


def check_writable_folder(path: str | Path, what: str) -> None:
    """Raise now, before the work whose files go into the folder ``path``, when it could not be created or
    written in.

    Args:
        what (str): names ``path`` in the message (``"--report"``).

    Raises:
        ValueError: ``path`` is a file, a part of it is a file, or the folder (or its nearest existing
            parent) is not writable.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} must be a folder, but {path} is a file")
    _check_writable_from(path, path, what)


def _check_writable_from(folder: Path, path: Path, what: str) -> None:
    """Raise unless ``folder``, or its nearest existing parent where it does not exist yet (it would be
    created), is a folder this process may write in."""
    if (broken := _broken_link(folder)) is not None:
        raise ValueError(f"{what} {path} cannot be written: {broken}")
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{what} {path} cannot be written: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path} cannot be written: no permission to write in {folder}")
    # the permission bits do not tell everything (a file system that makes nothing, such as /proc, or
    # root's access to a read-only mount): a folder made and removed at once does
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".detens-probe-", dir=folder))
    except OSError as err:
        raise ValueError(f"{what} {path} cannot be written: nothing can be created in {folder} "
                         f"({err.strerror or err})") from None


#: What each kind of file that holds no data of its own is, by its ``stat`` mode.
_SPECIAL_FILES = ((stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                  (stat.S_ISSOCK, "a socket"))


def special_file_kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is where it is neither a regular file nor a folder, following links: ``"a pipe"`` (a
    FIFO, or what a shell's ``<(...)`` gives), ``"a character device"`` (``/dev/zero``), ``"a block device"``
    or ``"a socket"``; None otherwise (a regular file, a folder, nothing there). Reading such a file blocks
    until another process writes to it, or never ends, and a pipe can be read only once."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # nothing there, a link to nothing, a path the system cannot take
        return None
    return next((kind for is_kind, kind in _SPECIAL_FILES if is_kind(mode)), None)


def check_not_special_file(path: str | os.PathLike[str], what: str) -> None:
    """Raise ``ValueError`` if the input ``path`` is a pipe or a device (:func:`special_file_kind`), naming
    ``what`` (``"COCO annotation file"``) and the path: detens reads an input file again where it checks
    or records it, which a pipe does not allow, and a device has no end.

    Raises:
        ValueError: a pipe, a device or a socket at ``path``.
    """
    kind = special_file_kind(path)
    if kind is not None:
        raise ValueError(
            f"{what} {path} is not a regular file ({kind}); save its content to a file and give that file's path"
        )


def read_json_file(path: str | Path, what: str) -> Any:
    """The JSON content of ``path``.

    Raises:
        FileNotFoundError: no such file, naming ``what`` (e.g. "COCO results file") and the path.
        IsADirectoryError: a folder there, named so.
        ValueError: a pipe or a device there (:func:`check_not_special_file`); the content cannot be read
            as JSON (:func:`parse_json`).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} expected, got a folder: {path}")
    check_not_special_file(path, what)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return parse_json(path.read_bytes(), what, path)


def parse_json(data: str | bytes, what: str, path: str | Path) -> Any:
    """The JSON value of ``data``, the content of the file ``path`` (a ``what``, as in ``"evaluation
    record"``), or of a part of it that holds JSON of its own (a safetensors header).

    Raises:
        ValueError: naming ``what``, the path and the position where it can: ``data`` is not valid JSON or not
            UTF-8 text (as JSON files must be); an object gives one key twice (a JSON reader keeps the last
            value); an integer of more digits than Python converts; arrays or objects nested too deeply to
            be read.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, object_pairs_hook=_object_without_repeated_keys)
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{what} {path} is not UTF-8 text, as a JSON file must be: byte {err.object[err.start]:#04x} at "
            f"position {err.start} ({err.reason}); save it as UTF-8"
        ) from err
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    except _RepeatedKeyError as err:
        raise ValueError(
            f"{what} {path} has the key {err.args[0]!r} twice in one object; a JSON reader keeps only the last "
            "value, so the others would be lost without a word: keep one, or merge them"
        ) from None
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise ValueError(f"{what} {path} cannot be read as JSON: {err}") from err
    except RecursionError:
        raise ValueError(f"{what} {path} nests arrays or objects too deeply to be read") from None


class _RepeatedKeyError(ValueError):
    """A key given twice in one JSON object (``args[0]``)."""


def _object_without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen: set[str] = set()
        raise _RepeatedKeyError(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return obj


def output_stems(
    names: Sequence[str], fixed: Mapping[str, str] | None = None, suffixes: Sequence[str] = ()
) -> dict[str, str]:
    """``file name → output stem``: a distinct stem per distinct input, for ``labels/<stem>.txt`` and the like.

    Args:
        names (list[str]): relative POSIX paths of the inputs (``"a.jpg"``, ``"sub/b.png"``), all different.
        fixed (dict[str, str] | None): stems already given to some of the names (by an earlier run, whose
            files carry them): those keep theirs, and the other names avoid them.
        suffixes (list[str]): what the caller appends to a stem to name its files (``[".txt", ".jpg"]``).
            A stem keeps its name's folders, so the files of ``x.jpg/a.png`` go in a folder ``x.jpg/``:
            no stem may name a file there (``x``, of ``x.png``, with ``.jpg``).

    A name keeps its path without the extension (``sub/b``) when no other name has that stem and none of
    its files would be another's folder. Otherwise it gets its extension appended (``a.jpg``, ``a.png`` →
    ``a_jpg``, ``a_png``; ``x.png`` beside the folder ``x.jpg/`` → ``x_png``), then a counter where that is
    still not enough (``a.jpg`` and ``a.JPG`` → ``a_jpg``, ``a_jpg_2``, in sorted name order). Stems, and
    files against folders, are compared ignoring case, so the outputs stay apart on case-insensitive file
    systems too. The stems do not depend on the order of ``names``. A stem whose files' names would be
    longer than a file system takes (:data:`NAME_MAX_BYTES`: a name of about 250 bytes given ``_jpg``, or
    without an extension) is cut short, ending in ``~`` and a digest of what it cuts short
    (:func:`name_within_limit`).

    Raises:
        ValueError: a name given twice; a stem of ``fixed`` whose file would be the folder of another
            name's files (the earlier file is there already: those names need another output folder).
    """
    if duplicated := sorted(n for n, count in Counter(names).items() if count > 1):
        raise ValueError(f"names must be distinct, got {duplicated[:5]} more than once")
    stems = {n: fixed[n] for n in names if fixed and n in fixed}
    # every stem lies in its name's folder (a fixed one too: it was made by this function)
    folders: dict[str, str] = {}
    for path in (*names, *stems.values()):
        for parent in PurePosixPath(path).parents:
            if str(parent) != ".":
                folders.setdefault(str(parent).casefold(), path)

    def in_a_folder(stem: str) -> tuple[str, str] | None:
        """``(file, name)``: a file of ``stem`` that would be the folder of the name's files; None if none."""
        return next(((f"{stem}{s}", folders[f]) for s in suffixes if (f := f"{stem}{s}".casefold()) in folders),
                    None)

    for name, stem in sorted(stems.items()):
        if (clash := in_a_folder(stem)) is not None:
            raise ValueError(
                f"{name!r} has the output stem {stem!r} from an earlier run, and its file {clash[0]!r} is where the "
                f"outputs of {clash[1]!r} need a folder (a file and a folder cannot share a path): give "
                f"{clash[1]!r} another output folder"
            )
    taken = {stem.casefold() for stem in stems.values()}
    new = [n for n in names if n not in stems]
    longest_suffix = max(suffixes, key=name_bytes, default="")

    def within_limit(stem: str) -> str:
        """``stem``, its last part cut short where a file of it would have too long a name."""
        folder, slash, last = stem.rpartition("/")
        return folder + slash + name_within_limit(last, longest_suffix).removesuffix(longest_suffix)

    whole = {n: str(PurePosixPath(n).with_suffix("")) if PurePosixPath(n).suffix else n for n in new}
    base = {n: within_limit(stem) for n, stem in whole.items()}
    counts = Counter(stem.casefold() for stem in base.values())
    for name, stem in base.items():
        if counts[stem.casefold()] == 1 and stem.casefold() not in taken and in_a_folder(stem) is None:
            stems[name] = stem
    taken |= {stems[n].casefold() for n in new if n in stems}
    for name in sorted(n for n in new if n not in stems):
        suffix = PurePosixPath(name).suffix.lstrip(".").lower()
        candidate = f"{whole[name]}_{suffix}" if suffix else whole[name]
        stem, copy = within_limit(candidate), 2
        while stem.casefold() in taken or in_a_folder(stem) is not None:
            stem, copy = within_limit(f"{candidate}_{copy}"), copy + 1
        stems[name] = stem
        taken.add(stem.casefold())
    return {n: stems[n] for n in names}
