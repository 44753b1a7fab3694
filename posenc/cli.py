"""The ``posenc`` command: one entry point, one subcommand per module.

Each subcommand module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Bad input surfaces as a one-line ``posenc: error: ...`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# subcommand -> module implementing it
COMMANDS = {
    "check": "posenc.tools.check",
    "lab": "posenc.lab.cli",
    "plot": "posenc.tools.plot",
    "inspect": "posenc.tools.inspect",
    "extend": "posenc.tools.extend",
    "search": "posenc.search.cli",
    "pick": "posenc.tools.pick",
    "export": "posenc.hf.export",
    "eval": "posenc.hf.evaluate",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posenc", description="Positional encodings for transformers.")
    parser.add_argument("--version", action="version", version=f"posenc {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a subcommand whose module is not built yet
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def _version() -> str:
    from posenc import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # the raw command line, for subcommands that re-launch themselves (posenc lab --nproc N under torchrun)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("posenc: interrupted", file=sys.stderr)
        return 130
    except (ValueError, KeyError, FileNotFoundError, IsADirectoryError, PermissionError,
            json.JSONDecodeError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"posenc {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
