"""``posenc tune``'s short LongRoPE search: ``posenc search`` (posenc.hf.search.search_model) run with a small
population inside the tune, its searched factors then raced as one more frequency candidate, ``longrope
(searched)``.

The rule (``--search auto``, the default). The plan estimates the search as ``posenc search`` counts it
(``LongRopeSettings.evaluations``): the initial population plus (population - parents) children per generation,
each one window of the target length on the training split, plus the held-out re-score of the best and of the
seeds, each one more window. Each window costs what a config edit's window costs. The searched candidate is in the
plan when the budget holds the search, the trained-length check, the survivors' retrieval and one window per
candidate of the race with the searched one among them (``Plan.fitting_rounds() >= 1``). Otherwise it is left out,
and the plan says why. It is also left out when ``--methods`` names methods without longrope, when the model's
config cannot take longrope (``posenc search``'s own refusal), or when the training split is too short for the
search's two windows. ``--search longrope`` puts it in whatever the budget says (a budget that cannot then
measure one window per candidate is refused, as any), and ``--search none`` leaves it out. A ``--resume`` whose
``--out`` holds the search's checkpoint keeps it in.

Why the splits cannot meet: the search scores the lab corpus's training split of ``--data`` (``training_bytes``),
while the race scores its validation split (``scored_text(data, "validation")``, the windows every candidate
shares). A file's split is its first 90% of bytes against its last 10%; a folder's is by a hash of each file's path.

The files, inside ``--out``: ``longrope-search.json`` (the search's checkpoint: ``--resume`` continues it and
redoes no finished evaluation) and ``longrope-searched.json`` (the config ``posenc search`` writes, rope_parameters
with the searched long_factor and short_factor). A winning ``longrope (searched)`` deploys that config as
``config.json``.
"""

from __future__ import annotations

from pathlib import Path

from posenc._internal.errors import ConfigError, PosencError
from posenc.hf.tune.plan import Candidate

MODES = ("auto", "longrope", "none")
# a short search: ~8 + 4 x 4 = 24 candidate windows and up to 2 + 3 seeds re-scored held out, about twice the
# first window round of a ten-candidate race (the paper's 64 x 40 is far beyond a tune's budget)
POPULATION, GENERATIONS, HELDOUT_TOP = 8, 4, 2
CHECKPOINT = "longrope-search.json"
CONFIG = "longrope-searched.json"
# windows of the target length in the search's fitness and in its held-out choice (the training split)
SEARCH_WINDOWS, HELDOUT_WINDOWS = 1, 1


def add_arguments(parser) -> None:
    """tune's search flags: --search, and posenc search's own --population and --generations."""
    from posenc._internal.flags import add_shared

    parser.add_argument("--search", default="auto", choices=MODES,
                        help="a short LongRoPE search among the candidates: auto (default: when the budget holds it "
                             "beside one window per candidate), longrope (always) or none")
    add_shared(parser, "population", default=POPULATION,
               help=f"the search's candidates per generation (default {POPULATION}; half are kept as parents)")
    add_shared(parser, "generations", default=GENERATIONS, help=f"the search's generations (default {GENERATIONS})")


def settings(population, generations):
    """The search's LongRopeSettings: ``population`` and ``generations`` checked (ConfigError naming the flag),
    parents half the population as ``posenc search`` defaults it, the best HELDOUT_TOP re-scored held out."""
    from posenc._internal.validate import check_int
    from posenc.search.longrope import LongRopeSettings

    # at least the three seeds (linear, ntk, yarn) and one child: the search refuses a smaller population
    check_int(population, "population", min=4, error=ConfigError)
    check_int(generations, "generations", min=0, error=ConfigError)
    return LongRopeSettings(population=population, parents=max(1, population // 2), generations=generations,
                            heldout_top=HELDOUT_TOP)


def candidate(out) -> Candidate:
    """The searched candidate: a config edit whose config is the search's file in ``out``."""
    return Candidate("longrope", "config", searched=str(Path(out or ".") / CONFIG))


def _why_not(args, trained: int, replace: bool) -> str | None:
    """Why the search cannot run on this model and text (None when it can): the search's own refusal of the
    config, or a training split shorter than its windows."""
    from posenc.hf.eval.adapter import token_stream
    from posenc.hf.lab_bridge import training_bytes
    from posenc.hf.loading import load_tokenizer
    from posenc.hf.search import read_search_config
    from posenc.hf.scaling import extend_for_factor

    try:      # posenc search's own check of the config, so the plan refuses exactly what the search would
        _, data, _, _ = read_search_config(Path(args.model), replace)
        extend_for_factor(data, "longrope", args.target_length / trained, replace=replace)
    except PosencError as exc:
        return str(exc)
    need = (SEARCH_WINDOWS + HELDOUT_WINDOWS) * args.target_length + 2
    raw, _ = training_bytes(args.data)
    stream, _ = token_stream(load_tokenizer(args.model), raw, need)
    if len(stream) < need:
        return (f"the training split of the text holds {len(stream)} tokens; the search needs {need} (two windows "
                f"of {args.target_length})")
    return None


def plan(args, trained: int, cands: list[Candidate], build, replace: bool):
    """The plan with or without the searched candidate, by the module docstring's rule. ``build(candidates,
    search)`` makes a Plan (posenc.hf.tune.plan.make_plan) with ``search`` recorded in it."""
    st = settings(args.population, args.generations)
    n, held = st.evaluations()
    entry = {"mode": args.search, "included": False, "evaluations": n, "heldout": held, "split": "training",
             "windows": SEARCH_WINDOWS, "heldout_windows": HELDOUT_WINDOWS,
             "settings": {"population": st.population, "parents": st.parents, "generations": st.generations,
                          "heldout_top": st.heldout_top}}
    if args.search == "none":
        return build(cands, {**entry, "reason": "--search none"})
    if args.search == "auto" and args.methods and "longrope" not in args.methods:
        return build(cands, {**entry, "reason": "--methods does not name longrope"})
    why = _why_not(args, trained, replace)
    if why and args.search == "longrope":
        raise ConfigError(f"search: LongRoPE's search cannot run here: {why}")
    if why:
        return build(cands, {**entry, "reason": why})
    at = next((i for i, c in enumerate(cands) if c.kind != "config"), len(cands))   # among the config methods
    with_search = build([*cands[:at], candidate(args.out), *cands[at:]], {**entry, "included": True})
    first = with_search.search_s + with_search.trained_check_s + with_search.first_round_s + \
        with_search.retrieval_s()
    sums = (f"search {with_search.search_s:.3g} s + trained-length check + one window per candidate "
            f"+ retrieval = {first:.3g} s, budget {with_search.budget_s:.3g} s")
    resumed = args.resume and args.out and (Path(args.out) / CHECKPOINT).exists()
    if args.search == "longrope" or resumed or with_search.fitting_rounds() >= 1:
        with_search.search["reason"] = ("--search longrope" if args.search == "longrope" else
                                        "its search in --out is resumed" if resumed else "the budget holds it") \
            + f" ({sums})"
        return with_search
    return build(cands, {**entry, "reason": f"the budget does not hold it beside one window per candidate ({sums})"})


def run_search(tune) -> dict | None:
    """Run the plan's search (None when it has none) -> what results.json keeps of it. ``tune``: the Tune, whose
    bar advances by one window's estimate per evaluation and, after the search, by what a resumed checkpoint had
    already done."""
    from posenc.hf.search import search_model

    c = next((c for c in tune.plan.candidates if c.searched), None)
    if c is None:
        return None
    args, out = tune.args, Path(tune.args.out)
    window = tune.plan.measurement_s(Candidate("longrope", "config"))
    start = tune.bar.n if tune.bar is not None else 0.0
    res = search_model(args.model, args.target_length, settings=settings(args.population, args.generations),
                       data=args.data, windows=SEARCH_WINDOWS, heldout_windows=HELDOUT_WINDOWS, device=args.device,
                       dtype=args.dtype, out_config=out / CONFIG, checkpoint=out / CHECKPOINT, resume=args.resume,
                       overwrite=True, replace=tune.plan.configured is not None, progress=False,
                       on_evaluation=lambda what: tune.advance(window))
    if tune.bar is not None:     # evaluations a resumed checkpoint held are not reported again
        tune.advance(max(0.0, tune.plan.search_s - (tune.bar.n - start)))
    r = res.result
    return {"candidate": c.name, "config": CONFIG, "checkpoint": CHECKPOINT, "evaluations": r.evaluations,
            "heldout_evaluations": r.heldout_evaluations, "fitness": r.fitness, "heldout": r.heldout,
            "long_factor": list(r.factors), "wall_s": round(r.wall_s, 1), "tokens": res.tokens["search"],
            "split": "training"}


def deploy_config(winner: dict) -> dict:
    """A searched winner's config.json: the config the search wrote (``winner["searched"]``), unchanged."""
    from posenc._internal.json_io import loads

    path = Path(winner["searched"])
    return loads(path.read_text(encoding="utf-8"), f"the searched config {path}")


def report_lines(doc: dict) -> list[str]:
    """report.md's search section (none when the plan had no search)."""
    s, plan = doc.get("search"), doc["plan"].get("search")
    if not plan:
        return []
    lines = ["", "## LongRoPE search", ""]
    if not s:
        return lines + [f"Left out: {plan['reason']}."]
    return lines + [f"{s['evaluations']} candidates and {s['heldout_evaluations']} held-out scores on the training "
                    f"split ({plan['settings']['population']} per generation, {plan['settings']['generations']} "
                    f"generations), {s['wall_s']} s: search perplexity {s['fitness']:.4f}, held-out "
                    f"{s['heldout'] if s['heldout'] is None else format(s['heldout'], '.4f')}. Its config "
                    f"({s['config']}) raced as {s['candidate']} on the validation windows; the search state is "
                    f"{s['checkpoint']}.", "", "long_factor: [" + ", ".join(f"{x:g}" for x in s["long_factor"]) + "]"]
