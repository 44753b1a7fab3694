"""A tiny pre-norm GPT over bytes (vocab 256) whose position signal is a pluggable scheme.

    tokens [B, T] -> embed (+ scheme.embed) -> n_layers x [x + attn(LN(x)); x + mlp(LN(x))] -> LN -> logits [B, T, 256]

The output head is tied to the token embedding. ``ModelConfig.bias`` False drops every bias (LayerNorms and MLP; the
attention projections never have one): MPT's block (MosaicML 2023), so that a trained ALiBi model exports exactly
to transformers' MptForCausalLM (docs/hf.md). One scheme object serves every layer (learned tables and RoPE
frequencies exist once per model); each layer asks it for its view (``scheme.for_layer(i)``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from posenc._internal.validate import check_bool, check_choice, check_int, heads_divide
from posenc._internal.errors import ConfigError
from posenc.nn.attention import CausalSelfAttention, KVCache
from posenc.rope.apply import LAYOUTS
from posenc.rope.config import check_theta
from posenc.schemes import check_scheme, make_scheme

# positions for a training batch: (batch, seq_len, device) -> LongTensor [T] or [B, T]
PositionSampler = Callable[[int, int, torch.device], torch.Tensor]


@dataclass
class ModelConfig:
    """Everything needed to rebuild a model. ``max_len`` = training length: the learned table's size and RoPE's
    max_position_embeddings. ``scheme_options``: scheme-specific settings passed to the scheme's factory."""

    scheme: str = "rope"
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4
    max_len: int = 128
    rope_base: float = 10000.0
    rope_layout: str = "half"
    rope_scaling: dict | None = field(default=None)
    scale_embeddings: bool = True  # token embeddings * sqrt(d_model), as in Vaswani et al. 2017 (sec. 3.4)
    bias: bool = True  # LayerNorm and MLP biases; False: MPT's bias-free block
    scheme_options: dict = field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    def validate(self) -> "ModelConfig":
        check_scheme(self.scheme)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_ratio", "max_len"):
            check_int(getattr(self, name), name, min=1, error=ConfigError)
        heads_divide(self.d_model, self.n_heads, error=ConfigError)
        check_choice(self.rope_layout, "rope_layout", LAYOUTS, error=ConfigError)
        with warnings.catch_warnings():    # the range, named as set; the RoPE scheme's config warns about a base <= 1
            warnings.simplefilter("ignore")
            check_theta(self.rope_base, "rope_base")
        for name in ("scale_embeddings", "bias"):
            check_bool(getattr(self, name), name, error=ConfigError)
        if not isinstance(self.scheme_options, dict):
            raise ConfigError(f"scheme_options must be a dict of scheme settings, got {self.scheme_options!r}")
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def flops_per_token(self, seq_len: int, training: bool = True) -> float:
        """Matmul FLOPs per token of a forward pass over ``seq_len`` tokens (x3 with ``training``: backward).

        Per layer 2 * 12 d^2 for the q/k/v, output and MLP projections (mlp_ratio 4 -> 2 * (4 + 2 * mlp_ratio) d^2
        in general), plus causal attention 2 * 2 d * (seq_len + 1) / 2 (scores and the weighted sum, each query
        against the keys up to it); then the tied output head 2 d V. The usual estimate 6 N + 12 L T d (Kaplan
        et al. 2020) counts every key; elementwise ops (norms, GELU, softmax, RoPE) are not counted.
        """
        d, L = self.d_model, self.n_layers
        forward = 2 * self.matmul_weights() + L * 2 * d * (seq_len + 1)
        return float(3 * forward if training else forward)

    def matmul_weights(self) -> int:
        """Weights of the matrices: per layer (4 + 2 * mlp_ratio) d^2 (q, k, v, output, the MLP's two), plus the
        tied embedding d V. Norms and biases (a few d per layer) and scheme parameters are not counted."""
        d = self.d_model
        return self.n_layers * (4 + 2 * self.mlp_ratio) * d * d + d * self.vocab_size

    def scheme_arguments(self) -> dict:
        """The model description every scheme factory is offered (registry.make_scheme's keywords)."""
        return dict(d_model=self.d_model, n_heads=self.n_heads, max_len=self.max_len, n_layers=self.n_layers,
                    vocab_size=self.vocab_size, rope_base=self.rope_base, rope_layout=self.rope_layout,
                    rope_scaling=self.rope_scaling, **self.scheme_options)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not d["scheme_options"]:  # absent when unused: run settings (checkpoints) stay as before
            del d["scheme_options"]
        if d["bias"]:  # likewise absent at its default
            del d["bias"]
        return d


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose results do not depend on the number of CPU threads.

    torch's fused CPU layer norm sums the weight and bias gradients over rows in per-thread parts, so 1 and 2
    threads train bit-different models. Here the fused op only normalizes and the affine step is ordinary
    elementwise autograd, whose reductions torch splits by output column: identical weights at any thread count
    (tests/nn/test_model.py), so ``--threads`` auto may pick 1 or 2 without changing a result. Same parameters
    and state dict as nn.LayerNorm.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        if self.weight is None:
            return y
        return y * self.weight if self.bias is None else torch.addcmul(self.bias, y, self.weight)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        # with bias=True the modules are built exactly as before the option existed (same random draws)
        self.ln1 = LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, layer_idx)
        self.ln2 = LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=cfg.bias), nn.GELU(),
                                 nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=cfg.bias))

    def forward(self, x, scheme, positions, cache, contiguous=True):
        x = x + self.attn(self.ln1(x), scheme, positions, cache, contiguous=contiguous)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Decoder-only byte LM. forward(tokens [B, T] long, cache=None) -> logits [B, T, vocab] float32.

    ``train_positions``: optional PositionSampler used instead of past..past+T-1 while training (randomized
    positions, PoSE); evaluation always uses the plain positions.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.ln_f = LayerNorm(cfg.d_model, bias=cfg.bias)
        self._init_weights()
        # built last so that the shared weights get identical initial values under every scheme
        self.scheme = make_scheme(cfg.scheme, **cfg.scheme_arguments())
        self.train_positions: PositionSampler | None = None

    def _init_weights(self):
        # GPT-2 style: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def positions(self, batch: int, seq_len: int, past: int, device) -> tuple[torch.Tensor, bool]:
        """-> (positions [T] or [B, T] of the new tokens, whether they are the plain past..past+T-1)."""
        if self.training and past == 0 and self.train_positions is not None:
            return self.train_positions(batch, seq_len, device), False
        return torch.arange(past, past + seq_len, device=device), True

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        past = len(cache) if cache is not None else 0
        positions, contiguous = self.positions(tokens.shape[0], tokens.shape[1], past, tokens.device)
        max_len = self.scheme.max_len
        if max_len is not None:
            top = past + tokens.shape[1] if contiguous else int(positions.max()) + 1
            if top > max_len:
                raise ConfigError(f"sequence length {top}: the {self.cfg.scheme} scheme's table covers only "
                                  f"max_len={max_len} positions")
        x = self.tok_emb(tokens)
        if self.cfg.scale_embeddings:  # keeps token embeddings (init std 0.02) from drowning under a fixed PE
            x = x * math.sqrt(self.cfg.d_model)
        x = self.scheme.embed(x, positions)
        for i, block in enumerate(self.blocks):
            x = block(x, self.scheme.for_layer(i), positions, cache, contiguous)
        return F.linear(self.ln_f(x), self.tok_emb.weight)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layers)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
        """Greedy decoding with the KV cache: prompt [B, T] -> the n_new generated tokens [B, n_new]."""
        cache = self.new_cache()
        logits = self(prompt, cache)
        out = []
        for i in range(n_new):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
            if i + 1 < n_new:
                logits = self(nxt, cache)
        return torch.cat(out, dim=1)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
