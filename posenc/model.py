"""A tiny pre-norm GPT over bytes (vocab 256) whose position signal is a pluggable scheme.

    tokens [B, T] -> embed (+ scheme.embed) -> n_layers x [x + attn(LN(x)); x + mlp(LN(x))] -> LN -> logits [B, T, 256]

The output head is tied to the token embedding. One scheme object is shared by every layer (learned tables and
RoPE frequencies exist once per model).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from posenc.attention import CausalSelfAttention, KVCache
from posenc.errors import ConfigError
from posenc.schemes import SCHEME_NAMES, make_scheme


@dataclass
class ModelConfig:
    """Everything needed to rebuild a model. ``max_len`` = training length: the learned table's size and RoPE's
    max_position_embeddings."""

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

    def __post_init__(self):
        if self.scheme not in SCHEME_NAMES:
            raise ConfigError(f"scheme: expected one of {', '.join(SCHEME_NAMES)}, got {self.scheme!r}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_ratio", "max_len"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name}: expected a positive integer, got {getattr(self, name)!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model: must be divisible by n_heads ({self.n_heads}), got {self.d_model}")

    def to_dict(self) -> dict:
        return asdict(self)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, layer_idx)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model), nn.GELU(),
                                 nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model))

    def forward(self, x, scheme, positions, cache):
        x = x + self.attn(self.ln1(x), scheme, positions, cache)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Decoder-only byte LM. forward(tokens [B, T] long, cache=None) -> logits [B, T, vocab] float32."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self._init_weights()
        # built last so that the shared weights get identical initial values under every scheme
        self.scheme = make_scheme(cfg.scheme, d_model=cfg.d_model, n_heads=cfg.n_heads, max_len=cfg.max_len,
                                  rope_base=cfg.rope_base, rope_layout=cfg.rope_layout, rope_scaling=cfg.rope_scaling)

    def _init_weights(self):
        # GPT-2 style: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        past = len(cache) if cache is not None else 0
        positions = torch.arange(past, past + tokens.shape[1], device=tokens.device)
        if self.scheme.max_len is not None and past + tokens.shape[1] > self.scheme.max_len:
            raise ConfigError(f"sequence length {past + tokens.shape[1]}: the {self.cfg.scheme} scheme's table "
                              f"covers only max_len={self.scheme.max_len} positions")
        x = self.tok_emb(tokens)
        if self.cfg.scale_embeddings:  # keeps token embeddings (init std 0.02) from drowning under a fixed PE
            x = x * math.sqrt(self.cfg.d_model)
        x = self.scheme.embed(x, positions)
        for block in self.blocks:
            x = block(x, self.scheme, positions, cache)
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
