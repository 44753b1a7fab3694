"""Model folders for the tests of what posenc does with them (remote code, pickles, recorded training lengths): a
tiny random Llama with the byte tokenizer, a tiny Llama GGUF file that transformers loads, a lab run folder, and the
one-line-error check of the hf commands.

Imported by its own top-level name from tests/_support (see posenc_oracles.py for why test folders are not packages).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

TRAIN_LEN = 32
SHAPE = dict(d_model=32, n_layers=1, n_heads=4, max_len=TRAIN_LEN)


def tiny_llama(folder: Path, hidden: int = 32) -> Path:
    """A random LlamaForCausalLM (vocab 256, context TRAIN_LEN) saved with the byte tokenizer."""
    import transformers

    from posenc.hf.tokenizer import save_byte_tokenizer

    config = transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=TRAIN_LEN, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(folder))
    save_byte_tokenizer(folder)
    return folder


def tiny_gguf(path: Path, hidden: int = 32, ff: int = 64) -> Path:
    """A GGUF file of a random one-layer Llama (28-token gpt2-style vocabulary, float32 tensors, context 64) that
    transformers' GGUF loader loads, tokenizer included: what ``posenc convert`` takes, in 47 kB."""
    import gguf
    import numpy as np

    tokens = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["<s>", "</s>"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(TRAIN_LEN * 2)
    w.add_embedding_length(hidden)
    w.add_block_count(1)
    w.add_feed_forward_length(ff)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(hidden // 2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_merges([])
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    rng = np.random.default_rng(0)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w.add_tensor("token_embd.weight", weight(len(tokens), hidden))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(hidden, np.float32))
    for name in ("q", "k", "v", "output"):
        w.add_tensor(f"blk.0.attn_{name}.weight", weight(hidden, hidden))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", weight(ff, hidden))
    w.add_tensor("blk.0.ffn_up.weight", weight(ff, hidden))
    w.add_tensor("blk.0.ffn_down.weight", weight(hidden, ff))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def short_text(path: Path) -> Path:
    """Write 2,000 characters of real text (posenc's own cli.py and gguf.py) to ``path``: its held-out part (the last
    10%) holds 3 windows of 64 byte tokens, a short race for ``posenc tune``."""
    import posenc

    root = Path(posenc.__file__).parent
    path.write_text("".join((root / name).read_text() for name in ("cli.py", "gguf.py"))[:2000])
    return path


def lab_run(folder: Path, scheme: str = "rope", **extra) -> Path:
    """A lab run folder: results.json, a report and one checkpoint of ``scheme``."""
    from posenc.hf.lab_bridge import build_lab_model, save_lab_model

    torch.manual_seed(0)
    (folder / "checkpoints").mkdir(parents=True)
    save_lab_model(folder / "checkpoints" / f"lm-{scheme}-seed0.safetensors",
                   build_lab_model(scheme=scheme, **{**SHAPE, **extra}))
    (folder / "results.json").write_text("{}\n")
    (folder / "report.md").write_text("# run\n")
    return folder


def fails(capsys, main, command: str, argv: list[str]) -> str:
    """Run ``main(argv)`` expecting exit 2 and one line "posenc COMMAND: error: ..." on stderr; -> that line."""
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"posenc {command}: error: ") and "\n" not in err, err
    assert "internal error" not in err
    return err


# the tune tests' shared module-scoped folders: a test module imports both names and asks for ``model`` and ``text``
@pytest.fixture(scope="module", name="model")
def tune_model_fixture(tmp_path_factory) -> str:
    """A tiny random Llama folder (tiny_llama), made once per test module."""
    return str(tiny_llama(tmp_path_factory.mktemp("tune") / "llama"))


@pytest.fixture(scope="module", name="text")
def tune_text_fixture(tmp_path_factory) -> str:
    """A short text file (short_text), made once per test module."""
    return str(short_text(tmp_path_factory.mktemp("text") / "text.txt"))
