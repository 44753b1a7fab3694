"""LongRoPE's search space (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens",
arXiv:2402.13753): per-pair rescale factors, their constraints, the seeds, the variation operators, and the
Hugging Face ``longrope`` dict a candidate becomes.

Convention (the paper's, and transformers' ``long_factor`` / ``short_factor``): pair j rotates with frequency
default_j / lambda_j, default_j = theta^(-2j/d), pair 0 the highest frequency. A candidate is (lambda, n_hat):

- lambda_j on the grid 1, 1 + step, 1 + 2 step, ... <= max_factor (the paper: step 0.01, max_factor = 1.25 s for an
  extension by s);
- lambda_0 <= lambda_1 <= ... <= lambda_{d/2-1}: non-decreasing from high to low frequency (the paper's monotone
  constraint: a lower frequency is interpolated at least as much as a higher one);
- n_hat from a fixed set of choices: positions < n_hat keep the original RoPE (no rescale, no attention scaling),
  positions >= n_hat use default_j / lambda_j (the paper's I(lambda, n_hat); ``longrope_cos_sin``). The paper's
  set is ``PAPER_N_HAT_CHOICES``; posenc's default is (0,), because transformers' ``longrope`` cannot express
  n_hat > 0 (see ``longrope_scaling``).

Candidates are stored as integer grid indices k_j (lambda_j = 1 + k_j * step), so equality, deduplication and
checkpoints are exact. Every operator returns a valid candidate: out-of-order values are repaired by the closest
non-decreasing sequence (``repair_monotone``), then snapped to the grid (snapping keeps the order).
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from posenc._internal.validate import check_float, check_int, even_int, positive_int
from posenc._internal.errors import ConfigError

# The paper's n_hat choices (its search-space table). positions < n_hat keep the original RoPE.
PAPER_N_HAT_CHOICES = (0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64, 128, 256)
# The paper's upper bound on lambda is 1.25 x the extension factor, on a 0.01 grid.
PAPER_MAX_FACTOR_RATIO = 1.25
PAPER_STEP = 0.01

# (grid indices k_j, n_hat): lambda_j = 1 + k_j * step
Candidate = tuple[tuple[int, ...], int]


@dataclass(frozen=True)
class LongRopeSpace:
    """Where the search looks: the model's RoPE geometry, the lengths, and the grid of factors.

    Attributes:
        rotary_dim: d, the rotated dims per head (d/2 factors).
        theta: the RoPE base.
        original_length: L0, the length the model was trained at (``original_max_position_embeddings``).
        target_length: the length the fitness evaluates at (> L0 for the long factors, <= L0 for the short ones).
        factor: s, written as the config's ``factor``; sets the seeds' strength and transformers' default attention
            scaling sqrt(1 + ln s / ln L0).
        max_factor: the largest lambda allowed.
        step: grid spacing of lambda.
        n_hat_choices: the allowed numbers of leading positions left unscaled.
    """

    rotary_dim: int
    theta: float
    original_length: int
    target_length: int
    factor: float
    max_factor: float
    step: float = PAPER_STEP
    n_hat_choices: tuple[int, ...] = (0,)

    def __post_init__(self):
        even_int(self.rotary_dim, "rotary_dim", error=ConfigError)
        check_float(self.theta, "theta", min=1.0, error=ConfigError)
        positive_int(self.original_length, "original_length", error=ConfigError)
        positive_int(self.target_length, "target_length", error=ConfigError)
        check_float(self.factor, "factor", min=1.0, error=ConfigError)
        check_float(self.step, "step", positive=True, error=ConfigError)
        check_float(self.max_factor, "max_factor", min=1.0, error=ConfigError)
        if self.max_factor < 1.0 + self.step:
            raise ConfigError(f"max_factor must be >= 1 + step = {1 + self.step:g} (one grid step above 1), "
                              f"got {self.max_factor!r}")
        choices = self.n_hat_choices
        if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence) or not choices:
            raise ConfigError(f"n_hat_choices must be a non-empty sequence of integers >= 0, got {choices!r}")
        checked = tuple(check_int(n, "n_hat_choices entry", min=0, max=self.target_length - 1, error=ConfigError)
                        for n in choices)
        if len(set(checked)) != len(checked):
            raise ConfigError(f"n_hat_choices must not repeat a value, got {list(checked)}")
        object.__setattr__(self, "n_hat_choices", checked)
        object.__setattr__(self, "theta", float(self.theta))
        object.__setattr__(self, "factor", float(self.factor))
        object.__setattr__(self, "max_factor", float(self.max_factor))
        object.__setattr__(self, "step", float(self.step))

    @property
    def n_pairs(self) -> int:
        return self.rotary_dim // 2

    @property
    def top(self) -> int:
        """The largest grid index: lambda = 1 + top * step <= max_factor."""
        return int(math.floor((self.max_factor - 1.0) / self.step + 1e-9))

    def factors(self, k: Sequence[int]) -> list[float]:
        """Grid indices -> lambda values (rounded to 12 digits so 1 + 7 * 0.01 is written 1.07)."""
        return [round(1.0 + i * self.step, 12) for i in k]

    def snap(self, values: Sequence[float]) -> tuple[int, ...]:
        """Grid coordinates (lambda - 1) / step, in any order -> the nearest valid grid indices (monotone, in range)."""
        return tuple(min(self.top, max(0, math.floor(v + 0.5))) for v in repair_monotone(values))

    def index(self, lambdas: Sequence[float]) -> tuple[int, ...]:
        """lambda values -> the nearest valid grid indices (clamped to [1, max_factor], made non-decreasing)."""
        return self.snap([(float(x) - 1.0) / self.step for x in lambdas])

    def is_valid(self, candidate: Candidate) -> bool:
        k, n_hat = candidate
        return (len(k) == self.n_pairs and all(0 <= a <= b <= self.top for a, b in zip(k, k[1:]))
                and 0 <= k[0] <= self.top and n_hat in self.n_hat_choices)

    def to_dict(self) -> dict:
        return {**asdict(self), "n_hat_choices": list(self.n_hat_choices)}


def longrope_space(*, rotary_dim: int, theta: float, original_length: int, target_length: int | None = None,
                   factor: float | None = None, max_factor: float | None = None, step: float = PAPER_STEP,
                   n_hat_choices: Sequence[int] = (0,)) -> LongRopeSpace:
    """A ``LongRopeSpace`` with the paper's defaults: factor = target / original, max_factor = 1.25 * factor.

    Give target_length or factor (or both; factor then overrides target / original, as ``posenc extend`` does).
    """
    original_length = positive_int(original_length, "original_length", error=ConfigError)
    if target_length is None and factor is None:
        raise ConfigError("give target_length or factor (the extension ratio s = target_length / original_length)")
    if target_length is None:
        factor = check_float(factor, "factor", min=1.0, error=ConfigError)
        target_length = int(round(original_length * factor))
    target_length = positive_int(target_length, "target_length", error=ConfigError)
    if factor is None:
        factor = target_length / original_length
    factor = check_float(factor, "factor", min=1.0, error=ConfigError)
    if max_factor is None:
        max_factor = max(PAPER_MAX_FACTOR_RATIO * factor, 1.0 + 2 * step)
    return LongRopeSpace(rotary_dim=rotary_dim, theta=theta, original_length=original_length,
                         target_length=target_length, factor=factor, max_factor=max_factor, step=step,
                         n_hat_choices=tuple(n_hat_choices))


# ----------------------------------------------------------------------------------------- constraints

def repair_monotone(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators).

    Already non-decreasing input is returned unchanged; otherwise each run that breaks the order is replaced by
    its mean, which moves no value further than needed (unlike a cumulative max, which only pushes values up).
    """
    blocks: list[list[float]] = []  # [sum, count] of pooled runs, means non-decreasing
    for v in values:
        blocks.append([float(v), 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    out: list[float] = []
    for total, count in blocks:
        out.extend([total / count] * int(count))
    return out


# --------------------------------------------------------------------------------------------- seeds

def seed_factors(method: str | Mapping, *, rotary_dim: int, theta: float, original_length: int,
                 factor: float, target_length: int | None = None) -> torch.Tensor:
    """Per-pair lambda_j = default_j / method_j (float64 [rotary_dim // 2]) of another scaling method, from posenc's
    rope registry (``posenc.rope_parameters`` evaluated at ``target_length``).

    method: a registered rope_type ("linear" -> all s, "ntk" -> s^(2j/(d-2)), "yarn" -> YaRN's per-pair ramp,
    "default" -> all 1, ...), given ``factor`` and ``original_max_position_embeddings`` where the type takes them;
    or a full rope-scaling mapping ({"rope_type": "llama3", "factor": 8, ...}) used as given.
    """
    from posenc.rope.apply import default_inv_freq
    from posenc.rope.scaling import ROPE_SCALING_FUNCTIONS, rope_parameters

    if isinstance(method, Mapping):
        scaling = dict(method)
    elif isinstance(method, str):
        fn = ROPE_SCALING_FUNCTIONS.get(method)
        if fn is None:
            raise ConfigError(f"seed method {method!r} is not a registered rope_type; known types: "
                              f"{sorted(ROPE_SCALING_FUNCTIONS)} (or pass a rope-scaling mapping)")
        keys = set(getattr(fn, "required_keys", ())) | set(getattr(fn, "optional_keys", ()))
        scaling = {"rope_type": method}
        if "factor" in keys:
            scaling["factor"] = float(factor)
        if "original_max_position_embeddings" in keys:
            scaling["original_max_position_embeddings"] = int(original_length)
    else:
        raise ConfigError(f"seed method must be a rope_type name or a rope-scaling mapping, got {method!r}")
    target = int(target_length or round(original_length * factor))
    config = {"head_dim": rotary_dim, "max_position_embeddings": target,
              "rope_parameters": {**scaling, "rope_theta": float(theta)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a seed is only a starting point; odd-but-legal values are fine
        inv, _ = rope_parameters(config, seq_len=target)
    if len(inv) != rotary_dim // 2 or not bool((inv > 0).all()):
        raise ConfigError(f"seed method {method!r} does not give {rotary_dim // 2} positive frequencies")
    return default_inv_freq(rotary_dim, theta).double() / inv.double()


# ----------------------------------------------------------------------------------------- operators

def mutate(space: LongRopeSpace, parent: Candidate, rng: random.Random, *, prob: float,
           scale: float) -> Candidate:
    """A random neighbour of ``parent``: each lambda_j, with probability ``prob``, is multiplied by exp(scale * z)
    (z standard normal: steps relative to the value, as the factors span 1 .. s), and n_hat, with probability
    ``prob``, moves to another choice. At least one of them changes. The result is repaired to a valid candidate.
    """
    k, n_hat = parent
    lambdas = space.factors(k)
    chosen = [j for j in range(len(k)) if rng.random() < prob]
    move_n_hat = len(space.n_hat_choices) > 1 and rng.random() < prob
    if not chosen and not move_n_hat:
        chosen = [rng.randrange(len(k))]
    for j in chosen:
        lambdas[j] *= math.exp(scale * rng.gauss(0.0, 1.0))
    if move_n_hat:
        n_hat = rng.choice([n for n in space.n_hat_choices if n != n_hat])
    return space.index(lambdas), n_hat


def crossover(space: LongRopeSpace, first: Candidate, second: Candidate, rng: random.Random, *,
              prob: float) -> Candidate:
    """A child of two parents: each lambda_j (and n_hat) from ``second`` with probability ``prob``, else from
    ``first``; the mix is repaired to a valid candidate (a mix of two monotone vectors need not be monotone)."""
    k = [b if rng.random() < prob else a for a, b in zip(first[0], second[0])]
    n_hat = second[1] if rng.random() < prob else first[1]
    return space.snap(k), n_hat


# ------------------------------------------------------------------------------------ the written config

def longrope_scaling(long_factor, short_factor=None, *, factor: float, original_max_position_embeddings: int,
                     attention_factor: float | None = None) -> dict:
    """The Hugging Face ``longrope`` rope-scaling dict for searched factors (transformers' and posenc's semantics).

    long_factor, short_factor: d/2 positive numbers each (lists or tensors); short_factor defaults to all 1
    (inputs up to L0 keep the original frequencies). Both divide the default frequencies: inv_j = default_j /
    factor_j, the long ones when the sequence is longer than ``original_max_position_embeddings`` (L0).
    factor: s; with ``attention_factor`` None, transformers and posenc scale cos and sin by sqrt(1 + ln s / ln L0)
    at every length (short inputs too); an explicit attention_factor replaces that.
    -> {"rope_type": "longrope", "factor", "short_factor", "long_factor", "original_max_position_embeddings"
    [, "attention_factor"]}: put it under ``rope_parameters`` (with rope_theta) or ``rope_scaling``.
    """
    long_ = _factor_list(long_factor, "long_factor")
    short = [1.0] * len(long_) if short_factor is None else _factor_list(short_factor, "short_factor")
    if len(short) != len(long_):
        raise ConfigError(f"short_factor and long_factor must have the same length (rotary_dim // 2), got "
                          f"{len(short)} and {len(long_)}")
    out = {"rope_type": "longrope",
           "factor": check_float(factor, "factor", min=1.0, error=ConfigError),
           "short_factor": short, "long_factor": long_,
           "original_max_position_embeddings": positive_int(original_max_position_embeddings,
                                                            "original_max_position_embeddings", error=ConfigError)}
    if attention_factor is not None:
        out["attention_factor"] = check_float(attention_factor, "attention_factor", positive=True, error=ConfigError)
    return out


def _factor_list(values, name: str) -> list[float]:
    if isinstance(values, torch.Tensor):
        values = values.detach().double().reshape(-1).tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ConfigError(f"{name} must be a non-empty list of positive numbers (rotary_dim // 2 of them), "
                          f"got {values!r:.80}")
    return [check_float(v, f"{name} entry", positive=True, error=ConfigError) for v in values]


def longrope_cos_sin(config, positions, n_hat: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (float32 [*positions.shape, rotary_dim // 2]) of a longrope config with LongRoPE's n_hat.

    Positions < n_hat get the original RoPE (default frequencies, attention scaling 1), the rest the config's
    frequencies and attention scaling for a sequence of max(positions) + 1 tokens (``posenc.rope_parameters``).
    n_hat = 0 is exactly the config. Rotate q and k with ``posenc.apply_rope_table(x, cos, sin, layout=...)``.
    config: any form ``posenc.load_rope_config`` reads.
    """
    from posenc.rope.apply import default_inv_freq, rope_cos_sin
    from posenc.rope.config import load_rope_config
    from posenc.rope.scaling import rope_parameters

    n_hat = check_int(n_hat, "n_hat", min=0, error=ConfigError)
    positions = torch.as_tensor(positions)
    if positions.numel() == 0 or positions.is_floating_point() or int(positions.min()) < 0:
        raise ConfigError("positions must be a non-empty integer tensor of positions >= 0")
    cfg = load_rope_config(config)
    inv, scaling = rope_parameters(cfg, seq_len=int(positions.max()) + 1)
    cos, sin = rope_cos_sin(positions, inv, scaling)
    if n_hat > 0:
        cos0, sin0 = rope_cos_sin(positions, default_inv_freq(cfg.rotary_dim, cfg.theta))
        early = (positions < n_hat).unsqueeze(-1)
        cos, sin = torch.where(early, cos0, cos), torch.where(early, sin0, sin)
    return cos, sin
