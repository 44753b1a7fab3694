"""Atomic file writes: write a temporary sibling, then ``os.replace`` it over the target.

An interrupted run never leaves a half-written results file, plot or config. Files get mode 0644 less the
process umask (mkstemp alone would leave them 0600).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from posenc.errors import ConfigError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def pid_alive(pid: int) -> bool:
    """True if process ``pid`` exists on this machine (or we cannot tell: then its files are kept)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists but not ours, or we cannot tell: keep its file
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete temporaries of ``path`` left by a killed writer (SIGKILL skips cleanup); returns what was removed.

    Temporaries are named ``.<name>.<pid>.<random>.tmp<suffix>``: one whose pid no longer runs is stale.
    """
    path = Path(path)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)\.[^.]+\.tmp")
    removed = []
    with contextlib.suppress(OSError):
        for sibling in path.parent.iterdir():
            m = pattern.match(sibling.name)
            if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
                with contextlib.suppress(OSError):
                    sibling.unlink()
                    removed.append(sibling)
    return removed


def check_writable_folder(folder: str | os.PathLike, what: str) -> None:
    """ConfigError naming ``what`` (e.g. "out runs/x (--out)") unless files can be created in ``folder``, or in its
    nearest existing ancestor when it does not exist yet (the writer makes the missing folders). Probed with a
    temporary folder that is removed at once: nothing is left behind, and an unwritable place is reported before
    any long work rather than, after it, as a temporary file's name."""
    base = Path(os.path.abspath(folder))
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise ConfigError(f"{what}: {base} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(dir=base, prefix=".posenc-probe."))
    except OSError as exc:
        raise ConfigError(f"{what}: cannot create files in {base} ({exc.strerror or type(exc).__name__})") from None


def _regular_target(path: Path) -> Path:
    """The file a write to ``path`` replaces: a symlink's target (the link stays a link), never a folder, FIFO,
    device or socket (``os.replace`` would silently swap such a node for a plain file: ``--out /dev/null`` as root
    would replace the device)."""
    if path.is_symlink():
        path = path.resolve()
    try:
        st = path.stat()
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot write {path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, f"cannot write {path}: it is a folder; give a file name")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device")
        raise OSError(errno.EINVAL, f"cannot write {path}: it is {kind}, not a regular file; give a file path")
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, make_parents: bool = True, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success move it into place, on error delete it.

    For writers that need a file name (matplotlib's savefig, safetensors). ``mode`` defaults to 0644 & ~umask.
    """
    path = _regular_target(Path(path))
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp" + path.suffix)
    except OSError as exc:  # name the file the user asked for, not our temporary
        raise type(exc)(exc.errno, f"cannot write {path}: {exc.strerror}") from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, (0o644 & ~_umask()) if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes, **kwargs) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_path(path, **kwargs) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str, **kwargs) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), **kwargs)


def atomic_write_json(path: str | os.PathLike, obj, **kwargs) -> Path:
    """Indented JSON; NaN/inf are refused (not valid JSON)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n", **kwargs)
