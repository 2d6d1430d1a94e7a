"""The commands' jobs as Python calls: ``detens.cache(...)`` and ``detens.fuse_images(...)`` run exactly
what ``detens cache`` and ``detens fuse`` run (same outputs, resuming, engines), with keyword options named
like the flags (``--max-det`` is ``max_det``). A mistake raises the library's ``ValueError``/``TypeError``
instead of ending the process; where the command would name its flags (``--shard``, ``--overwrite``), the
message and the job's log lines name the keyword options instead (``shard``, ``overwrite=True``).

The options are checked as the command line's flags are, by type: a flag without a value (``overwrite``,
``quiet``) takes a bool, a number flag an integer (``max_images``, ``actors``: an ``int`` or a NumPy integer)
or a number (``conf``), a path flag a ``str`` or ``os.PathLike``, the others a ``str``; a string is never read
as a number, nor a number or a string as a bool (``overwrite="no"`` would otherwise discard finished work).

A Ctrl-C raises ``KeyboardInterrupt`` once the job has saved its finished work, as the command ends with
``error: interrupted`` and exit status 130 then: a script's loop over calls stops there, and the same call
made again resumes (without ``overwrite=True``, which would discard the finished work instead).

``quiet=True`` quiets the detector libraries for the call only: their log levels and the environment
variables they read are put back when it returns or raises."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from detens.jobs import job
from detens.jobs._options import UsageError, command_line_flag, python_keyword

__all__ = ["cache", "fuse_images", "in_python_words"]


def _models_text(value: Any) -> str:
    """``models`` as ``--models`` takes it: a string, or a list of names or globs joined with commas.

    Raises:
        ValueError: ``models`` names no member (``[]``, ``""``, ``" , "``), or a name of the list is empty or
            holds a comma: leaving ``models`` out selects every member, so naming none is a mistake.
    """
    if isinstance(value, str):
        if not any(part.strip() for part in value.split(",")):
            raise ValueError(
                f"models={value!r} names no member; give names or globs ('yolo26n*,yolov8n' or a list of "
                "them), or leave models out for every member"
            )
        return value
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        if not value:
            raise ValueError(
                f"models={value!r} names no member; give a list of names or globs (['yolo26n*', 'yolov8n']), "
                "or leave models out for every member"
            )
        for i, name in enumerate(value):
            if not name.strip():
                raise ValueError(f"models[{i}] is {name!r}: each entry names a member or is a glob of names")
            if "," in name:
                raise ValueError(
                    f"models[{i}] = {name!r} holds a comma, which no member name holds (the command line "
                    "separates names with commas); give the names (or globs) one by one"
                )
        return ",".join(value)
    raise TypeError(
        f"models must be a str ('yolo26n*,yolov8n') or a list of str, got {type(value).__name__}: {value!r}"
    )


def _run(command: str, options: dict[str, Any]) -> int:
    module, options_class = job(command)
    if options.get("models") is not None:
        options = {**options, "models": _models_text(options["models"])}
    checked = options_class.from_python(options)
    names, flags = options_class.option_names(), options_class.flag_names()
    from detens.jobs._logging import quieted

    try:
        # as the command's --quiet (the detector libraries' loading messages too), for this call only
        with quieted(checked.quiet, only_where_stderr_is_fd_2=True), _logged_in_python_words(names, flags):
            return int(module.run(checked))
    except UsageError as err:
        raise ValueError(in_python_words(str(err), names, flags)) from None
    except (ValueError, ConnectionError) as err:
        # the job's other refusals of an option's value (a Ray address where no cluster answers too), in the
        # caller's words too
        reworded = in_python_words(str(err), names, flags)
        if reworded != str(err) and len(err.args) == 1:
            err.args = (reworded,)
        raise


#: Another run's command line quoted in a message (``detens cache --shard 0/2``, a lock's holder): its flags
#: are that command's, and stay as they are.
_QUOTED_COMMAND = re.compile(r"\bdetens [a-z]+(?: merge)?(?: --[A-Za-z][\w-]*(?: (?!--)[^\s,;()`]+)?)+")
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][A-Za-z0-9-]*")


def in_python_words(message: str, names: Sequence[str], flags: Collection[str] = ()) -> str:
    """``message``, in a job's command-line words, with each flag of the job (``--max-det``) written as the
    Python call's keyword option (``max_det``; ``overwrite=True`` for the options in ``flags``, which take no
    value). Other text is kept, and so is a quoted command line (``in use by detens cache --shard 0/2``).

    Args:
        names: the job's option names. flags: those of them that take no value on the command line.
    """
    keywords = {command_line_flag(name): python_keyword(name, name in flags) for name in names}

    def reworded(text: str) -> str:
        return _FLAG.sub(lambda found: keywords.get(found.group(0), found.group(0)), text)

    pieces, start = [], 0
    for quoted in _QUOTED_COMMAND.finditer(message):
        pieces += [reworded(message[start:quoted.start()]), quoted.group(0)]
        start = quoted.end()
    return "".join([*pieces, reworded(message[start:])])


class _InPythonWords(logging.Filter):
    """Rewrites each record's message with :func:`in_python_words`."""

    def __init__(self, names: Sequence[str], flags: Collection[str]) -> None:
        super().__init__()
        self.names, self.flags = names, flags

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        reworded = in_python_words(message, self.names, self.flags)
        if reworded != message:
            record.msg, record.args = reworded, None
        return True


@contextlib.contextmanager
def _logged_in_python_words(names: Sequence[str], flags: Collection[str]) -> Iterator[None]:
    """For the block, the records of detens' loggers in the Python call's words (:func:`in_python_words`).

    The filter sits on each logger of a detens module imported by the block's start (the job's modules are:
    ``job`` imported them), as a logger's filters see only the records made on it; records that other
    threads make on them meanwhile are reworded too.
    """
    rewording = _InPythonWords(names, flags)
    loggers = [
        logger for name, logger in list(logging.Logger.manager.loggerDict.items())
        if (name == "detens" or name.startswith("detens.")) and isinstance(logger, logging.Logger)
    ]
    for logger in loggers:
        logger.addFilter(rewording)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(rewording)


def cache(
    config: str | Path | None = None,
    images: str | Path | None = None,
    gt: str | Path | None = None,
    out: str | Path | None = None,
    **options: Any,
) -> int:
    """Cache each member's detections on a COCO-format dataset (``detens cache``), or join the shards of
    earlier runs (``merge=True``, ``detens cache merge``).

    Args:
        config: a shipped ensemble name (``coco_yolo3``, the default) or an ensemble YAML.
        images: the folder of the ground truth's images. gt: its COCO annotation file. out: the output folder.
            A detection run needs all three; ``merge=True`` takes ``out`` (and optionally ``gt``,
            ``models``) and nothing that only a detection run uses.
        **options: the command's other flags, each of the flag's type (see the module): e.g.
            ``engine="ray"``, ``actors=2``, ``models="yolo26n"`` (or a list of names or globs:
            ``["yolo26n*", "yolov8n"]``), ``shard="0/4"``, ``conf=0.001``, ``max_images=100``,
            ``overwrite=True``, ``quiet=True``, ``merge=True``.

    Returns:
        int: 0, once done.

    Raises:
        KeyboardInterrupt: a Ctrl-C, once the finished images and the summary of the stopped run are saved;
            the same call made again (without ``overwrite=True``) resumes.
        TypeError: an unknown option, or an option of the wrong type (``overwrite="no"``, ``max_images="3"``).
        ValueError: a bad value, as the command reports it (``shard="2/2"``, ``engine="rayy"``).
    """
    given = {"config": config, "images": images, "gt": gt, "out": out}
    return _run("cache", {**{k: v for k, v in given.items() if v is not None}, **options})


def fuse_images(config: str | Path, source: str | Path, out: str | Path, **options: Any) -> int:
    """Run an ensemble on images and fuse its detections (``detens fuse``).

    Args:
        config: a shipped ensemble name or an ensemble YAML. source: an image, a folder or a glob.
        out: the output folder (``predictions.json``, ``images.json``, ...).
        **options: the command's other flags, each of the flag's type (see the module): e.g.
            ``engine="ray"``, ``head="runs/train/head.json"``, ``method="wbf"``, ``save_per_model=True``,
            ``quiet=True``.

    Returns:
        int: 0, once done.

    Raises:
        KeyboardInterrupt: a Ctrl-C, once the finished images and the outputs of them are saved (their
            ``summary.json`` says ``"interrupted": true``), or before the first image is done, ``out`` left as
            it was; the same call made again (without ``overwrite=True``) resumes.
        TypeError: an unknown option, or an option of the wrong type (``no_vis="yes"``, ``imgsz=640.0``).
        ValueError: a bad value, as the command reports it; no image of ``source`` could be read (after the
            outputs, whose summary lists the unreadable files, are written).
    """
    return _run("fuse", {"config": config, "source": source, "out": out, **options})
