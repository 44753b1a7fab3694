"""Byte-level data for the lab: the default corpus, the train/validation split, and the LM sampler.

Default corpus: the CPython standard library's own .py files (found via sysconfig, nothing downloaded), without
test suites, site-packages and caches. Files are sorted by relative path; a file goes to validation when the
first byte of sha256(relative path) is < 26 (about 10%), so the split does not depend on file order or count.
``--data PATH`` takes a text file (split 90/10 by bytes) or a folder (every regular non-hidden file, same
hash rule). Documents are joined with a blank line. Tokens are bytes, held as uint8 tensors. A user's data must be
text: UTF-8 with at most 1% control bytes (other than tab, newline, carriage return and form feed) per file, so a
binary file given by mistake is refused by name instead of trained on.

Samplers (this LM one and the tasks' episode samplers, posenc/lab/tasks/) draw batch ``step`` from
``batch_generator(seed, step)`` alone, so every scheme sees the same data
in the same order, a resumed run continues the same stream, and a distributed rank can take its rows
``rank::world_size`` of the same global batch.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch

from posenc._internal.errors import DataError

EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
VAL_HASH_THRESHOLD = 26  # first sha256 byte < 26 -> validation (~10.2%)
DOC_SEPARATOR = b"\n\n"
IGNORE = -100  # target value that the loss skips
MAX_CONTROL_FRACTION = 0.01  # more control bytes than this in a file: not text
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\r\f") + b"\x7f"


@dataclass
class Corpus:
    """train, val: uint8 tensors of bytes; meta: provenance recorded with every result."""

    train: torch.Tensor
    val: torch.Tensor
    meta: dict = field(default_factory=dict)


def stdlib_files(root: Path | None = None) -> tuple[Path, list[Path]]:
    """-> (stdlib root, sorted relative paths of its .py files outside test dirs and site-packages)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p.relative_to(root) for p in root.rglob("*.py")
                   if p.is_file() and not EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1]))
    return root, files


def _is_val(rel: Path) -> bool:
    return hashlib.sha256(rel.as_posix().encode()).digest()[0] < VAL_HASH_THRESHOLD


def _files_hash(root: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for rel in files:
        h.update(f"{rel.as_posix()}\0{(root / rel).stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def check_text(data: bytes, where) -> bytes:
    """``data`` if it is text (valid UTF-8, at most MAX_CONTROL_FRACTION control bytes), else DataError naming
    ``where`` and the first offending byte."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"data: {where} is not text: not valid UTF-8 at byte {exc.start} (byte "
                        f"0x{data[exc.start]:02x}); give UTF-8 text (convert with iconv) or a folder of text files"
                        ) from None
    control = len(data) - len(data.translate(None, _CONTROL))
    if control > MAX_CONTROL_FRACTION * len(data):
        raise DataError(f"data: {where} is not text: {control} of {len(data)} bytes are control characters "
                        f"(more than {MAX_CONTROL_FRACTION:.0%}); give UTF-8 text")
    return data


def _read_bytes(path: Path) -> bytes:
    """The bytes of ``path``, or DataError naming it (an unreadable file is the data setting's fault)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"data: cannot read {path}: {exc.strerror or exc}") from None


def _read(root: Path, rel: Path, check: bool) -> bytes:
    data = _read_bytes(root / rel)
    return check_text(data, root / rel) if check else data


def _join(root: Path, files: list[Path], check: bool = False) -> torch.Tensor:
    data = DOC_SEPARATOR.join(_read(root, rel, check) for rel in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


@functools.lru_cache(maxsize=4)
def load_corpus(data: str | None = None) -> Corpus:
    """Load the default stdlib corpus (data None) or a user's file/folder. Raises DataError naming the path."""
    path = data
    if path is None:
        root, files = stdlib_files()
        source = "cpython-stdlib"
        if not files:
            raise DataError(f"data: no .py files found in the standard library at {root}; "
                            "give data as a file or folder of text")
    else:
        p = Path(path).expanduser()
        if not p.exists():
            raise DataError(f"data: {path} does not exist (expected a text file or a folder of text files)")
        if not p.is_file() and not p.is_dir():   # reading /dev/zero or a pipe would never end
            raise DataError(f"data: {path} is not a regular file or a folder (a device, a pipe or a socket); "
                            "expected a text file or a folder of text files")
        if p.is_file():
            data = _read_bytes(p)
            if not data.strip():
                raise DataError(f"data: {path} is empty")
            check_text(data, path)
            cut = int(len(data) * 0.9)
            tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            meta = {"source": str(p.resolve()), "n_files": 1,
                    "files_sha256": hashlib.sha256(data).hexdigest()[:16], "split": "last 10% of bytes"}
            return _finish(tokens[:cut].clone(), tokens[cut:].clone(), meta)
        root, source = p, str(p.resolve())
        files = sorted(q.relative_to(p) for q in p.rglob("*")
                       if q.is_file() and not any(part.startswith(".") for part in q.relative_to(p).parts))
        if not files:
            raise DataError(f"data: the folder {path} holds no files")
    val_files = [f for f in files if _is_val(f)]
    train_files = [f for f in files if not _is_val(f)]
    meta = {"source": source, "n_files": len(files), "n_val_files": len(val_files),
            "files_sha256": _files_hash(root, files), "split": f"sha256(relative path)[0] < {VAL_HASH_THRESHOLD}"}
    if not val_files or not train_files:  # too few files for the hash rule: split the bytes instead
        tokens = _join(root, files, check=path is not None)
        cut = int(len(tokens) * 0.9)
        meta["split"] = "last 10% of bytes"
        return _finish(tokens[:cut].clone(), tokens[cut:].clone(), meta, path)
    check = path is not None  # the stdlib is text; a user's folder is checked file by file
    return _finish(_join(root, train_files, check), _join(root, val_files, check), meta, path)


def _finish(train: torch.Tensor, val: torch.Tensor, meta: dict, path=None) -> Corpus:
    if len(train) == 0 or len(val) == 0:
        raise DataError(f"data: {path or 'the standard library'} holds no text (train {len(train)} bytes, "
                        f"validation {len(val)} bytes)")
    meta.update(python_version=sys.version.split()[0], train_bytes=len(train), val_bytes=len(val))
    return Corpus(train, val, meta)


def batch_generator(seed: int, step: int) -> torch.Generator:
    """The random stream of batch ``step`` under ``seed``: every sampler draws from it and nothing else."""
    # one independent stream per (seed, step): order is fixed per seed and resumable from any step
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(step)) % (2**63 - 1))


class LMSampler:
    """Random windows of a token stream. batch(step) -> (inputs [B, T] long, targets [B, T] long)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch_size: int, seed: int):
        if len(tokens) < seq_len + 2:
            raise DataError(f"seq_len: {seq_len} needs more than {seq_len + 1} training bytes; "
                            f"the corpus has {len(tokens)}")
        self.tokens, self.seq_len, self.batch_size, self.seed = tokens, seq_len, batch_size, seed

    def batch(self, step: int, rank: int = 0, world_size: int = 1):
        starts = torch.randint(0, len(self.tokens) - self.seq_len - 1, (self.batch_size,),
                               generator=batch_generator(self.seed, step))[rank::world_size]
        idx = starts[:, None] + torch.arange(self.seq_len + 1)
        window = self.tokens[idx].long()
        return window[:, :-1], window[:, 1:]
