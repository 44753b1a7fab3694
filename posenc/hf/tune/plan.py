"""``posenc tune``'s plan: the candidates, what each measurement costs, and what the budget leaves out.

Candidates: every registered frequency method that ``posenc eval`` runs as a config edit (plug-ins' included), at
factor L / trained length, and every registered attention method with the settings ``attention_settings`` derives
from the trained length.

The estimate's rule: one measurement (one window of ``length`` tokens) costs ``passes x model_flops(length) /
(EFFICIENCY x matmul_peak)`` seconds, where ``model_flops`` is posenc.hf.throughput's forward count, ``matmul_peak``
this machine's measured FLOP/s of one square matmul in the run's dtype, and ``passes`` the score passes of the
method (1 for a config edit; an attention rule's modes, each a score pass over its keys, for an attention method).
The race's rounds after the first are estimated as the field halving each window (the race's rule decides).

Retrieval on the survivors (passkey, RULER's tasks): a sample is one prefill at the target length plus up to its
answer budget of decode steps, each a forward of one token at the target length (model_flops(L + 1) -
model_flops(L)); per survivor a task costs ``samples x (1 + decode x step / window)`` of the survivor's window
estimate. The survivors are estimated as the race's last round (the field halving, at least two); the budget
reserves their retrieval before the race's windows.

A short LongRoPE search (posenc.hf.tune.searched) is estimated as its evaluations, each one window of the target
length on the training split (as a config edit's window), and reserved before the race's windows as well.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from posenc._internal.errors import ConfigError

# a forward pass reaches about half the square-matmul peak (smaller, oddly shaped matmuls, attention, norms)
EFFICIENCY = 0.5
# windows of held-out text the race may use per candidate unless --windows says otherwise (the text's own length may
# allow fewer)
MAX_WINDOWS = 8
# --methods none: the unchanged model as a candidate, the baseline every extension must beat (left out by default:
# it is what the user already has, and at L it usually loses by far)
BASELINE = "none"
# --race: "eliminate" drops the candidates outside the noise of the best after each window (posenc.hf.tune.race);
# "none" measures every candidate on every window (a fixed grid: the same rows as a study of fixed windows)
RACES = ("eliminate", "none")


@dataclass(frozen=True)
class Candidate:
    """One measured configuration: ``method`` with its attention ``options`` (a config method has none); a
    ``configured`` label ("as configured (fine-tuned)") marks the model's own scaling, run as its config says."""

    method: str
    kind: str                        # "config" (written into config.json) or "attention" (posenc.patch)
    options: dict = field(default_factory=dict)
    passes: int = 1                  # score passes per forward, for the estimate
    configured: str = ""
    searched: str = ""               # the config file a LongRoPE search wrote (posenc.hf.tune.searched)

    @property
    def name(self) -> str:
        """The candidate's label: the method, with its options when it has any (``self-extend(window=8,...)``),
        or with its configured label (``yarn as configured (fine-tuned)``)."""
        if self.configured:
            return f"{self.method} {self.configured}"
        if self.searched:
            return f"{self.method} (searched)"
        if not self.options:
            return self.method
        return f"{self.method}({','.join(f'{k}={v}' for k, v in self.options.items())})"


def attention_settings(method: str, trained: int, target: int) -> list[dict]:
    """The 2-3 option sets tune races for attention ``method`` of a model trained at ``trained`` tokens run at
    ``target``. Why these: each method's quality turns on how much of the trained range stays exact (the window or
    chunk) against how far the rest is compressed, so the settings span a small, a middle and a large exact part
    of the trained length, and the compression is then set so that the longest input still lands inside it."""
    t = trained
    if method == "self-extend":      # window W exact; group G so that the farthest grouped distance stays below t
        return [{"window": w, "group_size": max(1, math.ceil((target - w) / max(t - w, 1)))}
                for w in sorted({max(1, t // 8), max(1, t // 4), max(1, t // 2)})]
    if method == "rerope":           # distances capped at the window: a quarter, half, three quarters of t
        return [{"window": w} for w in sorted({max(1, t // 4), max(1, t // 2), max(1, 3 * t // 4)})]
    if method == "leaky-rerope":     # the leak is derived so that the farthest pair lands at t - 1
        return [{"window": w} for w in sorted({max(1, t // 4), max(1, t // 2)})]
    if method == "dca":              # ChunkLlama's local window t // 16; chunk sizes around its 3t // 4 default
        local = t // 16
        return [{"chunk_size": c, "local_window": local} for c in sorted({max(local + 2, t // 2),
                                                                         max(local + 2, 3 * t // 4)})]
    return [{}]                      # sinks and plug-in methods: the rule's own defaults for (t, target)


def tunable_methods() -> tuple[str, ...]:
    """Every method tune races: the frequency methods eval runs as a config edit, then the attention methods
    (registered ones, plug-ins' included)."""
    from posenc.attention import attention_method_names
    from posenc.hf.lab_bridge import config_methods

    return (*config_methods(), *attention_method_names())


def check_methods(methods) -> list[str]:
    """``methods`` (None: every one of ``tunable_methods``), each checked: ConfigError naming --methods and listing
    the methods tune races (and BASELINE) for an unknown one, or saying what to use for a registered one eval cannot
    run."""
    from posenc._internal.validate import check_choice
    from posenc.extensions import METHODS
    from posenc.hf.lab_bridge import check_config_method

    if methods is None:
        return list(tunable_methods())
    for name in methods:
        if name in METHODS:
            check_config_method(name, "methods")
        check_choice(name, "methods", (BASELINE, *tunable_methods()), error=ConfigError)
    return list(methods)


def explicit_options(options, methods: list[str]) -> dict[str, dict]:
    """--method-options ({"method.option": value}) -> {method: {option: value}}: each attention method named there
    races once, with exactly those options, instead of ``attention_settings``' derived ones. ConfigError naming
    --method-options for a key whose method is not an attention method of ``methods`` (frequency methods race at
    factor L / t as ``posenc extend`` writes them) or that the method does not take."""
    from posenc.attention import attention_method_names
    from posenc.extensions.catalogue import method_options

    if not options:
        return {}
    raced = [m for m in attention_method_names() if m in methods]
    method_options(options, raced, None, "method_options")
    return {m: method_options(options, raced, m, "method_options") for m in raced
            if any(str(k).partition(".")[0] == m for k in options)}


def candidates(config: dict, trained: int, target: int, methods=None, configured=None,
               options=None) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """-> (the candidates, [(method, why it is left out)]): BASELINE when ``methods`` names it, the frequency methods
    of ``methods`` (default: every one, ``tunable_methods``) this config takes at factor target / trained
    (``extend_for_factor`` decides, as eval's loading does), then the attention methods' settings (``options``:
    --method-options, ``explicit_options``; a value the rule refuses is a ConfigError there, where a derived
    setting the rule refuses is left out). ``configured`` (posenc.hf.tune.configured): the config's own scaling,
    raced first as configured, and every other candidate computed from the original RoPE parameters (replacing that
    scaling); a re-extension with the configured frequencies is left out as that one, and so is BASELINE."""
    from posenc.attention import attention_method_names, attention_rule
    from posenc.extensions import ExtensionSpec
    from posenc.hf.lab_bridge import config_methods
    from posenc.hf.scaling import extend_for_factor
    from posenc.hf.tune.configured import same_frequencies

    methods = check_methods(methods)
    explicit = explicit_options(options, methods)
    out, skipped = [], []
    if configured is not None:
        out.append(Candidate(configured.rope_type, "config", configured=configured.label))
        if BASELINE in methods:
            skipped.append((BASELINE, f"the unchanged model is the model as configured: raced as {out[0].name}"))
    elif BASELINE in methods:
        out.append(Candidate(BASELINE, "config"))
    for method in (m for m in config_methods() if m in methods):
        try:
            written = extend_for_factor(config, method, target / trained, replace=configured is not None).config
        except ConfigError as exc:
            skipped.append((method, str(exc)))
            continue
        if configured is not None and same_frequencies(written, config, target):
            skipped.append((method, f"at factor {target / trained:g} it is the configured scaling: raced as "
                                    f"{out[0].name}"))
            continue
        out.append(Candidate(method, "config"))
    spec = ExtensionSpec(original=trained, factor=target / trained, rotary_dim=None, target=target)
    for method in (m for m in attention_method_names() if m in methods):
        for setting in [explicit[method]] if method in explicit else attention_settings(method, trained, target):
            try:
                rule = attention_rule(method, spec, **setting)
            except ConfigError as exc:
                if method in explicit:
                    raise ConfigError(f"method_options: {method}: {exc}") from None
                skipped.append((method, str(exc)))
                continue
            out.append(Candidate(method, "attention", setting, passes=len(rule.modes())))
    return out, skipped


def parse_budget(text) -> float:
    """Seconds of a budget: ``45m``, ``2h``, ``90s`` or a plain number of seconds. ConfigError naming --budget for
    anything else, or for a budget that is not positive."""
    units = {"s": 1, "m": 60, "h": 3600}
    raw = str(text).strip().lower()
    scale = units.get(raw[-1:], None)
    try:
        seconds = float(raw[:-1] if scale else raw) * (scale or 1)
    except ValueError:
        raise ConfigError(f"budget: expected a duration like 45m, 2h, 90s or seconds, got {text!r}") from None
    if not seconds > 0 or math.isinf(seconds):
        raise ConfigError(f"budget: expected a positive duration (e.g. 45m), got {text!r}")
    return seconds


@dataclass
class Plan:
    """What tune measures and the estimated seconds of it (see the module docstring for the estimate's rule)."""

    target: int
    trained: int
    windows: int                     # windows of held-out text available at the target length
    budget_s: float
    peak_flops: float
    flops: float                     # model_flops of one window at the target length
    flops_trained: float             # ... at the trained length
    candidates: list[Candidate]
    skipped: list[tuple[str, str]]
    seconds: dict[str, float] = field(default_factory=dict)          # candidate name -> one window at target
    rounds: list[float] = field(default_factory=list)                # estimated seconds of each window round
    trained_check_s: float = 0.0
    # retrieval task -> {"samples": per survivor, "decode": answer budget in decode steps, "windows": its cost per
    # survivor in that survivor's window estimates}
    retrieval: dict[str, dict] = field(default_factory=dict)
    survivors: int = 0                                               # estimated: the race's last round
    configured: dict | None = None   # the config's own scaling (Configured.to_dict), when it has one
    # the short LongRoPE search: {"included", "reason", "evaluations", "heldout", "settings", ...}
    # (posenc.hf.tune.searched.decide); None when tune was not asked to consider it
    search: dict | None = None
    race: str = "eliminate"          # RACES: "none" measures every candidate on every window

    def measurement_s(self, c: Candidate, length_flops: float | None = None) -> float:
        """The estimate of one window of ``c`` (at the target length unless ``length_flops`` says otherwise)."""
        return c.passes * (self.flops if length_flops is None else length_flops) / (EFFICIENCY * self.peak_flops)

    @property
    def first_round_s(self) -> float:
        return self.rounds[0] if self.rounds else 0.0

    def retrieval_s(self, names=None, task: str | None = None) -> float:
        """The estimate of retrieval (``task``, or every retrieval task) on the candidates ``names`` (default: the
        ``survivors`` cheapest, as the plan's rounds assume)."""
        if names is None:
            windows = sorted(self.seconds.values())[:self.survivors]
        else:
            windows = [self.seconds[n] for n in names]
        per_window = sum(r["windows"] for t, r in self.retrieval.items() if task in (None, t))
        return per_window * sum(windows)

    @property
    def search_s(self) -> float:
        """The estimate of the LongRoPE search (0 when it is not in the plan): its fitness evaluations and held-out
        scores, each one window at the target length."""
        if not self.search or not self.search.get("included"):
            return 0.0
        return (self.search["evaluations"] + self.search["heldout"]) * self.measurement_s(Candidate("longrope",
                                                                                                   "config"))

    @property
    def total_s(self) -> float:
        return self.search_s + self.trained_check_s + sum(self.rounds) + self.retrieval_s()

    def fitting_rounds(self) -> int:
        """How many window rounds the budget holds after the search, the trained-length check and the survivors'
        retrieval."""
        left, n = self.budget_s - self.search_s - self.trained_check_s - self.retrieval_s(), 0
        for seconds in self.rounds:
            if seconds > left:
                break
            left -= seconds
            n += 1
        return n

    def to_dict(self) -> dict:
        out = asdict(self)
        out["candidates"] = [{"name": c.name, **asdict(c), "estimate_s": self.seconds[c.name]}
                             for c in self.candidates]
        out["total_s"] = self.total_s
        out["search_s"] = self.search_s
        out["retrieval_s"] = {t: self.retrieval_s(task=t) for t in self.retrieval}
        out["fitting_rounds"] = self.fitting_rounds()
        return out


def retrieval_samples(task: str, ruler_samples: int) -> tuple[int, int]:
    """(samples per survivor, decode steps per sample) of retrieval ``task`` as tune runs it: passkey with its
    default depths x trials and its key's digits; a RULER task with ``ruler_samples`` and its answer budget."""
    from posenc.lab.tasks import get_task
    from posenc.lab.tasks.passkey import KEY_DIGITS
    from posenc.lab.tasks.registry import TASK_SETTINGS

    if task == "passkey":
        return len(TASK_SETTINGS["passkey_depths"].default) * TASK_SETTINGS["passkey_trials"].default, KEY_DIGITS
    return ruler_samples, int(getattr(get_task(task), "budget", 0))


def make_plan(candidates_: list[Candidate], skipped, *, target: int, trained: int, windows: int, budget_s: float,
              peak_flops: float, flops: float, flops_trained: float, retrieval: dict | None = None,
              flops_step: float = 0.0, configured: dict | None = None, search: dict | None = None,
              race: str = "eliminate") -> Plan:
    """The plan's estimates: each candidate's window at the target, the rounds (all candidates on the first
    window, then the field halving each window), the trained-length check (every candidate and the unchanged
    model, one window at the trained length), and ``retrieval`` (task -> (samples, decode steps) per survivor;
    ``flops_step``: one decode step's FLOPs at the target) on the estimated survivors; ``search``: the LongRoPE
    search's evaluations (``Plan.search_s``); ``race`` "none": every candidate on every window (no halving)."""
    plan = Plan(target=target, trained=trained, windows=windows, budget_s=budget_s, peak_flops=peak_flops,
                flops=flops, flops_trained=flops_trained, candidates=list(candidates_), skipped=list(skipped),
                configured=configured, search=search, race=race)
    plan.seconds = {c.name: plan.measurement_s(c) for c in plan.candidates}
    by_cost = sorted(plan.seconds.values())
    for w in range(windows):
        alive = len(by_cost) if w == 0 or race == "none" else \
            max(min(2, len(by_cost)), math.ceil(len(by_cost) / 2 ** w))
        plan.rounds.append(sum(by_cost[:alive]))
        plan.survivors = alive
    plan.retrieval = {task: {"samples": n, "decode": decode, "windows": n * (1 + decode * flops_step / flops)}
                      for task, (n, decode) in (retrieval or {}).items()}
    # the model as configured is the check's reference (the unchanged model), not measured against itself
    # (and BASELINE, when it races, is that reference itself)
    plan.trained_check_s = sum(plan.measurement_s(c, flops_trained) for c in plan.candidates
                               if not c.configured and c.name != BASELINE) + \
        plan.measurement_s(Candidate(BASELINE, "config"), flops_trained)
    return plan


def alternatives(plan: Plan, flops_at) -> list[str]:
    """When the budget cannot measure one window per candidate: the largest budget-fitting alternatives, as
    sentences (the config methods first among fewer candidates: they deploy without posenc; the longest length,
    halving from the target, at which every candidate fits). ``flops_at(length)``: model_flops of one window."""
    out = []
    # a candidate's first window at the target and its trained-length check (the unchanged model's too)
    own = {c.name: plan.seconds[c.name] + plan.measurement_s(c, plan.flops_trained) * (c.name != BASELINE)
           for c in plan.candidates}
    left = plan.budget_s - plan.measurement_s(Candidate("none", "config"), plan.flops_trained) - plan.retrieval_s() \
        - plan.search_s
    ranked = sorted(plan.candidates, key=lambda c: (c.kind != "config", own[c.name]))
    kept, spent = [], 0.0
    for c in ranked:
        if spent + own[c.name] <= left:
            kept.append(c.name)
            spent += own[c.name]
    if kept:
        out.append(f"fewer candidates: {len(kept)} of {len(plan.candidates)} fit ({', '.join(kept)})")
    length = plan.target // 2
    while length > plan.trained:
        scale = flops_at(length) / plan.flops
        if sum(own.values()) * scale <= left:
            out.append(f"a shorter length: --target-length {length} measures every candidate on one window "
                       f"(about {sum(own.values()) * scale:.3g} s)")
            break
        length //= 2
    if not out:
        out.append("nothing fits: raise --budget")
    return out


def format_plan(plan: Plan, flops_at=None) -> str:
    """The plan as printed before anything runs: candidates with their estimates, the total, what the budget
    leaves out (and, when not even one window per candidate fits, the alternatives)."""
    lines = [f"plan: {len(plan.candidates)} candidates at {plan.target} tokens (trained {plan.trained}, factor "
             f"{plan.target / plan.trained:g}); {plan.windows} windows of held-out text; matmul peak "
             f"{plan.peak_flops / 1e9:.1f} GFLOP/s, one window {plan.flops / 1e9:.3g} GFLOP",
             f"estimate per window = passes x model FLOPs / ({EFFICIENCY} x matmul peak)"]
    if plan.configured:
        c = plan.configured
        lines.append(f"the config already applies {c['rope_type']}"
                     + (f" ({c['fine_tuned']})" if c["fine_tuned"] else "")
                     + f": raced {c['label']}; every other candidate starts from its original RoPE parameters at "
                     f"factor {plan.target / plan.trained:g} (as posenc extend --replace), and the trained-length "
                     "check compares with the model as configured")
    lines += [f"  {c.name:<44} {c.kind:<9} {plan.seconds[c.name]:9.3g} s" for c in plan.candidates]
    lines += [f"  left out: {m}: {why}" for m, why in plan.skipped]
    if plan.search:
        lines.append(search_line(plan))
    lines.append(f"trained-length check {plan.trained_check_s:.3g} s; rounds (window 1..{len(plan.rounds)}"
                 + ("; --race none: every candidate on every window" if plan.race == "none" else "") + "): "
                 + ", ".join(f"{s:.3g}" for s in plan.rounds) + " s")
    lines += _retrieval_lines(plan)
    lines.append(f"estimated total {plan.total_s:.3g} s; budget {plan.budget_s:.3g} s")
    n = plan.fitting_rounds()
    if n == 0:
        lines.append("the budget cannot measure one window per candidate; alternatives:")
        lines += [f"  {a}" for a in alternatives(plan, flops_at or (lambda L: plan.flops))]
    elif n < len(plan.rounds):
        lines.append(f"the budget leaves out windows {n + 1}..{len(plan.rounds)} of the race")
    else:
        lines.append("the budget holds the whole plan")
    return "\n".join(lines)


def _retrieval_lines(plan: Plan) -> list[str]:
    """The plan's retrieval part: each task's samples, decode steps and estimate on the estimated survivors."""
    if not plan.retrieval:
        return []
    lines = [f"retrieval on the race's survivors (estimated {plan.survivors}) at {plan.target} tokens: a sample is "
             f"one prefill plus up to its answer budget of decode steps; {plan.retrieval_s():.3g} s in all"]
    lines += [f"  {task:<44} {str(r['samples']) + ' samples x (prefill + ' + str(r['decode']) + ' decode steps)':<44}"
              f"{plan.retrieval_s(task=task):9.3g} s" for task, r in plan.retrieval.items()]
    return lines


def search_line(p) -> str:
    """The plan's line about the search: in or left out, why, and its evaluations."""
    s = p.search
    what = (f"{s['evaluations']} + up to {s['heldout']} held-out evaluations (population {s['settings']['population']}"
            f", {s['settings']['generations']} generations), one window of {p.target} each on the training split")
    if s["included"]:
        return f"LongRoPE search: in, {p.search_s:.3g} s, runs first: {what}; {s['reason']}"
    return f"LongRoPE search: left out: {s['reason']} ({what})"
