"""``posenc tune MODEL --target-length L --out DIR``: measure every context-extension method on the user's own
checkpoint within a budget, and write what to deploy (docs/tune.md).

Steps: the plan (posenc.hf.tune.plan: candidates, estimates, what the budget leaves out; ``--dry-run`` stops
there), the trained-length check, the race on paired windows (posenc.hf.tune.race), retrieval on the survivors
(passkey, RULER's tasks), the answer, and the files (posenc.hf.tune.report). Every measurement runs through ``posenc eval``'s loop
(posenc.hf.tune.measure) and is saved in results.json as it lands, so ``--resume`` measures nothing twice. The
plots (posenc.hf.tune.plots) are drawn after every completed stage.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from posenc._internal.errors import ConfigError, DataError
from posenc._internal.flags import add_shared, integer
from posenc.hf.tune import measure, plan as planning, plots as plotting, race as racing, ranks, searched
from posenc.hf.tune.report import (OUTPUT_FILES, check_out_folder, report_markdown, retrieval_note, write_deploy,
                                   write_gguf_deploy)

HELP = "Measure every context-extension method on your own model within a budget and write what to deploy."
# what --tasks takes besides the registered RULER-style tasks (those scored by string_match_all) and their groups
TASKS = ("lm", "passkey")
# RULER samples per task and survivor when --ruler-samples is not given: a CPU-sized check, not RULER's 500
RULER_SAMPLES = 5
RULES = {"race": f"after each window, a candidate stays while its mean paired log-perplexity difference to the best "
                 f"is at most {racing.Z:g} standard errors of the paired differences (sd / sqrt(windows)); after "
                 "one window, the better half stays (at least two)",
         "trained": f"a candidate whose log-perplexity at the trained length exceeds the unchanged model's on the "
                    f"same window by more than {racing.TRAINED_MARGIN} nats (about 2% perplexity) is flagged; "
                    "attention rules that leave the trained length's positions unchanged are not measured there"}
RACE_NONE = "--race none: every candidate on every window the budget holds; nobody is eliminated"


def add_arguments(parser) -> None:
    parser.add_argument("model", help="a local transformers causal LM folder or a .gguf file")
    add_shared(parser, "target_length", required=True)
    parser.add_argument("--budget", default="45m", help="time to spend: 45m, 2h, 90s or seconds (default 45m)")
    add_shared(parser, "data", default=None)
    add_shared(parser, "methods", default=None, help="the methods to race, comma-separated (default: every "
               "registered frequency method eval runs as a config edit and every attention method); none races the "
               "unchanged model as a baseline")
    add_shared(parser, "method_options", default=None, help="attention methods' options, method.option=value,...: "
               "a method named here races once with exactly these options instead of tune's derived settings")
    parser.add_argument("--race", default="eliminate", choices=planning.RACES, help="eliminate (default: after each "
                        "window only the candidates within the noise of the best go on) or none (every candidate "
                        "on every window: a fixed grid)")
    parser.add_argument("--windows", type=integer, default=planning.MAX_WINDOWS, help="windows of held-out text at "
                        f"most, each L tokens (default {planning.MAX_WINDOWS}; the text may hold fewer)")
    parser.add_argument("--tasks", default="lm", help="lm (the race, always), and retrieval on the race's survivors: "
                        "passkey, ruler (RULER's eleven synthetic tasks) or RULER task names (niah_single_1, vt, ...)")
    parser.add_argument("--ruler-samples", type=int, default=RULER_SAMPLES, help="RULER samples per task and "
                        f"survivor (default {RULER_SAMPLES}: a small CPU-sized check; its Wilson interval is wide)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its estimate; measure nothing")
    add_shared(parser, "out", default=None, help="folder for the deploy file, results.json and report.md")
    add_shared(parser, "resume", help="continue an interrupted tune in --out: its measurements are kept")
    add_shared(parser, "overwrite", help="replace what an earlier tune wrote into --out")
    add_shared(parser, "threads", default=None)
    add_shared(parser, "dtype", default="float32")
    add_shared(parser, "device", default="cpu")
    add_shared(parser, "no_progress")
    add_shared(parser, "no_band_attention")
    searched.add_arguments(parser)
    from posenc.lab.launch import add_arguments as add_launch_arguments

    add_launch_arguments(parser, "measure with N processes on this machine, one device each (cuda:LOCAL_RANK "
                                 "with NCCL, or CPU shares with gloo), one report; re-launches through torchrun")


def retrieval_tasks() -> list[str]:
    """The registered tasks tune measures on the survivors besides passkey: RULER's and RULER-style plug-ins'
    (scored by string_match_all, sampled by --ruler-samples)."""
    from posenc.lab.tasks import TASKS as REGISTERED

    return [name for name, task in REGISTERED.items() if "string_match_all" in task.metrics]


def _tasks(text: str) -> list[str]:
    """--tasks as run: lm first (the race), then the retrieval tasks in the order given, groups (ruler) expanded;
    ConfigError naming --tasks for a name that is not a task, or a task that is not retrieval."""
    from posenc.lab.tasks import TASK_GROUPS, TASKS as REGISTERED, expand_tasks

    accepted = [*TASKS, *(g for g, members in TASK_GROUPS.items() if set(members) <= set(retrieval_tasks())),
                *retrieval_tasks()]
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    for t in names:
        if t in accepted:
            continue
        if t in REGISTERED:
            raise ConfigError(f"tasks: {t} is not a retrieval task (tune races on perplexity and measures retrieval "
                              f"on the survivors); expected one of {', '.join(accepted)}")
        raise ConfigError(f"tasks: expected one of {', '.join(accepted)}, got {t!r}")
    return ["lm"] + [t for t in expand_tasks(names) if t != "lm"]


def _checked(args):
    """The checks before anything is measured -> (config, trained length, budget seconds, tasks)."""
    from posenc.hf.eval.settings import check_threads
    from posenc.hf.loading import check_model_folder
    from posenc.rope.contexts import trained_length

    threads = check_threads(args.threads)
    budget = planning.parse_budget(args.budget)
    planning.check_methods(args.methods)
    tasks = _tasks(args.tasks)
    from posenc._internal.validate import check_int

    check_int(args.ruler_samples, "ruler_samples", min=1, max=100_000, error=ConfigError)
    check_int(args.windows, "windows", min=1, max=10_000, error=ConfigError)
    if not args.dry_run and not args.out:
        raise ConfigError("out: tune writes its deploy file and report into a folder: pass --out DIR (or --dry-run)")
    if args.out:
        from posenc._internal.outputs import check_output

        check_output(args.out, f"out {args.out} (--out)", inputs=[("model", args.model), ("--data", args.data)])
        if not args.resume and not args.dry_run:
            check_out_folder(args.out, args.overwrite)
    config = check_model_folder(args.model)
    trained = trained_length(config)
    if not trained:
        raise ConfigError(f"model {args.model}: its config states no trained context (max_position_embeddings)")
    if not isinstance(args.target_length, int) or args.target_length <= trained:
        raise ConfigError(f"target_length: expected more than the model's trained length {trained}, got "
                          f"{args.target_length}")
    if threads:
        torch.set_num_threads(threads)
    if not args.dry_run:
        ranks.check(args)
    return config, trained, budget, tasks


def _windows(model: str, data, length: int, most: int = planning.MAX_WINDOWS) -> int:
    """Windows of ``length`` tokens the held-out text holds (at most ``most``: --windows); DataError when none."""
    from posenc.hf.eval.adapter import token_stream
    from posenc.hf.lab_bridge import scored_text
    from posenc.hf.loading import load_tokenizer

    text, meta, _ = scored_text(data, "validation")
    stream, _ = token_stream(load_tokenizer(model), text, most * length + 1)
    n = min(most, (len(stream) - 1) // length)
    if n < 1:
        raise DataError(f"data: the held-out text ({meta.get('source')}) has {len(stream)} tokens, fewer than one "
                        f"window of --target-length {length} (+1): give a longer text")
    return n


def _flops_at(config):
    """model_flops(length) of one window, counted on a weightless copy of the model (meta device)."""
    from transformers import AutoModelForCausalLM

    from posenc.hf.remote_code import NO_REMOTE_CODE
    from posenc.hf.throughput import model_flops

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, **NO_REMOTE_CODE)
    return lambda length: model_flops(skeleton, length)


def make_plan(args, config, trained: int, budget: float, tasks=("lm",)) -> tuple[planning.Plan, str]:
    """The plan and its printed form (``tasks``: lm, then the retrieval tasks on the survivors)."""
    from posenc.hf.loading import DTYPES
    from posenc.hf.throughput import matmul_peak

    from posenc.hf.tune.configured import configured

    own = configured(config.to_dict(), args.model)     # the config's own scaling: raced as configured
    cands, skipped = planning.candidates(config.to_dict(), trained, args.target_length, args.methods, own,
                                         args.method_options)
    flops_at = _flops_at(config)
    peak = matmul_peak(DTYPES[args.dtype], n=1024, repeats=3, device=args.device)
    windows = _windows(args.model, args.data, args.target_length, args.windows)

    def build(with_cands, search):
        return planning.make_plan(with_cands, skipped, target=args.target_length, trained=trained, windows=windows,
                                  budget_s=budget, peak_flops=peak, flops=flops_at(args.target_length),
                                  flops_trained=flops_at(trained),
                                  retrieval={t: planning.retrieval_samples(t, args.ruler_samples) for t in tasks[1:]},
                                  flops_step=flops_at(args.target_length + 1) - flops_at(args.target_length),
                                  configured=own.to_dict() if own else None, search=search, race=args.race)

    # the short LongRoPE search joins when the budget holds it (posenc.hf.tune.searched's rule)
    plan = searched.plan(args, trained, cands, build, replace=own is not None)
    return plan, planning.format_plan(plan, flops_at)


def run(args) -> int:
    config, trained, budget, tasks = _checked(args)
    if not args.dry_run:
        status = ranks.relaunch(args)          # --nproc N: this command again under torchrun, N ranks
        if status is not None:
            return status
        if ranks.distributed():              # a rank: rank 0 tunes, the others measure its rounds with it
            return ranks.run_ranks(args, trained, _key(args),
                                   lambda pool: _tune(args, config, trained, budget, tasks, pool))
    return _tune(args, config, trained, budget, tasks)


def _tune(args, config, trained: int, budget: float, tasks: list[str], pool: ranks.Pool | None = None) -> int:
    """The plan, then (unless --dry-run) the tune and its files; ``pool``: the ranks that measure with this one."""
    plan, text = make_plan(args, config, trained, budget, tasks)
    print(text)
    if pool is not None:
        print(pool.describe(len(plan.candidates)))
    if args.dry_run:
        return 0
    if plan.fitting_rounds() == 0:
        raise ConfigError(f"budget: {args.budget} cannot measure one window per candidate (the first window alone "
                          f"is estimated at {plan.first_round_s:.3g} s); see the alternatives above")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = Tune(args, plan, text, trained, tasks, pool).run()
    from posenc.tools.evidence import identity

    doc["identity"] = identity(config.to_dict())      # what posenc pick --evidence checks the model by
    doc["deploy_files"] = write_deploy(out, doc["answer_row"], config, args.target_length, trained,
                                       replace=plan.configured is not None)
    doc["gguf"] = write_gguf_deploy(out, args.model, doc["answer_row"], args.target_length)
    from posenc._internal.atomic import atomic_write_json, atomic_write_text

    atomic_write_json(out / "results.json", doc)
    atomic_write_text(out / "report.md", report_markdown(doc))
    ranks.remove_rank_files(out)                 # what the ranks kept is in results.json now
    print(f"winner: {doc['answer']['winner']} ({doc['answer']['reason']})")
    if doc["answer"].get("retrieval"):
        print(doc["answer"]["retrieval"])
    if doc["gguf"] and "text" in doc["gguf"]:
        print(doc["gguf"]["text"])
    elif doc["gguf"]:
        print(f"no GGUF written: {doc['gguf']['refused']}")
    print(f"wrote {doc['deploy']}{', ' + doc['gguf']['file'] if doc['gguf'] and 'file' in doc['gguf'] else ''}, "
          f"results.json, report.md{''.join(', ' + name for name in doc['plots'])} into {out}")
    return 0


def _resumed(args) -> dict:
    """The measurements of the interrupted tune in --out (none without --resume); ConfigError when it measured
    another model, length, text or dtype."""
    path = Path(args.out) / "results.json"
    if not args.resume:
        return {}

    def check_key(key, where):
        if key != _key(args):
            raise ConfigError(f"resume: {where} measured {key}, not {_key(args)}: use another --out")

    found = ranks.kept(args.out, check_key)      # what the ranks of an interrupted --nproc tune kept
    if not path.exists():
        return found
    from posenc._internal.json_io import loads

    doc = loads(path.read_text(encoding="utf-8"), f"out {args.out}: results.json")
    check_key(doc.get("key"), path)
    return {**found, **(doc.get("measurements") or {})}


def window_key(c: planning.Candidate, length: int, window: int) -> str:
    """A window measurement's key in the store and results.json: ``yarn@64#0``."""
    return f"{c.name}@{length}#{window}"


def _key(args) -> dict:
    """What a resumed tune must share with the interrupted one."""
    return {"model": str(args.model), "target": args.target_length, "data": args.data, "dtype": args.dtype,
            "methods": args.methods}


class Tune:
    """One tune run after its plan: the trained-length check, the race, passkey, the answer (the document that
    results.json holds)."""

    def __init__(self, args, plan: planning.Plan, plan_text: str, trained: int, tasks: list[str],
                 pool: ranks.Pool | None = None):
        self.args, self.plan, self.plan_text, self.trained, self.tasks = args, plan, plan_text, trained, tasks
        self.pool = pool                 # --nproc: the ranks that measure each batch with this one; None: alone
        self.by_name = {c.name: c for c in plan.candidates}
        self.store = measure.Measurements(_resumed(args), on_new=self.save)
        self.started = time.perf_counter()
        self.doc: dict = {}
        self.bar = None
        self.partial: dict = {}         # what the completed stages found: the plots drawn after each stage
        self.plots: dict = {"files": [], "not_drawn": []}
        if not args.resume:             # an earlier tune's plots (--overwrite) are not this tune's
            for name in plotting.PLOTS:
                (Path(args.out) / name).unlink(missing_ok=True)

    def settings(self, c, length: int, window: int, tasks=("lm",)):
        return measure.eval_settings(c, length=length, trained=self.trained, target=self.args.target_length,
                                     window=window, data=self.args.data, dtype=self.args.dtype,
                                     device=self.args.device, tasks=tasks,
                                     replace=self.plan.configured is not None, band=not self.args.no_band_attention)

    def loss(self, c, length: int, window: int) -> float:
        """Candidate ``c``'s log-perplexity on ``window`` at ``length`` (measured once; kept for --resume)."""
        estimate = self.plan.measurement_s(c, self.plan.flops if length == self.plan.target else
                                           self.plan.flops_trained)
        value = self.store.get(window_key(c, length, window),
                               lambda: measure.window_loss(self.args.model, self.settings(c, length, window)))
        self.advance(estimate)
        return value

    def spread(self, jobs: list[ranks.Job]) -> None:
        """--nproc: measure ``jobs`` on every rank at once, before the tune reads them from the store; one process
        measures each where it is read (nothing here)."""
        if self.pool is not None:
            self.pool.run(jobs, self.store)

    def lm_jobs(self, cands, length: int, window: int) -> list[ranks.Job]:
        """The window measurements of ``cands`` as jobs for the ranks, each with its estimate."""
        flops = self.plan.flops if length == self.plan.target else self.plan.flops_trained
        return [ranks.Job((window_key(c, length, window),), c, length, window, cost=self.plan.measurement_s(c, flops))
                for c in cands]

    def save(self) -> None:
        """results.json with what is measured so far (atomically), so an interrupted tune can --resume."""
        from posenc._internal.atomic import atomic_write_json

        atomic_write_json(Path(self.args.out) / "results.json",
                          {"key": _key(self.args), "incomplete": True, "measurements": self.store.done,
                           "plots": self.plots["files"]})

    def stage(self, **found) -> None:
        """After a completed stage: keep what it ``found`` (results.json's keys) and draw the plots from everything
        found so far, so that an interrupted tune still has them."""
        self.partial.update(found)
        self.draw({"model": str(self.args.model), "target": self.plan.target, "trained": self.trained,
                   "plan": self.plan.to_dict(), "measurements": self.store.done, "tasks": self.tasks,
                   **self.partial})

    def draw(self, doc: dict) -> None:
        """The plots of ``doc`` (complete or partial) into --out; what was drawn is kept for results.json."""
        self.plots = plotting.write_plots(doc, Path(self.args.out), retrieval=len(self.tasks) > 1)

    def trained_check(self) -> dict[str, float]:
        """Each candidate's paired log-perplexity difference to the unchanged model on the first window at the
        trained length (rules that keep those positions are skipped)."""
        from posenc.attention import attention_rule
        from posenc.extensions import ExtensionSpec

        spec = ExtensionSpec(original=self.trained, factor=self.plan.target / self.trained, rotary_dim=None,
                             target=self.plan.target)
        unchanged = planning.Candidate("none", "config")
        # as configured, and the baseline: the reference itself
        measured = [c for c in self.plan.candidates if not c.configured and c.name != planning.BASELINE and not (
            c.kind == "attention" and attention_rule(c.method, spec, **c.options).identity_for(self.trained))]
        self.spread(self.lm_jobs([unchanged, *measured], self.trained, 0))
        base = self.loss(unchanged, self.trained, 0)
        return {c.name: self.loss(c, self.trained, 0) - base for c in measured}

    def can_afford(self, alive: list[str]) -> bool:
        """Whether another window for ``alive``, and their retrieval after it, fit what is left, the estimates
        scaled by the measured / estimated ratio so far."""
        spent = time.perf_counter() - self.started
        done = self.bar.n if self.bar is not None and self.bar.n else None
        ratio = spent / done if done else 1.0
        ahead = sum(self.plan.seconds[n] for n in alive) + self.plan.retrieval_s(alive)
        return spent + ratio * ahead <= self.plan.budget_s

    def advance(self, estimate: float) -> None:
        """The progress bar past a measurement of ``estimate`` seconds (done now or kept from before)."""
        if self.bar is not None:
            # the plan's later rounds assume the field halves: a race that keeps more grows the bar's total
            self.bar.total = max(self.bar.total, self.bar.n + estimate)
            self.bar.update(estimate)

    def run(self) -> dict:
        from tqdm import tqdm

        self.bar = tqdm(total=round(self.plan.total_s, 3), unit="s", desc="tune (estimated seconds)",
                        disable=self.args.no_progress, bar_format="{l_bar}{bar}| {n:.3g}/{total:.3g} est s "
                        "[{elapsed}<{remaining}]")
        try:
            if self.pool is not None:
                self.pool.start(self.store, self.save)
            # the search first: its config is the searched candidate every later stage measures
            self.partial["search"] = searched.run_search(self)
            trained = self.trained_check()
            self.stage(trained_check=trained)
            round_jobs = None if self.pool is None else lambda alive, w: self.spread(
                self.lm_jobs([self.by_name[n] for n in alive], self.plan.target, w))
            result = racing.race([c.name for c in self.plan.candidates], self.plan.windows,
                                 lambda name, w: self.loss(self.by_name[name], self.plan.target, w),
                                 can_afford=self.can_afford, log=self.bar.write, before_round=round_jobs,
                                 eliminate=self.plan.race != "none",
                                 on_round=lambda losses, alive: self.stage(race={"losses": losses, "alive": alive}))
            passkey = self.passkey(result["alive"]) if "passkey" in self.tasks else {}
            ruler = self.ruler(result["alive"], [t for t in self.tasks if t not in TASKS])
        finally:
            self.bar.close()
        return self.document(result, trained, passkey, ruler)

    def passkey(self, names: list[str]) -> dict:
        """Mean passkey accuracy at the target length of each survivor (measured once; kept for --resume)."""
        out, target = {}, self.plan.target
        self.spread([ranks.Job((f"{name}@{target}#passkey",), self.by_name[name], target, tasks=("passkey",),
                               cost=self.plan.retrieval_s([name], "passkey")) for name in names])
        for name in names:
            out[name] = self.store.get(f"{name}@{self.plan.target}#passkey", lambda c=self.by_name[name]:
                                       measure.passkey_rate(self.args.model,
                                                            self.settings(c, self.plan.target, 0, ("passkey",))))
            self.advance(self.plan.retrieval_s([name], "passkey"))
            self.stage(passkey=dict(out))
        return out

    def ruler(self, names: list[str], tasks: list[str]) -> dict:
        """Each survivor's RULER scores at the target length: {name: {task: {value, n, ci_low, ci_high}}}, the
        tasks a survivor lacks measured in one eval call (the model loaded once), each kept for --resume under
        ``name@target#task/samples`` (another --ruler-samples is another measurement)."""
        n, out = self.args.ruler_samples, {}
        self.spread(self.ruler_jobs(names, tasks))
        for name in names if tasks else []:
            keys = {t: f"{name}@{self.plan.target}#{t}/{n}" for t in tasks}
            missing = [t for t in tasks if keys[t] not in self.store.done]
            if missing:
                settings = self.settings(self.by_name[name], self.plan.target, 0, missing)
                settings.options["ruler_samples"] = n
                self.store.put({keys[t]: score for t, score in
                                measure.ruler_scores(self.args.model, settings).items()})
            out[name] = {t: self.store.done[keys[t]] for t in tasks}
            self.advance(sum(self.plan.retrieval_s([name], t) for t in tasks))
            self.stage(ruler=dict(out))
        return out

    def ruler_jobs(self, names: list[str], tasks: list[str]) -> list[ranks.Job]:
        """Each survivor's RULER tasks it lacks, one job (one eval call) per survivor, for the ranks."""
        n, jobs = self.args.ruler_samples, []
        for name in names if tasks else []:
            missing = [t for t in tasks if f"{name}@{self.plan.target}#{t}/{n}" not in self.store.done]
            if missing:
                jobs.append(ranks.Job(tuple(f"{name}@{self.plan.target}#{t}/{n}" for t in missing), self.by_name[name],
                                      self.plan.target, tasks=tuple(missing),
                                      cost=sum(self.plan.retrieval_s([name], t) for t in missing)))
        return jobs

    def document(self, result: dict, trained: dict, passkey: dict, ruler: dict) -> dict:
        kinds = {c.name: c.kind for c in self.plan.candidates}
        ans = racing.answer(result["losses"], kinds)
        note = retrieval_note(ans["winner"], passkey, ruler)
        if note:
            ans["retrieval"] = note
        winner = self.by_name[ans["winner"]]
        doc = {"key": _key(self.args), "model": str(self.args.model), "target": self.plan.target,
               "trained": self.trained, "budget_s": self.plan.budget_s, "plan": self.plan.to_dict(),
               "plan_text": self.plan_text, "rules": {**RULES, "race": RACE_NONE if self.plan.race == "none" else
                                                      RULES["race"]}, "margin": racing.TRAINED_MARGIN,
               "measurements": self.store.done, "race": result, "trained_check": trained,
               "flagged": racing.flagged(trained), "passkey": passkey, "ruler": ruler,
               "ruler_samples": self.args.ruler_samples, "tasks": self.tasks, "answer": ans,
               "answer_row": {"method": winner.method, "kind": winner.kind, "options": winner.options,
                              "configured": winner.configured, "searched": winner.searched},
               "configured": self.plan.configured, "search": self.partial.get("search"),
               "winner_kind": winner.kind, "deploy": "config.json" if winner.kind == "config" else "patch_spec.json",
               "spent_s": round(time.perf_counter() - self.started, 1)}
        self.draw(doc)
        doc["plots"], doc["plots_not_drawn"] = self.plots["files"], self.plots["not_drawn"]
        return doc


def tune_main(argv: list[str] | None = None) -> int:
    """``posenc tune`` as a function (exit status; errors as one line on stderr)."""
    from posenc.hf.command import run_command

    return run_command("tune", add_arguments, run, argv)


__all__ = ["HELP", "OUTPUT_FILES", "add_arguments", "run", "tune_main"]
