"""How a ``posenc`` command ends when something goes wrong: the one owner of the CLI's error policy.

    bad input (PosencError: ConfigError, DataError, CheckpointError, ...)  one line, exit 2
    the environment refused (OSError: read-only or missing --out, no space)  one line naming the path, exit 2
    a closed pipe (``posenc pick ... | head``)                              quiet, exit 141 (128 + SIGPIPE)
    Ctrl-C                                                                   one line, exit 130
    SIGTERM: unwinds as Ctrl-C does (temporaries removed; posenc lab writes  one line, exit 143
    its finished results first)
    an optional package missing (transformers for export / eval)            one line naming the extra, exit 2
    a warning (a suspicious but usable value)                                one line "posenc CMD: warning: ...", once
    out of memory                                                            one line, exit 1
    anything else is a bug in posenc: one line saying so, the traceback saved to a file to attach to a report, exit 1

A bad-input message names the flag to change ("--eval-tokens must be ...") where the library's own message names
the setting ("eval_tokens must be ..."): ``flag_names`` / ``to_flags``, applied by the commands.

Only posenc's own PosencError family is "your input": a stray ValueError or KeyError from deep inside is a bug, and
calling it user error would send the user hunting for a mistake they did not make.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import traceback
import warnings
from collections.abc import Mapping
from typing import Callable

ISSUES_HINT = "please report it (the command line and the saved traceback) to the posenc maintainers"
EXIT_USER = 2
EXIT_BUG = 1
EXIT_PIPE = 141
# optional packages -> the pyproject extra that installs them (a command needing one says how to get it)
# package -> the set-up that installs it (an extra and a scripts/setup.sh set; peft's own extra, finetune, has no set)
OPTIONAL_PACKAGES = {"transformers": "hf", "tokenizers": "hf", "rotary_embedding_torch": "bench", "torchtune": "bench",
                     "peft": "test"}


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error: "posenc lab: error: argument --steps: invalid int value: 'x' (see ...)".

    No abbreviations (``allow_abbrev=False``, for every command and subcommand: subparsers are this class too):
    ``posenc search MODEL --check x`` must not be taken as ``--checkpoint x``, and a flag added later must not change
    what an existing command line means."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_USER, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def flag_names(parser: argparse.ArgumentParser, aliases: Mapping[str, str] | None = None) -> dict[str, str]:
    """Setting name -> the flag that sets it ("eval_tokens" -> "--eval-tokens"): each long option of ``parser``
    by its destination, then ``aliases`` (other names the library's messages cite, e.g. "replace_scaling")."""
    names: dict[str, str] = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest != "help":
            names.setdefault(action.dest, longs[0])
    for name, flag in (aliases or {}).items():
        names.setdefault(name, flag)
    return names


def to_flags(message: str, names: Mapping[str, str]) -> str:
    """A library message with setting names replaced by the command's flags ("d_model must" -> "--d-model must").

    Names with an underscore are replaced wherever they stand as a word; plain-word names (tasks, data, ...) only
    where they open the message or a "name/name:" list, so ordinary words in the text stay; a name the message
    follows with its flag ("out_config PATH (--out): ...") stays. Idempotent.
    """
    def swap(match: re.Match) -> str:
        name = match.group(0)
        flag = names.get(name)
        if flag is None or re.match(r"\s+(?:\S+\s+)?\(" + re.escape(flag) + r"\)", message[match.end():]):
            return name
        return flag

    # not inside a path, an attribute, a flag or a call: "/tmp/eval_tokens.txt", "cfg.eval_tokens", "f_x()"
    out = re.sub(r"(?<![\w./\\-])[a-z]+_[a-z_]+(?![\w(/\\]|\.\w)", swap, message)
    return re.sub(r"^[a-z]+(?=:|/| must)", swap, out)


@contextlib.contextmanager
def errors_name_flags(flags: Mapping[str, str]):
    """Inside this block a PosencError's message names flags instead of settings (``to_flags``), for commands
    that parse their own arguments below posenc.cli (``posenc search``, ``posenc lab``)."""
    from posenc._internal.errors import PosencError

    try:
        yield
    except PosencError as exc:
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (to_flags(exc.args[0], flags), *exc.args[1:])
        raise


def describe_os_error(exc: OSError) -> str:
    """'cannot write /ro/out/results.json: Permission denied' style text for an OSError."""
    what = exc.strerror or type(exc).__name__
    if exc.filename is None and exc.strerror:  # already a sentence ("cannot write runs/x/results.json: ...")
        return exc.strerror
    if exc.filename is not None:
        where = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
        return f"{where}: {what}"
    return str(exc) or what


def save_traceback(exc: BaseException) -> str | None:
    """Write the traceback of ``exc`` to a temporary file; -> its path (None if even that fails)."""
    try:
        fd, path = tempfile.mkstemp(prefix="posenc-bug-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write("posenc " + " ".join(sys.argv[1:]) + "\n\n")
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=f)
        return path
    except OSError:
        return None


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def run_reporting_faults(command: str, fn: Callable[[], int | None], flags: Mapping[str, str] | None = None) -> int:
    """Run ``fn()`` for ``posenc COMMAND`` and turn every fault into its one-line message and exit status.
    ``flags`` (``flag_names``): setting names in bad-input messages are shown as the flags that set them."""
    prefix = f"posenc {command}"
    shown_warning = warnings.showwarning
    warnings.showwarning = one_line_warnings(prefix)
    try:
        return _run(prefix, fn, flags)
    finally:
        warnings.showwarning = shown_warning


def one_line_warnings(prefix: str):
    """A ``warnings.showwarning`` printing "posenc CMD: warning: text" once per text (no file path or source line:
    the user did not write the line that warned)."""
    seen: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        if text not in seen:
            seen.add(text)
            print(f"{prefix}: warning: {text}", file=sys.stderr if file is None else file)

    return show


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, ``timeout``, ``kill``) raised in the main thread like Ctrl-C, so that what cleans up
    after an interrupt runs (the lab writes its finished results); the command exits 143."""


@contextlib.contextmanager
def sigterm_raises():
    """Inside this block (main thread only) SIGTERM raises ``Terminated`` instead of ending the process at once."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        SIGNAL_SEEN.set()
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# Set by posenc's Python-level SIGINT / SIGTERM handlers when they run: the watchdog of ``signals_stop_c_calls``
# knows from it that the main thread got the signal (and is cleaning up), not stuck inside one long C call.
SIGNAL_SEEN = None  # a threading.Event, made on first use
# seconds a signal may wait for the main thread to reach Python before the process ends without cleaning up
SIGNAL_GRACE_S = 5.0


def _signal_seen():
    global SIGNAL_SEEN
    if SIGNAL_SEEN is None:
        import threading

        SIGNAL_SEEN = threading.Event()
    return SIGNAL_SEEN


@contextlib.contextmanager
def signals_stop_c_calls(prefix: str, grace_s: float | None = None):
    """Inside this block (main thread only) Ctrl-C and SIGTERM stop the command even inside one long C call.

    Python runs a signal handler only between bytecodes, so a single long torch call (attention over a million
    tokens, a huge matmul) would hold both signals until it returns -- minutes or hours. A watcher thread learns of
    each signal at once (``signal.set_wakeup_fd``); when the main thread has not run its handler ``grace_s``
    seconds later, the watcher prints one line and ends the process (exit 130 for Ctrl-C, 143 for SIGTERM).
    What was written before (checkpoints, atomic results) stays; nothing is left half-written, since every result
    file is replaced atomically and the watcher deletes the temporaries of writes in progress first. A handler that
    runs in time (the usual case: Python between steps) cleans up as before.
    """
    import signal
    import socket
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    grace = SIGNAL_GRACE_S if grace_s is None else grace_s
    seen = _signal_seen()
    seen.clear()
    reader, writer = socket.socketpair()
    reader.settimeout(None)
    writer.setblocking(False)
    try:
        previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except (ValueError, OSError):
        reader.close(), writer.close()
        yield
        return
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        def on_int(signum, frame):
            seen.set()
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, on_int)

    def watch():
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in (signal.SIGINT, signal.SIGTERM):
                    continue
                if seen.wait(grace):
                    seen.clear()
                    continue
                terminated = signum == signal.SIGTERM
                try:
                    _remove_temporaries()
                    sys.stderr.write(f"{prefix}: {'terminated' if terminated else 'interrupted'} inside a long "
                                     f"computation that did not return within {grace:g} s; stopped at once "
                                     "(files written before stay; unfinished writes are removed)\n")
                    sys.stderr.flush()
                finally:
                    os._exit(143 if terminated else 130)

    watcher = threading.Thread(target=watch, name="posenc-signal-watchdog", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        if signal.getsignal(signal.SIGINT) is not previous_int and previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)
        writer.close()
        try:
            reader.close()
        except OSError:
            pass
        watcher.join(timeout=1.0)


def _remove_temporaries() -> None:
    """Delete the temporary files and folders of writes in progress (posenc._internal.atomic), when the process is about to
    end without unwinding: a half-written model folder must not stay behind, looking like a model."""
    atomic = sys.modules.get("posenc._internal.atomic")
    if atomic is not None:
        try:
            atomic.remove_pending_temporaries()
        except Exception:  # (ending the process matters more than a temporary left over)
            pass


def _run(prefix: str, fn: Callable[[], int | None], flags: Mapping[str, str] | None = None) -> int:
    from posenc._internal.errors import PosencError

    try:
        # SIGTERM unwinds like Ctrl-C (every command's temporaries are removed on the way out), exit 143
        with signals_stop_c_calls(prefix), sigterm_raises():
            status = int(fn() or 0)
        sys.stdout.flush()  # a closed pipe shows up here for short outputs
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_PIPE
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print(f"{prefix}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except PosencError as exc:
        print(f"{prefix}: error: {to_flags(str(exc), flags) if flags else exc}", file=sys.stderr)
        return EXIT_USER
    except OSError as exc:  # the environment: permissions, missing folders, a file where a folder should be
        print(f"{prefix}: error: {describe_os_error(exc)}", file=sys.stderr)
        return EXIT_USER
    except ModuleNotFoundError as exc:
        package = (exc.name or "").split(".")[0]
        if package not in OPTIONAL_PACKAGES:
            return _report_bug(prefix, exc)
        extra = OPTIONAL_PACKAGES[package]
        print(f"{prefix}: error: this command needs the optional package {package!r}, which is not installed: "
              f"pip install -e \".[{extra}]\" in the checkout (or bash scripts/setup.sh {extra})", file=sys.stderr)
        return EXIT_USER
    except MemoryError:
        print(f"{prefix}: error: out of memory (use smaller sizes or lengths)", file=sys.stderr)
        return EXIT_BUG
    except SystemExit as exc:  # sys.exit() in a plug-in's hook: name it; posenc's own exits pass through
        blamed = _plugin_fault(exc)
        if blamed is None:
            raise
        print(f"{prefix}: error: {blamed}", file=sys.stderr)
        return EXIT_USER
    except Exception as exc:  # a bug (posenc's, or a plug-in's: then named), and keep the traceback for the report
        blamed = _plugin_fault(exc)
        if blamed is not None:
            path = save_traceback(exc)
            print(f"{prefix}: error: {blamed}" + (f"; traceback saved to {path}" if path else ""), file=sys.stderr)
            return EXIT_USER
        size = allocation_failure(exc)
        if size is not None:   # torch's allocators raise RuntimeError (torch.OutOfMemoryError on CUDA), not MemoryError
            print(f"{prefix}: error: out of memory{size} (use smaller sizes or lengths)", file=sys.stderr)
            return EXIT_BUG
        return _report_bug(prefix, exc)


def allocation_failure(exc: BaseException) -> str | None:
    """" (tried to allocate 7.5 GiB)" (or "") when ``exc`` is torch's failure to allocate memory; else None."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or not ("can't allocate memory" in text or "out of memory" in text.lower()
                                                 or type(exc).__name__ == "OutOfMemoryError"):
        return None
    match = re.search(r"allocate (\d+) bytes", text) or re.search(r"allocate ([\d.]+ [KMGT]i?B)", text)
    if match is None:
        return ""
    amount = match.group(1)
    shown = f"{int(amount) / 2**30:.1f} GiB" if amount.isdigit() else amount
    return f" (tried to allocate {shown})"


def _plugin_fault(exc: BaseException) -> str | None:
    """posenc._internal.plugins.plugin_fault, when plug-ins were loaded (no import otherwise)."""
    plugins = sys.modules.get("posenc._internal.plugins")
    return plugins.plugin_fault(exc) if plugins is not None else None


def _report_bug(prefix: str, exc: BaseException) -> int:
    path = save_traceback(exc)
    saved = f"; traceback saved to {path}" if path else ""
    text = " ".join(str(exc).split())[:300]
    print(f"{prefix}: internal error (a bug in posenc, not in your input): {type(exc).__name__}: {text}"
          f"{saved}; {ISSUES_HINT}", file=sys.stderr)
    return EXIT_BUG
