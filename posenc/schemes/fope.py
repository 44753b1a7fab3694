"""``fope``: FoPE (Hua et al. 2024, "Fourier Position Embedding: Enhancing Attention's Periodic Extension for Length
Generalization", arXiv 2412.17739): each rotary pair's cos and sin become a Fourier series over the kept frequencies,
and the frequencies too low to turn once within the training length are clipped to zero.

    w_k    = theta^(-2k/d), kept iff w_k >= 2 pi / L (L = max_len, the training length)   (rope type ``fope``)
    cos'_j(n) = sum_k C_cos[l, h, k, j] cos(n w_k),   sin'_j(n) = sum_k C_sin[l, h, k, j] sin(n w_k)   (j kept)
    cos'_j = 1, sin'_j = 0 for a clipped pair j (no position: a constant channel)
    q'_j = (a cos'_j - b sin'_j, a sin'_j + b cos'_j) for the pair (a, b) = (x_j, x_{j + d/2}) ("half" layout)

C_cos and C_sin ([n_layers, n_heads, K, K], K = kept pairs) are learned, start at the identity plus Gaussian noise,
and are the same for q and k (the rotation of a token depends on its position only, so the KV cache holds rotated
keys). With C = identity FoPE is RoPE at the clipped frequencies. Since C mixes frequencies, q'.k' is not a function
of the distance alone: FoPE gives up exact relative position for robustness to the spectral leakage the paper
describes (linear layers and activations spread each pair's single frequency over others).

The authors' code (github.com/TsinghuaC3I/Fourier-Position-Embedding, ``olmo/model.py``, ``FourierEmbedding``, read
for this module) and what differs here:

- Coefficients: separate for sin and cos (``fourier_separate_basis``), separate per head (``fourier_separate_head``),
  one module per layer, shared by q and k; shape [heads, K, min(K, head_dim // 4)], no normalisation
  (``fourier_norm`` off). Here the output keeps all K kept pairs ([heads, K, K]): their cap at head_dim // 4 (a
  "TODO" in their code) turns kept pairs past it into constants too, and is not part of the paper's formula.
- Init ("eye_xavier_norm", their configs): ``xavier_normal_`` with gain sigma on the [heads, K, K] tensor (std =
  sigma * sqrt(2 / (K * K + heads * K)) by torch's fan rule, not sigma itself), plus the identity, which stays part
  of the learned matrix. Their configs use gain 0.3 / 0.4 / 0.6 for the 60M / 180M / 1.2B models. The same here,
  ``fope_sigma`` = the gain (default 0.3).
- Clipping: inv_freq < 2 pi / max_sequence_length set to 0 (``rope_clamp_floor_freq``, ``..._to_zero``), and the
  zero frequencies dropped from the series (``fourier_ignore_zero``). The same here (``fope_clip``).
- Clipped pairs: their code pads the clipped pairs' cos AND sin with 1, a fixed position-independent map
  (a - b, a + b); here cos = 1, sin = 0 (the identity), as the paper describes zeroed frequencies. In q.k the two
  differ only by a factor 2 on those channels, which the projections absorb.
- Learnability: their ``fourier_learnable`` defaults to False and their released configs do not set it, so their
  coefficients stay at the random init. Here they are learned by default; ``fope_learnable=False`` freezes them.

Not extendable: the clipping is the method's own answer to lengths past L, and an extension method's rope type
would replace the clipped frequencies. Options: ``fope_sigma`` (0.3), ``fope_clip`` (True), ``fope_learnable`` (True).
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from posenc._internal.validate import check_bool, check_choice, check_float, even_int, positive_int
from posenc._internal.errors import ConfigError
from posenc.angles import angles_cos_sin
from posenc.rope.apply import LAYOUTS, math_dtype
from posenc.rope.scaling import rope_parameters
from posenc.schemes.base import AttentionContext, Scheme
from posenc.schemes.registry import register_scheme


@register_scheme("fope")
class FoPEScheme(Scheme):
    """RoPE whose pairs take a learned Fourier series of the kept frequencies; floor frequencies clipped (FoPE)."""

    name = "fope"
    rotates = True
    extendable = False
    float32_buffers = ("kept_freq",)

    def __init__(self, head_dim: int, n_heads: int, n_layers: int, *, rope_base: float = 10000.0,
                 max_len: int = 2048, rope_layout: str = "half", fope_sigma: float = 0.3, fope_clip: bool = True,
                 fope_learnable: bool = True):
        super().__init__()
        self.layout = check_choice(rope_layout, "rope_layout", LAYOUTS, error=ConfigError)
        even_int(head_dim, "head_dim", error=ConfigError)
        self.sigma = check_float(fope_sigma, "fope_sigma", min=0.0, error=ConfigError)
        self.clip = check_bool(fope_clip, "fope_clip", error=ConfigError)
        learnable = check_bool(fope_learnable, "fope_learnable", error=ConfigError)
        self.train_len = positive_int(max_len, "max_len", error=ConfigError)
        self.rope_config = {"rope_theta": float(rope_base), "head_dim": int(head_dim),
                            "num_attention_heads": int(n_heads), "hidden_size": int(head_dim * n_heads),
                            "max_position_embeddings": self.train_len}
        if self.clip:   # the frequencies come from the registry's rope type, the one owner of the clipping rule
            self.rope_config["rope_scaling"] = {"rope_type": "fope",
                                                "original_max_position_embeddings": self.train_len}
        inv_freq, _ = rope_parameters(self.rope_config)
        kept = torch.nonzero(inv_freq > 0).flatten()
        if len(kept) == 0:
            raise ConfigError(f"fope: max_len {self.train_len} clips every pair (the highest frequency, 1 rad per "
                              "token, needs max_len >= 7 to turn once); expected a longer max_len, or fope_clip=False")
        # pair j reads column order[j] of [series of the K kept pairs, constant]: K for a clipped pair
        order = torch.full((len(inv_freq),), len(kept), dtype=torch.long)
        order[kept] = torch.arange(len(kept))
        self.register_buffer("kept_freq", inv_freq[kept].clone(), persistent=False)       # float32 [K]
        self.register_buffer("pair_order", order, persistent=False)                       # long [head_dim // 2]
        size = (positive_int(n_layers, "n_layers", error=ConfigError), int(n_heads), len(kept), len(kept))
        self.cos_coefficients = nn.Parameter(torch.empty(size), requires_grad=learnable)
        self.sin_coefficients = nn.Parameter(torch.empty(size), requires_grad=learnable)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Identity plus xavier-normal noise of gain sigma, per layer on each [heads, K, K] (the authors' init)."""
        with torch.no_grad():
            for coefficients in (self.cos_coefficients, self.sin_coefficients):
                for layer in coefficients:
                    if self.sigma > 0:
                        nn.init.xavier_normal_(layer, gain=self.sigma)
                    else:
                        layer.zero_()
                    layer += torch.eye(layer.shape[-1])

    @property
    def kept_pairs(self) -> int:
        """K: the pairs that rotate (the others are constant channels)."""
        return len(self.kept_freq)

    def cos_sin(self, positions: torch.Tensor, layer: int, dtype: torch.dtype = torch.float32
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """FoPE's cos'/sin' for every pair: [H, T, head_dim // 2] for positions [T], [B, H, T, head_dim // 2] for
        positions [B, T], in ``dtype`` (float32, or float64 for float64 activations); differentiable in the
        coefficients. The angles are formed in float64 whatever ``dtype`` (large positions keep their precision)."""
        cos, sin = angles_cos_sin(positions, self.kept_freq.double(), 1.0, dtype)   # [..., T, K]
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)                             # [..., 1, T, K]: over heads
        cos = cos @ self.cos_coefficients[layer].to(dtype)                          # [..., H, T, K]
        sin = sin @ self.sin_coefficients[layer].to(dtype)
        order = self.pair_order.to(cos.device)
        cos = torch.cat((cos, torch.ones_like(cos[..., :1])), dim=-1).index_select(-1, order)
        sin = torch.cat((sin, torch.zeros_like(sin[..., :1])), dim=-1).index_select(-1, order)
        return cos, sin

    def rotate_qk(self, q, k, ctx: AttentionContext):
        dtype = math_dtype(q.dtype)
        cos, sin = self.cos_sin(ctx.q_positions.to(q.device), ctx.layer, dtype)
        q_out = _rotate(q, cos, sin, self.layout)
        if ctx.k_positions is not ctx.q_positions:
            cos, sin = self.cos_sin(ctx.k_positions.to(k.device), ctx.layer, dtype)
        return q_out, _rotate(k, cos, sin, self.layout)

    def set_rope_scaling(self, scaling: Mapping | None, max_position_embeddings: int | None = None) -> None:
        """Only None (no scaling) is accepted: FoPE's clipping is its own answer to lengths past training."""
        if scaling:
            raise ConfigError("the fope scheme cannot take an extension method's rope scaling (it would replace the "
                              "clipped frequencies its coefficients were trained with); expected None")

    def describe(self) -> str:
        pairs = len(self.pair_order)
        clip = f"clipped at L={self.train_len}" if self.clip else "unclipped"
        return f"{self.name} (sigma={self.sigma:g}, {self.kept_pairs} of {pairs} pairs rotate, {clip})"


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """x [B, H, T, Dh] rotated pair by pair with cos/sin [H, T, Dh/2] or [B, H, T, Dh/2], in cos's dtype, returned
    in x's dtype. Plain tensor arithmetic (not the RoPE kernels): gradients must reach cos and sin."""
    y = x.to(cos.dtype)
    if layout == "half":
        a, b = y.chunk(2, dim=-1)
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    else:
        a, b = y[..., 0::2], y[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)
