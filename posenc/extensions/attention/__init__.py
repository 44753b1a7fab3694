"""The attention methods' old import path: they live in ``posenc.attention`` (its own package and registry); the
public names are re-exported here so that ``from posenc.extensions.attention import SelfExtend`` keeps working."""

from __future__ import annotations

from posenc.attention import (AttentionRule, DualChunk, LeakyReRoPE, Mode, ReRoPE, SelfExtend, Sinks,  # noqa: F401
                              window_mode)
from posenc.attention.kernel import rule_attention  # noqa: F401
from posenc.attention.scheme import RuleScheme  # noqa: F401
