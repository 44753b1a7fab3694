"""Fast kernels behind posenc's math: callers use posenc.apply_rope / posenc.alibi, never a kernel by hand.

    rope         dispatch (Triton on CUDA, C kernel on CPU, eager elsewhere) + autograd   (posenc.kernels.rope_dispatch)
    rope_checks  torch's memory rules for RoPE writes (overlap, aliasing), its errors     (posenc.kernels.rope_checks)
    cpu_rope     CPU RoPE: C kernel built at first use, chunked eager fallback           (posenc.kernels.cpu_rope)
    triton_rope  GPU RoPE in Triton: q and k in one launch                               (posenc.kernels.triton_rope)
    alibi_attention  ALiBi attention without the N^2 bias                            (posenc.kernels.alibi_attention)
    alibi_band   ALiBi's steep heads over a band of keys, exact below rounding        (posenc.kernels.alibi_band)

Submodules load lazily so that importing posenc never imports triton or builds anything.
"""

from __future__ import annotations

from posenc._internal.lazy import lazy_exports

_EXPORTS = {
    "rope": "posenc.kernels.rope_dispatch",
    "native_info": "posenc.kernels.cpu_rope",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
