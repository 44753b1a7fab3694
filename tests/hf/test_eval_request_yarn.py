"""posenc eval --methods yarn-request: each length is scored with the smallest factor of 1, 2, 4, ... (up to
--factor) that covers it, so a length within the trained context is the unscaled model and 2x is static YaRN at 2."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_support"))
transformers = pytest.importorskip("transformers", minversion="5.0")

from posenc_hf_folders import TRAIN_LEN, tiny_llama  # noqa: E402

import posenc  # noqa: E402
from posenc._internal.errors import ConfigError  # noqa: E402
from posenc.hf.evaluate import EvalSettings, evaluate_model  # noqa: E402
from posenc.hf.request_yarn import eval_factors  # noqa: E402


def _values(doc):
    return {(r["scaling"], r["task"], r["metric"], r["eval_len"]): r["value"] for r in doc["results"]}


def test_short_lengths_are_unscaled_and_2x_is_yarn_at_factor_2(tmp_path):
    folder = tiny_llama(tmp_path / "model")
    text = tmp_path / "corpus.txt"
    text.write_text("".join(p.read_text() for p in sorted(Path(posenc.__file__).parent.rglob("*.py")))[:60_000])
    common = dict(eval_lens=[TRAIN_LEN, 2 * TRAIN_LEN, 3 * TRAIN_LEN], data=str(text), eval_tokens=384,
                  sliding_stride=0, tasks=["lm", "passkey"], passkey_depths=[0.5], passkey_trials=2)

    def run(methods, factor):
        return _values(evaluate_model(str(folder), EvalSettings(methods=methods, factor=factor, **common),
                                      progress=False))

    static, static4 = run(["none", "yarn"], 2.0), run(["yarn"], 4.0)
    doc = evaluate_model(str(folder), EvalSettings(methods=["yarn-request"], factor=4.0, **common), progress=False)
    request = _values(doc)
    assert doc["meta"]["methods"]["yarn-request"]["request_factors"] == [1.0, 2.0, 4.0]
    assert request[("yarn-request", "passkey", "exact_match", 3 * TRAIN_LEN)] is not None   # generate ran
    for (_, task, metric, length), value in request.items():
        # <= trained: unscaled; 2x: YaRN at 2; 3x: YaRN at 4 (the smallest of 1, 2, 4 that covers it)
        expected = {1: static.get(("none", task, metric, length)), 2: static.get(("yarn", task, metric, length)),
                    3: static4.get(("yarn", task, metric, length))}[length // TRAIN_LEN]
        assert value == expected, (task, metric, length)
    # the two static methods differ at both lengths, so the equalities above tell them apart
    assert static[("none", "lm", "ppl", TRAIN_LEN)] != static[("yarn", "lm", "ppl", TRAIN_LEN)]
    assert static[("none", "lm", "ppl", 2 * TRAIN_LEN)] != static[("yarn", "lm", "ppl", 2 * TRAIN_LEN)]


def test_factor_set_and_settings():
    assert eval_factors(4.0) == (1.0, 2.0, 4.0)
    assert eval_factors(3.0) == (1.0, 2.0, 3.0)
    assert eval_factors(1.0) == (1.0,)
    with pytest.raises(ConfigError, match="factor: extension methods need --factor"):
        EvalSettings(methods=["yarn-request"]).validate()
    assert EvalSettings(methods=["none", "yarn-request"], factor=8.0).validate().methods == ["none", "yarn-request"]
