"""``gpudash`` command line. Each subcommand lives in its own module, imported
only when that command runs, so ``gpudash info`` never imports torch or dash.

A command module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
Errors the user can cause (:class:`UserError`, :class:`RunError`, bad flags)
print one line and exit 2; nothing prints a traceback unless GPUDASH_DEBUG=1.
Output into a pipe that closes early (``gpudash info --json | head -1``) ends quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, NoReturn

from gpudash._version import __version__
from gpudash.errors import RunError, UserError
from gpudash.terminal import printable

__all__ = ["COMMANDS", "main"]

#: command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("gpudash.commands.demo", "train the tiny preset with the live dashboard beside it"),
    "run": ("gpudash.commands.run", "run a training script unchanged, recorded (gpudash run -- python train.py)"),
    "train": ("gpudash.commands.train", "run the memory-optimized GPT trainer under the Monitor"),
    "estimate": ("gpudash.commands.estimate", "predict memory by category and what fits a card"),
    "serve": ("gpudash.commands.serve", "serve the dashboard for a directory of runs"),
    "check": ("gpudash.commands.check", "gate a run in CI: exit 1 when it breaks a rule (peak, step time, NaN, OOM, spikes)"),
    "info": ("gpudash.commands.info", "print a run's status and summary in the terminal"),
    "report": ("gpudash.commands.report", "write a post-mortem report (html or md)"),
    "export": ("gpudash.commands.export", "export a run's tables to parquet or csv"),
    "import-snapshot": ("gpudash.commands.import_snapshot", "store a torch memory snapshot pickle in a run"),
    "diff-snapshots": ("gpudash.commands.diff_snapshots", "what grew between two snapshots, by frame"),
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (UserError), not usage + error."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see `{self.prog} --help`)")


def _module(command: str) -> Any:
    return importlib.import_module(COMMANDS[command][0])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="gpudash", description="Live GPU memory and throughput dashboard.")
    parser.add_argument("--version", action="version", version=f"gpudash {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or name == only:
            try:
                _module(name).add_arguments(p)
            except ImportError as exc:
                if name == only:
                    raise UserError(f"'{name}' needs a module that is not installed ({exc.name}); "
                                    "install gpudash with its extras: pip install 'gpudash[train]'") from exc
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        parser = build_parser(only)
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 0
        rc = int(_module(args.command).run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return rc
    except BrokenPipeError:  # `gpudash ... | head`: the reader has what it wanted; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool stopped by a closed pipe
    except (UserError, RunError) as exc:
        if os.environ.get("GPUDASH_DEBUG"):
            raise
        print(f"gpudash: error: {printable(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpudash: interrupted", file=sys.stderr)
        return 130
    except MemoryError:  # what the readers' bounds did not catch: still one line, no traceback
        if os.environ.get("GPUDASH_DEBUG"):
            raise
        print("gpudash: error: ran out of memory (a damaged run? 'gpudash info RUN' names what it could not read)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
