"""Long-context attention on the CPU, side by side in one process: torch SDPA, posenc's path, every attention method,
and a sliding-window layer's band, against the bf16 matmul peak measured in the same process.

    python benchmarks/attention_long.py --threads 2                            # 4k, 16k, 32k; D 64 and 128; bf16, fp32
    python benchmarks/attention_long.py --threads 1 --lens 4096 --head-dims 64 --dtypes bfloat16 --repeats 2

Inputs: B=1, 9 query heads over 3 key heads (SmolLM2-135M's GQA), head dim --head-dims, unrotated q/k/v in each
--dtypes. Rows, each timed on the same inputs, interleaved round by round (--repeats rounds):

- ``sdpa``: torch's causal SDPA (its CPU flash kernel) on pre-rotated q/k: what plain ``posenc eval`` runs per
  full-attention layer (transformers' sdpa), rotation not counted.
- ``posenc plain``: ``posenc.attention.kernel.rule_attention`` under an identity rule (one band of all keys): what a
  layer patched by ``posenc.patch`` costs when the method changes no position (rotation counted).
- each registered attention method (``rule_attention`` under its rule, options resolved for a model trained at
  --train-len and evaluated at T, as posenc eval resolves them).
- ``band W`` (posenc.attention.kernel.band_attention) and ``sdpa masked W``: a sliding-window layer of window W
  (--window; Gemma 3's 512) as posenc runs it (only the band) and as transformers' sdpa does (the square with a
  mask; left out past --masked-max tokens, where its [T, T] mask alone would take T^2 bytes).

Columns: ms (the median of the rounds; min beside it), GFLOP/s counting the score and value products of the pairs
attended (causal: 2 * 2 * T^2/2 * D * Hq; a band, sinks or LM-Infinite: the pairs they keep), ``x_peak`` that rate
over the bf16 2048^3 ``torch.matmul`` peak measured in the same process with the same threads before and after each
length (the median; the model's own narrow shapes reach less: ``benchmarks/matmul_peak.py --model``), ``x_sdpa``
the time over sdpa's, and peak MiB (the resident high-water mark of the first call above the resident size before
it; Linux). Timings on a shared machine move with its load: compare rows of one run only; the load average is printed.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS_DIR, environment, load_average, print_table, save_json, status_kib  # noqa: E402

from posenc.attention import as_rule, attention_method_names  # noqa: E402
from posenc.attention.kernel import BandRule, band_attention, rotate, rule_attention  # noqa: E402
from posenc.hf.throughput import matmul_peak, reset_peak_memory  # noqa: E402
from posenc.rope.apply import default_inv_freq  # noqa: E402

COLUMNS = ["T", "D", "dtype", "row", "ms", "min_ms", "GFLOP/s", "x_peak", "x_sdpa", "peak_MiB", "load_1m"]


def band_pairs(T: int, window: int) -> int:
    """Query-key pairs a causal window of ``window`` keys holds over T queries: sum_i min(i + 1, window)."""
    w = min(window, T)
    return w * (w + 1) // 2 + (T - w) * w


def rule_pairs(rule, T: int) -> int:
    """Query-key pairs a rule attends over T queries (its modes' intervals, as the kernel clips them): a rule that
    drops keys (sinks, LM-Infinite) is credited only with the pairs it computes."""
    qi = torch.arange(T)
    return sum(int((torch.minimum(m.hi(qi), qi + 1) - m.lo(qi).clamp(0, T)).clamp(min=0).sum())
               for m in rule.modes())


def inputs(T: int, D: int, dtype: torch.dtype, heads: int, kv_heads: int):
    """Unrotated q [1, heads, T, D], k and v [1, kv_heads, T, D] in ``dtype``, and the RoPE frequencies [D/2]."""
    g = torch.Generator().manual_seed(T + D)
    q, k, v = (torch.randn(1, h, T, D, generator=g).to(dtype) for h in (heads, kv_heads, kv_heads))
    return q, k, v, default_inv_freq(D, 10000.0)


def rows_for(q, k, v, inv, args) -> dict:
    """Each row's callable and the pairs it attends (for its FLOP count), on the same inputs."""
    T = q.shape[-2]
    pos = torch.arange(T, dtype=torch.float64)
    qr, kr = rotate(q, pos, inv, 1.0, "half").to(q.dtype), rotate(k, pos, inv, 1.0, "half").to(k.dtype)
    causal = T * (T + 1) // 2
    rows = {"sdpa": (lambda: F.scaled_dot_product_attention(qr, kr, v, is_causal=True, enable_gqa=True), causal),
            "posenc plain": (lambda: rule_attention(q, k, v, BandRule(T), inv), causal)}
    for name in args.methods:
        rule = as_rule(name).resolve(args.train_len, T)
        rows[name] = ((lambda r: lambda: rule_attention(q, k, v, r, inv))(rule), rule_pairs(rule, T))
    if args.window:
        W = args.window
        rows[f"band {W}"] = (lambda: band_attention(q, k, v, W, inv), band_pairs(T, W))
        if T <= args.masked_max:
            i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
            mask = (j <= i) & (j > i - W)
            rows[f"sdpa masked {W}"] = (lambda: F.scaled_dot_product_attention(qr, kr, v, attn_mask=mask,
                                                                               enable_gqa=True), band_pairs(T, W))
    return rows


def time_rows(rows: dict, repeats: int) -> dict:
    """{row: (seconds per round, peak MiB of its first call)}: the rows interleaved round by round, so a change in
    the machine's load falls on every row alike."""
    times = {name: [] for name in rows}
    peaks: dict = {}
    with torch.no_grad():
        for _ in range(repeats):
            for name, (fn, _pairs) in rows.items():
                before = status_kib("VmRSS")
                reset_peak_memory()
                t0 = time.perf_counter()
                out = fn()
                times[name].append(time.perf_counter() - t0)
                high = status_kib("VmHWM")
                if name not in peaks:
                    peaks[name] = None if before is None or high is None else max(0, high - before) / 1024
                del out
    return {name: (times[name], peaks[name]) for name in rows}


def measure(T: int, D: int, dtype: torch.dtype, args) -> list[dict]:
    """One length, head dim and dtype: the rows' table entries."""
    q, k, v, inv = inputs(T, D, dtype, args.heads, args.kv_heads)
    rows = rows_for(q, k, v, inv, args)
    peaks = [matmul_peak(torch.bfloat16, repeats=3)]
    timed = time_rows(rows, args.repeats)
    peaks.append(matmul_peak(torch.bfloat16, repeats=3))
    peak = statistics.median(peaks)
    base = statistics.median(timed["sdpa"][0])
    table = []
    for name, (seconds, mib) in timed.items():
        t = statistics.median(seconds)
        flops = 2 * 2 * rows[name][1] * D * args.heads
        table.append({"T": T, "D": D, "dtype": str(dtype).removeprefix("torch."), "row": name, "ms": 1e3 * t,
                      "min_ms": 1e3 * min(seconds), "GFLOP/s": flops / t / 1e9, "x_peak": flops / t / peak,
                      "x_sdpa": t / base, "peak_MiB": mib, "load_1m": load_average(),
                      "peak_GFLOP/s": peak / 1e9})
    return table


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--lens", default="4096,16384,32768", help="comma-separated lengths")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds; the median counts")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--train-len", type=int, default=2048, help="the trained length the methods' defaults plan from")
    p.add_argument("--methods", default=",".join(attention_method_names()), help="comma-separated; '' for none")
    p.add_argument("--window", type=int, default=512, help="sliding window of the band rows (0: none)")
    p.add_argument("--masked-max", type=int, default=16384, help="longest T for the 'sdpa masked' row")
    p.add_argument("--json", default=os.path.join(RESULTS_DIR, "attention_long.json"))
    args = p.parse_args(argv)
    args.lens = [int(x) for x in args.lens.split(",")]
    args.head_dims = [int(x) for x in args.head_dims.split(",")]
    args.dtypes = [getattr(torch, x) for x in args.dtypes.split(",")]
    args.methods = [m for m in args.methods.split(",") if m]
    return args


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    env = environment("cpu")
    table = []
    for T in args.lens:
        for D in args.head_dims:
            for dtype in args.dtypes:
                rows = measure(T, D, dtype, args)
                table += rows
                print_table(rows, COLUMNS, title=f"T = {T}, D = {D}, {dtype} ({args.threads} thread(s), B=1, "
                                                 f"{args.heads}/{args.kv_heads} heads; bf16 2048^3 matmul peak "
                                                 f"{rows[0]['peak_GFLOP/s']:.1f} GFLOP/s in this process)")
    env["load_average_end"] = load_average()
    save_json({"environment": env, "settings": {k: (v if not isinstance(v, list) else [str(x) for x in v])
                                                for k, v in vars(args).items()}, "rows": table}, args.json)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
