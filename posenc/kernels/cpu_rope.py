"""CPU RoPE at copy speed: a small C kernel built at first use, with a chunked eager fallback.

Why C through ctypes (see docs/performance.md for the measurements):
- RoPE is memory-bound; the limit is a copy of the same bytes. Eager PyTorch needs >= 4 passes over the data
  (mul, addcmul per half) and, for bf16, fp32 temporaries; one fused pass needs a compiled loop.
- ``rope_native.c`` uses no Python or torch headers, so it builds in about a second with any C compiler (``cc``,
  ``gcc`` or ``clang``; ``$CC`` wins) and needs no ninja. torch.compile needs a compiler too and compiles per
  shape/dtype (seconds each); a torch C++ extension compiles against torch's large headers and needs ninja.
- Built with -march=native (AVX-512/AVX2 speed up the bf16/fp16 conversions ~1.6x; a portable build if the
  compiler refuses) and cached in ``$POSENC_CACHE_DIR`` (default ``~/.cache/posenc``) under a hash of the source,
  compiler, flags and CPU model/features, written atomically so concurrent processes are safe.
- No compiler, a failed build, ``POSENC_NATIVE=0``, or an unsupported input (odd strides, float16 without
  compiler support) -> the eager fallback below, which is exact too: chunked over leading dims so its
  temporaries stay cache-sized, fp32 math for half-precision inputs.

Tensor shapes used throughout:
    x, out: [..., dim] (the last dim is the head dim; any leading dims: batch, heads, seq, ...)
    cos, sin: broadcastable to [..., rotary_dim // 2], float32 (float64 for float64 x)
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from importlib import resources

import torch

_DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2, torch.float16: 3}
_LAYOUT_CODES = {"interleaved": 0, "half": 1}
_DTYPE_BYTES = {torch.float32: 4, torch.float64: 8, torch.bfloat16: 2, torch.float16: 2}
_MAX_DIMS = 8                    # leading dims the C kernel takes after collapsing
_GRAIN = 1 << 16                 # elements per thread below which extra threads cost more than they save
_CHUNK = 1 << 18                 # elements per chunk in the eager fallback (1 MiB fp32: stays in L2)
_TABLE_BLOCK_BYTES = 1 << 20     # cos + sin rows kept in cache while every head uses them (256 KiB blocks were
                                 # 1.4x slower here: each head restarts the prefetcher every block)
_STREAM_BYTES = 8 << 20          # outputs at least this big bypass the cache (non-temporal stores)
# -std=c11 (ISO C) keeps a*b+c unfused (no FMA contraction): results match torch's eager ops bit for bit
_FLAGS = ["-O3", "-shared", "-fPIC", "-pthread", "-std=c11"]
_ARCH_FLAGS = ["-march=native"]

_lock = threading.Lock()
_plans: dict = {}                # geometry -> kernel launches (see _plan)
_state: dict = {"lib": None, "tried": False, "reason": None, "path": None, "build_seconds": None}


# ---------------------------------------------------------------------------------------------------------------
# building and loading the native kernel
# ---------------------------------------------------------------------------------------------------------------

def _cache_dir() -> str:
    root = os.environ.get("POSENC_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "posenc")
    return root


def _compiler() -> str | None:
    for cand in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def _cpu_fingerprint() -> str:
    """Identifies the CPU model/features, so a -march=native build is never loaded on a different CPU
    (a cache directory shared between machines)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def _build(source: str, cc: str) -> tuple[str, float | None]:
    """Compile ``source`` into the cache (if not there yet); return (path, seconds spent compiling or None).

    Tuned for this CPU first (-march=native: AVX-512/AVX2 matter for the bf16/fp16 conversions); if the compiler
    rejects that, a portable build.
    """
    key = hashlib.sha256("\0".join([source, cc, " ".join(_FLAGS + _ARCH_FLAGS), sys.platform,
                                    platform.machine(), _cpu_fingerprint()]).encode()).hexdigest()[:16]
    folder = _cache_dir()
    path = os.path.join(folder, f"posenc_rope_{key}.so")
    if os.path.exists(path):
        return path, None
    try:
        os.makedirs(folder, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise PermissionError(folder)
    except OSError:  # read-only home (some CI/containers): build into a per-user temp folder instead
        folder = os.path.join(tempfile.gettempdir(), f"posenc-cache-{os.getuid() if hasattr(os, 'getuid') else 0}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"posenc_rope_{key}.so")
        if os.path.exists(path):
            return path, None
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src = os.path.join(tmp, "rope_native.c")
        with open(src, "w") as f:
            f.write(source)
        lib = os.path.join(tmp, "rope.so")
        for flags in (_FLAGS + _ARCH_FLAGS, _FLAGS):
            proc = subprocess.run([cc, *flags, "-o", lib, src], capture_output=True, text=True, timeout=120)
            if proc.returncode == 0:
                break
        else:
            raise RuntimeError(f"{os.path.basename(cc)} failed: {proc.stderr.strip()[:500]}")
        os.replace(lib, path)    # atomic: a concurrent process sees the whole file or none
    return path, time.perf_counter() - t0


def _load():
    """The ctypes library, building it on first use; None (with the reason recorded) if unavailable."""
    if _state["tried"]:
        return _state["lib"]
    with _lock:
        if _state["tried"]:
            return _state["lib"]
        try:
            if os.environ.get("POSENC_NATIVE", "1") == "0":
                raise RuntimeError("disabled by POSENC_NATIVE=0")
            cc = _compiler()
            if cc is None:
                raise RuntimeError("no C compiler found (set $CC or install gcc/clang)")
            source = resources.files("posenc.kernels").joinpath("rope_native.c").read_text()
            path, seconds = _build(source, cc)
            lib = ctypes.CDLL(path)
            lib.posenc_rope.restype = ctypes.c_int
            i64p = ctypes.POINTER(ctypes.c_int64)
            lib.posenc_rope.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 6 + [i64p] * 4 + \
                [ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
            lib.posenc_rope_has_f16.restype = ctypes.c_int
            _state.update(lib=lib, path=path, build_seconds=seconds, has_f16=bool(lib.posenc_rope_has_f16()))
        except Exception as exc:  # any failure: the eager path is exact, only slower
            _state["reason"] = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"posenc: native CPU RoPE kernel unavailable ({_state['reason']}); "
                          "using the eager fallback (correct, slower)", RuntimeWarning, stacklevel=3)
        _state["tried"] = True
    return _state["lib"]


def native_available() -> bool:
    """True if the C kernel is built and loaded (building it now if needed)."""
    return _load() is not None


def native_info() -> dict:
    """What happened when loading the kernel: available, path, build_seconds (None if cached), reason."""
    _load()
    return {"available": _state["lib"] is not None, "path": _state["path"],
            "build_seconds": _state["build_seconds"], "reason": _state["reason"]}


# ---------------------------------------------------------------------------------------------------------------
# the native call
# ---------------------------------------------------------------------------------------------------------------

def _collapse(sizes, *strides_lists):
    """Drop size-1 dims and merge adjacent dims that are contiguous with each other in every tensor."""
    dims = [(s, *[st[i] for st in strides_lists]) for i, s in enumerate(sizes) if s != 1]
    if not dims:
        return [1], *[[0] for _ in strides_lists]
    merged = [list(dims[0])]
    for d in dims[1:]:
        prev = merged[-1]
        if all(prev[k] == d[k] * d[0] for k in range(1, len(d))):
            prev[0] *= d[0]
            for k in range(1, len(d)):
                prev[k] = d[k]
        else:
            merged.append(list(d))
    return [m[0] for m in merged], *[[m[k] for m in merged] for k in range(1, len(strides_lists) + 1)]


def _blocked(sizes, xs, os_, cs, block):
    """Reorder [..., H, T] (table broadcast over H, varying along T) into [..., T // block, H, block] so that one
    block of table rows stays in cache while every head uses it; the T % block leftover rows become a second
    launch. Yields (element offset along T, sizes, x strides, out strides, table strides) per launch."""
    k = len(sizes) - 1
    while k > 0 and cs[k - 1] == 0:
        k -= 1
    t = sizes[-1]
    if k == len(sizes) - 1 or cs[-1] == 0 or t < 2 * block or len(sizes) + 1 > _MAX_DIMS:
        yield 0, sizes, xs, os_, cs
        return
    n = t // block

    def split(st):
        return st[:k] + [st[-1] * block] + st[k:-1] + [st[-1]]
    yield 0, sizes[:k] + [n] + sizes[k:-1] + [block], split(xs), split(os_), split(cs)
    if t % block:
        yield n * block, sizes[:-1] + [t % block], xs, os_, cs


def _plan(shape, x_strides, out_strides, cs_strides, dtype, layout, rotary_dim, inverse, in_place, nthreads):
    """The kernel launches for one geometry: [(x/out element offset, table element offset, ctypes args)], or None
    if the kernel cannot address it. Cached: a decode loop calls with the same geometry every step."""
    key = (shape, x_strides, out_strides, cs_strides, dtype, layout, rotary_dim, inverse, in_place, nthreads)
    plan = _plans.get(key, False)
    if plan is not False:
        return plan
    sizes, xs, os_, cs = _collapse(list(shape[:-1]), list(x_strides[:-1]), list(out_strides[:-1]),
                                   list(cs_strides[:-1]))
    plan = None
    if len(sizes) <= _MAX_DIMS:
        csize = 8 if dtype == torch.float64 else 4
        numel = 1
        for n in shape:
            numel *= n
        # an output far bigger than the cache: non-temporal stores (see rope_native.c)
        stream = not in_place and numel * _DTYPE_BYTES[dtype] >= _STREAM_BYTES
        block = max(1, _TABLE_BLOCK_BYTES // (rotary_dim * csize))      # rows of cos + sin per block
        plan = []
        for t0, sz, xst, ost, cst in _blocked(sizes, xs, os_, cs, block):
            arr = ctypes.c_int64 * len(sz)
            args = (_DTYPE_CODES[dtype], _LAYOUT_CODES[layout], int(inverse), int(not in_place), int(stream),
                    len(sz), arr(*sz), arr(*xst), arr(*ost), arr(*cst), shape[-1], rotary_dim, nthreads)
            plan.append((t0 * xs[-1], t0 * os_[-1], t0 * cs[-1], args))
    if len(_plans) > 256:
        _plans.clear()
    _plans[key] = plan
    return plan


def _native_into(x, cos, sin, out, layout, rotary_dim, inverse) -> bool:
    """Run the C kernel if it can take these tensors; return False (nothing written) if it cannot."""
    lib = _state["lib"] if _state["tried"] else _load()
    dtype = x.dtype
    if lib is None or dtype not in _DTYPE_CODES or (dtype == torch.float16 and not _state.get("has_f16")):
        return False
    if cos.dtype != (torch.float64 if dtype == torch.float64 else torch.float32) or sin.dtype != cos.dtype:
        return False
    xst, ost, cst = x.stride(), out.stride(), cos.stride()
    if xst[-1] != 1 or ost[-1] != 1 or cst[-1] != 1 or cst != sin.stride():
        return False
    xp, op = x.data_ptr(), out.data_ptr()
    nthreads = max(1, min(torch.get_num_threads(), x.numel() // _GRAIN))
    plan = _plan(x.shape, xst, ost, cst, dtype, layout, rotary_dim, inverse, xp == op, nthreads)
    if plan is None:
        return False
    esize, csize = x.element_size(), cos.element_size()
    cp, sp = cos.data_ptr(), sin.data_ptr()
    for xoff, ooff, coff, args in plan:
        rc = lib.posenc_rope(xp + xoff * esize, op + ooff * esize, cp + coff * csize, sp + coff * csize, *args)
        if rc != 0:
            raise RuntimeError(f"posenc native RoPE kernel failed with code {rc}")
    return True


# ---------------------------------------------------------------------------------------------------------------
# the eager fallback: fused out= ops over cache-sized chunks
# ---------------------------------------------------------------------------------------------------------------

def _chunks(x, out, cos, sin, dim: int = 0):
    """Yield aligned slices of (x, out, cos, sin) with about _CHUNK elements each, split along leading dims."""
    if x.numel() <= _CHUNK or dim >= x.dim() - 1:
        yield x, out, cos, sin
        return
    n = x.shape[dim]
    step = max(1, n * _CHUNK // x.numel())
    for i in range(0, n, step):
        sl = (slice(None),) * dim + (slice(i, i + step),)
        yield from _chunks(x[sl], out[sl], cos[sl], sin[sl], dim + 1)


def _pairs(t: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    h = t.shape[-1] // 2
    return (t[..., 0::2], t[..., 1::2]) if layout == "interleaved" else (t[..., :h], t[..., h:])


def eager_rope_into(x, cos, sin, out, layout: str, rotary_dim: int, inverse: bool = False) -> torch.Tensor:
    """out = RoPE(x) with plain torch ops, chunk by chunk; ``out`` may be ``x`` (in place). Any device."""
    cos = cos.expand(*x.shape[:-1], rotary_dim // 2)
    sin = sin.expand(*x.shape[:-1], rotary_dim // 2)
    in_place = out.data_ptr() == x.data_ptr()
    sign = -1.0 if inverse else 1.0
    for xc, oc, cc, sc in _chunks(x, out, cos, sin):
        src = xc[..., :rotary_dim]
        if src.dtype != cc.dtype or in_place:
            src = src.to(cc.dtype, copy=True)         # chunk-sized: fp32 math, and safe to overwrite xc
        direct = oc.dtype == cc.dtype
        dst = oc[..., :rotary_dim] if direct else torch.empty_like(src)
        a, b = _pairs(src, layout)
        da, db = _pairs(dst, layout)
        torch.mul(a, cc, out=da)
        da.addcmul_(b, sc, value=-sign)               # a cos - b sin
        torch.mul(b, cc, out=db)
        db.addcmul_(a, sc, value=sign)                # b cos + a sin
        if not direct:
            oc[..., :rotary_dim].copy_(dst)
        if not in_place and rotary_dim < x.shape[-1]:
            oc[..., rotary_dim:].copy_(xc[..., rotary_dim:])
    return out


# ---------------------------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------------------------

def rope_into(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor, *, layout: str,
              rotary_dim: int, inverse: bool = False, native: bool | None = None) -> torch.Tensor:
    """Write RoPE(x) into ``out`` (which may be ``x`` itself for in place) and return ``out``.

    x, out: [..., dim] same shape and dtype; cos, sin: broadcastable to [..., rotary_dim // 2] in the math dtype.
    ``inverse`` rotates by minus the angle (the backward pass). ``native``: None = C kernel when possible,
    False = eager only (tests/benchmarks), True = require the C kernel.
    Inputs are not checked here beyond what the kernel needs: posenc.rope.apply validates user input.
    """
    cos = cos.expand(*x.shape[:-1], rotary_dim // 2)
    sin = sin.expand(*x.shape[:-1], rotary_dim // 2)
    if x.device.type == "cpu" and native is not False:
        if _native_into(x, cos, sin, out, layout, rotary_dim, inverse):
            return out
        if native:
            raise RuntimeError(f"native RoPE kernel cannot take this input ({native_info()['reason'] or 'layout'})")
    return eager_rope_into(x, cos, sin, out, layout, rotary_dim, inverse)
