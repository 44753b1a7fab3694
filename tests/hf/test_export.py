"""Export of lab models to transformers folders: AutoModelForCausalLM.from_pretrained gives the lab model's logits
(posenc's TinyLM is the oracle for transformers' code and vice versa) for every exportable scheme and for every
extension method written into config.json; schemes transformers cannot express are refused with the reason."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 (transformers loads the exports)")

from posenc._internal.errors import CheckpointError, ConfigError  # noqa: E402
from posenc.hf.export import export_lab_model, export_main  # noqa: E402
from posenc.hf.lab_bridge import build_lab_model, save_lab_model, set_lab_extension  # noqa: E402
from posenc.tools.inspect import detect_scheme  # noqa: E402

transformers.logging.set_verbosity_error()

TRAIN_LEN = 32
SHAPE = dict(d_model=48, n_layers=2, n_heads=6, max_len=TRAIN_LEN)  # 6 heads: ALiBi's non-power-of-two slopes


def lab_model(scheme: str, *, perturb_biases: bool = True, **extra):
    """A random TinyLM whose every weight (biases and LayerNorms too, unless told) is away from its init."""
    torch.manual_seed(0)
    model = build_lab_model(scheme=scheme, **{**SHAPE, **extra})
    with torch.no_grad():
        for name, p in model.named_parameters():
            if perturb_biases or not name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def save(tmp_path, model, name="model"):
    return save_lab_model(tmp_path / f"{name}.safetensors", model)


def hf_logits(folder, tokens):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(input_ids=tokens, use_cache=False).logits


def tokens(length, batch=2):
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(length))


def assert_rel_close(got, want, rtol=1e-4):
    assert float((got - want).abs().max()) <= rtol * float(want.abs().max())


CASES = {  # name -> (scheme, model options, perturb biases, eval length)
    "rope": ("rope", {}, True, 48),
    "rope-interleaved": ("rope", {"rope_layout": "interleaved"}, True, 48),
    "rope-unscaled-embeddings": ("rope", {"scale_embeddings": False, "rope_base": 500.0}, True, 48),
    "nope": ("nope", {}, True, 48),
    "learned": ("learned", {}, True, TRAIN_LEN),
    "sinusoidal": ("sinusoidal", {}, True, 80),
    "alibi": ("alibi", {}, False, 80),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_logits_equal(case, tmp_path):
    scheme, options, biases, length = CASES[case]
    model = lab_model(scheme, perturb_biases=biases, **options)
    res = export_lab_model(save(tmp_path, model), tmp_path / "out")
    assert res.check_max_rel_err is not None and res.check_max_rel_err <= 1e-4
    x = tokens(length)
    with torch.no_grad():
        want = model(x)
    assert_rel_close(hf_logits(tmp_path / "out", x), want)
    meta = json.loads((tmp_path / "out" / "posenc_export.json").read_text())
    assert meta["architecture"] == res.architecture and meta["lab_model"]["scheme"] == scheme


def test_trained_bias_free_alibi_model_round_trips_through_mpt(tmp_path):
    """ModelConfig(bias=False) is MPT's block: a model trained a few steps (every weight moved, LayerNorm gains
    included) exports to MptForCausalLM with the lab's logits, past its training length too."""
    torch.manual_seed(0)
    model = build_lab_model(scheme="alibi", bias=False, **SHAPE).train()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    text = torch.tensor(list(b"def f(x):\n    return x * 2 + 1\n" * 20))
    for step in range(8):
        x = torch.stack([text[i:i + TRAIN_LEN + 1] for i in range(step, step + 64, 16)])
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).transpose(1, 2), x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert all(not torch.equal(v, start[k]) for k, v in model.state_dict().items() if v.is_floating_point())
    res = export_lab_model(save(tmp_path, model), tmp_path / "out", max_positions=128)
    assert res.architecture == "MptForCausalLM" and res.check_max_rel_err <= 1e-4
    x = tokens(3 * TRAIN_LEN)
    with torch.no_grad():
        want = model(x)
    assert_rel_close(hf_logits(tmp_path / "out", x), want)


def test_architectures_and_limits(tmp_path):
    from transformers import AutoConfig

    expect = {"rope": ("gpt_neox", None), "nope": ("gpt_neox", None), "learned": ("gpt2", TRAIN_LEN),
              "sinusoidal": ("gpt2", 16 * TRAIN_LEN), "alibi": ("mpt", 100)}
    for scheme, (model_type, limit) in expect.items():
        out = tmp_path / scheme
        res = export_lab_model(save(tmp_path, lab_model(scheme, perturb_biases=scheme != "alibi"), scheme), out,
                               max_positions=100 if scheme == "alibi" else None, check=False)
        assert AutoConfig.from_pretrained(str(out)).model_type == model_type
        assert res.max_positions == limit
        # read back as the scheme it was trained with (posenc eval labels its rows with it)
        detected = detect_scheme(json.loads((out / "config.json").read_text()))[0]
        assert detected == {"sinusoidal": "learned"}.get(scheme, scheme)
    rope = AutoConfig.from_pretrained(str(tmp_path / "nope")).rope_parameters
    assert rope["partial_rotary_factor"] == 0.0  # NoPE: transformers rotates no dimension


def test_refusals_name_the_reason(tmp_path):
    with pytest.raises(ConfigError, match="rope\\+alibi.*no transformers architecture applies RoPE and an ALiBi"):
        export_lab_model(save(tmp_path, lab_model("rope+alibi")), tmp_path / "a")
    # a trained ALiBi model has LayerNorm and MLP biases, which MPT's block cannot hold
    with pytest.raises(ConfigError, match="MPT.*LayerNorm biases are non-zero.*MLP biases are non-zero.*--bias no"):
        export_lab_model(save(tmp_path, lab_model("alibi")), tmp_path / "b")
    with pytest.raises(ConfigError, match="rope_scaling: only a RoPE model"):
        export_lab_model(save(tmp_path, lab_model("nope")), tmp_path / "c", rope_scaling="yarn", factor=2.0)
    with pytest.raises(ConfigError, match="factor: rope_scaling needs"):
        export_lab_model(save(tmp_path, lab_model("rope")), tmp_path / "d", rope_scaling="yarn")
    with pytest.raises(ConfigError, match="max_positions: a learned table has exactly max_len = 32"):
        export_lab_model(save(tmp_path, lab_model("learned")), tmp_path / "e", max_positions=64)


def test_output_folder_rules(tmp_path):
    path = save(tmp_path, lab_model("rope"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match="not empty; pass overwrite=True"):
        export_lab_model(path, out, check=False)
    assert (out / "keep.txt").exists()
    export_lab_model(path, out, overwrite=True, check=False)
    assert not (out / "keep.txt").exists() and (out / "config.json").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporaries left behind
    export_lab_model(path, tmp_path / "new" / "deeper" / "out", check=False)    # missing parents are made
    assert (tmp_path / "new" / "deeper" / "out" / "config.json").exists()


def test_run_folder_and_scheme_pick_the_lowest_seed(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    save_lab_model(run / "checkpoints" / "lm-rope-seed3.safetensors", lab_model("rope"))
    save_lab_model(run / "checkpoints" / "lm-rope-seed1.safetensors", lab_model("rope"))
    save_lab_model(run / "checkpoints" / "lm-rope-ft-yarn-seed0.safetensors", lab_model("rope"))
    res = export_lab_model(run, tmp_path / "out", scheme="rope", check=False)
    assert res.checkpoint.endswith("lm-rope-seed1.safetensors")
    with pytest.raises(CheckpointError, match="no checkpoint for task 'lm', scheme 'alibi'"):
        export_lab_model(run, tmp_path / "out2", scheme="alibi")
    with pytest.raises(ConfigError, match="pass scheme"):
        export_lab_model(run, tmp_path / "out3")


# ---- extension methods: transformers' implementation of the written config == the lab's meaning of the method ----

LAB_METHODS = ["linear", "ntk", "dynamic", "yarn", "llama3"]


@pytest.fixture(scope="module")
def rope_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rope")
    model = lab_model("rope")
    return save(folder, model), folder


@pytest.mark.parametrize("method", LAB_METHODS)
def test_extension_methods_run_by_transformers_match_the_lab(method, rope_checkpoint, tmp_path):
    path, _ = rope_checkpoint
    factor, length = 4.0, 4 * TRAIN_LEN
    res = export_lab_model(path, tmp_path / method, rope_scaling=method, factor=factor)
    from posenc.hf.lab_bridge import load_lab_model

    model, _ = load_lab_model(path)
    x = tokens(length)
    with torch.no_grad():
        plain = model(x)
        if method == "dynamic":  # the factor asked is the factor written (as posenc extend): transformers' rule at 4
            from posenc.hf.lab_bridge import set_lab_scaling

            set_lab_scaling(model, {"rope_type": "dynamic", "factor": factor}, TRAIN_LEN)
        else:
            set_lab_extension(model, method, factor)
        want = model(x)
    got = hf_logits(tmp_path / method, x)
    assert_rel_close(got, want)
    assert float((got - plain).abs().max()) > 1e-3 * float(plain.abs().max())  # the method changed the model
    expected_type = "default" if method == "ntk" else method  # transformers lacks static NTK: a rescaled theta
    assert res.rope_scaling["rope_type"] == expected_type
    if method != "ntk":
        assert res.rope_scaling["factor"] == factor


def test_longrope_export_runs_the_written_factors(rope_checkpoint, tmp_path):
    """longrope is not a lab method: the exported config (extend's unsearched factors) is the oracle's input."""
    path, _ = rope_checkpoint
    res = export_lab_model(path, tmp_path / "lr", rope_scaling="longrope", factor=4.0)
    assert res.rope_scaling["rope_type"] == "longrope" and res.check_max_rel_err <= 1e-4
    from posenc.hf.lab_bridge import load_lab_model, set_lab_scaling

    model, _ = load_lab_model(path)
    scaling = {k: v for k, v in res.rope_scaling.items() if k not in ("rope_theta", "partial_rotary_factor")}
    set_lab_scaling(model, scaling, 4 * TRAIN_LEN)
    x = tokens(3 * TRAIN_LEN)
    with torch.no_grad():
        want = model(x)
    assert_rel_close(hf_logits(tmp_path / "lr", x), want)


# ---- the byte tokenizer ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def byte_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from posenc.hf.tokenizer import save_byte_tokenizer

    folder = save_byte_tokenizer(tmp_path_factory.mktemp("tok"))
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=40))
def test_byte_tokenizer_ids_are_the_utf8_bytes(byte_tok, text):
    ids = byte_tok(text)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert byte_tok.decode(ids) == text


def test_byte_tokenizer_is_recognised(byte_tok):

    from posenc.hf.tokenizer import is_byte_tokenizer

    assert len(byte_tok) == 256 and is_byte_tokenizer(byte_tok)
    assert byte_tok.decode([0xC3]) == bytes([0xC3]).decode("utf-8", errors="replace")  # a lone byte of a character


def test_export_command(tmp_path, capsys):
    path = save(tmp_path, lab_model("rope"))
    assert export_main([str(path), "--out", str(tmp_path / "cli"), "--rope-scaling", "yarn", "--factor", "2"]) == 0
    out = capsys.readouterr().out
    assert "rope -> GPTNeoXForCausalLM" in out and "max relative difference" in out
    assert export_main([str(path), "--out", str(tmp_path / "cli")]) == 2  # not empty, no --overwrite
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc export: error: out ") and "\n" not in err


def test_the_export_check_reaches_past_the_training_length_with_an_extension(tmp_path):
    """A model trained on more than 256 tokens with an extension written: the check runs past the training
    length, where the method acts (dynamic NTK grows only there)."""
    path = save(tmp_path, lab_model("rope", max_len=300))
    res = export_lab_model(path, tmp_path / "dyn", rope_scaling="dynamic", factor=2.0)
    assert res.check_length == 300 + 128 and res.check_max_rel_err <= 1e-4
    assert export_lab_model(path, tmp_path / "plain").check_length == 256


def test_an_interrupted_runs_checkpoint_is_exported_with_a_warning(tmp_path):
    from posenc.lab.checkpoint import save_checkpoint

    model = lab_model("rope")
    path = save_checkpoint(tmp_path / "half.safetensors", model, None, 2,
                           {"model": model.cfg.to_dict(), "train": {"steps": 10}})
    with pytest.warns(UserWarning, match="holds step 2 of 10: an interrupted run's model"):
        res = export_lab_model(path, tmp_path / "out", check=False)
    record = json.loads((tmp_path / "out" / "posenc_export.json").read_text())
    assert record["training"] == {"step": 2, "steps": 10, "stopped_by_criterion": False}
    assert any("interrupted run" in n for n in res.notes)


@pytest.mark.parametrize("factor", [1.5, 2.0, 4.0, 8.0])
def test_export_writes_the_factor_asked_for_as_extend_does(rope_checkpoint, tmp_path, factor):
    """export --rope-scaling METHOD --factor F writes factor F, the value posenc extend --factor F writes."""
    path, _ = rope_checkpoint
    for method in ("dynamic", "linear", "yarn"):
        export_lab_model(path, tmp_path / f"{method}{factor}", rope_scaling=method, factor=factor, check=False)
        written = json.loads((tmp_path / f"{method}{factor}" / "config.json").read_text())
        assert written["rope_parameters"]["rope_type"] == method
        assert written["rope_parameters"]["factor"] == factor
