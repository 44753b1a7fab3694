"""Run one ``posenc`` subcommand of this package on its own (``export_main``, ``eval_main``), with the same contract
as posenc.cli: bad input is one ``posenc NAME: error: ...`` line on stderr and exit status 2, never a traceback.

The modules also expose ``HELP``, ``add_arguments(parser)`` and ``run(args)``, the shape posenc.cli's COMMANDS table
takes, so ``posenc export`` / ``posenc eval`` are one line each there.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable


def run_command(name: str, add_arguments: Callable, run: Callable, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"posenc {name}")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return int(run(args) or 0)
    except KeyboardInterrupt:
        print("posenc: interrupted", file=sys.stderr)
        return 130
    except (ValueError, KeyError, FileNotFoundError, IsADirectoryError, PermissionError,
            json.JSONDecodeError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"posenc {name}: error: {msg}", file=sys.stderr)
        return 2
