"""``posenc tune``'s race: every candidate on the first window, then further windows only for those still within the
noise of the best, and the answer.

The rule (``survivors``). Losses are paired: window w is the same tokens for every candidate. After n windows the
best is the candidate with the lowest mean log-perplexity; another candidate stays while the mean of its paired
differences to the best, d_w = loss_w - best_w, is at most Z (2) standard errors of those differences
(sd(d) / sqrt(n)). With one window there is no spread yet: the better half stays (at least two).

The answer (``answer``): the winner, each runner-up's mean paired difference to it and the spread (sd) over their
common windows, "tie" when the difference is within Z standard errors (or only one window was shared), and among
candidates tied with the best a config method is preferred: it deploys in transformers, vLLM and llama.cpp without
posenc, where an attention method needs posenc.patch at runtime.
"""

from __future__ import annotations

import math
import statistics

Z = 2.0
# a method that raises log-perplexity at the trained length by more than this (nats; ~2% perplexity) is flagged
TRAINED_MARGIN = 0.02


def paired(a: list[float], b: list[float]) -> tuple[float, float, int]:
    """(mean, sd, n) of the differences a_w - b_w over the windows both measured (lists indexed by window; None:
    not measured)."""
    d = [x - y for x, y in zip(a, b) if x is not None and y is not None]
    if not d:
        return math.nan, math.nan, 0
    return statistics.fmean(d), (statistics.stdev(d) if len(d) > 1 else math.nan), len(d)


def within_noise(mean: float, sd: float, n: int) -> bool:
    """True when a mean paired difference ``mean`` over ``n`` windows is at most Z standard errors."""
    if n < 2:
        return False
    return mean <= Z * sd / math.sqrt(n)


def _finite(x: float) -> float | None:
    """``x``, or None where it is nan or infinite (results.json is strict JSON)."""
    return x if math.isfinite(x) else None


def mean_loss(losses: list) -> float:
    values = [x for x in losses if x is not None]
    return statistics.fmean(values) if values else math.inf


def survivors(losses: dict[str, list[float]]) -> list[str]:
    """The candidates that stay in the race (see the module docstring): ``losses`` maps each candidate still racing
    to its per-window losses (the same windows for all)."""
    if len(losses) <= 1:
        return list(losses)
    ranked = sorted(losses, key=lambda name: mean_loss(losses[name]))
    best = ranked[0]
    n = min(sum(x is not None for x in v) for v in losses.values())
    if n < 2:
        return ranked[:max(2, math.ceil(len(ranked) / 2))]
    return [best] + [name for name in ranked[1:] if within_noise(*paired(losses[name], losses[best]))]


def flagged(trained_check: dict[str, float]) -> list[str]:
    """The candidates whose log-perplexity at the trained length exceeds the unchanged model's by more than
    TRAINED_MARGIN (``trained_check``: name -> that paired difference)."""
    return [name for name, d in trained_check.items() if d > TRAINED_MARGIN]


def race(names: list[str], windows: int, score, *, can_afford=lambda alive: True, log=print,
         on_round=None, before_round=None, eliminate: bool = True) -> dict:
    """Run the race: ``score(name, window) -> loss`` (mean log-perplexity of that window); ``can_afford(alive)``:
    whether another window round for the names ``alive`` fits what is left of the budget; ``before_round(alive,
    window)``, when given, is told each round's work before ``score`` is asked for it (--nproc measures the round
    on several ranks at once); ``on_round(losses, alive)``: called after each window round (tune draws its plots
    there); ``eliminate`` False (--race none): nobody leaves, every candidate runs every window the budget holds.
    -> {"losses": name -> per-window losses (None where not measured), "rounds": [names measured in each round],
    "stopped": why}."""
    losses = {name: [None] * windows for name in names}
    alive, rounds, stopped = list(names), [], "windows exhausted"
    for w in range(windows):
        if w and not can_afford(alive):
            stopped = f"budget: window {w + 1} for {len(alive)} candidates does not fit"
            break
        if before_round is not None:
            before_round(list(alive), w)
        for name in alive:
            losses[name][w] = score(name, w)
        rounds.append(list(alive))
        kept = survivors({name: losses[name][:w + 1] for name in alive}) if eliminate else list(alive)
        dropped = [name for name in alive if name not in kept]
        if dropped:
            log(f"window {w + 1}: out of the race: {', '.join(dropped)}")
        alive = kept
        if on_round is not None:
            on_round(losses, alive)
        if len(alive) == 1:
            stopped = "one candidate left"
            break
    return {"losses": losses, "rounds": rounds, "stopped": stopped, "alive": alive}


def answer(losses: dict[str, list], kinds: dict[str, str]) -> dict:
    """The winner, the runners-up (paired difference to the best, its sd and the windows shared), ties, and the
    config-over-patch preference (module docstring). ``kinds``: name -> "config" or "attention"."""
    ranked = sorted(losses, key=lambda name: (-sum(x is not None for x in losses[name]), mean_loss(losses[name])))
    best = ranked[0]
    rows = []
    for name in ranked:
        mean, sd, n = paired(losses[name], losses[best])
        tie = name != best and within_noise(mean, sd, n)
        rows.append({"name": name, "kind": kinds[name], "mean_loss": _finite(mean_loss(losses[name])),
                     "windows": sum(x is not None for x in losses[name]), "diff_to_best": _finite(mean),
                     "sd": _finite(sd),
                     "shared_windows": n, "tie": tie})
    tied = [r for r in rows if r["name"] == best or r["tie"]]
    winner, reason = best, "lowest mean log-perplexity on the paired windows"
    if kinds[best] != "config":
        configs = [r for r in tied if r["kind"] == "config"]
        if configs:
            winner = configs[0]["name"]
            reason = (f"tied within the noise with {best} (an attention method); a config deploys in transformers, "
                      "vLLM and llama.cpp without posenc, where an attention method needs posenc.patch at runtime")
    if len(tied) > 1 and winner == best:
        reason += f"; tie within the noise with {', '.join(r['name'] for r in tied if r['name'] != best)}"
    return {"winner": winner, "best": best, "reason": reason, "ranking": rows,
            "tie": [r["name"] for r in tied]}
