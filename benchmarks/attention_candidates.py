"""Candidates for causal CPU attention, measured before building one (issue 46): torch's SDPA (its CPU flash kernel),
posenc's rule_attention, FlexAttention through torch.compile, and a blocked path of big torch.matmul calls.

    python benchmarks/attention_candidates.py --lens 4096 --dtypes bfloat16,float32 --rounds 3
    python benchmarks/attention_candidates.py --lens 16384 --dtypes bfloat16 --rounds 2 --rows sdpa,mm_bf16_scores
    python benchmarks/attention_candidates.py --precision          # each candidate's error against float64

Inputs: B=1, 9 query / 3 KV heads, head dim --head-dim, causal, in each dtype. The candidates run interleaved, round
by round, in one process on the same inputs; the bf16 2048^3 ``torch.matmul`` peak is timed between rounds with the
same threads, and each row prints its GFLOP/s (causal: 2 * 2 * T^2/2 * D * Hq), its fraction of that peak and
sdpa's time over its own. FlexAttention's compile time (first call, block mask included) is printed separately.

The blocked matmul path (``blocked``): query blocks with the GQA group stacked as rows, one [rows, D] x [D, keys]
score matmul per block over the keys up to the block's end (keys above the diagonal skipped), only the diagonal
block masked, a softmax over the row and one [rows, keys] x [keys, Dv] matmul. ``mm_fp32_scores`` forms the scores in
float32 (bf16 inputs upcast: torch's CPU matmul has no bf16 x bf16 -> fp32 product); ``mm_bf16_scores`` keeps
them in bf16 (the matmul's output type; softmax accumulates in fp32 inside), faster but the scores are rounded to 8
bits, so its error grows with the logits' size (--precision).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from posenc.attention.kernel import BandRule, rule_attention


def blocked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, rows: int = 768,
            fp32_scores: bool = True) -> torch.Tensor:
    """Exact causal attention of q [B, Hq, T, D] over k, v [B, Hk, T, D] -> [B, Hq, T, Dv] by big matmuls, one query
    block of ``rows`` stacked rows (rows // g positions times the g query heads of a key head) at a time."""
    B, Hq, T, D = q.shape
    Hk = k.shape[1]
    g = Hq // Hk
    n = max(1, rows // g)
    upcast = fp32_scores and q.dtype != torch.float32
    # bf16 scores: the scale goes on q before the matmul (a power of two for D = 64: exact), so softmax reads them
    qg = (q if upcast or fp32_scores else q * scale).reshape(B, Hk, g, T, D)
    kt = k.transpose(-1, -2).float() if upcast else k.transpose(-1, -2)
    out = torch.empty(B, Hk, g, T, v.shape[-1], dtype=q.dtype)
    above = torch.ones(n, n, dtype=torch.bool).triu_(1)
    for a in range(0, T, n):
        b = min(T, a + n)
        m = b - a
        r = qg[:, :, :, a:b].reshape(B, Hk, g * m, D)
        s = torch.matmul(r.float() if upcast else r, kt[..., :b])
        if fp32_scores:
            s.mul_(scale)
        s.view(B, Hk, g, m, b)[..., a:b].masked_fill_(above[:m, :m], float("-inf"))   # the diagonal block only
        p = torch.softmax(s, dim=-1).to(v.dtype)
        out[:, :, :, a:b] = torch.matmul(p, v[:, :, :b]).view(B, Hk, g, m, -1)
    return out.view(B, Hq, T, -1)


def candidates(q, k, v, names: list[str]) -> dict:
    """The callables of the rows named (FlexAttention compiled here, its compile time printed)."""
    T, D = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    zero = torch.zeros(D // 2)        # rule_attention rotates; zero frequencies make that rotation the identity
    rows = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
            "rule_attention": lambda: rule_attention(q, k, v, BandRule(T), zero),
            "mm_fp32_scores": lambda: blocked(q, k, v, scale, 384, True),
            "mm_bf16_scores": lambda: blocked(q, k, v, scale, 768, False)}
    if "flex" in names:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        t0 = time.perf_counter()
        mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, T, T, device="cpu")
        compiled = torch.compile(flex_attention)
        with torch.no_grad():
            compiled(q, k, v, block_mask=mask, enable_gqa=True)
        print(f"flex: compile + first call {time.perf_counter() - t0:.1f} s ({q.dtype}, T={T})", flush=True)
        rows["flex"] = lambda: compiled(q, k, v, block_mask=mask, enable_gqa=True)
    return {name: rows[name] for name in names}


def timed(T: int, D: int, dtype: torch.dtype, names: list[str], rounds: int) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, T, D, generator=g).to(dtype) for h in (9, 3, 3))
    rows = candidates(q, k, v, names)
    x = torch.randn(2048, 2048).bfloat16()
    flops = 2 * 2 * T * T / 2 * D * 9
    peaks, times = [], {name: [] for name in rows}
    with torch.no_grad():
        want = rows["sdpa"]().float()
        for name, fn in rows.items():
            print(f"  {name}: max |difference from sdpa| {(fn().float() - want).abs().max().item():.2e}")
        for _ in range(rounds):
            for name, fn in [("peak", lambda: x @ x), *rows.items()]:
                t0 = time.perf_counter()
                fn()
                (peaks if name == "peak" else times[name]).append(time.perf_counter() - t0)
    peak = 2 * 2048 ** 3 / statistics.median(peaks)
    base = statistics.median(times["sdpa"])
    print(f"T={T} D={D} {dtype}, {torch.get_num_threads()} thread(s); bf16 2048^3 matmul peak {peak / 1e9:.1f} GFLOP/s")
    for name, seconds in times.items():
        t = statistics.median(seconds)
        print(f"  {name:15s} {t * 1e3:9.0f} ms (min {min(seconds) * 1e3:.0f})  {flops / t / 1e9:6.1f} GFLOP/s  "
              f"{flops / t / peak:.2f} of peak  sdpa/this {base / t:.2f}x", flush=True)


def precision(T: int = 1024, D: int = 64) -> None:
    """Each candidate's error against float64 attention on the same bf16 inputs, as the logits grow (q scaled up,
    one sink-like key with large scores)."""
    for size in (1.0, 4.0, 10.0):
        g = torch.Generator().manual_seed(1)
        q = (torch.randn(1, 9, T, D, generator=g) * size).bfloat16()
        k = torch.randn(1, 3, T, D, generator=g)
        k[:, :, 0] *= 4
        k, v = k.bfloat16(), torch.randn(1, 3, T, D, generator=g).bfloat16()
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True)
        with torch.no_grad():
            for name, fn in candidates(q, k, v, ["sdpa", "mm_fp32_scores", "mm_bf16_scores"]).items():
                err = (fn().double() - want).abs()
                print(f"q x {size:4}: {name:15s} max error {err.max():.2e}, mean {err.mean():.2e}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--lens", default="4096")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--rows", default="sdpa,rule_attention,mm_fp32_scores,mm_bf16_scores,flex")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", action="store_true", help="print the errors against float64 instead of timing")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.precision:
        precision(D=args.head_dim)
        return 0
    names = args.rows.split(",")
    for T in (int(x) for x in args.lens.split(",")):
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            timed(T, args.head_dim, dtype, [n for n in names if dtype == torch.bfloat16 or n != "mm_bf16_scores"],
                  args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
