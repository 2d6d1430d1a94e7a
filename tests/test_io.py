"""``detens.io``: checked JSON reads and atomic writes."""

from __future__ import annotations

import errno
import json
import os

import pytest

from detens.io import atomic_write_json, atomic_write_text, read_json_file


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
