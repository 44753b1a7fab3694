"""The published-config corpus (tests/fixtures/configs, the position keys of 49 real config.json files, and of 2
transformers config classes' defaults where no published file could be read: the ``*-config-defaults`` ones):
``posenc inspect`` describes each as published (facts below, typed from the model cards / papers) with no error and
no warning except the true ones listed; posenc's frequencies equal the family's own transformers rotary class built
from the same file; ``posenc extend`` extends or refuses with the reason; ``posenc pick`` reads theta and length."""

from __future__ import annotations

import importlib
import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from posenc import rope_parameters
from posenc._internal.errors import PosencError
from posenc.rope.config import load_rope_config, rope_layer_types, rope_section
from posenc.rope.scaling import STATIC_BASE_KEYS, ntk_theta
from posenc.tools.extend import ACCEPTED_ROPE_TYPES, extend_config
from posenc.tools.inspect import format_report, inspect_config
from posenc.tools.pick import config_context, pick

CONFIGS = Path(__file__).parent.parent / "fixtures" / "configs"
NAMES = sorted(p.stem for p in CONFIGS.glob("*.json"))


def g(m, s):
    """DeepSeek's softmax multiplier g(s, m)^2 = (0.1 m ln s + 1)^2, typed here from the model code's formula."""
    return (0.1 * m * math.log(s) + 1) ** 2


# name: (scheme, {layer type or None: (rope_type, theta, rotary_dim, head_dim)}, original, claimed, extra facts)
# extra: nope (count of NoPE layers), chunk, layout, axes (M-RoPE pairs per t/h/w), interleaved, vision
# (rope_type, head_dim), mult (softmax multiplier), warnings (substrings of the true warnings), extend (reason
# substring when extend must refuse), kinds ({attention kind: layers}), query_temperature ((beta, original)),
# learned (Mistral Large 4's learned LeRoPE frequencies and query scale),
# sink_logits
CORPUS = {
    "bert-base-uncased": ("learned", None, None, 512, {}),
    "bloom-560m": ("alibi", None, None, None, {}),
    "codellama-7b": ("rope", {None: ("default", 1e6, 128, 128)}, 16384, 16384, {}),
    "command-r-v01": ("rope", {None: ("default", 8e6, 128, 128)}, 8192, 8192, {"layout": "interleaved"}),
    "deepseek-v2-lite": ("rope", {None: ("yarn", 1e4, 64, 64)}, 4096, 163840,
                         {"mult": g(0.707, 40), "layout": "interleaved", "extend": "already uses rope_type 'yarn'"}),
    "deepseek-v3": ("rope", {None: ("yarn", 1e4, 64, 64)}, 4096, 163840,
                    {"mult": g(1.0, 40), "layout": "interleaved", "extend": "already uses"}),
    # the file has no max_position_embeddings: transformers' FalconConfig puts its default 2048 there
    "falcon-7b": ("rope", {None: ("default", 1e4, 64, 64)}, 2048, 2048,
                  {"warnings": ["max_position_embeddings is absent: transformers' falcon config class puts 2,048"]}),
    "gemma-2-9b": ("rope", {None: ("default", 1e4, 256, 256)}, 8192, 8192,
                   {"kinds": {"sliding_attention": 21, "full_attention": 21}}),
    "gemma-3-1b-it": ("rope", {"full_attention": ("default", 1e6, 256, 256),
                               "sliding_attention": ("default", 1e4, 256, 256)}, 32768, 32768,
                      {"kinds": {"sliding_attention": 22, "full_attention": 4}}),
    "gemma-3-4b-it": ("rope", {"full_attention": ("linear", 1e6, 256, 256),
                               "sliding_attention": ("default", 1e4, 256, 256)}, 16384, 131072,
                      # the file has no original length: posenc assumes Lmax / factor and says so (Gemma 3's
                      # report: pretrained at 32k, then x8)
                      {"kinds": {"sliding_attention": 29, "full_attention": 5}, "extend": "already uses rope_type 'linear'",
                       "warnings": ["linear scaling has no original length"]}),
    "glm-4-9b-0414": ("rope", {None: ("default", 1e4, 64, 128)}, 32768, 32768, {"layout": "interleaved"}),
    "glm-4-9b-chat-hf": ("rope", {None: ("default", 5e6, 64, 128)}, 131072, 131072, {"layout": "interleaved"}),
    "gpt-j-6b": ("rope", {None: ("default", 1e4, 64, 256)}, 2048, 2048, {"layout": "interleaved"}),
    # gpt-oss: yarn x32 with an unrounded correction range, 128-token window on alternate layers, sink logits
    "gpt-oss-20b": ("rope", {None: ("yarn", 150000.0, 64, 64)}, 4096, 131072,
                    {"extend": "already uses", "kinds": {"sliding_attention": 12, "full_attention": 12},
                     "sink_logits": True}),
    "gpt2": ("learned", None, None, 1024, {}),
    "hunyuan-7b-instruct": ("rope", {None: ("ntk_alpha", 1e4, 128, 128)}, 32768, 32768,
                            {"extend": "already uses rope_type 'ntk_alpha'"}),
    "kimi-k2-instruct": ("rope", {None: ("yarn", 5e4, 64, 64)}, 4096, 131072,
                         {"mult": g(1.0, 32), "layout": "interleaved", "extend": "already uses"}),
    "llama-2-7b": ("rope", {None: ("default", 1e4, 128, 128)}, 4096, 4096, {}),
    "llama-3.1-8b": ("rope", {None: ("llama3", 5e5, 128, 128)}, 8192, 131072, {"extend": "already uses"}),
    "llama-3.2-1b": ("rope", {None: ("llama3", 5e5, 64, 64)}, 8192, 131072, {"extend": "already uses"}),
    "llama-4-maverick": ("rope", {None: ("default", 5e5, 128, 128)}, 1048576, 1048576,
                         {"nope": 12, "chunk": 8192, "layout": "interleaved",
                          "kinds": {"chunked_attention": 36, "full_attention": 12}, "vision": ("axial", 88)}),
    "llama-4-scout": ("rope", {None: ("llama3", 5e5, 128, 128)}, 8192, 10485760,
                      {"nope": 12, "chunk": 8192, "layout": "interleaved", "extend": "already uses",
                       "vision": ("axial", 88)}),
    # Ministral 3: yarn x16 with the every-layer query temperature (llama_4_scaling_beta) and no softmax multiplier
    "ministral-3-8b-instruct-2512": ("rope", {None: ("yarn", 1e6, 128, 128)}, 16384, 262144,
                                     {"extend": "query temperature", "query_temperature": (0.1, 16384)}),
    # Mistral Small 4 / Large 4: the config classes' defaults (transformers 5.25), not published files (their
    # _comment says so). Small 4: MLA yarn x128 on the 64-dim qk_rope part, interleaved, DeepSeek's multiplier and
    # the query temperature; Large 4: yarn x2048 from 512, every 4th of 72 layers NoPE, learned LeRoPE and q scale
    "mistral-small-4-config-defaults": ("rope", {None: ("yarn", 1e4, 64, 64)}, 8192, 1048576,
                                        {"layout": "interleaved", "mult": g(1, 128), "extend": "query temperature",
                                         "query_temperature": (0.1, 8192)}),
    "mistral-large-4-config-defaults": ("rope", {None: ("yarn", 1e4, 64, 64)}, 512, 1048576,
                                        {"layout": "interleaved", "nope": 18, "extend": "LeRoPE", "learned": True}),
    "mistral-7b-instruct-v0.3": ("rope", {None: ("default", 1e6, 128, 128)}, 32768, 32768, {}),
    "mistral-7b-v0.1": ("rope", {None: ("default", 1e4, 128, 128)}, 32768, 32768, {}),
    "mistral-nemo-base-2407": ("rope", {None: ("default", 1e6, 128, 128)}, 1024000, 1024000, {}),
    "mistral-small-3.1-24b-instruct": ("rope", {None: ("default", 1e9, 128, 128)}, 131072, 131072,
                                       {"vision": ("axial_pixtral", 64)}),
    "mixtral-8x7b-v0.1": ("rope", {None: ("default", 1e6, 128, 128)}, 32768, 32768, {}),
    "modernbert-base": ("rope", {"full_attention": ("default", 160000.0, 64, 64),
                                 "sliding_attention": ("default", 1e4, 64, 64)}, 8192, 8192,
                        {"kinds": {"full_attention": 8, "sliding_attention": 14}}),
    "mpt-7b": ("alibi", None, None, None, {}),
    # OLMo 3: yarn x8 (attention_factor 1.208) on the 8 full-attention layers only; sliding layers plain RoPE
    "olmo-3-1025-7b": ("rope", {"full_attention": ("yarn", 5e5, 128, 128),
                                "sliding_attention": ("default", 5e5, 128, 128)}, 8192, 65536,
                       {"kinds": {"sliding_attention": 24, "full_attention": 8}, "extend": "already uses"}),
    "olmo-2-1124-7b": ("rope", {None: ("default", 5e5, 128, 128)}, 4096, 4096, {}),
    "phi-2": ("rope", {None: ("default", 1e4, 32, 80)}, 2048, 2048, {}),
    "phi-3.5-mini-instruct": ("rope", {None: ("longrope", 1e4, 96, 96)}, 4096, 131072, {"extend": "already uses"}),
    # Phi-4-mini: LongRoPE over 96 of 128 dims (partial 0.75), mscale sqrt(1 + ln 32 / ln 4096)
    "phi-4-mini-instruct": ("rope", {None: ("longrope", 1e4, 96, 128)}, 4096, 131072, {"extend": "already uses"}),
    "phi-4": ("rope", {None: ("default", 250000.0, 128, 128)}, 16384, 16384, {}),
    "pixtral-12b": ("rope", {None: ("default", 1e9, 128, 128)}, 1024000, 1024000, {"vision": ("axial_pixtral", 64)}),
    "pixtral-12b-vision": ("rope", {}, None, None, {"vision": ("axial_pixtral", 64), "extend": "vision tower"}),
    "pythia-1.4b": ("rope", {None: ("default", 1e4, 32, 128)}, 2048, 2048, {}),
    "qwen2-vl-7b-instruct": ("rope", {None: ("default", 1e6, 128, 128)}, 32768, 32768,
                             {"axes": [16, 24, 24], "interleaved": False, "vision": ("axial", 80)}),
    "qwen2.5-7b-instruct": ("rope", {None: ("default", 1e6, 128, 128)}, 32768, 32768, {}),
    "qwen2.5-7b-instruct-yarn": ("rope", {None: ("yarn", 1e6, 128, 128)}, 32768, 131072,
                                 {"warnings": ["equals the original context"], "extend": "already uses"}),
    "qwen2.5-vl-7b-instruct": ("rope", {None: ("default", 1e6, 128, 128)}, 128000, 128000,
                               {"axes": [16, 24, 24], "interleaved": False, "vision": ("axial", 80)}),
    # Qwen3.5 text: interleaved M-RoPE on 64 of 256 dims (partial 0.25) with the cards' YaRN x4 block
    "qwen3.5-text-yarn": ("rope", {None: ("yarn", 1e7, 64, 256)}, 262144, 1048576,
                          {"axes": [11, 11, 10], "interleaved": True, "warnings": ["equals the original context"],
                           "extend": "already uses", "kinds": {"linear_attention": 24, "full_attention": 8},
                           "nope": 24}),   # the Gated DeltaNet layers have no q/k attention to rotate
    "qwen3-8b": ("rope", {None: ("default", 1e6, 128, 128)}, 40960, 40960, {}),
    "qwen3-vl-8b-instruct": ("rope", {None: ("default", 5e6, 128, 128)}, 262144, 262144,
                             {"axes": [24, 20, 20], "interleaved": True, "vision": ("axial", 72)}),
    "smollm3-3b": ("rope", {None: ("default", 5e6, 128, 128)}, 65536, 65536, {"nope": 9}),
    "stablelm-2-1.6b": ("rope", {None: ("default", 1e4, 16, 64)}, 4096, 4096, {}),
    "t5-base": ("relative_bias", None, None, None, {}),
}


def load(name):
    return json.loads((CONFIGS / f"{name}.json").read_text())


def test_the_corpus_is_covered():
    assert sorted(CORPUS) == NAMES and len(NAMES) >= 30
    families = {load(n).get("model_type") for n in NAMES}
    assert len(families) >= 30


@pytest.mark.parametrize("name", NAMES)
def test_inspect_describes_each_published_config(name):
    scheme, entries, original, claimed, extra = CORPUS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # no Python warning escapes either
        report = inspect_config(CONFIGS / f"{name}.json")
    assert report["scheme"] == scheme
    expected_warnings = extra.get("warnings", [])
    assert len(report["warnings"]) == len(expected_warnings), report["warnings"]
    for needle, warning in zip(expected_warnings, report["warnings"]):
        assert needle in warning
    assert format_report(report)
    json.dumps(report)
    if scheme == "learned":
        assert report["learned"]["table_size"] == claimed
    if scheme != "rope":
        return
    got = {e["layer_type"]: (e["rope_type"], e["rope_theta"], e["rotary_dim"], e["head_dim"]) for e in report["rope"]}
    assert got == entries
    for e in report["rope"]:
        if e["layer_type"] in (None, "full_attention"):     # local layers are not rescaled (Gemma 3)
            assert (e["original_context"], e["claimed_context"]) == (original, claimed)
        assert e["layout"] == extra.get("layout", "half")
        assert e["softmax_scale_multiplier"] == pytest.approx(extra.get("mult", 1.0))
        assert e["effective_logit_scale"] == pytest.approx(e["attention_scaling"] ** 2 * extra.get("mult", 1.0))
        axes = e["position_axes"]
        assert (axes and axes["pairs_per_axis"]) == extra.get("axes"), axes
        if axes:
            assert axes["interleaved"] == extra["interleaved"]
    layers = report.get("layers")
    if layers:
        assert len(layers["nope_layers"]) == extra.get("nope", 0)
        assert layers["attention_chunk_size"] == extra.get("chunk")
        if "kinds" in extra:
            assert layers["layer_types"] == extra["kinds"]
        assert layers["sink_logits"] == extra.get("sink_logits", False)
        assert layers["learned_frequency_scale"] == layers["learned_query_scale"] == extra.get("learned", False)
        q = layers.get("query_temperature")
        assert (q and (q["beta"], q["original"])) == extra.get("query_temperature")
    vision = report.get("vision")
    assert (vision and (vision["rope_type"], vision["head_dim"])) == extra.get("vision")


def _family_rotary(text: dict):
    """transformers' config and text rotary embedding for a fixture's language model, or None when transformers
    has no such class (Kimi K2 ships remote code; GPT-J builds its table without one)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = text.get("model_type")
    if model_type not in CONFIG_MAPPING:
        return None
    config_cls = CONFIG_MAPPING[model_type]
    config = config_cls(**{k: v for k, v in text.items() if k not in ("model_type", "_comment")})
    config = getattr(config, "text_config", None) or config          # Qwen2-VL: flat text keys -> text_config
    modeling = importlib.import_module(config_cls.__module__.replace(".configuration_", ".modeling_"))
    classes = [getattr(modeling, n) for n in dir(modeling) if n.endswith("RotaryEmbedding") and "Vision" not in n]
    emb = classes[0](config) if classes else None
    return emb if emb is not None and (hasattr(emb, "inv_freq") or hasattr(emb, "layer_types")) else None


@pytest.mark.parametrize("name", [n for n in NAMES if CORPUS[n][0] == "rope" and CORPUS[n][1]])
def test_frequencies_equal_the_family_rotary_built_from_the_file(name):
    pytest.importorskip("transformers")
    import transformers

    transformers.logging.set_verbosity_error()
    raw = {k: v for k, v in load(name).items() if k != "_comment"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        emb = _family_rotary(dict(rope_section(raw)))
    if emb is None:
        pytest.skip(f"transformers has no rotary class for {name}")
    for layer_type in rope_layer_types(raw) or [None]:
        want = getattr(emb, "inv_freq" if layer_type is None else f"{layer_type}_inv_freq")
        inv, scaling = rope_parameters(raw, layer_type=layer_type)
        torch.testing.assert_close(inv, want.float(), rtol=2e-6, atol=0)
        hf_scaling = emb.attention_scaling if layer_type is None else getattr(emb, f"{layer_type}_attention_scaling")
        assert scaling == pytest.approx(hf_scaling, rel=1e-9)


def _states_no_context(name: str) -> bool:
    text = rope_section({k: v for k, v in load(name).items() if k != "_comment"})
    return "max_position_embeddings" not in text and "n_positions" not in text


@pytest.mark.parametrize("name", [n for n in NAMES if CORPUS[n][0] == "rope" and CORPUS[n][1]
                                  and _states_no_context(n)])
def test_an_absent_context_is_what_the_transformers_config_class_puts_there(name):
    pytest.importorskip("transformers")
    import transformers

    raw = {k: v for k, v in load(name).items() if k != "_comment"}
    text = dict(rope_section(raw))
    try:
        hf = transformers.AutoConfig.for_model(text["model_type"],
                                               **{k: v for k, v in text.items() if k != "model_type"})
    except (KeyError, ValueError) as exc:
        pytest.skip(f"transformers has no config class for {name} ({exc})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert load_rope_config(raw).max_position_embeddings == getattr(hf, "max_position_embeddings", None)


@pytest.mark.parametrize("name", NAMES)
def test_extend_extends_or_refuses_with_the_reason(name):
    scheme, entries, original, claimed, extra = CORPUS[name]
    path = CONFIGS / f"{name}.json"
    target = 4 * (original or claimed or 4096)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if scheme != "rope":
            with pytest.raises(PosencError, match="extend needs a RoPE config"):
                extend_config(path, target, "yarn")
            return
        method = "yarn"
        if load(name).get("model_type") in ACCEPTED_ROPE_TYPES:      # Phi-3: its config class takes longrope only
            with pytest.raises(PosencError, match="accepts rope_type default or longrope only"):
                extend_config(path, target, "yarn", replace=True)
            method = "longrope"
        if "extend" in extra:
            with pytest.raises(PosencError, match=extra["extend"]):
                extend_config(path, target, method)
            if "already uses" not in extra["extend"]:
                return
            result = extend_config(path, target, method, replace=True)   # --replace swaps it, from L0
        else:
            result = extend_config(path, target, method)
        new = result.config
        text = rope_section(new)
        params = text["rope_parameters"]
        if "full_attention" in entries:     # RoPE per layer type: the global entry only, the others as they were
            params = params["full_attention"]
            again = {e["layer_type"]: e for e in inspect_config(new)["rope"]}
            assert again["full_attention"]["rope_type"] == method
            assert {k: e["rope_type"] for k, e in again.items() if k != "full_attention"} == \
                {k: e[0] for k, e in entries.items() if k != "full_attention"}
        assert params["rope_type"] == method and params["factor"] == pytest.approx(target / original)
        assert params["original_max_position_embeddings"] == original
        assert (params.get("mrope_section") and sum(params["mrope_section"])) == (extra.get("axes") and
                                                                                    sum(extra["axes"]))
        again = inspect_config(new)
        if "full_attention" not in entries:
            assert [e["rope_type"] for e in again["rope"]] == [method]
        assert again["rope"][0]["claimed_context"] == target
        if "vision" in extra:                                   # the vision tower is left as it was
            assert new["vision_config"] == load(name)["vision_config"]


@pytest.mark.parametrize("name", NAMES)
def test_pick_reads_theta_and_length(name):
    scheme, entries, original, claimed, extra = CORPUS[name]
    if scheme != "rope" or not entries or original is None and claimed is None:
        with pytest.raises(PosencError):
            config_context(CONFIGS / f"{name}.json")
        return
    theta = (entries.get(None) or entries["full_attention"])[1]
    assert config_context(CONFIGS / f"{name}.json") == (theta, original or claimed)
    # past what the config claims, an extension is needed: sized from the original context, replacing (and
    # saying so) a scaling the config already has
    rec = pick(2 * (claimed or original), config=CONFIGS / f"{name}.json", budget="finetune")
    snippet = rec.config_snippet["rope_parameters"]
    snippet = snippet.get("full_attention", snippet)      # per-layer-type configs: the global entry is rescaled
    rope_type, _, _, rotary_dim = entries.get(None) or entries["full_attention"]
    if rope_type in STATIC_BASE_KEYS:   # a scaling that only raised the base (Hunyuan's NTK-alpha): the trained base
        raw = json.loads((CONFIGS / f"{name}.json").read_text())
        params = raw.get("rope_scaling") or raw.get("rope_parameters")
        theta = ntk_theta(theta, params[STATIC_BASE_KEYS[rope_type]], rotary_dim)
    assert snippet["rope_theta"] == theta
    assert snippet["original_max_position_embeddings"] == (original or claimed)
    rope_type = (entries.get(None) or entries["full_attention"])[0]
    assert ("replacing the config's" in rec.method) == (rope_type != "default"), rec.method
    if claimed and original and claimed > original:     # within the claimed context the config's scaling serves
        kept = pick(claimed, config=CONFIGS / f"{name}.json", budget="finetune")
        assert kept.method.startswith("none") and kept.config_snippet == {}
