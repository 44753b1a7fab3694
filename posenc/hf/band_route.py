"""Plain evaluation of a model with sliding-window layers (Gemma 3's local layers, Mistral-style windows): those
layers cost their band, the full-attention layers run transformers' sdpa unchanged.

transformers' sdpa gives a sliding layer the whole [T, T] square with a mask (at 64k tokens and a 512 window, 128x
the work inside the window). ``use_band_route(model)`` registers ``posenc_band`` with transformers' AttentionInterface
(``posenc.hf.attention_interface.register``: sdpa's mask function under the same name, so the masks are
the ones sdpa gets) and points the model's ``config._attn_implementation`` at it. Its forward,
``band_sdpa_forward``, hands every call to transformers' own ``sdpa_attention_forward`` with the same arguments,
except a sliding layer's call that ``band_applies`` accepts, which runs ``posenc.attention.kernel.band_attention``
over the keys inside the window.

Unlike ``posenc.patch(method=...)`` nothing about positions changes: transformers has rotated q and k already (the
cache holds rotated keys, as for sdpa), and the band kernel is called with ``inv_freq=None`` (no rotation). The band
runs only when the result is the masked square's (within rounding): inference (no autograd, no dropout, no
softcap), eager (not under torch.compile), CPU tensors of float32/bf16/fp16 (``band_in_one_call``: elsewhere the
kernel's exact fallback is no faster than sdpa), more keys than the window (else sdpa is already the band), and
transformers' mask the plain sliding one (``posenc.hf.attention_interface.is_band_mask``: a padded batch falls back to sdpa with that mask).
A model without sliding layers is left as it is: sdpa, bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

IMPLEMENTATION = "posenc_band"
PATH = "sdpa (sliding layers: band_attention over the window)"


def has_sliding_layers(config) -> bool:
    """Whether a transformers config gives some layer a sliding window: ``sliding_window`` set and, where the config
    lists its layers' kinds (``layer_types``: Gemma 3, Qwen2), at least one "sliding_attention"; a config with a
    window and no kinds (Mistral) slides every layer."""
    if not getattr(config, "sliding_window", None):
        return False
    kinds = getattr(config, "layer_types", None)
    return True if not kinds else "sliding_attention" in kinds


def band_applies(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
                 kwargs: dict) -> int | None:
    """The window when this attention call (query [B, Hq, Tq, D], key/value [B, Hk, Tk, D], transformers' mask
    [B, 1, Tq, Tk] or None) is one the band kernel computes exactly as sdpa would; None to leave it to sdpa."""
    from posenc.attention.kernel import band_in_one_call
    from posenc.hf.attention_interface import is_band_mask

    window = kwargs.get("sliding_window")
    if window is None or key.shape[-2] <= int(window) or not isinstance(attention_mask, torch.Tensor):
        return None          # a full layer, or every key inside the window: sdpa already does only the band's work
    if (kwargs.get("dropout") or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
            or kwargs.get("is_causal") is False):
        return None          # sdpa's own behaviour (dropout, its refusal of a softcap) is kept
    if torch.compiler.is_compiling() or not getattr(module, "is_causal", True) or not band_in_one_call(query, key,
                                                                                                     value):
        return None
    t_q, t_k = query.shape[-2], key.shape[-2]
    return int(window) if is_band_mask(attention_mask, t_q, t_k, int(window)) else None


def band_sdpa_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, **kwargs):
    """transformers' attention-function interface: query [B, Hq, Tq, D], key/value [B, Hk, Tk, D] (rotated by the
    model) -> (output [B, Tq, Hq, Dv], None). A sliding layer's call that ``band_applies`` accepts runs the band
    kernel; every other call is transformers' ``sdpa_attention_forward`` with the same arguments."""
    window = band_applies(module, query, key, value, attention_mask, kwargs)
    if window is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    from posenc.attention import kernel

    # (the module attribute, looked up per call: tests count the calls by replacing it)
    out = kernel.band_attention(query, key, value, window, None, scale=kwargs.get("scaling"))
    return out.transpose(1, 2).contiguous(), None


def use_band_route(model: nn.Module, enabled: bool = True) -> bool:
    """Point ``model`` (loaded with transformers' sdpa) at ``posenc_band`` when its config has sliding-window layers
    and ``enabled`` (``posenc eval --no-band-attention`` passes False) and its weights are CPU float32/bf16/fp16;
    True when it did. Any other model, or one loaded with another implementation (eager, flash), is left as it is."""
    config = model.config
    if not enabled or getattr(config, "_attn_implementation", None) != "sdpa" or not has_sliding_layers(config):
        return False
    # where the band kernel's one-call path cannot run (a GPU, float64) every call would fall back to sdpa: leave the
    # model as it is, so that its recorded attention path is the code that runs
    if not all(p.device.type == "cpu" and p.dtype in (torch.float32, torch.bfloat16, torch.float16)
               for p in model.parameters() if p.is_floating_point()):
        return False
    from posenc.hf.attention_interface import register

    register(IMPLEMENTATION, band_sdpa_forward)
    config._attn_implementation = IMPLEMENTATION
    return True
