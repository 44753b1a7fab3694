"""Lab settings and the named presets. Every setting can be overridden from the command line.

    smoke    CI: every task and scheme end to end on a toy model, well under a minute on 2 cores
    default  the LM extrapolation comparison (nope, sinusoidal, learned, rope, alibi) + zero-shot extension
             methods on the RoPE model, train length 128, evaluated to 8x; a few minutes on a 2-core CPU
    ntk      the lesson's exercise 2: train at 256, test to 1024 with and without NTK-aware scaling (+ others)
    copy     the lesson's exercise 3: 4-layer model, copy task trained at 512, tested to 2048; sized for a GPU
    passkey  passkey retrieval trained as episodes at 128, exact match over a length x depth grid to 512
    extend   context extension that trains, on the default model (train 128, target 1024), seeds 0,1,2: every
             method zero-shot, LongRoPE searched on the model, each method fine-tuned 100 steps at 1024, PoSE
    extend-ntk  the same study on the ntk preset's model (train 256, target 1024)
    extend-passkey  passkey retrieval past the training length: PI and YaRN zero-shot vs fine-tuned at 512
    schemes  every registered scheme (+ rope with randomized positions) on the LM task to 8x, three seeds
    copy-cpu exercise 3 at CPU size: 4 layers, copy trained at 128, tested to 512, eleven schemes, three seeds
    ruler    RULER's retrieval tasks on byte-level models, trained at 1024, tested to 4096, three seeds
    hybrid, drope, variants   the 2025-26 lessons on the default model, three seeds: NoPE/RoPE hybrids, DroPE,
             RoPE's frequency variants (Resonance RoPE, p-RoPE, HoPE, FoPE)

``LabConfig`` holds the model (a ``ModelConfig`` template: the scheme and max_len are set per run), the training
settings (a ``TrainSettings``) and the lab's own settings. Presets and ``get_preset`` take flat setting names
(``d_model=32``, ``steps=12``) and route each to the section that owns it. "all" in tasks or schemes means every
registered one (plug-ins included).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from posenc._internal.memory import physical_memory
from posenc._internal.settings import check_settings
from posenc._internal.validate import check_choice, check_distinct, check_float, check_int, even_int, is_int
from posenc._internal.errors import ConfigError
from posenc.extensions import METHODS, check_method
from posenc.lab.curriculum import check_length_warmup
from posenc.lab.distributed import resolve_device
from posenc.lab.precision import PRECISIONS
from posenc.lab.tasks import expand_tasks, get_task, needs_corpus, task_names
from posenc.lab.train import TrainSettings
from posenc.nn.model import ModelConfig
from posenc.schemes import check_scheme, make_scheme, scheme_names

ALL = "all"


def _default_model() -> ModelConfig:
    return ModelConfig(scheme="rope", d_model=64, n_layers=2, n_heads=4, rope_base=10000.0, rope_layout="half",
                       scale_embeddings=True)  # token embeddings * sqrt(d_model) (Vaswani et al.): docs/lab.md


def _default_train() -> TrainSettings:
    return TrainSettings(steps=600, lr=3e-3, warmup=50, weight_decay=0.1, grad_clip=1.0, ckpt_every=200)


def scaled_steps(steps: int, scale: float) -> int:
    """``steps`` x ``scale`` to the nearest step: a scheme's step count under ``scheme_step_scale``."""
    return round(steps * scale)


@dataclass
class LabConfig:
    preset: str = "default"
    tasks: list = field(default_factory=lambda: ["lm"])
    schemes: list = field(default_factory=lambda: ["nope", "sinusoidal", "learned", "rope", "alibi"])
    model: ModelConfig = field(default_factory=_default_model)        # identical for every scheme
    train: TrainSettings = field(default_factory=_default_train)      # identical for every scheme
    # data (same data order per seed)
    train_len: int = 128
    batch_size: int = 20
    seeds: list = field(default_factory=lambda: [0])
    # evaluation
    eval_lens: list = field(default_factory=lambda: [128, 256, 512, 1024])
    eval_tokens: int = 49152  # tokens scored per LM eval length
    sliding_stride: int = -1  # -1: half the sliding length; 0: no sliding eval; S: stride (context = L - S)
    sliding_lens: list = field(default_factory=list)  # lengths for the sliding eval (empty: the longest eval length)
    sliding_tokens: int = 49152  # = eval_tokens (get_preset keeps them equal): both protocols score one text
    extensions: list = field(default_factory=lambda: ["linear", "ntk", "dynamic", "yarn", "llama3"])
    extended_schemes: list = field(default_factory=lambda: ["rope"])  # models evaluated under the extensions
    # per-method options, "method.option" -> value (e.g. {"self-extend.window": 32}); a method's write() receives them
    extension_options: dict = field(default_factory=dict)
    # randomized positions (Ruoss et al. 2023): train on a sorted random subset of 0..N-1 (0: off)
    randomized_positions: int = 0
    randomized_schemes: list = field(default_factory=list)  # empty: every scheme; else these, besides plain ones
    ext_factor: float = 0.0  # 0: max(eval_lens) / train_len
    finetune_steps: int = 0  # > 0: also fine-tune each method at finetune_len, then evaluate
    finetune_len: int = 0  # 0: max(eval_lens); PoSE methods (pose-*) fine-tune at train_len instead
    # train each model until its task's criterion at the training length reaches this (0: off; the copy task:
    # exact match on held-out strings), checked every check_every steps; steps is then the cap
    train_until: float = 0.0
    check_every: int = 100
    # scheme -> a multiplier of steps for its models (the cap and the schedule's length), for schemes measured to
    # learn a task more slowly (the copy-cpu preset: docs/lab.md); it follows --steps; nothing else changes
    scheme_step_scale: dict = field(default_factory=dict)
    # sequence-length warmup: [[length, steps], ...] trained before train_len, same tokens per step
    # (posenc.lab.curriculum)
    length_warmup: list = field(default_factory=list)
    # run
    device: str = "auto"
    threads: int = 0  # 0: auto (torch's default, capped at the cores left idle by other work)
    jobs: int = 0  # models trained at once, one process each (0: auto, the idle cores): posenc.lab.jobs
    precision: str = "fp32"  # fp32 | bf16 | auto (bf16 where native): posenc.lab.precision
    data: str | None = None
    out: str | None = None
    # the settings tasks and extension methods declare themselves (copy_examples, passkey_depths, search_windows,
    # a plug-in's own): name -> value, every declared one once validate() has run (posenc.lab.presets.declared)
    options: dict = field(default_factory=dict)

    def validate(self) -> "LabConfig":
        """Check every setting; errors name the setting (the CLI shows its flag) and the expected form."""
        if self.tasks == ALL or isinstance(self.tasks, (list, tuple)):   # "all" and group names (ruler)
            self.tasks = expand_tasks(self.tasks)
        if self.schemes == ALL:
            self.schemes = list(scheme_names())
        for name in ("tasks", "schemes", "extended_schemes", "extensions", "seeds", "eval_lens", "sliding_lens",
                     "randomized_schemes"):
            if isinstance(getattr(self, name), (list, tuple)):
                check_distinct(getattr(self, name), name, error=ConfigError)
        for t in self.tasks:
            get_task(t, "tasks")
        self.options = check_settings(declared(), self.options)
        for s in list(self.schemes) + list(self.extended_schemes):
            check_scheme(s, "schemes" if s in self.schemes else "extended_schemes")
        for e in self.extensions:
            check_method(e, "extensions")
        self.method_options(None)
        self.model.validate()
        self._check_scheme_options()
        even_int(self.model.head_dim, "d_model / n_heads (the head dim)", error=ConfigError)
        for name, limit in SIZE_LIMITS.items():  # sizes no lab run needs, which would only exhaust memory
            value = getattr({None: self, "model": self.model, "train": self.train}[SECTIONS[name]], name)
            for v in (value if isinstance(value, list) else [value]):
                if is_int(v) and v > limit:
                    raise ConfigError(f"{name} must be at most {limit:,}, got {v:,}")
        check_int(self.train_len, "train_len", min=2, error=ConfigError)  # one token predicts nothing from context
        for name in ("batch_size", "eval_tokens", "sliding_tokens"):
            check_int(getattr(self, name), name, min=1, error=ConfigError)
        for name in ("finetune_steps", "finetune_len", "threads", "jobs", "randomized_positions"):
            check_int(getattr(self, name), name, min=0, error=ConfigError)
        check_int(self.train.steps, "steps", min=1, error=ConfigError)
        check_int(self.train.warmup, "warmup", min=0, error=ConfigError)
        check_int(self.train.ckpt_every, "ckpt_every", min=0, error=ConfigError)
        check_float(self.train.lr, "lr", positive=True, error=ConfigError)
        check_float(self.train.weight_decay, "weight_decay", min=0.0, error=ConfigError)
        check_float(self.train.grad_clip, "grad_clip", positive=True, error=ConfigError)
        if not self.eval_lens:
            raise ConfigError("eval_lens: expected at least one length >= 2")
        for L in list(self.eval_lens) + list(self.sliding_lens):
            check_int(L, "eval_lens" if L in self.eval_lens else "sliding_lens", min=2, error=ConfigError)
        check_float(self.ext_factor, "ext_factor", min=0.0, error=ConfigError)
        check_float(self.train_until, "train_until", min=0.0, max=1.0, error=ConfigError)
        check_int(self.check_every, "check_every", min=1, error=ConfigError)
        check_float(self.train.bias_lr_scale, "bias_lr_scale", positive=True, error=ConfigError)
        check_float(self.train.min_lr_ratio, "min_lr_ratio", min=0.0, max=1.0, error=ConfigError)
        self._check_scheme_step_scale()
        fewest_steps = min([self.train.steps, *map(self.steps_for, self.scheme_step_scale)])
        self.length_warmup = check_length_warmup(self.length_warmup, train_len=self.train_len,
                                                 batch_size=self.batch_size, steps=fewest_steps)
        if self.finetune_len and self.finetune_len < self.train_len:
            raise ConfigError(f"finetune_len must be 0 (the longest eval length) or >= train_len ({self.train_len}): "
                              f"a fine-tune for a longer context trains at the longer length, got {self.finetune_len}")
        if 0 < self.ext_factor < 1:
            raise ConfigError(f"ext_factor: expected 0 (auto) or a factor >= 1, got {self.ext_factor}")
        if not self.seeds:
            raise ConfigError("seeds: expected at least one seed")
        for s in self.seeds:
            check_int(s, "seeds", min=0, error=ConfigError)
        check_int(self.sliding_stride, "sliding_stride", min=-1, error=ConfigError)
        check_choice(self.precision, "precision", PRECISIONS, error=ConfigError)
        device = resolve_device(self.device)  # a bad --device is named here, before any model or relaunch
        check_fits_in_memory(self.model, device)
        self._check_attention_memory(device)
        self._check_randomized()
        for t in self.tasks:
            get_task(t).check(self)
            if self.train_until and not get_task(t).has_criterion():
                raise ConfigError(f"train_until: task {t!r} has no training criterion (tasks with one: "
                                  f"{', '.join(n for n in task_names() if get_task(n).has_criterion())}); "
                                  "use 0 (off) or drop the task")
        self._check_schemes()
        return self

    def longest_sequence(self) -> tuple[str, int]:
        """(setting, length) of the longest sequence one forward call sees: training, evaluation, sliding windows,
        or the full-length fine-tune."""
        lengths = [("train_len", self.train_len), ("eval_lens", max(self.eval_lens))]
        if self.sliding_lens:
            lengths.append(("sliding_lens", max(self.sliding_lens)))
        if self.finetune_steps and self.extensions and any(s in self.schemes for s in self.extended_schemes):
            lengths.append(("finetune_len", self.finetune_len or max(self.eval_lens)))
        return max(lengths, key=lambda item: item[1])

    def _check_attention_memory(self, device) -> None:
        """ConfigError when a scheme that biases the logits would need more memory for one layer's [heads, T, T]
        float32 bias (+ causal mask) at the longest length than the device has: a lower bound (one row, one
        layer), checked before training instead of a process ended by the out-of-memory killer mid-run."""
        name, T = self.longest_sequence()
        need = ATTENTION_BIAS_BYTES * self.model.n_heads * T * T
        have = device_memory_bytes(device)
        if not have or need <= have:
            return
        for s in self.schemes:
            if make_scheme(s, **self.model_config(s).scheme_arguments()).capabilities.biases:
                raise ConfigError(
                    f"{name}: the {s} scheme biases the attention logits, which at {T:,} tokens takes at least "
                    f"{need / 2**30:,.1f} GiB per layer ({self.model.n_heads} heads x {T:,}^2 float32), more than "
                    f"this {device.type} device's {have / 2**30:.1f} GiB; use shorter lengths or drop the scheme")

    def _check_scheme_options(self) -> None:
        """Every scheme_options key is an option some registered scheme takes: a misspelled key (t5_bucket) would
        otherwise be dropped without a word (each factory is offered only the options it names)."""
        from posenc.schemes.registry import option_names

        known: set[str] = set()
        for s in scheme_names():
            names = option_names(s)
            if names is None:   # a scheme taking **kwargs accepts any key: nothing to check against
                return
            known |= names
        unknown = sorted(k for k in self.model.scheme_options if k not in known)
        if unknown:
            raise ConfigError(f"scheme_options: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not an "
                              f"option of any registered scheme (options: {', '.join(sorted(known))})")

    def _check_scheme_step_scale(self) -> None:
        if not isinstance(self.scheme_step_scale, dict):
            raise ConfigError(f"scheme_step_scale: expected scheme:multiplier pairs, got {self.scheme_step_scale!r}")
        for scheme, scale in self.scheme_step_scale.items():
            check_scheme(scheme, "scheme_step_scale")  # any registered scheme: a preset's entry outlives --schemes
            check_float(scale, f"scheme_step_scale ({scheme})", positive=True, error=ConfigError)
            check_int(self.steps_for(scheme), f"steps x scheme_step_scale ({scheme})", min=1,
                      max=SIZE_LIMITS["steps"], error=ConfigError)

    def steps_for(self, scheme: str) -> int:
        """Training steps of ``scheme``'s models: ``train.steps`` x its ``scheme_step_scale`` entry (default 1),
        rounded to the nearest step."""
        return scaled_steps(self.train.steps, self.scheme_step_scale.get(scheme, 1.0))

    def method_options(self, method: str | None) -> dict:
        """The options --extension-options gives ``method`` ({option: value}); None: check them all (each key is
        "method.option" for a listed method and one of its options) and return {}."""
        from posenc.extensions.catalogue import method_options

        return method_options(self.extension_options, self.extensions, method, "extension_options")

    def _check_schemes(self) -> None:
        """What would otherwise fail only after a model has trained: each scheme is built once with its options
        (a bad --scheme-options value is named here), an extended scheme must have a RoPE to rescale, and a method
        fitted on the text corpus needs a task that loads it."""
        for s in self.schemes:
            scheme = make_scheme(s, **self.model_config(s).scheme_arguments())
            if self.extensions and s in self.extended_schemes and not getattr(scheme, "extendable", False):
                raise ConfigError(f"extended_schemes: the {s} scheme has no RoPE that an extension method can "
                                  "rescale; list only RoPE schemes there, or drop --extensions")
            if s in self.extended_schemes:
                self._check_extension_options(scheme)
        if self.extensions and not needs_corpus(self.tasks):
            for e in self.extensions:
                if e in METHODS and METHODS[e].needs_corpus:
                    raise ConfigError(f"extensions: {e} is fitted on the text corpus, which none of the tasks "
                                      f"({', '.join(self.tasks)}) loads; use it with the lm task")

    def _check_extension_options(self, scheme) -> None:
        """Each method's --extension-options values, given to its write() on this scheme as the evaluation will
        give them: a bad value is named now, not after every model has trained."""
        from posenc.extensions.catalogue import check_option_values
        from posenc.lab.evaluate import lab_spec

        for e in self.extensions:
            if self.method_options(e):
                check_option_values(e, lab_spec(e, scheme, self.factor, self.train_len), self.method_options(e),
                                    "extension_options")

    def _check_randomized(self) -> None:
        n = self.randomized_positions
        if not n:  # off: randomized_schemes is ignored
            return
        if n < self.train_len:
            raise ConfigError(f"randomized_positions must be 0 (off) or >= train_len ({self.train_len}), got {n}")
        for s in self.randomized_schemes:
            check_scheme(s, "randomized_schemes")
        for s in self.randomized_scheme_names():
            table = make_scheme(s, **self.model_config(s).scheme_arguments()).capabilities.max_len
            if table is not None and table < n:
                raise ConfigError(f"randomized_positions: the {s} scheme has no encoding past its table of {table} "
                                  f"positions, so it cannot train on positions up to {n}")

    def randomized_scheme_names(self) -> list[str]:
        """Schemes trained with randomized positions (none when randomized_positions is 0)."""
        if not self.randomized_positions:
            return []
        return [s for s in self.schemes if not self.randomized_schemes or s in self.randomized_schemes]

    def position_variants(self, scheme: str) -> list[int]:
        """The randomized-positions N of each model to train for ``scheme``: 0 = plain positions."""
        n = self.randomized_positions
        if not n or scheme not in self.randomized_scheme_names():
            return [0]
        return [0, n] if self.randomized_schemes else [n]

    @property
    def factor(self) -> float:
        return self.ext_factor or max(self.eval_lens) / self.train_len

    def model_config(self, scheme: str) -> ModelConfig:
        """The model every run of ``scheme`` trains: the template with its scheme and max_len = train_len."""
        return replace(self.model, scheme=scheme, max_len=self.train_len)

    def to_dict(self) -> dict:
        """The settings as results.json records them: nested model and train sections, and the declared settings
        flat beside the lab's own (as when they were LabConfig fields)."""
        out = asdict(self)
        return {**out.pop("options"), **out}


# upper bounds that keep a run's memory and time bounded (the CLI names the flag): far above any tiny-model
# experiment. Sequence lengths: attention's work grows with T^2, and one attention call at 2^20 tokens (d_model 32,
# one layer, one row) did not finish in 11 minutes on a CPU core; 2^17 keeps one call to seconds-minutes.
MAX_SEQUENCE = 2**17
SIZE_LIMITS = {"d_model": 2**16, "n_layers": 1024, "train_len": MAX_SEQUENCE, "eval_lens": MAX_SEQUENCE,
               "sliding_lens": MAX_SEQUENCE, "finetune_len": MAX_SEQUENCE, "batch_size": 2**16, "threads": 4096,
               "jobs": 4096, "eval_tokens": 2**30, "sliding_tokens": 2**30, "steps": 2**31,
               "check_every": 2**31, "mlp_ratio": 256, "randomized_positions": 2**20, "warmup": 2**31,
               "ckpt_every": 2**31, "finetune_steps": 2**31}


# a bias scheme's float32 [heads, T, T] logit bias and the causal mask added to it: 2 tensors of 4 bytes
ATTENTION_BIAS_BYTES = 8

# weights, gradients and Adam's two moments, all float32: what training holds per weight before any activation
TRAINING_BYTES_PER_WEIGHT = 16


def check_fits_in_memory(model: ModelConfig, device) -> None:
    """ConfigError when the model's weights, gradients and optimizer state alone exceed the device's memory (a lower
    bound: activations come on top), instead of a process killed mid-run by the out-of-memory killer."""
    need = TRAINING_BYTES_PER_WEIGHT * model.matmul_weights()
    have = device_memory_bytes(device)
    if have and need > have:
        raise ConfigError(
            f"d_model {model.d_model}, n_layers {model.n_layers}, mlp_ratio {model.mlp_ratio}: "
            f"{model.matmul_weights() / 1e9:.2f}B weights need at least {need / 2**30:.1f} GiB for weights, "
            f"gradients and Adam state, more than this {device.type} device's {have / 2**30:.1f} GiB")


def device_memory_bytes(device) -> int | None:
    """Total memory of ``device`` (physical RAM for the CPU), or None when it cannot be read."""
    import torch

    if device.type != "cuda":
        return physical_memory()
    try:
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    except (AssertionError, RuntimeError):
        return None


# flat setting name -> the section of LabConfig that owns it (None: LabConfig itself); the settings that tasks and
# extension methods declare go to "options" (``section_of``)
SECTIONS = {**{f.name: "model" for f in fields(ModelConfig) if f.name not in ("scheme", "max_len", "rope_scaling")},
            **{f.name: "train" for f in fields(TrainSettings)},
            **{f.name: None for f in fields(LabConfig) if f.name not in ("model", "train", "options")}}


def declared() -> dict:
    """Setting name -> declaration (posenc._internal.settings.Setting) of every registered task and extension method."""
    from posenc.extensions.registry import METHOD_SETTINGS
    from posenc.lab.tasks.registry import TASK_SETTINGS

    return {**TASK_SETTINGS, **METHOD_SETTINGS}


def section_of(name: str) -> str | None:
    """The LabConfig section holding flat setting ``name`` ("options" for a declared one); ConfigError if none."""
    if name in SECTIONS:
        return SECTIONS[name]
    if name in declared():
        return "options"
    raise ConfigError(f"unknown lab settings: {name}")


def apply_settings(cfg: LabConfig, settings: dict) -> LabConfig:
    """``cfg`` with flat ``settings`` applied (None values ignored); ConfigError for an unknown name."""
    unknown = sorted(n for n in settings if n not in SECTIONS and n not in declared())
    if unknown:
        raise ConfigError(f"unknown lab settings: {', '.join(unknown)}")
    parts: dict[str | None, dict] = {}
    for name, value in settings.items():
        if value is not None:
            parts.setdefault(section_of(name), {})[name] = value
    cfg = replace(cfg, **parts.get(None, {}))
    if "options" in parts:
        cfg.options = {**cfg.options, **parts["options"]}
    if "model" in parts:
        cfg.model = replace(cfg.model, **parts["model"])
    if "train" in parts:
        cfg.train = replace(cfg.train, **parts["train"])
    return cfg


# the lesson's exercise 2: RoPE trained at 256, tested to 1024 (docs/lab.md)
NTK_MODEL = dict(schemes=["rope"], d_model=128, n_layers=4, n_heads=4, train_len=256, batch_size=16, steps=1500,
                 eval_lens=[256, 512, 1024], sliding_stride=256)
# context extension that trains (docs/lab.md): every method zero-shot, searched, fine-tuned and PoSE, 3 seeds
EXTEND_STUDY = dict(schemes=["rope"], seeds=[0, 1, 2], finetune_steps=100,
                    extensions=["linear", "ntk", "yarn", "llama3", "longrope-search", "pose-linear", "pose-yarn"])

PRESETS: dict[str, dict] = {
    "smoke": dict(tasks=ALL, schemes=ALL, d_model=32, n_layers=1, n_heads=2,
                  train_len=96, batch_size=8, steps=12, warmup=3, eval_lens=[96, 192], eval_tokens=1024,
                  sliding_stride=48, sliding_lens=[192], sliding_tokens=256, copy_examples=4,
                  passkey_depths=[0.0, 1.0], passkey_trials=2, ckpt_every=5,
                  extensions=["linear", "ntk", "dynamic", "yarn", "llama3", "longrope-search", "pose-yarn"],
                  finetune_steps=2, search_population=4, search_generations=1, search_windows=1,
                  randomized_positions=384, randomized_schemes=["rope"]),
    "default": dict(),
    "extend": dict(EXTEND_STUDY),
    "extend-passkey": dict(tasks=["passkey"], schemes=["rope"], seeds=[0, 1, 2], batch_size=16, steps=3000,
                           eval_lens=[128, 256, 512], sliding_stride=0, finetune_steps=100,
                           extensions=["linear", "yarn"]),
    "ntk": dict(NTK_MODEL),
    # the extension study (extend) on the ntk preset's model: trained at 256, target 1024
    "extend-ntk": dict(NTK_MODEL, **EXTEND_STUDY),
    "copy": dict(tasks=["copy"], schemes=ALL, d_model=128, n_layers=4, n_heads=4, train_len=512,
                 batch_size=16, steps=3000, lr=1e-3, warmup=200, eval_lens=[256, 512, 1024, 2048], extensions=[],
                 sliding_stride=0, copy_examples=64),
    # every registered scheme on the LM task to 8x, 3 seeds, sized for ~15 min on a quiet 2-core CPU at 1 thread
    # (docs/lab.md): irope with a NoPE layer every 2nd of the 2 layers; rope also with randomized positions
    "schemes": dict(tasks=["lm"], schemes=ALL, d_model=64, n_layers=2, n_heads=4, train_len=128, batch_size=16,
                    steps=300, lr=3e-3, warmup=30, seeds=[0, 1, 2], eval_lens=[128, 256, 512, 1024],
                    eval_tokens=16384, sliding_stride=0, extensions=[], scheme_options={"nope_every": 2},
                    randomized_positions=2048, randomized_schemes=["rope"]),
    # the lesson's exercise 3 at CPU size: copy task, 4 layers, 300 steps at 32 and 300 at 64 tokens, then each
    # model trained at 128 until 98% exact copy of two held-out sets of strings (cap 2500 steps; 1.2x for NoPE and
    # ALiBi, the slowest learners of the copy in every run), tested to 4x (docs/lab.md); learned attention biases
    # (T5, KERPLE, FIRE) at 10x the learning rate; no weight decay; bf16 where native; 2 heads of 32: the same bar
    # as 4 heads of 16 in ~8% less time (docs/lab.md)
    "copy-cpu": dict(tasks=["copy"], schemes=["nope", "rope", "alibi", "rope+alibi", "t5", "kerple", "fire", "xpos",
                                              "cope", "p-rope", "irope"],
                     d_model=64, n_layers=4, n_heads=2, train_len=128, batch_size=8, steps=2500, lr=3e-3,
                     weight_decay=0.0, warmup=100, min_lr_ratio=0.02, length_warmup=[[32, 300], [64, 300]],
                     bias_lr_scale=10.0, train_until=0.98, check_every=100,
                     scheme_step_scale={"nope": 1.2, "alibi": 1.2}, seeds=[0, 1, 2], eval_lens=[128, 256, 384, 512],
                     extensions=[], sliding_stride=0, copy_examples=128, copy_distinct=True,
                     copy_min_fraction=0.75, precision="auto"),
    # RULER's retrieval tasks on byte-level models (docs/ruler.md): one needle in noise, one among distracting needles,
    # variable tracking; trained at 1024 bytes (vt's template and worked example need 846), tested to 4x, 3 seeds
    "ruler": dict(tasks=["niah_single_1", "niah_multikey_2", "vt"], schemes=["nope", "rope", "alibi"], d_model=64,
                  n_layers=2, n_heads=4, train_len=1024, batch_size=8, steps=400, seeds=[0, 1, 2],
                  eval_lens=[1024, 2048, 4096], sliding_stride=0, extensions=["ntk", "yarn"], ruler_samples=10),
    # the 2025-26 lessons (docs/results/lessons.md), each on the default model (2 layers, trained at 128, to 8x),
    # 3 seeds: NoPE/RoPE hybrids (one sliding-window RoPE layer of 64 keys, one global NoPE layer) beside RoPE, NoPE
    # and Llama 4's iRoPE on the same layer split
    "hybrid": dict(schemes=["rope", "nope", "irope", "rnope-swa"], seeds=[0, 1, 2], extensions=[],
                   scheme_options={"nope_every": 2, "swa_window": 64}),
    # DroPE: the RoPE model with RoPE dropped, zero-shot and recalibrated 60 steps (10% of its training) at 128,
    # beside YaRN zero-shot and fine-tuned 60 steps at 1024, plain RoPE fine-tuned at 1024, and NoPE from scratch
    "drope": dict(schemes=["rope", "nope"], seeds=[0, 1, 2], extensions=["yarn", "drope"], finetune_steps=60),
    # RoPE's frequency variants: integer wavelengths (Resonance RoPE, with Resonance YaRN), the fastest quarter of
    # the pairs (p-RoPE), the pairs with a full turn inside the training length (HoPE), and those pairs with learned
    # Fourier coefficients (FoPE), beside RoPE (+ YaRN)
    "variants": dict(schemes=["rope", "resonance-rope", "p-rope", "hope", "fope"], seeds=[0, 1, 2],
                     extensions=["yarn"],
                     extended_schemes=["rope", "resonance-rope"]),
    "passkey": dict(tasks=["passkey"], schemes=["nope", "rope", "alibi", "rope+alibi"], d_model=64, n_layers=2,
                    n_heads=4, train_len=128, batch_size=16, steps=3000, eval_lens=[128, 256, 512],
                    sliding_stride=0, extensions=["ntk", "yarn"]),
}


def get_preset(name: str, **overrides) -> LabConfig:
    """LabConfig for preset ``name`` with flat ``overrides`` (None values are ignored) applied, validated."""
    check_choice(name, "preset", PRESETS, error=ConfigError)
    cfg = apply_settings(LabConfig(preset=name), PRESETS[name])
    if overrides.get("eval_tokens") is not None and overrides.get("sliding_tokens") is None:
        overrides = {**overrides, "sliding_tokens": overrides["eval_tokens"]}   # both protocols score one text
    cfg = apply_settings(cfg, overrides).validate()
    _check_given_schemes(cfg, overrides)
    return cfg


def _check_given_schemes(cfg: LabConfig, given: dict) -> None:
    """Per-scheme settings the caller gave (not the preset's, which outlive --schemes) must name schemes of this
    run, and randomized_schemes needs randomized positions on: otherwise they would be ignored without a word."""
    for name in ("randomized_schemes", "scheme_step_scale"):
        entries = given.get(name)
        if not entries or entries == ALL:
            continue
        outside = [s for s in entries if s not in cfg.schemes]
        if outside:
            raise ConfigError(f"{name}: {', '.join(outside)} {'is' if len(outside) == 1 else 'are'} not among the "
                              f"schemes of this run ({', '.join(cfg.schemes)}); add it to schemes or drop it here")
    _check_given_scheme_options(cfg, given.get("scheme_options"))
    if given.get("randomized_schemes") and not cfg.randomized_positions:
        raise ConfigError("randomized_schemes: randomized positions are off (randomized_positions 0), so no scheme "
                          "would train with them; set randomized_positions N or drop randomized_schemes")


def _check_given_scheme_options(cfg: LabConfig, options) -> None:
    """Each scheme option the caller gave is taken by a scheme of this run: one meant for a scheme the run does not
    train (cope_npos with --schemes rope) would be dropped without a word. A scheme of the run taking any option
    (**kwargs) accepts every key."""
    from posenc.schemes.registry import option_names

    takers = [option_names(s) for s in cfg.schemes]
    if not options or any(names is None for names in takers):
        return
    for key in options:
        if not any(key in names for names in takers):
            owners = [s for s in scheme_names() if key in (option_names(s) or ())]
            whose = (f"is an option of {', '.join(owners)}, which {'is' if len(owners) == 1 else 'are'} not among"
                     if owners else "is taken by none of")
            raise ConfigError(f"scheme_options: {key} {whose} the schemes of this run ({', '.join(cfg.schemes)}); "
                              f"add {'it' if len(owners) == 1 else 'one'} to schemes or drop {key}")
