"""Atomic writes: write a temporary sibling (a file, or a folder for a model), then ``os.replace`` it over the target.

An interrupted run never leaves a half-written results file, plot, config or model folder. What lands gets the
modes a plain ``open()`` / ``mkdir`` would give (0666 / 0777 less the process umask): mkstemp and mkdtemp make
their temporaries private (0600 / 0700), and writers such as transformers' ``save_pretrained`` may too.

Every temporary in progress is registered (``pending_temporaries``): Ctrl-C and SIGTERM remove it as the write
unwinds, and when the main thread is stuck in one long C call, posenc._internal.faults' watcher removes what is registered
before it ends the process. A temporary left by a killed writer (SIGKILL) is removed by the next write to the same
path.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from posenc._internal.errors import ConfigError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0666 less the umask."""
    return 0o666 & ~_umask()


# temporaries being written by this process (files and folders), removed when a signal ends it
_PENDING: dict[str, None] = {}


def pending_temporaries() -> list[Path]:
    """The temporary files and folders this process is writing now."""
    return [Path(p) for p in list(_PENDING)]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def remove_pending_temporaries() -> None:
    """Delete every temporary in progress: for a process about to end without unwinding (posenc._internal.faults' watcher)."""
    for path in pending_temporaries():
        _remove(path)
        _PENDING.pop(str(path), None)


@contextlib.contextmanager
def _registered(tmp: str | os.PathLike) -> Iterator[None]:
    """``tmp`` is registered while the block runs; on an exception or signal it is deleted."""
    _PENDING[str(tmp)] = None
    try:
        yield
    except BaseException:
        _remove(Path(tmp))
        raise
    finally:
        _PENDING.pop(str(tmp), None)


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

    Temporaries (files and folders) are named ``.<name>.<pid>.<random>.tmp<suffix>``: one whose pid no longer runs
    is stale.
    """
    path = Path(path)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)\.[^.]+\.tmp")
    removed = []
    with contextlib.suppress(OSError):
        for sibling in path.parent.iterdir():
            m = pattern.match(sibling.name)
            if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
                _remove(sibling)
                if not os.path.lexists(sibling):
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

    For writers that need a file name (matplotlib's savefig, safetensors). ``mode`` defaults to ``file_mode()``.
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
    with _registered(tmp):
        yield Path(tmp)
        os.chmod(tmp, file_mode() if mode is None else mode)
        os.replace(tmp, path)


def _normal_modes(folder: Path) -> None:
    """Give ``folder``, its subfolders and files the modes ``mkdir`` and ``open()`` would (0777 / 0666 less the
    umask; a file its writer made executable keeps that for the owner's x bits)."""
    umask = _umask()
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o777 & ~umask)
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                executable = os.stat(p).st_mode & 0o111
                os.chmod(p, (0o777 if executable else 0o666) & ~umask)


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a new temporary folder beside ``path`` to fill; on success it gets ordinary modes and replaces
    ``path`` (an existing folder or file there is removed only once the new folder is in place); on an error, Ctrl-C
    or SIGTERM it is deleted. The caller has checked ``path`` (posenc._internal.outputs.check_output) and its parent."""
    path = Path(path)
    remove_stale_temporaries(path)
    try:
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp"))
    except OSError as exc:  # name the folder the user asked for, not our temporary
        raise type(exc)(exc.errno, f"cannot write {path}: {exc.strerror}") from None
    with _registered(tmp):
        yield tmp
        _normal_modes(tmp)
        if not os.path.lexists(path):
            os.replace(tmp, path)
            return
        old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp.old"))
        try:
            os.replace(path, old / "x")
            os.replace(tmp, path)
        except BaseException:           # (a signal between the two moves included)
            if os.path.lexists(old / "x") and not os.path.lexists(path):
                os.replace(old / "x", path)     # the old one back: nothing is lost
            shutil.rmtree(old, ignore_errors=True)
            raise
    with _registered(old):          # (a signal while it is deleted: deleted all the same)
        shutil.rmtree(old, ignore_errors=True)


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
