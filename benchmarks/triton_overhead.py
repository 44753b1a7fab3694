"""Host-side cost of one Triton RoPE call, without a GPU: everything posenc does in Python before the launch.

    python benchmarks/triton_overhead.py [--calls 20000]

The kernel launch is replaced by a no-op, and CPU tensors of the decode shape (B1, Hq32, Hk8, T1, D128) are handed
to the Triton path directly, so the time is planning, checks and dispatch: what a decode step pays on the host
besides triton's own launch. Rows:
  rope_into       posenc.kernels.triton_rope.rope_into with the Angles of one position (the kernel entry point)
  dispatch        posenc.kernels.rope_dispatch.rope with the Triton backend (adds the write and autograd rules)
  public call     posenc.apply_rope_qk taking its CUDA route (argument checks, the frequencies' cache entry, Angles,
                  dispatch, rope_into), without and with out=
  triton binder   triton's own argument binding and kernel-cache key for this call's arguments (the Python part of
                  its launch; internal triton API, for an sm_90 target; "unavailable" where that API differs)
and, for scale, the CPU path's whole public call (posenc.apply_rope_qk with its C kernel) in the same process.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import posenc
from posenc.kernels import rope_dispatch
from posenc.rope.angles import Angles
from posenc.rope.tables import table_for


def per_call_us(fn, calls: int) -> float:
    for _ in range(min(200, calls)):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def binder_us(q, k, pos, outs, calls: int) -> float | str:
    """Per call: triton binding this call's kernel arguments and computing its cache key (no launch)."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.jit import compute_cache_key, create_function_from_signature

        from posenc.kernels import triton_rope
        fn = triton.jit(triton_rope._rope_kernel, do_not_specialize=triton_rope._INT_ARGS)
        binder = create_function_from_signature(fn.signature, fn.params, make_backend(GPUTarget("cuda", 90, 32)))
        packed = torch.cat((torch.ones(64, dtype=torch.float64), torch.ones(1, dtype=torch.float64)))
        _, ints, meta = triton_rope._plan([q, k], outs, pos, True, False, True, "half", 128, False)
        call_args = (q, outs[0], k, outs[1], pos, packed, *ints)
        kwargs = dict(meta, debug=False, instrumentation_mode="", fpsan_homomorphic_casts=False)
        cache: dict = {}

        def bind():
            _, specialization, options = binder(*call_args, **kwargs)
            compute_cache_key(cache, specialization, options)
        return per_call_us(bind, calls)
    except Exception as err:  # noqa: BLE001 - internal API: report, do not fail the other rows
        return f"unavailable ({type(err).__name__})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20000)
    args = p.parse_args(argv)
    try:
        from posenc.kernels import triton_rope
    except ImportError:
        print("triton is not installed")
        return 1
    torch.set_num_threads(1)

    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *a, **kw: None

    q, k, pos = torch.randn(1, 32, 1, 128), torch.randn(1, 8, 1, 128), torch.tensor([1000])
    entry = table_for(10000.0, None, None, 1.0, 128, torch.device("cpu"), torch.float32)
    angles = Angles(pos, entry.inv64, 1.0, entry.packed())
    outs = [torch.empty_like(q), torch.empty_like(k)]
    from posenc.rope import apply as apply_module

    real = triton_rope._kernel, apply_module.KERNEL_ANGLE_DEVICES, rope_dispatch.backend_for
    triton_rope._kernel = NoLaunch
    try:
        rows = [("rope_into (launch stubbed)", per_call_us(
                    lambda: triton_rope.rope_into([q, k], outs, angles, None, layout="half", rotary_dim=128),
                    args.calls)),
                ("dispatch.rope, Triton backend (launch stubbed)", per_call_us(
                    lambda: rope_dispatch.rope((q, k), angles, None, layout="half", rotary_dim=128,
                                               backend=rope_dispatch._triton_backend), args.calls))]
        apply_module.KERNEL_ANGLE_DEVICES = frozenset({"cuda", "cpu"})      # the CUDA route on CPU tensors
        rope_dispatch.backend_for = lambda x: rope_dispatch._triton_backend
        rows.append(("posenc.apply_rope_qk, CUDA route (launch stubbed)",
                     per_call_us(lambda: posenc.apply_rope_qk(q, k, pos, layout="half"), args.calls)))
        rows.append(("posenc.apply_rope_qk out=, CUDA route (launch stubbed)",
                     per_call_us(lambda: posenc.apply_rope_qk(q, k, pos, layout="half", out=outs), args.calls)))
    finally:
        triton_rope._kernel, apply_module.KERNEL_ANGLE_DEVICES, rope_dispatch.backend_for = real
    rows.append(("triton's argument binder + cache key (internal API)", binder_us(q, k, pos, outs, args.calls)))
    rows.append(("posenc.apply_rope_qk on CPU (C kernel, whole call)",
                 per_call_us(lambda: posenc.apply_rope_qk(q, k, pos, layout="half"), args.calls)))
    for name, us in rows:
        print(f"{name:56s} {us:8.1f} us" if isinstance(us, float) else f"{name:56s} {us}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
