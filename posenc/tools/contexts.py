"""The context lengths a RoPE config states: they live in ``posenc.rope.contexts`` (the layer below the tools, so
that eval and posenc.patch read them too); re-exported here for the tools that import them from this path."""

from __future__ import annotations

from posenc.rope.contexts import (MAX_CONTEXT, check_rope_values, claimed_context, context_length,  # noqa: F401
                                  trained_length)
