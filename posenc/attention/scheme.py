"""RuleScheme: a RoPE scheme of posenc's TinyLM evaluated under an attention rule (the lab's zero-shot rows for the
attention methods). It keeps the base scheme's frequencies and layout; rotation moves from ``rotate_qk`` into
``attend``, which runs the rule's blocked kernel. It declares itself length dependent, so the KV cache keeps keys
unrotated (the rules re-position cached keys, as Self-Extend's and StreamingLLM's caches do)."""

from __future__ import annotations

import torch

from posenc._internal.errors import ConfigError
from posenc.attention.kernel import rule_attention
from posenc.attention.rules import AttentionRule
from posenc.schemes.base import AttentionContext, Scheme


class RuleScheme(Scheme):
    """``base`` (an extendable RoPE scheme without a bias, at its plain frequencies) under ``rule``."""

    rotates = True
    length_dependent = True

    def __init__(self, base: Scheme, rule: AttentionRule):
        super().__init__()
        if not getattr(base, "extendable", False) or base.capabilities.biases or not hasattr(base, "rotary"):
            raise ConfigError(f"extensions: the {base.name} scheme is not a plain RoPE scheme; attention methods "
                              f"({rule.name}) need one")
        self.base, self.rule = base, rule
        self.name = base.name
        self.max_len = base.max_len
        self.extendable = True

    @property
    def rope_config(self):
        return self.base.rope_config

    def embed(self, x, positions):
        return self.base.embed(x, positions)

    def rotate_qk(self, q, k, ctx: AttentionContext):
        return q, k  # rotated inside attend, at the rule's positions

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if not ctx.contiguous:
            raise ConfigError(f"{self.rule.name}: attention methods need the plain positions past..past+T-1")
        rotary = self.base.rotary
        with torch.autograd.set_grad_enabled(torch.is_grad_enabled() and ctx.training):
            return rule_attention(q, k, v, self.rule, rotary.inv_freq.float(),
                                  attention_scaling=float(rotary.attention_scaling), scale=ctx.scale,
                                  layout=self.base.layout, q_offset=ctx.past)

    def describe(self) -> str:
        return f"{self.base.describe()} + {self.rule.name}"
