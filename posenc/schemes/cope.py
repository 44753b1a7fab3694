"""``cope``: CoPE, contextual position encoding (Golovneva et al. 2024, arXiv 2405.18719), a thin adapter over
``posenc.bias.cope.CoPE``.

    a_ij = q_i . k_j * scale                       the layer's logits (after rotate_qk: none here)
    p_ij = sum_{t=j..i} sigmoid(a_it)              a soft count of the keys between j and i, clamped to npos - 1
    logits[i, j] += q_i . e[p_ij]                  e interpolated between floor(p_ij) and ceil(p_ij)

One embedding table [npos, head_dim] per layer (shared by its heads, as in the paper's code), picked by
``ctx.layer``. ``cope_npos`` (default: the training length) bounds the count; larger counts read the last
embedding. No position index is used: positions (randomized or plain) do not affect CoPE. Attention runs
through ``attend`` (``posenc.bias.cope.cope_attention``: q.k computed once, the softmax fused with the bias);
``bias`` stays the reference it must equal.
"""

from __future__ import annotations

from torch import nn

from posenc._internal.validate import check_int

MAX_NPOS = 2**17
from posenc.bias.cope import CoPE
from posenc._internal.errors import ConfigError
from posenc.schemes.base import AttentionContext, Scheme
from posenc.schemes.registry import register_scheme


@register_scheme("cope")
class CoPEScheme(Scheme):
    """CoPE: positions counted by sigmoid gates on the logits; their interpolated embeddings bias the logits."""

    biases = True

    def __init__(self, head_dim: int, n_layers: int, max_len: int, *, cope_npos: int | None = None):
        super().__init__()
        # a soft count of keys never exceeds the sequence length: past the longest one the lab runs (2^17) a table
        # row is never read, and 10^8 rows would only exhaust memory
        npos = check_int(max_len if cope_npos is None else cope_npos, "cope_npos", min=1, max=MAX_NPOS,
                         error=ConfigError)
        self.layers = nn.ModuleList(CoPE(npos, head_dim) for _ in range(n_layers))

    def bias(self, q, k, ctx: AttentionContext):  # q [B, H, Tq, Dh], k [B, H, Tk, Dh] -> [B, H, Tq, Tk]
        return self.layers[ctx.layer](q, (q @ k.transpose(-1, -2)) * ctx.scale)

    def attend(self, q, k, v, ctx: AttentionContext):  # -> [B, H, Tq, Dh]: bias() + SDPA in one fused op
        return self.layers[ctx.layer].attention(q, k, v, scale=ctx.scale)
