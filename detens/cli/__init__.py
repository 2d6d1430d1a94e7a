"""The ``detens`` command: ``detens fuse | cache | train | evaluate | bench | report | configs`` (also
``python -m detens``).

Each subcommand is a module of this package with its help page, ``add_arguments(parser)`` and
``run(args) -> int``, which reads the parsed flags into the job's options and runs the job of
:mod:`detens.jobs` (``detens/jobs/<command>.py``); the ``tools/*.py`` scripts call the same modules.

A user's mistake (a bad flag, a missing file, a YAML typo, a head for other models, a learning rate that
makes a fit diverge, an optional dependency not installed) ends as one ``error: <message>`` on stderr and
exit status 2, without a traceback; ``--debug`` shows the traceback instead. Ctrl-C ends as ``error:
interrupted`` and exit status 130 (after what the command saves of its finished work) at any point, the
imports of the detector libraries included; a SIGTERM (``kill``, a job scheduler's stop) likewise, as
``error: terminated`` and exit status 143.

This module imports only the standard library: a Ctrl-C while it is imported, before :func:`main` can
catch it, would print a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from detens._termination import sigterm_as_interruption, was_terminated

__all__ = ["COMMANDS", "add_threads_argument", "add_weights_dir_argument", "argparse_type", "existing_folder", "file_or_folder", "finite_number", "folder_path", "build_parser", "integer", "output_file", "positive_int", "command_parser", "main", "run_command"]

#: subcommand -> (module, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "fuse": ("detens.cli.fuse", "run an ensemble on images and fuse its detections"),
    "cache": ("detens.cli.cache", "save each member's detections on a COCO-format dataset"),
    "train": ("detens.cli.train", "fit a fusion head on cached predictions"),
    "evaluate": ("detens.cli.evaluate", "compare fusion methods with cross-validated COCO mAP"),
    "bench": ("detens.cli.bench", "time the fusers against ensemble_boxes and torchvision"),
    "report": ("detens.cli.report", "write the HTML report page of a saved evaluation"),
    "configs": ("detens.cli.configs", "list, print or copy the configs and heads shipped with detens"),
}

#: the exit status of an interrupted command (128 + SIGINT, as shells report it), and of a terminated one
#: (128 + SIGTERM)
_INTERRUPTED = 130
_TERMINATED = 143


# argparse's message for a value outside an argument's choices, and the quoted names it lists
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<valid>.*)\)")
_QUOTED = re.compile(r"'([^']*)'")
# argparse's message for an option whose value it took for another option ("--shard -1/2")
_EXPECTED_ONE = re.compile(r"argument (?P<flags>[^:]+): expected one argument")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one ``error:`` line (exit status 2), like every other
    user mistake, instead of a usage block."""

    #: the arguments being parsed
    _command_line: list[str] = []

    def error(self, message: str) -> NoReturn:
        choice = _INVALID_CHOICE.search(message)
        if choice:  # as every unknown name of detens is answered: with the nearest valid one
            close = difflib.get_close_matches(choice["given"], _QUOTED.findall(choice["valid"]), n=1)
            message += f"; did you mean {close[0]!r}?" if close else ""
        expected = _EXPECTED_ONE.search(message)
        if expected:
            message += _dash_value_hint(expected["flags"].split("/"), self._command_line)
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")  # same form as UsageError

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """argparse's, but a flag the command does not know is reported by that command's parser (argparse
        reports it from the top: ``detens: ...``), with the nearest flag it has."""
        _Parser._command_line = list(sys.argv[1:] if args is None else args)  # for the subcommands' errors
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            parser = getattr(parsed, "_parser", self)
            flags = sorted(o for action in parser._actions for o in action.option_strings if o.startswith("--"))
            first = next((a.split("=", 1)[0] for a in unknown if a.startswith("--")), None)
            close = difflib.get_close_matches(first, flags, n=1) if first else []
            if close:
                hint = f"; did you mean {close[0]}?"
            else:
                hint = _expanded_glob_hint(list(sys.argv[1:] if args is None else args), unknown)
            parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
        return parsed


def _dash_value_hint(flags: list[str], args: list[str]) -> str:
    """How to give a value that starts with ``-`` (argparse reads ``--shard -1/2`` as two options) where
    one of ``flags`` is followed by such a value in ``args``; empty otherwise."""
    for flag, value in zip(args, args[1:], strict=False):
        if flag in flags and value.startswith("-") and not value.startswith("--"):
            return f"; argparse takes {value!r} for an option: write {flag}={value}"
    return ""


def _expanded_glob_hint(args: list[str], unknown: list[str]) -> str:
    """What to do about ``unknown`` arguments that are all existing paths: most likely a glob given unquoted,
    which the shell expanded into paths, the first taken as the option's value and the rest left over
    (``--source imgs/*.jpg``). Names that option and the value it took where the paths follow one; empty for
    other arguments."""
    import os

    if not all(os.path.lexists(arg) for arg in unknown):
        return ""
    # the last occurrence: the option's value may be the same path (``--source a.jpg a.jpg``)
    first = len(args) - 1 - args[::-1].index(unknown[0])
    taker = ""
    if first >= 1 and args[first - 1].startswith("--") and "=" in args[first - 1]:
        flag, value = args[first - 1].split("=", 1)
        taker = f"{flag} takes one value, here {value}; "
    elif first >= 2 and args[first - 2].startswith("--") and "=" not in args[first - 2]:
        taker = f"{args[first - 2]} takes one value, here {args[first - 1]}; "
    folders = {os.path.dirname(arg) for arg in unknown}
    suffixes = {os.path.splitext(arg)[1] for arg in unknown}
    folder = folders.pop() if len(folders) == 1 else "imgs"
    example = os.path.join(folder, "*" + (suffixes.pop() if len(suffixes) == 1 else ""))
    return f": {taker}quote a glob ({example!r}) so the shell does not expand it"


def argparse_type(module: str, check_name: str) -> Callable[[str], Any]:
    """An argparse type running the check ``check_name`` of the jobs' module ``module`` (imported when the
    command line is parsed, not with this module), its ValueError reported as argparse reports a bad flag."""

    def convert(text: str) -> Any:
        try:
            return getattr(importlib.import_module(module), check_name)(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = check_name.removeprefix("check_")
    return convert


#: argparse type: an integer (digits with an optional minus sign)
integer = argparse_type("detens.jobs._options", "check_int_text")
#: argparse type: an integer >= 1
positive_int = argparse_type("detens.jobs._options", "check_positive_int")
#: argparse type: a finite number (``float`` also takes nan and inf)
finite_number = argparse_type("detens.jobs._options", "check_finite_number")
#: argparse type: the path of a folder that exists (kept as written)
existing_folder = argparse_type("detens.jobs._options", "check_existing_folder")
#: argparse type: the path of a folder, which may not exist yet (see :func:`detens.jobs._options.check_folder`)
folder_path = argparse_type("detens.jobs._options", "check_folder")
#: argparse type: the path of a file to write, kept as written; one ending in a separator (a folder) is refused
output_file = argparse_type("detens.jobs._options", "check_output_file")
#: argparse type: the path of a file to write, or of a folder to write it in (ending in a separator), as written
file_or_folder = argparse_type("detens.jobs._options", "check_file_or_folder")


def __getattr__(name: str) -> Any:
    # the jobs' error, for callers that catch it by this module's name; imported on use, as this module
    # imports only the standard library
    if name == "UsageError":
        from detens.jobs._options import UsageError

        return UsageError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def add_weights_dir_argument(parser: argparse.ArgumentParser) -> None:
    """``--weights-dir``, for the commands that load detectors. A folder that does not exist is refused even
    when the weights are found elsewhere (``$DETENS_WEIGHTS`` is looked in first): it is a mistyped path."""
    parser.add_argument(
        "--weights-dir", type=existing_folder,
        help="folder that weights names are relative to, a relative one from the working directory "
        "(overrides weights_dir)",
    )


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads``, for the commands that fuse many small clusters with torch."""
    parser.add_argument(
        "--threads", type=positive_int, default=1,
        help="torch intra-op threads (default 1: fusion works on tensors of a few hundred boxes, where thread "
        "hand-offs cost more than they save)",
    )


def _command_texts(module: Any) -> dict[str, Any]:
    """A subcommand's help page: its module's docstring, laid out as written."""
    return {"description": module.__doc__, "formatter_class": argparse.RawDescriptionHelpFormatter}


def _add_command(parser: argparse.ArgumentParser, module: Any) -> argparse.ArgumentParser:
    """Give ``parser`` the options of the command ``module`` and the common ones, and make it run it."""
    module.add_arguments(parser)
    _add_common(parser)
    parser.set_defaults(_run=module.run, _parser=parser)
    return parser


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="warnings and results only: no progress bars or lines, no library chatter, no run summary")
    parser.add_argument("--debug", action="store_true", help="show the Python traceback of an error")


def build_parser(commands: Sequence[str] | None = None, *, with_options: bool = True) -> argparse.ArgumentParser:
    """The ``detens`` parser with every subcommand (or only ``commands``); ``with_options=False`` names the
    subcommands without their options, which is all ``detens --help`` shows (some options' help lists what
    only torch knows, and importing it takes seconds)."""
    parser = _Parser(
        prog="detens",
        description="Object-detection ensembling: run detectors, fuse their boxes, fit and evaluate fusion.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from detens import __version__

    parser.add_argument("--version", action="version", version=f"detens {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for name in commands or COMMANDS:
        if not with_options:
            sub.add_parser(name, help=COMMANDS[name][1])
            continue
        module = importlib.import_module(COMMANDS[name][0])
        _add_command(sub.add_parser(name, help=COMMANDS[name][1], **_command_texts(module)), module)
    return parser


def _usage_error() -> type[ValueError]:
    from detens.jobs._options import UsageError

    return UsageError


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean the input was wrong, not the program: reported without a traceback.

    ``FloatingPointError`` is how every head's fit reports that it diverged: the cure is the user's
    learning rate (the message names it), not a fix of the program. ``MissingExtraError`` says which
    optional dependency to install; any other ImportError is a broken install or a bug, with its traceback.
    """
    import yaml

    from detens.extras import MissingExtraError

    return (ValueError, TypeError, OSError, yaml.YAMLError, FloatingPointError, MissingExtraError)


#: Control characters as an error line writes them: a file name holding a line break would otherwise
#: split the one ``error:`` line in two, the second perhaps starting with "error:" itself.
_ESCAPED_CONTROLS = {**{code: f"\\x{code:02x}" for code in (*range(32), 127)}, ord("\n"): "\\n", ord("\r"): "\\r",
                     ord("\t"): "\t"}


def _message(err: BaseException) -> str:
    text = str(err)
    if isinstance(err, OSError) and err.filename is not None and str(err.filename) not in text:
        text = f"{text}: {err.filename}"
    return (text or type(err).__name__).translate(_ESCAPED_CONTROLS)


def _dispatch(args: argparse.Namespace) -> int:
    from detens.jobs._logging import log_above_progress_bars, quieted

    try:
        with log_above_progress_bars(args.quiet), quieted(args.quiet):
            return int(args._run(args))
    except BaseException as err:  # a KeyboardInterrupt, or an error raised while one was handled, is a Ctrl-C
        from detens.jobs._interrupts import is_interruption

        if is_interruption(err) and not args.debug:  # a job that saves its work on a Ctrl-C raises it once saved
            return _interrupted(err)
        if isinstance(err, _usage_error()):
            print(f"error: {args._parser.prog}: {_message(err)} (see {args._parser.prog} --help)", file=sys.stderr)
            return 2
        if isinstance(err, _user_errors()) and not args.debug:
            print(f"error: {_message(err)}", file=sys.stderr)
            return 2
        raise


def _interrupted(err: BaseException) -> int:
    if was_terminated(err):
        print("error: terminated", file=sys.stderr)
        return _TERMINATED
    print("error: interrupted", file=sys.stderr)
    return _INTERRUPTED


def _interruptible(argv: Sequence[str], start: Callable[[], int]) -> int:
    """``start()``, with a Ctrl-C before the command runs (while its modules, torch among them, are
    imported, or its arguments parsed) ending as one during the run does, and a SIGTERM as a Ctrl-C."""
    try:
        with sigterm_as_interruption():
            return start()
    except KeyboardInterrupt as err:
        if _asks_for_debug(argv):  # not parsed yet, maybe
            raise
        return _interrupted(err)


def _asks_for_debug(argv: Sequence[str]) -> bool:
    """Whether ``argv`` gives ``--debug``, as argparse will read it: whole or abbreviated (``--deb``), up to a
    ``--``, after which every argument is a positional one.

    argparse takes any prefix of an option that no other option of the command starts with. The shortest
    one is ``--d`` for a command with no other ``--d...`` option, ``--deb`` beside ``--device``; where a
    shorter prefix is ambiguous argparse refuses the command line, so counting each prefix of ``--debug``
    past the dashes agrees with argparse on each line it accepts, and needs the options of no command
    (importing them is what a Ctrl-C here interrupts). ``--debug=...`` is refused by argparse: the flag
    takes no value.
    """
    for arg in argv:
        if arg == "--":
            return False
        if len(arg) > 2 and "--debug".startswith(arg):
            return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """``detens COMMAND [options]``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def start() -> int:
        wanted = [argv[0]] if argv and argv[0] in COMMANDS else None  # import only the command that runs
        if wanted is None:  # help or a mistake, but for a rare spelling such as `detens -- fuse`
            build_parser(with_options=False).parse_args(argv)
        args = build_parser(wanted).parse_args(argv)
        args._command_line = ["detens", *argv]  # for outputs that record how they were made
        return _dispatch(args)

    return _interruptible(argv, start)


def command_parser(command: str, prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of one subcommand on its own (``prog`` default: ``detens <command>``)."""
    module = importlib.import_module(COMMANDS[command][0])
    return _add_command(_Parser(prog=prog or f"detens {command}", **_command_texts(module)), module)


def run_command(command: str, argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """One subcommand with its own argv, as the ``tools/<command>.py`` scripts call it."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def start() -> int:
        parser = command_parser(command, prog)
        args = parser.parse_args(argv)
        args._command_line = [*parser.prog.split(), *argv]  # for outputs that record how they were made
        return _dispatch(args)

    return _interruptible(argv, start)
