"""Small GGUF files for the tests of what posenc does with them, well-formed or damaged on purpose: a complete
tiny Llama (tokenizer and every tensor, so transformers loads and converts it), and byte patches at the offsets the
gguf package's own reader finds in the well-formed file.

Imported by its own top-level name from tests/_support (see posenc_oracles.py for why test folders are not packages).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

TOKENS = ["a", "b", "c", "d", "ab", "cd", "<s>", "</s>"]


def llama_tensors(blocks: int, hidden: int = 16, heads: int = 2, kv_heads: int = 2, ff: int = 32,
                  vocab: int = len(TOKENS)) -> dict[str, tuple[int, ...]]:
    """{GGUF tensor name: numpy shape} of a Llama with these sizes (numpy shapes: the row length last)."""
    head_dim = hidden // heads
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    for i in range(blocks):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (hidden,), f"blk.{i}.attn_q.weight": (heads * head_dim, hidden),
            f"blk.{i}.attn_k.weight": (kv_heads * head_dim, hidden),
            f"blk.{i}.attn_v.weight": (kv_heads * head_dim, hidden),
            f"blk.{i}.attn_output.weight": (hidden, heads * head_dim), f"blk.{i}.ffn_norm.weight": (hidden,),
            f"blk.{i}.ffn_gate.weight": (ff, hidden), f"blk.{i}.ffn_up.weight": (ff, hidden),
            f"blk.{i}.ffn_down.weight": (hidden, ff)})
    return shapes


def tiny_llama_gguf(path: Path, *, blocks: int = 2, hidden: int = 16, ff: int = 32, vocab: int = len(TOKENS),
                    arch: str = "llama", block_count: int | None = None, embedding_length: int | None = None,
                    drop: tuple = (), strings: dict | None = None, arrays: dict | None = None) -> Path:
    """A GGUF Llama transformers loads and converts (gpt2-style tokenizer of 8 tokens, float32 tensors). Written
    with the metadata it says unless: ``block_count`` / ``embedding_length`` (what the metadata claims; the tensors
    stay), ``vocab`` (the embedding's rows and vocab_size; the tokenizer keeps its 8 tokens), ``drop`` (tensor names
    left out), ``strings`` / ``arrays`` (more metadata: {key: str} / {key: (GGUF value type, items)})."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.name", "tiny")
    sizes = {"context_length": 64, "embedding_length": hidden if embedding_length is None else embedding_length,
             "block_count": blocks if block_count is None else block_count, "feed_forward_length": ff,
             "attention.head_count": 2, "attention.head_count_kv": 2, "vocab_size": vocab}
    for key, value in sizes.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", TOKENS)
    w.add_array("tokenizer.ggml.token_type", [1] * len(TOKENS))
    w.add_array("tokenizer.ggml.merges", ["a b", "c d"])
    w.add_uint32("tokenizer.ggml.bos_token_id", 6)
    w.add_uint32("tokenizer.ggml.eos_token_id", 7)
    for key, value in (strings or {}).items():
        w.add_string(key, value)
    for key, (sub_type, items) in (arrays or {}).items():
        w.add_key_value(key, items, gguf.GGUFValueType.ARRAY, sub_type=sub_type)
    rng = np.random.default_rng(0)
    for name, shape in llama_tensors(blocks, hidden=hidden, ff=ff, vocab=vocab).items():
        if name not in drop:
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def field_offset(path: Path, key: str) -> int:
    """Where the metadata entry ``key`` begins in the well-formed GGUF file at ``path`` (its key's 8-byte length):
    then come the key, the 4-byte value type and the value (an array: 4-byte item type, 8-byte count, items)."""
    from gguf import GGUFReader

    return int(GGUFReader(path).fields[key].offset)


def value_offset(path: Path, key: str) -> int:
    """Where the value of the metadata entry ``key`` begins (for an array: its item type)."""
    return field_offset(path, key) + 8 + len(key.encode()) + 4


def tensor_info_offset(path: Path, name: str) -> int:
    """Where the description of tensor ``name`` begins (its name's 8-byte length): then the name, the 4-byte
    dimension count, 8 bytes per dimension, the 4-byte type and the 8-byte offset."""
    from gguf import GGUFReader

    return int(next(t for t in GGUFReader(path).tensors if t.name == name).field.offset)


def patched(path: Path, out: Path, offset: int, fmt: str, value) -> Path:
    """A copy of ``path`` at ``out`` with ``value`` packed (struct ``fmt``, little-endian) at byte ``offset``."""
    data = bytearray(path.read_bytes())
    struct.pack_into("<" + fmt, data, offset, value)
    out.write_bytes(bytes(data))
    return out
