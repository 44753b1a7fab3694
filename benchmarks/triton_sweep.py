"""Tile sizes of the Triton RoPE kernel, timed on a GPU: which (tile, elements a thread) reaches the copy floor.

    python benchmarks/triton_sweep.py [--shapes long,prefill] [--dtypes fp32,bf16]

posenc.kernels.triton_rope chose its tile (_TILE elements of one head's [tokens, dim] tile) and the elements each
thread holds (_THREAD_ELEMS, hence the warps) without a GPU, from register counts. This times
posenc.apply_rope_qk(q, k, positions, out=...) for each choice, side by side with a preallocated copy of q and k
(the floor), and prints the fraction of the copy's bandwidth each reaches. Needs CUDA.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import time_fn  # noqa: E402

import posenc  # noqa: E402
from posenc.kernels import triton_rope  # noqa: E402

SHAPES = {"decode": (1, 1, 32, 8, 128), "prefill": (1, 2048, 32, 8, 128), "long": (1, 16384, 32, 8, 128)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CHOICES = [(2048, 8), (2048, 16), (4096, 16), (4096, 32), (8192, 16), (8192, 32)]   # (tile, elements a thread)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="long,prefill")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--layouts", default="half,interleaved")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or triton_rope.triton is None:
        print("needs a CUDA device and triton")
        return 1
    default = (triton_rope._TILE, triton_rope._THREAD_ELEMS)
    print(f"default (tile, elements a thread) = {default}; 'of copy' = copy time / kernel time")
    for shape_name, dtype_name, layout in itertools.product(args.shapes.split(","), args.dtypes.split(","),
                                                            args.layouts.split(",")):
        b, t, hq, hk, d = SHAPES[shape_name]
        q = torch.randn(b, hq, t, d, device="cuda", dtype=DTYPES[dtype_name])
        k = torch.randn(b, hk, t, d, device="cuda", dtype=DTYPES[dtype_name])
        pos = torch.arange(t, device="cuda")
        out = (torch.empty_like(q), torch.empty_like(k))
        copy = time_fn(lambda: (out[0].copy_(q), out[1].copy_(k)), device="cuda")
        row = []
        try:
            for tile, elems in CHOICES:
                triton_rope._TILE, triton_rope._THREAD_ELEMS = tile, elems
                triton_rope._PLANS.clear()
                ms = time_fn(lambda: posenc.apply_rope_qk(q, k, pos, layout=layout, out=out), device="cuda")
                row.append(f"{tile}/{elems}: {copy / ms:4.0%}")
        finally:
            triton_rope._TILE, triton_rope._THREAD_ELEMS = default
            triton_rope._PLANS.clear()
        gbs = 2 * (q.numel() + k.numel()) * q.element_size() / copy / 1e9
        print(f"{shape_name:8}{dtype_name:5}{layout:12} copy {copy * 1e3:.3f} ms ({gbs:.0f} GB/s)  " + "  ".join(row),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
