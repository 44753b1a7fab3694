"""What ``posenc eval`` measures (``EvalSettings``) and the checks of its settings: lengths, tasks, methods (config
edits or attention methods), factor, data, dtype, device and threads, each refused as one line naming it."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields

from posenc._internal.devices import check_device
from posenc._internal.errors import ConfigError
from posenc.hf.loading import DTYPES, check_attn_implementation


@dataclass
class EvalSettings:
    """What ``evaluate_model`` measures. Lengths count the model's tokens."""

    eval_lens: list[int] = field(default_factory=lambda: [128, 256, 512, 1024])
    tasks: list[str] = field(default_factory=lambda: ["lm"])
    methods: list[str] = field(default_factory=lambda: ["none"])   # "none" = the config as it is
    factor: float | None = None             # extension factor for methods other than none
    # attention methods' options, "method.option" -> value (e.g. {"self-extend.window": 1024})
    method_options: dict = field(default_factory=dict)
    replace_scaling: bool = False           # allow replacing a scaling the config already has
    config: str | None = None               # a config file to load the model with (e.g. posenc search's output)
    data: str | None = None                 # corpus (lab semantics): None = the CPython stdlib
    data_split: str = "validation"          # what of it is scored: the lab's validation split, or "all"
    eval_tokens: int = 49152
    eval_offset: int = 0                    # tokens of the text skipped before the first window
    sliding_stride: int = -1                # -1: half the sliding length; 0: off; S: stride
    sliding_lens: list[int] = field(default_factory=list)   # empty: the longest eval length
    sliding_tokens: int | None = None       # tokens scored per sliding length; None: eval_tokens (the lab's rule)
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    device_map: str | None = None           # "auto": accelerate's placement over GPUs and CPU
    attn_implementation: str | None = None  # None: the model's default (SDPA where supported)
    batch_tokens: int | None = None         # tokens per forward; None: as many windows as keep logits ~256 MiB
    # the settings registered tasks declare (passkey_depths, passkey_trials, a plug-in's own): name -> value
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


def method_choices() -> tuple[str, ...]:
    """Every name --methods takes: none, the frequency methods a config edit expresses, the attention methods."""
    from posenc.attention import attention_method_names
    from posenc.hf.lab_bridge import config_methods

    return ("none", *config_methods(), *attention_method_names())


def check_method(name) -> str:
    """``name`` if --methods takes it as a config edit (none or a frequency method); ConfigError listing every name
    --methods takes for an unknown one, or saying what to use instead for a registered method eval cannot run."""
    from posenc._internal.validate import check_choice
    from posenc.extensions import METHODS
    from posenc.hf.lab_bridge import check_config_method

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
