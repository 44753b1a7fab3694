"""One job per output folder: ``with out_lock(out, command): ...`` holds ``out/.posenc-lock`` while a lab run writes.

Two runs into one ``--out`` would overwrite each other's results, report and checkpoints (last writer wins), so the
second is refused with the holder's pid, host, start time and command. The lock file is created complete and
atomically (written to a temporary name, then hard-linked into place: a link fails if the name exists), so a reader
never sees half a lock. A lock whose pid no longer runs on this host (a SIGKILLed run) is stale and taken over; one
held from another host is never guessed at: the message says how to remove it by hand.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
from pathlib import Path

from posenc._internal.atomic import pid_alive
from posenc._internal.errors import PosencError

LOCK_NAME = ".posenc-lock"


class LockError(PosencError):
    """The output folder is in use by another run."""


def _holder(path: Path) -> dict | None:
    """The lock's content, or None when it is gone; an unreadable lock reads as {} (held, holder unknown)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        info = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return info if isinstance(info, dict) else {}


def _stale(info: dict) -> bool:
    """A lock of a pid that no longer runs on this host."""
    pid = info.get("pid")
    return (info.get("host") == socket.gethostname() and isinstance(pid, int) and pid != os.getpid()
            and not pid_alive(pid))


def describe(info: dict) -> str:
    if not info:
        return "an unknown process (the lock file is unreadable)"
    return (f"pid {info.get('pid')} on {info.get('host')} since {info.get('started')}: "
            f"{info.get('command') or '?'}")


def _place(tmp: Path, path: Path, text: str) -> None:
    """Create ``path`` with ``text`` unless it exists (FileExistsError): a hard link of the complete ``tmp``, or
    O_EXCL on filesystems without hard links."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)


def acquire(out: Path, command: str) -> Path:
    """Create ``out`` (if needed) and its lock; -> the lock path. LockError naming the holder if it is taken."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only place, a file in the way: say which folder, in one line
        raise type(exc)(exc.errno, f"cannot create the output folder {out}: {exc.strerror}") from None
    path = out / LOCK_NAME
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    tmp = out / f"{LOCK_NAME}.{os.getpid()}.tmp"
    text = json.dumps(mine) + "\n"
    try:
        tmp.write_text(text)
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot write in the output folder {out}: {exc.strerror}") from None
    try:
        for _ in range(3):  # a stale lock taken over; a second racer loses cleanly
            try:
                _place(tmp, path, text)
                return path
            except FileExistsError:
                pass
            info = _holder(path)
            if info is None:  # released meanwhile
                continue
            if not _stale(info):
                raise LockError(f"out: {out} is in use by another posenc run ({describe(info)}); wait for it to "
                                f"finish or use another --out (if that run is gone, delete {path})")
            moved = out / f"{LOCK_NAME}.stale.{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, moved)
                if _holder(moved) != info:  # a racer's fresh lock, not the stale one: put it back
                    with contextlib.suppress(FileExistsError):
                        os.link(moved, path)
                moved.unlink()
        raise LockError(f"out: {out}: could not take the lock {path} (other runs keep taking it)")
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def release(path: Path) -> None:
    """Remove the lock if it is still this process's."""
    info = _holder(path)
    if info and info.get("pid") == os.getpid() and info.get("host") == socket.gethostname():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def out_lock(out: Path, command: str):
    """Hold ``out``'s lock for the duration of the block (released on any exit)."""
    path = acquire(out, command)
    try:
        yield path
    finally:
        release(path)
