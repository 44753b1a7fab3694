"""Lab throughput: tokens/s and achieved GFLOP/s of each preset's training step and evaluation, against this
machine's measured matmul peak, under each precision / optimizer / thread option, side by side in one process.

    python benchmarks/lab_throughput.py --threads 1                    # default + copy presets, every option
    python benchmarks/lab_throughput.py --threads 1,2 --presets default
    python benchmarks/lab_throughput.py --threads 1 --profile          # + where a step's time goes
    python benchmarks/lab_throughput.py --quick                        # smoke: the smoke preset, short timing

Peak: the best GFLOP/s of one square matmul (n = 512, 1024, 2048; torch.mm) per dtype and thread count.
FLOPs: ``ModelConfig.flops_per_token`` (posenc/nn/model.py): the matmuls of the linear layers, the tied output
head and causal attention (each query against the keys up to it); a training step is 3x the forward.
Options (each a row, timed on the preset's own model (scheme rope, or --scheme) and batches from its own task's
sampler):
  fp32             float32, AdamW as the lab makes it (torch's default: a per-tensor loop on the CPU)
  fp32-foreach     float32, AdamW(foreach=True)
  fp32-fused       float32, AdamW(fused=True)
  bf16             bf16 autocast, attention in float32 on the CPU (the lab's --precision bf16)
  bf16-attn-bf16   bf16 autocast with the attention in bf16 too (plain autocast)
A step is the lab's own ``posenc.lab.train.train_step``; time = median over the timed steps after warm-up, wall
clock and this process's CPU time (at one thread on a shared machine CPU time is the steadier figure; the load
average is recorded). The profile splits a step by op category from torch.profiler's self times; whatever the
ops do not account for is Python and dispatch. Evaluation: one batch of ``lm_eval`` windows at the preset's
longest eval length (forward only, FLOPs = 1x forward). Results: benchmarks/results/lab-throughput-<device>.json
(atomic write).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS_DIR, environment, print_table, save_json  # noqa: E402

import posenc.nn.attention as attention  # noqa: E402
from posenc.lab.context import Run  # noqa: E402
from posenc.lab.precision import autocast, native_bf16  # noqa: E402
from posenc.lab.presets import get_preset  # noqa: E402
from posenc.lab.run import training  # noqa: E402
from posenc.lab.tasks import get_task  # noqa: E402
from posenc.lab.train import make_optimizer, train_step  # noqa: E402
from posenc.nn.model import TinyLM  # noqa: E402

OPTIONS = {  # name -> (precision, AdamW options, attention in fp32 on the CPU under bf16)
    "fp32": ("fp32", {}, True),
    "fp32-foreach": ("fp32", {"foreach": True}, True),
    "fp32-fused": ("fp32", {"fused": True}, True),
    "bf16": ("bf16", {}, True),
    "bf16-attn-bf16": ("bf16", {}, False),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SCHEME = ["rope"]  # the scheme of the timed models (--scheme)
CATEGORIES = (  # (category, substrings of profiler op names), first match wins
    ("attention", ("scaled_dot_product", "flash_attention")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
    ("layernorm/GELU", ("layer_norm", "gelu")),
    ("loss", ("log_softmax", "nll_loss")),
    ("optimizer", ("_foreach", "fused_adam", "Optimizer.", "clip_grad", "aten::sqrt", "aten::lerp")),
    ("rope", ("Rope",)),
    ("casts/copies", ("aten::copy_", "aten::_to_copy", "aten::clone")),
)


def loadavg() -> list | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def matmul_peak(dtype: torch.dtype, sizes=(512, 1024, 2048), min_time: float = 0.3) -> dict:
    """Best GFLOP/s of torch.mm on n x n matrices over ``sizes`` (2 n^3 FLOPs per call) at the current threads."""
    best = {"gflops": 0.0, "n": None}
    for n in sizes:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        torch.mm(a, b)
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < min_time or calls < 3:
            torch.mm(a, b)
            calls += 1
        gflops = 2 * n ** 3 * calls / (time.perf_counter() - t0) / 1e9
        if gflops > best["gflops"]:
            best = {"gflops": round(gflops, 1), "n": n}
    return best


@contextlib.contextmanager
def attention_fp32(enabled: bool):
    """Temporarily set whether the model runs attention in fp32 on the CPU under bf16 autocast."""
    old = attention.CPU_FP32_ATTENTION
    attention.CPU_FP32_ATTENTION = enabled
    try:
        yield
    finally:
        attention.CPU_FP32_ATTENTION = old


def preset_setup(name: str, quick: bool):
    """-> (LabConfig, Run, task name) for preset ``name``: its model, batch size, train length and task."""
    cfg = get_preset(name, device="cpu")
    task = cfg.tasks[0]
    corpus = None
    if get_task(task).needs_corpus:
        from posenc.lab.data import load_corpus
        corpus = load_corpus(cfg.data)
    return cfg, Run(cfg, corpus, torch.device("cpu"), out=None, progress=False), task


def time_steps(cfg, run, task, option: str, n_steps: int, warmup: int) -> dict:
    """Median wall and CPU seconds of one lab training step of the preset's rope model under ``option``."""
    precision, adamw, fp32_attn = OPTIONS[option]
    torch.manual_seed(0)
    model = TinyLM(cfg.model_config(SCHEME[0])).train()
    settings = training(cfg)
    opt = make_optimizer(model, settings, **adamw)
    sampler = get_task(task).sampler(run, cfg.train_len, cfg.batch_size, 0)
    t0 = time.perf_counter()
    batches = [sampler.batch(step) for step in range(warmup + n_steps)]
    sampler_s = (time.perf_counter() - t0) / len(batches)
    walls, cpus = [], []
    with attention_fp32(fp32_attn):
        for step, batch in enumerate(batches):
            w, c = time.perf_counter(), time.process_time()
            train_step(model, model, opt, batch, step, settings, precision=precision)
            if step >= warmup:
                walls.append(time.perf_counter() - w)
                cpus.append(time.process_time() - c)
    return {"step_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "sampler_s": sampler_s}


def time_eval(cfg, run, option: str, n_calls: int) -> dict | None:
    """Median wall and CPU seconds of one evaluation forward (an lm_eval batch at the longest eval length)."""
    precision, _, fp32_attn = OPTIONS[option]
    L = max(cfg.eval_lens)
    torch.manual_seed(0)
    model = TinyLM(cfg.model_config(SCHEME[0])).eval()
    from posenc.lab.tasks.lm import EVAL_BATCH_TOKENS
    rows = max(1, EVAL_BATCH_TOKENS // L)
    x = torch.randint(0, 256, (rows, L))
    walls, cpus = [], []
    with attention_fp32(fp32_attn), torch.no_grad(), autocast(precision, "cpu"):
        for i in range(n_calls + 1):
            w, c = time.perf_counter(), time.process_time()
            model(x).float()
            if i:
                walls.append(time.perf_counter() - w)
                cpus.append(time.process_time() - c)
    return {"eval_len": L, "rows": rows, "step_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}


def categorize(name: str) -> str:
    for category, keys in CATEGORIES:
        if any(k in name for k in keys):
            return category
    return "other ops"


def profile_steps(cfg, run, task, option: str, n_steps: int = 3) -> dict:
    """Seconds per step by category (torch.profiler self CPU time); "Python/dispatch" = wall - all ops."""
    from torch.profiler import ProfilerActivity, profile

    precision, adamw, fp32_attn = OPTIONS[option]
    torch.manual_seed(0)
    model = TinyLM(cfg.model_config(SCHEME[0])).train()
    settings = training(cfg)
    opt = make_optimizer(model, settings, **adamw)
    sampler = get_task(task).sampler(run, cfg.train_len, cfg.batch_size, 0)
    batches = [sampler.batch(step) for step in range(2 + n_steps)]
    with attention_fp32(fp32_attn):
        for step in range(2):
            train_step(model, model, opt, batches[step], step, settings, precision=precision)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            for step in range(2, 2 + n_steps):
                train_step(model, model, opt, batches[step], step, settings, precision=precision)
            wall = time.perf_counter() - t0
    out: dict[str, float] = {}
    for event in prof.key_averages():
        if event.self_cpu_time_total > 0:
            key = categorize(event.key)
            out[key] = out.get(key, 0.0) + event.self_cpu_time_total / 1e6 / n_steps
    out["Python/dispatch"] = max(0.0, wall / n_steps - sum(out.values()))
    out["total"] = wall / n_steps
    return {k: round(v, 4) for k, v in out.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="default,copy", help="comma list of lab presets (default: default,copy)")
    p.add_argument("--options", default=",".join(OPTIONS), help="comma list of: " + ",".join(OPTIONS))
    p.add_argument("--threads", default="1", help="comma list of thread counts (default 1)")
    p.add_argument("--scheme", default="rope", help="position scheme of the timed models (default rope)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per row (default: 10, 3 for big models)")
    p.add_argument("--profile", action="store_true", help="also break a step down by op category (fp32, bf16)")
    p.add_argument("--quick", action="store_true", help="the smoke preset, 2 timed steps: a smoke run")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/lab-throughput-cpu.json)")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = p.parse_args(argv)

    presets = ["smoke"] if args.quick else [s for s in args.presets.split(",") if s]
    from posenc._internal.errors import ConfigError
    from posenc.schemes import check_scheme
    try:
        SCHEME[0] = check_scheme(args.scheme, "--scheme")
    except ConfigError as exc:
        p.error(str(exc))
    options = [o for o in args.options.split(",") if o]
    for o in options:
        if o not in OPTIONS:
            p.error(f"--options: unknown option {o!r}; expected some of {', '.join(OPTIONS)}")
    threads = [int(t) for t in args.threads.split(",") if t]
    if not native_bf16("cpu"):
        print("note: this CPU has no native bf16 (AVX512-BF16 / AMX); bf16 rows run emulated", file=sys.stderr)
    doc = {"environment": environment("cpu"), "scheme": SCHEME[0], "loadavg_start": loadavg(), "peak": {},
           "train": [], "eval": [], "profile": {}}
    for n in threads:
        torch.set_num_threads(n)
        for dtype in ("fp32", "bf16"):
            doc["peak"][f"{dtype}/{n}"] = matmul_peak(DTYPES[dtype], sizes=(256, 512) if args.quick else
                                                      (512, 1024, 2048), min_time=0.05 if args.quick else 0.3)
    print_table([{"dtype": k.split("/")[0], "threads": int(k.split("/")[1]), **v} for k, v in doc["peak"].items()],
                ["dtype", "threads", "gflops", "n"], "matmul peak (torch.mm, n x n)", markdown=args.markdown)

    for name in presets:
        cfg, run, task = preset_setup(name, args.quick)
        mcfg = cfg.model_config(SCHEME[0])
        tokens = cfg.batch_size * cfg.train_len
        flops = mcfg.flops_per_token(cfg.train_len, training=True) * tokens
        big = flops > 20e9
        n_steps = args.steps or (2 if args.quick else 3 if big else 10)
        base = {}
        for n in threads:
            torch.set_num_threads(n)
            for option in options:
                r = time_steps(cfg, run, task, option, n_steps, warmup=1 if args.quick else 2)
                precision = OPTIONS[option][0]
                peak = doc["peak"][f"{precision}/{n}"]["gflops"]
                row = {"preset": name, "option": option, "threads": n, "step_s": round(r["step_s"], 4),
                       "cpu_s": round(r["cpu_s"], 4), "sampler_ms": round(1e3 * r["sampler_s"], 2),
                       "tokens/s": round(tokens / r["step_s"]), "GFLOP/s": round(flops / r["step_s"] / 1e9, 1),
                       "% peak": round(100 * flops / r["step_s"] / 1e9 / peak, 1),
                       "GFLOP/step": round(flops / 1e9, 2), "model": f"d{mcfg.d_model} L{mcfg.n_layers} "
                                                                      f"{cfg.batch_size}x{cfg.train_len}"}
                base.setdefault("step_s", row["step_s"])
                base.setdefault("cpu_s", row["cpu_s"])
                row["speedup"] = round(base["step_s"] / row["step_s"], 2)
                row["speedup_cpu"] = round(base["cpu_s"] / row["cpu_s"], 2) if n == 1 else None
                doc["train"].append(row)
                print(f"  {name} {option} threads={n}: {row['step_s']:.4f} s/step", file=sys.stderr, flush=True)
            for option in [o for o in options if o in ("fp32", "bf16")]:
                e = time_eval(cfg, run, option, n_calls=2 if args.quick or big else 5)
                eflops = mcfg.flops_per_token(e["eval_len"], training=False) * e["rows"] * e["eval_len"]
                precision = OPTIONS[option][0]
                doc["eval"].append({"preset": name, "option": option, "threads": n, "eval_len": e["eval_len"],
                                    "rows": e["rows"], "batch_s": round(e["step_s"], 4),
                                    "cpu_s": round(e["cpu_s"], 4),
                                    "tokens/s": round(e["rows"] * e["eval_len"] / e["step_s"]),
                                    "GFLOP/s": round(eflops / e["step_s"] / 1e9, 1),
                                    "% peak": round(100 * eflops / e["step_s"] / 1e9
                                                    / doc["peak"][f"{precision}/{n}"]["gflops"], 1)})
        if args.profile:
            torch.set_num_threads(threads[0])
            for option in [o for o in options if o in ("fp32", "bf16")]:
                doc["profile"][f"{name}/{option}"] = profile_steps(cfg, run, task, option, 2 if args.quick else 3)
    doc["loadavg_end"] = loadavg()
    print_table(doc["train"], ["preset", "model", "option", "threads", "step_s", "cpu_s", "speedup", "speedup_cpu",
                               "tokens/s", "GFLOP/s", "% peak", "sampler_ms"],
                "training step (GFLOP/s = model FLOPs / wall time; % of the matmul peak of its dtype and threads; "
                "speedups against the first row of the preset, by wall and (one thread) by CPU time)",
                markdown=args.markdown)
    print_table(doc["eval"], ["preset", "option", "threads", "eval_len", "rows", "batch_s", "cpu_s", "tokens/s",
                              "GFLOP/s", "% peak"], "evaluation forward (one lm_eval batch)", markdown=args.markdown)
    if doc["profile"]:
        cats = sorted({k for v in doc["profile"].values() for k in v} - {"total"})
        rows = [{"preset/option": k, **{c: f"{100 * v.get(c, 0) / v['total']:.0f}%" for c in cats},
                 "step_s": v["total"]} for k, v in doc["profile"].items()]
        print_table(rows, ["preset/option"] + cats + ["step_s"], f"share of a step by op category "
                    f"(torch.profiler self time, {threads[0]} thread(s); step_s under the profiler)",
                    markdown=args.markdown)
    print(f"\nload average: start {doc['loadavg_start']}, end {doc['loadavg_end']}")
    path = args.out or os.path.join(RESULTS_DIR, f"lab-throughput-cpu{'-quick' if args.quick else ''}.json")
    print(f"wrote {save_json(doc, path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
