"""posenc finetune's text and outputs on a tiny random Llama (2 layers, hidden 32, trained context 32, byte
tokenizer): ``--data prose`` reads the study's prose folder (its training split trained on, its validation split
scored) or says in one line how to get it; the merged model is saved in the source's dtype (``--save-dtype``) and
still gives the adapters' logits. What reads DIR/model (eval, tune, pick): test_finetune_readers.py."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from posenc.cli import main  # noqa: E402
from posenc.finetune import data as finetune_data  # noqa: E402
from posenc.finetune.command import finetune_main  # noqa: E402
from posenc.finetune.run import finetune  # noqa: E402
from posenc.finetune.settings import FinetuneSettings  # noqa: E402
from posenc_hf_folders import fails, short_text  # noqa: E402

TRAIN_LEN = 32
TARGET = 128
ROOT = Path(__file__).resolve().parents[2]
QUIET = dict(log=lambda *a: None)


def save_llama(folder: Path, dtype: torch.dtype = torch.float32) -> Path:
    """A random 2-layer LlamaForCausalLM (vocabulary 256, trained context TRAIN_LEN, tied embeddings) in ``dtype``,
    saved with the byte tokenizer."""
    from posenc.hf.tokenizer import save_byte_tokenizer

    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=TRAIN_LEN, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(dtype).save_pretrained(str(folder))
    save_byte_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sources")
    return {"float32": save_llama(root / "fp32"), "bfloat16": save_llama(root / "bf16", torch.bfloat16),
            "text": short_text(root / "text.txt")}


def run(model: Path, out: Path, data: str, **extra) -> dict:
    given = dict(model=str(model), target_length=TARGET, out=str(out), data=data, steps=2, eval_every=2,
                 checkpoint_every=0, warmup=1, lr=1e-2, progress=False)
    return finetune(FinetuneSettings(**{**given, **extra}), **QUIET)


# ---- --data prose ------------------------------------------------------------------------------------------------

def prose_folder(folder: Path) -> Path:
    """40 small .txt files, each naming itself, as the study's folder of reStructuredText sources."""
    for i in range(40):
        path = folder / f"section{i // 10}" / f"page{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"Page {i:02d} of the prose. " + "Words follow words in sentences here. " * 6)
    return folder


def test_data_prose_trains_on_the_training_split_and_scores_the_validation_split(sources, tmp_path, monkeypatch):
    from posenc.hf.loading import load_tokenizer
    from posenc.lab.data import VAL_HASH_THRESHOLD, load_corpus

    folder = prose_folder(tmp_path / "prose")
    monkeypatch.setenv(finetune_data.PROSE_ENV, str(folder))
    assert finetune_data.data_source("prose") == str(folder)
    corpus = load_corpus(str(folder))
    assert corpus.meta["split"].startswith("sha256(relative path)")          # the folder rule, as posenc eval's
    assert 0 < corpus.meta["n_val_files"] < 40
    tokenizer = load_tokenizer(str(sources["float32"]))
    train, _ = finetune_data.training_tokens(tokenizer, str(folder), 10**6, TRAIN_LEN)
    held_out = finetune_data.validation_windows(tokenizer, str(folder), TARGET, 1)
    assert torch.equal(train, corpus.train.long())                          # byte tokens: ids are the bytes
    assert torch.equal(held_out[0], corpus.val[:TARGET + 1].long())
    # each page is in exactly one split, the one sha256(its relative path) gives
    train_text, val_text = (bytes(part.tolist()).decode() for part in (corpus.train, corpus.val))
    for path in folder.rglob("*.txt"):
        relative = path.relative_to(folder).as_posix()
        held = hashlib.sha256(relative.encode()).digest()[0] < VAL_HASH_THRESHOLD
        marker = path.read_text()[:8]                                       # "Page NN "
        assert (marker in val_text, marker in train_text) == (held, not held), relative
    # the whole run: "prose" is that folder, named so in finetune.json
    named = run(sources["float32"], tmp_path / "named", "prose")
    given = run(sources["float32"], tmp_path / "given", str(folder))
    assert named["data"]["source"] == str(folder.resolve()) and named["data"]["name"] == "prose"
    assert named["settings"]["data"] == "prose"
    assert named["train_losses"] == given["train_losses"]
    assert named["validation_losses"] == given["validation_losses"]


def test_data_prose_without_its_folder_is_one_line(sources, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(finetune_data.PROSE_ENV, str(tmp_path / "absent"))
    err = fails(capsys, finetune_main, "finetune", [str(sources["float32"]), "--target-length", str(TARGET),
                                                    "--data", "prose", "--out", str(tmp_path / "out")])
    assert "--data: prose" in err and "python scripts/smollm2_study.py prose" in err, err
    assert str(tmp_path / "absent") in err and not (tmp_path / "out").exists()


def test_the_prose_default_is_the_study_scripts(monkeypatch):
    monkeypatch.delenv(finetune_data.PROSE_ENV, raising=False)
    spec = importlib.util.spec_from_file_location("smollm2_study_prose", ROOT / "scripts" / "smollm2_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert str(module.PROSE_DIR) == finetune_data.PROSE_DEFAULT


# ---- --save-dtype ------------------------------------------------------------------------------------------------

def _saved_dtypes(out: Path) -> set:
    from safetensors.torch import load_file

    return {t.dtype for t in load_file(str(out / "model" / "model.safetensors")).values()}


def _adapters_applied(source: Path, out: Path, config) -> torch.nn.Module:
    """The float32 source with the extended config, the trained embeddings and norms and peft's adapters."""
    from peft import PeftModel
    from safetensors.torch import load_file

    base = transformers.AutoModelForCausalLM.from_pretrained(str(source), config=config, dtype=torch.float32)
    base.load_state_dict(load_file(str(out / "adapters" / "embeddings_norms.safetensors")), strict=False)
    return PeftModel.from_pretrained(base, str(out / "adapters"))


@pytest.mark.parametrize("source, flag, expected", [("bfloat16", "auto", torch.bfloat16),
                                                    ("float32", "auto", torch.float32),
                                                    ("bfloat16", "float32", torch.float32),
                                                    ("float32", "bfloat16", torch.bfloat16)])
def test_the_merged_model_is_saved_in_the_chosen_dtype(sources, tmp_path, source, flag, expected):
    out = tmp_path / "run"
    doc = run(sources[source], out, str(sources["text"]), save_dtype=flag, rank=4, train_embeddings_norms=True)
    assert doc["saved_dtype"] == str(expected).removeprefix("torch.")
    assert _saved_dtypes(out) == {expected}
    assert json.loads((out / "finetune.json").read_text())["saved_dtype"] == doc["saved_dtype"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(out / "model"), dtype="auto")
    assert loaded.dtype == expected and loaded.config.rope_parameters["rope_type"] == "yarn"
    applied = _adapters_applied(sources[source], out, loaded.config)
    ids = torch.arange(100)[None] % 256
    with torch.no_grad():
        want = applied(input_ids=ids).logits
        got = loaded(input_ids=ids).logits.float()
    tolerance = dict(atol=1e-5, rtol=0) if expected == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got, want, **tolerance)


def test_a_bad_save_dtype_is_one_line(sources, tmp_path, capsys):
    err = fails(capsys, main, "finetune", ["finetune", str(sources["float32"]), "--target-length", str(TARGET),
                                           "--out", str(tmp_path / "out"), "--save-dtype", "int8"])
    assert "--save-dtype" in err and not (tmp_path / "out").exists()
