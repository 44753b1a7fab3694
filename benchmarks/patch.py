"""posenc.patch speed: a CPU prefill forward of a Llama-shaped random model, patched vs unpatched in one process.

    python benchmarks/patch.py                      # hidden 512, 8 layers, 8 heads, seq 2048; fp32 and bf16; 1 thread
    python benchmarks/patch.py --quick              # seq 512, shorter timing (a smoke run)
    python benchmarks/patch.py --threads 2 --dtypes bf16 --seq 4096

The model is transformers' LlamaForCausalLM with random weights (no download). A prefill forward is what
``generate`` runs on the prompt: ``model(input_ids, use_cache=False, logits_to_keep=1)``, so the time is the decoder
stack (the output head is computed for the last position only). The RoPE step is a few percent of such a forward,
less than the noise of a shared machine between two separate timings, so the forwards are timed in pairs: one
unpatched and one patched forward back to back (``posenc.patch``/``unpatch`` cost microseconds), the order
alternating between pairs so that a load trend cancels. speedup = the median over pairs of unpatched / patched;
forward_ms columns are each side's median. Before timing, the patched logits are compared with the unpatched ones
(fp32: relative 1e-5).

Also timed, to show where the difference comes from: the RoPE step alone for one forward (every layer's q and k),
transformers' ``apply_rotary_pos_emb`` with its (cos, sin) against posenc's table path (``RopeTable.rotate``).
Columns: unpatched_ms / patched_ms (median forward), speedup (median of paired unpatched / patched, with its
interquartile range), rope_hf_ms / rope_posenc_ms (the RoPE step per forward), rope_speedup, rope_share (transformers'
RoPE time / its forward time: the most the patch can save), max_rel_err (patched vs unpatched logits).
JSON goes to benchmarks/results/patch-cpu-<N>thread.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from tqdm.auto import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS_DIR, environment, print_table, save_json, time_fn  # noqa: E402

import posenc  # noqa: E402
from posenc.hf.patch import PosencRotaryEmbedding  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(args, dtype):
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                         max_position_embeddings=max(4096, args.seq), attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(dtype).eval()


def rope_step_times(model, args, dtype, min_run_time):
    """ms per forward of the RoPE step alone: transformers' apply_rotary_pos_emb vs posenc's table path."""
    from transformers.models.llama import modeling_llama

    head_dim = args.hidden // args.heads
    q = torch.randn(args.batch, args.heads, args.seq, head_dim).to(dtype)
    k = torch.randn(args.batch, args.kv_heads, args.seq, head_dim).to(dtype)
    positions = torch.arange(args.seq)[None]
    cos, sin = model.model.rotary_emb(q, positions)
    table, _ = PosencRotaryEmbedding(model.model.rotary_emb)(q, positions)
    hf = time_fn(lambda: modeling_llama.apply_rotary_pos_emb(q, k, cos, sin), min_run_time=min_run_time)
    ours = time_fn(lambda: table.rotate(q, k), min_run_time=min_run_time)
    return hf * 1e3 * args.layers, ours * 1e3 * args.layers


def _iqr(xs: list[float]) -> list[float]:
    """25th and 75th percentiles."""
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return [q[0], q[2]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=1376, help="MLP width (Llama's ~8/3 x hidden)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--pairs", type=int, default=15, help="(unpatched, patched) forward pairs per dtype")
    p.add_argument("--min-run-time", type=float, default=1.0, help="seconds of sampling for the RoPE-step timing")
    p.add_argument("--quick", action="store_true", help="seq 512, 5 pairs, short sampling")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/patch-cpu-<N>thread.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.seq, args.pairs, args.min_run_time = 512, 5, 0.3
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    rows = []
    for name in args.dtypes.split(","):
        dtype = DTYPES[name]
        model = build(args, dtype)

        def forward():
            with torch.no_grad():
                return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits

        with torch.no_grad():  # correctness first: full logits of a shorter prefix
            short = ids[:, : min(256, args.seq)]
            want = model(input_ids=short, use_cache=False).logits.float()
            got = posenc.patch(model)(input_ids=short, use_cache=False).logits.float()
            posenc.unpatch(model)
        rel = float((got - want).abs().max() / want.abs().max())
        if name == "fp32" and rel > 1e-5:
            raise SystemExit(f"patched logits differ from transformers' by {rel:.3g} (relative) in fp32")
        forward()  # warm-up: allocator, kernels, the patched side's table and native build
        posenc.patch(model)
        forward()
        posenc.unpatch(model)
        base, patched = [], []
        for i in tqdm(range(args.pairs), desc=f"{name} pairs", leave=False):
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                if side:
                    posenc.patch(model)
                t0 = time.perf_counter()
                forward()
                (patched if side else base).append(time.perf_counter() - t0)
                posenc.unpatch(model)
        rope_hf, rope_ours = rope_step_times(model, args, dtype, args.min_run_time)
        b, q = statistics.median(base) * 1e3, statistics.median(patched) * 1e3
        ratios = [x / y for x, y in zip(base, patched)]
        rows.append({"dtype": name, "seq": args.seq, "unpatched_ms": b, "patched_ms": q,
                     "speedup": statistics.median(ratios), "speedup_iqr": _iqr(ratios),
                     "rope_hf_ms": rope_hf, "rope_posenc_ms": rope_ours, "rope_speedup": rope_hf / rope_ours,
                     "rope_share": rope_hf / b, "max_rel_err": rel, "pairs_unpatched_ms": [x * 1e3 for x in base],
                     "pairs_patched_ms": [x * 1e3 for x in patched]})
        del model
    for r in rows:
        r["speedup_iqr_text"] = "{:.3f}-{:.3f}".format(*r["speedup_iqr"])
    print_table(rows, ["dtype", "seq", "unpatched_ms", "patched_ms", "speedup", "speedup_iqr_text", "rope_hf_ms",
                       "rope_posenc_ms", "rope_speedup", "rope_share", "max_rel_err"],
                title=f"Llama-shaped prefill (hidden {args.hidden}, {args.layers} layers, {args.heads} heads, "
                      f"batch {args.batch}), {args.threads} thread(s)")
    out = args.out or os.path.join(RESULTS_DIR, f"patch-cpu-{args.threads}thread{'-quick' if args.quick else ''}.json")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    save_json({"settings": vars(args), "environment": environment("cpu"), "loadavg_end": load,
               "wall_s": round(time.perf_counter() - t_start, 1), "rows": rows}, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
