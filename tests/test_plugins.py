"""Plug-ins from outside the package: a scheme, an extension method and a task registered by a file in tmp_path
run through the smoke lab; failures name the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from posenc_plugin_fixtures import registries_restored
import torch

from posenc.cli import main
from posenc._internal.plugins import PluginError, load_plugin
from posenc.schemes import SCHEMES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "my_scheme.py"

PLUGIN = '''
import random

import torch

import posenc
from posenc.lab.tasks import Task

exec(open({example!r}).read())   # the README's scheme "mine"


@posenc.register_method("half-pi", label="half PI")
def half_pi(spec):
    return {{"rope_type": "linear", "factor": spec.factor / 2}}


class ReverseSampler:
    def __init__(self, seq_len, batch_size, seed):
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed

    def episode(self, rng):
        n = (self.seq_len - 1) // 2
        xs = [rng.randrange(1, 256) for _ in range(n)]
        seq = (xs + [0] + xs[::-1] + [0] * self.seq_len)[:self.seq_len + 1]
        targets = [-100] * n + seq[n + 1:2 * n + 1] + [-100] * (self.seq_len - 2 * n)
        return seq[:self.seq_len], targets[:self.seq_len]

    def batch(self, step, rank=0, world_size=1):
        rng = random.Random(self.seed * 1000 + step)
        rows = [self.episode(rng) for _ in range(self.batch_size)][rank::world_size]
        return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])


@posenc.register_task("reverse")
class Reverse(Task):
    metrics = ("exact_match",)
    title = "Reverse task (teacher-forced exact match)"

    def sampler(self, run, seq_len, batch_size, seed):
        return ReverseSampler(seq_len, batch_size, seed)

    def evaluate(self, ev):
        def score(length):
            if not ev.supports(length):
                return None
            x, y = ReverseSampler(length, 4, ev.seed + 99).batch(0)
            with torch.no_grad():
                hit = (ev.model(x.to(ev.device)).argmax(-1).cpu() == y) | (y == -100)
            return hit.all(-1).float().mean().item()

        return [ev.row(L, "exact_match", v) for L, v in zip(ev.cfg.eval_lens, ev.map(score, ev.cfg.eval_lens))]
'''



@pytest.fixture
def clean_registries():
    """Plug-ins register into the process-wide registries: remove what a test added."""
    with registries_restored():
        yield


def test_readme_shows_the_example_file():
    readme = (ROOT / "README.md").read_text()
    assert EXAMPLE.read_text().strip() in readme
    assert "posenc lab --preset smoke --plugin my_scheme.py --schemes rope,mine" in readme
    assert "posenc lab --preset smoke --plugin my_scheme.py --schemes rope,mine" in (ROOT / "docs/lab.md").read_text()


@pytest.mark.slow
def test_a_scheme_a_method_and_a_task_from_a_file_run_through_the_smoke_lab(tmp_path, clean_registries):
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(PLUGIN.format(example=str(EXAMPLE)))
    out = tmp_path / "run"
    assert main(["lab", "--preset", "smoke", "--plugin", str(plugin), "--tasks", "lm,reverse", "--schemes",
                 "rope,mine", "--extensions", "yarn,half-pi", "--steps", "4", "--out", str(out), "--quiet"]) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert {r["scheme"] for r in rows} == {"rope", "mine"} and {r["task"] for r in rows} == {"lm", "reverse"}
    # half PI at the smoke factor 2 is PI with factor 1: exactly plain RoPE, length by length
    lm = {(r["scaling"], r["eval_len"], r["protocol"]): r["value"] for r in rows
          if r["task"] == "lm" and r["scheme"] == "rope" and r.get("positions") is None}
    assert {k[0] for k in lm} == {"none", "yarn", "half-pi"}
    assert all(lm[("half-pi", L, p)] == lm[("none", L, p)] for (_, L, p) in lm)
    rev = [r for r in rows if r["task"] == "reverse"]
    assert {r["eval_len"] for r in rev} == {96, 192} and all(0.0 <= r["value"] <= 1.0 for r in rev)
    report = (out / "report.md").read_text()
    assert "rope + half PI, zero-shot" in report and "Reverse task (teacher-forced exact match)" in report
    assert "| mine |" in report


def test_the_example_scheme_biases_attention_and_decodes_like_a_full_forward(clean_registries):
    from posenc.nn.model import ModelConfig, TinyLM

    load_plugin(str(EXAMPLE))
    assert load_plugin(str(EXAMPLE)) is load_plugin(str(EXAMPLE))  # loading twice is a no-op, not a clash
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(scheme="mine", d_model=32, n_heads=2, n_layers=2, max_len=16)).eval()
    assert model.scheme.capabilities.biases and model.scheme.slope.shape == (2, 1, 1)
    tokens = torch.randint(0, 256, (1, 20))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = torch.cat([model(tokens[:, :5], cache)] + [model(tokens[:, t:t + 1], cache) for t in range(5, 20)], 1)
        torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
        model.scheme.slope.zero_()  # without the bias the model is NoPE: the bias did reach the logits
        assert not torch.allclose(model(tokens), full)


@pytest.mark.parametrize("body,match", [
    ("raise RuntimeError('boom')", "import failed: RuntimeError: boom"),
    ("def broken(:\n    pass", "syntax error at line 1"),
    ("import posenc\nposenc.register_scheme('rope')(object)", "scheme 'rope' is already registered"),
    ("import posenc\nfrom posenc.lab.tasks import Task\n@posenc.register_task('half')\nclass Half(Task):\n"
     "    def sampler(self, run, seq_len, batch_size, seed):\n        return None\n", "lacks the task interface"),
    ("import posenc\n@posenc.register_scheme('test-not-module')\nclass NotAScheme:\n    pass\n",
     "must subclass posenc.schemes.Scheme"),
])
def test_plugin_failures_name_the_file(tmp_path, clean_registries, body, match):
    plugin = tmp_path / "bad_plugin.py"
    plugin.write_text(body)
    with pytest.raises(PluginError, match=f"plugin {plugin}: .*{match}"):
        load_plugin(str(plugin))


def test_module_plugins_and_missing_ones(tmp_path, monkeypatch, clean_registries, capsys):
    (tmp_path / "my_positions.py").write_text(EXAMPLE.read_text().replace('"mine"', '"mine-module"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    load_plugin("my_positions")
    assert "mine-module" in SCHEMES and SCHEMES["mine-module"].origin.endswith("my_positions.py")
    with pytest.raises(PluginError, match="plugin no_such_module_here: no such module"):
        load_plugin("no_such_module_here")
    assert main(["lab", "--plugin", str(tmp_path / "absent.py"), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"posenc lab: error: plugin {tmp_path / 'absent.py'}: no such file"


def test_the_example_scheme_biases_per_row_positions_per_head(clean_registries):
    """The README's scheme under randomized positions ([B, T] per row): one penalty per (row, head), never the
    batch broadcast against the heads."""
    from posenc.schemes import AttentionContext, make_scheme

    exec(EXAMPLE.read_text(), {})
    heads = 2
    scheme = make_scheme("mine", d_model=8, n_heads=heads, max_len=16)
    with torch.no_grad():
        scheme.slope.copy_(torch.tensor([0.5, 2.0]).view(heads, 1, 1))
    pos = torch.tensor([[0, 3, 7], [1, 2, 9]])                      # batch 2 == heads 2: a wrong broadcast fits
    bias = scheme.bias(None, None, AttentionContext(pos, pos, contiguous=False))
    assert bias.shape == (2, heads, 3, 3)
    for b in range(2):
        for h, slope in enumerate((0.5, 2.0)):
            want = -slope * (pos[b][:, None] - pos[b][None, :]).abs().float()
            torch.testing.assert_close(bias[b, h], want)
    assert scheme.bias(None, None, AttentionContext(pos[0], pos[0])).shape == (heads, 3, 3)


@pytest.mark.parametrize("body", [
    "x = 1\n",                                                                   # a file given by mistake
    "import posenc\nfrom posenc.schemes import scheme_names\nNAMES = scheme_names()\n",   # imports, defines only
    "import posenc\nif __name__ == '__main__':\n    posenc.register_method('never', label='never')(lambda spec: {})\n",
])
def test_a_plugin_that_registers_nothing_is_refused_naming_it(tmp_path, clean_registries, capsys, body):
    plugin = tmp_path / "empty_plugin.py"
    plugin.write_text(body)
    with pytest.raises(PluginError, match=f"plugin {plugin}: registers nothing"):
        load_plugin(str(plugin))
    with pytest.raises(PluginError, match="registers nothing"):     # a second try is refused again
        load_plugin(str(plugin))
    for command in (["lab", "--out", str(tmp_path / "o")], ["eval", str(tmp_path / "no-model")]):
        assert main([*command, "--plugin", str(plugin)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"posenc {command[0]}: error: plugin {plugin}: registers nothing"), err
        assert "\n" not in err
    assert not (tmp_path / "o").exists()


def test_a_module_plugin_that_registers_nothing_is_refused(tmp_path, monkeypatch, clean_registries):
    (tmp_path / "nothing_here.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="plugin nothing_here: registers nothing"):
        load_plugin("nothing_here")
    with pytest.raises(PluginError, match="registers nothing"):
        load_plugin("nothing_here")


def test_a_plugin_replacing_a_builtin_registers_something(tmp_path, clean_registries):
    """register_task('lm', replace=True) is a registration (the entry is new), not "nothing"."""
    plugin = tmp_path / "lm_plugin.py"
    plugin.write_text("import posenc\nfrom posenc.lab.tasks import Task\n@posenc.register_task('lm', replace=True)\n"
                      "class LM(Task):\n    def sampler(self, run, seq_len, batch_size, seed):\n        return None\n"
                      "    def evaluate(self, ev):\n        return []\n")
    load_plugin(str(plugin))
