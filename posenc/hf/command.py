"""Run one ``posenc`` subcommand of this package on its own (``export_main``, ``eval_main``), with the same contract
as posenc.cli: bad input is one ``posenc NAME: error: ...`` line on stderr and exit status 2, never a traceback.

The modules also expose ``HELP``, ``add_arguments(parser)`` and ``run(args)``, the shape posenc.cli's COMMANDS table
takes, so ``posenc export`` / ``posenc eval`` are one line each there.
"""

from __future__ import annotations

from typing import Callable

from posenc._internal.faults import Parser, flag_names, run_reporting_faults


def run_command(name: str, add_arguments: Callable, run: Callable, argv: list[str] | None = None,
                flag_aliases: dict[str, str] | None = None) -> int:
    """``flag_aliases``: as a module's FLAG_ALIASES in posenc.cli (messages name flags, not settings)."""
    parser = Parser(prog=f"posenc {name}")
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:   # --help (0) or a usage error (2, already printed as one line): a status, not a raise
        return exc.code if isinstance(exc.code, int) else 2
    flags = None if flag_aliases is None else flag_names(parser, flag_aliases)
    return run_reporting_faults(name, lambda: run(args), flags=flags)
