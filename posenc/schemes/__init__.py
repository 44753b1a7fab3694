"""Position schemes behind one interface, and the registry that owns their names.

    base.py      Scheme (hooks embed / rotate_qk / bias / for_layer), Capabilities, AttentionContext
    registry.py  SCHEMES, register_scheme, make_scheme, scheme_names
    builtin.py   nope, sinusoidal, learned, rope (over posenc.Rotary), alibi, rope+alibi
    t5.py, kerple.py, fire.py, xpos.py, cope.py, p_rope.py, irope.py   one module per scheme of issue 11
    resonance.py, hybrid.py, fope.py   the 2025-26 lessons: resonance-rope, rnope-swa, fope (p_rope.py: hope)

A new scheme is one module here (registered with ``@register_scheme``) plus one import line below.
docs/architecture.md describes the interface.
"""

from __future__ import annotations

from posenc.schemes.base import AttentionContext, Capabilities, NoPEScheme, Scheme
from posenc.schemes.registry import SCHEMES, SchemeEntry, check_scheme, make_scheme, register_scheme, scheme_names
from posenc.schemes import builtin  # noqa: F401  (registers the built-ins)
from posenc.schemes import t5  # noqa: F401
from posenc.schemes import kerple  # noqa: F401
from posenc.schemes import fire  # noqa: F401
from posenc.schemes import xpos  # noqa: F401
from posenc.schemes import cope  # noqa: F401
from posenc.schemes import p_rope  # noqa: F401
from posenc.schemes import irope  # noqa: F401
from posenc.schemes import resonance  # noqa: F401
from posenc.schemes import hybrid  # noqa: F401
from posenc.schemes import fope  # noqa: F401
from posenc.schemes.builtin import ALiBiScheme, LearnedScheme, RoPEALiBiScheme, RoPEScheme, SinusoidalScheme


def __getattr__(name: str):
    if name == "SCHEME_NAMES":  # derived from the registry when read, so plug-ins are included
        return scheme_names()
    raise AttributeError(f"module 'posenc.schemes' has no attribute {name!r}")


__all__ = ["AttentionContext", "Capabilities", "Scheme", "NoPEScheme", "SCHEMES", "SchemeEntry", "check_scheme",
           "make_scheme", "register_scheme", "scheme_names", "SCHEME_NAMES", "ALiBiScheme", "LearnedScheme",
           "RoPEALiBiScheme", "RoPEScheme", "SinusoidalScheme"]
