"""LongRoPE's evolutionary search on cheap synthetic fitnesses with a known optimum: it improves on its seeds,
every evaluated candidate obeys the constraints, it is deterministic per seed, an interrupted search resumes to
the uninterrupted result, and the config it writes loads in posenc and transformers with the same frequencies."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import LongRopeResult, LongRopeSettings, Rotary, default_inv_freq, longrope_search, rope_parameters
from posenc import short_factor_search
from posenc._internal.errors import CheckpointError, ConfigError, PosencError
from posenc.search.longrope_space import PAPER_N_HAT_CHOICES, longrope_space

D, THETA, L0, TARGET = 32, 10000.0, 128, 1024
PROBLEM = dict(rotary_dim=D, theta=THETA, original_length=L0, target_length=TARGET)
SMALL = dict(population=16, parents=8, generations=6)


def hidden_optimum(n_pairs: int = D // 2, s: float = 8.0) -> torch.Tensor:
    """A monotone factor vector shaped like LongRoPE's results (near 1 at high frequency, near s at low), on grid."""
    j = torch.arange(n_pairs, dtype=torch.float64)
    space = longrope_space(rotary_dim=2 * n_pairs, theta=THETA, original_length=L0, factor=s)
    return torch.tensor(space.factors(space.index((1 + (s - 1) * torch.sigmoid((j - 0.55 * n_pairs) / 1.5)).tolist())),
                        dtype=torch.float64)


HIDDEN = hidden_optimum()


def distance(rescale: torch.Tensor, n_hat: int, target: torch.Tensor = HIDDEN, n_best: int = 0) -> float:
    """Squared log distance to the hidden optimum, plus a penalty for n_hat away from n_best."""
    return float(((rescale.log() - target.log()) ** 2).sum()) + 0.1 * abs(math.log2(n_hat + 1) - math.log2(n_best + 1))


class Recorder:
    """A fitness that records every call (and can be told to fail after a number of calls)."""

    def __init__(self, fn=distance, fail_after: int | None = None):
        self.fn, self.fail_after, self.calls = fn, fail_after, []

    def __call__(self, rescale, n_hat):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt("simulated interrupt")
        assert rescale.dtype == torch.float64 and rescale.shape == (D // 2,)
        self.calls.append((tuple(rescale.tolist()), n_hat))
        return self.fn(rescale, n_hat)


def comparable(result: LongRopeResult) -> dict:
    out = result.to_dict()
    out.pop("wall_s")
    return out


# ------------------------------------------------------------------------------------------ quality

def test_search_beats_its_seeds_and_nears_the_optimum():
    fitness = Recorder()
    result = longrope_search(fitness, **PROBLEM, progress=False)            # the paper's settings: 64 x 40
    seeds = {name: entry["fitness"] for name, entry in result.seeds.items()}
    assert set(seeds) == {"linear", "ntk", "yarn"}
    assert result.fitness < 0.05 * min(seeds.values()), (result.fitness, seeds)
    assert result.evaluations == len(fitness.calls) == 64 + 40 * 32
    assert result.best_per_generation == sorted(result.best_per_generation, reverse=True)  # elitist: never worse
    assert result.best_per_generation[-1] == result.fitness
    assert max(abs(math.log(a / b)) for a, b in zip(result.factors, HIDDEN.tolist())) < 0.2
    assert result.role == "long" and result.n_hat == 0 and result.factor == 8.0 and result.heldout is None


def test_search_finds_n_hat_when_asked():
    fitness = Recorder(lambda r, n: distance(r, n, n_best=8))
    cfg = LongRopeSettings(n_hat_choices=PAPER_N_HAT_CHOICES)
    result = longrope_search(fitness, **PROBLEM, settings=cfg, progress=False)
    assert result.n_hat == 8
    assert len({n for _, n in fitness.calls}) > 3                            # n_hat really was searched


@settings(max_examples=15, deadline=None, derandomize=True)
@given(population=st.integers(4, 20), generations=st.integers(0, 4), step=st.sampled_from([0.01, 0.05, 0.5]),
       mutation_prob=st.floats(0.0, 1.0), crossover_prob=st.floats(0.0, 1.0), seed=st.integers(0, 1000),
       factor=st.sampled_from([2.0, 4.0, 8.0, 3.3]), n_hat=st.sampled_from([(0,), (0, 2, 4), (1, 8)]))
def test_every_candidate_obeys_the_constraints(population, generations, step, mutation_prob, crossover_prob, seed,
                                               factor, n_hat):
    fitness = Recorder(lambda r, n: distance(r, n, target=hidden_optimum(s=factor)))
    cfg = LongRopeSettings(population=population, parents=max(1, population // 2), generations=generations,
                           step=step, mutation_prob=mutation_prob, crossover_prob=crossover_prob, seed=seed,
                           n_hat_choices=n_hat)
    result = longrope_search(fitness, rotary_dim=D, theta=THETA, original_length=L0, factor=factor, settings=cfg,
                             progress=False)
    max_factor = 1.25 * factor
    for rescale, n in fitness.calls:
        assert all(a <= b for a, b in zip(rescale, rescale[1:])), rescale          # non-decreasing
        assert 1.0 <= rescale[0] and rescale[-1] <= max_factor + 1e-9               # within [1, 1.25 s]
        assert all(abs((x - 1) / step - round((x - 1) / step)) < 1e-6 for x in rescale)   # on the grid
        assert n in n_hat
    assert len(set(fitness.calls)) == len(fitness.calls)                             # never evaluated twice
    assert result.fitness == min(distance(torch.tensor(r, dtype=torch.float64), n, target=hidden_optimum(s=factor))
                                 for r, n in fitness.calls)


def test_deterministic_per_seed():
    cfg = LongRopeSettings(**SMALL)
    first = longrope_search(Recorder(), **PROBLEM, settings=cfg, progress=False)
    again = longrope_search(Recorder(), **PROBLEM, settings=cfg, progress=False)
    other = longrope_search(Recorder(), **PROBLEM, settings=LongRopeSettings(**SMALL, seed=1), progress=False)
    assert comparable(first) == comparable(again)
    assert first.best_per_generation != other.best_per_generation


# ------------------------------------------------------------------------------------------ held-out

def test_heldout_picks_the_winner_among_the_top_candidates():
    elsewhere = hidden_optimum() * torch.linspace(1.0, 1.2, D // 2, dtype=torch.float64)
    heldout = Recorder(lambda r, n: distance(r, n, target=elsewhere))
    cfg = LongRopeSettings(**SMALL, heldout_top=5)
    result = longrope_search(Recorder(), **PROBLEM, heldout=heldout, settings=cfg, progress=False)
    search_scores = [c["fitness"] for c in result.candidates]
    assert len(result.candidates) == 5 and search_scores == sorted(search_scores)
    assert result.heldout == min(c["heldout"] for c in result.candidates)
    winner = next(c for c in result.candidates if c["heldout"] == result.heldout)
    assert winner["factors"] == result.factors and winner["fitness"] == result.fitness
    assert all(entry["heldout"] is not None for entry in result.seeds.values())
    assert result.heldout_evaluations == len(heldout.calls) <= 5 + 3


# ------------------------------------------------------------------------------------------ checkpoints

@pytest.mark.parametrize("where, fail_after", [("fitness", 5),            # in the initial population
                                               ("fitness", 16 + 8 * 3 + 3),  # in generation 4 of 6
                                               ("heldout", 2)])              # while scoring the held-out split
def test_interrupted_search_resumes_to_the_same_result(tmp_path, where, fail_after):
    cfg = LongRopeSettings(**SMALL, heldout_top=3)

    def heldout_fn(r, n):
        return distance(r, n, target=hidden_optimum() * 1.1)

    whole = longrope_search(Recorder(), **PROBLEM, heldout=Recorder(heldout_fn), settings=cfg, progress=False)
    path = tmp_path / "search.json"
    failing = {"fitness": Recorder(fail_after=fail_after if where == "fitness" else None),
               "heldout": Recorder(heldout_fn, fail_after=fail_after if where == "heldout" else None)}
    with pytest.raises(KeyboardInterrupt):
        longrope_search(failing["fitness"], **PROBLEM, heldout=failing["heldout"], settings=cfg, checkpoint=path,
                        progress=False)
    resumed_fitness = Recorder()
    resumed = longrope_search(resumed_fitness, **PROBLEM, heldout=Recorder(heldout_fn), settings=cfg,
                              checkpoint=path, progress=False)
    assert comparable(resumed) == comparable(whole)
    if fail_after > 16 or where == "heldout":  # generations were completed before the interrupt: not redone
        assert len(resumed_fitness.calls) < whole.evaluations
    # finished: a third call returns the stored result without evaluating anything
    done = longrope_search(Recorder(fail_after=0), **PROBLEM, heldout=Recorder(heldout_fn, fail_after=0),
                           settings=cfg, checkpoint=path, progress=False)
    assert comparable(done) == comparable(whole)
    state = json.loads(path.read_text())
    assert state["generation"] == cfg.generations and state["result"] is not None


def test_checkpoint_of_another_search_is_refused(tmp_path):
    path = tmp_path / "search.json"
    longrope_search(Recorder(), **PROBLEM, settings=LongRopeSettings(**SMALL), checkpoint=path, progress=False)
    with pytest.raises(CheckpointError, match="other arguments"):
        longrope_search(Recorder(), **PROBLEM, settings=LongRopeSettings(**SMALL, seed=3), checkpoint=path,
                        progress=False)
    fresh = longrope_search(Recorder(), **PROBLEM, settings=LongRopeSettings(**SMALL, seed=3), checkpoint=path,
                            resume=False, progress=False)                      # resume=False starts afresh
    assert fresh.settings["seed"] == 3
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read"):
        longrope_search(Recorder(), **PROBLEM, settings=LongRopeSettings(**SMALL), checkpoint=path, progress=False)


def test_non_finite_fitness_counts_as_worst_and_survives_the_checkpoint(tmp_path):
    def fitness(r, n):  # the PI seed (all 8) "diverges"
        return math.nan if r[0] > 7.9 else distance(r, n)

    path = tmp_path / "search.json"
    result = longrope_search(fitness, **PROBLEM, settings=LongRopeSettings(**SMALL), checkpoint=path,
                             progress=False)
    assert result.seeds["linear"]["fitness"] == math.inf and math.isfinite(result.fitness)
    again = LongRopeResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.seeds["linear"]["fitness"] == math.inf and comparable(again) == comparable(result)
    with pytest.raises(PosencError, match="must return a number"):
        longrope_search(lambda r, n: "low", **PROBLEM, settings=LongRopeSettings(**SMALL), progress=False)


# ------------------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("kwargs, match", [
    (dict(PROBLEM, target_length=L0), "longer than original_length"),
    (dict(PROBLEM, settings=LongRopeSettings(population=2, parents=1)), "distinct seeds"),
    (dict(PROBLEM, settings=LongRopeSettings(seeds=())), "at least one seed"),
    (dict(PROBLEM, initial=[[1.0, 2.0]]), "initial"),
    (dict(PROBLEM, attention_factor=-1.0), "attention_factor"),
])
def test_bad_search_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        longrope_search(Recorder(), **{"progress": False, **kwargs})


@pytest.mark.parametrize("kwargs, match", [
    (dict(population=1), "population"), (dict(parents=64), "parents"), (dict(mutation_prob=1.5), "mutation_prob"),
    (dict(generations=-1), "generations"), (dict(seeds="linear"), "seeds"), (dict(heldout_top=0), "heldout_top"),
])
def test_bad_settings(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LongRopeSettings(**kwargs)


# ------------------------------------------------------------------------------------------ short factors

def test_short_factor_search_and_the_combined_config():
    long_result = longrope_search(Recorder(), **PROBLEM, settings=LongRopeSettings(**SMALL), progress=False)
    mild = torch.tensor([1.0] * 8 + [1.3] * 8, dtype=torch.float64)
    short = short_factor_search(Recorder(lambda r, n: distance(r, n, target=mild)), rotary_dim=D, theta=THETA,
                                original_length=L0, factor=8.0, initial=[long_result.factors],
                                settings=LongRopeSettings(**SMALL | {"generations": 10}, seeds=("default",)),
                                progress=False)
    assert short.role == "short" and short.target_length == L0
    assert set(short.seeds) == {"default", "initial0"} and short.seeds["default"]["factors"] == [1.0] * 16
    assert short.fitness < short.seeds["default"]["fitness"]
    scaling = long_result.rope_scaling(short_factor=short)
    assert scaling["short_factor"] == short.factors and scaling["long_factor"] == long_result.factors
    with pytest.raises(PosencError, match="short factors"):
        short.rope_scaling()


# ------------------------------------------------------------------------------------------ the written config

@pytest.fixture(scope="module")
def searched() -> LongRopeResult:
    return longrope_search(Recorder(), **PROBLEM, settings=LongRopeSettings(**SMALL), progress=False)


@pytest.mark.parametrize("form", ["rope_parameters", "rope_scaling"])
def test_written_config_loads_with_the_searched_frequencies(searched, form):
    transformers = pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    transformers.logging.set_verbosity_error()
    scaling = searched.rope_scaling()
    assert scaling == {"rope_type": "longrope", "factor": 8.0, "short_factor": [1.0] * (D // 2),
                       "long_factor": searched.factors, "original_max_position_embeddings": L0}
    config = {"hidden_size": 2 * D, "num_attention_heads": 2, "max_position_embeddings": TARGET}
    if form == "rope_parameters":   # transformers 5.x
        config["rope_parameters"] = {**scaling, "rope_theta": THETA}
    else:                           # transformers 4.x
        config.update(rope_scaling=scaling, rope_theta=THETA)
    hf = LlamaConfig(**json.loads(json.dumps(config)))
    rotary = Rotary.from_config(config)
    for seq_len, factors in ((TARGET, searched.factors), (L0, [1.0] * (D // 2))):
        ours, attention = rope_parameters(config, seq_len=seq_len)
        theirs, hf_attention = ROPE_INIT_FUNCTIONS["longrope"](hf, None, seq_len=seq_len)
        torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)
        assert attention == pytest.approx(hf_attention, rel=1e-9)
        assert attention == pytest.approx(math.sqrt(1 + math.log(8) / math.log(L0)), rel=1e-12)
        # exactly what the search's fitness was told: default / lambda
        torch.testing.assert_close(ours, default_inv_freq(D, THETA) / torch.tensor(factors), rtol=1e-6, atol=0)
        rotary.update(seq_len)
        torch.testing.assert_close(rotary.inv_freq, ours, rtol=0, atol=0)


def test_written_config_matches_posenc_extend(searched):
    from posenc.tools.extend import extend_config

    base = {"hidden_size": 2 * D, "num_attention_heads": 2, "max_position_embeddings": L0, "rope_theta": THETA}
    for version, key in ((5, "rope_parameters"), (4, "rope_scaling")):
        out = extend_config(base, TARGET, "longrope", transformers_version=version,
                            short_factor=[1.0] * (D // 2), long_factor=searched.factors).config[key]
        out.pop("rope_theta", None)
        assert out == searched.rope_scaling()


def test_n_hat_is_dropped_from_the_hf_config_with_a_warning(searched):
    data = searched.to_dict() | {"n_hat": 4}
    with pytest.warns(UserWarning, match="n_hat=4"):
        scaling = LongRopeResult.from_dict(data).rope_scaling()
    assert "n_hat" not in json.dumps(scaling) and scaling == searched.rope_scaling()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        searched.rope_scaling()                                               # n_hat 0: exact, no warning
