"""LongRoPE's search on a transformers model folder: the candidates run through transformers' own longrope code
(the searched fitness is what transformers computes with the written config), the config is written beside the
model (never over config.json) and loads in transformers with posenc's frequencies."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 (transformers runs the models)")

from posenc._internal.errors import ConfigError  # noqa: E402
from posenc.hf.lab_bridge import training_bytes  # noqa: E402
from posenc.hf.search import search_main, search_model  # noqa: E402
from posenc.hf.tokenizer import save_byte_tokenizer  # noqa: E402
from posenc.search.fitness import lm_perplexity  # noqa: E402
from posenc.search.longrope import LongRopeSettings  # noqa: E402

transformers.logging.set_verbosity_error()

L0, TARGET = 32, 128
SMALL = LongRopeSettings(population=6, parents=3, generations=2, heldout_top=2)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    import posenc

    root = Path(posenc.__file__).parent
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text("".join(p.read_text() for p in sorted(root.rglob("*.py")))[:60_000])
    return str(path)


def tiny_llama(folder: Path) -> Path:
    """A random Llama (head dim 16: 8 rotary pairs) trained for L0 = 32 positions, with the byte tokenizer."""
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=L0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(str(folder))
    save_byte_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def searched(tmp_path_factory, text_file):
    folder = tiny_llama(tmp_path_factory.mktemp("llama"))
    before = (folder / "config.json").read_bytes()
    res = search_model(folder, TARGET, settings=SMALL, data=text_file, windows=2, heldout_windows=2, progress=False)
    return folder, before, res


def test_config_is_written_beside_the_model_and_loads_with_posencs_frequencies(searched):
    import posenc
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    folder, before, res = searched
    assert (folder / "config.json").read_bytes() == before
    assert Path(res.config_path) == folder / f"config.longrope-{TARGET}.json"
    config = transformers.AutoConfig.from_pretrained(res.config_path)
    rope = config.rope_parameters
    assert rope["rope_type"] == "longrope" and rope["original_max_position_embeddings"] == L0
    assert rope["long_factor"] == pytest.approx(res.result.factors) and rope["short_factor"] == [1.0] * 8
    rotary = LlamaRotaryEmbedding(config)
    for length in (L0, TARGET):  # short factors inside L0, the searched long factors past it
        rotary(torch.zeros(1, length, 32), torch.arange(length)[None])
        inv, scaling = posenc.rope_parameters(res.config_path, seq_len=length)
        torch.testing.assert_close(rotary.inv_freq.float(), inv, rtol=1e-6, atol=0)
        assert rotary.attention_scaling == pytest.approx(scaling, rel=1e-6)
    default, _ = posenc.rope_parameters(folder / "config.json")
    torch.testing.assert_close(inv, default / torch.tensor(res.result.factors, dtype=torch.float32), rtol=1e-6,
                               atol=0)
    assert math.sqrt(1 + math.log(TARGET / L0) / math.log(L0)) == pytest.approx(scaling, rel=1e-6)


def test_the_searched_fitness_is_what_transformers_computes_with_the_written_config(searched, text_file):
    """Loading the model with the written config and scoring the search windows reproduces the winner's fitness,
    and the winner beats or ties every seed (PI, NTK, YaRN) on the search windows."""
    folder, _, res = searched
    config = transformers.AutoConfig.from_pretrained(res.config_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), config=config).eval()
    train, _ = training_bytes(text_file)
    ppl = lm_perplexity(lambda x: model(input_ids=x, use_cache=False), train[:2 * TARGET + 1], TARGET)
    assert ppl == pytest.approx(res.result.fitness, rel=1e-5)
    plain = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    assert lm_perplexity(lambda x: plain(input_ids=x, use_cache=False), train[:2 * TARGET + 1], TARGET) != \
        pytest.approx(ppl, rel=1e-4)  # the factors reached transformers' rotary
    assert set(res.result.seeds) == {"linear", "ntk", "yarn"}
    assert min(res.result.candidates[0]["fitness"], res.result.fitness) <= min(
        e["fitness"] for e in res.result.seeds.values())


def test_rerun_resumes_and_refusals(searched, text_file, tmp_path):
    folder, _, res = searched
    with pytest.raises(ConfigError, match="out_config .*exists; pass overwrite=True"):
        search_model(folder, TARGET, settings=SMALL, data=text_file, windows=2, heldout_windows=2, progress=False)
    again = search_model(folder, TARGET, settings=SMALL, data=text_file, windows=2, heldout_windows=2,
                         overwrite=True, progress=False)  # the finished checkpoint answers
    assert again.result.factors == res.result.factors and again.result.wall_s == res.result.wall_s
    with pytest.raises(ConfigError, match="is the config.json of the model folder .*never writes over a model's"):
        search_model(folder, TARGET, out_config=folder / "config.json", progress=False)
    with pytest.raises(ConfigError, match="target_length must be"):
        search_model(folder, L0, progress=False)
    with pytest.raises(ConfigError, match="n_hat_choices: transformers' longrope has no n_hat"):
        search_model(folder, TARGET, settings=LongRopeSettings(n_hat_choices=(0, 4)), progress=False)
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, n_positions=32,
                                                         vocab_size=256)).save_pretrained(str(gpt2))
    with pytest.raises(ConfigError, match="LongRoPE rescales RoPE frequencies; this model is"):
        search_model(gpt2, TARGET, progress=False)


def test_search_command(tmp_path, text_file, capsys):
    folder = tiny_llama(tmp_path / "m")
    out = tmp_path / "searched.json"
    assert search_main([str(folder), "--target-length", "64", "--data", text_file, "--windows", "1",
                        "--heldout-windows", "1", "--population", "4", "--parents", "2", "--generations", "1",
                        "--heldout-top", "1", "--out-config", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "| seed yarn |" in printed and "| searched |" in printed and out.is_file()
    assert (tmp_path / "longrope-search-64.json").is_file()
    assert search_main([str(folder), "--target-length", "16", "--no-progress"]) == 2
    assert "posenc search: error: --target-length must be" in capsys.readouterr().err


def test_eval_runs_the_searched_config(searched, text_file):
    """posenc eval MODEL_DIR --config SEARCHED: transformers with the searched config, lengths against L0."""
    from posenc.hf.evaluate import EvalSettings, evaluate_model
    from posenc.hf.lab_bridge import validation_bytes

    folder, _, res = searched
    doc = evaluate_model(str(folder), EvalSettings(eval_lens=[TARGET], config=res.config_path, data=text_file,
                                                   eval_tokens=2 * TARGET, sliding_stride=0), progress=False)
    (row,) = doc["results"]
    assert row["train_len"] == L0 and doc["meta"]["methods"]["none"]["rope_parameters"]["rope_type"] == "longrope"
    assert row["scaling"] == "longrope"  # the lab's tables label it "rope + LongRoPE"
    config = transformers.AutoConfig.from_pretrained(res.config_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), config=config).eval()
    val, _ = validation_bytes(text_file)
    want = lm_perplexity(lambda x: model(input_ids=x, use_cache=False), val[:2 * TARGET + 1], TARGET)
    assert row["value"] == pytest.approx(want, rel=1e-5)


def test_a_checkpoint_resumes_only_the_same_model_and_text(tmp_path, text_file):
    """Two models (or two texts) sharing a checkpoint path: the second search is refused instead of handed the
    first one's finished record (which it would write as its own config)."""
    from posenc._internal.errors import CheckpointError

    a = tiny_llama(tmp_path / "a")
    b = tmp_path / "b"
    config = transformers.AutoConfig.from_pretrained(str(a))
    torch.manual_seed(1)                                               # same shape, other weights
    transformers.LlamaForCausalLM(config).save_pretrained(str(b))
    save_byte_tokenizer(b)
    shared = tmp_path / "configs"
    shared.mkdir()
    kw = dict(settings=SMALL, windows=1, heldout_windows=1, progress=False)
    first = search_model(a, 64, data=text_file, out_config=shared / "a.json", **kw)
    with pytest.raises(CheckpointError, match="written by a search with other arguments"):
        search_model(b, 64, data=text_file, out_config=shared / "b.json", **kw)
    other_text = tmp_path / "other.txt"
    other_text.write_text(Path(text_file).read_text()[::-1])
    with pytest.raises(CheckpointError, match="written by a search with other arguments"):
        search_model(a, 64, data=str(other_text), out_config=shared / "a.json", overwrite=True, **kw)
    again = search_model(a, 64, data=text_file, out_config=shared / "a.json", overwrite=True, **kw)
    assert again.result.factors == first.result.factors and again.result.wall_s == first.result.wall_s
    fresh = search_model(b, 64, data=text_file, out_config=shared / "b.json", resume=False, **kw)
    assert fresh.result.fitness != first.result.fitness


def test_the_checkpoint_never_replaces_a_model_file_or_the_written_config(tmp_path, text_file):
    folder = tiny_llama(tmp_path / "m")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    kw = dict(settings=SMALL, data=text_file, windows=1, heldout_windows=1, progress=False, resume=False)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        with pytest.raises(ConfigError, match=f"is a file of the model folder \\({name}\\), not a LongRoPE"):
            search_model(folder, 64, checkpoint=folder / name, **kw)
    out = tmp_path / "new.json"
    with pytest.raises(ConfigError, match="is also out_config"):
        search_model(folder, 64, checkpoint=out, out_config=out, **kw)
    elsewhere = tmp_path / "notes.json"
    elsewhere.write_text('{"mine": 1}')
    from posenc._internal.errors import CheckpointError
    with pytest.raises(CheckpointError, match="exists and is not a LongRoPE search checkpoint"):
        search_model(folder, 64, checkpoint=elsewhere, out_config=out, **kw)
    assert elsewhere.read_text() == '{"mine": 1}'
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_per_layer_type_rope_searches_the_global_layers_only(tmp_path, text_file):
    """Gemma 3 (local and global RoPE per layer type): the searched factors go into the full_attention entry only
    (posenc.rope.layers' rule, as posenc extend writes it); the sliding layers keep their plain RoPE."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    config = transformers.Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=256,
                                           max_position_embeddings=L0, sliding_window=8,
                                           layer_types=["sliding_attention", "full_attention"],
                                           bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    transformers.Gemma3ForCausalLM(config).eval().save_pretrained(str(tmp_path))
    save_byte_tokenizer(tmp_path)
    res = search_model(tmp_path, TARGET, settings=LongRopeSettings(population=4, parents=2, generations=0,
                                                                   heldout_top=1),
                       data=text_file, windows=1, heldout_windows=1, progress=False)
    written = transformers.AutoConfig.from_pretrained(res.config_path)
    rope = written.rope_parameters
    assert rope["full_attention"]["rope_type"] == "longrope" and res.original_context == L0
    assert rope["full_attention"]["long_factor"] == pytest.approx(res.result.factors)
    assert rope["sliding_attention"] == config.rope_parameters["sliding_attention"]
    assert torch.equal(Gemma3RotaryEmbedding(written).sliding_attention_inv_freq,
                       Gemma3RotaryEmbedding(config).sliding_attention_inv_freq)


@pytest.mark.parametrize("population", [4, 5, 8, 16, 64])
def test_the_parents_default_follows_the_population(population, monkeypatch):
    """--population N alone is a valid search (the default --parents is half of it, the paper's 32 of 64)."""
    import argparse

    from posenc.hf import search as hf_search
    from posenc.search.longrope import LongRopeSettings

    seen = {}

    def fake_search(model, target, *, settings, resume, **kw):
        seen.update(settings=settings, resume=resume)
        return None

    monkeypatch.setattr(hf_search, "search_model", fake_search)
    monkeypatch.setattr(hf_search, "format_result", lambda res: "")
    parser = argparse.ArgumentParser()
    hf_search.add_arguments(parser)
    assert hf_search.run(parser.parse_args(["m", "--target-length", "64", "--population", str(population)])) == 0
    assert seen["settings"].parents == population // 2 and seen["resume"] is True
    assert LongRopeSettings().parents == LongRopeSettings().population // 2     # the paper's ratio, as the default
    hf_search.run(parser.parse_args(["m", "--target-length", "64", "--no-resume"]))   # the old spelling
    assert seen["resume"] is False
    hf_search.run(parser.parse_args(["m", "--target-length", "64", "--fresh", "--parents", "3"]))
    assert seen["resume"] is False and seen["settings"].parents == 3
