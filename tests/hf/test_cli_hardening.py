"""posenc export / eval / hf search refuse bad input in one line before any long work: an --out that would delete
the lab run it exports from, weights that do not fit a --config, unknown devices and attention implementations,
malformed list flags, outputs that cannot be written; --no-progress silences transformers' bars too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 (transformers loads the models)")

from posenc._internal.errors import ConfigError  # noqa: E402
from posenc.hf.evaluate import EvalSettings, eval_main, load_causal_lm  # noqa: E402
from posenc.hf.export import export_lab_model, export_main  # noqa: E402
from posenc.hf.search import search_main  # noqa: E402
from posenc.hf.tokenizer import save_byte_tokenizer  # noqa: E402
from posenc_hf_folders import TRAIN_LEN, lab_run, tiny_llama  # noqa: E402

transformers.logging.set_verbosity_error()

linux_proc = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")



def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny lab RoPE model exported to GPT-NeoX (with the byte tokenizer)."""
    root = tmp_path_factory.mktemp("hardening")
    run = lab_run(root / "run")
    export_lab_model(run, root / "neox", scheme="rope", check=False)
    return root / "neox"



@pytest.fixture
def no_model_loading(monkeypatch):
    """Loading a model fails the test: the checks under test must come before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def fails(capsys, main, argv: list[str]) -> str:
    """Run ``main(argv)`` (export_main, eval_main, search_main) expecting exit 2 with one line on stderr (no
    traceback, no "internal error", no temporary file's name); -> that line."""
    capsys.readouterr()  # what the setup printed (transformers' "Writing model shards" bars)
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    command = {export_main: "export", eval_main: "eval", search_main: "search"}[main]
    assert err.startswith(f"posenc {command}: error: ") and "\n" not in err, err
    assert "internal error" not in err and ".tmp" not in err
    return err


# ---- export ------------------------------------------------------------------------------------------------------

def test_export_refuses_an_out_folder_that_is_or_holds_its_source(tmp_path, capsys):
    run = lab_run(tmp_path / "run")
    before = snapshot(run)
    (tmp_path / "link").symlink_to(run, target_is_directory=True)
    ckpt = run / "checkpoints" / "lm-rope-seed0.safetensors"
    cases = [[str(run), "--scheme", "rope", "--out", str(run)],                        # the run itself
             [str(run), "--scheme", "rope", "--out", str(run / "checkpoints")],        # the checkpoints
             [str(run), "--scheme", "rope", "--out", str(tmp_path / "link")],          # a symlink to the run
             [str(tmp_path / "link"), "--scheme", "rope", "--out", str(run / "checkpoints")],
             [str(ckpt), "--out", str(run / "checkpoints" / ".." / "checkpoints")],     # the checkpoint's folder
             [str(run), "--scheme", "rope", "--out", str(tmp_path)]]                   # a folder above the run
    for argv in cases:
        err = fails(capsys, export_main, [*argv, "--overwrite"])
        assert "the source" in err and "would delete it" in err
    assert snapshot(run) == before and (tmp_path / "link").is_symlink()
    # a new folder inside the run stays allowed
    assert export_main([str(run), "--scheme", "rope", "--out", str(run / "exported"), "--no-check"]) == 0
    assert (run / "exported" / "config.json").is_file() and snapshot(run / "checkpoints") == {
        k[len("checkpoints/"):]: v for k, v in before.items() if k.startswith("checkpoints/")}


def test_export_bounds_max_positions_and_refuses_factor_without_rope_scaling(tmp_path, capsys):
    run = lab_run(tmp_path / "run", scheme="sinusoidal")
    out = tmp_path / "out"
    argv = [str(run), "--scheme", "sinusoidal", "--out", str(out)]
    err = fails(capsys, export_main, [*argv, "--max-positions", "99999999999"])
    assert "--max-positions must be an integer in [1, 1073741824]" in err
    assert "--factor needs --method" in fails(capsys, export_main, [*argv, "--factor", "4"])
    assert not out.exists()
    with pytest.raises(ConfigError, match="factor: .*given without rope_scaling"):
        export_lab_model(run, out, scheme="sinusoidal", factor=4.0)


def test_export_names_max_positions_when_its_tables_do_not_fit(tmp_path, monkeypatch):
    import posenc.hf.export as export
    import posenc.hf.lab_bridge as bridge

    run = lab_run(tmp_path / "run", scheme="sinusoidal")
    monkeypatch.setattr(export, "available_memory", lambda: 1 << 20)  # 1 MiB: the 4096-row table needs more
    with pytest.raises(ConfigError, match=r"max_positions: 4096 positions need about .* GiB .*smaller max_positions"):
        export_lab_model(run, tmp_path / "a", scheme="sinusoidal", max_positions=4096)
    monkeypatch.setattr(export, "available_memory", lambda: None)  # unknown: torch's refusal is reported instead

    def refuse(model, n):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(bridge, "absolute_table", refuse)
    with pytest.raises(ConfigError, match=r"max_positions: 4096 positions do not fit in memory"):
        export_lab_model(run, tmp_path / "b", scheme="sinusoidal", max_positions=4096)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@linux_proc
def test_export_names_an_unwritable_out_before_loading(tmp_path, capsys, no_model_loading):
    run = lab_run(tmp_path / "run")
    err = fails(capsys, export_main, [str(run), "--scheme", "rope", "--out", "/proc/posenc-x"])
    assert "out /proc/posenc-x (--out): cannot create files in /proc" in err


# ---- eval: what is loaded ----------------------------------------------------------------------------------------

def test_eval_refuses_weights_that_do_not_fit_the_config(model_dir, tmp_path, capsys):
    llama = tiny_llama(tmp_path / "llama")
    shutil.copy(llama / "config.json", tmp_path / "llama.json")
    transformers.logging.set_verbosity_warning()  # transformers' own load report would be logged at this level
    try:
        err = fails(capsys, eval_main, [str(model_dir), "--config", str(tmp_path / "llama.json"), "--eval-lens",
                                        "32", "--eval-tokens", "64", "--no-progress"])
    finally:
        transformers.logging.set_verbosity_error()
    assert "do not fit the LlamaForCausalLM" in err and "missing (lm_head.weight" in err
    assert "unexpected (embed_out.weight, gpt_neox.embed_in.weight" in err
    wide = json.loads((llama / "config.json").read_text())
    wide["hidden_size"] = 64
    (tmp_path / "wide.json").write_text(json.dumps(wide))
    with pytest.raises(ConfigError, match=r"of another shape \(lm_head.weight"):
        load_causal_lm(str(llama), config_file=str(tmp_path / "wide.json"))
    # every export, and a model loaded with its own config, reports none (rotary inv_freq and other
    # non-persistent buffers do not count)
    for scheme, extra in (("rope", {}), ("nope", {}), ("learned", {}), ("sinusoidal", {}),
                          ("alibi", {"bias": False})):
        run = lab_run(tmp_path / f"run-{scheme}", scheme=scheme, **extra)
        export_lab_model(run, tmp_path / scheme, scheme=scheme, check=False)
        model, _, _ = load_causal_lm(str(tmp_path / scheme))
        assert model.config.architectures
    load_causal_lm(str(llama))


def test_eval_names_a_bad_config_or_a_missing_tokenizer_or_weights(model_dir, tmp_path, capsys, no_model_loading):
    (tmp_path / "list.json").write_text("[1, 2]")
    argv = ["--eval-lens", "32", "--no-progress"]
    err = fails(capsys, eval_main, [str(model_dir), "--config", str(tmp_path / "list.json"), *argv])
    assert "(--config): expected a JSON object (a transformers config.json), got a JSON list" in err
    no_tok = tmp_path / "no-tokenizer"
    no_tok.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model_dir / name, no_tok / name)
    err = fails(capsys, eval_main, [str(no_tok), *argv])
    assert f"model {no_tok}: no tokenizer (expected tokenizer.json" in err
    no_weights = tmp_path / "no-weights"
    shutil.copytree(model_dir, no_weights)
    (no_weights / "model.safetensors").unlink()
    err = fails(capsys, eval_main, [str(no_weights), *argv])
    assert f"model {no_weights}: no weights (expected model.safetensors" in err


# ---- eval and hf search: flags checked before loading ------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--threads", "-1"], "--threads must be an integer in [0, 4096], got -1"),
    (["--device", "bogus"], "--device: expected cpu, cuda, cuda:N"),
    (["--device", "cuda:99"], "--device: cuda:99 requested but"),
    (["--attn-implementation", "bogus"], "--attn-implementation: expected one of eager, "),
])
def test_eval_and_search_check_threads_device_and_attention_first(flags, message, model_dir, tmp_path, capsys,
                                                                  no_model_loading):
    assert message in fails(capsys, eval_main, [str(model_dir), "--eval-lens", "32", "--no-progress", *flags])
    llama = tiny_llama(tmp_path / "llama")
    assert message in fails(capsys, search_main, [str(llama), "--target-length", "64", "--no-progress", *flags])


def test_an_attention_implementation_the_model_cannot_use_names_the_flag(tmp_path):
    llama = tiny_llama(tmp_path / "llama")
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed")
    with pytest.raises(ConfigError, match=r"attn_implementation 'flash_attention_2' \(--attn-implementation\)"):
        load_causal_lm(str(llama), attn_implementation="flash_attention_2")


@pytest.mark.parametrize("flags, message", [
    (["--eval-lens", "abc"], "argument --eval-lens: expected comma-separated integers, got 'abc'"),
    (["--eval-lens", "96,,192"], "argument --eval-lens: expected comma-separated integers with no empty entry"),
    (["--tasks", ""], "argument --tasks: expected comma-separated names with no empty entry"),
    (["--methods", ""], "argument --methods: expected comma-separated names with no empty entry"),
    (["--passkey-depths", "0.5,"], "argument --passkey-depths: expected comma-separated numbers with no empty"),
    (["--factor", "4"], "factor: 4.0 given, but only extension methods use it"),
])
def test_eval_list_flags_and_factor(flags, message, model_dir, capsys, no_model_loading):
    from posenc.cli import main

    capsys.readouterr()
    assert main(["eval", str(model_dir), "--no-progress", *flags]) == 2  # argparse's errors end the parse
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc eval: error: ") and "\n" not in err
    assert message in err and "_ints" not in err


def test_eval_settings_refuse_empty_lists():
    for name in ("tasks", "methods", "eval_lens", "passkey_depths"):
        with pytest.raises(ConfigError, match=f"{name}: expected at least one entry"):
            EvalSettings(**{"tasks": ["lm", "passkey"], name: []}).validate()
    with pytest.raises(ConfigError, match="factor: 2.0 given, but only extension methods use it"):
        EvalSettings(factor=2.0).validate()


# ---- outputs --------------------------------------------------------------------------------------------------

def test_eval_out_is_checked_before_evaluating(model_dir, tmp_path, capsys, monkeypatch):
    run = lab_run(tmp_path / "run")
    before = snapshot(run)
    argv = [str(model_dir), "--eval-lens", "32", "--eval-tokens", "64", "--sliding-stride", "0", "--no-progress"]
    with monkeypatch.context() as m:
        m.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                  lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded before --out was checked")))
        err = fails(capsys, eval_main, [*argv, "--out", str(run)])
        assert f"out {run}: already holds results.json and report.md" in err and "--overwrite" in err
        assert snapshot(run) == before
        (tmp_path / "file").write_text("x")
        assert "is a file, not a folder" in fails(capsys, eval_main, [*argv, "--out", str(tmp_path / "file" / "x")])
        if Path("/proc/self").is_dir():
            err = fails(capsys, eval_main, [*argv, "--out", "/proc/posenc-x"])
            assert "out /proc/posenc-x (--out): cannot create files in /proc" in err
    assert eval_main([*argv, "--out", str(run), "--overwrite"]) == 0
    assert json.loads((run / "results.json").read_text())["results"][0]["eval_len"] == 32
    assert (run / "checkpoints" / "lm-rope-seed0.safetensors").read_bytes() == \
        before["checkpoints/lm-rope-seed0.safetensors"]


def test_search_out_config_and_checkpoint_are_checked_before_loading(tmp_path, capsys, no_model_loading):
    llama = tiny_llama(tmp_path / "llama")
    folder = tmp_path / "hfm"
    folder.mkdir()
    argv = [str(llama), "--target-length", "64", "--no-progress"]
    err = fails(capsys, search_main, [*argv, "--out-config", str(folder)])
    assert f"out_config {folder} (--out): is a folder" in err
    err = fails(capsys, search_main, [*argv, "--out-config", str(tmp_path / "c.json"), "--checkpoint", str(folder)])
    assert f"checkpoint {folder} (--checkpoint): is a folder" in err
    if Path("/proc/self").is_dir():
        err = fails(capsys, search_main, [*argv, "--out-config", "/proc/posenc-x.json"])
        assert "out_config /proc/posenc-x.json (--out): cannot create files in /proc" in err
    assert list(folder.iterdir()) == []


# ---- help and progress bars ----------------------------------------------------------------------------------------

def test_eval_flags_have_help(capsys):
    assert eval_main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("where the key sits", "passkey episodes", "seed of the random passkey", "weights and activations",
                  "--overwrite"):
        assert words in text


def test_no_progress_silences_transformers_bars(model_dir, tmp_path, capsys):
    from transformers.utils import logging as hf_logging

    argv = [str(model_dir), "--eval-lens", "32", "--eval-tokens", "64", "--sliding-stride", "0"]
    assert hf_logging.is_progress_bar_enabled()
    assert eval_main(argv) == 0
    assert "Loading weights" in capsys.readouterr().err  # the bar this flag must silence
    assert eval_main([*argv, "--no-progress"]) == 0
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # restored
    llama = tiny_llama(tmp_path / "llama")
    capsys.readouterr()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(p.read_text() for p in sorted(Path(json.__file__).parent.glob("*.py")))[:40_000])
    assert search_main([str(llama), "--target-length", "64", "--data", str(corpus), "--windows", "1",
                        "--heldout-windows", "1", "--population", "4", "--parents", "2", "--generations", "1",
                        "--heldout-top", "1", "--no-progress"]) == 0
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()


@pytest.mark.parametrize("name, values", [("methods", ["none", "none"]), ("eval_lens", [128, 128]),
                                          ("tasks", ["lm", "lm"])])
def test_eval_settings_refuse_repeated_entries(name, values):
    with pytest.raises(ConfigError, match=f"{name}: .* appears more than once"):
        EvalSettings(**{name: values}).validate()


def test_standalone_entry_points_return_the_usage_status(capsys):
    from posenc.hf.evaluate import eval_main

    assert eval_main(["somewhere", "--eval-lens", "abc"]) == 2
    err = capsys.readouterr().err
    assert "posenc eval: error: argument --eval-lens: expected comma-separated integers" in err
    assert eval_main(["--help"]) == 0


def test_an_interrupted_eval_keeps_the_methods_it_finished(model_dir, tmp_path, monkeypatch, capsys):
    """--out gets each method's rows as soon as it finishes: Ctrl-C during the second method leaves the first's
    rows in results.json, marked incomplete (exit 130); a full run replaces them with everything."""
    from posenc.hf.eval import loop as E
    from posenc.hf.evaluate import eval_main

    real = E.load_causal_lm
    calls = []

    def interrupt_second(*args, **kwargs):
        calls.append(kwargs.get("method"))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(E, "load_causal_lm", interrupt_second)
    out = tmp_path / "out"
    argv = [str(model_dir), "--eval-lens", "32", "--eval-tokens", "64", "--sliding-stride", "0", "--methods",
            "none,linear", "--factor", "2", "--out", str(out), "--no-progress"]
    assert eval_main(argv) == 130
    doc = json.loads((out / "results.json").read_text())
    assert doc["meta"]["incomplete"] == "methods still to run: linear"
    assert "an interrupted eval: --resume continues it" in fails(capsys, eval_main, argv)
    assert {r["scaling"] for r in doc["results"]} == {"none"} and all(r["value"] for r in doc["results"])
    monkeypatch.setattr(E, "load_causal_lm", real)
    assert eval_main([*argv, "--overwrite"]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert "incomplete" not in doc["meta"] and {r["scaling"] for r in doc["results"]} == {"none", "linear"}


def test_write_outputs_as_a_library_call_refuses_a_folder_with_results(model_dir, tmp_path):
    """The CLI's --out rule holds for the library call too: a lab run's results are not replaced silently."""
    from posenc.hf.evaluate import evaluate_model, write_outputs

    run = lab_run(tmp_path / "run")
    before = snapshot(run)
    doc = evaluate_model(str(model_dir), EvalSettings(eval_lens=[32], eval_tokens=64, sliding_stride=0),
                         progress=False)
    with pytest.raises(ConfigError, match=f"out {run}: already holds results.json and report.md"):
        write_outputs(doc, run)
    assert snapshot(run) == before
    written = write_outputs(doc, run, overwrite=True)
    assert run / "results.json" in written and json.loads((run / "results.json").read_text()) == doc
    fresh = tmp_path / "fresh"
    assert (fresh / "report.md") in write_outputs(doc, fresh)
    # a plot alone is held too; overwriting removes an earlier run's plot this run does not make
    plot_only = tmp_path / "plot-only"
    plot_only.mkdir()
    (plot_only / "ppl_vs_length.png").write_bytes(b"old")
    with pytest.raises(ConfigError, match="already holds ppl_vs_length.png"):
        write_outputs(doc, plot_only)
    (run / "passkey_accuracy.png").write_bytes(b"an earlier passkey run")
    written = write_outputs(doc, run, overwrite=True)
    assert not (run / "passkey_accuracy.png").exists() and all(p.exists() for p in written)


@pytest.mark.parametrize("method, message", [
    ("pose-linear", "methods: pose-linear is a fine-tuning mode (it trains with other positions); without its "
                    "fine-tuning it is its base method's config: use linear"),
    ("longrope-search", "methods: longrope-search computes its factors by a search on the model: run `posenc "
                        "search`"),
    ("drope", "methods: drope changes the model so much that it must be trained again at its trained length first"),
])
def test_methods_a_config_edit_cannot_express_are_refused_up_front(method, message):
    """A PoSE mode untrained is its base method (its rows would be the base's numbers under another name); a
    searched method has no factors to write. eval and export refuse both before any work."""
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EvalSettings(methods=["none", method], factor=2.0).validate()
    with pytest.raises(ConfigError, match=message.replace("methods:", "rope_scaling:").replace("(", r"\(")
                       .replace(")", r"\)")):
        export_lab_model("unused.safetensors", "unused", rope_scaling=method, factor=2.0)


def test_every_method_is_checked_against_the_model_before_the_first_one_runs(tmp_path, capsys, no_model_loading):
    """--methods none,linear on a model whose config already has a scaling (no --replace), or on a model without
    RoPE: refused before anything loads (not after 'none' has been evaluated), and --out is not created."""
    folder = tmp_path / "scaled"
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=4 * TRAIN_LEN, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})
    transformers.LlamaForCausalLM(config).save_pretrained(str(folder))
    save_byte_tokenizer(folder)
    out = tmp_path / "out"
    argv = [str(folder), "--methods", "none,linear", "--factor", "2", "--eval-lens", "32", "--no-progress",
            "--out", str(out)]
    assert "already" in fails(capsys, eval_main, argv) and not out.exists()
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, n_positions=64,
                                                         vocab_size=256)).save_pretrained(str(gpt2))
    save_byte_tokenizer(gpt2)
    argv[0] = str(gpt2)
    assert "extend needs a RoPE config" in fails(capsys, eval_main, argv) and not out.exists()


def _interrupted_eval(E, model_dir, out, monkeypatch, extra=()):
    """An eval of methods none,linear into ``out`` stopped by Ctrl-C while loading linear; -> its argv."""
    real = E.load_causal_lm

    def interrupt_linear(*args, **kwargs):
        if kwargs.get("method") == "linear":
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    argv = [str(model_dir), "--eval-lens", "32", "--eval-tokens", "64", "--sliding-stride", "0", "--methods",
            "none,linear", "--factor", "2", "--out", str(out), "--no-progress", *extra]
    monkeypatch.setattr(E, "load_causal_lm", interrupt_linear)
    assert eval_main(argv) == 130
    monkeypatch.setattr(E, "load_causal_lm", real)
    return argv


def test_resume_runs_only_the_methods_an_interrupted_eval_had_left(model_dir, tmp_path, monkeypatch, capsys):
    """--resume keeps the finished methods' rows (their models are not loaded again) and runs the rest: the
    results equal an uninterrupted run's, and the report says it was resumed."""
    from posenc.hf.eval import loop as E
    from posenc.hf.evaluate import eval_main

    out = tmp_path / "out"
    argv = _interrupted_eval(E, model_dir, out, monkeypatch)
    kept = json.loads((out / "results.json").read_text())["results"]
    real, loaded = E.load_causal_lm, []

    def counting(*args, **kwargs):
        loaded.append(kwargs.get("method"))
        return real(*args, **kwargs)

    monkeypatch.setattr(E, "load_causal_lm", counting)
    assert eval_main([*argv, "--resume"]) == 0
    assert loaded == ["linear"]
    doc = json.loads((out / "results.json").read_text())
    assert "incomplete" not in doc["meta"] and doc["meta"]["resumed"][0]["kept"] == ["none"]
    assert [r for r in doc["results"] if r["scaling"] == "none"] == kept
    whole = tmp_path / "whole"
    assert eval_main([a if a != str(out) else str(whole) for a in argv]) == 0
    expected = json.loads((whole / "results.json").read_text())
    assert [(r["scaling"], r["eval_len"], r["value"]) for r in doc["results"]] == \
        [(r["scaling"], r["eval_len"], r["value"]) for r in expected["results"]]
    assert (out / "report.md").is_file()
    assert "complete; nothing to resume" in fails(capsys, eval_main, [*argv, "--resume"])


def test_resume_refuses_what_would_mix_two_evaluations(model_dir, tmp_path, monkeypatch, capsys):
    from posenc.hf.eval import loop as E
    from posenc.hf.evaluate import eval_main

    out = tmp_path / "out"
    argv = _interrupted_eval(E, model_dir, out, monkeypatch)
    other = [a if a != "64" else "96" for a in argv]                    # --eval-tokens 96
    assert "--eval-tokens: 64 then, 96 now" in fails(capsys, eval_main, [*other, "--resume"])
    assert "contradict" in fails(capsys, eval_main, [*argv, "--resume", "--overwrite"])
    no_out = argv[:argv.index("--out")] + argv[argv.index("--out") + 2:]
    assert "pass --out DIR" in fails(capsys, eval_main, [*no_out, "--resume"])
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no results.json" in fails(capsys, eval_main,
                                            [a if a != str(out) else str(empty) for a in argv] + ["--resume"])
    changed = tmp_path / "changed"
    shutil.copytree(model_dir, changed)
    argv_changed = _interrupted_eval(E, changed, tmp_path / "out2", monkeypatch)
    (changed / "config.json").write_text((changed / "config.json").read_text() + "\n")     # another file now
    assert "model's files" in fails(capsys, eval_main, [*argv_changed, "--resume"])
