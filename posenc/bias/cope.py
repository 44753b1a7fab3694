"""CoPE, contextual position encoding (Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count
What's Important", arXiv 2405.18719): positions counted by the attention itself, added to its logits.

For query i and key j <= i, with the attention logits a_it (already scaled and masked, as in the paper's code):

    gate       g_it = sigmoid(a_it)                               (0 for masked keys t > i)
    position   p_ij = sum_{t=j..i} g_it,  clamped to npos_max - 1  (fractional: a soft count of "what matters")
    bias       b_ij = (1 - w) * q_i . e[floor(p_ij)] + w * q_i . e[ceil(p_ij)],  w = p_ij - floor(p_ij)

e: learned position embeddings [npos_max, head_dim] (zeros at init, as in the paper). The logits then become
a_ij + b_ij. Computed efficiently: q @ e^T once ([Tq, npos_max]), then two gathers; the suffix sums are one
reversed cumulative sum over the key axis. No position index is used, so a KV-cache decoding step (one query
row over all cached keys) gives exactly the last row of the full computation.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc._validate import positive_int
from posenc.errors import PosencError


def cope_bias(query: torch.Tensor, logits: torch.Tensor, pos_emb: torch.Tensor, *,
              causal: bool = True) -> torch.Tensor:
    """The CoPE bias [..., Tq, Tk] to add to ``logits``.

    Args:
        query: [..., Tq, head_dim] queries (per head: heads are part of the leading dims).
        logits: [..., Tq, Tk] attention logits q.k (scaled as the attention scales them); the gates are their
            sigmoids. Masked entries may already be -inf.
        pos_emb: [npos_max, head_dim] position embeddings.
        causal: gate out keys after the query (query i sits at key index i + Tk - Tq: queries are the last Tq of
            the Tk keys, as with a KV cache). False: the caller's logits carry the mask (-inf entries).
    Returns:
        float32 (float64 for float64 inputs) [..., Tq, Tk]; entries for masked keys are finite and meaningless.
    """
    if query.dim() < 2 or logits.dim() < 2 or pos_emb.dim() != 2:
        raise PosencError(f"query must be [..., Tq, head_dim], logits [..., Tq, Tk] and pos_emb [npos_max, head_dim]; "
                          f"got {tuple(query.shape)}, {tuple(logits.shape)}, {tuple(pos_emb.shape)}")
    if query.shape[-1] != pos_emb.shape[-1] or query.shape[-2] != logits.shape[-2]:
        raise PosencError(f"query {tuple(query.shape)} must match pos_emb's head_dim {pos_emb.shape[-1]} and "
                          f"logits' query length {logits.shape[-2]}")
    q_len, k_len = logits.shape[-2:]
    if k_len < q_len:
        raise PosencError(f"logits must have Tk >= Tq (queries are the last Tq of the keys), got {tuple(logits.shape)}")
    dtype = torch.float64 if torch.float64 in (query.dtype, logits.dtype, pos_emb.dtype) else torch.float32
    gates = torch.sigmoid(logits.to(dtype))
    if causal:
        i = torch.arange(q_len, device=logits.device).unsqueeze(-1) + (k_len - q_len)
        j = torch.arange(k_len, device=logits.device)
        gates = gates.masked_fill(j > i, 0.0)
    npos = pos_emb.shape[0]
    positions = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos - 1)                # p_ij = sum_{t >= j} g_it
    lower = positions.floor()
    frac = positions - lower
    per_position = query.to(dtype) @ pos_emb.to(dtype).transpose(0, 1)                  # [..., Tq, npos]
    per_position = per_position.expand(*positions.shape[:-1], npos)
    at_lower = per_position.gather(-1, lower.long())
    at_upper = per_position.gather(-1, positions.ceil().long())
    return (1 - frac) * at_lower + frac * at_upper


class CoPE(nn.Module):
    """CoPE's learned embeddings [npos_max, head_dim]: forward(query, logits) -> bias [..., Tq, Tk].

    One table per attention layer, shared by its heads (the paper's code). ``npos_max`` bounds the counted
    position: counts past npos_max - 1 all read the last embedding.
    """

    def __init__(self, npos_max: int, head_dim: int):
        super().__init__()
        self.npos_max = positive_int(npos_max, "npos_max")
        self.head_dim = positive_int(head_dim, "head_dim")
        self.pos_emb = nn.Parameter(torch.zeros(npos_max, head_dim))

    def forward(self, query: torch.Tensor, logits: torch.Tensor, *, causal: bool = True) -> torch.Tensor:
        return cope_bias(query, logits, self.pos_emb, causal=causal)

    def extra_repr(self) -> str:
        return f"npos_max={self.npos_max}, head_dim={self.head_dim}"
