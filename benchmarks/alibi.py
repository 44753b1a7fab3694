"""ALiBi attention: posenc.alibi_attention against SDPA without any bias (the floor) and with a prebuilt bias.

    python benchmarks/alibi.py                       # S=2048 and 8192, causal and bidirectional, 1 and 2 threads
    python benchmarks/alibi.py --quick               # S=1024, one round: a smoke test
    python benchmarks/alibi.py --seq 8192 --mode causal --threads 1 --blocks 256 512 --splits 1024/256 2048/256

Variants, timed side by side in this process (B1, H16, D64, fp32 by default):
  sdpa_no_bias     F.scaled_dot_product_attention(q, k, v, is_causal=causal): no ALiBi at all, the floor
  sdpa_prebuilt    SDPA + the [1, H, S, S] bias (posenc.alibi_bias, -inf above the diagonal when causal) built
                   once and reused; skipped when it does not fit in memory or exceeds alibi_bias's size bound
  posenc           posenc.alibi_attention(q, k, v, causal=causal): the public call, its default schedule
opt-in (--variants, --blocks, --splits):
  sdpa_rebuilt     the prebuilt bias rebuilt on every call
  flex             alibi_attention(backend="flex"): compiled FlexAttention (first call compiles)
  flex_static      the same score_mod and block mask through flex_attention compiled with dynamic=False (one
                   kernel per shape): tells whether the default compile (dynamic after a second shape, what a
                   growing KV cache needs) costs speed on a GPU
  blocks_<n>       the block schedule with n queries per call (posenc.kernels.alibi_attention.causal_blocks)
  split_<o>/<i>    the split schedule with outer/inner block sizes (split_causal_attention; causal only)
  no_bands         posenc's CPU schedules with no head banded (internal: what inputs whose norms leave the bands
                   nothing to skip get; posenc.kernels.alibi_band)

Timing: the machine may be shared, so the variants are interleaved: every round times each variant once (one call,
order rotated per round), after one untimed call each. Reported: the median and the minimum over rounds, and
"vs floor" = the median over rounds of (variant time / floor time in the same round), which cancels load that
drifts between rounds. Each group records the 1-minute load average before and after, and the CPU time other
processes used meanwhile ("others", in cores, from /proc/stat minus this process's own CPU time). "cpu_vs_floor" is
the same ratio in process CPU time: at one thread it counts only the cycles this process ran, so it stays close to
the quiet-machine ratio when other jobs take turns on the core (with more threads it also counts OpenMP's spinning).

Peak extra memory: each variant runs in a fresh subprocess. After its inputs exist and one warm-up call has run,
the worker records VmRSS, resets the kernel's high-water mark (write "5" to /proc/self/clear_refs), builds the
variant's state (the prebuilt bias counts) and makes one call; peak extra = VmHWM - VmRSS before. The output tensor
counts for every variant alike. On CUDA: torch.cuda.max_memory_allocated over the same call.
Results go to benchmarks/results/alibi-<device>.json (atomic write; --out to change).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS_DIR, environment, print_table, save_json, status_kib  # noqa: E402

import posenc  # noqa: E402
from posenc.alibi import MAX_BIAS_ELEMENTS, alibi_bias, alibi_slopes  # noqa: E402
from posenc.kernels.alibi_attention import _flex as alibi_flex  # noqa: E402
from posenc.kernels.alibi_attention import _cpu_schedule as cpu_schedule  # noqa: E402
from posenc.kernels.alibi_attention import causal_blocks, split_causal_attention  # noqa: E402
from posenc._internal.machine import busy_jiffies  # noqa: E402

BASE_VARIANTS = ("sdpa_no_bias", "sdpa_prebuilt", "posenc")
OPTIONAL_VARIANTS = ("sdpa_rebuilt", "flex", "flex_static", "no_bands")
MATERIALISED = ("sdpa_prebuilt", "sdpa_rebuilt")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FLOOR = "sdpa_no_bias"


def materialised_bias(n_heads: int, seq: int, causal: bool, device) -> torch.Tensor:
    """The full ALiBi bias [1, H, S, S] in fp32, with -inf above the diagonal when causal (what SDPA needs)."""
    bias = alibi_bias(n_heads, seq, device=device)
    if causal:
        bias.masked_fill_(torch.ones(seq, seq, dtype=torch.bool, device=device).triu_(1), float("-inf"))
    return bias.unsqueeze(0)


def make_variant(name: str, q, k, v, causal: bool):
    """A no-argument callable running one attention of variant ``name``; it owns its state (e.g. the bias)."""
    H, S = q.shape[1], q.shape[2]
    if name == "sdpa_no_bias":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if name == "sdpa_prebuilt":
        bias = materialised_bias(H, S, causal, q.device)
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    if name == "sdpa_rebuilt":
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=materialised_bias(H, S, causal, q.device))
    if name == "posenc":
        return lambda: posenc.alibi_attention(q, k, v, causal=causal)
    if name == "flex":
        return lambda: posenc.alibi_attention(q, k, v, causal=causal, backend="flex")
    if name == "flex_static":
        slopes, fn = alibi_slopes(H).to(q.device), static_flex()
        return lambda: alibi_flex(q, k, v, slopes, causal, 0, None, compiled=fn)
    if q.device.type != "cpu":
        raise ValueError(f"{name}: the block and split schedules are the CPU paths")
    slopes = alibi_slopes(H)
    if name == "no_bands":
        return lambda: cpu_schedule(q, k, v, slopes, causal, 0, None, None)
    if name.startswith("blocks_"):
        block = int(name.split("_")[1])
        return lambda: causal_blocks(q, k, v, slopes, causal=causal, offset=0, scale=None, block=block)
    if name.startswith("split_"):
        outer, inner = (int(x) for x in name.split("_")[1].split("/"))
        if not causal:
            raise ValueError("split schedules are causal only")
        return lambda: split_causal_attention(q, k, v, slopes, offset=0, scale=None, outer=outer, inner=inner)
    raise ValueError(f"unknown variant {name!r}")


_STATIC_FLEX: list = []


def static_flex():
    """torch.compile(flex_attention, dynamic=False), made once per process."""
    if not _STATIC_FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        def static(*args, **kwargs):    # its own code object: dynamo caches compiled code per code object
            return flex_attention(*args, **kwargs)
        _STATIC_FLEX.append(torch.compile(static, dynamic=False))
    return _STATIC_FLEX[0]


def compile_counters() -> dict:
    """torch.compile's counts so far (graphs compiled, recompiles and their reasons): a kernel recompiled on every
    call, or one that fell back to eager after too many recompiles, shows here."""
    from torch._dynamo.utils import counters
    return {group: dict(counters[group]) for group in ("stats", "recompiles", "graph_break") if counters.get(group)}


def make_inputs(batch, heads, seq, dim, dtype, device="cpu", seed=0, qk_std=1.0):
    """q, k, v ~ N(0, 1), q and k times ``qk_std``: posenc's bands (posenc.kernels.alibi_band) narrow with |q| |k|."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq, dim, generator=g) for _ in range(3))
    return [t.to(device=device, dtype=dtype) for t in (q * qk_std, k * qk_std, v)]


def bias_bytes(heads: int, seq: int) -> int:
    """Bytes of the materialised fp32 bias [H, S, S]: the yardstick for every memory ratio."""
    return heads * seq * seq * 4


def materialised_fits(heads: int, seq: int, device) -> tuple[bool, str]:
    n = heads * seq * seq
    if n > MAX_BIAS_ELEMENTS:
        return False, f"skipped: {n * 4 / 1e9:.1f} GB bias, over alibi_bias's bound"
    if torch.device(device).type == "cpu" and not fits_in_memory(int(1.2 * n * 4)):
        # building it holds the bias, an [S, S] distance matrix and the causal mask: ~1.1x the bias at peak
        return False, f"skipped: the bias needs {n * 4 / 1e9:.1f} GB"
    return True, ""


def fits_in_memory(n_bytes: int, fraction: float = 0.8) -> bool:
    """Whether n_bytes is under ``fraction`` of MemAvailable."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return True
    return n_bytes < fraction * avail


# ------------------------------------------------------------------------------------------- machine load

class LoadProbe:
    """The 1-minute load average at start and end, and the cores other processes kept busy in between."""

    def __init__(self):
        self.load0 = os.getloadavg()[0]
        self.busy0, self.own0, self.t0 = busy_jiffies(), _own_cpu_s(), time.perf_counter()

    def finish(self) -> dict:
        busy1, own1, t1 = busy_jiffies(), _own_cpu_s(), time.perf_counter()
        rec = {"load_1m": [round(self.load0, 2), round(os.getloadavg()[0], 2)]}
        if self.busy0 is not None and busy1 is not None:
            total = (busy1 - self.busy0) / os.sysconf("SC_CLK_TCK")
            rec["others_cores"] = round(max(0.0, total - (own1 - self.own0)) / (t1 - self.t0), 2)
        return rec


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ------------------------------------------------------------------------------------------- memory (subprocess)

def _proc_status_kib(key: str) -> int:
    value = status_kib(key)
    if value is None:
        raise RuntimeError(f"{key} not in /proc/self/status")
    return value


def memory_worker(args) -> dict:
    """Run in a fresh process: peak extra memory of one call of one variant (see module docstring)."""
    torch.set_num_threads(args.threads[0])
    q, k, v = make_inputs(args.batch, args.heads, args.seq[0], args.dim, DTYPES[args.dtype], args.device,
                          qk_std=args.qk_std)
    causal = args.mode[0] == "causal"
    warm = make_variant(args.memory_worker, q, k, v, causal)
    warm()
    del warm
    gc.collect()
    if torch.device(args.device).type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = make_variant(args.memory_worker, q, k, v, causal)()
        torch.cuda.synchronize()
        return {"peak_extra_bytes": torch.cuda.max_memory_allocated() - before}
    before = _proc_status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    fn = make_variant(args.memory_worker, q, k, v, causal)
    out = fn()
    peak = _proc_status_kib("VmHWM")
    del out, fn
    return {"peak_extra_bytes": (peak - before) * 1024}


def measure_memory(variant: str, args, seq: int, mode: str) -> int | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-worker", variant, "--seq", str(seq),
           "--batch", str(args.batch), "--heads", str(args.heads), "--dim", str(args.dim), "--dtype", args.dtype,
           "--mode", mode, "--threads", str(args.threads[0]), "--device", args.device, "--qk-std", str(args.qk_std)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"  memory worker {variant} S={seq} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])["peak_extra_bytes"]


# ------------------------------------------------------------------------------------------------------- timing

def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def interleaved_times(fns: dict, rounds: int, device) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and process-CPU seconds per call of each callable, ``rounds`` calls each, interleaved (order rotated
    every round)."""
    names = list(fns)
    for name in names:   # untimed first call: allocations, lazy initialisation, compilation
        fns[name]()
    _sync(device)
    wall, cpu = {name: [] for name in names}, {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            c0, t0 = time.process_time(), time.perf_counter()
            fns[name]()
            _sync(device)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return wall, cpu


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def run_group(args, seq: int, mode: str, threads: int, variants: list[str], memory: dict) -> list[dict]:
    """Time ``variants`` side by side at one (S, mode, threads); ``memory`` caches peak bytes per (S, mode, variant)."""
    torch.set_num_threads(threads)
    causal = mode == "causal"
    q, k, v = make_inputs(args.batch, args.heads, seq, args.dim, DTYPES[args.dtype], args.device,
                          qk_std=args.qk_std)
    full = bias_bytes(args.heads, seq)
    fns, skipped = {}, {}
    for name in variants:
        if name in MATERIALISED:
            ok, why = materialised_fits(args.heads, seq, args.device)
            if not ok:
                skipped[name] = why
                continue
        if name.startswith("split_") and not causal:
            continue
        fns[name] = make_variant(name, q, k, v, causal)
    print(f"  S={seq} {mode} threads={threads}: {', '.join(fns)} x {args.rounds} rounds ...", flush=True)
    probe = LoadProbe()
    start = time.perf_counter()
    times, cpu_times = interleaved_times(fns, args.rounds, args.device)
    print(f"    {time.perf_counter() - start:.1f} s (first calls included); torch.compile: {compile_counters()}",
          flush=True)
    load = probe.finish()
    with torch.no_grad():
        outputs = {name: fn() for name, fn in fns.items()}
    ref = outputs.get("sdpa_prebuilt")
    rows = []
    for name in variants:
        row = {"threads": threads, "S": seq, "mode": mode, "variant": name, "bias_GB": full / 1e9}
        if name in skipped:
            row["note"] = skipped[name]
        if name not in fns:
            rows.append(row) if name in skipped else None
            continue
        t = times[name]
        row.update(ms=_median(t) * 1e3, min_ms=min(t) * 1e3, rounds=len(t), **load)
        row["cpu_ms"] = _median(cpu_times[name]) * 1e3
        if FLOOR in times:
            row["vs_floor"] = _median([a / b for a, b in zip(t, times[FLOOR])])
            row["min_vs_floor"] = min(t) / min(times[FLOOR])
            row["cpu_vs_floor"] = _median([a / b for a, b in zip(cpu_times[name], cpu_times[FLOOR])])
        if ref is not None:
            row["max_abs_err"] = (outputs[name].float() - ref.float()).abs().max().item()
        if not args.no_memory:
            key = (seq, mode, name)
            if key not in memory:
                memory[key] = measure_memory(name, args, seq, mode)
            if memory[key] is not None:
                row.update(peak_extra_MB=memory[key] / 2**20, mem_vs_bias=memory[key] / full)
        rows.append(row)
    del fns, outputs, ref
    gc.collect()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="S=1024, one thread count, 1 round (smoke test)")
    p.add_argument("--seq", type=int, nargs="+", default=[2048, 8192], help="sequence lengths")
    p.add_argument("--mode", nargs="+", choices=("causal", "bidirectional"), default=["causal", "bidirectional"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts, each timed in turn")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--qk-std", type=float, default=1.0,
                   help="standard deviation of q and k (v stays N(0, 1)): larger norms give posenc's bands less to "
                        "skip (posenc.kernels.alibi_band)")
    p.add_argument("--variants", nargs="*", default=list(BASE_VARIANTS),
                   help=f"from {BASE_VARIANTS + OPTIONAL_VARIANTS}")
    p.add_argument("--blocks", type=int, nargs="*", default=[], help="add blocks_<n> variants (block schedule)")
    p.add_argument("--splits", nargs="*", default=[], help="add split_<outer>/<inner> variants, e.g. 1024/256")
    p.add_argument("--rounds", type=int, default=5, help="timed calls per variant, interleaved (after one untimed)")
    p.add_argument("--no-memory", action="store_true", help="skip the per-variant memory subprocesses")
    p.add_argument("--out", help="JSON path (default benchmarks/results/alibi-<device>.json)")
    p.add_argument("--memory-worker", metavar="VARIANT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_worker:
        print(json.dumps(memory_worker(args)))
        return 0
    if args.quick:
        args.seq, args.threads, args.rounds = [1024], args.threads[:1], 1
    variants = list(args.variants)
    if FLOOR not in variants:
        variants.insert(0, FLOOR)   # every ratio is against it
    variants += [f"blocks_{b}" for b in args.blocks] + [f"split_{s}" for s in args.splits]
    rows, memory = [], {}
    for seq in args.seq:
        for mode in args.mode:
            for threads in args.threads:
                rows += run_group(args, seq, mode, threads, variants, memory)
    title = (f"ALiBi attention, {args.dtype}, B={args.batch} H={args.heads} D={args.dim}, {args.device} "
             f"(ms: median of {args.rounds} interleaved rounds; vs_floor: median per-round ratio to sdpa_no_bias)")
    print_table(rows, ["threads", "S", "mode", "variant", "ms", "min_ms", "vs_floor", "min_vs_floor",
                       "cpu_vs_floor", "peak_extra_MB", "mem_vs_bias", "max_abs_err", "load_1m", "others_cores", "note"],
                title=title)
    config = {key: getattr(args, key) for key in ("batch", "heads", "dim", "dtype", "device", "rounds", "seq",
                                                  "mode", "threads", "qk_std")}
    out = args.out or os.path.join(RESULTS_DIR, f"alibi-{torch.device(args.device).type}.json")
    path = save_json({"benchmark": "alibi", "command": " ".join(["python", "benchmarks/alibi.py"] + (argv or
                                                                                               sys.argv[1:])),
                      "environment": environment(args.device), "config": config,
                      "timing_method": "interleaved rounds, one call per variant per round; vs_floor = median of "
                                       "per-round ratios to sdpa_no_bias",
                      "memory_method": "fresh subprocess per variant; VmHWM - VmRSS after a warm-up call, "
                                       "high-water mark reset via /proc/self/clear_refs",
                      "rows": rows, "compile_counters": compile_counters()}, out)
    print(f"\nsaved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
