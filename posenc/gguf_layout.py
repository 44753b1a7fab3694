"""A GGUF file's layout, every size it claims checked against the bytes left in the file before it is read.

A GGUF file opens with two counts (tensors, metadata entries), and every string, array and tensor in it carries its
own length. A reader that trusts them turns a few hundred damaged bytes into an unbounded allocation (the ``gguf``
package's GGUFReader loops over as many items as an array claims, reading empty slices past the end of the file),
and a file cut short into a smaller model (a string cut by the end of the file reads as a shorter string).
``read_layout(path)`` walks the file once, memory-mapped (only the header's pages are touched, the weights stay on
disk), and refuses in one line naming the file and the entry (ConfigError):

- a count or length that cannot fit the bytes left: "model.gguf: metadata array 'x' claims 1099511627776 items
  but only 120 bytes remain (the file is truncated or damaged)";
- a string (key, value, tensor name) that is not UTF-8;
- a value type, tensor type or dimension count GGUF does not define; arrays nested past ``MAX_NESTING``;
  a key or tensor name given twice; a ``general.alignment`` that is not a power of two;
- a tensor whose data would run past the end of the file, or whose row is not a whole number of its
  quantization's blocks.

It returns the metadata values (``Layout.fields``) and each tensor's name, shape, type and byte range. Once a file
passed, every reader of it (the gguf package's, transformers' GGUF loader) reads only bytes the file holds, in work
and memory proportional to the file. posenc.gguf reads the metadata through it; nothing in posenc hands a GGUF file
to another reader before it passed.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from posenc._internal.errors import ConfigError

MAGIC = b"GGUF"
VERSIONS = (2, 3)                   # the GGUF versions with 64-bit counts (what the gguf package reads too)
MAX_DIMS = 4                        # llama.cpp's GGML_MAX_DIMS
MAX_NESTING = 8                     # arrays of arrays: no model uses more than one level
DEFAULT_ALIGNMENT = 32
_INT64_MAX = 2**63 - 1
# GGUF value type -> (struct code, size in bytes); 8 and 9 are strings and arrays
_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4),
            7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32", 7: "bool",
               8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64"}
STRING, ARRAY, UINT32 = 8, 9, 4
# the fewest bytes one value of a type takes: a string is at least its 8-byte length, an array its item type and count
_MIN_BYTES = {**{t: size for t, (_, size) in _SCALARS.items()}, STRING: 8, ARRAY: 12}
_TRUNCATED = "(the file is truncated or damaged)"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the file describes it: dims in GGUF order (dims[0] is the row length), the quantization
    type's name (F32, Q4_1, ...), its data's absolute byte offset and length."""

    name: str
    dims: tuple[int, ...]
    type_name: str
    offset: int
    nbytes: int

    @property
    def n_values(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass
class Layout:
    """What ``read_layout`` read: fields {key: value} (an array a ``keep`` predicate declined is left out; its length
    is in ``lengths`` as for every array), value_types {key: GGUF type name}, the tensors in file order."""

    path: str
    version: int
    size: int
    fields: dict[str, Any] = field(default_factory=dict)
    value_types: dict[str, str] = field(default_factory=dict)
    lengths: dict[str, int] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    alignment: int = DEFAULT_ALIGNMENT
    data_offset: int = 0


class _Walk:
    """A cursor over the mapped file that checks each read against the bytes left before making it."""

    def __init__(self, buf, path: str):
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)
        self.order = "<"

    def fail(self, text: str):
        raise ConfigError(f"{self.path}: {text}")

    def need(self, n: int, claim: str) -> None:
        """Refuse unless ``n`` bytes are left; ``claim`` says who needs them ("metadata array 'x' claims 9 items")."""
        left = self.size - self.pos
        if n > left:
            self.fail(f"{claim} but only {left} bytes remain {_TRUNCATED}")

    def scalar(self, code: int, what: str):
        fmt, size = _SCALARS[code]
        self.need(size, f"{what} needs {size} bytes")
        (value,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.scalar(10, f"{what}'s length")
        self.need(n, f"{what} claims a {n}-byte string")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.fail(f"{what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at position {exc.start} of its "
                      f"{n} bytes; GGUF strings are UTF-8, so the file is damaged)")

    def value(self, vtype: int, what: str, keep: bool, depth: int = 0):
        """One value of GGUF type ``vtype``; an array -> (its length, its items or None when not ``keep``)."""
        if vtype in _SCALARS:
            return self.scalar(vtype, what)
        if vtype == STRING:
            return self.string(what)
        if vtype != ARRAY:
            self.fail(f"{what} has value type {vtype}, which GGUF does not define {_TRUNCATED}")
        if depth >= MAX_NESTING:
            self.fail(f"{what} nests arrays more than {MAX_NESTING} deep")
        itype = self.scalar(UINT32, f"{what}'s item type")
        count = self.scalar(10, f"{what}'s length")
        if itype not in _MIN_BYTES:
            self.fail(f"{what} holds items of type {itype}, which GGUF does not define {_TRUNCATED}")
        least = count * _MIN_BYTES[itype]
        self.need(least, f"{what} claims {count} items ({_TYPE_NAMES[itype]}, at least {least} bytes)")
        if itype in _SCALARS:           # one read for the whole array: its size is known
            fmt, size = _SCALARS[itype]
            items = list(struct.unpack_from(f"{self.order}{count}{fmt}", self.buf, self.pos)) if keep else None
            self.pos += count * size
            return count, items
        items = [] if keep else None
        for i in range(count):
            item = self.value(itype, f"{what} item {i}", keep, depth + 1)
            if keep:
                items.append(item[1] if itype == ARRAY else item)
        return count, items


def _header(walk: _Walk) -> tuple[int, int, int]:
    """(version, tensor count, metadata entry count), the byte order set from the version."""
    if bytes(walk.buf[:4]) != MAGIC:
        walk.fail("not a readable GGUF file (it does not begin with the GGUF magic bytes)")
    walk.pos = 4
    walk.need(20, "the GGUF header needs 20 bytes after the magic")
    version = struct.unpack_from("<I", walk.buf, 4)[0]
    if version & 0xFFFF == 0:           # written on a machine of the other byte order (as the gguf package reads it)
        walk.order, version = ">", struct.unpack_from(">I", walk.buf, 4)[0]
    if version not in VERSIONS:
        walk.fail(f"GGUF version {version}: posenc reads GGUF versions {' and '.join(map(str, VERSIONS))}")
    walk.pos = 8
    n_tensors, n_fields = walk.scalar(10, "tensor count"), walk.scalar(10, "metadata entry count")
    return version, n_tensors, n_fields


def _fields(walk: _Walk, layout: Layout, count: int, keep: Callable[[str], bool]) -> None:
    # an entry takes at least 13 bytes: an 8-byte key length, a 4-byte type and a 1-byte value
    walk.need(count * 13, f"the header claims {count} metadata entries (at least {count * 13} bytes)")
    for i in range(count):
        key = walk.string(f"metadata entry {i}'s key")
        if key in layout.value_types:
            walk.fail(f"metadata key {key!r} appears twice {_TRUNCATED}")
        vtype = walk.scalar(UINT32, f"metadata entry {key!r}'s type")
        what = f"metadata array {key!r}" if vtype == ARRAY else f"metadata entry {key!r}"
        value = walk.value(vtype, what, keep(key))
        layout.value_types[key] = _TYPE_NAMES[vtype]
        if vtype == ARRAY:
            layout.lengths[key], value = value
            if value is None:
                continue
        layout.fields[key] = value


def _tensor_infos(walk: _Walk, count: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    # a tensor's description takes at least 24 bytes: name length, dimension count, type and offset
    walk.need(count * 24, f"the header claims {count} tensors (at least {count * 24} bytes of descriptions)")
    infos, names = [], set()
    for i in range(count):
        name = walk.string(f"tensor {i}'s name")
        if name in names:
            walk.fail(f"tensor {name!r} appears twice {_TRUNCATED}")
        names.add(name)
        n_dims = walk.scalar(UINT32, f"tensor {name!r}'s dimension count")
        if n_dims > MAX_DIMS:
            walk.fail(f"tensor {name!r} claims {n_dims} dimensions (GGUF tensors have at most {MAX_DIMS}) "
                      f"{_TRUNCATED}")
        walk.need(8 * n_dims, f"tensor {name!r} claims {n_dims} dimensions")
        dims = struct.unpack_from(f"{walk.order}{n_dims}Q", walk.buf, walk.pos)
        walk.pos += 8 * n_dims
        ttype = walk.scalar(UINT32, f"tensor {name!r}'s type")
        offset = walk.scalar(10, f"tensor {name!r}'s offset")
        infos.append((name, tuple(dims), ttype, offset))
    return infos


def _tensors(walk: _Walk, layout: Layout, infos) -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, dims, ttype, offset in infos:
        try:
            qtype = GGMLQuantizationType(ttype)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            walk.fail(f"tensor {name!r} has type {ttype}, which the gguf package does not know {_TRUNCATED}")
        n = 1
        for d in dims:
            n *= d
        if n > _INT64_MAX:
            walk.fail(f"tensor {name!r} claims {'x'.join(map(str, dims))} = {n} values {_TRUNCATED}")
        if dims and dims[0] % block:
            walk.fail(f"tensor {name!r} has rows of {dims[0]} values, not a whole number of {qtype.name}'s "
                      f"{block}-value blocks {_TRUNCATED}")
        nbytes = n // block * type_size
        start = layout.data_offset + offset
        if start + nbytes > layout.size:
            walk.fail(f"tensor {name!r} ({'x'.join(map(str, dims))} {qtype.name}) claims bytes {start} to "
                      f"{start + nbytes} but the file ends at byte {layout.size} {_TRUNCATED}")
        layout.tensors.append(TensorInfo(name, dims, qtype.name, start, nbytes))


def _alignment(walk: _Walk, layout: Layout) -> int:
    if "general.alignment" not in layout.value_types:
        return DEFAULT_ALIGNMENT
    value = layout.fields.get("general.alignment")
    if layout.value_types["general.alignment"] != "uint32" or value <= 0 or value & (value - 1):
        walk.fail(f"general.alignment must be a uint32 power of two, got {layout.value_types['general.alignment']} "
                  f"{value!r}")
    return value


def read_layout(path: str | os.PathLike, keep: Callable[[str], bool] = lambda key: True) -> Layout:
    """The layout of the GGUF file at ``path`` (see the module's docstring); ConfigError naming the file and the
    entry for anything that does not fit. ``keep(key)`` False: that array's items are checked, not kept (the
    tokenizer's vocabulary)."""
    p = Path(path)
    shown = os.fspath(path)
    if not p.is_file():
        raise ConfigError(f"GGUF file not found: {shown!r}")
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < len(MAGIC):
            raise ConfigError(f"{shown}: not a readable GGUF file ({size} bytes: too short for the GGUF header)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            walk = _Walk(buf, shown)
            version, n_tensors, n_fields = _header(walk)
            layout = Layout(path=shown, version=version, size=size)
            _fields(walk, layout, n_fields, keep)
            infos = _tensor_infos(walk, n_tensors)
            layout.alignment = _alignment(walk, layout)
            layout.data_offset = -(-walk.pos // layout.alignment) * layout.alignment
            _tensors(walk, layout, infos)
    return layout
