"""torch.compile and posenc's RoPE, side by side in one process: a TinyLM training step and RoPE alone.

    python benchmarks/compile.py --threads 1                     # the copy preset's model, T=128, batch 8, CPU
    python benchmarks/compile.py --device cuda --seq 512 --batch 16    # the preset's training length on a GPU
    python benchmarks/compile.py --quick                         # a smaller model and shorter timing (smoke run)

Rows (all in this process, on the same inputs):
- "eager, posenc kernel": TinyLM as the lab trains it, uncompiled (RoPE by posenc's C kernel on CPU, Triton on CUDA);
- "compiled, posenc ops": torch.compile(TinyLM, fullgraph=True); RoPE runs as posenc's custom op
  (posenc.kernels.ops), the rest of the step is inductor's;
- "compiled, transformers RoPE": the same model with its rotation replaced by transformers' eager
  ``apply_rotary_pos_emb`` (cos/sin from float32 angles, as its rotary embedding makes them) and torch.compile'd:
  inductor then fuses RoPE itself, which is what a user gets without posenc.
The step is forward + cross-entropy + backward (no optimizer). The RoPE-only rows time q [B, H, T, Dh] and
k at the model's shapes, forward only.

Columns: ms (median per call: torch.utils.benchmark's blocked_autorange, the minimum over --repeats rounds that
interleave the rows), tokens/s, x_eager (time / the eager row), vs_hf_compiled (time / the compiled transformers
row), max_err (max |logits - eager logits|, or |rotated - posenc eager|), compile_s (first call), load (1-minute load
average). Results also go to benchmarks/results/compile-<device>[-quick].json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS_DIR, device_tag, environment, load_average, print_table, save_json, time_fn  # noqa: E402

import posenc  # noqa: E402
from posenc.lab.presets import PRESETS  # noqa: E402
from posenc.nn.model import ModelConfig, TinyLM  # noqa: E402


def hf_rotation(model: TinyLM):
    """rotate_qk for the model's RoPE scheme computed as transformers does (half layout: the model's default)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inv_freq = model.scheme.rotary.inv_freq

    def rotate_qk(q, k, ctx):
        freqs = ctx.q_positions[:, None].float() * inv_freq[None, :]        # [T, Dh/2], float32 as transformers
        emb = torch.cat((freqs, freqs), dim=-1)
        return apply_rotary_pos_emb(q, k, emb.cos()[None], emb.sin()[None])
    return rotate_qk


def build(args, device):
    preset = PRESETS["copy"]
    d_model, n_layers = (64, 2) if args.quick else (preset["d_model"], preset["n_layers"])
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(scheme="rope", d_model=d_model, n_layers=n_layers, n_heads=preset["n_heads"],
                               max_len=max(args.seq, preset["train_len"]))).to(device)
    return model


def step_fn(model, tokens):
    def step():
        model.zero_grad(set_to_none=True)
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        return logits.detach()
    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 128 CPU, 512 CUDA)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--repeats", type=int, default=3, help="timing rounds (the minimum median is kept)")
    p.add_argument("--min-run-time", type=float, default=1.0)
    p.add_argument("--quick", action="store_true", help="2-layer 64-wide model, T=64, short timing")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.seq is None:
        args.seq = 64 if args.quick else (512 if device.type == "cuda" else 128)
    if args.quick:
        args.min_run_time, args.repeats = 0.3, 1
    env = environment(device)
    print(f"compile benchmark on {env.get('gpu') or env['cpu_model']} ({env['cpu_count']} CPUs, "
          f"{torch.get_num_threads()} torch threads), torch {torch.__version__}, load average "
          f"{env['load_average_start']}")

    tokens = torch.randint(0, 256, (args.batch, args.seq), generator=torch.Generator().manual_seed(0)).to(device)
    model = build(args, device)
    hf_model = build(args, device)
    hf_model.scheme.rotate_qk = hf_rotation(hf_model)
    cfg = model.cfg
    print(f"TinyLM (copy preset's model): d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads; "
          f"batch {args.batch} x {args.seq} tokens; step = forward + loss + backward")

    steps = {"eager, posenc kernel": step_fn(model, tokens)}
    compile_s = {}
    for name, m in (("compiled, posenc ops", model), ("compiled, transformers RoPE", hf_model)):
        torch._dynamo.reset()
        compiled = torch.compile(m, fullgraph=True)
        fn = step_fn(compiled, tokens)
        start = time.perf_counter()
        fn()
        compile_s[name] = time.perf_counter() - start
        steps[name] = fn
    reference = steps["eager, posenc kernel"]()

    # RoPE alone at the model's shapes
    B, H, T, Dh = args.batch, cfg.n_heads, args.seq, cfg.head_dim
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(B, H, T, Dh, generator=g).to(device) for _ in range(2))
    positions = torch.arange(T, device=device)
    rot = posenc.Rotary(Dh, layout="half").to(device)
    hf_rot = hf_rotation(hf_model)

    class Ctx:
        q_positions = positions
    ropes = {"RoPE eager, posenc Rotary": lambda: rot(q, k, positions)}
    for name, fn in (("RoPE compiled, posenc ops", lambda a, b: rot(a, b, positions)),
                     ("RoPE compiled, transformers", lambda a, b: hf_rot(a, b, Ctx))):
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True)
        start = time.perf_counter()
        compiled(q, k)
        compile_s[name] = time.perf_counter() - start
        ropes[name] = (lambda c: (lambda: c(q, k)))(compiled)
    rope_reference = ropes["RoPE eager, posenc Rotary"]()

    best: dict[str, tuple[float, float | None]] = {}
    for _ in range(args.repeats):              # rounds interleave the rows: load hits every row alike
        for name, fn in {**steps, **ropes}.items():
            t = time_fn(fn, min_run_time=args.min_run_time, device=device)
            if name not in best or t < best[name][0]:
                best[name] = (t, load_average())

    rows = []
    for group, fns, ref_name, hf_name in (("step", steps, "eager, posenc kernel", "compiled, transformers RoPE"),
                                          ("rope", ropes, "RoPE eager, posenc Rotary", "RoPE compiled, transformers")):
        for name, fn in fns.items():
            t, load = best[name]
            out = fn()
            err = ((out - reference).abs().max() if group == "step" else
                   max((a - b).abs().max() for a, b in zip(out, rope_reference)))
            rows.append(dict(row=name, ms=t * 1e3, tokens_per_s=args.batch * args.seq / t,
                             x_eager=t / best[ref_name][0], vs_hf_compiled=t / best[hf_name][0],
                             max_err=float(err), compile_s=compile_s.get(name), load=load))
    columns = ["row", "ms", "tokens_per_s", "x_eager", "vs_hf_compiled", "max_err", "compile_s", "load"]
    print_table(rows, columns, title="TinyLM step and RoPE alone (lower x_eager / vs_hf_compiled is faster)")
    path = args.out or os.path.join(RESULTS_DIR, f"compile-{device_tag(device)}{'-quick' if args.quick else ''}.json")
    save_json({"environment": env, "settings": vars(args), "rows": rows}, path)
    print(f"\nsaved {path}; load average {env['load_average_start']} -> {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
