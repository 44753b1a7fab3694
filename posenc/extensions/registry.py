"""The extension-method registry: name -> how the method writes a RoPE scaling config; the one owner of the list
of context-extension methods, their display labels, their defaults and whether they expect fine-tuning.

    >>> @register_method("half-pi", label="half PI", expects_finetune=True)
    ... def half_pi(spec):
    ...     return {"rope_type": "linear", "factor": spec.factor / 2}

A method's ``write(spec, **options)`` returns the rope scaling mapping in posenc's registry form (``rope_type`` plus
its keys, as ``posenc.rope_parameters`` reads it) for an ``ExtensionSpec`` (original length L0, factor s, rotary
dim, theta). ``method_config`` adds max_position_embeddings and notes. Readers: the lab (evaluation and
fine-tuning), ``posenc extend`` (which writes the transformers 4.x/5.x form), ``posenc plot scaling``,
``posenc pick`` and the lab's report and plots (labels, order). docs/architecture.md describes every field.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from posenc._registry import check_new_name, origin_of
from posenc._settings import declare
from posenc._validate import check_bool, check_choice, check_float, check_int, even_int
from posenc.errors import ConfigError
from posenc.extensions.attention.rules import AttentionRule

# What a method changes: "frequency" methods write a RoPE scaling config (rope_type + keys); "attention" methods
# keep the frequencies and change which positions query-key pairs see (Self-Extend, ReRoPE, DCA, attention sinks):
# their write(spec, **options) returns an ``AttentionRule`` (posenc/extensions/attention/rules.py). Readers branch on
# this kind, never on method names.
KINDS = ("frequency", "attention")


@dataclass(frozen=True)
class ExtensionSpec:
    """What every method is told: original (pre-extension) context L0, factor s, rotary dim d, RoPE base theta,
    and the target length (default round(s * L0)); head_dim defaults to the rotary dim. rotary_dim may be None
    when unknown (a config snippet); methods that need it (LongRoPE's initialisation) then raise."""

    original: int
    factor: float
    rotary_dim: int | None
    theta: float = 10000.0
    target: int | None = None
    head_dim: int | None = None

    def __post_init__(self):
        check_int(self.original, "original", min=1, error=ConfigError)
        check_float(self.factor, "factor", min=1.0, error=ConfigError)
        if self.rotary_dim is not None:
            even_int(self.rotary_dim, "rotary_dim", error=ConfigError)
        check_float(self.theta, "theta", positive=True, error=ConfigError)
        if self.target is None:
            object.__setattr__(self, "target", int(round(self.factor * self.original)))
        check_int(self.target, "target", min=1, error=ConfigError)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.rotary_dim)

    def geometry(self) -> dict:
        """A minimal HF-style config of this RoPE (head_dim, rotary dim, theta) for asking the rope-type registry."""
        if self.rotary_dim is None:
            raise ConfigError("rotary_dim: this method needs the rotary dimension, got None")
        return {"head_dim": self.head_dim, "rotary_dim": self.rotary_dim, "rope_theta": self.theta}


@dataclass(frozen=True)
class MethodConfig:
    """A method's output: the rope scaling mapping, the max_position_embeddings to go with it, and notes."""

    scaling: dict
    max_position_embeddings: int
    notes: tuple[str, ...] = ()
    details: dict = field(default_factory=dict)  # what a ``fit`` reported (search time, scores), for results.json


@dataclass
class FitContext:
    """What a method that computes its config from a trained model receives (``fit``; LongRoPE's search).

    model: the trained model (a TinyLM whose scheme is ``extendable``); task: the lab task name; corpus: the
    lab's Corpus (train and val byte tensors) or None for synthetic tasks; device; seed; eval_lens; settings:
    the lab's settings dict; out: the run folder (for the method's own checkpoints); progress: show bars.
    """

    model: Any
    task: str
    corpus: Any
    device: Any
    seed: int
    eval_lens: list
    settings: dict = field(default_factory=dict)
    out: Any = None
    progress: bool = True
    resume: bool = False


@dataclass(frozen=True)
class ExtensionMethod:
    """A registered method (see ``register_method`` for the fields)."""

    name: str
    write: Callable[..., dict]
    label: str
    expects_finetune: bool = False
    note: str = ""
    defaults: Mapping = field(default_factory=dict)
    keeps_original_length: bool = False
    lab_factor: float | None = None
    transformers_form: Callable[[dict, ExtensionSpec], tuple[dict, list]] | None = None
    fit: Callable[[ExtensionSpec, FitContext], dict | tuple[dict, dict]] | None = None
    train_positions: Callable[..., Any] | None = None
    needs_corpus: bool = False
    options: tuple[str, ...] = ()
    origin: str = ""
    settings: tuple = ()        # posenc._settings.Setting: the lab's settings of a fit (its flags, validation)
    kind: str = "frequency"
    costs: str = ""          # what the method costs at inference (attention kind: score passes, cache, what is lost)

    @property
    def changes_attention(self) -> bool:
        return self.kind == "attention"


# name -> method, in registration order (built-ins first: linear, ntk, dynamic, yarn, llama3, longrope)
METHODS: dict[str, ExtensionMethod] = {}
# setting name -> its declaration, over every registered method (a name belongs to one method)
METHOD_SETTINGS: dict = {}


def register_method(name: str, *, label: str, expects_finetune: bool = False, note: str = "",
                    defaults: Mapping | None = None, keeps_original_length: bool = False,
                    lab_factor: float | None = None, transformers_form: Callable | None = None,
                    fit: Callable | None = None, train_positions: Callable | None = None,
                    needs_corpus: bool = False, settings=(), kind: str = "frequency", costs: str = "",
                    replace: bool = False):
    """Decorator registering ``write(spec, **options) -> rope scaling mapping`` as extension method ``name``.

    label: display name (reports, plots, extend). expects_finetune / note: whether the method is meant to be
    fine-tuned, and the evidence. defaults: fixed parameters, written once (the write function reads them from
    ``METHODS[name].defaults``). keeps_original_length: max_position_embeddings stays L0 (dynamic NTK) instead of
    the target. lab_factor: the factor the lab evaluates with instead of target / L0. transformers_form(scaling,
    spec) -> (scaling, notes): the form transformers reads when the rope_type is posenc's own. fit(spec, ctx:
    FitContext) -> scaling, or (scaling, details): compute the config from the trained model and data (the lab
    calls it before evaluating; ``details``, e.g. the search time, go into results.json). train_positions(batch,
    seq_len, spec, generator) -> LongTensor [batch, seq_len]: a fine-tuning method that trains at the ORIGINAL
    length with these position ids (PoSE); the lab fine-tunes it at L0 and has no zero-shot row for it (its
    zero-shot model is the plain scaling's). needs_corpus: ``fit`` reads the lab's text corpus (``ctx.corpus``), so
    the lab refuses the method before training unless a task loads it. settings: the lab settings ``fit`` reads
    from ``ctx.settings`` (``posenc._settings.Setting`` declarations: ``posenc lab`` makes their flags and checks
    them). Options: the write function's keyword-only arguments (e.g. longrope's factor lists). kind: "frequency"
    (write returns a rope scaling mapping) or "attention" (write returns an AttentionRule; no scaling, the model's
    RoPE stays; read with ``attention_rule``); costs: what an attention method costs (extra score passes, cache
    handling, what it cannot see).
    """
    check_new_name("extension method", name, METHODS, replace)
    kind = check_choice(kind, "kind", KINDS, error=ConfigError)
    if kind == "attention" and (fit or train_positions or transformers_form or keeps_original_length or lab_factor):
        raise ConfigError(f"extension method {name!r}: an attention method takes no fit, train_positions, "
                          "transformers_form, keeps_original_length or lab_factor (those describe frequency scaling)")
    if not isinstance(label, str) or not label:
        raise ConfigError(f"extension method {name!r}: label must be a non-empty string, got {label!r}")
    for hook_name, hook in (("transformers_form", transformers_form), ("fit", fit),
                            ("train_positions", train_positions)):
        if hook is not None and not callable(hook):
            raise ConfigError(f"extension method {name!r}: {hook_name} must be callable, got {type(hook).__name__}")

    def decorator(write):
        if not callable(write):
            raise ConfigError(f"extension method {name!r}: expected a function write(spec, **options), got "
                              f"{type(write).__name__}")
        options = tuple(p.name for p in inspect.signature(write).parameters.values() if p.kind is p.KEYWORD_ONLY)
        owner = f"extension method {name}"
        declared = declare(settings, owner, {k: v for k, v in METHOD_SETTINGS.items() if v.owner != owner})
        for k in [k for k, v in METHOD_SETTINGS.items() if v.owner == owner]:
            del METHOD_SETTINGS[k]
        METHOD_SETTINGS.update({s.name: s for s in declared})
        METHODS[name] = ExtensionMethod(
            name=name, write=write, label=label, expects_finetune=bool(expects_finetune), note=note,
            defaults=dict(defaults or {}), keeps_original_length=bool(keeps_original_length),
            lab_factor=None if lab_factor is None else check_float(lab_factor, "lab_factor", min=1.0,
                                                                    error=ConfigError),
            transformers_form=transformers_form, fit=fit, train_positions=train_positions,
            needs_corpus=check_bool(needs_corpus, "needs_corpus", error=ConfigError), options=options,
            origin=origin_of(write), settings=declared, kind=kind, costs=str(costs))
        return write

    return decorator


def method_names(kind: str | None = None) -> tuple[str, ...]:
    """Registered method names in registration order (only those of ``kind`` when given)."""
    if kind is not None:
        kind = check_choice(kind, "kind", KINDS, error=ConfigError)
    return tuple(name for name, m in METHODS.items() if kind is None or m.kind == kind)


def get_method(name, argument: str = "method") -> ExtensionMethod:
    """The registered method ``name``, or ConfigError naming ``argument`` and listing the methods."""
    return METHODS[check_choice(name, argument, METHODS, error=ConfigError)]


def method_label(name: str) -> str:
    """Display label of a method; an unregistered name (an old results file) shows as itself."""
    return METHODS[name].label if name in METHODS else name


def method_config(name: str, spec: ExtensionSpec, *, scaling: Mapping | None = None, details: Mapping | None = None,
                  **options) -> MethodConfig:
    """The config method ``name`` writes for ``spec``: its scaling mapping (or ``scaling``, e.g. from ``fit``, with
    its ``details``), max_position_embeddings (the target, or L0 for methods that keep it) and notes. ``options``
    go to write()."""
    method = get_method(name)
    if method.changes_attention:
        raise ConfigError(f"extension method {name!r} changes attention, not RoPE's frequencies: it has no rope "
                          "scaling config (use attention_rule, or posenc.patch(model, method=...))")
    _check_options(method, options)
    notes: list[str] = []
    if scaling is None:
        out = method.write(spec, **options)
        scaling, notes = (out if isinstance(out, tuple) else (out, []))
    if not isinstance(scaling, Mapping) or "rope_type" not in scaling:
        raise ConfigError(f"extension method {name!r} (registered in {method.origin}) must write a mapping with a "
                          f"'rope_type', got {scaling!r}")
    length = spec.original if method.keeps_original_length else spec.target
    return MethodConfig(dict(scaling), int(length), tuple(notes), dict(details or {}))


def _check_options(method: ExtensionMethod, options: Mapping) -> None:
    unknown = set(options) - set(method.options)
    if unknown:
        raise ConfigError(f"extension method {method.name!r} takes no option {', '.join(sorted(unknown))}"
                          + (f" (options: {', '.join(method.options)})" if method.options else ""))


def attention_rule(name: str, spec: ExtensionSpec, **options):
    """The AttentionRule that attention method ``name`` gives a model trained at ``spec.original`` (its options
    override the defaults derived from the trained length)."""
    method = get_method(name)
    if not method.changes_attention:
        raise ConfigError(f"extension method {name!r} rescales RoPE's frequencies (kind 'frequency'); it has no "
                          "attention rule (use method_config)")
    _check_options(method, options)
    rule = method.write(spec, **options)
    if not isinstance(rule, AttentionRule):
        raise ConfigError(f"extension method {name!r} (registered in {method.origin}) must return an AttentionRule, "
                          f"got {type(rule).__name__}")
    return rule


def transformers_config(name: str, config: MethodConfig, spec: ExtensionSpec) -> MethodConfig:
    """``config`` in the form transformers reads (a method whose rope_type transformers lacks converts itself)."""
    method = get_method(name)
    if method.transformers_form is None:
        return config
    scaling, notes = method.transformers_form(dict(config.scaling), spec)
    return MethodConfig(dict(scaling), config.max_position_embeddings, config.notes + tuple(notes))


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
            if option not in get_method(name).options:
                raise ConfigError(f"{argument}: {name} takes no option {option!r} (options: "
                                  f"{', '.join(get_method(name).options) or 'none'})")
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
    method = get_method(name)
    if not options or method.fit is not None:
        return
    try:
        if method.changes_attention:
            attention_rule(name, spec, **options)
        else:
            method_config(name, spec, **options)
    except ConfigError as exc:
        text = str(exc)
        option = next((o for o in options if text.startswith((f"{o} ", f"{o}:"))), None)
        raise ConfigError(f"{argument}: {name}.{text}" if option else f"{argument}: {name}: {text}") from None
