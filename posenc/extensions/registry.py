"""The frequency-method registry: name -> how the method writes a RoPE scaling config; the one owner of the list
of context-extension methods that rescale RoPE's frequencies, their display labels, their defaults and whether they
expect fine-tuning (the methods that change attention instead are ``posenc.attention``'s; ``catalogue.py`` reads
both).

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
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from posenc._internal.registry import check_new_name, origin_of
from posenc._internal.settings import declare
from posenc._internal.validate import check_bool, check_choice, check_float, check_int, even_int
from posenc.attention.registry import ATTENTION_METHODS
from posenc._internal.errors import ConfigError

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
    recalibrates: bool = False
    needs_corpus: bool = False
    options: tuple[str, ...] = ()
    origin: str = ""
    settings: tuple = ()        # posenc._internal.settings.Setting: the lab's settings of a fit (its flags, validation)


# name -> method, in registration order (built-ins first: linear, ntk, dynamic, yarn, llama3, longrope)
METHODS: dict[str, ExtensionMethod] = {}
# setting name -> its declaration, over every registered method (a name belongs to one method)
METHOD_SETTINGS: dict = {}


def register_method(name: str, *, label: str, expects_finetune: bool = False, note: str = "",
                    defaults: Mapping | None = None, keeps_original_length: bool = False,
                    lab_factor: float | None = None, transformers_form: Callable | None = None,
                    fit: Callable | None = None, train_positions: Callable | None = None,
                    recalibrates: bool = False, needs_corpus: bool = False, settings=(), replace: bool = False):
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
    zero-shot model is the plain scaling's). recalibrates: the method changes the model so much that it is
    meant to be trained again at the ORIGINAL length with ordinary positions (DroPE drops RoPE): the lab fine-tunes
    it at L0, and it has no config that a model runs without that training (``posenc extend`` refuses it).
    needs_corpus: ``fit`` reads the lab's text corpus (``ctx.corpus``), so the lab refuses the method before training
    unless a task loads it. settings: the lab settings ``fit`` reads from ``ctx.settings``
    (``posenc._internal.settings.Setting`` declarations: ``posenc lab`` makes their flags and checks them). Options:
    the write function's keyword-only arguments (e.g. longrope's factor lists). A method that changes attention
    instead of the frequencies registers with ``posenc.attention.register_attention_method``.
    """
    check_new_name("extension method", name, METHODS, replace)
    if name in ATTENTION_METHODS:
        raise ConfigError(f"extension method {name!r} is already registered as an attention method (by "
                          f"{ATTENTION_METHODS[name].origin}); choose another name")
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
            recalibrates=check_bool(recalibrates, "recalibrates", error=ConfigError),
            needs_corpus=check_bool(needs_corpus, "needs_corpus", error=ConfigError), options=options,
            origin=origin_of(write), settings=declared)
        return write

    return decorator


def method_names() -> tuple[str, ...]:
    """Registered (frequency) method names in registration order; ``all_method_names`` adds the attention ones."""
    return tuple(METHODS)


def get_method(name, argument: str = "method") -> ExtensionMethod:
    """The registered method ``name``, or ConfigError naming ``argument`` and listing the methods (an attention
    method's name is told to go to posenc.patch)."""
    if name in ATTENTION_METHODS:
        raise ConfigError(f"{argument}: {name!r} changes attention, not RoPE's frequencies: it has no rope scaling "
                          "config (posenc.patch(model, method=...) runs it)")
    return METHODS[check_choice(name, argument, METHODS, error=ConfigError)]


def method_config(name: str, spec: ExtensionSpec, *, scaling: Mapping | None = None, details: Mapping | None = None,
                  **options) -> MethodConfig:
    """The config method ``name`` writes for ``spec``: its scaling mapping (or ``scaling``, e.g. from ``fit``, with
    its ``details``), max_position_embeddings (the target, or L0 for methods that keep it) and notes. ``options``
    go to write()."""
    method = get_method(name)
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


def transformers_config(name: str, config: MethodConfig, spec: ExtensionSpec) -> MethodConfig:
    """``config`` in the form transformers reads (a method whose rope_type transformers lacks converts itself)."""
    method = get_method(name)
    if method.transformers_form is None:
        return config
    scaling, notes = method.transformers_form(dict(config.scaling), spec)
    return MethodConfig(dict(scaling), config.max_position_embeddings, config.notes + tuple(notes))
