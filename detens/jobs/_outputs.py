"""Checks of where ``detens evaluate`` and ``detens train`` write, made before the run: an output on one of
the run's own input files would destroy it, and a JSON output in a prediction folder would break the
folder for every later run; and the lock each holds on its ``--out`` while it runs.

Paths come as ``(what, path)`` pairs, ``what`` naming the path in a message (``"--out"``, ``"--gt"``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from detens.io import check_name_length, check_replaceable, name_within_limit, output_lock
from detens.jobs._options import UsageError

__all__ = ["output_file_lock", "refuse_unwritable_outputs", "refuse_outputs_over_inputs", "refuse_results_in_prediction_folders"]


@contextlib.contextmanager
def output_file_lock(out: Path, command: str) -> Iterator[None]:
    """Hold the lock of the output file ``out`` (``.<name>.detens.lock`` beside it, cut short with a digest
    where that name would be too long: :func:`detens.io.name_within_limit`; :func:`detens.io.output_lock`)
    while ``command`` writes it: a second run on the same ``--out`` is refused, naming the first, where both
    would write it and the last would win without a word. Another file in the same folder is another run's.

    Raises:
        ValueError: another process holds the lock, naming it.
    """
    lock_name = name_within_limit(out.name, ".detens.lock", prefix=".")
    with output_lock(out.parent, command, lock_name, output=f"--out {out}"):
        yield


def refuse_unwritable_outputs(outputs: Sequence[tuple[str, Path]]) -> None:
    """Raise if an output's name is longer than a file system takes (:func:`detens.io.check_name_length`) or
    the file already there may not be replaced (:func:`detens.io.check_replaceable`): only the rename that
    ends its writing, after the work, would find it. An output that no flag names (``"the record"``) is
    named after ``--out``, which the message says to change."""
    for what, path in outputs:
        named_after_out = not what.startswith("--")
        check_name_length(path, what, "--out" if named_after_out else None)
        check_replaceable(path, what, "--out another name" if named_after_out else "another path")


def refuse_outputs_over_inputs(
    outputs: Sequence[tuple[str, Path]], inputs: Sequence[tuple[str, Path]], folders: Sequence[tuple[str, Path]]
) -> None:
    """Raise if an output is one of ``inputs`` or one of the ``.json`` files in the prediction ``folders``
    (those of the members that ``--models`` leaves out included: they are the folder's data all the same),
    or a new ``.json`` file in one of those folders (:func:`refuse_results_in_prediction_folders`)."""
    read = {path.resolve(): what for what, path in inputs}
    for flag, folder in folders:
        read.update((path.resolve(), f"{path.name} in {flag}") for path in sorted(Path(folder).glob("*.json")))
    for what, path in outputs:
        if path.resolve() in read:
            raise UsageError(
                f"{what} {path} is {read[path.resolve()]}: the run would write over its own input; "
                "give the output another name"
            )
    refuse_results_in_prediction_folders(outputs, folders)


def refuse_results_in_prediction_folders(
    outputs: Sequence[tuple[str, Path]], folders: Sequence[tuple[str, Path]]
) -> None:
    """Raise if an output is a ``.json`` file in a prediction folder: :meth:`EnsemblePredictions.from_folder`
    reads each as a member's COCO results, so the folder would no longer load."""
    for what, path in outputs:
        for flag, folder in folders:
            if path.suffix == ".json" and not path.name.startswith(".") and path.resolve().parent == folder.resolve():
                raise UsageError(
                    f"{what} {path} would be written into the prediction folder of {flag}, where every .json file "
                    "is read as a member's predictions; give it another folder"
                )
