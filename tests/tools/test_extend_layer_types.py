"""posenc extend on a config with RoPE parameters per layer type (Gemma 3's local / global layers): only the
full-attention entry is rescaled, the sliding one is kept, and transformers is the oracle. On a tiny random Gemma 3:
the written config loads; its rotary's full-attention frequencies are transformers' own ROPE_INIT_FUNCTIONS on an
equivalent single-set config, its sliding ones unchanged bit for bit; the model eval loads (``load_causal_lm`` with a
method and factor) gives the logits of transformers' model with exactly those frequencies; and a per-layer-type
config with no full-attention entry is refused in one line. The rule itself is posenc.rope.layers'."""

from __future__ import annotations

import copy
import io
import json
import logging
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.0")

from posenc._internal.errors import ConfigError  # noqa: E402
from posenc.cli import main  # noqa: E402
from posenc.rope.layers import global_rope_entry, global_rope_view, with_global_rope  # noqa: E402
from posenc.tools.extend import extend_config, unscaled_config  # noqa: E402

LMAX, TARGET = 32, 128          # 4x
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=97, max_position_embeddings=LMAX, head_dim=16, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"])


def gemma3_config(**extra):
    return transformers.Gemma3TextConfig(**{**TINY, **extra})


def write(folder, config: dict):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def load_quietly(folder):
    """AutoConfig of ``folder``, asserting transformers logs and warns nothing (a key it ignores, a bad value)."""
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            config = transformers.AutoConfig.from_pretrained(str(folder))
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not log.getvalue().strip() and not caught, (log.getvalue(), [str(w.message) for w in caught])
    return config


def single_set_frequencies(entry: dict, max_positions: int):
    """transformers' own (inv_freq, attention scaling) for ``entry`` as the only RoPE of an equivalent Llama config
    (same head_dim, context), through ROPE_INIT_FUNCTIONS: the oracle for Gemma 3's full-attention layers."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    llama = transformers.LlamaConfig(hidden_size=TINY["hidden_size"], num_attention_heads=TINY["num_attention_heads"],
                                     head_dim=TINY["head_dim"], max_position_embeddings=max_positions,
                                     rope_parameters=copy.deepcopy(entry))
    if entry["rope_type"] == "default":
        d = TINY["head_dim"]
        return 1.0 / entry["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d), 1.0
    return ROPE_INIT_FUNCTIONS[entry["rope_type"]](llama, "cpu")


@pytest.mark.parametrize("form", [5, 4])
@pytest.mark.parametrize("method", ["yarn", "linear", "ntk", "llama3", "longrope", "dynamic"])
@pytest.mark.parametrize("given", ["nested", "local_base"])
def test_only_the_global_layers_are_rescaled_as_transformers_computes_it(tmp_path, method, form, given):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    source = gemma3_config().to_dict()
    if given == "local_base":             # the 4.x file form: rope_theta + rope_local_base_freq, no nested dict
        source.pop("rope_parameters")
        source |= {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": None}
    result = extend_config(source, TARGET, method, transformers_version=form)
    config = load_quietly(write(tmp_path / "out", result.config))                      # (a) it loads
    assert result.original_context == LMAX and result.factor == TARGET / LMAX
    before = Gemma3RotaryEmbedding(gemma3_config())
    after = Gemma3RotaryEmbedding(config)
    entry = config.rope_parameters["full_attention"]
    assert entry["rope_type"] == result.check["rope_type"]
    inv, scaling = single_set_frequencies(entry, config.max_position_embeddings)      # (b) transformers' oracle
    torch.testing.assert_close(after.full_attention_inv_freq, inv.float(), rtol=0, atol=0)
    assert after.full_attention_attention_scaling == scaling
    assert torch.equal(after.sliding_attention_inv_freq, before.sliding_attention_inv_freq)  # bit for bit
    assert after.sliding_attention_attention_scaling == 1.0
    assert config.rope_parameters["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert result.notes[0] == ("RoPE per layer type: only the full_attention (global) entry is rescaled, factor 4 "
                               "(its original context 32, target 128); sliding_attention left as given: those "
                               "layers attend within their 8-token window, inside the trained range")
    if method != "ntk":          # ntk is written as a raised base; the others keep it
        assert entry["rope_theta"] == 1e6


def test_eval_loading_changes_only_the_global_layers(tmp_path):
    """(c) what ``posenc eval --methods yarn --factor 4`` loads (load_causal_lm with the method): the logits of
    transformers' own model whose full-attention rotary holds ROPE_INIT_FUNCTIONS' YaRN, sliding untouched."""
    from posenc.hf.loading import load_causal_lm

    torch.manual_seed(0)
    reference = transformers.Gemma3ForCausalLM(gemma3_config()).eval()
    folder = tmp_path / "gemma3"
    reference.save_pretrained(folder)
    model, config, extended = load_causal_lm(str(folder), method="yarn", factor=4.0, log=lambda *a: None,
                                             progress=False)
    assert config.rope_parameters["full_attention"]["rope_type"] == "yarn" and extended.factor == 4.0
    rotary = reference.model.rotary_emb
    inv, scaling = single_set_frequencies(config.rope_parameters["full_attention"], config.max_position_embeddings)
    unscaled = copy.deepcopy(reference)
    rotary.full_attention_inv_freq = inv.float()
    rotary.full_attention_original_inv_freq = inv.float().clone()
    rotary.full_attention_attention_scaling = scaling
    ids = torch.randint(0, TINY["vocab_size"], (2, 3 * LMAX), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want, plain = (m(input_ids=ids, use_cache=False).logits for m in (model, reference, unscaled))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    assert (got - plain).abs().max() > 1e-4           # the global layers did change


def test_unscaled_config_takes_the_scaling_off_the_global_entry_only():
    """tune / eval --replace: a Gemma 3 with linear x8 on its global layers comes back plain, local base kept."""
    source = gemma3_config(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                           max_position_embeddings=8 * LMAX).to_dict()
    plain = unscaled_config(source)
    assert plain["rope_parameters"] == {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                        "full_attention": {"rope_type": "default", "rope_theta": 1e6}}
    assert plain["max_position_embeddings"] == LMAX


def test_no_full_attention_entry_is_one_clear_line(tmp_path, capsys):
    """(d) per-layer-type RoPE with no full-attention entry: which layers to rescale is not stated."""
    source = {**gemma3_config().to_dict(), "layer_types": ["sliding_attention", "chunked_attention"],
              "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                  "chunked_attention": {"rope_type": "default", "rope_theta": 1e6}}}
    path = write(tmp_path / "in", source) / "config.json"
    out = tmp_path / "out.json"
    assert main(["extend", str(path), "--target-length", str(TARGET), "--method", "yarn", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("posenc extend: error: the config has RoPE parameters per layer type (sliding_attention, "
                   "chunked_attention) but its 'full_attention' entry is missing: a context extension rescales the "
                   "global (full-attention) layers only, and which those are is not stated") and not out.exists()
    source["rope_parameters"]["full_attention"] = None
    with pytest.raises(ConfigError, match="its 'full_attention' entry is null"):
        extend_config(source, TARGET, "linear")


def test_the_4x_form_is_refused_where_rope_scaling_would_reach_the_local_layers():
    """ModernBERT's 4.x rope_scaling rescales both layer types: only the nested 5.x form keeps the local one."""
    from pathlib import Path

    path = Path(__file__).parent.parent / "fixtures" / "configs" / "modernbert-base.json"
    with pytest.raises(ConfigError, match="transformers 4.x's form cannot rescale the full_attention RoPE .*"
                                          "--transformers-version 5"):
        extend_config(path, 4 * 8192, "linear", transformers_version=4)
    written = extend_config(path, 4 * 8192, "linear").config["rope_parameters"]
    assert written == {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 160000.0},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}


def test_the_shared_rule_round_trips():
    """global_rope_view / with_global_rope: a single-set config is None; an unedited view writes back the same."""
    assert global_rope_entry({"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e4}) is None
    source = gemma3_config().to_dict()
    view = global_rope_view(source)
    assert view["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6} and "rope_theta" not in view
    assert with_global_rope(source, view)["rope_parameters"] == source["rope_parameters"]


def test_tune_plans_the_frequency_methods_and_reads_the_global_entrys_length(tmp_path):
    """posenc tune on Gemma 3: every frequency method is a candidate (extend decides, as eval's loading does); a
    scaled global entry (Gemma 3 4B: linear x8) is the configured scaling, its trained length the global one's even
    when transformers 5 lists the sliding entry first."""
    from posenc.hf.tune.configured import configured, same_frequencies
    from posenc.hf.tune.plan import candidates
    from posenc.rope.contexts import trained_length

    plain = gemma3_config().to_dict()
    cands, skipped = candidates(plain, LMAX, TARGET)
    assert {c.method for c in cands if c.kind == "config"} == {"linear", "ntk", "dynamic", "yarn", "llama3",
                                                            "longrope"}
    assert not any("per layer type" in why for _, why in skipped)
    scaled = gemma3_config(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                            "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                               "rope_theta": 1e6}},
                           max_position_embeddings=8 * LMAX).to_dict()
    assert list(scaled["rope_parameters"])[0] == "sliding_attention" and trained_length(scaled) == LMAX
    own = configured(scaled, tmp_path)
    assert own is not None and own.rope_type == "linear"
    again = extend_config(scaled, 8 * LMAX, "linear", replace=True).config
    assert same_frequencies(again, scaled, 8 * LMAX)


def test_a_window_past_the_original_context_is_a_warning():
    """Sliding layers whose window is longer than the trained context would see untrained distances: said first."""
    result = extend_config(gemma3_config(sliding_window=2 * LMAX).to_dict(), TARGET, "yarn")
    assert result.notes[0].startswith("WARNING: RoPE per layer type: only the full_attention (global) entry")
    assert result.notes[0].endswith("their window (64 tokens) is longer than the original context, so past it they "
                                    "see distances they did not train on")
