"""Everything posenc.hf needs from the lab, in one module, so the lab's layout can change behind it.

Readers: export.py (checkpoints, the TinyLM's anatomy, its position scheme), evaluate.py (the lab's perplexity
protocols, passkey episodes, corpus, extension-method conventions, report tables and plots) and search.py (the
corpus's training split). Nothing else in posenc.hf imports posenc.lab,
posenc.model or posenc.schemes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch

from posenc._internal.errors import CheckpointError, ConfigError


# ---- checkpoints and the lab model ----------------------------------------------------------------------------

def find_run_checkpoint(run_dir: str | os.PathLike, scheme: str, *, task: str = "lm", seed: int | None = None) -> Path:
    """The checkpoint of ``scheme`` for ``task`` in a lab run folder (``RUN_DIR/checkpoints/TASK-SCHEME-seedN``).

    seed None: the lowest seed present. Fine-tuned checkpoints (``-ft-METHOD``) are never picked. Raises
    CheckpointError listing what the folder holds when nothing matches.
    """
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        raise CheckpointError(f"run folder {run_dir}: no checkpoints/ folder (expected a `posenc lab` output folder)")
    pattern = re.compile(rf"^{re.escape(task)}-{re.escape(scheme)}-seed(\d+)\.safetensors$")
    found = {int(m.group(1)): p for p in folder.iterdir() if (m := pattern.match(p.name))}
    if seed is not None:
        found = {s: p for s, p in found.items() if s == seed}
    if not found:
        have = sorted(p.name for p in folder.glob("*.safetensors"))
        raise CheckpointError(f"run folder {run_dir}: no checkpoint for task {task!r}, scheme {scheme!r}"
                              f"{'' if seed is None else f', seed {seed}'}; it holds {have or 'none'}")
    return found[min(found)]


def load_lab_model(path: str | os.PathLike) -> tuple[torch.nn.Module, dict]:
    """Rebuild the TinyLM stored in a lab checkpoint (eval mode, float32) -> (model, model settings dict)."""
    from posenc.lab.checkpoint import read_checkpoint
    from posenc.nn.model import ModelConfig, TinyLM

    tensors, meta = read_checkpoint(path)
    settings = meta["settings"].get("model")
    if not isinstance(settings, dict):
        raise CheckpointError(f"checkpoint {path}: its settings hold no model description (written by posenc lab?)")
    try:
        cfg = ModelConfig(**settings)
    except TypeError as exc:
        raise CheckpointError(f"checkpoint {path}: model settings this posenc cannot read ({exc})") from None
    model = TinyLM(cfg)
    weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint {path}: weights do not match its model settings ({exc})") from None
    return model.float().eval(), cfg.to_dict()


def checkpoint_progress(path: str | os.PathLike) -> dict:
    """How far a lab checkpoint trained: {"step", "steps" (the run's cap), "stopped_by_criterion"} -- a step below
    the cap without a training criterion (--train-until) means an interrupted run."""
    from posenc.lab.checkpoint import read_checkpoint

    _, meta = read_checkpoint(path)
    steps = (meta["settings"].get("train") or {}).get("steps")
    steps = steps if isinstance(steps, int) else meta["step"]
    return {"step": meta["step"], "steps": steps, "stopped_by_criterion": "train_until" in meta["settings"]}


def build_lab_model(**settings) -> torch.nn.Module:
    """A freshly initialised TinyLM (eval mode) from ModelConfig fields: for tests and examples."""
    from posenc.nn.model import ModelConfig, TinyLM

    return TinyLM(ModelConfig(**settings)).eval()


def save_lab_model(path: str | os.PathLike, model: torch.nn.Module) -> Path:
    """Write ``model`` as a lab checkpoint (no optimizer state) that ``load_lab_model`` reads back."""
    from posenc.lab.checkpoint import save_checkpoint

    return save_checkpoint(path, model, None, 0, {"model": model.cfg.to_dict()})


@dataclass
class Block:
    """One pre-norm block's weights: x + proj(attn(ln1(x))); x + down(gelu(up(ln2(x)))).

    qkv [3D, D] (q rows, then k, then v; head h = rows h*Dh..(h+1)*Dh of each), proj [D, D] (no biases);
    up [M, D] + up_bias [M], down [D, M] + down_bias [D]; LayerNorm weights and biases [D].
    """

    ln1_weight: torch.Tensor
    ln1_bias: torch.Tensor
    qkv: torch.Tensor
    proj: torch.Tensor
    ln2_weight: torch.Tensor
    ln2_bias: torch.Tensor
    up: torch.Tensor
    up_bias: torch.Tensor
    down: torch.Tensor
    down_bias: torch.Tensor


@dataclass
class Anatomy:
    """A TinyLM described in plain tensors and numbers: what an exporter maps onto another architecture."""

    scheme: str
    d_model: int
    n_layers: int
    n_heads: int
    head_dim: int
    mlp_hidden: int
    vocab_size: int
    max_len: int
    ln_eps: float
    gelu: str                 # torch's GELU ``approximate``: "none" (erf) or "tanh"
    embed_scale: float        # token embeddings are multiplied by this (sqrt(d_model), or 1)
    tok_emb: torch.Tensor     # [V, D]; the output head is this same matrix (tied)
    ln_f_weight: torch.Tensor
    ln_f_bias: torch.Tensor
    blocks: list[Block]
    rope_base: float
    rope_layout: str
    rope_scaling: dict | None


def anatomy(model: torch.nn.Module) -> Anatomy:
    """Read a TinyLM's weights and settings into an ``Anatomy`` (tensors detached, float32)."""
    cfg = model.cfg
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    for name in [k for k in sd if k.endswith(".weight")]:  # a bias-free model (ModelConfig.bias False): zeros
        sd.setdefault(name[:-len("weight")] + "bias", torch.zeros(sd[name].shape[0]))
    gelu = model.blocks[0].mlp[1]
    if not isinstance(gelu, torch.nn.GELU):
        raise ConfigError(f"the lab model's MLP activation is {type(gelu).__name__}, expected GELU")
    blocks = [Block(ln1_weight=sd[f"blocks.{i}.ln1.weight"], ln1_bias=sd[f"blocks.{i}.ln1.bias"],
                    qkv=sd[f"blocks.{i}.attn.qkv.weight"], proj=sd[f"blocks.{i}.attn.proj.weight"],
                    ln2_weight=sd[f"blocks.{i}.ln2.weight"], ln2_bias=sd[f"blocks.{i}.ln2.bias"],
                    up=sd[f"blocks.{i}.mlp.0.weight"], up_bias=sd[f"blocks.{i}.mlp.0.bias"],
                    down=sd[f"blocks.{i}.mlp.2.weight"], down_bias=sd[f"blocks.{i}.mlp.2.bias"])
              for i in range(cfg.n_layers)]
    return Anatomy(scheme=cfg.scheme, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                   head_dim=cfg.d_model // cfg.n_heads, mlp_hidden=cfg.mlp_ratio * cfg.d_model,
                   vocab_size=cfg.vocab_size, max_len=cfg.max_len, ln_eps=float(model.ln_f.eps),
                   gelu=gelu.approximate, embed_scale=float(cfg.d_model) ** 0.5 if cfg.scale_embeddings else 1.0,
                   tok_emb=sd["tok_emb.weight"], ln_f_weight=sd["ln_f.weight"], ln_f_bias=sd["ln_f.bias"],
                   blocks=blocks, rope_base=float(cfg.rope_base), rope_layout=cfg.rope_layout,
                   rope_scaling=dict(cfg.rope_scaling) if cfg.rope_scaling else None)


@torch.no_grad()
def absolute_table(model: torch.nn.Module, n_positions: int) -> torch.Tensor:
    """The vector the model's scheme adds to the token embeddings at positions 0..n-1: float32 [n, D]
    (zeros for schemes that add nothing). Read through the scheme's own ``embed``, so it is the lab's signal."""
    zeros = torch.zeros(1, n_positions, model.cfg.d_model)
    return model.scheme.embed(zeros, torch.arange(n_positions))[0].float()


def set_lab_scaling(model: torch.nn.Module, scaling: dict | None, max_position_embeddings: int | None = None) -> None:
    """Set the lab model's RoPE scaling (a rope_scaling mapping; None: plain RoPE) as the lab's extension stage does."""
    model.scheme.set_rope_scaling(scaling, max_position_embeddings=max_position_embeddings)


def set_lab_extension(model: torch.nn.Module, method: str | None, factor: float = 1.0) -> None:
    """Evaluate the lab model under extension ``method`` at ``factor`` as the lab does (None: plain RoPE)."""
    from posenc.lab.evaluate import apply_extension, extension_config

    config = None if method is None else extension_config(method, model, factor, model.cfg.max_len)
    apply_extension(model, config)


# ---- extension methods: the lab's conventions ------------------------------------------------------------------

def lab_methods() -> tuple[str, ...]:
    """The extension methods the lab evaluates zero-shot without a search (the registry's, less LongRoPE's fixed
    factors, the searched ``fit`` methods and the PoSE fine-tuning modes, which are their base method untrained)."""
    from posenc.extensions import METHODS

    return tuple(name for name, m in METHODS.items()
                 if m.fit is None and m.train_positions is None and not m.recalibrates and name != "longrope")


def config_methods() -> tuple[str, ...]:
    """The extension methods a config edit at a factor expresses: all but the searched (``fit``) methods, the
    PoSE fine-tuning modes (``train_positions``) and the methods that need recalibration (DroPE). longrope is one:
    ``posenc extend`` writes its unsearched factors."""
    from posenc.extensions import METHODS

    return tuple(name for name, m in METHODS.items()
                 if m.fit is None and m.train_positions is None and not m.recalibrates)


def check_config_method(name, argument: str, also: tuple[str, ...] = ()) -> str:
    """``name`` if it is one of ``also`` or ``config_methods``, else a ConfigError naming ``argument`` and what to use
    instead: a PoSE fine-tuning mode untrained is its base method's config, a searched method needs ``posenc
    search``."""
    from posenc._internal.validate import check_choice
    from posenc.attention import is_attention_method
    from posenc.extensions import METHODS

    if is_attention_method(name):
        raise ConfigError(f"{argument}: {name} changes attention, not the config's RoPE: apply it to a loaded "
                          f"model with posenc.patch(model, method={name!r}, ...) or `posenc eval --methods {name}`")
    if name in METHODS and name not in config_methods():
        m = METHODS[name]
        if m.recalibrates:
            raise ConfigError(f"{argument}: {name} changes the model so much that it must be trained again at its "
                              f"trained length first (posenc lab --extensions {name} --finetune-steps N does)")
        if m.train_positions is not None:
            raise ConfigError(f"{argument}: {name} is a fine-tuning mode (it trains with other positions); without "
                              f"its fine-tuning it is its base method's config: use {name.removeprefix('pose-')}")
        raise ConfigError(f"{argument}: {name} computes its factors by a search on the model: run `posenc search`, "
                          "then pass the config it writes")
    return check_choice(name, argument, also + config_methods(), error=ConfigError)


def lab_config_factor(method: str, factor: float, original: int) -> float:
    """The ``factor`` the lab writes into the scaling for ``method`` at extension ``factor`` (dynamic NTK: 1.0,
    the NTK base for exactly L / original at every length L); ``factor`` itself for methods the lab lacks."""
    from posenc.extensions import METHODS

    if method not in lab_methods():
        return float(factor)
    return float(METHODS[method].lab_factor or factor)


# ---- evaluation protocols ---------------------------------------------------------------------------------------

class LogitsModel:
    """What the lab's evaluators call: ``model(tokens [B, T]) -> logits [B, T, V]``, ``model.generate(prompts, n)``
    and ``model.scheme.max_len`` (positions the model cannot encode: None = no hard limit).

    ``forward``/``generate`` are plain callables, so any model (a transformers one, through evaluate.py) fits.
    """

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor],
                 generate: Callable[[torch.Tensor, int], torch.Tensor] | None = None, max_len: int | None = None,
                 parameters: Callable | None = None,
                 token_losses: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        self._forward, self._generate, self._parameters = forward, generate, parameters
        self.scheme = SimpleNamespace(max_len=max_len)
        if token_losses is not None:    # read by posenc.perplexity.window_losses: next-token losses [B, T]
            self.token_losses = token_losses

    def parameters(self):
        """The wrapped model's parameters (the lab's Evaluation checks them for NaN/inf), or none."""
        return iter(()) if self._parameters is None else self._parameters()

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._forward(tokens)

    def generate(self, prompts: torch.Tensor, n_new: int) -> torch.Tensor:
        if self._generate is None:
            raise ConfigError("this model adapter has no generate()")
        return self._generate(prompts, n_new)


def perplexity(model: LogitsModel, tokens: torch.Tensor, eval_len: int, *, n_tokens: int, stride: int | None = None,
               device="cpu", batch_tokens: int = 16384) -> dict | None:
    """The lab's ``lm_eval`` (non-overlapping windows, or sliding with ``stride``) on any ``LogitsModel``."""
    from posenc.lab.tasks.lm import lm_eval

    return lm_eval(model, tokens, eval_len, n_tokens=n_tokens, stride=stride, device=device,
                   batch_tokens=batch_tokens)


def passkey_rate(model: LogitsModel, length: int, depth: float, *, n_trials: int, seed: int, device="cpu"):
    """The lab's ``passkey_eval`` (greedy decoding of the key in byte episodes of ``length`` characters)."""
    from posenc.lab.tasks.passkey import passkey_eval

    return passkey_eval(model, length, depth, n_trials=n_trials, seed=seed, device=device)


def passkey_prompt(length: int, depth: float, key: str) -> tuple[str, str]:
    """The lab's passkey episode of ``length`` characters -> (prompt, answer)."""
    from posenc.lab.tasks.passkey import passkey_example

    return passkey_example(length, depth, key)


def passkey_episode_chars(encode, n_tokens: int) -> int | None:
    """The lab passkey task's ``episode_chars``: the longest episode ``encode`` fits into ``n_tokens``."""
    from posenc.lab.tasks.passkey import episode_chars

    return episode_chars(encode, n_tokens)


def training_bytes(data: str | None = None) -> tuple[torch.Tensor, dict]:
    """The lab corpus's training split (uint8 bytes) and its provenance: text a search may fit to, kept apart from
    the validation split that ``posenc eval`` scores."""
    from posenc.lab.data import load_corpus

    corpus = load_corpus(data)
    return corpus.train, dict(corpus.meta)


def validation_bytes(data: str | None = None) -> tuple[torch.Tensor, dict]:
    """The lab corpus's validation split (uint8 bytes) and its provenance: the stdlib by default, or ``data``."""
    from posenc.lab.data import load_corpus

    corpus = load_corpus(data)
    return corpus.val, dict(corpus.meta)


# what of a text ``posenc eval`` scores (--data-split): the lab's validation split, or all of it
DATA_SPLITS = ("validation", "all")


def scored_text(data: str | None = None, split: str = "validation") -> tuple[torch.Tensor, dict, str]:
    """The text ``posenc eval`` scores -> (uint8 bytes, the corpus's provenance, which part in words).

    "validation": the lab corpus's validation split, the text the lab scores (a file: its last 10% of bytes; a
    folder or the stdlib: the files whose sha256(relative path) starts below 26, about 10%). "all": the whole text
    (a file's bytes in order; a folder's training files, then its validation files)."""
    from posenc.lab.data import DOC_SEPARATOR, VAL_HASH_THRESHOLD, load_corpus

    corpus = load_corpus(data)
    by_bytes = corpus.meta.get("split") == "last 10% of bytes"
    if split == "validation":
        rule = ("the last 10% of its bytes" if by_bytes else
                f"the files whose sha256(relative path) starts with a byte below {VAL_HASH_THRESHOLD}, about 10%")
        return corpus.val, dict(corpus.meta), f"its validation split ({rule})"
    if by_bytes:
        return torch.cat([corpus.train, corpus.val]), dict(corpus.meta), "all of it"
    separator = torch.frombuffer(bytearray(DOC_SEPARATOR), dtype=torch.uint8)
    return (torch.cat([corpus.train, separator, corpus.val]), dict(corpus.meta),
            "all of it (its training files, then its validation files)")


# ---- the lab's report tables and plots -----------------------------------------------------------------------

def lab_tables(doc: dict) -> str:
    """The lab's result tables (each task's ``report`` section, posenc.lab.report.main_table) for {"results": rows}."""
    from posenc.lab.report import main_table

    return main_table(doc)


def lab_plots(doc: dict, out: str | os.PathLike) -> list[str]:
    """The lab's plots (each task's ``plot``, posenc.lab.report.make_plots) written into ``out``; -> file names."""
    from posenc.lab.report import make_plots

    return make_plots(doc, Path(out))
