"""posenc plot: every kind renders a valid PNG, and the numbers drawn are checked against independent oracles."""

import math
import struct
from pathlib import Path

import pytest
import torch

from posenc import reference
from posenc.cli import main
from posenc._internal.errors import PosencError
from posenc.extensions import METHODS, method_names
from posenc.rope.apply import apply_rope, default_inv_freq
from posenc.tools.plot import (measure_periods, plot_alibi, plot_decay, plot_rope, plot_scaling,
                               plot_sinusoidal, rope_decay)

CONFIGS = Path(__file__).parent.parent / "fixtures" / "configs"


def png_size(path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    assert len(data) > 10_000, "suspiciously small image"
    return struct.unpack(">II", data[16:24])


def assert_sensible_png(path):
    width, height = png_size(path)
    assert 600 <= width <= 3000 and 300 <= height <= 2500, (width, height)


def test_sinusoidal_measures_the_formula(tmp_path):
    result = plot_sinusoidal(tmp_path / "sin.png")
    assert_sensible_png(result["path"])
    measured = result["measured_period"]
    assert len(measured) == 64 and result["grows_with_dim"]
    for i, m in enumerate(measured):
        if m is not None:   # measured from the matrix, compared with 2 pi base^(2i/d)
            assert m == pytest.approx(2 * math.pi * 10000 ** (2 * i / 128), rel=0.01)
    # every pair whose period fits twice in the table gets measured; the longest ones cannot be
    assert measured[0] == pytest.approx(2 * math.pi, rel=1e-3) and measured[-1] is None


def test_measure_periods_on_the_lessons_loop():
    table = torch.tensor(reference.sinusoidal(300, 16))
    periods = measure_periods(table)
    assert periods[0] == pytest.approx(2 * math.pi, rel=1e-3)
    assert periods[2] == pytest.approx(2 * math.pi * 10000 ** (4 / 16), rel=0.01)
    assert periods[7] is None                        # 2 pi 10000^(14/16) ~ 20k positions: longer than the table


def test_rope_plot_llama31(tmp_path):
    result = plot_rope(tmp_path / "rope.png", CONFIGS / "llama-3.1-8b.json")
    assert_sensible_png(result["path"])
    labels, wl, wl0 = result["labels"], result["wavelength"], result["wavelength_unscaled"]
    assert [labels.count(b) for b in ("kept", "blended", "interpolated")] == [29, 6, 29]
    for j in range(64):
        if labels[j] == "kept":
            assert wl[j] == pytest.approx(wl0[j], rel=1e-6)
        if labels[j] == "interpolated":
            assert wl[j] == pytest.approx(8 * wl0[j], rel=1e-6)
    assert (result["original_context"], result["claimed_context"]) == (8192, 131072)


def test_rope_plot_from_flags(tmp_path):
    result = plot_rope(tmp_path / "r.png", head_dim=64, theta=1e4, rope_type="linear", factor=4.0, original=2048)
    assert set(result["labels"]) == {"interpolated"}
    assert result["wavelength"][0] == pytest.approx(4 * 2 * math.pi, rel=1e-6)


def test_scaling_plot_properties(tmp_path):
    result = plot_scaling(tmp_path / "scaling.png", head_dim=128, theta=1e4, original=4096, factor=8.0)
    assert_sensible_png(result["path"])
    m = result["methods"]
    # plain + every method with its own frequencies (no fit-only search, no PoSE fine-tuning mode, no DroPE)
    assert len(m) == 1 + sum(1 for name in method_names() if METHODS[name].fit is None
                             and METHODS[name].train_positions is None and not METHODS[name].recalibrates)
    assert m["default (no scaling)"]["interpolation"] == pytest.approx([1.0] * 64)
    assert m["PI"]["interpolation"] == pytest.approx([8.0] * 64, rel=1e-6)
    ntk = m["NTK-aware"]["interpolation"]
    assert ntk[0] == pytest.approx(1.0) and ntk[-1] == pytest.approx(8.0, rel=1e-5)  # lowest pair divided by s
    yarn = m["YaRN"]
    assert yarn["attention_scaling"] == pytest.approx(0.1 * math.log(8) + 1)
    assert yarn["interpolation"][0] == pytest.approx(1.0) and yarn["interpolation"][-1] == pytest.approx(8.0)
    assert "dynamic NTK (factor 8) @ 32,768" in m and "LongRoPE (unsearched init)" in m


def test_scaling_plot_uses_searched_longrope_factors(tmp_path):
    result = plot_scaling(tmp_path / "s.png", CONFIGS / "phi-3.5-mini-instruct.json")
    assert result["factor"] == 32 and result["original"] == 4096
    assert "LongRoPE (searched)" in result["methods"]
    assert result["methods"]["LongRoPE (searched)"]["interpolation"][-1] == pytest.approx(64.84, rel=1e-4)


def test_alibi_plot(tmp_path):
    result = plot_alibi(tmp_path / "alibi.png", n_heads=12, seq_len=16)
    assert_sensible_png(result["path"])
    assert result["slopes"] == pytest.approx(reference.alibi_slopes(12))
    assert len(result["heads_shown"]) == 8 and result["heads_shown"][0] == 0 and result["heads_shown"][-1] == 11


def test_decay_matches_monte_carlo_with_apply_rope(tmp_path):
    """mean_j cos(m theta_j) is E[(R_0 q) . (R_m q)] / E[|q|^2] for isotropic q: check by sampling."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(20000, 64, generator=gen)
    inv = default_inv_freq(64, 10000.0)
    for m in (1, 7, 100, 3000):
        rotated = apply_rope(q[:, None, :], torch.tensor([m]))[:, 0]
        sampled = float((rotated * q).sum(-1).mean() / (q * q).sum(-1).mean())
        expected, _ = rope_decay(inv, torch.tensor([m]))
        assert sampled == pytest.approx(float(expected[0]), abs=0.03)
    _, bound = rope_decay(inv, torch.tensor([0]))
    assert float(bound[0]) == pytest.approx(1.0)


def test_decay_plot(tmp_path):
    result = plot_decay(tmp_path / "decay.png", bases=(10000.0, 500000.0),
                        configs=[CONFIGS / "llama-3.1-8b.json"], max_distance=8192, points=300)
    assert_sensible_png(result["path"])
    assert len(result["curves"]) == 3
    c = result["curves"]["base 10000 (d=128)"]
    # decays: the mean of the far half is far below the near values
    far = c["bound"][len(c["bound"]) // 2:]
    assert c["bound"][0] > 0.9 and sum(far) / len(far) < 0.5


@pytest.mark.parametrize("argv", [
    ["rope", "--config", str(CONFIGS / "qwen2.5-7b-instruct-yarn.json")],
    ["scaling", "--factor", "4"],
    ["alibi", "--heads", "4", "--seq-len", "8"],
    ["decay", "--base", "10000", "--max-distance", "2048"],
])
def test_cli_renders(tmp_path, capsys, argv):
    out = tmp_path / "x.png"
    assert main(["plot", *argv, "--out", str(out)]) == 0
    png_size(out)
    assert f"wrote {out}" in capsys.readouterr().out


def test_cli_sinusoidal_prints_measured_widths(tmp_path, capsys):
    out = tmp_path / "s.png"
    assert main(["plot", "sinusoidal", "--out", str(out)]) == 0
    assert_sensible_png(out)
    text = capsys.readouterr().out
    assert "measured period" in text and "grows with the dimension index: yes" in text


@pytest.mark.parametrize("argv,needle", [
    (["alibi", "--out", "{tmp}/x.jpg"], ".png"),
    (["alibi", "--out", "{tmp}/missing/x.png"], "does not exist"),
    (["alibi", "--heads", "0", "--out", "{tmp}/x.png"], "n_heads"),
    (["sinusoidal", "--dim", "7", "--out", "{tmp}/x.png"], "even"),
    (["rope", "--config", "{tmp}/none.json", "--out", "{tmp}/x.png"], "not found"),
    (["rope", "--config", str(CONFIGS / "bloom-560m.json"), "--out", "{tmp}/x.png"], "does not use RoPE"),
    (["scaling", "--factor", "1", "--out", "{tmp}/x.png"], "factor"),
    # a base <= 1 breaks YaRN's ramp: one error naming theta, not a warning about the base and then an error
    (["scaling", "--theta", "1e-30", "--out", "{tmp}/x.png"], "theta must be > 1"),
    (["scaling", "--theta", "1", "--out", "{tmp}/x.png"], "theta must be > 1"),
    (["rope", "--rope-type", "yarn", "--factor", "4", "--out", "{tmp}/x.png"], "--original: rope type yarn needs"),
    (["rope", "--rope-type", "dynamic", "--factor", "4", "--out", "{tmp}/x.png"],
     "--original or --max-position-embeddings: rope type dynamic needs"),
])
def test_cli_bad_input_one_line(tmp_path, capsys, argv, needle):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["plot", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("posenc plot: error:") and needle in err[0]


def test_importing_the_tools_does_not_import_matplotlib():
    import subprocess
    import sys

    code = ("import sys, posenc.tools, posenc.tools.plot, posenc.cli; posenc.cli.build_parser(); "
            "posenc.tools.plot_rope; assert 'matplotlib' not in sys.modules, 'matplotlib imported eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_python_api_rejects_bad_values(tmp_path):
    with pytest.raises(PosencError, match="max_len"):
        plot_sinusoidal(tmp_path / "a.png", max_len=0)


def test_scaling_plot_draws_a_configs_own_method_with_its_own_factor(tmp_path):
    # Llama 3.1 claims 131072 = 16 x 8192, but its llama3 scaling has factor 8: that curve must be x8
    result = plot_scaling(tmp_path / "s.png", CONFIGS / "llama-3.1-8b.json")
    assert result["factor"] == 16
    own = [name for name in result["methods"] if name.startswith("Llama 3")]
    assert own == ["Llama 3 (this config, factor 8)"]
    assert max(result["methods"][own[0]]["interpolation"]) == pytest.approx(8.0)
    assert max(result["methods"]["PI"]["interpolation"]) == pytest.approx(16.0)


def test_scaling_plot_clips_and_names_the_off_scale_dynamic_curve(tmp_path):
    result = plot_scaling(tmp_path / "s.png", CONFIGS / "phi-3.5-mini-instruct.json")
    s = result["factor"]
    [(name, peak)] = result["off_scale"].items()
    assert name.startswith("dynamic NTK")
    # transformers' dynamic rule at L = s * L0: base x (s^2 - s + 1)^(d/(d-2)); the lowest pair's frequency
    # base^(-(d-2)/d) is then divided by exactly s^2 - s + 1 (993 for Phi-3.5's x32)
    assert peak == pytest.approx(s * s - s + 1, rel=1e-4)
    assert all(max(v["interpolation"]) <= 3 * s for k, v in result["methods"].items() if k != name)


# ----------------------------------------------------------------- audit: flags given with --config override it

def test_rope_flags_override_the_config(tmp_path, capsys):
    llama = CONFIGS / "llama-3.1-8b.json"
    out = tmp_path / "r.png"
    theta = plot_rope(out, llama, theta=1e4)
    assert theta["wavelength_unscaled"][-1] == pytest.approx(2 * math.pi * 1e4 ** (126 / 128), rel=1e-6)
    assert theta["labels"].count("interpolated") < 29             # llama3 at base 1e4: fewer pairs past 8192
    assert set(plot_rope(out, llama, rope_type="default")["labels"]) == {"kept"}
    assert len(plot_rope(out, llama, head_dim=64)["labels"]) == 32
    assert plot_rope(out, llama, original=4096)["original_context"] == 4096
    assert plot_rope(out, llama, max_position_embeddings=262144)["claimed_context"] == 262144
    two = plot_rope(out, llama, factor=2.0)
    j = two["labels"].index("interpolated")
    assert two["wavelength"][j] == pytest.approx(2 * two["wavelength_unscaled"][j], rel=1e-6)
    # on the command line too: --theta changes what is drawn
    assert main(["plot", "rope", "--config", str(llama), "--out", str(out)]) == 0
    plain = capsys.readouterr().out
    assert main(["plot", "rope", "--config", str(llama), "--theta", "10000", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[0] != plain.splitlines()[0]


def test_rope_factor_for_a_type_without_one_is_refused(tmp_path, capsys):
    for argv in (["--factor", "4"], ["--config", str(CONFIGS / "qwen2.5-7b-instruct.json"), "--factor", "4"]):
        assert main(["plot", "rope", *argv, "--out", str(tmp_path / "x.png")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("posenc plot: error: --factor does not apply to rope_type 'default'") and "\n" not in err
    # with a type that scales, the config's plain RoPE takes the factor
    result = plot_rope(tmp_path / "x.png", CONFIGS / "qwen2.5-7b-instruct.json", rope_type="linear", factor=4.0)
    assert set(result["labels"]) == {"interpolated"}


def test_scaling_flags_override_the_config(tmp_path, capsys):
    llama = CONFIGS / "llama-3.1-8b.json"
    result = plot_scaling(tmp_path / "s.png", llama, original=4096, factor=4.0)
    assert (result["original"], result["factor"], result["target"]) == (4096, 4.0, 16384)
    assert max(result["methods"]["PI"]["interpolation"]) == pytest.approx(4.0)
    assert plot_scaling(tmp_path / "s.png", llama, original=4096)["factor"] == 32     # claimed / --original
    small = plot_scaling(tmp_path / "s.png", llama, head_dim=64, theta=1e4)
    wl = small["methods"]["default (no scaling)"]["wavelength"]
    assert len(wl) == 32 and wl[-1] == pytest.approx(2 * math.pi * 1e4 ** (62 / 64), rel=1e-6)
    assert main(["plot", "scaling", "--config", str(llama), "--factor", "2", "--out", str(tmp_path / "s.png")]) == 0
    assert "dynamic NTK (factor 2) @ 16,384" in capsys.readouterr().out         # x2 from 8192, not the claimed x16
    # searched LongRoPE factors fit one head size only: another one is refused naming both
    assert main(["plot", "scaling", "--config", str(CONFIGS / "phi-3.5-mini-instruct.json"), "--head-dim", "128",
                 "--out", str(tmp_path / "s.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--head-dim 128" in err and "--config" in err and "\n" not in err
