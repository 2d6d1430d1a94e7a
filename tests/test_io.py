"""``detens.io``: checked JSON reads and atomic writes."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import time
from pathlib import Path

import pytest

from detens.io import atomic_json_list, atomic_write_json, atomic_write_text, json_list_items, read_json_file

REPO = Path(__file__).resolve().parents[1]


class TestReadJsonFile:
    def test_reads_json(self, tmp_path):
        path = tmp_path / "a.json"
        path.write_text('{"images": [], "n": 1}', encoding="utf-8")
        assert read_json_file(path, "annotation file") == {"images": [], "n": 1}

    @pytest.mark.parametrize("text", ['{"annotations": [1, 2], "annotations": []}', '[{"score": 0.9, "score": 0.1}]'])
    def test_a_repeated_key_is_an_error(self, tmp_path, text):
        path = tmp_path / "twice.json"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=r"annotation file .*twice\.json has the key '(annotations|score)' twice"):
            read_json_file(path, "annotation file")

    @pytest.mark.parametrize(
        "text, fragment",
        [('{"id": ' + "1" * 5000 + "}", "cannot be read as JSON"), ("[" * 100_000 + "]" * 100_000, "too deeply")],
    )
    def test_what_json_cannot_hold_names_the_file(self, tmp_path, text, fragment):
        path = tmp_path / "odd.json"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=rf"results file .*odd\.json.*{fragment}"):
            read_json_file(path, "results file")


    def test_a_folder_is_named_as_one(self, tmp_path):
        with pytest.raises(IsADirectoryError, match=rf"^annotation file expected, got a folder: {tmp_path}$"):
            read_json_file(tmp_path, "annotation file")
        with pytest.raises(FileNotFoundError, match=r"^annotation file not found: "):
            read_json_file(tmp_path / "none.json", "annotation file")

    def test_a_pipe_or_a_device_is_named_as_no_regular_file_not_as_missing(self, tmp_path, named_pipe):
        """A shell's ``<(cat gt.json)`` is a pipe, which the run would read more than once."""
        pipe = named_pipe(tmp_path / "gt.json")
        with pytest.raises(ValueError, match=rf"^annotation file {pipe} is not a regular file \(a pipe\); save its "
                                             "content to a file and give that file's path$"):
            read_json_file(pipe, "annotation file")
        if os.path.exists("/dev/null"):
            with pytest.raises(ValueError, match=r"^results file /dev/null is not a regular file \(a character device\)"):
                read_json_file("/dev/null", "results file")


class TestAtomicWrite:
    @pytest.mark.parametrize("stem", ["x" * 240, "画" * 80])  # 249 and 249 bytes with ".jpg.json"
    def test_a_long_name_that_fits_can_be_written(self, tmp_path, stem):
        path = tmp_path / f"{stem}.jpg.json"
        path.write_text("old", encoding="utf-8")  # the file system takes the name itself
        atomic_write_text(path, "new")
        assert path.read_text(encoding="utf-8") == "new"
        assert [p.name for p in tmp_path.iterdir()] == [path.name]

    @pytest.mark.parametrize("failing", ["fsync", "replace"])
    def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(self, tmp_path, monkeypatch, failing):
        path = tmp_path / "out.json"
        atomic_write_json(path, {"old": 1})

        def disk_full(*args):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, failing, disk_full)
        with pytest.raises(OSError) as raised:
            atomic_write_json(path, {"new": 2})
        # the file not written is named: a long run writes many, and the disk is full for all of them
        assert str(raised.value) == f"[Errno {errno.ENOSPC}] No space left on device, writing: '{path}'"
        assert raised.value.errno == errno.ENOSPC
        assert json.loads(path.read_text(encoding="utf-8")) == {"old": 1}
        assert [p.name for p in tmp_path.iterdir()] == ["out.json"]

    @pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors in /proc")
    def test_a_failed_chmod_closes_the_temporary_file(self, tmp_path, monkeypatch):
        def refused(*args):
            raise PermissionError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(os, "chmod", refused)
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(5):
            with pytest.raises(PermissionError):
                atomic_write_text(tmp_path / "out.txt", "x")
        assert len(os.listdir("/proc/self/fd")) == before
        assert list(tmp_path.iterdir()) == []

    def test_a_folder_that_refuses_the_temporary_file_names_the_file_written(self, tmp_path, monkeypatch):
        """mkstemp's own error names the hidden temporary file, which the user never asked for."""
        path = tmp_path / "labels" / "a.txt"
        real_open = os.open

        def refused(file, *args, **kwargs):  # a folder of mode 555, with root's permission checks
            if os.path.dirname(file) == str(path.parent):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), file)
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(os, "open", refused)
        with pytest.raises(PermissionError) as raised:
            atomic_write_text(path, "x")
        assert str(raised.value) == f"[Errno {errno.EACCES}] Permission denied, writing: '{path}'"
        assert list(path.parent.iterdir()) == []

    def test_a_refused_rename_names_the_file_written(self, tmp_path, monkeypatch):
        """os.replace's error names both paths, the temporary file first (an immutable target)."""
        path = tmp_path / "r.json"
        atomic_write_json(path, {"old": 1})

        def immutable(src, dst):
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), src, None, dst)

        monkeypatch.setattr(os, "replace", immutable)
        with pytest.raises(PermissionError) as raised:
            atomic_write_json(path, {"new": 2})
        assert str(raised.value) == f"[Errno {errno.EPERM}] Operation not permitted, writing: '{path}'"
        assert [p.name for p in tmp_path.iterdir()] == ["r.json"]

    def test_a_folder_that_refuses_a_set_of_files_is_named_and_so_is_a_file_it_refuses(self, tmp_path, monkeypatch):
        import tempfile

        from detens.io import files_written_together

        def immutable(src, dst):
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), src, None, dst)

        with monkeypatch.context() as patched:
            patched.setattr(os, "replace", immutable)
            with pytest.raises(PermissionError) as raised, files_written_together(tmp_path) as staged:
                staged("h.json").write_text("{}")
        assert str(raised.value) == f"[Errno {errno.EPERM}] Operation not permitted: '{tmp_path / 'h.json'}'"

        def refused(*args, **kwargs):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / ".files.abcdefgh.tmp"))

        monkeypatch.setattr(tempfile, "mkdtemp", refused)
        with pytest.raises(PermissionError) as raised, files_written_together(tmp_path):
            pytest.fail("nothing can be staged")
        assert str(raised.value) == f"[Errno {errno.EACCES}] Permission denied, writing in: '{tmp_path}'"
        assert list(tmp_path.iterdir()) == []


class TestNamesWithinTheLimit:
    """A name of up to 255 bytes (UTF-8, as Linux counts them) is all a file system takes."""

    @pytest.mark.parametrize("name, suffix, prefix", [("a.jpg", ".json", ""), ("x" * 250, ".json", ""),
                                                       ("画" * 80, ".json", ""), ("r.json", ".detens.lock", ".")])
    def test_a_name_that_fits_is_kept(self, name, suffix, prefix):
        from detens.io import name_within_limit

        assert name_within_limit(name, suffix, prefix) == f"{prefix}{name}{suffix}"

    @pytest.mark.parametrize("stem", ["b" * 251, "b" * 255, "画" * 84, "é" * 127 + "x", "\udcff" * 255],
                             ids=["251 bytes", "255 bytes", "84 CJK characters", "é", "bytes not UTF-8"])
    def test_a_longer_one_is_cut_short_and_told_apart_by_a_digest(self, tmp_path, stem):
        from detens.io import NAME_MAX_BYTES, name_within_limit

        fitted = name_within_limit(stem, ".json")
        assert len(os.fsencode(fitted)) <= NAME_MAX_BYTES and fitted.endswith(".json")
        assert re.fullmatch(r".+~[0-9a-f]{12}\.json", fitted, re.DOTALL) and stem.startswith(fitted.split("~")[0])
        assert name_within_limit(stem, ".json") == fitted  # the same name each run: a resumed run finds it
        assert name_within_limit(stem[:-1] + "c", ".json") != fitted
        (tmp_path / fitted).write_text("the file system takes it")
        with pytest.raises(OSError, match="File name too long"):
            (tmp_path / f"{stem}.json").write_text("x")  # the name it stands for


def test_every_library_writer_refuses_a_path_written_as_a_folder(tmp_path, monkeypatch):
    """``Path("out/")`` is ``out``: each writer would write the file ``out`` where a folder was meant."""
    import torch

    from detens import Detections, ThetaHead
    from detens.coco import save_coco_results
    from detens.export import save_yolo_txt

    monkeypatch.chdir(tmp_path)
    det = Detections(torch.tensor([[1.0, 2.0, 30.0, 40.0]]), [0.9], [1], (50, 60))
    writers = {
        "atomic_write_text": lambda path: atomic_write_text(path, "x"),
        "save_coco_results": lambda path: save_coco_results([], path),
        "save_yolo_txt": lambda path: save_yolo_txt(path, det),
        "head.save": lambda path: ThetaHead(["a", "b"]).save(path),
    }
    for name, write in writers.items():
        with pytest.raises(ValueError, match=r"expected a file path, got 'out/': a path ending in / names a folder"):
            write("out/")
        assert list(tmp_path.iterdir()) == [], name
    save_coco_results([], "out.json")  # a file path as before
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


class TestOutputLock:
    def test_a_second_run_is_refused_naming_the_first(self, tmp_path, lock_in_another_process):
        from detens.io import output_lock

        holder = lock_in_another_process(tmp_path / "out")
        with pytest.raises(ValueError, match=rf"is in use by detens fuse \(pid {holder.pid} on "):
            with output_lock(tmp_path / "out", "detens fuse"):
                pytest.fail("both hold the lock")

    def test_a_killed_holder_does_not_block_the_next_run(self, tmp_path, lock_in_another_process):
        from detens.io import LOCK_NAME, output_lock

        holder = lock_in_another_process(tmp_path / "out")
        holder.kill()  # SIGKILL: no clean-up, the lock file stays behind
        holder.wait()
        assert (tmp_path / "out" / LOCK_NAME).is_file()
        with output_lock(tmp_path / "out", "detens fuse"):
            (tmp_path / "out" / "done.json").write_text("{}")
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["done.json"]

    def test_a_folder_it_created_goes_when_left_empty(self, tmp_path):
        from detens.io import output_lock

        with output_lock(tmp_path / "a" / "b", "detens fuse"):
            assert (tmp_path / "a" / "b").is_dir()
        assert list(tmp_path.iterdir()) == []
        (tmp_path / "kept").mkdir()
        with output_lock(tmp_path / "kept", "detens fuse"):
            pass
        assert (tmp_path / "kept").is_dir() and list((tmp_path / "kept").iterdir()) == []

    def test_a_file_in_the_folders_path_is_named(self, tmp_path):
        from detens.io import output_lock

        (tmp_path / "notes.txt").write_text("x")
        for out in (tmp_path / "notes.txt" / "out", tmp_path / "notes.txt" / "a" / "b"):
            message = f"{out} cannot be created: {tmp_path / 'notes.txt'} is a file, not a folder"
            with pytest.raises(NotADirectoryError, match=f"^{re.escape(message)}$"):
                with output_lock(out, "detens fuse"):
                    pytest.fail("a folder under a file")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]

    @pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors in /proc")
    def test_a_lock_file_that_cannot_be_written_is_named_and_removed_with_the_folder_it_made(self, tmp_path,
                                                                                           monkeypatch):
        from detens.io import LOCK_NAME, output_lock

        real_write = os.write

        def disk_full(fd, data):  # the holder's text only: the test's own output still goes out
            if data.startswith(b'{"pid"'):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", disk_full)
        (tmp_path / "kept").mkdir()
        before = len(os.listdir("/proc/self/fd"))
        for out in (tmp_path / "new" / "g", tmp_path / "kept"):
            with pytest.raises(OSError) as raised, output_lock(out, "detens fuse"):
                pytest.fail("the lock is not held")
            assert str(raised.value) == (f"[Errno {errno.ENOSPC}] No space left on device, writing the lock file: "
                                         f"'{out / LOCK_NAME}'")
        assert len(os.listdir("/proc/self/fd")) == before
        assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")] == ["kept"]

    @pytest.mark.parametrize("under", ["", "sub/deeper"])
    def test_a_symbolic_link_that_leads_nowhere_is_named_with_its_target(self, tmp_path, under):
        """Storage not mounted: the folder is not there, the link is, and mkdir said only "File exists"."""
        from detens.io import check_writable_file, check_writable_folder, output_lock

        try:
            os.symlink(tmp_path / "unmounted", tmp_path / "dang")
            os.symlink("loop", tmp_path / "loop")
        except (OSError, NotImplementedError):
            pytest.skip("no symbolic links here")
        for link, fault in (("dang", f"{tmp_path / 'unmounted'}, which does not exist: create it"),
                            ("loop", "loop, which leads round a loop of links: fix the link")):
            out = tmp_path / link / under if under else tmp_path / link
            said = f"{tmp_path / link} is a symbolic link to {fault}, or give another path"
            with pytest.raises(FileNotFoundError, match=f"^{re.escape(f'{out} cannot be created: {said}')}$"):
                with output_lock(out, "detens fuse"):
                    pytest.fail("a folder behind a broken link")
            with pytest.raises(ValueError, match=f"^{re.escape(f'--out {out} cannot be written: {said}')}$"):
                check_writable_folder(out, "--out")
            with pytest.raises(ValueError, match=f"^{re.escape(f'--out {out}/r.json cannot be written: {said}')}$"):
                check_writable_file(out / "r.json", "--out")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["dang", "loop"]

    def test_a_lock_whose_folder_moved_or_whose_file_went_is_no_longer_held(self, tmp_path):
        from detens.io import LOCK_NAME, output_lock

        out = tmp_path / "out"
        with output_lock(out, "detens fuse") as lock:
            lock.check()
            out.rename(tmp_path / "moved")
            assert not lock.held()
            message = (f"the lock file {out / LOCK_NAME} of this run is gone: {out} was moved or deleted, or the file "
                       "removed, while the run wrote there; the run stops rather than write outputs where they "
                       "would be lost or mixed with another run's")
            with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
                lock.check()

    def test_the_end_of_a_run_whose_lock_file_went_leaves_the_lock_another_run_holds(self, tmp_path):
        from detens.io import LOCK_NAME, output_lock

        out = tmp_path / "out"
        first = output_lock(out, "detens fuse")
        first.__enter__()
        (out / LOCK_NAME).unlink()
        with output_lock(out, "detens fuse") as second:
            first.__exit__(None, None, None)
            assert second.held() and (out / LOCK_NAME).is_file()
            with pytest.raises(ValueError, match="is in use by detens fuse"):
                with output_lock(out, "detens fuse"):
                    pytest.fail("a third run beside the second")


_KILLED_MID_WRITE = """
import os, sys
from detens import io

def stuck(fd):  # the data is written, not yet synced: the process is killed here
    print("writing", flush=True)
    sys.stdin.read()

os.fsync = stuck
io.atomic_write_text(sys.argv[1], "never finished")
"""


class TestStaleTemporaries:
    """A writer killed mid-write (``kill -9``) leaves its temporary file; the next run in the folder removes
    it, and never one that a live writer (another shard, on this host or another) is still writing."""

    def test_the_temporary_file_names_its_writer(self, tmp_path, monkeypatch):
        from detens.io import _host_tag

        replaced = []
        real_replace = os.replace
        monkeypatch.setattr(os, "replace", lambda src, dst: replaced.append(os.path.basename(src)) or real_replace(src, dst))
        atomic_write_text(tmp_path / "out.json", "{}")
        assert len(replaced) == 1
        assert re.fullmatch(rf"\.out\.json\.[a-z0-9_]{{8}}\.{_host_tag()}-{os.getpid()}\.tmp", replaced[0]), replaced

    def test_only_those_of_gone_writers_are_removed(self, tmp_path):
        import subprocess
        import sys

        from detens.io import _host_tag, output_lock

        finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                                  text=True, check=True)
        dead, here, elsewhere = int(finished.stdout), _host_tag(), "0123abcd" if _host_tag() != "0123abcd" else "abcd0123"
        out = tmp_path / "out"
        (out / "labels" / "sub").mkdir(parents=True)
        (out / "vis").mkdir()
        (out / "elsewhere").mkdir()
        names = {
            "labels/sub/.a.txt.k2j4_x9q.{here}-{dead}.tmp": "removed",  # its writer is gone
            ".predictions.json.aaaaaaaa.{here}-{dead}.tmp": "removed",
            "labels/.b.txt.bbbbbbbb.{here}-{live}.tmp": "kept",  # this process: still writing
            ".summary.json.cccccccc.{elsewhere}-{dead}.tmp": "kept",  # another host's: cannot be asked
            ".images.json.dddddddd.tmp": "kept",  # a version that did not name the writer
            "elsewhere/.c.txt.eeeeeeee.{here}-{dead}.tmp": "kept",  # not a folder the command writes in
            ".notes.tmp": "kept",  # no temporary of ours
            ".notes.iiiiiiii.tmp": "kept",  # as earlier versions named theirs, but of no file the commands write
            "labels/a.txt": "kept",
        }
        for name in names:
            path = out / name.format(here=here, dead=dead, live=os.getpid(), elsewhere=elsewhere)
            path.write_text("x")
        # untouched for two days: whoever wrote them is gone, whatever their names say
        for name in (f".old.json.ffffffff.{elsewhere}-{dead}.tmp", ".old.json.gggggggg.tmp",
                     f"labels/.old.txt.hhhhhhhh.{here}-{os.getpid()}.tmp", "vis/.old.jpg.jjjjjjjj.tmp"):
            (out / name).write_text("x")
            os.utime(out / name, (time.time() - 2 * 86400,) * 2)
            names[name] = "removed"
        # a user's hidden file named as earlier versions named their temporaries, however old, is theirs
        os.utime(out / ".notes.iiiiiiii.tmp", (time.time() - 2 * 86400,) * 2)
        with output_lock(out, "detens fuse", outputs=("labels", "vis")):
            pass
        left = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
        expected = {name.format(here=here, dead=dead, live=os.getpid(), elsewhere=elsewhere)
                    for name, fate in names.items() if fate == "kept"}
        assert left == expected

    def test_a_killed_shard_s_temporary_goes_a_running_one_s_stays(self, tmp_path):
        """Two shards write into one folder; one is killed mid-write, the other is still writing when a
        run of the killed shard starts again."""
        import signal
        import subprocess
        import sys

        from detens.io import output_lock

        out = tmp_path / "out"
        (out / "shards").mkdir(parents=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        writers = [
            subprocess.Popen([sys.executable, "-c", _KILLED_MID_WRITE, str(out / "shards" / f"m.shard-{i}-of-2.json")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            for i in range(2)
        ]
        try:
            for writer in writers:
                assert writer.stdout.readline().strip() == "writing"
            writers[0].send_signal(signal.SIGKILL)
            writers[0].wait()
            assert len(list((out / "shards").glob(".m.shard-*.tmp"))) == 2
            with output_lock(out, "detens cache", ".detens.shard-0-of-2.lock", ("shards",)):
                left = [p.name for p in (out / "shards").iterdir()]
            assert len(left) == 1 and left[0].startswith(".m.shard-1-of-2.json.") and left[0].endswith(
                f"-{writers[1].pid}.tmp"), left
        finally:
            for writer in writers:
                writer.kill()
                writer.wait()


class TestFilesWrittenTogether:
    """A set of files replaces the earlier set whole, or, where a write fails, not at all."""

    def test_the_set_replaces_the_earlier_one_in_order_and_a_file_not_written_goes(self, tmp_path, monkeypatch):
        from detens.io import files_written_together

        for name in ("a.txt", "b.txt", "c.txt", "other.txt"):
            (tmp_path / name).write_text("earlier")
        replaced = []
        real_replace = os.replace
        monkeypatch.setattr(os, "replace", lambda src, dst: replaced.append(Path(dst)) or real_replace(src, dst))
        with files_written_together(tmp_path) as staged:
            atomic_write_text(staged("b.txt"), "new b")
            staged("c.txt")  # this set has no c.txt
            assert (tmp_path / "b.txt").read_text() == "earlier"  # nothing replaced while the set is written
            atomic_write_text(staged("a.txt"), "new a")
        assert [path.name for path in replaced if path.parent == tmp_path] == ["b.txt", "a.txt"]  # not the stage's
        assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
            "a.txt": "new a", "b.txt": "new b", "other.txt": "earlier"}

    def test_a_failed_write_leaves_the_earlier_set_and_no_temporary(self, tmp_path):
        from detens.io import files_written_together

        for name in ("a.txt", "b.txt"):
            (tmp_path / name).write_text("earlier")
        with pytest.raises(OSError, match="No space left"), files_written_together(tmp_path) as staged:
            atomic_write_text(staged("a.txt"), "new a")
            staged("b.txt")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a.txt": "earlier", "b.txt": "earlier"}

    def test_a_failed_rename_puts_back_the_files_already_replaced(self, tmp_path, monkeypatch):
        from detens.io import files_written_together

        for name in ("a.txt", "b.txt", "c.txt"):
            (tmp_path / name).write_text("earlier")
        real_replace = os.replace

        def refuse_c(src, dst):
            if Path(dst) == tmp_path / "c.txt":
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(src), None, str(dst))
            return real_replace(src, dst)

        monkeypatch.setattr(os, "replace", refuse_c)
        with pytest.raises(PermissionError), files_written_together(tmp_path) as staged:
            atomic_write_text(staged("new.txt"), "new")  # no earlier file: removed again
            atomic_write_text(staged("a.txt"), "new a")
            staged("b.txt")  # not written: its earlier file comes back
            atomic_write_text(staged("c.txt"), "new c")
        assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
            "a.txt": "earlier", "b.txt": "earlier", "c.txt": "earlier"}

    def test_a_name_asked_for_twice_is_written_once(self, tmp_path):
        from detens.io import files_written_together

        with files_written_together(tmp_path) as staged:
            atomic_write_text(staged("a.txt"), "first")
            atomic_write_text(staged("a.txt"), "second")
        assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a.txt": "second"}

    def test_a_refused_file_is_named_where_it_would_be(self, tmp_path):
        from detens.io import files_written_together

        with pytest.raises(ValueError, match=rf"^refusing to save {re.escape(str(tmp_path / 'a.json'))}$"), \
                files_written_together(tmp_path) as staged:
            raise ValueError(f"refusing to save {staged('a.json')}")

    def test_a_name_with_a_folder_is_refused(self, tmp_path):
        from detens.io import files_written_together

        with pytest.raises(ValueError, match=r"named without folders, got 'sub/a.txt'"), \
                files_written_together(tmp_path) as staged:
            staged("sub/a.txt")
        assert list(tmp_path.iterdir()) == []

    def test_the_set_of_a_killed_writer_is_removed_by_the_next(self, tmp_path, caplog):
        import subprocess
        import sys

        from detens.io import _host_tag, files_written_together

        finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                                  text=True, check=True)
        killed = tmp_path / f".files.abcdefgh.{_host_tag()}-{int(finished.stdout)}.tmp"
        running = tmp_path / f".files.ijklmnop.{_host_tag()}-{os.getpid()}.tmp"
        for stage in (killed, running):
            stage.mkdir()
            (stage / "a.txt").write_text("staged")
        (tmp_path / ".user_folder").mkdir()  # no set of ours
        (tmp_path / f".a.txt.qrstuvwx.{_host_tag()}-{int(finished.stdout)}.tmp").write_text("cut short")
        with caplog.at_level(logging.INFO, logger="detens.io"), files_written_together(tmp_path) as staged:
            atomic_write_text(staged("a.txt"), "new")
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".user_folder", running.name, "a.txt"])
        assert "removed 1 temporary file and 1 temporary folder in" in caplog.text


class TestCheckWritable:
    def test_a_folder_to_be_made_under_a_writable_one_passes_and_nothing_is_left(self, tmp_path):
        from detens.io import check_writable_file, check_writable_folder

        check_writable_folder(tmp_path / "new" / "deeper", "--out")
        check_writable_file(tmp_path / "new" / "r.json", "--out")
        assert list(tmp_path.iterdir()) == []

    def test_a_folder_where_nothing_can_be_created_is_refused_whatever_its_permission_bits(self, tmp_path, monkeypatch):
        """A read-only mount, or a file system such as /proc, refuses new entries that the permission bits
        (all that root's ``os.access`` looks at) allow."""
        import tempfile

        from detens.io import check_writable_file, check_writable_folder

        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        monkeypatch.setattr(tempfile, "mkdtemp", read_only)
        with pytest.raises(ValueError, match=rf"^--out {re.escape(str(tmp_path / 'run'))} cannot be written: nothing "
                                             rf"can be created in {re.escape(str(tmp_path))} \(Read-only file system\)$"):
            check_writable_folder(tmp_path / "run", "--out")
        with pytest.raises(ValueError, match=r"^--plot .*p\.png cannot be written: nothing can be created in"):
            check_writable_file(tmp_path / "p.png", "--plot")

    def test_a_file_that_may_not_be_replaced_is_refused_and_a_read_only_one_is_not(self, tmp_path, immutable,
                                                                                  monkeypatch):
        """An immutable file refuses the rename that ends a write whatever the permission bits say; a file that
        is only read-only (a write refused with EACCES) is replaced all the same."""
        from detens.io import check_writable_file

        (tmp_path / "r.json").write_text("{}")
        immutable(tmp_path / "r.json")
        with pytest.raises(ValueError, match=f"^{re.escape(f'--out {tmp_path}/r.json cannot be written: the file there')} "
                                             r"may be neither replaced, moved nor removed \(Operation not permitted: it "
                                             r"is marked immutable or append-only, as lsattr shows\); lift that mark, or "
                                             r"give another path$"):
            check_writable_file(tmp_path / "r.json", "--out")
        (tmp_path / "read_only.json").write_text("{}")
        marked_open = os.open

        def read_only(path, flags, *args, **kwargs):
            if os.fspath(path).endswith("read_only.json") and flags & os.O_WRONLY:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
            return marked_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", read_only)
        check_writable_file(tmp_path / "read_only.json", "--out")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "read_only.json"]
        assert (tmp_path / "r.json").read_text() == "{}"

    def test_an_existing_file_is_probed_where_os_has_no_nonblocking_flag(self, tmp_path, monkeypatch):
        """Windows' os module has no O_NONBLOCK: the probe of a file already there must not need it."""
        from detens.io import check_writable_file

        (tmp_path / "r.json").write_text("{}")
        monkeypatch.delattr(os, "O_NONBLOCK")
        check_writable_file(tmp_path / "r.json", "--out")
        assert (tmp_path / "r.json").read_text() == "{}"


@pytest.mark.parametrize("seed", range(5))
def test_a_json_list_written_in_parts_is_the_bytes_of_the_whole_list_written_at_once(tmp_path, seed):
    """A fuse run streams its results an image at a time (a folder's worth of boxes would not fit in memory
    as one list): its file must read, and compare, as the one json.dumps of the whole list wrote."""
    import random

    rng = random.Random(seed)
    items = [{"image_id": i, "bbox": [rng.random(), 1.5, 2, 3], "score": rng.random(), "name": "é\u2028\""}
             for i in range(rng.randrange(0, 40))]
    cuts = sorted(rng.randrange(0, len(items) + 1) for _ in range(rng.randrange(0, 6)))
    parts = [items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)], strict=True)]
    with atomic_json_list(tmp_path / "streamed.json") as extend:
        for part in parts:
            extend(part)
            extend([])  # an image with no box
    atomic_write_json(tmp_path / "whole.json", items)
    assert (tmp_path / "streamed.json").read_bytes() == (tmp_path / "whole.json").read_bytes()


def test_a_json_list_whose_writing_fails_leaves_the_earlier_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "predictions.json"
    path.write_text("[1]")
    with pytest.raises(KeyboardInterrupt), atomic_json_list(path) as extend:
        extend([2, 3])
        raise KeyboardInterrupt
    assert path.read_text() == "[1]" and sorted(p.name for p in tmp_path.iterdir()) == ["predictions.json"]


def test_the_items_of_a_json_list_are_json_loads_own_each_with_the_text_it_was_read_from():
    """Against json.loads, the slow obvious reader: random lists written with random white space."""
    import random

    rng = random.Random(0)
    values = [1, -2.5e-3, "a,] \"x\"", {"image_id": 3, "bbox": [1, {"c": None}]}, [], {}, True, None, "é"]
    for _ in range(500):
        items = [rng.choice(values) for _ in range(rng.randrange(0, 6))]
        space = lambda: rng.choice(["", " ", "\n", " \t\r\n "])  # noqa: E731
        text = space() + "[" + space() + ",".join(space() + json.dumps(i) + space() for i in items) + "]" + space()
        read = list(json_list_items(text))
        assert [item for item, _, _ in read] == json.loads(text) == items
        assert all(json.loads(text[start:end]) == item for item, start, end in read)


@pytest.mark.parametrize("text", ["", "{}", "[1,]", "[1 2]", "[1] x", "[", "[1,", "[,1]", "]", "[1]]", "[tru]",
                                  "[1, " + "[" * 100_000 + "]" * 100_000 + "]"])
def test_what_is_not_one_json_list_is_refused(text):
    """An item nested too deeply to be read too: a ValueError, not the RecursionError of the reader."""
    with pytest.raises(ValueError):
        list(json_list_items(text))
