"""The scheme registry: name -> factory building a ``Scheme``; the one owner of the list of schemes.

    >>> @register_scheme("mine", description="my bias")
    ... class Mine(Scheme):
    ...     biases = True
    ...     def __init__(self, *, n_heads, **_): ...

A factory (a Scheme subclass or a function returning a Scheme) is called with keyword arguments describing the
model -- d_model, n_heads, head_dim, n_layers, max_len, vocab_size, rope_base, rope_layout, rope_scaling, plus the
model's scheme_options -- and receives only those its signature names (all of them if it takes ``**kwargs``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Mapping

from posenc._internal.registry import call_with_accepted, check_new_name, origin_of
from posenc._internal.validate import check_choice, check_int, heads_divide
from posenc._internal.errors import ConfigError, PosencError
from posenc.schemes.base import Scheme


@dataclass(frozen=True)
class SchemeEntry:
    """A registered scheme: its factory, a one-line description and where it was registered (for messages)."""

    name: str
    factory: Callable[..., Scheme]
    description: str = ""
    origin: str = ""


# name -> entry, in registration order (built-ins first); read through scheme_names() / make_scheme()
SCHEMES: dict[str, SchemeEntry] = {}


def register_scheme(name: str, *, description: str = "", replace: bool = False):
    """Decorator adding a Scheme subclass or a factory function to ``SCHEMES`` under ``name``."""
    check_new_name("scheme", name, SCHEMES, replace)

    def decorator(factory):
        if inspect.isclass(factory) and not issubclass(factory, Scheme):
            raise ConfigError(f"scheme {name!r}: {factory.__name__} (in {origin_of(factory)}) must subclass "
                              "posenc.schemes.Scheme")
        if not callable(factory):
            raise ConfigError(f"scheme {name!r}: expected a Scheme subclass or a factory function, got "
                              f"{type(factory).__name__}")
        doc = description or (inspect.getdoc(factory) or "").split("\n")[0]
        SCHEMES[name] = SchemeEntry(name, factory, doc, origin_of(factory))
        return factory

    return decorator


class SchemeError(PosencError):
    """A scheme's hook returned what the model cannot use; the message names the scheme and its file."""


def scheme_label(scheme) -> str:
    """"scheme 'mine' (registered by /path/mine.py)" for a scheme instance (a per-layer view included)."""
    name = getattr(scheme, "name", "") or type(scheme).__name__
    entry = SCHEMES.get(name)
    origin = entry.origin if entry is not None else origin_of(type(scheme))
    return f"scheme {name!r} (registered by {origin})"


# what make_scheme offers every factory besides scheme_options: not an option name
MODEL_ARGUMENTS = frozenset({"d_model", "n_heads", "head_dim", "n_layers", "max_len", "vocab_size", "rope_base",
                             "rope_layout", "rope_scaling"})


def option_names(name: str) -> frozenset[str] | None:
    """The scheme-specific options scheme ``name``'s factory takes (its keyword parameters that are not the model
    description); None when it takes any (**kwargs) or has no readable signature."""
    factory = SCHEMES[name].factory
    if inspect.isclass(factory) and _inherits_module_init(factory):
        return frozenset()   # make_scheme calls it without arguments
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                     and p.name != "self") - MODEL_ARGUMENTS


def scheme_names() -> tuple[str, ...]:
    """Registered scheme names in registration order."""
    return tuple(SCHEMES)


def check_scheme(name, argument: str = "scheme") -> str:
    """``name`` if registered, else ConfigError naming ``argument`` and listing the schemes."""
    return check_choice(name, argument, SCHEMES, error=ConfigError)


def _inherits_module_init(cls) -> bool:
    """True when no class between ``cls`` and torch's nn.Module defines __init__."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            return klass.__module__.startswith("torch.")
    return True


def make_scheme(name: str, *, d_model: int, n_heads: int, max_len: int, n_layers: int = 1, vocab_size: int = 256,
                rope_base: float = 10000.0, rope_layout: str = "half", rope_scaling: Mapping | None = None,
                **options) -> Scheme:
    """Build the registered scheme ``name`` for a model of this shape. ``max_len`` is the training length (a
    learned table's size, RoPE's max_position_embeddings); ``options`` are scheme-specific settings."""
    check_scheme(name)
    entry = SCHEMES[name]
    head_dim = heads_divide(d_model, n_heads, error=ConfigError)
    model = dict(d_model=d_model, n_heads=n_heads, head_dim=head_dim,
                 n_layers=check_int(n_layers, "n_layers", min=1, error=ConfigError),
                 max_len=check_int(max_len, "max_len", min=1, error=ConfigError), vocab_size=vocab_size,
                 rope_base=rope_base, rope_layout=rope_layout, rope_scaling=rope_scaling, **options)
    factory = entry.factory
    if inspect.isclass(factory) and _inherits_module_init(factory):
        scheme = factory()  # no __init__ of its own: nn.Module's takes nothing we should pass
    else:
        scheme = call_with_accepted(factory, model, f"scheme {name!r} (registered in {entry.origin})")
    if not isinstance(scheme, Scheme):
        raise ConfigError(f"scheme {name!r} (registered in {entry.origin}): the factory returned "
                          f"{type(scheme).__name__}, expected a posenc.schemes.Scheme")
    scheme.name = name
    return scheme
