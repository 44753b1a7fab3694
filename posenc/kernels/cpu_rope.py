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
- No compiler, a failed build, ``POSENC_NATIVE=0`` (or ``eager_only()`` in tests), or an unsupported input (odd
  strides, float16 without compiler support) -> the eager fallback below, which is exact too: chunked over leading
  dims so its temporaries stay cache-sized, fp32 math for half-precision inputs.
- Per-call cost matters as much as bandwidth (a decode step rotates 40 vectors): q and k go through one ctypes call
  with plain pointer arguments, the launch geometry is cached per shape, and the kernel reads each vector's cos/sin
  row of a cached table through its position (no gathered copy), range-checking the positions itself.

Tensor shapes used throughout:
    x, out: [..., dim] (the last dim is the head dim; any leading dims: batch, heads, seq, ...)
    cos, sin: broadcastable to [..., rotary_dim // 2], float32 (float64 for float64 x); or, with ``index`` (int64
        positions broadcastable to x's leading dims), a contiguous table [rows, rotary_dim // 2]
"""

from __future__ import annotations

import contextlib
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

from posenc.kernels.rope_checks import TableIndexError

_STRIDED = torch.strided
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
_force = {"eager": False}        # eager_only(): the fallback even where the C kernel is loaded
_tracing = torch._C._get_tracing_state   # torch.jit.trace recording: kernels are invisible to it
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


class _Launch(ctypes.Structure):
    """Mirror of rope_native.c's launch_t: one launch's geometry (pointers are passed per call)."""
    _fields_ = [(name, ctypes.c_int32) for name in
                ("which", "dtype", "layout", "inverse", "copy_tail", "stream", "ndim", "nthreads")] + \
               [(name, ctypes.c_int64) for name in ("x_off", "out_off", "table_off", "dim", "rdim")] + \
               [(name, ctypes.c_int64 * _MAX_DIMS) for name in ("sizes", "xs", "os", "cs")]


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
            lib.posenc_rope_run.restype = ctypes.c_int
            lib.posenc_rope_run.argtypes = [ctypes.c_int, ctypes.POINTER(_Launch)] + [ctypes.c_void_p] * 7 + \
                [ctypes.c_int64] * 2
            lib.posenc_rope_has_f16.restype = ctypes.c_int
            _state.update(lib=lib, run=lib.posenc_rope_run, path=path, build_seconds=seconds,
                          has_f16=bool(lib.posenc_rope_has_f16()))
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

def collapse_dims(sizes, *strides_lists):
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


def _table_strides(table_shape, table_stride, lead_ndim: int) -> list[int]:
    """Element strides of a table (or position index) broadcast against ``lead_ndim`` leading dims, aligned from
    the right; broadcast (size-1 or missing) dims get stride 0."""
    out = [0] * lead_ndim
    for i in range(1, min(len(table_shape), lead_ndim) + 1):
        out[-i] = 0 if table_shape[-i] == 1 else table_stride[-i]
    return out


def _plan(xs, outs, cos, sin, index, dtype, layout, rotary_dim, inverse):
    """The kernel launches for one geometry: (ctypes array of _Launch, count), or None if the kernel cannot take
    these tensors (the eager fallback runs instead). Everything checked here is part of the cache key."""
    if dtype not in _DTYPE_CODES or (dtype == torch.float16 and not _state.get("has_f16")) or len(xs) > 2:
        return None
    if cos.dtype != (torch.float64 if dtype == torch.float64 else torch.float32) or sin.dtype != cos.dtype:
        return None
    cst = cos.stride()
    if cst[-1] != 1 or cst != sin.stride():
        return None
    if index is None:
        table_geom = (cos.shape[:-1], cst[:-1])
    elif cos.dim() != 2 or cst[0] != cos.shape[1] or index.dtype != torch.int64 or not index.is_contiguous():
        return None
    else:
        table_geom = (index.shape, index.stride())
    csize = 8 if dtype == torch.float64 else 4
    block = max(1, _TABLE_BLOCK_BYTES // (rotary_dim * csize))      # rows of cos + sin per block
    threads = torch.get_num_threads()
    launches = []
    for which, (x, o) in enumerate(zip(xs, outs)):
        shape, x_strides, out_strides = x.shape, x.stride(), o.stride()
        if x_strides[-1] != 1 or out_strides[-1] != 1:
            return None
        in_place = x.data_ptr() == o.data_ptr()
        lead = len(shape) - 1
        sizes, xs_, os_, cs = collapse_dims(list(shape[:-1]), list(x_strides[:-1]), list(out_strides[:-1]),
                                        _table_strides(table_geom[0], table_geom[1], lead))
        if len(sizes) > _MAX_DIMS:
            return None
        numel = x.numel()
        nthreads = max(1, min(threads, numel // _GRAIN))
        # an output far bigger than the cache: non-temporal stores (see rope_native.c)
        stream = not in_place and numel * _DTYPE_BYTES[dtype] >= _STREAM_BYTES
        for t0, sz, xst, ost, cst_ in _blocked(sizes, xs_, os_, cs, block):
            launch = _Launch(which, _DTYPE_CODES[dtype], _LAYOUT_CODES[layout], int(inverse), int(not in_place),
                             int(stream), len(sz), nthreads, t0 * xs_[-1], t0 * os_[-1], t0 * cs[-1], shape[-1],
                             rotary_dim)
            launch.sizes[:len(sz)], launch.xs[:len(sz)], launch.os[:len(sz)], launch.cs[:len(sz)] = sz, xst, ost, cst_
            launches.append(launch)
    return (_Launch * len(launches))(*launches), len(launches)


def native_rope(xs, outs, cos, sin, index, layout: str, rotary_dim: int, inverse: bool) -> bool:
    """Run the C kernel on every (xs[i] -> outs[i]) in one call if it can take them; False (nothing written) if not.

    Without ``index``: cos, sin [..., rotary_dim // 2] broadcastable against each x's leading dims. With ``index``
    (int64, contiguous, broadcastable against the leading dims): cos, sin are a contiguous [rows, rotary_dim // 2]
    table and row index[...] of it rotates each vector; a position outside [0, rows) raises TableIndexError before
    anything is written. All tensors share one dtype; the table is in the math dtype. At most two tensors (q, k).

    This is the decode hot path: one flat cache key (shapes, strides, dtypes: whatever the plan depends on), then
    one ctypes call with plain pointer arguments.
    """
    lib = _state["lib"]
    if lib is None:
        if _state["tried"] or _load() is None:
            return False
        lib = _state["lib"]
    if _force["eager"] or _tracing():
        return False
    x0, o0 = xs[0], outs[0]
    p0, q0 = x0.data_ptr(), o0.data_ptr()
    two = len(xs) == 2
    if two:
        x1, o1 = xs[1], outs[1]
        p1, q1 = x1.data_ptr(), o1.data_ptr()
    else:
        p1 = q1 = 0
    # the cache key: everything the plan depends on; contiguous tensors are keyed by their shapes alone
    if x0.is_contiguous() and o0.is_contiguous() and (not two or x1.is_contiguous() and o1.is_contiguous()):
        geo = (x0.shape, p0 == q0, x1.shape, p1 == q1) if two else (x0.shape, p0 == q0)
    elif two:
        geo = (x0.shape, x0.stride(), o0.stride(), p0 == q0, x1.shape, x1.stride(), o1.stride(), p1 == q1)
    else:
        geo = (x0.shape, x0.stride(), o0.stride(), p0 == q0)
    if index is None:
        key = (geo, x0.dtype, cos.dtype, cos.shape, cos.stride(), sin.stride(), layout, rotary_dim, inverse,
               torch.get_num_threads())
    elif cos.is_contiguous() and sin.is_contiguous() and index.is_contiguous():
        key = (geo, x0.dtype, cos.dtype, cos.shape[1], index.dtype, index.shape, layout, rotary_dim, inverse,
               torch.get_num_threads())
    else:
        return False          # (the index path needs a contiguous table and index)
    plan = _plans.get(key, False)
    if plan is False:
        plan = _plan(xs, outs, cos, sin, index, x0.dtype, layout, rotary_dim, inverse)
        if len(_plans) > 256:
            _plans.clear()
        _plans[key] = plan
    if plan is None:
        return False
    if index is None:
        rc = lib.posenc_rope_run(plan[1], plan[0], p0, q0, p1, q1, cos.data_ptr(), sin.data_ptr(), None, 0, 0)
    else:
        rc = lib.posenc_rope_run(plan[1], plan[0], p0, q0, p1, q1, cos.data_ptr(), sin.data_ptr(), index.data_ptr(),
                                 index.numel(), cos.shape[0])
    if rc:
        if rc == 4:
            raise TableIndexError(f"positions must lie in [0, {cos.shape[0]}) to index the cos/sin table")
        _failed(rc)
    return True


def _failed(rc: int):
    raise RuntimeError(f"posenc native RoPE kernel failed with code {rc}")


# ---------------------------------------------------------------------------------------------------------------
# the decode fast path: q and k into fresh outputs at rows of a cached table
# ---------------------------------------------------------------------------------------------------------------

class DecodePlans:
    """The decode fast path's one cache, bounded (cleared whole when full), holding two kinds of entries:

    - kernel plans by geometry (``qk_plan``): the launch geometry ``run_qk`` needs, one per shape/dtype/layout;
    - checked calls (``recall`` / ``remember``): a caller's key -> (plan, table) for a call the caller
      (posenc.rope.apply's functions, posenc.Rotary) has checked once and sent to the kernel, so that a repeat
      skips to it. The key holds everything the caller's checks depended on (its first element names the caller:
      "apply", or a Rotary's own token); ``table`` is what the caller re-checks on every call before trusting the
      plan (apply: its TABLES key; Rotary: a weak reference to its cos table).
    """

    def __init__(self, limit: int = 256):
        self.limit = limit
        self._entries: dict = {}
        self.recall = self._entries.get         # key -> (plan, table) or None (bound once: a decode step calls it)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def remember(self, key, plan, table) -> None:
        self._store(key, (plan, table))

    def _store(self, key, value) -> None:
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[key] = value


PLANS = DecodePlans()


def qk_plan(q, k, cos, sin, index, layout: str, rotary_dim: int, inplace: bool = False):
    """The cached kernel plan for ``run_qk`` on tensors of this geometry, writing separate contiguous outputs (or,
    with ``inplace``, q and k themselves); None where the kernel cannot take them (no compiler, ``eager_only()``,
    an unsupported dtype): the caller then takes the general path. ``k`` None: a plan for q alone (apply_rope).

    The caller promises what posenc.rope.apply and posenc.Rotary have checked: q [..., Hq, T, D] and k
    [..., Hk, T, D] contiguous CPU tensors of one dtype; index int64, contiguous, broadcastable to their leading
    dims; cos, sin a contiguous [rows, rotary_dim // 2] table in the math dtype. Contiguous tensors of one shape
    share one geometry, so shapes (not strides) key the cache, as in ``native_rope``.
    """
    if _force["eager"]:
        return None
    key = ("plan", q.shape, None if k is None else k.shape, q.dtype, index.shape, cos.shape[1], layout, rotary_dim,
           inplace, torch.get_num_threads())
    plan = PLANS.recall(key, False)
    if plan is False:
        if _state["lib"] is None and (_state["tried"] or _load() is None):
            return None
        xs = (q,) if k is None else (q, k)
        outs = xs if inplace else tuple(torch.empty_like(x) for x in xs)
        plan = _plan(xs, outs, cos, sin, index, q.dtype, layout, rotary_dim, False)
        PLANS._store(key, plan)
    return plan


def run_qk(plan, q, k, q_out, k_out, cos, sin, index) -> bool:
    """Write RoPE(q), RoPE(k) into q_out, k_out (q and k themselves for an in-place plan) with a ``qk_plan`` plan
    made for this geometry (k and k_out None for a plan of q alone). False, with nothing written, when a position
    lies outside the table, ``eager_only()`` is on or torch.jit.trace is recording (it cannot see the kernel): the
    caller takes the general path. Aliasing is the caller's to have ruled out."""
    if _force["eager"] or _tracing():
        return False
    rc = _state["run"](plan[1], plan[0], q.data_ptr(), q_out.data_ptr(), 0 if k is None else k.data_ptr(),
                       0 if k_out is None else k_out.data_ptr(), cos.data_ptr(), sin.data_ptr(), index.data_ptr(),
                       index.numel(), cos.shape[0])
    if rc:
        if rc == 4:
            return False
        _failed(rc)
    return True


def run_fresh_qk(plan, q, k, cos, sin, index):
    """(RoPE(q), RoPE(k)) as new tensors through a ``qk_plan`` plan (not in place), or (RoPE(q),) for a plan of q
    alone (k None); None where ``run_qk`` is False."""
    if k is None:
        q_out = torch.empty_like(q)
        return (q_out,) if run_qk(plan, q, None, q_out, None, cos, sin, index) else None
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    return (q_out, k_out) if run_qk(plan, q, k, q_out, k_out, cos, sin, index) else None


def plain_cpu(a, b, positions=None) -> bool:
    """Whether q and k (or the out= tensors) and the positions are what the fast path (``qk_plan``) takes: dense
    contiguous CPU tensors that do not require grad and are not negated views. Anything else (autograd, other
    devices, strides or layouts, negated views) takes the general path. (Written out, not looped: a decode step
    calls it.)"""
    ok = (a.is_cpu and b.is_cpu and a.layout is _STRIDED and b.layout is _STRIDED and a.is_contiguous()
          and b.is_contiguous() and not (a.requires_grad or b.requires_grad or a.is_neg() or b.is_neg()))
    if positions is None or not ok:
        return ok
    return positions.is_cpu and positions.is_contiguous() and not positions.is_neg()


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


def gather_table(cos: torch.Tensor, sin: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows index[...] of a [rows, R/2] table, as [*index.shape, R/2]; TableIndexError for a position outside it."""
    rows = cos.shape[0]
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= rows):
        raise TableIndexError(f"positions must lie in [0, {rows}) to index the cos/sin table")
    flat = index.reshape(-1)
    return (cos.index_select(0, flat).view(*index.shape, cos.shape[-1]),
            sin.index_select(0, flat).view(*index.shape, sin.shape[-1]))


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
        # each product rounded, then the sum: the C kernel's arithmetic (addcmul may fuse into one FMA rounding)
        tmp = torch.mul(b, sc)
        torch.mul(a, cc, out=da)
        da.sub_(tmp) if sign > 0 else da.add_(tmp)    # a cos - b sin
        torch.mul(a, sc, out=tmp)
        torch.mul(b, cc, out=db)
        db.add_(tmp) if sign > 0 else db.sub_(tmp)    # b cos + a sin
        if not direct:
            oc[..., :rotary_dim].copy_(dst)
        if not in_place and rotary_dim < x.shape[-1]:
            oc[..., rotary_dim:].copy_(xc[..., rotary_dim:])
    return out


# ---------------------------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------------------------

def rope_many(xs, outs, cos, sin, *, layout: str, rotary_dim: int, inverse: bool = False,
              index: torch.Tensor | None = None) -> None:
    """Write RoPE(xs[i]) into outs[i] for every i (outs[i] may be xs[i]: in place): the C kernel in one call when
    it can take the tensors, else the eager fallback. See ``native_rope`` for cos/sin/index."""
    if xs[0].is_cpu and len(xs) <= 2 and native_rope(xs, outs, cos, sin, index, layout, rotary_dim, inverse):
        return
    if index is not None:
        cos, sin = gather_table(cos, sin, index)
    for x, o in zip(xs, outs):
        eager_rope_into(x, cos, sin, o, layout, rotary_dim, inverse)


def rope_into(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor, *, layout: str,
              rotary_dim: int, inverse: bool = False, native: bool | None = None,
              index: torch.Tensor | None = None) -> torch.Tensor:
    """Write RoPE(x) into ``out`` (which may be ``x`` itself for in place) and return ``out``.

    x, out: [..., dim] same shape and dtype; cos, sin: broadcastable to [..., rotary_dim // 2] in the math dtype
    (or, with ``index``, a [rows, rotary_dim // 2] table indexed by it). ``inverse`` rotates by minus the angle (the
    backward pass). ``native``: None = C kernel when possible, False = eager only (tests/benchmarks), True =
    require the C kernel. Inputs are not checked here beyond what the kernel needs: posenc.rope.apply validates
    user input (and posenc.kernels.rope_dispatch the aliasing rules).
    """
    if index is not None:
        index = index.contiguous()
    if x.device.type == "cpu" and native is not False:
        if native_rope((x,), (out,), cos, sin, index, layout, rotary_dim, inverse):
            return out
        if native:
            raise RuntimeError(f"native RoPE kernel cannot take this input ({native_info()['reason'] or 'layout'})")
    if index is not None:
        cos, sin = gather_table(cos, sin, index)
    return eager_rope_into(x, cos, sin, out, layout, rotary_dim, inverse)


@contextlib.contextmanager
def eager_only():
    """Run the eager fallback instead of the C kernel inside this block (tests compare the two backends; users set
    ``POSENC_NATIVE=0`` for the whole process)."""
    previous = _force["eager"]
    _force["eager"] = True
    try:
        yield
    finally:
        _force["eager"] = previous
