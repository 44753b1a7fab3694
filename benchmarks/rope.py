"""RoPE speed, side by side in one process: posenc's public calls vs the peers vs two floors.

    python benchmarks/rope.py --threads 1           # decode, prefill and long shapes; fp32 and bf16
    python benchmarks/rope.py --quick               # smaller shapes, shorter timing (a smoke run)
    python benchmarks/rope.py --shapes decode,prefill --dtypes bf16
    python benchmarks/rope.py --threads 1 --malloc mmap   # pin where glibc puts large blocks (see MALLOC_REGIMES)

Each implementation rotates q [B, Hq, T, D] and k [B, Hk, T, D] (GQA, Llama-3-8B-like head counts) at integer
positions. posenc rows time what users call: ``posenc.apply_rope_qk`` (default: fresh outputs; ``out=``;
``inplace=True``), ``posenc.apply_rope`` called on q and then on k, and the ``posenc.Rotary`` module, positions in
and rotated tensors out (tables included). One row
labelled "(internal)" times the kernel behind them with a precomputed table, as a reference.
The floors: a copy of the same bytes into preallocated buffers (``copy_``) and an allocate-and-copy
(``torch.empty_like`` + ``copy_``: what any out-of-place op pays for fresh outputs).

Timing: torch.utils.benchmark's blocked_autorange median after warm-up, the minimum over --repeats rounds that
interleave the implementations (other processes on a shared machine only ever make a round slower, and hit every
row alike); the 1-minute load average of the best round is recorded beside each number. Before timing, every
peer's output is compared with posenc's in the peer's own layout (Hugging Face: half-split; rotary-embedding-torch,
torchtune: interleaved), so the comparison is like for like. A peer that is not installed (the ``bench`` extra) or
fails is reported as unavailable.

Columns: ms (median per call, q and k together), GB/s (bytes of q and k read + written / time; tables not counted),
x_copy / x_alloc (time / the floor's time), vs_posenc (time / ``posenc.apply_rope_qk``'s in the same layout),
vs_hf (time / transformers' eager apply_rotary_pos_emb), max_err (max |output - posenc|), ok (within tolerance),
load (1-minute load average). The targets (issue 15) are checked at the end. Results are also written to
benchmarks/results/rope-<device>[-quick].json.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import traceback
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (RESULTS_DIR, device_tag, environment, gbps, load_average, print_table, save_json,  # noqa: E402
                     time_fn)

import posenc  # noqa: E402
from posenc.kernels import cpu_rope  # noqa: E402
from posenc.kernels.rope_dispatch import rope as posenc_rope  # noqa: E402
from posenc.rope.apply import default_inv_freq, rope_cos_sin  # noqa: E402
from posenc.rope.module import Rotary  # noqa: E402

# name -> (batch, seq, q heads, kv heads, head dim, first position)
SHAPES = {
    "decode": (1, 1, 32, 8, 128, 2047),      # one new token after a 2047-token prompt
    "prefill": (1, 2048, 32, 8, 128, 0),
    "long": (1, 16384, 32, 8, 128, 0),
}
QUICK_SHAPES = {
    "decode": (1, 1, 32, 8, 128, 2047),
    "prefill": (1, 512, 32, 8, 128, 0),
    "long": (1, 2048, 32, 8, 128, 0),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# "ok" when max |peer - posenc| <= TOL * max |posenc|: a few roundings of the dtype. Peers that form angles in
# fp32 drift by ~position * 1e-7 (fine at 2k, visible at 16k); rotary-embedding-torch 0.9.1 forms positions in the
# input dtype, so in bf16 position 257 becomes 256 and its output is wrong (reported, not hidden).
TOL = {torch.float32: 2e-4, torch.bfloat16: 2 ** -6, torch.float16: 2 ** -9}


# ---------------------------------------------------------------------------------------------------------------
# the peers: each returns a callable (no arguments) producing (q_rot, k_rot) in q's [B, H, T, D] layout
# ---------------------------------------------------------------------------------------------------------------

def load_hf():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    return apply_rotary_pos_emb


def load_rotary_embedding_torch():
    from rotary_embedding_torch import RotaryEmbedding
    return RotaryEmbedding


def load_torchtune():
    """torchtune's RotaryPositionalEmbeddings; its package __init__ may fail (torchao version skew), so fall back
    to loading torchtune/modules/position_embeddings.py (which needs only torch) by file path."""
    try:
        from torchtune.modules import RotaryPositionalEmbeddings
        return RotaryPositionalEmbeddings, "package"
    except Exception as exc:  # noqa: BLE001 - any import failure: try the file itself
        first = f"{type(exc).__name__}: {exc}"
    spec = importlib.util.find_spec("torchtune")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torchtune is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "modules", "position_embeddings.py")
    mod_spec = importlib.util.spec_from_file_location("_torchtune_position_embeddings", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module.RotaryPositionalEmbeddings, f"loaded by file path (package import failed: {first[:120]})"


def load_liger():
    from liger_kernel.ops.rope import LigerRopeFunction
    return LigerRopeFunction


def load_flash_attn():
    from flash_attn.layers.rotary import apply_rotary_emb
    return apply_rotary_emb


def plain_half(q, k, cos, sin):
    """The plain half-split formula (what torch.compile is given): math in fp32, output in the input dtype."""
    h = q.shape[-1] // 2

    def one(x):
        x1, x2 = x[..., :h].float(), x[..., h:].float()
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    return one(q), one(k)


class Case:
    """Inputs for one (shape, dtype, device) and the reference outputs posenc gives in both layouts."""

    def __init__(self, shape, dtype, device):
        b, t, hq, hk, d, start = shape
        g = torch.Generator().manual_seed(0)
        self.b, self.t, self.hq, self.hk, self.d, self.start = b, t, hq, hk, d, start
        self.q = torch.randn(b, hq, t, d, generator=g).to(dtype).to(device)
        self.k = torch.randn(b, hk, t, d, generator=g).to(dtype).to(device)
        self.positions = torch.arange(start, start + t, device=device)
        self.inv_freq = default_inv_freq(d, device=device)
        self.cos, self.sin = rope_cos_sin(self.positions, self.inv_freq)              # [T, D/2] float32
        self.q_out, self.k_out = torch.empty_like(self.q), torch.empty_like(self.k)
        self.bytes = 2 * (self.q.numel() + self.k.numel()) * self.q.element_size()
        with torch.no_grad():
            self.ref = {lay: posenc_rope((self.q, self.k), self.cos, self.sin, layout=lay, rotary_dim=d)
                        for lay in ("half", "interleaved")}


POSENC_DEFAULT = "posenc.apply_rope_qk"          # the row every other row is compared with (vs_posenc)
HF = "transformers eager apply_rotary_pos_emb"
COPY, ALLOC = "copy floor (preallocated)", "alloc+copy floor (empty_like + copy_)"


def candidates(case: Case, device: str, compile_times: dict):
    """Yield (name, layout, make) where make() returns the timed callable (or raises if unavailable)."""
    q, k, cos, sin, d, pos = case.q, case.k, case.cos, case.sin, case.d, case.positions

    def copy_floor():
        qo, ko = case.q_out, case.k_out
        return lambda: (qo.copy_(q), ko.copy_(k))
    yield COPY, None, copy_floor

    def alloc_copy_floor():
        return lambda: (torch.empty_like(q).copy_(q), torch.empty_like(k).copy_(k))
    yield ALLOC, None, alloc_copy_floor

    for lay in ("half", "interleaved"):
        suffix = "" if lay == "half" else " interleaved"

        def default(lay=lay):
            return lambda: posenc.apply_rope_qk(q, k, pos, layout=lay)
        yield POSENC_DEFAULT + suffix, lay, default

        def with_out(lay=lay):
            out = (case.q_out, case.k_out)
            return lambda: posenc.apply_rope_qk(q, k, pos, layout=lay, out=out)
        yield f"posenc.apply_rope_qk out={suffix}", lay, with_out

    def inplace():
        qi, ki = q.clone(), k.clone()   # rotated again on every call: timing only (norms are preserved)
        return lambda: posenc.apply_rope_qk(qi, ki, pos, layout="half", inplace=True)
    yield "posenc.apply_rope_qk inplace=True", "half", inplace

    def separately():
        return lambda: (posenc.apply_rope(q, pos, layout="half"), posenc.apply_rope(k, pos, layout="half"))
    yield "posenc.apply_rope on q, then on k", "half", separately

    def module():
        rot = Rotary(d, layout="half").to(q.device)
        rot(q, k, pos)                  # builds its table once, as in a model
        return lambda: rot(q, k, pos)
    yield "posenc.Rotary (module)", "half", module

    def kernel():
        out = (case.q_out, case.k_out)
        return lambda: posenc_rope((q, k), cos, sin, layout="half", rotary_dim=d, out=out)
    yield "posenc kernel, given table, out= (internal)", "half", kernel

    if device == "cpu":
        def eager_fallback():
            out = (case.q_out, case.k_out)

            def run():
                with cpu_rope.eager_only():
                    return posenc.apply_rope_qk(q, k, pos, layout="half", out=out)
            return run
        yield "posenc.apply_rope_qk out=, eager fallback (POSENC_NATIVE=0)", "half", eager_fallback

    def hf():
        apply_rotary_pos_emb = load_hf()
        # transformers' LlamaRotaryEmbedding hands cos/sin [B, T, D] in the activation dtype
        cos2 = torch.cat((cos, cos), -1)[None].to(q.dtype)
        sin2 = torch.cat((sin, sin), -1)[None].to(q.dtype)
        return lambda: apply_rotary_pos_emb(q, k, cos2, sin2)
    yield HF, "half", hf

    def compiled():
        fn = torch.compile(plain_half, dynamic=False)
        t0 = time.perf_counter()
        fn(q, k, cos, sin)
        compile_times[f"{case.t}:{q.dtype}"] = time.perf_counter() - t0
        return lambda: fn(q, k, cos, sin)
    yield "torch.compile(plain formula)", "half", compiled

    def ret():
        RotaryEmbedding = load_rotary_embedding_torch()
        rot = RotaryEmbedding(dim=d, cache_max_seq_len=max(8192, case.start + case.t)).to(q.device)
        return lambda: (rot.rotate_queries_or_keys(q, seq_dim=-2, offset=case.start),
                        rot.rotate_queries_or_keys(k, seq_dim=-2, offset=case.start))
    yield "rotary-embedding-torch", "interleaved", ret

    def tt():
        RoPE, how = load_torchtune()
        mod = RoPE(dim=d, max_seq_len=case.start + case.t).to(q.device)
        qt, kt = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()   # its layout: [B, T, H, D]
        tpos = None if case.start == 0 else case.positions[None].expand(case.b, -1)

        def run():
            return mod(qt, input_pos=tpos), mod(kt, input_pos=tpos)
        run.transform = lambda outs: tuple(o.transpose(1, 2) for o in outs)
        run.note = " ".join(how.split())
        return run
    yield "torchtune RotaryPositionalEmbeddings", "interleaved", tt

    if device != "cpu":
        def liger():
            fn = load_liger()
            cos2 = torch.cat((cos, cos), -1)[None].to(q.dtype)
            sin2 = torch.cat((sin, sin), -1)[None].to(q.dtype)
            qc, kc = q.clone(), k.clone()      # liger rotates in place
            return lambda: fn.apply(qc, kc, cos2, sin2)
        yield "liger-kernel rope (in place)", "half", liger

        def flash():
            fn = load_flash_attn()
            qt, kt = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()   # [B, T, H, D]
            c, s_ = cos.to(q.dtype), sin.to(q.dtype)

            def run():
                return fn(qt, c, s_, interleaved=False), fn(kt, c, s_, interleaved=False)
            run.transform = lambda outs: tuple(o.transpose(1, 2) for o in outs)
            return run
        yield "flash-attn apply_rotary_emb", "half", flash


def check(name, fn, case: Case, layout: str | None):
    """Max |output - posenc's| for one call of fn (None for the copy floor; in-place peers are skipped)."""
    if layout is None or "inplace" in name or "in place" in name:
        return None, None
    with torch.no_grad():
        outs = fn()
    outs = getattr(fn, "transform", lambda o: o)(outs)
    ref = case.ref[layout]
    err = max(float((o.float() - r.float()).abs().max()) for o, r in zip(outs, ref))
    scale = max(float(r.float().abs().max()) for r in ref)
    return err, err <= TOL[case.q.dtype] * scale


def run_case(shape_name, shape, dtype_name, dtype, device, args, compile_times):
    case = Case(shape, dtype, device)
    rows, fns = [], {}
    for name, layout, make in candidates(case, device, compile_times):
        row = {"shape": shape_name, "dtype": dtype_name, "impl": name, "layout": layout}
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn = make()
                row["max_err"], row["ok"] = check(name, fn, case, layout)
            fns[name] = fn
            if getattr(fn, "note", None):
                row["note"] = fn.note
        except Exception as exc:  # noqa: BLE001 - a missing or broken peer must not stop the run
            row["unavailable"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            if args.verbose:
                traceback.print_exc()
        rows.append(row)
    # rounds interleave the implementations, and each keeps its fastest round's median: load from other
    # processes on a shared machine only ever makes a round slower, and hits every implementation alike
    for _ in range(args.repeats):
        for row in rows:
            fn = fns.get(row["impl"])
            if fn is None:
                continue
            try:
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t = time_fn(fn, min_run_time=args.min_run_time, device=device)
                if t < row.get("seconds", float("inf")):
                    row["seconds"], row["load"] = t, load_average()
            except Exception as exc:  # noqa: BLE001
                row["unavailable"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                fns.pop(row["impl"])
    by_name = {r["impl"]: r.get("seconds") for r in rows}
    base = {lay: by_name.get(POSENC_DEFAULT + ("" if lay == "half" else " interleaved")) for lay in
            ("half", "interleaved")}
    for row in rows:
        sec = row.get("seconds")
        if sec:
            row["ms"] = sec * 1e3
            row["GB/s"] = gbps(case.bytes, sec)
            for col, ref in (("x_copy", by_name.get(COPY)), ("x_alloc", by_name.get(ALLOC)),
                             ("vs_posenc", base.get(row["layout"])), ("vs_hf", by_name.get(HF))):
                if ref:
                    row[col] = sec / ref
        row["bytes"] = case.bytes
        row["shape_dims"] = dict(zip(("batch", "seq", "q_heads", "kv_heads", "head_dim", "start"), shape))
    fns.clear()
    return rows


COLUMNS = ["impl", "layout", "ms", "GB/s", "x_copy", "x_alloc", "vs_posenc", "vs_hf", "max_err", "ok", "load"]

# issue 15's targets, and issue 33's (Rotary goes through nn.Module.__call__; a shortcut around it is allowed only
# while this decode row is above 0.3x transformers): (shape kind, row, measure, floor/peer column, limit per dtype)
TARGETS = [
    ("decode", POSENC_DEFAULT, "vs_hf", {"fp32": 0.5, "bf16": 0.5}, "decode: apply_rope_qk <= 0.5x transformers"),
    ("prefill", POSENC_DEFAULT, "x_alloc", {"fp32": 1.5, "bf16": 1.5}, "prefill default <= 1.5x alloc+copy"),
    ("prefill", "posenc.apply_rope_qk out=", "x_copy", {"fp32": 1.2, "bf16": 1.5}, "prefill out= vs copy"),
    ("decode", "posenc.Rotary (module)", "vs_posenc", {"fp32": 1.0, "bf16": 1.0}, "Rotary <= apply_rope_qk"),
    ("prefill", "posenc.Rotary (module)", "vs_posenc", {"fp32": 1.0, "bf16": 1.0}, "Rotary <= apply_rope_qk"),
    ("decode", "posenc.Rotary (module)", "vs_hf", {"fp32": 0.3, "bf16": 0.3}, "decode: Rotary <= 0.3x transformers"),
]


def target_rows(results) -> list[dict]:
    """One row per (target, dtype) found in the results: the measured ratio, the limit, and whether it is met."""
    out = []
    for shape, impl, col, limits, what in TARGETS:
        for r in results:
            if r["shape"] == shape and r["impl"] == impl and r["dtype"] in limits and r.get(col) is not None:
                limit = limits[r["dtype"]]
                out.append({"target": what, "shape": shape, "dtype": r["dtype"], "measured": r[col],
                            "limit": limit, "met": r[col] <= limit, "load": r.get("load")})
    return out


def show(rows, shape_name, dtype_name, shape, markdown=False):
    b, t, hq, hk, d, start = shape
    shown = [r if "unavailable" not in r else {"impl": r["impl"], "layout": r["layout"], "ms": "unavailable"}
             for r in rows]
    print_table(shown, COLUMNS, markdown=markdown,
                title=f"{shape_name} {dtype_name}: B{b} T{t} Hq{hq} Hk{hk} D{d} (positions from {start}); "
                      f"{rows[0]['bytes'] / 2**20:.3g} MiB moved")
    for r in rows:
        if "unavailable" in r:
            print(f"  unavailable: {r['impl']}: {r['unavailable']}")


# glibc serves a large block either from its heap (reused memory, already faulted in) or as a fresh mmap (every
# page faulted in by the first write, then returned to the OS on free). By default it moves its threshold between
# the two as blocks are freed, so rows of one run can land in different regimes: an fp32 prefill output (32 MiB)
# costs 4 ms to allocate and copy in one and 15-20 ms in the other (measured on the 2-core Intel VM). Pinning the
# regime makes rows comparable; both regimes are real (which one a program gets depends on its history).
MALLOC_REGIMES = {"default": None, "heap": 1 << 30, "mmap": 1 << 20}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3      # glibc's mallopt parameters


def set_malloc_regime(regime: str) -> None:
    """Pin glibc's mmap threshold (and, for 'heap', its trim threshold) with mallopt; SystemExit if not glibc."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        raise SystemExit(f"--malloc {regime}: needs glibc's mallopt, not found on this system") from None
    value = MALLOC_REGIMES[regime]
    ok = mallopt(_M_MMAP_THRESHOLD, value) and (regime != "heap" or mallopt(_M_TRIM_THRESHOLD, value))
    if not ok:
        raise SystemExit(f"--malloc {regime}: mallopt refused the threshold {value}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller shapes and short timing (a smoke run)")
    p.add_argument("--shapes", default="decode,prefill,long", help="comma list of: " + ",".join(SHAPES))
    p.add_argument("--dtypes", default="fp32,bf16", help="comma list of: " + ",".join(DTYPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--min-run-time", type=float, default=None, help="seconds of timing per round (default 0.5, "
                   "quick 0.1)")
    p.add_argument("--repeats", type=int, default=None, help="timing rounds per row; the minimum median is "
                   "kept (default 3, quick 1)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--malloc", choices=sorted(MALLOC_REGIMES), default="default",
                   help="glibc's placement of large blocks (see set_malloc_regime): 'default' leaves it to glibc, "
                        "whose choice can differ from row to row; 'heap' or 'mmap' pins it for the whole run")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/rope-<device>[-quick].json)")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--from-json", default=None, metavar="PATH", help="print the tables of a saved run; no timing")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of unavailable peers")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.malloc != "default":
        set_malloc_regime(args.malloc)
    args.min_run_time = args.min_run_time or (0.1 if args.quick else 0.5)
    args.repeats = args.repeats or (1 if args.quick else 3)
    table = QUICK_SHAPES if args.quick else SHAPES
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    dtypes = [s.strip() for s in args.dtypes.split(",") if s.strip()]
    for s in shapes:
        if s not in table:
            p.error(f"--shapes: unknown shape {s!r}; choose from {', '.join(table)}")
    for s in dtypes:
        if s not in DTYPES:
            p.error(f"--dtypes: unknown dtype {s!r}; choose from {', '.join(DTYPES)}")

    if args.from_json:
        import json
        with open(args.from_json) as f:
            saved = json.load(f)
        for shape_name in dict.fromkeys(r["shape"] for r in saved["results"]):
            for dtype_name in dict.fromkeys(r["dtype"] for r in saved["results"]):
                rows = [r for r in saved["results"] if r["shape"] == shape_name and r["dtype"] == dtype_name]
                if rows:
                    dims = rows[0]["shape_dims"]
                    show(rows, shape_name, dtype_name, tuple(dims.values()), args.markdown)
        if saved.get("targets"):
            print_table(saved["targets"], ["target", "shape", "dtype", "measured", "limit", "met", "load"],
                        title="targets (issue 15)", markdown=args.markdown)
        return 0

    env = environment(args.device)
    t0 = time.perf_counter()
    native = cpu_rope.native_info() if args.device == "cpu" else None
    if native is not None:
        native["first_use_seconds"] = time.perf_counter() - t0
    print(f"posenc RoPE benchmark on {env.get('gpu', env['cpu_model'])} ({env['cpu_count']} CPUs, "
          f"{env['torch_threads']} torch threads), torch {env['torch']}, load average {env['load_average_start']}")
    print(f"command: python benchmarks/rope.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"large blocks: {'glibc default (can differ between rows)' if args.malloc == 'default' else args.malloc}")
    if native is not None:
        built = "cached build" if native["build_seconds"] is None else f"built in {native['build_seconds']:.2f} s"
        print(f"native CPU kernel: {'available' if native['available'] else 'UNAVAILABLE: ' + native['reason']}"
              f" ({built}; first use {native['first_use_seconds']:.3f} s)")

    results, compile_times = [], {}
    started = time.perf_counter()
    for shape_name in shapes:
        for dtype_name in dtypes:
            shape = table[shape_name]
            rows = run_case(shape_name, shape, dtype_name, DTYPES[dtype_name], args.device, args, compile_times)
            results += rows
            show(rows, shape_name, dtype_name, shape, args.markdown)
    targets = target_rows(results) if not args.quick else []
    if targets:
        print_table(targets, ["target", "shape", "dtype", "measured", "limit", "met", "load"],
                    title="targets (issue 15)", markdown=args.markdown)
    if compile_times:
        print("\ntorch.compile first-call seconds: " +
              ", ".join(f"T{k.split(':')[0]} {k.split(':')[1].replace('torch.', '')}: {v:.1f}"
                        for k, v in compile_times.items()))
    env["load_average_end"] = load_average()
    env["wall_seconds"] = round(time.perf_counter() - started, 1)
    out = args.out or os.path.join(RESULTS_DIR, f"rope-{device_tag(args.device)}{'-quick' if args.quick else ''}.json")
    save_json({"benchmark": "rope", "environment": env, "args": vars(args), "native_kernel": native,
               "torch_compile_first_call_seconds": compile_times, "results": results, "targets": targets}, out)
    print(f"\nsaved {out} ({env['wall_seconds']} s; load average {env['load_average_start']} -> "
          f"{env['load_average_end']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
