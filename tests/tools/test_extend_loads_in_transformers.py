"""Every config `posenc extend` writes loads in transformers and means there what posenc says it means: each
published RoPE config of the corpus x every method x both file forms is loaded with AutoConfig (no error, no
warning), and the family's own rotary class computes posenc's frequencies and attention scaling, at init and, for
the length-dependent methods, through its forward at the target length. A config extend cannot write for a family
is refused with a reason instead (Phi-3: longrope only)."""

from __future__ import annotations

import importlib
import io
import json
import logging
import math
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.0")

from posenc import rope_parameters  # noqa: E402
from posenc._internal.errors import ConfigError  # noqa: E402
from posenc.extensions import METHODS as REGISTRY  # noqa: E402
from posenc.tools.extend import IGNORES_ROPE_KEYS, extend_config  # noqa: E402
from posenc.tools.inspect import inspect_config  # noqa: E402

CONFIGS = Path(__file__).parent.parent / "fixtures" / "configs"
METHODS = [m for m, spec in REGISTRY.items() if spec.fit is None and not spec.recalibrates]
MULTI_AXIS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def _rope_configs() -> list[str]:
    """The corpus's RoPE language-model configs that this transformers builds, less the families whose code reads
    no RoPE keys (GPT-J, CodeGen: extend says so in a WARNING note)."""
    from transformers import CONFIG_MAPPING

    names = []
    for path in sorted(CONFIGS.glob("*.json")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = inspect_config(path)
        if report["scheme"] == "rope" and report.get("rope") and report["model_type"] in CONFIG_MAPPING \
                and report["model_type"] not in IGNORES_ROPE_KEYS:
            names.append(path.stem)
    return names


def _rotary(text_config):
    module = importlib.import_module(type(text_config).__module__.replace(".configuration_", ".modeling_"))
    classes = [getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding") and "Vision" not in n]
    return classes[0](text_config) if classes else None


@pytest.mark.parametrize("name", _rope_configs())
def test_extended_configs_load_and_mean_the_same_in_transformers(name, tmp_path):
    path = CONFIGS / f"{name}.json"
    entry = next(e for e in inspect_config(path)["rope"] if e["layer_type"] in (None, "full_attention"))
    target = 4 * (entry["original_context"] or entry["max_position_embeddings"] or 4096)
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger("transformers").addHandler(handler)
    checked = refused = 0
    try:
        for method in METHODS:
            for form in (4, 5):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        result = extend_config(path, target, method, transformers_version=form, replace=True)
                    except ConfigError:
                        refused += 1                               # refused with its reason (tested elsewhere)
                        continue
                folder = tmp_path / f"{method}-{form}"
                folder.mkdir()
                (folder / "config.json").write_text(json.dumps(result.config))
                log.seek(0)
                log.truncate()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    text = transformers.AutoConfig.from_pretrained(str(folder)).get_text_config()
                    rotary = _rotary(text)
                assert not log.getvalue().strip() and not caught, (method, form, log.getvalue(), caught)
                # RoPE per layer type (Gemma 3, ModernBERT): the full-attention layers' buffers, rescaled, and the
                # sliding ones, as posenc reads each entry of the written config
                layered = hasattr(rotary, "full_attention_inv_freq")
                kinds = ["full_attention", "sliding_attention"] if layered else [None]
                if rotary is None or (not layered and (not hasattr(rotary, "inv_freq")
                                                       or rotary.inv_freq.is_complex())):
                    continue                                       # (GPT-J: no rotary class to compare)
                for kind in kinds:
                    prefix, where = (f"{kind}_" if kind else ""), {"layer_type": kind} if kind else {}
                    inv, attention = rope_parameters(result.config, **where)
                    torch.testing.assert_close(getattr(rotary, prefix + "inv_freq").float(), inv, rtol=2e-6, atol=0,
                                               msg=(method, form, kind))
                    assert math.isclose(getattr(rotary, prefix + "attention_scaling"), attention, rel_tol=1e-6)
                if REGISTRY[method].keeps_original_length or method == "longrope":   # length-dependent
                    position = torch.tensor([[target - 1]])
                    x = torch.zeros(1, 1, 8)
                    prefix, where = ("full_attention_", {"layer_type": "full_attention"}) if layered else ("", {})
                    rotary(x, position.expand(3, 1, 1) if text.model_type.startswith(MULTI_AXIS) else position,
                           **where)
                    inv, _ = rope_parameters(result.config, target, **where)
                    torch.testing.assert_close(getattr(rotary, prefix + "inv_freq").float(), inv, rtol=5e-6, atol=0,
                                               msg=(method, form))
                    assert math.isclose(getattr(rotary, prefix + "attention_scaling"),
                                        result.check["attention_scaling"], rel_tol=1e-6)
                checked += 1
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert checked or refused == 2 * len(METHODS)       # (Falcon-7B states no context: every method refused)


@pytest.mark.parametrize("method", ["linear", "dynamic", "yarn", "llama3"])
def test_phi3_family_takes_longrope_only(method):
    with pytest.raises(ConfigError, match="model_type 'phi3': transformers' config class accepts rope_type "
                                          "default or longrope only"):
        extend_config(CONFIGS / "phi-4.json", 65536, method)
    assert extend_config(CONFIGS / "phi-4.json", 65536, "longrope").config["rope_parameters"]["rope_type"] == \
        "longrope"
