"""Every context-extension method by name, of both kinds: those that rescale RoPE's frequencies (this package's
registry) and those that change attention (``posenc.attention``'s registry). The one place that answers, for a name
from a list that mixes them (``posenc lab --extensions``, ``posenc eval --methods``, reports, plots), whether it
exists, what it is called, which options it takes and whether it changes attention.
"""

from __future__ import annotations

import math
from typing import Mapping

from posenc._internal.validate import check_choice
from posenc.attention.registry import ATTENTION_METHODS, attention_rule, is_attention_method
from posenc._internal.errors import ConfigError
from posenc.extensions.registry import METHODS, ExtensionSpec, method_config


def all_method_names() -> tuple[str, ...]:
    """Every registered method: the frequency methods in registration order, then the attention methods."""
    return (*METHODS, *ATTENTION_METHODS)


def check_method(name, argument: str = "method") -> str:
    """``name`` if it names a method of either kind, else ConfigError naming ``argument`` and listing them all."""
    return check_choice(name, argument, all_method_names(), error=ConfigError)


def _entry(name: str):
    return ATTENTION_METHODS[name] if is_attention_method(name) else METHODS[check_method(name)]


def method_label(name: str) -> str:
    """Display label of a method of either kind; an unregistered name (an old results file) shows as itself."""
    return _entry(name).label if name in METHODS or name in ATTENTION_METHODS else name


def method_option_names(name: str) -> tuple[str, ...]:
    """The options method ``name`` takes (a frequency method's keyword-only arguments, an attention rule's fields)."""
    return _entry(name).options


def method_origin(name: str) -> str:
    """The module whose code implements method ``name`` (its write function, or its rule class)."""
    entry = _entry(name)
    return entry.rule.__module__ if is_attention_method(name) else entry.write.__module__


def method_options(options, methods, method: str | None, argument: str) -> dict:
    """``method``'s options from ``options`` ({"method.option": value}, as --extension-options / --method-options
    give them) as {option: value}; with ``method`` None, check every key instead (a method of ``methods`` and one of
    its declared options; ConfigError naming ``argument``) and return {}."""
    if not isinstance(options, dict):
        raise ConfigError(f"{argument}: expected method.option=value pairs, got {options!r}")
    out: dict = {}
    for key, value in options.items():
        name, dot, option = str(key).partition(".")
        if method is None:
            if not dot or name not in methods:
                raise ConfigError(f"{argument}: expected method.option=value with one of the run's methods "
                                  f"({', '.join(methods) or 'none'}), got {key!r}")
            if option not in method_option_names(name):
                raise ConfigError(f"{argument}: {name} takes no option {option!r} (options: "
                                  f"{', '.join(method_option_names(name)) or 'none'})")
            if not _finite(value):     # NaN passes every comparison a method's checks make
                raise ConfigError(f"{argument}: {key} must be a finite number, got {value!r}")
        elif name == method:
            out[option] = value
    return out


def _finite(value) -> bool:
    """False for a NaN or infinite float, also inside a list (LongRoPE's factors); True for anything else."""
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def check_option_values(name: str, spec: ExtensionSpec, options: Mapping, argument: str) -> None:
    """Method ``name``'s ``write`` run once with ``options`` on ``spec`` (what it will be given), so that a bad value
    (a negative window) is refused before any model is trained or loaded, in one line naming ``argument`` and the
    option ("extension_options: self-extend.window must be a positive integer, got -1"). A method computed by
    ``fit`` (LongRoPE's search) is checked when it runs."""
    if not options or (name in METHODS and METHODS[name].fit is not None):
        return
    try:
        if is_attention_method(name):
            attention_rule(name, spec, **options)
        else:
            method_config(name, spec, **options)
    except ConfigError as exc:
        text = str(exc)
        option = next((o for o in options if text.startswith((f"{o} ", f"{o}:"))), None)
        raise ConfigError(f"{argument}: {name}.{text}" if option else f"{argument}: {name}: {text}") from None
