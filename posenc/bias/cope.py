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

Two entry points: ``cope_bias`` (the bias alone, the reference: autograd differentiates it) and
``cope_attention`` (the whole attention softmax(a + b) @ v in one autograd Function with a hand-written
backward). The fused one computes q.k once instead of once for the gates and again in SDPA, keeps the softmax it
needs instead of every intermediate autograd would, needs about half the passes over [Tq, Tk], and runs the
query rows in blocks against their causal key prefix, so the masked half is mostly never computed: one copy-cpu
layer's forward + backward (8 x 4 heads x 128 x 128, head dim 16, one thread) 21.1 -> 10.4 ms, inference at 512
tokens 1711 -> 272 ms (benchmarks/biases.py; docs/lab.md, "Throughput").
"""

from __future__ import annotations

import torch
from torch import nn

from posenc._internal.validate import positive_int
from posenc._internal.errors import PosencError


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
        gates = gates.masked_fill(~_causal_keep(q_len, k_len, logits.device), 0.0)
    npos = pos_emb.shape[0]
    positions = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos - 1)                # p_ij = sum_{t >= j} g_it
    lower = positions.floor()
    frac = positions - lower
    per_position = query.to(dtype) @ pos_emb.to(dtype).transpose(0, 1)                  # [..., Tq, npos]
    per_position = per_position.expand(*positions.shape[:-1], npos)
    at_lower = per_position.gather(-1, lower.long())
    at_upper = per_position.gather(-1, positions.ceil().long())
    return (1 - frac) * at_lower + frac * at_upper


def _causal_keep(q_len: int, k_len: int, device) -> torch.Tensor:
    """Bool [Tq, Tk]: key j is visible to query i (queries are the last Tq of the Tk keys)."""
    i = torch.arange(q_len, device=device).unsqueeze(-1) + (k_len - q_len)
    return torch.arange(k_len, device=device) <= i


def _position_logits(query: torch.Tensor, pos_emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q . e[n] for every position n, and its forward difference -> ([..., Tq, P], [..., Tq, P]); the last
    difference is 0 (a count clamped at P - 1 reads e[P - 1] alone)."""
    at = query @ pos_emb.transpose(0, 1)
    step = torch.zeros_like(at)
    step[..., :-1] = at[..., 1:] - at[..., :-1]
    return at, step


def _fused_forward(q, k, v, pos_emb, scale: float, *, for_backward: bool):
    """softmax(q.k * scale + CoPE bias, causal) @ v, all inputs already in the compute dtype.

    -> (out [..., Tq, Dh], saved): saved = (softmax, gates, interpolation weights, floor indices, the position
    logits' step at those indices), each [..., Tq, Tk], when ``for_backward``, else None.
    """
    logits = (q @ k.transpose(-1, -2)).mul_(scale)                                       # [..., Tq, Tk]
    hidden = ~_causal_keep(logits.shape[-2], logits.shape[-1], q.device)
    gates = torch.sigmoid(logits).masked_fill_(hidden, 0.0)
    positions = gates.flip(-1).cumsum(-1).flip(-1).clamp_(max=pos_emb.shape[0] - 1)      # p_ij
    lower = positions.floor()
    weight = positions.sub_(lower)                                                       # p - floor(p), in place
    index = lower.long()
    at, step = _position_logits(q, pos_emb)
    step_at = step.gather(-1, index)
    logits.add_(at.gather(-1, index)).addcmul_(weight, step_at)                         # + e[lo] + w (e[lo+1] - e[lo])
    probs = torch.softmax(logits.masked_fill_(hidden, float("-inf")), dim=-1)
    out = probs @ v
    return out, ((probs, gates, weight, index, step_at) if for_backward else None)


# query rows per block in inference: about this many [Tq, Tk] entries per block keep the intermediates in cache
_BLOCK_ENTRIES = 1 << 20


def _query_blocks(q_len: int, k_len: int, rows: int):
    """(start, stop, seen) per block of ``rows`` queries: rows start..stop-1 see keys 0..seen-1 (causal)."""
    for start in range(0, q_len, rows):
        stop = min(q_len, start + rows)
        yield start, stop, k_len - q_len + stop


def _blocked_forward(q, k, v, pos_emb, scale: float) -> torch.Tensor:
    """The inference path: query blocks, each against only the keys it can see (the causal prefix), so the
    [..., rows, Tk] intermediates stay cache-sized and the masked half is never computed."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    lead = q[..., 0, 0].numel()
    rows = max(1, min(q_len, _BLOCK_ENTRIES // max(1, lead * k_len)))
    if rows >= q_len:
        return _fused_forward(q, k, v, pos_emb, scale, for_backward=False)[0]
    out = torch.empty_like(q)
    for start, stop, seen in _query_blocks(q_len, k_len, rows):
        out[..., start:stop, :] = _fused_forward(q[..., start:stop, :], k[..., :seen, :], v[..., :seen, :],
                                                 pos_emb, scale, for_backward=False)[0]
    return out


# training: query rows in up to this many blocks of at least _MIN_TRAIN_ROWS rows, each against its causal key prefix
# (autograd sums the blocks' key, value and table gradients). One copy-cpu layer's forward + backward (8 x 4 heads x
# 128 x 128, head dim 16, one thread): 17.3 ms in one block, 14.4 in two, 10.8 in four, 13.5 in eight.
_TRAIN_BLOCKS, _MIN_TRAIN_ROWS = 4, 32


def _trained_blocks(q, k, v, pos_emb, scale: float, dtype) -> torch.Tensor:
    q_len, k_len = q.shape[-2], k.shape[-2]
    rows = max(_MIN_TRAIN_ROWS, -(-q_len // _TRAIN_BLOCKS))
    outs = []
    for start, stop, seen in _query_blocks(q_len, k_len, rows):
        outs.append(_CoPEAttention.apply(q[..., start:stop, :], k[..., :seen, :], v[..., :seen, :], pos_emb,
                                         scale, dtype))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


class _CoPEAttention(torch.autograd.Function):
    """softmax(q.k * scale + CoPE bias, causal) @ v with the backward written out (see ``cope_attention``).

    Saved for backward: the softmax, the gates, the interpolation weights, the floor indices and the step of the
    position logits at them, all [..., Tq, Tk]."""

    @staticmethod
    def forward(ctx, q, k, v, pos_emb, scale, dtype):
        with torch.autocast(q.device.type, enabled=False):
            out, saved = _fused_forward(*(t.to(dtype) for t in (q, k, v, pos_emb)), scale, for_backward=True)
        ctx.save_for_backward(q, k, v, pos_emb, *saved)
        ctx.scale, ctx.dtype = scale, dtype
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, pos_emb, probs, gates, weight, index, step_at = ctx.saved_tensors
        scale, dtype = ctx.scale, ctx.dtype
        with torch.autocast(q.device.type, enabled=False):
            q_, k_, v_, e_, dy = (t.to(dtype) for t in (q, k, v, pos_emb, grad_out))
            grad_v = probs.transpose(-1, -2) @ dy
            grad_a = dy @ v_.transpose(-1, -2)                                           # d/dA
            grad_a.sub_((grad_a * probs).sum(-1, keepdim=True)).mul_(probs)              # softmax backward: d/da
            # the bias reads (1 - w) q.e[lo] + w q.e[lo + 1]: d/d(q.e[n]) gathers d/da * (1 - w) at n = lo and
            # d/da * w at n = lo + 1, i.e. all(n) - weighted(n) + weighted(n - 1) with both scattered at lo
            npos = pos_emb.shape[0]
            weighted = grad_a * weight
            grad_at = torch.zeros(*q_.shape[:-1], npos, dtype=dtype, device=q.device).scatter_add_(-1, index, grad_a)
            moved = torch.zeros_like(grad_at).scatter_add_(-1, index, weighted)
            grad_at.sub_(moved)
            grad_at[..., 1:] += moved[..., :-1]                                          # lo = P - 1 has w = 0
            # the count: d/dp = d/dw (floor has no gradient; a clamped count reads step = 0 there), and
            # p_ij = sum_{t >= j} g_it, so d/dg_it = sum_{j <= t} d/dp_ij: a forward cumulative sum
            grad_g = weighted.copy_(grad_a).mul_(step_at).cumsum(-1)
            grad_s = grad_g.mul_(gates).mul_(1 - gates).add_(grad_a).mul_(scale)       # masked keys: g = 0, A = 0
            grad_q = grad_s @ k_ + grad_at @ e_
            grad_k = grad_s.transpose(-1, -2) @ q_
            grad_e = grad_at.reshape(-1, npos).transpose(0, 1) @ q_.reshape(-1, q_.shape[-1])
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), grad_e.to(pos_emb.dtype), None, None


def cope_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, pos_emb: torch.Tensor, *,
                   scale: float) -> torch.Tensor:
    """Causal attention with the CoPE bias, fused: softmax(q.k * scale + b) @ v with b = ``cope_bias``.

    Equal (to rounding) to ``scaled_dot_product_attention(q, k, v, attn_mask=cope_bias(q, q.k * scale, e) +
    causal -inf, scale=scale)``, in value and gradient (tests/bias/test_cope.py checks both against that, and
    float64 gradients by finite differences).

    Args:
        query: [..., Tq, head_dim]; key, value: [..., Tk, head_dim] with the same leading dims (heads included)
            and Tk >= Tq: the queries are the last Tq keys, as with a KV cache.
        pos_emb: [npos_max, head_dim] CoPE's position embeddings.
        scale: the softmax scale (1 / sqrt(head_dim) in a transformer).
    Returns:
        [..., Tq, head_dim] in the query's dtype; computed in float32 (float64 if any input is float64).
    """
    if query.dim() < 2 or pos_emb.dim() != 2 or key.shape != value.shape or key.shape[:-2] != query.shape[:-2] \
            or key.shape[-1] != query.shape[-1] or pos_emb.shape[-1] != query.shape[-1]:
        raise PosencError(f"query must be [..., Tq, head_dim], key and value [..., Tk, head_dim] with the same "
                          f"leading dims, pos_emb [npos_max, head_dim]; got {tuple(query.shape)}, "
                          f"{tuple(key.shape)}, {tuple(value.shape)}, {tuple(pos_emb.shape)}")
    if key.shape[-2] < query.shape[-2]:
        raise PosencError(f"key must hold at least as many positions as query (Tk >= Tq), got {key.shape[-2]} "
                          f"< {query.shape[-2]}")
    dtype = torch.float64 if torch.float64 in (query.dtype, key.dtype, value.dtype, pos_emb.dtype) else torch.float32
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, pos_emb)):
        return _trained_blocks(query, key, value, pos_emb, float(scale), dtype)
    with torch.autocast(query.device.type, enabled=False):
        out = _blocked_forward(*(t.to(dtype) for t in (query, key, value, pos_emb)), float(scale))
    return out.to(query.dtype)


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

    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                  scale: float) -> torch.Tensor:
        """The fused causal attention with this table: ``cope_attention`` -> [..., Tq, head_dim]."""
        return cope_attention(query, key, value, self.pos_emb, scale=scale)

    def extra_repr(self) -> str:
        return f"npos_max={self.npos_max}, head_dim={self.head_dim}"
