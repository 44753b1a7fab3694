"""LongRoPE's evolutionary search (Ding et al. 2024, arXiv:2402.13753) as a library function, model-agnostic.

    >>> result = longrope_search(fitness, rotary_dim=32, theta=1e4, original_length=128, target_length=1024,
    ...                          heldout=heldout_fitness, checkpoint="search.json")
    >>> result.rope_scaling()     # {"rope_type": "longrope", "factor": 8.0, "long_factor": [...], ...}

``fitness(rescale, n_hat) -> float`` (lower is better) scores one candidate: rescale is float64 [rotary_dim // 2],
lambda_j with pair j's frequency default_j / lambda_j, and n_hat the number of leading positions left unscaled;
typically the perplexity at the target length on a search split (``posenc.search.fitness.perplexity_fitness``).
The fitness must apply the candidate the way the written config will: ``longrope_scaling`` gives that config
(including transformers' default attention scaling sqrt(1 + ln s / ln L0)).

The algorithm (the paper's Algorithm 1, with its defaults):
1. Initial population of ``population`` candidates: the seeds (PI, NTK-aware and YaRN's per-pair factors from
   posenc's rope registry, plus any ``initial`` vectors), then mutations of them.
2. Each generation keeps the ``parents`` best, and adds (population - parents) / 2 mutations of random parents
   and as many crossovers of random parent pairs (a crossover that gives nothing new falls back to a mutation).
   No candidate is evaluated twice. The operators keep the constraints (``posenc.search.longrope_space``).
3. After ``generations`` generations the ``heldout_top`` best are scored by ``heldout`` (a separate split), and
   the best there wins; without ``heldout``, the best search fitness wins.

Checkpoint: with ``checkpoint=path`` the state is written atomically (JSON) after the initial population and after
every generation; a rerun with the same arguments resumes from the last completed generation and returns exactly
what an uninterrupted run returns (each generation's random numbers come from (seed, role, generation) alone, and
the fitness is assumed deterministic). A finished checkpoint returns its result without evaluating anything.
"""

from __future__ import annotations

import json
import math
import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from posenc._internal.atomic import atomic_write_json
from posenc._internal.validate import check_choice, check_float, check_int, is_number
from posenc._internal.errors import CheckpointError, ConfigError, PosencError
from posenc.search.longrope_space import (PAPER_STEP, Candidate, LongRopeSpace, crossover, longrope_scaling,
                                          longrope_space, mutate, seed_factors)

Fitness = Callable[[torch.Tensor, int], float]
CHECKPOINT_FORMAT = "posenc-longrope-search/1"
ROLES = ("long", "short")


@dataclass
class LongRopeSettings:
    """Search knobs; the defaults are the paper's (population 64, 40 generations, 32 parents, 16 mutations and 16
    crossovers per generation, probability 0.3, lambda on a 0.01 grid up to 1.25 x the factor).

    Attributes:
        population: candidates per generation.
        parents: the best kept each generation (the rest are new children).
        generations: generations after the initial population.
        mutation_prob: per pair (and for n_hat), the chance a mutation moves it.
        crossover_prob: per pair (and for n_hat), the chance a crossover takes the second parent's value.
        mutation_scale: std of a mutation's relative step: lambda * exp(scale * z).
        step: grid spacing of lambda.
        max_factor: the largest lambda (None: 1.25 x the factor).
        n_hat_choices: numbers of leading positions left unscaled to choose from ((0,): not searched; the paper's
            set is ``posenc.search.longrope_space.PAPER_N_HAT_CHOICES``).
        seeds: rope types (or rope-scaling mappings) whose per-pair factors seed the population.
        heldout_top: how many of the best are scored on the held-out fitness.
        max_tries: attempts to produce a child that was not evaluated before.
        seed: random seed; a search is a pure function of its arguments and the fitness.
    """

    population: int = 64
    parents: int = 32
    generations: int = 40
    mutation_prob: float = 0.3
    crossover_prob: float = 0.3
    mutation_scale: float = 0.1
    step: float = PAPER_STEP
    max_factor: float | None = None
    n_hat_choices: tuple = (0,)
    seeds: tuple = ("linear", "ntk", "yarn")
    heldout_top: int = 4
    max_tries: int = 20
    seed: int = 0

    def __post_init__(self):
        check_int(self.population, "population", min=2, error=ConfigError)
        check_int(self.parents, "parents", min=1, max=self.population - 1, error=ConfigError)
        check_int(self.generations, "generations", min=0, error=ConfigError)
        for name in ("mutation_prob", "crossover_prob"):
            check_float(getattr(self, name), name, min=0.0, max=1.0, error=ConfigError)
        check_float(self.mutation_scale, "mutation_scale", positive=True, error=ConfigError)
        check_int(self.heldout_top, "heldout_top", min=1, error=ConfigError)
        check_int(self.max_tries, "max_tries", min=1, error=ConfigError)
        check_int(self.seed, "seed", error=ConfigError)
        if isinstance(self.seeds, (str, bytes, Mapping)) or not isinstance(self.seeds, Sequence):
            raise ConfigError(f"seeds must be a sequence of rope types or rope-scaling mappings, got {self.seeds!r}")
        self.seeds = tuple(self.seeds)
        self.n_hat_choices = tuple(self.n_hat_choices)

    def to_dict(self) -> dict:
        return _jsonable(asdict(self))

    def evaluations(self, seeds: int | None = None, heldout: bool = True) -> tuple[int, int]:
        """(search-fitness evaluations, held-out scores at most) of a search with these settings, as its progress
        bar counts them: the initial population, then population - parents new children per generation; with a
        held-out fitness, the re-score of the heldout_top best and of the ``seeds`` distinct seeds (default
        len(self.seeds)), fewer when they overlap. ``posenc tune`` plans a search's cost from it."""
        search = self.population + self.generations * (self.population - self.parents)
        if not heldout:
            return search, 0
        return search, min(self.heldout_top, self.population) + (len(self.seeds) if seeds is None else seeds)


@dataclass
class LongRopeResult:
    """What a search found. ``factors`` are lambda_j (pair 0 = highest frequency), the long factors for role "long"
    (evaluated above L0) or the short ones for role "short" (at L0).

    fitness / heldout: the winner's search and held-out scores (heldout None without a held-out fitness).
    candidates: the ``heldout_top`` best by search fitness, each {"factors", "n_hat", "fitness", "heldout"}.
    seeds: per seed name, {"factors", "n_hat", "fitness", "heldout"} as placed on the grid and scored.
    best_per_generation: the best search fitness after the initial population and after each generation.
    """

    role: str
    factors: list[float]
    n_hat: int
    factor: float
    original_max_position_embeddings: int
    target_length: int
    rotary_dim: int
    theta: float
    attention_factor: float | None
    fitness: float
    heldout: float | None
    candidates: list[dict] = field(default_factory=list)
    seeds: dict = field(default_factory=dict)
    best_per_generation: list[float] = field(default_factory=list)
    evaluations: int = 0
    heldout_evaluations: int = 0
    wall_s: float = 0.0
    settings: dict = field(default_factory=dict)

    @property
    def long_factor(self) -> list[float]:
        if self.role != "long":
            raise PosencError("this result holds short factors (role 'short'); its long factors come from "
                              "longrope_search")
        return list(self.factors)

    def rope_scaling(self, short_factor=None) -> dict:
        """The Hugging Face ``longrope`` dict (``longrope_scaling``) with these long factors and ``short_factor``
        (a list, or a short-role ``LongRopeResult``; default all 1). transformers has no n_hat: when the search
        chose n_hat > 0 this warns and the dict applies the factors at every position (use ``longrope_cos_sin``
        for the searched behaviour in posenc)."""
        if isinstance(short_factor, LongRopeResult):
            if short_factor.role != "short":
                raise PosencError("short_factor must be a short-role result (from short_factor_search) or a list")
            short_factor = short_factor.factors
        if self.n_hat:
            warnings.warn(f"the search chose n_hat={self.n_hat} (positions < {self.n_hat} unscaled), which a Hugging "
                          "Face longrope config cannot express: the written config rescales every position, so it "
                          "behaves differently from what was searched. Search with n_hat_choices=(0,) for a config "
                          "that matches exactly, or use posenc.search.longrope_space.longrope_cos_sin.",
                          UserWarning, stacklevel=2)
        return longrope_scaling(self.long_factor, short_factor, factor=self.factor,
                                original_max_position_embeddings=self.original_max_position_embeddings,
                                attention_factor=self.attention_factor)

    def to_dict(self) -> dict:
        """JSON-ready (a non-finite score is written as the string "inf")."""
        return _jsonable(_map_scores(asdict(self), _to_json_score))

    @classmethod
    def from_dict(cls, data: Mapping) -> LongRopeResult:
        return cls(**_map_scores(json.loads(json.dumps(dict(data))), _from_json_score))


# ------------------------------------------------------------------------------- what a checkpoint belongs to

def is_search_checkpoint(path: str | Path) -> bool:
    """True if ``path`` is a JSON file in this module's checkpoint format."""
    from posenc._internal.json_io import loads

    try:
        data = loads(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, PosencError):
        return False
    return isinstance(data, dict) and data.get("format") == CHECKPOINT_FORMAT


# -------------------------------------------------------------------------------------------- public calls

def longrope_search(fitness: Fitness, *, rotary_dim: int, theta: float, original_length: int,
                    target_length: int | None = None, factor: float | None = None, heldout: Fitness | None = None,
                    settings: LongRopeSettings | None = None, initial: Sequence = (),
                    attention_factor: float | None = None, checkpoint: str | Path | None = None,
                    resume: bool = True, progress: bool = True, problem: Mapping | None = None,
                    on_evaluation: Callable[[str], None] | None = None) -> LongRopeResult:
    """Search LongRoPE's long factors (and n_hat, if settings.n_hat_choices offers more than one) for extending a
    RoPE model trained at ``original_length`` (L0) to ``target_length`` (or by ``factor``).

    fitness, heldout: ``(rescale float64 [rotary_dim // 2], n_hat) -> float``, lower is better (perplexity at the
        target length on the search split / on a held-out split). Non-finite values count as +inf.
    initial: extra seed vectors (lambda lists, e.g. a previous search's result), placed on the grid.
    attention_factor: written into the config and to be applied by the fitness (None: transformers' default
        sqrt(1 + ln s / ln L0)).
    checkpoint, resume: JSON state file; resume=False starts afresh and overwrites it (only a search checkpoint:
        any other file there is refused).
    problem: what the fitness scores, as JSON-able values (the model's and the data's fingerprints, windows, dtype:
        ``posenc._internal.fingerprint``); a checkpoint resumes only a search of the same problem, so
        another model's or another text's record is refused instead of returned.
    on_evaluation: called with "fitness" or "heldout" after each new score (posenc tune's progress bar counts
        them); scores kept from a checkpoint are not reported again.
    Returns a ``LongRopeResult`` (role "long"); ``result.rope_scaling()`` is the config.
    """
    settings = settings or LongRopeSettings()
    space = longrope_space(rotary_dim=rotary_dim, theta=theta, original_length=original_length,
                           target_length=target_length, factor=factor, max_factor=settings.max_factor,
                           step=settings.step, n_hat_choices=settings.n_hat_choices)
    if space.target_length <= space.original_length:
        raise ConfigError(f"target_length ({space.target_length}) must be longer than original_length "
                          f"({space.original_length}): long factors apply only past it (use short_factor_search "
                          "for the original context)")
    return _Search(space, settings, "long", fitness, heldout, initial, attention_factor, problem,
                   on_evaluation).run(checkpoint, resume, progress)


def short_factor_search(fitness: Fitness, *, rotary_dim: int, theta: float, original_length: int, factor: float,
                        heldout: Fitness | None = None, settings: LongRopeSettings | None = None,
                        initial: Sequence = (), attention_factor: float | None = None,
                        checkpoint: str | Path | None = None, resume: bool = True,
                        progress: bool = True, problem: Mapping | None = None) -> LongRopeResult:
    """LongRoPE's short-context recovery: search the short factors, used for inputs of at most L0 tokens, on a
    model extended by ``factor`` (typically fine-tuned with the long factors).

    fitness scores candidates at L0 (the fitness applies them as ``short_factor``, with the long factors and the
    attention scaling of the extended config). Seeds default to "default" (all 1: the original RoPE) plus
    ``initial`` (e.g. the long factors); pass settings.seeds to change them. Returns role "short"; combine with
    ``long_result.rope_scaling(short_factor=short_result)``.
    """
    settings = settings or LongRopeSettings(seeds=("default",))
    space = longrope_space(rotary_dim=rotary_dim, theta=theta, original_length=original_length,
                           target_length=original_length, factor=factor, max_factor=settings.max_factor,
                           step=settings.step, n_hat_choices=settings.n_hat_choices)
    return _Search(space, settings, "short", fitness, heldout, initial, attention_factor, problem).run(
        checkpoint, resume, progress)


# -------------------------------------------------------------------------------------------- the engine

class _Search:
    """One search: its problem, settings and state (evaluated candidates, current population, generation)."""

    def __init__(self, space: LongRopeSpace, settings: LongRopeSettings, role: str, fitness: Fitness,
                 heldout: Fitness | None, initial: Sequence, attention_factor: float | None,
                 problem: Mapping | None = None, on_evaluation: Callable[[str], None] | None = None):
        check_choice(role, "role", ROLES, error=ConfigError)
        for name, fn in (("fitness", fitness), ("heldout", heldout)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name} must be a callable (rescale, n_hat) -> float, got {type(fn).__name__}")
        if fitness is None:
            raise ConfigError("fitness must be a callable (rescale, n_hat) -> float, got None")
        if attention_factor is not None:
            attention_factor = check_float(attention_factor, "attention_factor", positive=True, error=ConfigError)
        self.space, self.settings, self.role = space, settings, role
        self.fitness, self.heldout, self.attention_factor = fitness, heldout, attention_factor
        self.on_evaluation = on_evaluation
        self.problem = None if problem is None else _jsonable(dict(problem))
        self.seed_candidates = self._seeds(initial)
        if len(set(self.seed_candidates.values())) > settings.population:
            raise ConfigError(f"population ({settings.population}) must be at least the number of distinct seeds "
                              f"({len(set(self.seed_candidates.values()))})")
        # state (what a checkpoint holds)
        self.evaluated: list[list] = []          # [k list, n_hat, search fitness] in evaluation order
        self.where: dict[Candidate, int] = {}    # candidate -> index into evaluated
        self.population: list[int] = []
        self.generation = -1                     # last completed generation (0 = the initial population)
        self.best: list[float] = []
        self.heldout_scores: dict[int, float] = {}
        self.wall_s = 0.0
        self.result: dict | None = None
        self._bar = None
        self._t0 = time.perf_counter()

    # -- seeds -------------------------------------------------------------------------------------------
    def _seeds(self, initial: Sequence) -> dict[str, Candidate]:
        s = self.space
        n_hat = 0 if 0 in s.n_hat_choices else min(s.n_hat_choices)
        named: dict[str, Candidate] = {}
        for i, method in enumerate(self.settings.seeds):
            name = method if isinstance(method, str) else f"{method.get('rope_type', 'seed')}#{i}"
            lambdas = seed_factors(method, rotary_dim=s.rotary_dim, theta=s.theta, original_length=s.original_length,
                                   factor=s.factor, target_length=max(s.target_length, s.original_length + 1))
            named[name] = (s.index(lambdas.tolist()), n_hat)
        if isinstance(initial, (str, bytes, torch.Tensor)) or not isinstance(initial, Sequence):
            raise ConfigError("initial must be a sequence of lambda vectors (lists or 1-D tensors)")
        for i, vector in enumerate(initial):
            values = vector.tolist() if isinstance(vector, torch.Tensor) else list(vector)
            if len(values) != s.n_pairs:
                raise ConfigError(f"initial[{i}] must have rotary_dim // 2 = {s.n_pairs} values, got {len(values)}")
            named[f"initial{i}"] = (s.index([check_float(v, f"initial[{i}] entry", positive=True, error=ConfigError)
                                             for v in values]), n_hat)
        if not named:
            raise ConfigError("the search needs at least one seed (settings.seeds or initial)")
        return named

    # -- evaluation -------------------------------------------------------------------------------------
    def _score(self, fn: Fitness, candidate: Candidate, what: str) -> float:
        k, n_hat = candidate
        rescale = torch.tensor(self.space.factors(k), dtype=torch.float64)
        value = fn(rescale, n_hat)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not is_number(value):
            raise PosencError(f"{what} must return a number (lower is better), got {type(value).__name__}")
        value = float(value)
        if self._bar is not None:
            self._bar.update(1)
        if self.on_evaluation is not None:
            self.on_evaluation(what)
        return value if math.isfinite(value) else math.inf

    def _evaluate(self, candidates: list[Candidate]) -> list[int]:
        indices = []
        for c in candidates:
            f = self._score(self.fitness, c, "fitness")
            self.where[c] = len(self.evaluated)
            self.evaluated.append([list(c[0]), c[1], f])
            indices.append(self.where[c])
        return indices

    def _ranked(self, indices: list[int]) -> list[int]:
        return sorted(indices, key=lambda i: (self.evaluated[i][2], i))

    # -- variation --------------------------------------------------------------------------------------
    def _rng(self, generation: int) -> random.Random:
        return random.Random(f"posenc-longrope/{self.settings.seed}/{self.role}/{generation}")

    def _new(self, make, taken: set) -> Candidate | None:
        for _ in range(self.settings.max_tries):
            child = make()
            if child not in self.where and child not in taken:
                taken.add(child)
                return child
        return None

    def _mutant(self, parent: Candidate, rng: random.Random, taken: set) -> Candidate | None:
        st = self.settings
        return self._new(lambda: mutate(self.space, parent, rng, prob=st.mutation_prob, scale=st.mutation_scale),
                         taken)

    def _initial_population(self) -> list[Candidate]:
        rng, taken = self._rng(0), set()
        members = []
        for c in self.seed_candidates.values():
            if c not in taken:
                taken.add(c)
                members.append(c)
        seeds = list(members)
        for i in range(self.settings.population - len(members)):
            child = self._mutant(seeds[i % len(seeds)], rng, taken)
            if child is not None:
                members.append(child)
        return members[:self.settings.population]

    def _children(self, parents: list[Candidate], rng: random.Random) -> list[Candidate]:
        st = self.settings
        n_new = st.population - len(parents)
        n_mutations = n_new // 2
        taken: set = set()
        children = []
        for _ in range(n_mutations):
            child = self._mutant(parents[rng.randrange(len(parents))], rng, taken)
            if child is not None:
                children.append(child)
        for _ in range(n_new - n_mutations):
            if len(parents) >= 2:
                a, b = sorted(rng.sample(range(len(parents)), 2))  # the better parent first
                first, second = parents[a], parents[b]
                child = self._new(lambda: crossover(self.space, first, second, rng, prob=st.crossover_prob), taken)
            else:
                first, child = parents[0], None
            if child is None:  # the parents are too alike to give anything new: mutate instead (as the paper)
                child = self._mutant(first, rng, taken)
            if child is not None:
                children.append(child)
        return children

    def _candidate(self, i: int) -> Candidate:
        k, n_hat, _ = self.evaluated[i]
        return tuple(k), n_hat

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self, checkpoint, resume: bool, progress: bool) -> LongRopeResult:
        from tqdm.auto import tqdm

        path = None if checkpoint is None else Path(checkpoint)
        if path is not None and not resume and path.exists() and not is_search_checkpoint(path):
            raise CheckpointError(f"checkpoint {str(path)!r} exists and is not a LongRoPE search checkpoint "
                                  f"({CHECKPOINT_FORMAT}); refusing to overwrite it: choose another path")
        if path is not None and resume and path.exists():
            self._load(path)
            if self.result is not None:
                return LongRopeResult.from_dict(self.result)
        st = self.settings
        total = sum(st.evaluations(len(self.seed_candidates), heldout=self.heldout is not None))
        self._t0 = time.perf_counter()
        self._bar = tqdm(total=total, initial=len(self.evaluated), desc=f"longrope search ({self.role})",
                         unit="eval", disable=not progress, dynamic_ncols=True, mininterval=0.5, leave=False)
        try:
            if self.generation < 0:
                self.population = self._evaluate(self._initial_population())
                self._commit(0, path)
            for generation in range(self.generation + 1, st.generations + 1):
                parents = self._ranked(self.population)[:st.parents]
                children = self._children([self._candidate(i) for i in parents], self._rng(generation))
                self.population = parents + self._evaluate(children)
                self._commit(generation, path)
            result = self._finish()
            self._tick()
            result.wall_s = self.wall_s
            self.result = result.to_dict()
            if path is not None:
                self._save(path)
            return result
        finally:
            self._bar.close()
            self._bar = None

    def _tick(self) -> None:
        """Add the time since the last tick to wall_s (which a checkpoint carries across resumes)."""
        now = time.perf_counter()
        self.wall_s += now - self._t0
        self._t0 = now

    def _commit(self, generation: int, path: Path | None) -> None:
        self.generation = generation
        self.best.append(self.evaluated[self._ranked(self.population)[0]][2])
        if self._bar is not None:
            self._bar.set_postfix(gen=f"{generation}/{self.settings.generations}", best=f"{self.best[-1]:.5g}",
                                  refresh=False)
        self._tick()
        if path is not None:
            self._save(path)

    def _finish(self) -> LongRopeResult:
        st, s = self.settings, self.space
        top = self._ranked(self.population)[:min(st.heldout_top, len(self.population))]
        seed_index = {}
        for name, c in self.seed_candidates.items():
            seed_index[name] = self.where[c]
        if self.heldout is not None:
            for i in top + list(seed_index.values()):
                if i not in self.heldout_scores:
                    self.heldout_scores[i] = self._score(self.heldout, self._candidate(i), "heldout")
            best = min(top, key=lambda i: (self.heldout_scores[i], self.evaluated[i][2], i))
        else:
            best = top[0]

        def entry(i):
            k, n_hat, f = self.evaluated[i]
            return {"factors": s.factors(k), "n_hat": n_hat, "fitness": f, "heldout": self.heldout_scores.get(i)}

        k, n_hat, f = self.evaluated[best]
        return LongRopeResult(
            role=self.role, factors=s.factors(k), n_hat=n_hat, factor=s.factor,
            original_max_position_embeddings=s.original_length, target_length=s.target_length,
            rotary_dim=s.rotary_dim, theta=s.theta, attention_factor=self.attention_factor, fitness=f,
            heldout=self.heldout_scores.get(best), candidates=[entry(i) for i in top],
            seeds={name: entry(i) for name, i in seed_index.items()}, best_per_generation=list(self.best),
            evaluations=len(self.evaluated), heldout_evaluations=len(self.heldout_scores),
            settings=self.settings.to_dict())

    # -- checkpoint -------------------------------------------------------------------------------------
    def _identity(self) -> dict:
        identity = {"role": self.role, "space": self.space.to_dict(), "settings": self.settings.to_dict(),
                    "attention_factor": self.attention_factor, "heldout": self.heldout is not None,
                    "seeds": {name: [list(c[0]), c[1]] for name, c in self.seed_candidates.items()}}
        if self.problem is not None:      # (absent when not given: older checkpoints keep resuming)
            identity["problem"] = self.problem
        return _jsonable(identity)

    def _save(self, path: Path) -> None:
        atomic_write_json(path, {
            "format": CHECKPOINT_FORMAT, "search": self._identity(), "generation": self.generation,
            "evaluated": [[k, n, _to_json_score(f)] for k, n, f in self.evaluated],
            "population": self.population, "best_per_generation": [_to_json_score(x) for x in self.best],
            "heldout": {str(i): _to_json_score(v) for i, v in self.heldout_scores.items()},
            "wall_s": self.wall_s, "result": self.result})

    def _load(self, path: Path) -> None:
        from posenc._internal.json_io import loads

        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"cannot read search checkpoint {str(path)!r}: {exc}") from None
        try:
            data = loads(text, "the file", error=CheckpointError)
        except CheckpointError as exc:
            raise CheckpointError(f"cannot read search checkpoint {str(path)!r}: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{str(path)!r} is not a LongRoPE search checkpoint ({CHECKPOINT_FORMAT})")
        if data.get("search") != self._identity():
            raise CheckpointError(f"search checkpoint {str(path)!r} was written by a search with other arguments "
                                  "(model, data, problem, settings or seeds); use another checkpoint path or "
                                  "start over with resume=False (--fresh)")
        try:
            self.evaluated = [[list(map(int, k)), int(n), _from_json_score(f)] for k, n, f in data["evaluated"]]
            self.where = {(tuple(k), n): i for i, (k, n, _) in enumerate(self.evaluated)}
            self.population = [int(i) for i in data["population"]]
            self.generation = int(data["generation"])
            self.best = [_from_json_score(x) for x in data["best_per_generation"]]
            self.heldout_scores = {int(i): _from_json_score(v) for i, v in data.get("heldout", {}).items()}
            self.wall_s = float(data.get("wall_s", 0.0))
            self.result = data.get("result")
            assert all(0 <= i < len(self.evaluated) for i in self.population)
        except (KeyError, TypeError, ValueError, AssertionError) as exc:
            raise CheckpointError(f"search checkpoint {str(path)!r} is corrupt: {exc!r}") from None


def _to_json_score(x: float | None):
    """JSON has no infinity: a non-finite score (a candidate that diverged) is written as the string "inf"."""
    return x if x is None or math.isfinite(x) else "inf"


def _from_json_score(x) -> float | None:
    return None if x is None else math.inf if x == "inf" else float(x)


def _map_scores(result: dict, fn) -> dict:
    """Apply fn to every score of a result dict (fitness, heldout, best_per_generation, candidates, seeds)."""
    out = dict(result)
    for key in ("fitness", "heldout"):
        out[key] = fn(out.get(key))
    out["best_per_generation"] = [fn(x) for x in out.get("best_per_generation", [])]
    out["candidates"] = [{**e, "fitness": fn(e.get("fitness")), "heldout": fn(e.get("heldout"))}
                         for e in out.get("candidates", [])]
    out["seeds"] = {name: {**e, "fitness": fn(e.get("fitness")), "heldout": fn(e.get("heldout"))}
                    for name, e in out.get("seeds", {}).items()}
    return out


def _jsonable(obj):
    """Round-trip through JSON (tuples -> lists, keys -> str) so settings compare equal after a reload."""
    return json.loads(json.dumps(obj, sort_keys=True, allow_nan=False))
