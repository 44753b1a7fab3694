"""What one ``posenc finetune`` run is (``FinetuneSettings``) and the checks of bad input before any long work:
each is one ConfigError naming the argument (the library keyword; the command shows its flag)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from posenc._internal.errors import ConfigError
from posenc._internal.validate import check_float, check_int

# LoRA's usual targets in Llama-family blocks: the attention projections (LongLoRA's choice too)
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
# PoSE's training window: the paper's Llama runs train on 2k-token windows (capped at the model's trained length)
DEFAULT_CHUNK_LENGTH = 2048
# the merged model's weights on disk: auto (the source's dtype, as its config states; float32 when it states none)
SAVE_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class FinetuneSettings:
    """One fine-tune. ``model``: a transformers folder or a .gguf file; ``out``: the folder written (DIR/model,
    DIR/adapters, DIR/finetune.json, DIR/checkpoint). The optimizer and schedule fields are the lab's
    (posenc.lab.train.TrainSettings); the rest say what is trained on which positions."""

    model: str
    target_length: int
    out: str
    method: str = "yarn"
    data: str | None = None
    chunk_length: int = DEFAULT_CHUNK_LENGTH     # PoSE's window L_c, capped at the trained length
    chunks: int = 2                              # PoSE's N: the window's pieces, each with its own skip
    rank: int = 8
    alpha: float = 16.0
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    train_embeddings_norms: bool = False         # LongLoRA: embeddings and norms trained besides the adapters
    full: bool = False                           # every weight trained, no adapters
    steps: int = 100
    batch_size: int = 1
    lr: float = 2e-4
    warmup: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_windows: int = 1
    checkpoint_every: int = 25
    bf16: bool = False
    gradient_checkpointing: bool = False
    save_dtype: str = "auto"                     # DIR/model's weights: SAVE_DTYPES (auto: the source's)
    seed: int = 0
    resume: bool = False
    overwrite: bool = False
    progress: bool = True
    extra: dict = field(default_factory=dict)    # recorded in finetune.json as given (the command line, ...)

    def recorded(self) -> dict:
        """The settings as finetune.json records them (plain JSON values)."""
        doc = asdict(self)
        doc["target_modules"] = list(self.target_modules)
        return doc


def check_settings(s: FinetuneSettings) -> FinetuneSettings:
    """Every check that needs neither the model nor the data; ConfigError naming the argument otherwise."""
    check_int(s.target_length, "target_length", min=2, error=ConfigError)
    check_int(s.chunk_length, "chunk_length", min=2, error=ConfigError)
    check_int(s.chunks, "chunks", min=1, max=s.chunk_length, error=ConfigError)
    if not s.full:
        check_int(s.rank, "rank", min=1, error=ConfigError)
        check_float(s.alpha, "alpha", min=0.0, error=ConfigError)
        if not s.target_modules or not all(isinstance(m, str) and m for m in s.target_modules):
            raise ConfigError(f"target_modules: expected module names such as q_proj,v_proj, got "
                              f"{list(s.target_modules)!r}")
    elif s.train_embeddings_norms:
        raise ConfigError("train_embeddings_norms: --full already trains every weight, embeddings and norms "
                          "included; drop one of the two")
    check_int(s.steps, "steps", min=1, error=ConfigError)
    check_int(s.batch_size, "batch_size", min=1, error=ConfigError)
    check_float(s.lr, "lr", min=0.0, error=ConfigError)
    check_int(s.warmup, "warmup", min=0, error=ConfigError)
    check_float(s.min_lr_ratio, "min_lr_ratio", min=0.0, max=1.0, error=ConfigError)
    check_float(s.weight_decay, "weight_decay", min=0.0, error=ConfigError)
    check_float(s.grad_clip, "grad_clip", min=0.0, error=ConfigError)
    check_int(s.eval_every, "eval_every", min=1, error=ConfigError)
    check_int(s.eval_windows, "eval_windows", min=1, error=ConfigError)
    check_int(s.checkpoint_every, "checkpoint_every", min=0, error=ConfigError)
    check_int(s.seed, "seed", min=0, error=ConfigError)
    if s.save_dtype not in SAVE_DTYPES:
        raise ConfigError(f"save_dtype: expected one of {', '.join(SAVE_DTYPES)}, got {s.save_dtype!r}")
    return s


def saved_dtype(s: FinetuneSettings, config) -> str:
    """The dtype DIR/model's weights are written in: ``s.save_dtype``, or for auto the source model's (its config's
    dtype: a bf16 source gives bf16 weights); float32 when the config states none or another."""
    if s.save_dtype != "auto":
        return s.save_dtype
    stated = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(stated).removeprefix("torch.") if stated is not None else None
    return name if name in SAVE_DTYPES else "float32"


def check_lengths(s: FinetuneSettings, trained: int | None) -> int:
    """The PoSE window: ``chunk_length`` capped at the model's trained length -> L_c. ConfigError when the config
    states no trained length or ``target_length`` is not above it."""
    if not trained:
        raise ConfigError(f"model {s.model}: its config states no trained context (max_position_embeddings), so "
                          "there is nothing to extend from")
    if s.target_length <= trained:
        raise ConfigError(f"target_length: expected more than the model's trained length {trained}, got "
                          f"{s.target_length}")
    window = min(s.chunk_length, trained)
    if s.chunks > window:
        raise ConfigError(f"chunks: expected at most the window's {window} tokens, got {s.chunks}")
    return window


def train_settings(s: FinetuneSettings):
    """The lab's optimizer and schedule settings for ``s`` (posenc.lab.train.TrainSettings)."""
    from posenc.lab.train import TrainSettings

    # a warmup longer than the run would never reach the peak rate: it ends with the run at the latest
    return TrainSettings(steps=s.steps, lr=s.lr, min_lr_ratio=s.min_lr_ratio, warmup=min(s.warmup, s.steps),
                         weight_decay=s.weight_decay, grad_clip=s.grad_clip, ckpt_every=s.checkpoint_every)
