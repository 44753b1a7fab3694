"""The learned biases' fast paths against their general forms, side by side: CoPE attention and the FIRE bias.

    python benchmarks/biases.py                 # copy-cpu's training shape and its longest test shape, 1 thread
    python benchmarks/biases.py --threads 2

CoPE variants (fp32, CPU):
  sdpa_causal      F.scaled_dot_product_attention(q, k, v, is_causal=True): no CoPE, the floor
  bias_sdpa        posenc.cope_bias(q, q.k * scale, e) + causal -inf as SDPA's mask: CoPE as autograd sees it
                   (the path before the fused call; its values and gradients are the tests' reference)
  posenc           posenc.cope_attention(q, k, v, e, scale=scale): the public fused call (the lab's path)
Shapes: "train" = forward + backward of one copy-cpu layer (B8, H4, T128, D16, 128 positions); "eval" = a
forward without gradients at the copy-cpu test's longest length (B32, H4, T512, D16).
FIRE variants (one layer's bias [H4, T, T] and its backward, width 32; the threshold L at 128, the lab's start):
  fire_general     FIREBias(q_pos, k_pos): the MLP on every (i, j) pair (posenc.fire_bias)
  fire_contiguous  FIREBias.contiguous(T, T): the MLP on the T distances (posenc.fire_bias_contiguous; what the
                   fire scheme uses at default positions), "vs" = / fire_general
  fire_contiguous_L126  the same with L = 126: the two queries at or past L take the general form
Medians of torch.utils.benchmark blocks after warm-up; "vs floor" = time / sdpa_causal's. Results go to
benchmarks/results/biases-cpu.json (atomic write).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS_DIR, environment, load_average, print_table, save_json, time_fn  # noqa: E402

import posenc  # noqa: E402
from posenc.bias.fire import FIREBias  # noqa: E402


def _bias_sdpa(q, k, v, emb, scale):
    q_len, k_len = q.shape[-2], k.shape[-2]
    hidden = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).triu(k_len - q_len + 1)
    mask = posenc.cope_bias(q, q @ k.transpose(-1, -2) * scale, emb).masked_fill(hidden, -math.inf)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=scale)


VARIANTS = {
    "sdpa_causal": lambda q, k, v, emb, scale: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale),
    "bias_sdpa": _bias_sdpa,
    "posenc": lambda q, k, v, emb, scale: posenc.cope_attention(q, k, v, emb, scale=scale),
}
SHAPES = {"train": (8, 4, 128, 16, 128, True), "eval": (32, 4, 512, 16, 128, False)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--min-run-time", type=float, default=1.0)
    ap.add_argument("--out", default=os.path.join(RESULTS_DIR, "biases-cpu.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for shape, (B, H, T, D, npos, grad) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, T, D, generator=g).requires_grad_(grad) for _ in range(3))
        emb = (torch.randn(npos, D, generator=g) * 0.1).requires_grad_(grad)
        scale = 1 / math.sqrt(D)
        times = {}
        for name, fn in VARIANTS.items():
            def call(fn=fn):
                if grad:
                    fn(q, k, v, emb, scale).sum().backward()
                else:
                    with torch.no_grad():
                        fn(q, k, v, emb, scale)
            times[name] = time_fn(call, min_run_time=args.min_run_time)
        for name, t in times.items():
            rows.append({"shape": shape, "variant": name, "ms": round(t * 1e3, 3),
                         "vs_floor": round(t / times["sdpa_causal"], 2),
                         "vs_bias_sdpa": round(t / times["bias_sdpa"], 2)})
    print_table(rows, ["shape", "variant", "ms", "vs_floor", "vs_bias_sdpa"], title="CoPE attention")
    fire = FIREBias(4, width=32, init_threshold=128.0)
    drifted = FIREBias(4, width=32, init_threshold=126.0)     # where the copy-cpu models' L ended: 2 rows past it
    weights = torch.randn(4, 128, 128, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(128)
    fire_rows = []
    for name, fn in (("fire_general", lambda: fire(positions, positions)),
                     ("fire_contiguous", lambda: fire.contiguous(128, 128)),
                     ("fire_contiguous_L126", lambda: drifted.contiguous(128, 128))):
        fire_rows.append({"shape": "train", "variant": name,
                          "ms": round(time_fn(lambda fn=fn: (fn() * weights).sum().backward(),
                                              min_run_time=args.min_run_time) * 1e3, 3)})
    for row in fire_rows:
        row["vs_general"] = round(row["ms"] / fire_rows[0]["ms"], 2)
    print_table(fire_rows, ["shape", "variant", "ms", "vs_general"], title="FIRE bias, T = 128")
    rows += fire_rows
    env = environment("cpu")
    env["load_average_end"] = load_average()
    save_json({"environment": env, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
