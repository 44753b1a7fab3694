"""Query temperatures that grow with the log of the position (each formula's one owner, below posenc.rope and
posenc.irope, which read them):

    Llama 4, NoPE layers only:     tau(n) = 1 + attn_scale * log1p(floor((n + 1) / floor_scale))
    Ministral 3, every layer:      tau(n) = 1 + beta * ln(1 + floor(n / original))        (llama_4_scaling_beta)
    log-length (Qwen's logn):      tau(n) = max(1, ln(n + 1) / ln(L))                      (the lab's rnope-swa)
    Mistral Large 4, every layer:  tau_h(n) = scale_h * ln(n + 1) + bias_h                 (learned per head)

n = the query's absolute position (transformers ``models/llama4``, arXiv 2501.19399; ``models/ministral3``). Both
are 1 for short contexts; they differ in the floor (n + 1 against n) and in which layers they scale.
"""

from __future__ import annotations

import math

import torch

from posenc._internal.validate import check_float
from posenc._internal.errors import PosencError
from posenc.positions import as_positions


def attention_temperature(positions, *, floor_scale: float = 8192, attn_scale: float = 0.1) -> torch.Tensor:
    """tau(n) = 1 + attn_scale * log1p(floor((n + 1) / floor_scale)), float32 with positions' shape.

    Float32 arithmetic in transformers' order (positions are exact in float32 up to 2^24 = 16.7M), so the
    values equal Llama 4's bit for bit.
    """
    floor_scale = check_float(floor_scale, "floor_scale", positive=True)
    attn_scale = check_float(attn_scale, "attn_scale", min=0.0)  # below 0 the temperature falls through 0
    positions = as_positions(positions)
    if positions.numel() and positions.device.type != "meta" and bool((positions < 0).any()):
        # log1p(floor((n + 1) / floor_scale)) is NaN or -inf below -1: absolute positions start at 0
        raise PosencError(f"positions must be >= 0 (absolute positions), got {positions.min().item()}")
    return torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0


def query_temperature(positions, *, beta: float, original: int) -> torch.Tensor:
    """Ministral 3's query temperature (``llama_4_scaling_beta``): tau(n) = 1 + beta * ln(1 + floor(n / original)),
    float32 with positions' shape.

    transformers ``models/ministral3`` (and ``mistral4``) multiply q by it on every layer, after RoPE, with
    original = the RoPE parameters' original_max_position_embeddings. Unlike Llama 4's rule above it divides the
    position itself (not n + 1) and acts on every layer, not NoPE layers only: tau is 1 for n < original and steps
    up at each multiple of it. The arithmetic follows transformers' order in float32, so the values match bit for bit.
    """
    beta = check_float(beta, "llama_4_scaling_beta", min=0.0)
    original = check_float(original, "original_max_position_embeddings", positive=True)
    positions = as_positions(positions)
    if positions.numel() and positions.device.type != "meta" and bool((positions < 0).any()):
        raise PosencError(f"positions must be >= 0 (absolute positions), got {positions.min().item()}")
    return 1 + beta * torch.log(1 + torch.floor(positions / original))


def log_length_temperature(positions, *, trained: int) -> torch.Tensor:
    """tau(n) = ln(n + 1) / ln(trained) past the trained length, 1 inside it, float32 with positions' shape.

    The log-length query scaling of Qwen (``use_logn_attn``: log base L of the 1-based position) and of the
    NoPE/RoPE hybrids that scale their global layers' logits at inference (SWAN-GPT, Puvvada et al. 2025): a query
    at n keeps the softmax's sharpness as the number of keys grows past what training saw.
    """
    trained = check_float(trained, "trained (the training length)", min=2.0)   # ln(1) = 0 divides
    positions = as_positions(positions)
    if positions.numel() and positions.device.type != "meta" and bool((positions < 0).any()):
        raise PosencError(f"positions must be >= 0 (absolute positions), got {positions.min().item()}")
    return torch.clamp(torch.log(positions.float() + 1.0) / math.log(trained), min=1.0)


def log_position_scale(positions, scale, bias) -> torch.Tensor:
    """Mistral Large 4's learned query scale: tau_h(n) = scale_h * ln(n + 1) + bias_h, one per head and position.

    transformers ``models/mistral_large4`` (MistralLarge4TextSoftmaxScaling) multiplies q by it on every layer,
    RoPE and NoPE alike, after RoPE; scale and bias are the checkpoint's per-head weights (``softmax_scaling.scale``
    and ``.bias``; 0 and 1 leave q unchanged). positions: [..., seq] absolute positions; scale, bias: [heads].
    Returns [..., heads, seq] in scale's dtype, computed in transformers' order (ln in float32, then scale's dtype).
    """
    positions = as_positions(positions)
    if positions.numel() and positions.device.type != "meta" and bool((positions < 0).any()):
        raise PosencError(f"positions must be >= 0 (absolute positions), got {positions.min().item()}")
    scale, bias = torch.as_tensor(scale), torch.as_tensor(bias)
    if scale.dim() != 1 or bias.shape != scale.shape:
        raise PosencError(f"scale and bias must be one value per head, got shapes {tuple(scale.shape)} and "
                          f"{tuple(bias.shape)}")
    log_position = (positions + 1).float().log().to(scale.dtype)
    return scale[:, None] * log_position[..., None, :] + bias[:, None]
