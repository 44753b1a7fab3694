"""What ``posenc eval`` measures (``EvalSettings``) and the checks of its settings: lengths, tasks, methods (config
edits or attention methods), factor, data, dtype, device and threads, each refused as one line naming it."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields

from posenc._internal.devices import check_device
from posenc._internal.errors import ConfigError
from posenc.hf.loading import DTYPES, check_attn_implementation


def flag(default, help: str, *, type=None, shared: str | None = None, name: str | None = None, choices=None,
         metavar: str | None = None):
    """An EvalSettings field and the ``posenc eval`` flag that sets it (posenc.hf.eval.command makes one flag per
    field): ``shared`` names a flag of posenc._internal.flags (its type and old spellings), else ``type`` parses
    the value (a bool field is a store_true flag); ``name``: the flag where it is not the field's (--replace);
    ``choices``: the values, or a function returning them (imported when the parser is built)."""
    meta = {"help": help, "type": type, "shared": shared, "flag": name, "choices": choices, "metavar": metavar}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: _copy(default), metadata=meta)
    return field(default=default, metadata=meta)


def _copy(value):
    return list(value) if isinstance(value, list) else dict(value)


def _data_splits():
    from posenc.hf.lab_bridge import DATA_SPLITS

    return DATA_SPLITS


def _ints(text):
    from posenc._internal.argtypes import ints

    return ints(text)


def _names(text):
    from posenc._internal.flags import names

    return names(text)


@dataclass
class EvalSettings:
    """What ``evaluate_model`` measures. Lengths count the model's tokens. Each field declares its ``posenc eval``
    flag (``flag``): a new setting is one field here."""

    eval_lens: list[int] = flag([128, 256, 512, 1024], "lengths in tokens", type=_ints)
    tasks: list[str] = flag(["lm"], "registered tasks, comma-separated (lm, passkey, copy, a plug-in's)", type=_names)
    # "none" = the config as it is
    methods: list[str] = flag(["none"], "none and/or extension methods: written into the config (linear,ntk,dynamic,"
                              "yarn,...) or applied to attention by posenc.patch (self-extend,rerope,leaky-rerope,"
                              "dca,sinks)", shared="methods")
    factor: float | None = flag(None, "extension factor (target / original context)", shared="factor")
    # attention methods' options, "method.option" -> value (e.g. {"self-extend.window": 1024})
    method_options: dict = flag({}, "attention methods' options, method.option=value,... (e.g. self-extend."
                                "group_size=8,self-extend.window=1024,sinks.n_sink=4)", shared="method_options")
    replace_scaling: bool = flag(False, "replace a rope scaling the config already has: a frequency method is "
                                 "computed from its original context, an attention method runs on its original "
                                 "(unscaled) RoPE", name="--replace")
    config: str | None = flag(None, "load the model with this config file instead of its config.json (posenc search "
                              "output)", type=str)
    data: str | None = flag(None, "text file or folder (default: the CPython stdlib, as the lab); perplexity scores "
                            "its validation split, as the lab does: a file's last 10%% of bytes, a folder's files "
                            "whose sha256(relative path) starts below 26 (about 10%%); --data-split all scores all "
                            "of it", shared="data")
    data_split: str = flag("validation", "what of the --data text perplexity scores: validation (default: the lab's "
                           "validation split, the text a lab model was not trained on) or all (a file's bytes in "
                           "order; a folder's training files, then its validation files)", type=str,
                           choices=_data_splits)
    eval_tokens: int = flag(49152, "tokens scored per length (whole windows of it); a text too short for every "
                            "length to score them, after --eval-offset, is refused", type=int)
    eval_offset: int = flag(0, "tokens of the text skipped before the first window (windows at a fixed offset: "
                            "--eval-offset 16384 --eval-tokens 16384 scores the second 16k window alone)", type=int)
    sliding_stride: int = flag(-1, "-1: half the length; 0: off; S: stride", type=int)
    sliding_lens: list[int] = flag([], "lengths for the sliding protocol", type=_ints)   # empty: the longest
    sliding_tokens: int | None = flag(None, "tokens scored per sliding length (default: --eval-tokens), as posenc "
                                      "lab's flag", type=int)
    seed: int = flag(0, "seed of the random passkey keys (default 0)", shared="seed")
    device: str = flag("cpu", "cpu, cuda, cuda:1, ...", shared="device")
    dtype: str = flag("float32", "weights and activations (default float32)", shared="dtype")
    device_map: str | None = flag(None, "auto: accelerate's multi-device load", type=str, choices=("auto",))
    attn_implementation: str | None = flag(None, "eager, sdpa, flash_attention_2 (default: model's)", type=str)
    # off: today's sdpa square on sliding layers too (posenc.hf.band_route; a model without them is sdpa either way)
    no_band_attention: bool = flag(False, "sliding-window layers (Gemma 3's local layers, Mistral-style windows) run "
                                   "transformers' sdpa over the whole masked square (default with sdpa: only the "
                                   "keys inside each window, band_attention, when the mask is the plain sliding "
                                   "one; full-attention layers run sdpa either way)", shared="no_band_attention")
    batch_tokens: int | None = flag(None, "tokens per forward (default: as many windows as keep logits ~256 MiB)",
                                    type=int)
    # the settings registered tasks declare (passkey_depths, passkey_trials, a plug-in's own): name -> value; their
    # flags are the tasks' declarations (and --task-options)
    options: dict = field(default_factory=dict)

    def __init__(self, **settings):
        """Fields by name; a setting a registered task declares (``passkey_trials=2``) goes into ``options``."""
        names = {f.name for f in fields(EvalSettings)}
        options = dict(settings.pop("options", None) or {})
        options.update({k: settings.pop(k) for k in list(settings) if k not in names})
        for f in fields(EvalSettings):
            if f.name != "options":
                default = f.default_factory() if f.default_factory is not MISSING else f.default
                setattr(self, f.name, settings.get(f.name, default))
        self.options = options

    def to_dict(self) -> dict:
        """As results.json records them: the declared task settings flat beside the fields."""
        out = asdict(self)
        return {**out, **out.pop("options")}

    def validate(self) -> "EvalSettings":
        from posenc._internal.validate import check_choice, check_distinct, check_float, check_int
        from posenc.hf.lab_bridge import DATA_SPLITS

        from posenc._internal.settings import check_settings
        from posenc.lab.tasks.registry import TASK_SETTINGS, TASKS

        for name in ("eval_lens", "tasks", "methods"):
            if not getattr(self, name):
                raise ConfigError(f"{name}: expected at least one entry, got none")
        self.methods, self.method_options = expand_patch_specs(self.methods, self.method_options)
        for name in ("eval_lens", "sliding_lens", "tasks", "methods"):
            check_distinct(getattr(self, name), name, error=ConfigError)
        from posenc.lab.tasks.registry import expand_tasks

        self.tasks = expand_tasks(self.tasks)          # group names (ruler) -> their tasks
        from posenc.lab.presets import SIZE_LIMITS
        from posenc.tools.contexts import MAX_CONTEXT

        # every length and count has a bound (a context no config states; the lab's token and trial bounds)
        self.eval_lens = [check_int(n, "eval_lens", min=2, max=MAX_CONTEXT, error=ConfigError) for n in self.eval_lens]
        self.sliding_lens = [check_int(n, "sliding_lens", min=2, max=MAX_CONTEXT, error=ConfigError)
                             for n in self.sliding_lens]
        for t in self.tasks:
            check_choice(t, "tasks", TASKS, error=ConfigError)
        self.options = check_settings(TASK_SETTINGS, self.options)
        attention = attention_methods(self.methods)
        for m in self.methods:
            if m not in attention:
                check_method(m)
        self.options_for(None)
        if any(m != "none" and m not in attention for m in self.methods):
            if self.factor is None:
                raise ConfigError("factor: extension methods need --factor F (target / original context), e.g. 4")
            check_float(self.factor, "factor", min=1.0, max=float(MAX_CONTEXT), error=ConfigError)
        elif self.factor is not None and attention:
            # the target the rules' defaults plan for
            check_float(self.factor, "factor", min=1.0, max=float(MAX_CONTEXT), error=ConfigError)
        elif self.factor is not None:
            raise ConfigError(f"factor: {self.factor!r} given, but only extension methods use it and methods is "
                              f"{','.join(self.methods)}: pass --methods with a method (e.g. --methods none,yarn) "
                              "or drop --factor")
        check_int(self.eval_tokens, "eval_tokens", min=1, max=SIZE_LIMITS["eval_tokens"], error=ConfigError)
        check_int(self.eval_offset, "eval_offset", min=0, max=SIZE_LIMITS["eval_tokens"], error=ConfigError)
        if self.sliding_tokens is None:   # both protocols score one text, as the lab's get_preset keeps them
            self.sliding_tokens = self.eval_tokens
        check_int(self.sliding_tokens, "sliding_tokens", min=1, max=SIZE_LIMITS["sliding_tokens"], error=ConfigError)
        check_int(self.sliding_stride, "sliding_stride", min=-1, error=ConfigError)
        if self.sliding_stride > min(self.sliding_lens or [max(self.eval_lens)]):
            raise ConfigError(f"sliding_stride: expected -1 (auto), 0 (off) or at most the sliding length, got "
                              f"{self.sliding_stride}")
        check_choice(self.dtype, "dtype", DTYPES, error=ConfigError)
        check_choice(self.data_split, "data_split", DATA_SPLITS, error=ConfigError)
        if self.device_map is not None:
            check_choice(self.device_map, "device_map", ("auto",), error=ConfigError)
        if self.batch_tokens is not None:
            check_int(self.batch_tokens, "batch_tokens", min=1, max=MAX_CONTEXT, error=ConfigError)
        check_device(self.device)
        check_attn_implementation(self.attn_implementation)
        self.check_tasks()
        return self

    def check_tasks(self) -> None:
        """Each task's own check of these settings (``Task.check``, as the lab's LabConfig.validate calls it)."""
        from posenc.lab.tasks import get_task

        for name in self.tasks:
            get_task(name).check(task_settings(self))

    def options_for(self, method: str | None) -> dict:
        """``method``'s options from method_options ({option: value}); None: check every key ("method.option" for
        an attention method of ``methods`` and one of its options) and return {}."""
        from posenc.extensions.catalogue import method_options

        return method_options(self.method_options, attention_methods(self.methods), method, "method_options")


def expand_patch_specs(methods, method_options) -> tuple[list[str], dict]:
    """``methods`` with each patch spec file (an entry ending in .json, what ``posenc tune`` writes and
    ``posenc.patch`` reads) replaced by its method, and its fields added to ``method_options`` as
    "method.field" keys, so that the spec runs exactly as ``--methods M --method-options M.field=value`` does.
    ConfigError (naming methods) for an unreadable spec, or a field that --method-options also sets."""
    from posenc.attention.spec import is_patch_spec, read_patch_spec, rule_spec

    out, options = [], dict(method_options or {})
    for entry in methods:
        if not is_patch_spec(entry):
            out.append(entry)
            continue
        spec = rule_spec(read_patch_spec(entry))      # checked by the registry, as posenc.patch reads it
        method = spec.pop("method")
        for name, value in spec.items():
            key = f"{method}.{name}"
            if key in options:
                raise ConfigError(f"methods: patch spec {entry} sets {key}, and method_options sets it too: "
                                  "give it in one place")
            options[key] = value
        out.append(method)
    return out, options


def method_choices() -> tuple[str, ...]:
    """Every name --methods takes: none, the frequency methods a config edit expresses, request-sized YaRN (each
    length its own factor, ``posenc.hf.request_yarn``), the attention methods."""
    from posenc.attention import attention_method_names
    from posenc.hf.lab_bridge import config_methods
    from posenc.hf.request_yarn import EVAL_METHOD

    return ("none", *config_methods(), EVAL_METHOD, *attention_method_names())


def check_method(name) -> str:
    """``name`` if --methods takes it as a config edit (none or a frequency method); ConfigError listing every name
    --methods takes for an unknown one, or saying what to use instead for a registered method eval cannot run."""
    from posenc._internal.validate import check_choice
    from posenc.extensions import METHODS
    from posenc.hf.lab_bridge import check_config_method
    from posenc.hf.request_yarn import EVAL_METHOD

    if name == EVAL_METHOD:
        return name
    if name not in METHODS:
        check_choice(name, "methods", method_choices(), error=ConfigError)
    return check_config_method(name, "methods", also=("none",))


def attention_methods(methods) -> tuple[str, ...]:
    """The entries of ``methods`` that change attention (posenc.attention's registry): applied to the loaded model by
    posenc.patch, not written into its config."""
    from posenc.attention import is_attention_method

    return tuple(m for m in methods if is_attention_method(m))


def check_threads(threads, name: str = "threads") -> int | None:
    """CPU threads for torch: None or 0 = torch's own choice, else a count up to the lab's own limit (ConfigError
    naming ``name``): torch.set_num_threads refuses a negative count only with its own RuntimeError."""
    from posenc._internal.validate import check_int
    from posenc.lab.presets import SIZE_LIMITS

    return None if threads is None else check_int(threads, name, min=0, max=SIZE_LIMITS["threads"], error=ConfigError)


@dataclass
class EvalTaskSettings:
    """The settings a registered task reads (``ev.cfg``) when posenc eval runs it: the lab's names for what an eval
    has (train_len is the model's original context), and the tasks' declared settings in ``options``.
    ``scores_only``: nothing is trained, so a length a task cannot score is an n/a row, not a refusal."""

    train_len: int | None
    eval_lens: list[int]
    options: dict
    eval_tokens: int
    sliding_stride: int
    sliding_lens: list[int]
    sliding_tokens: int
    seeds: list[int]
    train_until: float = 0.0
    scores_only: bool = True


def task_settings(s: EvalSettings, train_len: int | None = None) -> EvalTaskSettings:
    """``s`` as the tasks read it (``ev.cfg``)."""
    return EvalTaskSettings(train_len=train_len, eval_lens=list(s.eval_lens), options=dict(s.options),
                            eval_tokens=s.eval_tokens, sliding_stride=s.sliding_stride,
                            sliding_lens=list(s.sliding_lens), sliding_tokens=s.sliding_tokens, seeds=[s.seed])
