"""Lab settings and the named presets. Every field can be overridden from the command line.

    smoke    CI: every task and scheme end to end on a toy model, well under a minute on 2 cores
    default  the LM extrapolation comparison (nope, sinusoidal, learned, rope, alibi) + zero-shot extension
             methods on the RoPE model, train length 128, evaluated to 8x; a few minutes on a 2-core CPU
    ntk      the lesson's exercise 2: train at 256, test to 1024 with and without NTK-aware scaling (+ others)
    copy     the lesson's exercise 3: 4-layer model, copy task trained at 512, tested to 2048; sized for a GPU
    passkey  passkey retrieval trained as episodes at 128, exact match over a length x depth grid to 512
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from posenc.errors import ConfigError

TASKS = ("lm", "copy", "passkey")
BASIC_SCHEMES = ["nope", "sinusoidal", "learned", "rope", "alibi"]
ALL_SCHEMES = BASIC_SCHEMES + ["rope+alibi"]
ALL_EXTENSIONS = ["linear", "ntk", "dynamic", "yarn", "llama3"]


@dataclass
class LabConfig:
    preset: str = "default"
    tasks: list = field(default_factory=lambda: ["lm"])
    schemes: list = field(default_factory=lambda: list(BASIC_SCHEMES))
    # model (identical for every scheme)
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    rope_base: float = 10000.0
    rope_layout: str = "half"
    scale_embeddings: bool = True  # token embeddings * sqrt(d_model) (Vaswani et al.): see docs/lab.md
    # training (identical for every scheme; same data order per seed)
    train_len: int = 128
    batch_size: int = 20
    steps: int = 600
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seeds: list = field(default_factory=lambda: [0])
    # evaluation
    eval_lens: list = field(default_factory=lambda: [128, 256, 512, 1024])
    eval_tokens: int = 49152  # tokens scored per LM eval length
    sliding_stride: int = -1  # -1: half the sliding length; 0: no sliding eval; S: stride (context = L - S)
    sliding_lens: list = field(default_factory=list)  # lengths for the sliding eval (empty: the longest eval length)
    sliding_tokens: int = 49152  # = eval_tokens: both protocols score the same text
    extensions: list = field(default_factory=lambda: list(ALL_EXTENSIONS))
    ext_factor: float = 0.0  # 0: max(eval_lens) / train_len
    finetune_steps: int = 0  # > 0: also fine-tune each method at finetune_len, then evaluate
    finetune_len: int = 0  # 0: max(eval_lens)
    copy_examples: int = 64
    passkey_depths: list = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    passkey_trials: int = 20
    # run
    device: str = "auto"
    threads: int = 0  # 0: auto (torch's default, capped at the cores left idle by other work)
    data: str | None = None
    out: str | None = None
    ckpt_every: int = 200

    def validate(self) -> "LabConfig":
        for t in self.tasks:
            if t not in TASKS:
                raise ConfigError(f"--tasks: unknown task {t!r}; expected some of {', '.join(TASKS)}")
        for s in self.schemes:
            if s not in ALL_SCHEMES:
                raise ConfigError(f"--schemes: unknown scheme {s!r}; expected some of {', '.join(ALL_SCHEMES)}")
        for e in self.extensions:
            if e not in ALL_EXTENSIONS:
                raise ConfigError(f"--extensions: unknown method {e!r}; expected some of {', '.join(ALL_EXTENSIONS)}")
        for name in ("d_model", "n_layers", "n_heads", "train_len", "batch_size", "steps", "eval_tokens",
                     "copy_examples", "passkey_trials"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(self, name)}")
        if not self.eval_lens or min(self.eval_lens) < 2:
            raise ConfigError(f"--eval-lens: expected lengths >= 2, got {self.eval_lens}")
        if self.rope_layout not in ("half", "interleaved"):
            raise ConfigError(f"--rope-layout: expected half or interleaved, got {self.rope_layout!r}")
        if self.ext_factor and self.ext_factor < 1:
            raise ConfigError(f"--ext-factor: expected 0 (auto) or a factor >= 1, got {self.ext_factor}")
        if not self.seeds:
            raise ConfigError("--seeds: expected at least one seed")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ConfigError(f"--d-model: must split into {self.n_heads} heads of even size, got {self.d_model}")
        if not all(0.0 <= d <= 1.0 for d in self.passkey_depths):
            raise ConfigError(f"--passkey-depths: expected fractions in [0, 1], got {self.passkey_depths}")
        shortest = min(self.sliding_lens or [max(self.eval_lens)])
        if self.sliding_stride < -1 or ("lm" in self.tasks and self.sliding_stride > shortest):
            raise ConfigError(f"--sliding-stride: expected -1 (auto), 0 (off) or 1..{shortest} (the sliding-window "
                              f"length), got {self.sliding_stride}")
        if "passkey" in self.tasks:
            from posenc.lab.data import passkey_min_len

            shortest = min([self.train_len] + list(self.eval_lens))
            if shortest < passkey_min_len():
                raise ConfigError(f"--train-len/--eval-lens: passkey episodes need at least {passkey_min_len()} "
                                  f"tokens, got {shortest}")
        return self

    @property
    def factor(self) -> float:
        return self.ext_factor or max(self.eval_lens) / self.train_len

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, dict] = {
    "smoke": dict(tasks=["lm", "copy", "passkey"], schemes=list(ALL_SCHEMES), d_model=32, n_layers=1, n_heads=2,
                  train_len=96, batch_size=8, steps=12, warmup=3, eval_lens=[96, 192], eval_tokens=1024,
                  sliding_stride=48, sliding_lens=[192], sliding_tokens=256, copy_examples=4,
                  passkey_depths=[0.0, 1.0], passkey_trials=2, ckpt_every=5),
    "default": dict(),
    "ntk": dict(schemes=["rope"], d_model=128, n_layers=4, n_heads=4, train_len=256, batch_size=16, steps=1500,
                eval_lens=[256, 512, 1024], sliding_stride=256),
    "copy": dict(tasks=["copy"], schemes=list(ALL_SCHEMES), d_model=128, n_layers=4, n_heads=4, train_len=512,
                 batch_size=16, steps=3000, lr=1e-3, warmup=200, eval_lens=[256, 512, 1024, 2048], extensions=[],
                 sliding_stride=0, copy_examples=64),
    "passkey": dict(tasks=["passkey"], schemes=["nope", "rope", "alibi", "rope+alibi"], d_model=64, n_layers=2,
                    n_heads=4, train_len=128, batch_size=16, steps=3000, eval_lens=[128, 256, 512],
                    sliding_stride=0, extensions=["ntk", "yarn"]),
}


def get_preset(name: str, **overrides) -> LabConfig:
    """LabConfig for preset ``name`` with ``overrides`` (None values are ignored) applied."""
    if name not in PRESETS:
        raise ConfigError(f"--preset: unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
    known = {f.name for f in fields(LabConfig)}
    unknown = set(overrides) - known
    if unknown:
        raise ConfigError(f"unknown lab settings: {', '.join(sorted(unknown))}")
    cfg = replace(LabConfig(preset=name), **PRESETS[name])
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None}).validate()
