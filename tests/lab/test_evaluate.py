"""Extension methods on a lab model: original length = the training length, the registry's configs applied to the
scheme (same frequencies as rope_parameters of that config), and band counts."""

from __future__ import annotations

import pytest
import torch

from posenc import rope_parameters
from posenc._internal.errors import ConfigError
from posenc.attention import attention_method_names
from posenc.extensions import METHODS, method_names
from posenc.lab.evaluate import apply_extension, band_counts, extension_config
from posenc.nn.model import ModelConfig, TinyLM


def _model(scheme="rope"):
    torch.manual_seed(0)
    return TinyLM(ModelConfig(scheme=scheme, d_model=64, n_layers=1, n_heads=2, max_len=128)).eval()


@pytest.mark.parametrize("method", [m for m in method_names() if m != "longrope" and METHODS[m].fit is None])
def test_extension_configs_use_train_length_as_original(method):
    model = _model()
    written = extension_config(method, model, 8.0, 128)
    apply_extension(model, written)
    rope = model.scheme.rotary
    inv, scaling = rope_parameters(model.scheme.rope_config, seq_len=1024)
    if method == "dynamic":  # the lab's dynamic NTK: factor 1 and L0 = 128 = max_position_embeddings
        assert written.scaling["factor"] == 1.0 and written.max_position_embeddings == 128
        rope.cos_sin(torch.arange(1024))  # a 1024-token sequence: the length rule picks 1024's frequencies
    else:
        assert written.max_position_embeddings == 1024
    torch.testing.assert_close(rope.inv_freq, inv)
    assert rope.attention_scaling == scaling
    if method in ("yarn", "llama3", "pose-yarn"):
        assert written.scaling["original_max_position_embeddings"] == 128
    if method == "linear":  # PI: every frequency divided by the factor
        base, _ = rope_parameters({**model.scheme.rope_config, "rope_scaling": None})
        torch.testing.assert_close(inv, base / 8)
    apply_extension(model, None)
    assert model.scheme.rope_type == "default"


def test_extensions_need_an_extendable_scheme_and_a_known_method():
    with pytest.raises(ConfigError, match="alibi scheme has no RoPE"):
        extension_config("yarn", _model("alibi"), 8.0, 128)
    with pytest.raises(ConfigError, match="extensions: expected one of"):
        extension_config("no-such-method", _model(), 2.0, 128)


def test_band_counts_cover_every_pair():
    model = _model()
    apply_extension(model, extension_config("yarn", model, 8.0, 128))
    bands = band_counts(model.scheme, 1024)
    assert sum(bands[k] for k in ("kept", "blended", "interpolated")) == 16  # head_dim 32 -> 16 pairs
    apply_extension(model, extension_config("linear", model, 8.0, 128))
    assert band_counts(model.scheme)["interpolated"] == 16


@pytest.mark.parametrize("method", attention_method_names())
def test_attention_methods_wrap_the_scheme_and_restore_it(method):
    """An attention method keeps the plain frequencies and runs its rule: identity at lengths it leaves alone, a
    different forward past them, its KV-cache decode equals the full forward, and None gives the plain model back."""
    model = _model()
    tokens = torch.randint(0, 256, (2, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("qkv.weight"):
                p.mul_(10)  # sharper attention than the random init's near-uniform one, so positions matter
        plain = model(tokens)
        rule = extension_config(method, model, 4.0, 128)
        apply_extension(model, rule)
        assert band_counts(model.scheme, 512) == {"keeps": rule.keeps}
        got = model(tokens)
        short = min(n for n in range(1, 201) if not rule.identity_for(n)) - 1  # the longest prefix it leaves alone
        torch.testing.assert_close(got[:, :short], plain[:, :short], rtol=1e-5, atol=1e-5)
        assert (got[:, -1] - plain[:, -1]).abs().max() > 1e-4
        cache = model.new_cache()
        steps = [model(tokens[:, :150], cache)] + [model(tokens[:, t:t + 1], cache) for t in range(150, 200)]
        torch.testing.assert_close(torch.cat(steps, dim=1), got, rtol=1e-4, atol=1e-4)
        apply_extension(model, None)
        assert type(model.scheme).__name__ == "RoPEScheme"
        assert torch.equal(model(tokens), plain)


def test_attention_method_options_reach_the_rule():
    model = _model()
    rule = extension_config("self-extend", model, 4.0, 128, options={"group_size": 3, "window": 20})
    assert (rule.group_size, rule.window) == (3, 20)
    with pytest.raises(ConfigError, match="takes no option"):
        extension_config("dca", model, 4.0, 128, options={"window": 3})


def test_evaluation_map_keeps_order_and_shows_progress(capsys):
    """Evaluation.map returns fn(item) in item order and draws a bar named after the model (silent when quiet)."""
    from pathlib import Path

    from posenc.lab.context import Evaluation, Run
    from posenc.lab.presets import get_preset

    cfg = get_preset("smoke")
    for progress in (True, False):
        run = Run(cfg, None, torch.device("cpu"), Path("."), progress=progress)
        ev = Evaluation(run, _model(), "lm", "rope", seed=3)
        assert ev.map(lambda L: L * 10, [96, 192, 384], cost=lambda L: L) == [960, 1920, 3840]
        err = capsys.readouterr().err
        if progress:
            assert "eval lm rope s3" in err
        else:
            assert err == ""
