"""What the Triton RoPE kernel compiles to on an H100/H200, without a GPU: registers and memory-access widths.

    python benchmarks/triton_compile.py [--arch 90]

For each dtype x layout x cos/sin source (angles computed in the kernel, or a table), the kernel is compiled for
sm_<arch> the way rope_into launches it for the prefill shape (head dim 128, BLOCK_T 32, 8 warps, aligned rows),
and the report gives, from the compiled code:
  regs        registers a thread (cuobjdump --dump-resource-usage on the cubin); 65536 / (regs * 256) blocks fit
              on one SM, and resident warps are what hide memory latency in a copy-like kernel
  ld / st     widths in bytes of the global loads and stores in the PTX (16 = one 16-byte vector per access)
Needs triton with its NVIDIA backend (it ships ptxas and cuobjdump); no CUDA device or driver is used.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile

from posenc.kernels import triton_rope


def registers(cubin: bytes) -> int | None:
    """Registers a thread, from cuobjdump (shipped with triton's NVIDIA backend) on the cubin."""
    tool = os.path.join(os.path.dirname(triton_rope.triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    m = re.search(r"REG:(\d+)", out)
    return int(m.group(1)) if m else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: H100/H200)")
    args = p.parse_args(argv)
    if triton_rope.triton is None:
        print("triton is not installed")
        return 1
    print(f"{'dtype':6}{'layout':13}{'cos/sin':9}{'regs':>6}  ld bytes      st bytes")
    for dtype, layout, angles in itertools.product(("fp32", "bf16"), ("half", "interleaved"), (True, False)):
        c = triton_rope.compile_offline(dtype, layout, angles, arch=args.arch)
        ptx = c.asm["ptx"]
        print(f"{dtype:6}{layout:13}{'angles' if angles else 'table':9}{registers(c.asm['cubin']) or '?':>6}  "
              f"{str(sorted(triton_rope.global_access_bytes(ptx, 'ld'))):13} "
              f"{sorted(triton_rope.global_access_bytes(ptx, 'st'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
