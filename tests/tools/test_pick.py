"""posenc pick: the decision table of docs/picker.md, its laws, and the CLI."""

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.cli import main
from posenc._internal.errors import PosencError
from posenc.tools.pick import BUDGETS, TASKS, THETA_PLACEHOLDER, format_recommendation, pick

# What counts as citing evidence: a paper ("Press et al. 2022"), transformers' own code, a published model card, the
# lesson (the spec) or one of posenc's lab measurements, each named so that a user can look it up.
CITATION = re.compile(r"\b[A-Z][a-z]+ et al\. (19|20)\d\d\b|\btransformers' modeling_rope_utils\b|\bmodel cards?\b"
                      r"|\bdocs/lesson\.md\b|\bdocs/lab\.md\b")

# (target, train, budget, task, extrapolation) -> (scheme contains, method contains): the rows of docs/picker.md
TABLE = [
    ((4096, 8192, "none", "lm", False), ("keep", "none")),
    ((32768, 8192, "finetune", "retrieval", False), ("RoPE", "yarn")),
    ((16384, 4096, "none", "lm", False), ("RoPE", "dynamic")),
    ((16384, 4096, "none", "code", True), ("RoPE", "dynamic")),
    ((8192, 1024, "pretrain", "lm", True), ("ALiBi", "none")),
    ((8192, 512, "pretrain", "encoder", True), ("ALiBi", "none")),
    ((131072, 8192, "pretrain", "retrieval", True), ("RoPE", "yarn")),
    ((131072, 8192, "pretrain", "code", False), ("RoPE", "yarn")),
    ((4096, 4096, "pretrain", "lm", False), ("RoPE", "none")),
]


@pytest.mark.parametrize("inputs,expected", TABLE)
def test_decision_table(inputs, expected):
    rec = pick(*inputs)
    assert expected[0] in rec.scheme and expected[1] in rec.method
    assert rec.reasons and rec.alternatives


def test_finetune_yarn_parameters_and_snippet_load_in_transformers():
    rec = pick(32768, 8192, "finetune", "lm", rope_theta=500000.0)
    rp = rec.config_snippet["rope_parameters"]
    assert rp == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192,
                  "rope_theta": 500000.0, "beta_fast": 32, "beta_slow": 1}  # the ramp bounds its text cites
    assert rec.config_snippet["max_position_embeddings"] == 32768
    # the snippet is a working config fragment: transformers reads it and agrees with posenc's registry
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = {"hidden_size": 4096, "num_attention_heads": 32, **rec.config_snippet}
    inv_hf, att_hf = ROPE_INIT_FUNCTIONS["yarn"](LlamaConfig(**cfg), None, 32768)
    inv, att = posenc.rope_parameters(cfg, 32768)
    assert inv.tolist() == pytest.approx(inv_hf.tolist(), rel=1e-6)
    assert att == pytest.approx(0.1 * math.log(4) + 1)   # YaRN's temperature, closed form
    assert att_hf == pytest.approx(att)


def test_pretrain_theta_follows_published_anchors():
    assert pick(4096, 4096, "pretrain").parameters["rope_theta"] == 10000.0      # Llama 2 at 4k
    assert pick(8192, 8192, "pretrain").parameters["rope_theta"] == 500000.0     # Llama 3 at 8k
    assert pick(32768, 32768, "pretrain").parameters["rope_theta"] == 1e6        # Qwen 2.5 at 32k


def test_encoder_alibi_is_symmetric():
    rec = pick(8192, 512, "pretrain", "encoder", True)
    assert "symmetric" in rec.parameters["bias"]
    assert any("symmetric" in r for r in rec.reasons)


@settings(max_examples=60, deadline=None)
@given(target=st.integers(1, 2**21), train=st.integers(1, 2**21), budget=st.sampled_from(BUDGETS),
       task=st.sampled_from(TASKS), extrapolate=st.booleans())
def test_laws(target, train, budget, task, extrapolate):
    rec = pick(target, train, budget, task, extrapolate)
    # every reason cites its evidence (see CITATION), and nothing cites a document users do not have;
    # every alternative says why not
    assert rec.reasons and all(CITATION.search(r) for r in rec.reasons), rec.reasons
    assert "facts" not in format_recommendation(rec)
    assert all(a["why_not"] for a in rec.alternatives)
    if budget != "pretrain" and target <= train:
        assert rec.method == "none" and rec.config_snippet == {}
    rp = rec.config_snippet.get("rope_parameters")
    if rp and "factor" in rp:
        if rp["rope_type"] == "dynamic":     # recommended at the factor the lab measured: 1 (static NTK's base for
            assert rp["factor"] == 1.0       # exactly L / L0 at every length L)
        else:
            assert rp["factor"] == pytest.approx(target / train, rel=1e-5) and rp["factor"] > 1
        # an existing model's base is not guessed: without --rope-theta the snippet holds a visible placeholder
        assert (rp["rope_theta"] == THETA_PLACEHOLDER) == (budget != "pretrain")
        snippet = {**rec.config_snippet, "rope_parameters": {**rp, "rope_theta": 10000.0}}
        # the snippet loads through the registry (with a head_dim and the model's theta supplied)
        inv, _ = posenc.rope_parameters({"head_dim": 64, "max_position_embeddings": train, **snippet})
        assert inv.isfinite().all()
    json.dumps(rec.to_dict())   # always serialisable
    assert rec.scheme in format_recommendation(rec)


@pytest.mark.parametrize("kwargs,word", [
    ({"target_context": 0, "train_context": 10}, "target_context"),
    ({"target_context": 10, "train_context": -1}, "train_context"),
    ({"target_context": 10, "train_context": 10, "budget": "lots"}, "budget"),
    ({"target_context": 10, "train_context": 10, "task": "chat"}, "task"),
    ({"target_context": 10, "train_context": 10, "rope_theta": -5}, "rope_theta"),
])
def test_bad_input_names_the_argument(kwargs, word):
    with pytest.raises(PosencError, match=word):
        pick(**kwargs)


def test_cli_text_and_json(capsys):
    assert main(["pick", "--target-context", "32768", "--train-context", "8192", "--budget", "finetune",
                 "--task", "code"]) == 0
    text = capsys.readouterr().out
    assert "yarn" in text and "Why:" in text and "Alternatives considered:" in text and "Config snippet" in text
    assert main(["pick", "--target-context", "8192", "--train-context", "1024", "--budget", "pretrain",
                 "--extrapolation-needed", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["scheme"] == "ALiBi" and data["inputs"]["extrapolation_needed"] is True


def test_cli_bad_value_is_one_line(capsys):
    assert main(["pick", "--target-context", "-5", "--train-context", "8192"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("posenc pick: error:") and "target_context" in err[0]


def test_existing_model_snippet_never_guesses_theta_and_cites_paths(capsys):
    rec = pick(32768, 8192, "finetune", "lm")
    assert rec.config_snippet["rope_parameters"]["rope_theta"] == THETA_PLACEHOLDER
    assert any("placeholder" in n and "--rope-theta" in n for n in rec.notes)
    given = pick(32768, 8192, "finetune", "lm", rope_theta=500000.0)
    assert given.config_snippet["rope_parameters"]["rope_theta"] == 500000.0
    assert not any("placeholder" in n for n in given.notes)
    # every citation of the project's docs names the file by its path in the repository; papers by author and year
    text = format_recommendation(rec) + format_recommendation(pick(10**6, 4096, "pretrain", "lm", True))
    assert "docs/lesson.md" in text and "Peng et al. 2023" in text and "Press et al. 2022" in text
    assert "facts" not in text
    assert not re.search(r"\blesson\b(?!\.md)", text.replace("docs/lesson.md", ""))
    assert not re.search(r"(?<!docs/)\blab\.md", text)


@pytest.mark.parametrize("argv", [["--target-context", str(10**38), "--train-context", "8192"],
                                  ["--target-context", "1e38", "--train-context", "8192"],
                                  ["--target-context", "32768", "--train-context", str(2**31)]])
def test_absurd_contexts_are_refused_in_one_line(argv, capsys):
    assert main(["pick", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc pick: error:") and "\n" not in err and ("context" in err or "--target-length" in err)


def test_closed_pipe_ends_quietly(tmp_path):
    import os
    import subprocess
    import sys

    # `posenc pick ... | head -0`: the reader is gone before anything is written (deterministic, unlike a race
    # with a reader that leaves after one line while the whole output still fits in the pipe's buffer)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "posenc", "pick", "--target-context", "32768",
                               "--train-context", "8192", "--budget", "finetune"],
                              stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == b"", proc.stderr


def test_finetune_and_longrope_advice_cite_the_lab_measurements():
    """The fine-tune recommendation and the LongRoPE alternative quote posenc's measured extend study."""
    rec = pick(1024, 128, "finetune", "lm", False)
    assert any("6.82" in r and "docs/lab.md" in r for r in rec.reasons)          # YaRN fine-tuned, lab.md table
    why = {a["option"]: a["why_not"] for a in rec.alternatives}
    longrope = why["LongRoPE"]
    assert "9.73" in longrope and "posenc search" in longrope
    assert "PoSE" in why


# ------------------------------------------------- audit: a config's own scaling, explicit flags over the config

LLAMA31 = Path(__file__).parent.parent / "fixtures" / "configs" / "llama-3.1-8b.json"


def test_config_whose_scaling_already_covers_the_target_needs_no_extension(capsys):
    """Llama 3.1 claims 131,072 tokens with llama3 scaling: 32,768 needs nothing, and the output says why."""
    assert main(["pick", "--target-context", "32768", "--config", str(LLAMA31)]) == 0
    text = capsys.readouterr().out
    assert "Recommendation: keep the model's own encoding -- none (the config's llama3 scaling covers it)" in text
    assert "claims 131,072 tokens" in text and "dynamic" not in text and "Config snippet" not in text
    for budget in ("none", "finetune"):
        rec = pick(32768, config=LLAMA31, budget=budget)
        assert rec.config_snippet == {} and rec.method.startswith("none")
        assert rec.inputs["existing_scaling"]["rope_type"] == "llama3"
        assert rec.inputs["existing_scaling"]["claimed_context"] == 131072
        assert all(CITATION.search(r) for r in rec.reasons)


def test_config_whose_scaling_falls_short_is_replaced_from_its_original_context():
    from posenc.tools.extend import extend_config

    rec = pick(262144, config=LLAMA31, budget="finetune")
    assert rec.method == "yarn + short fine-tune, replacing the config's llama3 scaling"
    assert "replaces that scaling" in rec.notes[0] and "131,072" in rec.notes[0]
    assert any("--replace" in n for n in rec.notes)
    # the same config `posenc extend --method yarn --replace` writes: factor 32 from the original 8192
    written = extend_config(LLAMA31, 262144, "yarn", replace=True).config
    snippet = rec.config_snippet
    assert snippet["max_position_embeddings"] == written["max_position_embeddings"] == 262144
    assert {k: v for k, v in snippet["rope_parameters"].items() if not k.startswith("beta")} == \
        written["rope_parameters"]
    # zero-shot: dynamic NTK from 8192, and the snippet resets max_position_embeddings (the file says 131072)
    zero = pick(262144, config=LLAMA31)
    assert "replacing the config's llama3 scaling" in zero.method
    assert zero.config_snippet["max_position_embeddings"] == 8192
    assert zero.config_snippet["rope_parameters"]["factor"] == 1.0 and "993x instead of 32x" in " ".join(zero.notes)


def test_config_with_dynamic_ntk_covers_zero_shot_and_is_replaced_for_a_fine_tune():
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
           "rope_theta": 1e4, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    keep = pick(65536, config=cfg)
    assert keep.method.startswith("none") and keep.config_snippet == {}
    assert "dynamic NTK rescales" in keep.reasons[0]
    tune = pick(65536, config=cfg, budget="finetune")
    assert "replacing the config's dynamic scaling" in tune.method
    assert tune.config_snippet["rope_parameters"]["factor"] == 16.0
    assert pick(2048, config=cfg, budget="finetune").config_snippet == {}


def test_explicit_rope_theta_is_used_for_pretraining(capsys):
    assert main(["pick", "--target-context", "8192", "--train-context", "8192", "--budget", "pretrain",
                 "--rope-theta", "5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameters"]["rope_theta"] == 5.0
    assert data["config_snippet"]["rope_parameters"]["rope_theta"] == 5.0
    assert any("rope_theta 5 as given" in r and "500000" in r for r in data["reasons"])
    # where the pick has no rotary base (ALiBi), a given theta is said to be unused, not dropped silently
    alibi = pick(8192, 1024, "pretrain", "lm", True, rope_theta=5.0)
    assert alibi.scheme == "ALiBi" and any("rope_theta 5 (given) is not used" in n for n in alibi.notes)
    # an explicit theta also wins over the config's
    assert pick(262144, config=LLAMA31, rope_theta=1e6).config_snippet["rope_parameters"]["rope_theta"] == 1e6


def test_per_layer_type_config_gets_a_nested_snippet_transformers_applies(tmp_path):
    """Gemma 3: the snippet rescales the full-attention entry and keeps the local one; merged into the file,
    transformers' own Gemma 3 rotary applies YaRN to the global layers only."""
    transformers = pytest.importorskip("transformers", minversion="5.0")
    path = Path(__file__).parent.parent / "fixtures" / "configs" / "gemma-3-1b-it.json"
    rec = pick(131072, budget="finetune", config=path)
    rp = rec.config_snippet["rope_parameters"]
    assert rp["full_attention"]["rope_type"] == "yarn" and rp["sliding_attention"]["rope_type"] == "default"
    assert any("`posenc extend` writes the same" in n for n in rec.notes)   # one rule: posenc.rope.layers'
    assert any("posenc extend CONFIG" in n for n in rec.notes)             # so pick points at it again
    merged = {**json.loads(path.read_text()), **rec.config_snippet}
    (tmp_path / "config.json").write_text(json.dumps(merged))
    config = transformers.AutoConfig.from_pretrained(str(tmp_path))
    assert config.rope_parameters["full_attention"]["rope_type"] == "yarn"
    assert config.rope_parameters["sliding_attention"]["rope_type"] == "default"


def test_phi3_family_is_recommended_the_rope_type_its_config_accepts():
    path = Path(__file__).parent.parent / "fixtures" / "configs" / "phi-4.json"
    for budget in ("none", "finetune"):
        rec = pick(65536, budget=budget, config=path)
        assert rec.config_snippet["rope_parameters"]["rope_type"] == "longrope", budget
        assert "accepts rope_type default or longrope only" in rec.method


def test_an_alibi_config_needs_no_extension(capsys):
    path = Path(__file__).parent.parent / "fixtures" / "configs" / "mpt-7b.json"
    rec = pick(8192, config=path)
    assert rec.scheme == "ALiBi (existing model)" and rec.method == "none" and rec.config_snippet == {}
    assert all(CITATION.search(r) for r in rec.reasons)
    assert main(["pick", "--config", str(path), "--target-context", "8192"]) == 0
    assert "ALiBi (existing model) -- none" in capsys.readouterr().out


@pytest.mark.parametrize("theta", [1, 1.0, 0.5, 0, -3, float("nan"), float("inf"), 1e39, True, "1e4"])
def test_rope_theta_out_of_its_stated_range_is_refused_with_that_range(theta, capsys):
    """pick states one range for --rope-theta ((1, float32 max]) and refuses exactly what lies outside it."""
    from posenc.rope.config import MAX_THETA
    from posenc.tools.pick import check_pick_theta

    stated = f"rope_theta must be a number > 1 and at most {MAX_THETA:.4g}"
    with pytest.raises(PosencError, match=re.escape(stated)):
        pick(32768, 8192, "finetune", "lm", rope_theta=theta)
    if isinstance(theta, float):
        assert main(["pick", "--target-context", "32768", "--train-context", "8192", "--rope-theta", repr(theta)]) \
            == 2
        assert stated in capsys.readouterr().err
    for ok in (1.0000001, 2, 1e4, 5e5, MAX_THETA):
        assert check_pick_theta(ok) == float(ok)


def test_the_copy_cpu_count_is_read_from_the_results():
    """The evidence text counts the models at >= 95% from docs/results/copy-cpu/results.json (an independent
    count here), never a typed-in number."""
    import json

    from posenc.tools.pick_rules import evidence

    doc = json.loads((Path(__file__).resolve().parents[2] / "docs/results/copy-cpu/results.json").read_text())
    per_model = [v for r in doc["results"] if r["metric"] == "exact_match" and r["eval_len"] == 128
                 for v in r["values"]]
    n_pass = sum(v >= 0.95 for v in per_model)
    assert len(per_model) == 33 and n_pass == 32          # xPos seed 1 at 93.0% (docs/lab.md)
    assert f"; {n_pass} of {len(per_model)} models >= 95% exact at 1x" in evidence("lab_copy")
