"""The scheme interface: how a positional encoding plugs into attention, so attention never branches on a name.

A scheme can touch three places; each hook is a no-op unless the scheme overrides it (the base class is NoPE):

    embed(x, positions)        x [B, T, D] token embeddings -> x + position signal            (sinusoidal, learned)
    rotate_qk(q, k, ctx)       q [B, H, Tq, Dh], k [B, H, Tk, Dh] -> (q, k), one joint hook    (rope, xPos, ...)
    bias(q, k, ctx)            -> float tensor broadcastable to [B, H, Tq, Tk] added to the     (alibi, T5, CoPE)
                               scaled logits before softmax, or None

    attend(q, k, v, ctx)       -> the attention output [B, H, Tq, Dh] when the scheme computes   (CoPE: its bias
                               the whole attention itself (q, k after rotate_qk), or None       needs q.k anyway)
                               for torch's SDPA with bias()

and ``for_layer(layer)`` returns the view a given layer uses (default: the scheme itself), so a scheme can differ
per layer (a NoPE layer every k-th layer). Positions are absolute token positions, LongTensor [T] or [B, T];
with a KV cache the new queries sit after the cached keys. docs/architecture.md describes the contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc._internal.fp32 import Float32Buffers


@dataclass(frozen=True)
class Capabilities:
    """What a scheme does; attention and the lab read these, never the scheme's name.

    embeds: embed() adds a signal to the token embeddings. rotates: rotate_qk() changes q/k. biases: bias()
    returns a tensor. length_dependent: rotate_qk() depends on the total length (dynamic NTK, LongRoPE), so keys
    are cached unrotated and all of them re-rotated each call. max_len: positions >= max_len have no encoding
    (None: unbounded). extendable: RoPE extension methods can rescale it (``set_rope_scaling``, ``rope_config``).
    """

    embeds: bool = False
    rotates: bool = False
    biases: bool = False
    length_dependent: bool = False
    max_len: int | None = None
    extendable: bool = False


@dataclass(frozen=True)
class AttentionContext:
    """Where one attention call sits: built by the attention for each layer and call, passed to the hooks.

    q_positions: [Tq] or [B, Tq] positions of the new queries. k_positions: [Tk] or [B, Tk] positions of the keys
    the hook sees (the new ones before caching, every cached one for length-dependent schemes and in bias()).
    layer: layer index. past: tokens cached before this call. scale: the softmax scale (1/sqrt(head_dim)).
    training: the model is in training mode. contiguous: the positions are past..past+T-1 (the default), so a
    scheme may work from lengths alone; False under custom positions (randomized positions, PoSE).
    """

    q_positions: torch.Tensor
    k_positions: torch.Tensor
    layer: int = 0
    past: int = 0
    scale: float = 1.0
    training: bool = False
    contiguous: bool = True

    @property
    def total_len(self) -> int:
        """Tokens in the sequence so far: cached + new."""
        return self.past + self.q_positions.shape[-1]

    def distance(self) -> torch.Tensor:
        """i - j for every query i and key j, float32 [Tq, Tk] (or [B, Tq, Tk] for per-row positions)."""
        return (self.q_positions[..., :, None] - self.k_positions[..., None, :]).to(torch.float32)


class Scheme(Float32Buffers):
    """Base class of every scheme: no position signal at all (NoPE behaves exactly like this).

    Subclasses set the capability attributes that apply and override the hooks they use. The factory registered
    for a scheme receives the model's description as keyword arguments (see ``posenc.schemes.registry``).
    Buffers named in ``float32_buffers`` (frequencies, slopes) keep their dtype when the model is cast to bf16.
    """

    name = "nope"
    embeds = False
    rotates = False
    biases = False
    length_dependent = False
    max_len: int | None = None
    extendable = False
    # its parameters are additive attention-logit biases (T5, KERPLE, FIRE), which the lab may train at a higher
    # learning rate (posenc.lab.train.TrainSettings.bias_lr_scale); not embeddings dotted with q (CoPE, a table)
    learned_bias = False

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(embeds=bool(self.embeds), rotates=bool(self.rotates), biases=bool(self.biases),
                            length_dependent=bool(self.length_dependent), max_len=self.max_len,
                            extendable=bool(self.extendable))

    def for_layer(self, layer: int) -> "Scheme":
        """The scheme layer ``layer`` uses (its capabilities and hooks may differ per layer)."""
        return self

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [B, T, D] -> x with the position signal added; positions [T] or [B, T]."""
        return x

    def rotate_qk(self, q: torch.Tensor, k: torch.Tensor, ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, H, Tq, Dh] at ctx.q_positions, k [B, H, Tk, Dh] at ctx.k_positions -> (q, k)."""
        return q, k

    def bias(self, q: torch.Tensor, k: torch.Tensor, ctx: AttentionContext) -> torch.Tensor | None:
        """Additive logits bias broadcastable to [B, H, Tq, Tk] (q, k after rotate_qk; k = every cached key)."""
        return None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               ctx: AttentionContext) -> torch.Tensor | None:
        """The causal attention output [B, H, Tq, Dh] computed by the scheme (q, k after rotate_qk; k, v every
        cached key), or None: attention then runs SDPA with ``bias()``. An override must equal that SDPA."""
        return None

    def describe(self) -> str:
        return self.name


class NoPEScheme(Scheme):
    """No position signal at all: the causal mask is the only source of order (Kazemnejad et al. 2023)."""
