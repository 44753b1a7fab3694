"""This machine's matmul peak, and where a causal LM's forward spends its time against it.

    python benchmarks/matmul_peak.py --threads 1                       # bf16 / fp32 matmul FLOP/s
    python benchmarks/matmul_peak.py --threads 1 --model DIR --length 2048 --profile   # + one forward, by op
    python benchmarks/matmul_peak.py --threads 2 --model DIR --length 4096,16384        # + where the time goes

The peak is posenc.hf.throughput.matmul_peak (the best of a few [n, n] @ [n, n] matmuls): the yardstick
``posenc eval`` records beside each length's achieved FLOP/s (results.json: matmul_peak_flops, flops_per_s,
fraction_of_matmul_peak). With --model, one forward of ``--length`` tokens through posenc eval's scoring
(posenc.hf.evaluate.chunked_losses) prints its model FLOP/s (posenc.hf.throughput.model_flops) as a ratio of the
peak, and with --profile the ops that take the time (torch.profiler, self CPU time). With two lengths or more,
the forward times are fitted as a T + b T^2 (least squares): the linear term is the per-token work (linear layers,
head, norms), the quadratic one attention's, so each gets its own FLOP/s against the peak. Timings on a shared
machine move with its load: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--n", type=int, default=2048, help="matmul size")
    p.add_argument("--model", default=None, help="a transformers folder or .gguf (optional)")
    p.add_argument("--length", default="2048", help="tokens per forward; comma-separated for the linear / attention "
                                                    "split")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from posenc.hf.throughput import matmul_peak, model_flops

    print(f"threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    peaks = {}
    for dtype in (torch.bfloat16, torch.float32):
        peaks[dtype] = matmul_peak(dtype, n=args.n)
        print(f"matmul {args.n}^3 {str(dtype).replace('torch.', ''):9s} {peaks[dtype] / 1e9:8.1f} GFLOP/s")
    if not args.model:
        return
    from posenc.hf.evaluate import chunked_losses, load_causal_lm

    model, _, _ = load_causal_lm(args.model, dtype=args.dtype, progress=False)
    losses = chunked_losses(model)
    lengths = [int(n) for n in str(args.length).split(",")]
    peak = peaks[getattr(torch, args.dtype)]
    times = []
    for length in lengths:
        ids = torch.randint(0, model.config.vocab_size, (1, length + 1))
        with torch.no_grad():
            losses(ids[:, :64], ids[:, 1:65])                     # warm-up
            t0 = time.perf_counter()
            if args.profile:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    losses(ids[:, :-1], ids[:, 1:])
            else:
                losses(ids[:, :-1], ids[:, 1:])
            seconds = time.perf_counter() - t0
        times.append(seconds)
        flops = model_flops(model, length)
        print(f"forward {length} tokens: {seconds:.1f} s, {length / seconds:.1f} tokens/s, "
              f"{flops / seconds / 1e9:.1f} GFLOP/s = {flops / seconds / peak:.2f}x the {args.dtype} matmul peak "
              f"(load average {os.getloadavg()})")
        if args.profile:
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    if len(lengths) >= 2:
        split(model, lengths, times, peak)


def split(model, lengths: list[int], times: list[float], peak: float) -> None:
    """Fit time = a T + b T^2 (benchmarks/_common.time_split) and print each term's time and FLOP/s."""
    from _common import time_split

    from posenc.hf.throughput import linear_weights, model_flops

    a, b = time_split(lengths, times)
    for length in lengths:
        linear = 2.0 * linear_weights(model) * length
        attention = model_flops(model, length) - linear
        t_lin, t_att = a * length, b * length * length
        print(f"  {length} tokens: per-token work {t_lin:.1f} s ({linear / max(t_lin, 1e-9) / 1e9:.0f} GFLOP/s = "
              f"{linear / max(t_lin, 1e-9) / peak:.2f}x peak), attention {t_att:.1f} s "
              f"({attention / max(t_att, 1e-9) / 1e9:.0f} GFLOP/s = {attention / max(t_att, 1e-9) / peak:.2f}x peak)")

if __name__ == "__main__":
    main()
