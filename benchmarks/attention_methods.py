"""Time and peak memory of the attention-changing extension methods against plain SDPA on the same inputs.

    python benchmarks/attention_methods.py --threads 1                 # 4k, 16k, 32k; prints ratios to SDPA
    python benchmarks/attention_methods.py --lens 4096 --repeats 3

One process. Inputs: B=1, 8 query heads over 2 key heads (GQA), head dim 64, fp32, unrotated q/k. Baselines: ``sdpa``
is torch's causal SDPA on pre-rotated q/k (the floor: no rotation counted); ``rope+sdpa`` rotates q and k with
posenc first (what a model pays). Each method (posenc.attention.kernel.rule_attention) rotates inside.
Method settings are those of a model trained at --train-len (default 4096): Self-Extend G=8, W=1024 (LongLM's
Llama-2 setting); ReRoPE w=1024; Leaky ReRoPE w=1024, k=4; Dual Chunk s=3L/4, w=L/16 (ChunkLlama's defaults);
sinks 4 + (L - 4). Time: the fastest of --repeats calls. Peak memory: the process's resident high-water mark
(VmHWM, reset through /proc/self/clear_refs before each call) minus its resident size before the call (Linux); the
[T, T] score matrix that eager attention would hold is printed for scale. Target (issue #35): Self-Extend <= 2.5x
SDPA at 16k on the CPU.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS_DIR, environment, load_average, print_table, save_json, status_kib  # noqa: E402

from posenc.attention.kernel import rotate, rule_attention  # noqa: E402
from posenc.attention.methods import DualChunk, LeakyReRoPE, ReRoPE, SelfExtend, Sinks  # noqa: E402
from posenc.rope.apply import default_inv_freq  # noqa: E402


def rules(train_len: int) -> dict:
    return {"self-extend": SelfExtend(group_size=8, window=1024), "rerope": ReRoPE(window=1024),
            "leaky-rerope": LeakyReRoPE(window=1024, leak=4.0),
            "dca": DualChunk(chunk_size=3 * train_len // 4, local_window=train_len // 16),
            "sinks": Sinks(n_sink=4, window=train_len - 4)}


def measure(fn, repeats: int) -> tuple[float, float | None]:
    """(fastest wall seconds over ``repeats`` calls, peak extra resident MiB of one call or None)."""
    best = math.inf
    peak = None
    for r in range(repeats):
        before = status_kib("VmRSS")
        reset = False
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
                f.write("5")  # resets VmHWM to the current resident size
            reset = True
        except OSError:
            pass
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        if r == 0 and reset and before is not None:
            peak = max(0, status_kib("VmHWM") - before) / 1024
        del out
    return best, peak


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lens", type=int, nargs="+", default=[4096, 16384, 32768])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="calls per method and length; the fastest counts")
    p.add_argument("--train-len", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--methods", nargs="+", default=list(rules(4096)))
    p.add_argument("--json", default=os.path.join(RESULTS_DIR, "attention_methods.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    env = environment("cpu")
    inv = default_inv_freq(args.head_dim, 10000.0)
    table = []
    for T in args.lens:
        g = torch.Generator().manual_seed(T)
        q = torch.randn(1, args.heads, T, args.head_dim, generator=g)
        k = torch.randn(1, args.kv_heads, T, args.head_dim, generator=g)
        v = torch.randn(1, args.kv_heads, T, args.head_dim, generator=g)
        pos = torch.arange(T, dtype=torch.float64)
        qr, kr = rotate(q, pos, inv, 1.0, "half"), rotate(k, pos, inv, 1.0, "half")
        fns = {"sdpa": lambda: F.scaled_dot_product_attention(qr, kr, v, is_causal=True, enable_gqa=True),
               "rope+sdpa": lambda: F.scaled_dot_product_attention(rotate(q, pos, inv, 1.0, "half"),
                                                                   rotate(k, pos, inv, 1.0, "half"), v,
                                                                   is_causal=True, enable_gqa=True)}
        for name in args.methods:
            rule = rules(args.train_len)[name]
            fns[name] = (lambda r: lambda: rule_attention(q, k, v, r, inv))(rule)
        with torch.no_grad():
            results = {name: measure(fn, args.repeats) for name, fn in fns.items()}
        base_t, base_m = results["sdpa"]
        scores_mib = args.heads * T * T * 4 / 2**20
        for name, (t, m) in results.items():
            table.append({"T": T, "method": name, "ms": 1e3 * t, "x_sdpa": t / base_t,
                          "peak_MiB": m, "mem_x_sdpa": (m / base_m) if m is not None and base_m else None,
                          "TxT_scores_MiB": scores_mib, "load_1m": load_average()})
        print_table([r for r in table if r["T"] == T],
                    ["T", "method", "ms", "x_sdpa", "peak_MiB", "mem_x_sdpa", "TxT_scores_MiB", "load_1m"],
                    title=f"T = {T} ({args.threads} thread(s), B=1, {args.heads}/{args.kv_heads} heads, "
                          f"D={args.head_dim}, fp32)")
    se16 = next((r["x_sdpa"] for r in table if r["T"] == 16384 and r["method"] == "self-extend"), None)
    if se16 is not None:
        print(f"\nSelf-Extend at 16k: {se16:.2f}x plain SDPA (target <= 2.5x: {'met' if se16 <= 2.5 else 'NOT met'})")
    env["load_average_end"] = load_average()
    save_json({"environment": env, "settings": vars(args), "rows": table}, args.json)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
