"""Model folders for the tests of what posenc does with them (remote code, pickles, recorded training lengths): a
tiny random Llama with the byte tokenizer, a lab run folder, and the one-line-error check of the hf commands.

Imported by its own top-level name from tests/_support (see posenc_oracles.py for why test folders are not packages).
"""

from __future__ import annotations

from pathlib import Path

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
