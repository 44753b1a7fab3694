"""The ``posenc`` command: one entry point, one subcommand per module.

Each subcommand module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Bad input surfaces as a one-line ``posenc COMMAND: error: ...`` and exit status 2, never a traceback; the whole
policy (bugs, closed pipes, OS errors) is ``posenc._internal.faults``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from posenc._internal.faults import Parser, flag_names, run_reporting_faults

# subcommand -> module implementing it
COMMANDS = {
    "check": "posenc.tools.check",
    "lab": "posenc.lab.cli",
    "plot": "posenc.tools.plot",
    "inspect": "posenc.tools.inspect",
    "extend": "posenc.tools.extend",
    "search": "posenc.hf.search_command",
    "pick": "posenc.tools.pick",
    "export": "posenc.hf.export",
    "eval": "posenc.hf.eval.command",
    "convert": "posenc.hf.gguf",
    "audit": "posenc.tools.audit",
    "tune": "posenc.hf.tune.command",
    "finetune": "posenc.finetune.command",
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="posenc", description="Positional encodings for transformers.")
    parser.add_argument("--version", action="version", version=f"posenc {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.commands = {}        # name -> its parser: errors about its arguments carry its name
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a subcommand whose module is not built yet
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        parser.commands[name] = p
        module.add_arguments(p)
        # a module with FLAG_ALIASES has its messages' setting names shown as its flags
        aliases = getattr(module, "FLAG_ALIASES", None)
        p.set_defaults(_run=module.run, _flags=None if aliases is None else flag_names(p, aliases))
    return parser


def _version() -> str:
    from posenc import __version__

    return __version__


def _plugins_named(argv: list[str]) -> list[str]:
    """The ``--plugin`` values of a command line (``--plugin X`` and ``--plugin=X``)."""
    out = []
    for i, arg in enumerate(argv):
        if arg == "--plugin" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith("--plugin="):
            out.append(arg.split("=", 1)[1])
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    plugins = _plugins_named(argv)
    if plugins and argv[0] in COMMANDS:
        # imported before the parser is built, so that the settings a plug-in's tasks and methods declare get
        # their own flags (--repeat-rows), as built-in ones do; the command imports them again at no cost
        from posenc._internal.plugins import load_plugins

        def load() -> int:
            load_plugins(plugins)
            return 0

        status = run_reporting_faults(argv[0], load, flags={"plugin": "--plugin"})
        if status:
            return status
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:   # "posenc check: error: unrecognized arguments: x", not the top-level "posenc: error"
            parser.commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help, --version, or a malformed flag (one line printed): the status, not a raise
        return exc.code if isinstance(exc.code, int) else 2
    # the raw command line, for subcommands that re-launch themselves (posenc lab --nproc N under torchrun)
    args.argv = argv
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    return run_reporting_faults(args.command, lambda: _run_naming_metadata(args), flags=args._flags)


def _run_naming_metadata(args) -> int | None:
    """``args._run(args)``; when the model's config is a GGUF file's metadata (``posenc inspect/extend/pick MODEL.gguf``,
    ``posenc eval/search/convert MODEL.gguf`` without --config), bad-input messages name its metadata keys
    (posenc.gguf.errors_name_metadata), not config.json's."""
    config, model = getattr(args, "config", None), getattr(args, "model", None)
    source = config if isinstance(config, str) else model if config is None and isinstance(model, str) else None
    if source is None or not source.lower().endswith(".gguf"):
        return args._run(args)
    from posenc.gguf import errors_name_metadata

    with errors_name_metadata(source):
        return args._run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
