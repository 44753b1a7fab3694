"""The attention-method registry: name -> the rule class (a frozen dataclass subclass of ``AttentionRule``) with its
display label, what it costs at inference and the evidence. The one owner of the list of attention methods and of
turning a method name and options into a rule, so that the string form ``posenc.patch(model, method="self-extend",
window=1024)`` and the typed form ``posenc.patch(model, posenc.SelfExtend(window=1024))`` reach the same rule.

    >>> @register_attention_method("window", label="sliding window", costs="one pass over the window")
    ... @dataclass(frozen=True)
    ... class Window(AttentionRule):
    ...     window: int | None = None
    ...     def resolve(self, original, target):
    ...         return self.with_defaults(window=original)
    ...     def modes(self):
    ...         return (window_mode("recent", self.window),)

Readers: the lab (``posenc lab --extensions``: zero-shot rows under ``RuleScheme``), ``posenc eval --methods`` and
``posenc.patch`` (posenc/hf/attention_patch.py), ``posenc pick`` (labels, costs, notes), the reports and plots.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass

from posenc._internal.registry import check_new_name, origin_of
from posenc._internal.validate import check_choice, check_int
from posenc.attention.rules import AttentionRule
from posenc._internal.errors import ConfigError


@dataclass(frozen=True)
class AttentionMethod:
    """A registered attention method: its rule class, display label, inference costs and evidence (``note``)."""

    name: str
    rule: type
    label: str
    costs: str = ""
    note: str = ""
    origin: str = ""

    @property
    def options(self) -> tuple[str, ...]:
        """The rule's fields: the method's options (every one may be left out and derived from the trained length)."""
        return tuple(f.name for f in fields(self.rule))


# name -> method, in registration order (built-ins: self-extend, rerope, leaky-rerope, dca, sinks)
ATTENTION_METHODS: dict[str, AttentionMethod] = {}


def register_attention_method(name: str, *, label: str, costs: str = "", note: str = "", replace: bool = False):
    """Class decorator registering a rule class as attention method ``name`` (and setting the class's ``name``).

    The class is a frozen dataclass subclass of ``AttentionRule``; its fields are the method's options, validated in
    ``__post_init__`` (ConfigError naming the field) and, where None, derived in ``resolve(original, target)``.
    label: display name (reports, plots, pick); costs: what it costs at inference (score passes, cache handling,
    what it cannot see); note: the evidence (cited by pick).
    """
    check_new_name("attention method", name, ATTENTION_METHODS, replace)
    if not isinstance(label, str) or not label:
        raise ConfigError(f"attention method {name!r}: label must be a non-empty string, got {label!r}")

    def decorator(cls):
        if not (isinstance(cls, type) and issubclass(cls, AttentionRule) and is_dataclass(cls)):
            raise ConfigError(f"attention method {name!r}: expected a dataclass subclass of AttentionRule, got "
                              f"{getattr(cls, '__name__', type(cls).__name__)}")
        cls.name = name
        ATTENTION_METHODS[name] = AttentionMethod(name=name, rule=cls, label=label, costs=str(costs),
                                                  note=str(note), origin=origin_of(cls))
        return cls

    return decorator


def attention_method_names() -> tuple[str, ...]:
    """Registered attention methods in registration order."""
    return tuple(ATTENTION_METHODS)


def is_attention_method(name) -> bool:
    """True when ``name`` (or the rule ``name`` is) names a registered attention method."""
    if isinstance(name, AttentionRule):
        return True
    return isinstance(name, str) and name in ATTENTION_METHODS


def get_attention_method(name, argument: str = "method") -> AttentionMethod:
    """The registered attention method ``name``, or ConfigError naming ``argument`` and listing the methods."""
    return ATTENTION_METHODS[check_choice(name, argument, ATTENTION_METHODS, error=ConfigError)]


def as_rule(method, argument: str = "method", **options) -> AttentionRule:
    """The rule that ``method`` names: a rule object as it is (it takes no further ``options``), or a method name
    with its options, built into its rule class (ConfigError for an option the method lacks)."""
    if isinstance(method, AttentionRule):
        if options:
            raise ConfigError(f"{', '.join(sorted(options))}: a {method.name or type(method).__name__} rule holds "
                              "its options; give them to the rule, not beside it")
        return method
    entry = get_attention_method(method, argument)
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        raise ConfigError(f"attention method {entry.name!r} takes no option {', '.join(unknown)}"
                          + (f" (options: {', '.join(entry.options)})" if entry.options else ""))
    return entry.rule(**options)


def attention_rule(method, spec, **options) -> AttentionRule:
    """The resolved rule that attention method ``method`` (a name with ``options``, or a rule) gives a model trained
    at ``spec.original`` for inputs up to ``spec.target`` (an ``ExtensionSpec``, or anything with those two ints):
    the fields left out are derived from those lengths, as the method's paper or code suggests."""
    rule = as_rule(method, **options)
    original = check_int(spec.original, "original", min=1, error=ConfigError)
    target = check_int(spec.target, "target", min=1, error=ConfigError)
    resolved = rule.resolve(original, target)
    if not isinstance(resolved, AttentionRule):
        raise ConfigError(f"attention method {rule.name!r} ({type(rule).__name__}.resolve) must return an "
                          f"AttentionRule, got {type(resolved).__name__}")
    resolved.check_resolved()
    return resolved
