"""Context extension that trains, in the lab: longrope-search (a ``fit`` method searched on the model, on splits
disjoint from the reported text, checkpointed and resumed), fine-tuning under every method with its cost in
results.json, and PoSE (``train_positions``) fine-tuning at the original length."""

from __future__ import annotations

import json
import random

import pytest
import torch

from posenc import LongRopeResult, lm_perplexity
from posenc._internal.errors import DataError
from posenc.extensions import METHODS, register_method
from posenc.extensions.longrope_search import search_splits
from posenc.hf.lab_bridge import load_lab_model
from posenc.lab.data import load_corpus
from posenc.lab.presets import get_preset
from posenc.lab.run import run_lab
from posenc.pose import pose_position_ids


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """~60 KB of word-like text (val = its last 10%), so the lab loads a corpus in milliseconds."""
    rng = random.Random(0)
    words = ["def", "return", "self", "import", "class", "if", "else", "for", "in", "None", "x", "y", "(", ")", ":"]
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(16000)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def spy_method():
    """A PoSE-like method that records how the lab calls its train_positions hook (removed afterwards)."""
    calls = []

    def positions(batch, seq_len, spec, generator=None):
        calls.append((batch, seq_len, spec.target))
        return pose_position_ids(batch, seq_len, spec.target, generator=generator)

    register_method("test-pose-spy", label="spy", train_positions=positions)(
        lambda spec: {"rope_type": "linear", "factor": spec.factor})
    yield calls
    del METHODS["test-pose-spy"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, text_file, spy_method):
    out = tmp_path_factory.mktemp("extend")
    cfg = get_preset("smoke", tasks=["lm"], schemes=["rope"], data=str(text_file), out=str(out), steps=3,
                     sliding_stride=0, extensions=["yarn", "longrope-search", "test-pose-spy", "drope"],
                     finetune_steps=2)
    doc = run_lab(cfg, progress=False, log=lambda *a: None)
    return cfg, out, doc


def test_zero_shot_rows_and_no_zero_shot_row_for_a_pose_method(run):
    cfg, _, doc = run
    zero = {r["scaling"] for r in doc["results"] if not r["finetuned"]}
    tuned = {r["scaling"] for r in doc["results"] if r["finetuned"]}
    assert zero == {"none", "yarn", "longrope-search", "drope"}      # drope zero-shot: dropped, not recalibrated
    assert tuned == {"none", "yarn", "longrope-search", "test-pose-spy", "drope"}


def test_finetune_cost_is_recorded_and_pose_and_drope_train_at_the_original_length(run, spy_method):
    """PoSE trains at the training length with skipping positions; DroPE recalibrates there with ordinary ones."""
    cfg, _, doc = run
    target = max(cfg.eval_lens)
    for r in (r for r in doc["results"] if r["finetuned"]):
        ft = r["finetune"]
        pose = r["scaling"] == "test-pose-spy"
        assert ft["len"] == (cfg.train_len if pose or r["scaling"] == "drope" else target)
        assert ft["batch"] == cfg.batch_size * cfg.train_len // ft["len"]  # the pre-training tokens per step
        assert ft["steps"] == 2 and ft["tokens"] == 2 * ft["batch"] * ft["len"]
        assert ft["positions"] == ("pose" if pose else "contiguous")
    info = doc["meta"]["extensions"]["lm/rope/seed0"]["finetune"]
    assert set(info) == {"none", "yarn", "longrope-search", "test-pose-spy", "drope"}
    assert all(v["wall_s"] >= 0 and v["cpu_s"] >= 0 for v in info.values())
    # the hook was called once per fine-tuning step, at the training length, covering the target
    assert spy_method[-2:] == [(cfg.batch_size, cfg.train_len, target)] * 2


def test_longrope_search_scores_on_splits_apart_from_the_reported_text(run, text_file):
    cfg, out, doc = run
    fit = doc["meta"]["extensions"]["lm/rope/seed0"]["fit"]["longrope-search"]
    assert fit["evaluations"] == 4 + 1 * (4 - 2)  # population + generations x (population - parents)
    assert fit["search_s"] >= 0 and fit["population"] == 4 and fit["generations"] == 1
    target = max(cfg.eval_lens)
    search, heldout = fit["splits"]["search"], fit["splits"]["heldout"]
    assert search[0] >= cfg.eval_tokens + 1 and heldout[0] >= search[1]   # disjoint from each other and the report
    # the written config, put into the trained model, gives the held-out perplexity the search recorded
    state = json.loads((out / "search" / "lm-rope-seed0-longrope.json").read_text())
    scaling = LongRopeResult.from_dict(state["result"]).rope_scaling()
    assert scaling["original_max_position_embeddings"] == cfg.train_len and scaling["short_factor"] == [1.0] * 8
    lam = scaling["long_factor"]
    assert all(1 <= a <= b <= 1.25 * target / cfg.train_len for a, b in zip(lam, lam[1:]))  # LongRoPE's constraints
    rows = [r for r in doc["results"] if r["scaling"] == "longrope-search" and not r["finetuned"]]
    assert rows and all(r["value"] is not None for r in rows)
    model, _ = load_lab_model(out / "checkpoints" / "lm-rope-seed0.safetensors")
    model.scheme.set_rope_scaling(scaling, max_position_embeddings=target)
    val = load_corpus(str(text_file)).val
    got = lm_perplexity(model, val[heldout[0]:heldout[1]], target)
    assert got == pytest.approx(fit["heldout"], rel=1e-5)


def test_resume_continues_search_and_finetunes_to_the_same_results(run, tmp_path):
    cfg, out, doc = run
    again = run_lab(cfg, resume=True, progress=False, log=lambda *a: None)
    assert [r["value"] for r in again["results"]] == pytest.approx([r["value"] for r in doc["results"]], rel=1e-6)
    fit = again["meta"]["extensions"]["lm/rope/seed0"]["fit"]["longrope-search"]
    assert fit["search_s"] == doc["meta"]["extensions"]["lm/rope/seed0"]["fit"]["longrope-search"]["search_s"]
    assert all(v["resumed_from"] == 2 for v in again["meta"]["extensions"]["lm/rope/seed0"]["finetune"].values())


def test_search_splits_are_disjoint_and_too_short_text_is_refused():
    text = torch.arange(1000) % 256
    a, b, where = search_splits(text, reserved=100, length=50, windows=3)
    assert len(a) == len(b) == 151 and where == {"search": [100, 251], "heldout": [251, 402], "reserved": 100}
    assert torch.equal(a, text[100:251]) and torch.equal(b, text[251:402])
    with pytest.raises(DataError, match="longrope-search needs 1052 validation tokens"):
        search_splits(text, reserved=950, length=50, windows=1)


def test_longrope_search_writes_the_factor_it_scored_with():
    """A factor that round(factor * L0) cannot express exactly (3.3 x 16 -> 53 tokens): every candidate is scored
    with the factor the written config carries (its default attention scaling reads it)."""
    from posenc.extensions import ExtensionSpec
    from posenc.extensions.longrope_search import SearchBudget, search_lab_model
    from posenc.nn.model import ModelConfig, TinyLM

    torch.manual_seed(0)
    model = TinyLM(ModelConfig(scheme="rope", d_model=32, n_heads=2, n_layers=1, max_len=16)).eval()
    spec = ExtensionSpec(original=16, factor=3.3, rotary_dim=16)
    scored = []
    real = model.scheme.set_rope_scaling
    model.scheme.set_rope_scaling = lambda scaling, **kw: (scored.append(scaling["factor"]), real(scaling, **kw))
    text = torch.randint(0, 256, (2000,), dtype=torch.uint8)
    result, _ = search_lab_model(model, text, spec, reserved=10, progress=False, seed=0,
                                 budget=SearchBudget(population=4, generations=0, windows=1))
    assert scored and set(scored) == {result.rope_scaling()["factor"]} == {3.3}


def test_a_retrained_base_does_not_resume_its_old_fine_tunes_or_search(run, tmp_path):
    """The base model retrained (its checkpoint deleted, other steps) under --resume: the old base's fine-tune and
    LongRoPE-search records are refused, not reported beside the new base."""
    import shutil

    from posenc._internal.errors import CheckpointError

    cfg, out, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "checkpoints" / "lm-rope-seed0.safetensors").unlink()
    cfg2 = get_preset("smoke", tasks=["lm"], schemes=["rope"], data=cfg.data, out=str(copy), steps=4,
                      sliding_stride=0, extensions=["yarn", "test-pose-spy"], finetune_steps=2)
    with pytest.raises(CheckpointError, match="lm-rope-ft-none-seed0.safetensors: was written with different "
                                              "settings"):
        run_lab(cfg2, resume=True, progress=False, log=lambda *a: None)
    for ft in (copy / "checkpoints").glob("lm-rope-ft-*"):
        ft.unlink()
    cfg3 = get_preset("smoke", tasks=["lm"], schemes=["rope"], data=cfg.data, out=str(copy), steps=4,
                      sliding_stride=0, extensions=["longrope-search"], finetune_steps=0, randomized_positions=0)
    (copy / "checkpoints" / "lm-rope-seed0.safetensors").unlink()
    with pytest.raises(CheckpointError, match="was written by a search with other arguments"):
        run_lab(cfg3, resume=True, progress=False, log=lambda *a: None)
