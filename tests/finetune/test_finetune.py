"""posenc finetune on a tiny random Llama (2 layers, hidden 32, byte tokenizer): the PoSE ids it trains on follow
posenc.pose's rule, a LoRA step changes only what is trainable, merged weights give the adapters' logits, a
resumed run equals an uninterrupted one step for step, each bad input is one line naming its flag, and the folder
written loads in transformers with the extended RoPE."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from posenc.cli import main  # noqa: E402
from posenc.finetune.adapters import TrainableView, embeddings_and_norms, make_trainable, merged  # noqa: E402
from posenc.finetune.command import finetune_main  # noqa: E402
from posenc.finetune.data import PoseSampler  # noqa: E402
from posenc.finetune.run import finetune  # noqa: E402
from posenc.finetune.settings import FinetuneSettings, train_settings  # noqa: E402
from posenc.lab.data import batch_generator  # noqa: E402
from posenc.lab.train import TrainSettings, train_step  # noqa: E402
from posenc.pose import pose_position_ids  # noqa: E402
from posenc_hf_folders import fails, short_text  # noqa: E402

TRAIN_LEN = 32


def llama(hidden: int = 32) -> torch.nn.Module:
    """A random 2-layer LlamaForCausalLM, vocabulary 256 (bytes), trained context TRAIN_LEN, tied embeddings."""
    config = transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=TRAIN_LEN, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[Path, Path]:
    """(the model folder, a 2,000-character text)."""
    from posenc.hf.tokenizer import save_byte_tokenizer

    root = tmp_path_factory.mktemp("finetune")
    llama().save_pretrained(str(root / "model"))
    save_byte_tokenizer(root / "model")
    return root / "model", short_text(root / "text.txt")


def settings_for(folder, out, **extra) -> FinetuneSettings:
    model, text = folder
    given = dict(model=str(model), target_length=128, out=str(out), data=str(text), steps=6, eval_every=2,
                 checkpoint_every=2, warmup=2, lr=1e-2, progress=False)
    return FinetuneSettings(**{**given, **extra})


# ---- PoSE ids ----------------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None, derandomize=True)
@given(window=st.integers(2, 48), extra=st.integers(0, 200), chunks=st.integers(1, 4), step=st.integers(0, 10**6),
       batch=st.integers(1, 3))
def test_the_training_ids_are_poses(window, extra, chunks, step, batch):
    chunks = min(chunks, window)
    target = window + extra
    sampler = PoseSampler(torch.arange(300) % 256, window, target, chunks=chunks, batch_size=batch, seed=3)
    inputs, targets = sampler.batch(step)
    assert inputs.shape == (batch, 2, window) and targets.shape == (batch, window)
    ids, positions = inputs[:, 0], inputs[:, 1]
    assert bool((positions[:, 0] == 0).all())                   # the first token at position 0, as at inference
    assert bool((positions.diff(dim=1) >= 1).all())             # strictly increasing
    assert int(positions.max()) < target
    assert torch.equal(targets[:, :-1], ids[:, 1:])             # the next tokens of one contiguous slice
    # posenc.pose's own draw: the window's starts come first from the step's generator, then the ids
    g = batch_generator(3, step)
    torch.randint(0, 300 - window, (batch,), generator=g)
    assert torch.equal(positions, pose_position_ids(batch, window, target, chunks=chunks, generator=g))


def test_a_batch_is_a_function_of_the_step():
    sampler = PoseSampler(torch.arange(500) % 256, 16, 64, batch_size=2, seed=1)
    a, b = sampler.batch(7), sampler.batch(7)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(sampler.batch(8)[0], a[0])


# ---- what a step trains ------------------------------------------------------------------------------------------

def _steps(model, n: int = 2) -> None:
    view = TrainableView(model)
    view.train()
    from posenc.lab.train import make_optimizer

    s = TrainSettings(steps=n, lr=1e-2, warmup=0, weight_decay=0.0)
    opt = make_optimizer(view, s)
    sampler = PoseSampler(torch.arange(400) % 256, TRAIN_LEN, 128, batch_size=2, seed=0)
    for step in range(n):
        train_step(view, view, opt, sampler.batch(step), step, s)


@pytest.mark.parametrize("embeddings_norms", [False, True])
def test_a_lora_step_changes_only_what_is_trainable(embeddings_norms):
    model = make_trainable(llama(), rank=4, alpha=8, embeddings_norms=embeddings_norms)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    _steps(model)      # two steps: B starts at zero, so A's first gradient is zero
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == trainable
    lora = {n for n in before if ".lora_A." in n or ".lora_B." in n}
    assert len(lora) == 2 * 4 * 2            # A and B, of q, k, v, o, in 2 layers
    extra = set(embeddings_and_norms(model)) if embeddings_norms else set()
    assert trainable == lora | extra
    if embeddings_norms:    # the embedding (the tied head too) and the 5 norms: 2 per layer and the final one
        assert len(extra) == 6 and any("embed_tokens" in n for n in extra)


def test_full_fine_tuning_trains_every_weight():
    model = make_trainable(llama(), full=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _steps(model, 1)
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_merged_weights_give_the_adapters_logits():
    model = make_trainable(llama(), rank=4, alpha=8, embeddings_norms=True)
    _steps(model)
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(40).expand(2, 40) * 3
    with torch.no_grad():
        applied = model(input_ids=ids, position_ids=positions).logits
        full = merged(model)
        assert not hasattr(full, "peft_config")
        assert not any("lora_" in n for n, _ in full.named_parameters())
        together = full(input_ids=ids, position_ids=positions).logits
    torch.testing.assert_close(together, applied, atol=1e-5, rtol=0)


# ---- the whole run -----------------------------------------------------------------------------------------------

def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model" / "model.safetensors"))


class Crash(Exception):
    pass


@pytest.mark.parametrize("interruption", ["stop", "crash"])
def test_resume_equals_an_uninterrupted_run(folder, tmp_path, monkeypatch, interruption):
    """"stop": the run ends after step 3 with a checkpoint there; "crash": it dies in the validation after step 4,
    and resumes from the checkpoint of step 2 (its history.json cut there)."""
    from posenc.finetune import loop

    quiet = dict(log=lambda *a: None)
    whole = finetune(settings_for(folder, tmp_path / "whole", train_embeddings_norms=True), **quiet)
    part = settings_for(folder, tmp_path / "part", train_embeddings_norms=True)
    if interruption == "stop":
        assert finetune(part, stop_after=3, **quiet)["steps"] == 3
    else:
        real, calls = loop.validation_loss, []

        def dies_at_step_4(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise Crash()
            return real(*args, **kwargs)

        monkeypatch.setattr(loop, "validation_loss", dies_at_step_4)
        with pytest.raises(Crash):
            finetune(part, **quiet)
        monkeypatch.setattr(loop, "validation_loss", real)
    assert not (tmp_path / "part" / "model").exists()
    part.resume = True
    rest = finetune(part, **quiet)
    assert rest["resumed_from"] == (3 if interruption == "stop" else 2)
    assert rest["train_losses"] == whole["train_losses"] and len(whole["train_losses"]) == 6
    assert rest["validation_losses"] == whole["validation_losses"]
    assert [s for s, _ in whole["validation_losses"]] == [2, 4, 6]
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_with_other_settings_is_refused(folder, tmp_path, capsys):
    model, text = folder
    argv = [str(model), "--target-length", "128", "--data", str(text), "--out", str(tmp_path / "run"), "--steps",
            "4", "--no-progress"]
    finetune(settings_for(folder, tmp_path / "run", steps=4), stop_after=2, log=lambda *a: None)
    err = fails(capsys, finetune_main, "finetune", argv + ["--resume", "--rank", "4"])
    assert "other settings" in err


def test_the_command_writes_a_folder_transformers_loads(folder, tmp_path, capsys):
    model, text = folder
    out = tmp_path / "run"
    assert main(["finetune", str(model), "--target-length", "128", "--out", str(out), "--data", str(text),
                 "--steps", "3", "--eval-every", "2", "--rank", "4", "--train-embeddings-norms",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "3 steps" in printed and "tokens/s" in printed
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(out / "model"))
    rope = loaded.config.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0 and rope["original_max_position_embeddings"] == 32
    assert loaded.config.max_position_embeddings == 128
    assert {"adapter_config.json", "adapter_model.safetensors", "embeddings_norms.safetensors"} <= set(
        os.listdir(out / "adapters"))
    doc = json.loads((out / "finetune.json").read_text())
    assert doc["steps"] == 3 and doc["tokens"] == 3 * TRAIN_LEN and doc["tokens_per_s"] > 0
    assert [s for s, _ in doc["validation_losses"]] == [2, 3] and len(doc["train_losses"]) == 3
    assert doc["settings"]["rank"] == 4 and doc["window"] == TRAIN_LEN and doc["extension"]["method"] == "yarn"
    # the cost: forward FLOPs of a step by the closed form (2 x linear weights x window + causal attention), the
    # 3 x forward convention over the training seconds, and a peak resident memory the process did reach
    linear = sum(m.weight.numel() for m in loaded.modules() if isinstance(m, torch.nn.Linear))
    lora = 2 * 4 * (4 * 32 + 32 * 4)     # 2 layers x q, k, v, o (32 -> 32): A [4, 32] + B [32, 4]
    L, cfg = TRAIN_LEN, loaded.config
    width = cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    assert doc["forward_flops_per_step"] == 2 * (linear + lora) * L + 4 * cfg.num_hidden_layers * width * L * (L + 1) / 2
    assert doc["train_flops_per_s"] == pytest.approx(3 * doc["forward_flops_per_step"] * 3 / doc["train_s"])
    assert doc["mfu"] == pytest.approx(doc["train_flops_per_s"] / doc["matmul_peak_flops"])
    assert doc["matmul_peak_dtype"] == "fp32" and doc["peak_rss_bytes"] > 50 * 2 ** 20
    # an adapter folder peft reads onto the extended model, with the embeddings and norms beside it, is the merged
    # model
    from peft import PeftModel
    from safetensors.torch import load_file

    base = transformers.AutoModelForCausalLM.from_pretrained(str(model), config=loaded.config)
    base.load_state_dict(load_file(str(out / "adapters" / "embeddings_norms.safetensors")), strict=False)
    again = PeftModel.from_pretrained(base, str(out / "adapters"))
    ids = torch.arange(100)[None] % 256
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids).logits, loaded(input_ids=ids).logits, atol=1e-5, rtol=0)
    # a second run into the same folder needs --resume or --overwrite
    err = fails(capsys, finetune_main, "finetune", [str(model), "--target-length", "128", "--out", str(out)])
    assert "--resume" in err and "--overwrite" in err


def test_posenc_eval_reads_the_merged_folder(folder, tmp_path):
    from posenc.hf.eval.command import eval_main

    model, text = folder
    finetune(settings_for(folder, tmp_path / "run", steps=2), log=lambda *a: None)
    assert eval_main([str(tmp_path / "run" / "model"), "--data", str(text), "--eval-lens", "32,64",
                      "--eval-tokens", "64", "--tasks", "lm", "--no-progress"]) == 0


# ---- bad input: one line naming the flag -------------------------------------------------------------------------

def _bad(folder, tmp_path) -> dict:
    model, text = folder
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("print('hello world')\n")          # 21 bytes: 18 to train on, less than a 32-token window
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    base = [str(model), "--target-length", "128", "--data", str(text), "--no-progress"]
    return {
        "target below the trained length": ([str(model), "--target-length", "16", "--out", str(tmp_path / "o1")],
                                            "--target-length: expected more than the model's trained length 32"),
        "rank 0": (base + ["--rank", "0", "--out", str(tmp_path / "o2")], "--rank must be"),
        "a data file shorter than one chunk": (
            [str(model), "--target-length", "128", "--data", str(tiny), "--out", str(tmp_path / "o3")],
            "--data: the training text"),
        "an unwritable --out": (base + ["--out", str(blocker / "out")], "(--out): "),
        "--out over the model's weights": (base + ["--out", str(model / "model.safetensors")], "(--out): is a model"),
        "an unknown method": (base + ["--method", "warp", "--out", str(tmp_path / "o4")], "--method"),
        "an attention method": (base + ["--method", "self-extend", "--out", str(tmp_path / "o5")], "--method"),
    }


@pytest.mark.parametrize("case", ["target below the trained length", "rank 0", "a data file shorter than one chunk",
                                  "an unwritable --out", "--out over the model's weights", "an unknown method",
                                  "an attention method"])
def test_bad_input_is_one_line_naming_the_flag(folder, tmp_path, capsys, case):
    argv, expected = _bad(folder, tmp_path)[case]
    err = fails(capsys, finetune_main, "finetune", argv)
    assert expected in err, err
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 6))     # nothing written before the checks


def test_a_read_only_out_folder_is_refused(folder, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        err = fails(capsys, finetune_main, "finetune", [str(folder[0]), "--target-length", "64", "--out",
                                               str(locked / "out")])
    finally:
        locked.chmod(0o700)
    assert "(--out): cannot create files" in err


def test_the_checkpoint_settings_are_the_lab_schedule():
    s = train_settings(FinetuneSettings(model="m", target_length=64, out="o", steps=5, warmup=10))
    assert isinstance(s, TrainSettings) and s.warmup == 5 and s.steps == 5


def test_a_gguf_file_is_fine_tuned_into_a_folder(tmp_path):
    """transformers dequantizes the GGUF file; the merged model is saved without its GGUF quantization config."""
    pytest.importorskip("gguf")
    from posenc_hf_folders import tiny_gguf

    source = tiny_gguf(tmp_path / "tiny.gguf")
    text = tmp_path / "letters.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 100)    # the file's 26 letters
    assert main(["finetune", str(source), "--target-length", "256", "--out", str(tmp_path / "run"), "--data",
                 str(text), "--steps", "2", "--no-progress"]) == 0
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "model"))
    assert loaded.config.rope_parameters["rope_type"] == "yarn" and loaded.config.max_position_embeddings == 256
