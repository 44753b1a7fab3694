"""ALiBi attention: time and peak extra memory of posenc's paths against SDPA with a materialised bias.

    python benchmarks/alibi.py            # (B1, H16, D64) at S=2048 and S=8192, causal, fp32
    python benchmarks/alibi.py --long     # also S=16384 (materialised variants skipped when they cannot fit)
    python benchmarks/alibi.py --quick    # S=1024 only: a smoke test

Variants, all timed in this process (torch.utils.benchmark medians, see benchmarks/_common.py):
  sdpa_no_bias     SDPA without any bias: the floor (no ALiBi at all)
  sdpa_prebuilt    SDPA + the [1, H, S, S] bias built once (posenc.alibi_bias + causal -inf), reused per call
  sdpa_rebuilt     the same bias rebuilt on every call
  posenc_chunked   posenc.kernels.alibi_attention.alibi_attention(backend="chunked")
  flex_compiled    alibi_attention(backend="flex"): torch.compile(flex_attention) + score_mod; first-call compile
                   time reported separately

Peak extra memory: each variant runs in a fresh subprocess. After its inputs exist and one warm-up call has run
(so the import and compile of torch.compile's machinery are not counted), the worker records VmRSS, resets the
kernel's high-water mark (write "5" to /proc/self/clear_refs), builds the variant's state (the prebuilt bias counts)
and makes one call; peak extra = VmHWM - VmRSS before. The output tensor is included for every variant alike.
Results go to benchmarks/results/alibi-<device>.json (atomic write).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS_DIR, environment, print_table, save_json, time_fn  # noqa: E402

from posenc.alibi import alibi_bias  # noqa: E402
from posenc.kernels.alibi_attention import alibi_attention  # noqa: E402

VARIANTS = ("sdpa_no_bias", "sdpa_prebuilt", "sdpa_rebuilt", "posenc_chunked", "flex_compiled")
MATERIALISED = ("sdpa_prebuilt", "sdpa_rebuilt")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def materialised_bias(n_heads: int, seq: int, causal: bool) -> torch.Tensor:
    """The full ALiBi bias [1, H, S, S] in fp32, with -inf above the diagonal when causal (what SDPA needs)."""
    bias = alibi_bias(n_heads, seq)
    if causal:
        bias.masked_fill_(torch.ones(seq, seq, dtype=torch.bool).triu_(1), float("-inf"))
    return bias.unsqueeze(0)


def make_variant(name: str, q, k, v, causal: bool):
    """A no-argument callable running one attention of variant ``name``; it owns its state (e.g. the bias)."""
    H, S = q.shape[1], q.shape[2]
    if name == "sdpa_no_bias":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if name == "sdpa_prebuilt":
        bias = materialised_bias(H, S, causal)
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    if name == "sdpa_rebuilt":
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=materialised_bias(H, S, causal))
    if name == "posenc_chunked":
        return lambda: alibi_attention(q, k, v, causal=causal, backend="chunked")
    if name == "flex_compiled":
        return lambda: alibi_attention(q, k, v, causal=causal, backend="flex")
    raise ValueError(f"unknown variant {name!r}; expected one of {VARIANTS}")


def make_inputs(batch, heads, seq, dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq, dim, generator=g).to(dtype) for _ in range(3)]


def bias_bytes(heads: int, seq: int) -> int:
    """Bytes of the materialised fp32 bias [H, S, S]: the yardstick for every memory ratio."""
    return heads * seq * seq * 4


# ------------------------------------------------------------------------------------------- memory (subprocess)

def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def memory_worker(args) -> dict:
    """Run in a fresh process: peak extra resident memory of one call of one variant (see module docstring)."""
    torch.set_num_threads(args.threads)
    q, k, v = make_inputs(args.batch, args.heads, args.seq, args.dim, DTYPES[args.dtype])
    causal = args.mode == "causal"
    warm = make_variant(args.variant, q, k, v, causal)
    warm()
    del warm
    gc.collect()
    before = _proc_status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    fn = make_variant(args.variant, q, k, v, causal)
    out = fn()
    peak = _proc_status_kib("VmHWM")
    del out, fn
    return {"peak_extra_bytes": (peak - before) * 1024}


def measure_memory(variant: str, args, seq: int) -> int | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-worker", variant, "--seq", str(seq),
           "--batch", str(args.batch), "--heads", str(args.heads), "--dim", str(args.dim), "--dtype", args.dtype,
           "--mode", args.mode, "--threads", str(args.threads)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"  memory worker {variant} S={seq} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])["peak_extra_bytes"]


# ------------------------------------------------------------------------------------------------------- timing

def fits_in_memory(n_bytes: int, fraction: float = 0.8) -> bool:
    """Whether n_bytes is under ``fraction`` of MemAvailable."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return True
    return n_bytes < fraction * avail


def bench_variant(name, q, k, v, causal, repeats) -> dict:
    fn = make_variant(name, q, k, v, causal)
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn()
    second = time.perf_counter() - t0
    median = time_fn(fn, warmup=0, min_run_time=max(0.5, repeats * second))
    del fn
    gc.collect()
    return {"median_s": median, "first_call_s": first, "out": out}


def run_shape(args, seq: int) -> list[dict]:
    causal = args.mode == "causal"
    q, k, v = make_inputs(args.batch, args.heads, seq, args.dim, DTYPES[args.dtype])
    full = bias_bytes(args.heads, seq)
    rows, outputs = [], {}
    for name in args.variants:
        row = {"S": seq, "variant": name, "bias_GB": full / 1e9}
        # building the bias holds it plus an [S, S] distance matrix and the causal mask: ~1.1x the bias at peak
        if name in MATERIALISED and not fits_in_memory(int(1.2 * full)):
            row["note"] = f"skipped: the bias needs {full / 1e9:.1f} GB"
            rows.append(row)
            print(f"  S={seq} {name}: {row['note']}", flush=True)
            continue
        print(f"  S={seq} {name} ...", flush=True)
        r = bench_variant(name, q, k, v, causal, args.repeats)
        outputs[name] = r.pop("out")
        row.update(ms=r["median_s"] * 1e3, first_call_s=r["first_call_s"])
        if not args.no_memory:
            peak = measure_memory(name, args, seq)
            if peak is not None:
                row.update(peak_extra_MB=peak / 2**20, mem_vs_bias=peak / full)
        rows.append(row)
    # correctness alongside the numbers: max |difference| to the materialised reference
    ref = outputs.get("sdpa_prebuilt", outputs.get("sdpa_rebuilt"))
    base = next((r["ms"] for r in rows if r["variant"] == "sdpa_prebuilt" and "ms" in r), None)
    for row in rows:
        if ref is not None and row["variant"] in outputs:
            row["max_abs_err"] = (outputs[row["variant"]].float() - ref.float()).abs().max().item()
        if base and "ms" in row:
            row["time_vs_prebuilt"] = row["ms"] / base
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--long", action="store_true", help="also S=16384")
    p.add_argument("--quick", action="store_true", help="S=1024 only (smoke test)")
    p.add_argument("--seq", type=int, nargs="*", help="sequence lengths (overrides the defaults)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--mode", choices=("causal", "bidirectional"), default="causal")
    p.add_argument("--variants", nargs="*", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--repeats", type=int, default=3, help="timed calls per variant (after two untimed)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--no-memory", action="store_true", help="skip the per-variant memory subprocesses")
    p.add_argument("--out", default=os.path.join(RESULTS_DIR, "alibi-cpu.json"))
    p.add_argument("--memory-worker", metavar="VARIANT", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_worker:
        args.variant = args.memory_worker
        args.seq = args.seq[0]
        print(json.dumps(memory_worker(args)))
        return 0
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    seqs = args.seq or ([1024] if args.quick else [2048, 8192] + ([16384] if args.long else []))
    rows = []
    for seq in seqs:
        rows += run_shape(args, seq)
    title = (f"ALiBi attention, {args.mode}, {args.dtype}, B={args.batch} H={args.heads} D={args.dim}, "
             f"{args.threads} threads (ms: median; first_call_s includes compile)")
    print_table(rows, ["S", "variant", "ms", "time_vs_prebuilt", "first_call_s", "peak_extra_MB", "bias_GB",
                       "mem_vs_bias", "max_abs_err", "note"], title=title)
    config = {k: getattr(args, k) for k in ("batch", "heads", "dim", "dtype", "mode", "repeats", "threads")}
    env = dict(environment("cpu"), load_average_1m=[load_start, os.getloadavg()[0]])  # shared machines: noise
    path = save_json({"benchmark": "alibi", "environment": env, "config": config,
                      "memory_method": "fresh subprocess per variant; VmHWM - VmRSS after a warm-up call, "
                                       "high-water mark reset via /proc/self/clear_refs",
                      "rows": rows}, args.out)
    print(f"\nsaved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
