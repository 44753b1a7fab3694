"""A plain ``posenc eval`` forward of a model with sliding-window layers, transformers' sdpa against posenc's band route
(``posenc.hf.band_route``), interleaved round by round in one process on the same model and tokens.

    python benchmarks/band_eval.py --threads 1 --length 8192 --rounds 2          # the run in docs/performance.md
    python benchmarks/band_eval.py --length 2048 --rounds 1                        # a minute or less

The model: a random Gemma3ForCausalLM with Gemma 3 270M's attention (hidden 640, 4 query heads over 1 key head,
head dim 256, query_pre_attn_scalar 256, window --window, 5 sliding layers to 1 full), --layers layers and a
256-token vocabulary (the head's cost left out). Each round runs one forward (use_cache=False, logits of the last
position only) with ``config._attn_implementation`` "sdpa" (every sliding layer computes the whole [T, T] square
with transformers' mask) and one with "posenc_band" (sliding layers: band_attention over the keys inside the window;
the full layer: sdpa). The last hidden states of the two are compared. On a shared machine the wall times move with
its load (printed): the ratio within a round is the number to read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import environment, load_average  # noqa: E402


def build(layers: int, window: int, dtype: torch.dtype):
    """A random Gemma 3 text model with the 270M model's attention shape; every 6th layer full, as Gemma 3."""
    import transformers as tf

    kinds = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    if "full_attention" not in kinds:
        kinds[-1] = "full_attention"
    config = tf.Gemma3TextConfig(hidden_size=640, intermediate_size=2048, num_hidden_layers=layers,
                                 num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                 query_pre_attn_scalar=256, sliding_window=window, layer_types=kinds,
                                 vocab_size=256, max_position_embeddings=32768)
    torch.manual_seed(0)
    return tf.Gemma3ForCausalLM(config).eval().to(dtype), kinds


# seconds inside the attention functions during the current forward, by kind of layer
ATTENTION_S = {"sliding": 0.0, "full": 0.0}


def timed(forward_fn):
    """``forward_fn`` (a transformers attention function) adding its wall time to ATTENTION_S."""
    def run(module, *args, **kwargs):
        start = time.perf_counter()
        out = forward_fn(module, *args, **kwargs)
        ATTENTION_S["sliding" if kwargs.get("sliding_window") else "full"] += time.perf_counter() - start
        return out

    return run


def time_attention() -> None:
    """Register timed versions of sdpa and posenc_band under their own names (this process only)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from posenc.hf.band_route import IMPLEMENTATION, band_sdpa_forward

    ALL_ATTENTION_FUNCTIONS.register("sdpa", timed(sdpa_attention_forward))
    ALL_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, timed(band_sdpa_forward))


def forward(model, ids: torch.Tensor, implementation: str) -> tuple[float, dict, torch.Tensor]:
    """One forward under ``implementation`` -> (seconds, attention seconds by kind of layer, the last layer's
    hidden states [1, T, hidden])."""
    model.config._attn_implementation = implementation
    ATTENTION_S.update(sliding=0.0, full=0.0)
    start = time.perf_counter()
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False, logits_to_keep=1, output_hidden_states=True)
    return time.perf_counter() - start, dict(ATTENTION_S), out.hidden_states[-1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from posenc.hf.band_route import IMPLEMENTATION, use_band_route

    dtype = getattr(torch, args.dtype)
    model, kinds = build(args.layers, args.window, dtype)
    assert use_band_route(model)            # registers posenc_band (and its mask function)
    time_attention()
    print(environment())
    print(f"T={args.length} window={args.window} layers={kinds} dtype={args.dtype} threads={args.threads}")
    ids = torch.randint(0, 256, (1, args.length), generator=torch.Generator().manual_seed(0))
    forward(model, ids[:, :args.window * 2], IMPLEMENTATION)     # warm-up: the kernels' first calls
    times: dict[str, list[float]] = {"sdpa": [], IMPLEMENTATION: []}
    sliding: dict[str, list[float]] = {"sdpa": [], IMPLEMENTATION: []}
    for r in range(args.rounds):
        order = ("sdpa", IMPLEMENTATION) if r % 2 == 0 else (IMPLEMENTATION, "sdpa")
        hidden = {}
        for name in order:
            seconds, attention, hidden[name] = forward(model, ids, name)
            times[name].append(seconds)
            sliding[name].append(attention["sliding"])
            print(f"round {r} {name}: forward {seconds:.2f} s; attention: sliding layers {attention['sliding']:.2f} s,"
                  f" full layers {attention['full']:.2f} s; load {load_average()}")
        diff = (hidden["sdpa"].float() - hidden[IMPLEMENTATION].float()).abs().max().item()
        scale = hidden["sdpa"].float().abs().max().item()
        print(f"round {r}: sdpa / band route = {times['sdpa'][-1] / times[IMPLEMENTATION][-1]:.2f}x (forward), "
              f"{sliding['sdpa'][-1] / sliding[IMPLEMENTATION][-1]:.1f}x (sliding layers' attention); last hidden "
              f"max |diff| {diff:.3g} of {scale:.3g}")
    med = {name: (statistics.median(times[name]), statistics.median(sliding[name])) for name in times}
    print(f"median forward: sdpa {med['sdpa'][0]:.2f} s, band route {med[IMPLEMENTATION][0]:.2f} s "
          f"({med['sdpa'][0] / med[IMPLEMENTATION][0]:.2f}x); sliding layers' attention: sdpa {med['sdpa'][1]:.2f} s,"
          f" band {med[IMPLEMENTATION][1]:.2f} s ({med['sdpa'][1] / med[IMPLEMENTATION][1]:.1f}x); load "
          f"{load_average()}")


if __name__ == "__main__":
    main()
