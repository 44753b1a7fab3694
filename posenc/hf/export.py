"""``posenc export``: a lab model as a transformers model folder that ``AutoModelForCausalLM`` loads and runs with
the lab's logits.

    posenc export runs/lm --scheme rope --out exported/rope                       # RUN_DIR + scheme (lowest seed)
    posenc export runs/lm/checkpoints/lm-rope-seed0.safetensors --out exported/rope --rope-scaling yarn --factor 4

The lab's block (posenc.model.TinyLM): pre-norm, nn.LayerNorm with bias, fused qkv and output projection without
bias, GELU MLP with biases (LayerNorms and MLP without biases when ModelConfig.bias is False), final LayerNorm,
output head tied to the token embedding, inputs scaled by sqrt(d_model).
Each scheme goes to the transformers architecture whose block holds those weights exactly (the choice was made by
reading the modelling files of transformers 5.24):

    rope        GPTNeoXForCausalLM: sequential residual (use_parallel_residual False), LayerNorms with bias,
                attention_bias False (fused qkv and dense without bias), MLP with biases, hidden_act "gelu" (erf),
                rotate_half RoPE with partial_rotary_factor 1 (Black et al. 2022). qkv rows are regrouped per head
                ([q_h; k_h; v_h]); an "interleaved" lab model has its q/k rows permuted to the half layout
                (posenc.permute_qk_weight), which leaves every q.k product unchanged.
    nope        the same GPT-NeoX block with partial_rotary_factor 0: transformers rotates zero dimensions.
    learned     GPT2LMHeadModel (Radford et al. 2019): wpe = the lab's table, activation "gelu", zero attention biases.
    sinusoidal  GPT-2 with wpe = the sinusoidal table (Vaswani et al. 2017) read through the lab scheme itself, for
                positions < max_positions (default 16 x the training length): exact up to there, an index error past.
    alibi       MptForCausalLM (Press et al. 2022 ALiBi as MPT applies it): the bias is added after the 1/sqrt(Dh)
                scaling, its slopes equal the lab's for every head count, GELU is exact, no biases anywhere. MPT's
                LayerNorms and MLP have no biases, so a checkpoint exports when those are all zero: a model trained
                with the lab's bias-free option (ModelConfig.bias False, ``posenc lab --bias no``: MPT's block), or
                a freshly initialised one; a model trained with biases is refused with the numbers. BLOOM is not
                exact (a LayerNorm on the embeddings and tanh-GELU); Falcon's alibi=True adds the bias *before* the
                1/sqrt(Dh) scaling and rounds it to bfloat16.
    rope+alibi  refused: no transformers architecture applies both.

Common to all: the tied head is untied (input embedding = W * sqrt(d_model), lm_head = W), so both are exact.
``rope_scaling`` / ``--rope-scaling METHOD --factor F`` writes an extension method into config.json with
``posenc.tools.extend.extend_config`` at factor F, as ``posenc extend --factor F`` writes it (dynamic NTK too:
factor F, transformers' rule), so transformers' own implementation runs it. posenc_export.json records the
training length, which ``posenc eval`` reads as the model's original context. The folder also gets the
byte-level tokenizer (posenc.hf.tokenizer) and posenc_export.json (source checkpoint, mapping, the check below).

The check: before the folder is moved into place, the written model is loaded back with
``AutoModelForCausalLM.from_pretrained`` and its float32 logits are compared with the lab model's (under the same
extension method) on a byte sequence; a relative difference above 1e-4 aborts the export.

The output: ``--out`` is replaced as a whole (with ``--overwrite`` when it is not empty), so it may not be the
source run or checkpoint nor a folder holding them, nor a model file (paths resolved, symlinks followed; a new
folder inside the run, e.g. RUN/exported, is fine: posenc._internal.outputs owns the rule). The arguments, that rule and the
writability of --out's folder are checked before anything is loaded; max_positions is at most 2^30
(posenc.tools.contexts.MAX_CONTEXT) and must fit in memory.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from posenc._internal.atomic import atomic_folder, check_writable_folder
from posenc._internal.outputs import check_output
from posenc._internal.memory import available_memory
from posenc._internal.errors import ConfigError, PosencError

HELP = "Write a lab model (posenc lab checkpoint) as a transformers model folder with a byte tokenizer."

CHECK_RTOL = 1e-4
ARCHITECTURES = {"rope": "GPTNeoXForCausalLM", "nope": "GPTNeoXForCausalLM", "learned": "GPT2LMHeadModel",
                 "sinusoidal": "GPT2LMHeadModel", "alibi": "MptForCausalLM"}
REFUSED = {
    "rope+alibi": "no transformers architecture applies RoPE and an ALiBi bias in the same attention",
}
_GELU_ACT = {"none": "gelu", "tanh": "gelu_pytorch_tanh"}  # torch GELU(approximate=...) -> transformers ACT2FN name


@dataclass
class ExportResult:
    """What was written and how it maps."""

    out_dir: str
    checkpoint: str
    scheme: str
    architecture: str
    max_positions: int | None          # the longest input the exported model accepts (None: no hard limit)
    rope_scaling: dict | None          # the extension written into config.json, if any
    check_max_rel_err: float | None    # max |hf - lab| / max |lab| over the check's logits
    check_length: int | None
    notes: list[str] = field(default_factory=list)


# ---- per-architecture weight mappings ----------------------------------------------------------------------------

def _neox(a, rotary: bool):
    from transformers import GPTNeoXConfig

    from posenc.rope.apply import permute_qk_weight

    D, H, Dh = a.d_model, a.n_heads, a.head_dim
    rope = {"rope_type": "default", "rope_theta": a.rope_base, "partial_rotary_factor": 1.0 if rotary else 0.0}
    if rotary and a.rope_scaling:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        scaling = dict(a.rope_scaling)
        rope_type = scaling.pop("rope_type", scaling.pop("type", "default"))
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            raise ConfigError(f"the checkpoint's model was trained with rope_type {rope_type!r}, which transformers "
                              "does not implement")
        rope.update(scaling, rope_type=rope_type)
    config = GPTNeoXConfig(
        vocab_size=a.vocab_size, hidden_size=D, num_hidden_layers=a.n_layers, num_attention_heads=H,
        intermediate_size=a.mlp_hidden, hidden_act=_GELU_ACT[a.gelu], max_position_embeddings=a.max_len,
        layer_norm_eps=a.ln_eps, use_parallel_residual=False, attention_bias=False, tie_word_embeddings=False,
        rope_parameters=rope, hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=None, eos_token_id=None,
        architectures=["GPTNeoXForCausalLM"])
    sd = {"gpt_neox.embed_in.weight": a.tok_emb * a.embed_scale, "lm_head.weight": a.tok_emb.clone(),
          "gpt_neox.final_layer_norm.weight": a.ln_f_weight, "gpt_neox.final_layer_norm.bias": a.ln_f_bias}
    for i, b in enumerate(a.blocks):
        q, k, v = b.qkv.split(D, dim=0)
        if rotary and a.rope_layout == "interleaved":
            q, k = permute_qk_weight(q, H, Dh, to="half"), permute_qk_weight(k, H, Dh, to="half")
        # GPT-NeoX reads the fused projection as [.., H, 3 * Dh]: per head its q, k and v rows
        qkv = torch.stack([t.reshape(H, Dh, D) for t in (q, k, v)], dim=1).reshape(3 * D, D)
        p = f"gpt_neox.layers.{i}."
        sd.update({p + "input_layernorm.weight": b.ln1_weight, p + "input_layernorm.bias": b.ln1_bias,
                   p + "attention.query_key_value.weight": qkv, p + "attention.dense.weight": b.proj,
                   p + "post_attention_layernorm.weight": b.ln2_weight, p + "post_attention_layernorm.bias": b.ln2_bias,
                   p + "mlp.dense_h_to_4h.weight": b.up, p + "mlp.dense_h_to_4h.bias": b.up_bias,
                   p + "mlp.dense_4h_to_h.weight": b.down, p + "mlp.dense_4h_to_h.bias": b.down_bias})
    return config, sd


def _gpt2(a, table: torch.Tensor):
    from transformers import GPT2Config

    D = a.d_model
    config = GPT2Config(
        vocab_size=a.vocab_size, n_positions=table.shape[0], n_embd=D, n_layer=a.n_layers, n_head=a.n_heads,
        n_inner=a.mlp_hidden, activation_function=_GELU_ACT[a.gelu], layer_norm_epsilon=a.ln_eps,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False, scale_attn_weights=True,
        bos_token_id=None, eos_token_id=None, architectures=["GPT2LMHeadModel"])
    sd = {"transformer.wte.weight": a.tok_emb * a.embed_scale, "transformer.wpe.weight": table,
          "lm_head.weight": a.tok_emb.clone(), "transformer.ln_f.weight": a.ln_f_weight,
          "transformer.ln_f.bias": a.ln_f_bias}
    for i, b in enumerate(a.blocks):  # GPT-2's Conv1D stores weights as [in, out]
        p = f"transformer.h.{i}."
        sd.update({p + "ln_1.weight": b.ln1_weight, p + "ln_1.bias": b.ln1_bias,
                   p + "attn.c_attn.weight": b.qkv.T.contiguous(), p + "attn.c_attn.bias": torch.zeros(3 * D),
                   p + "attn.c_proj.weight": b.proj.T.contiguous(), p + "attn.c_proj.bias": torch.zeros(D),
                   p + "ln_2.weight": b.ln2_weight, p + "ln_2.bias": b.ln2_bias,
                   p + "mlp.c_fc.weight": b.up.T.contiguous(), p + "mlp.c_fc.bias": b.up_bias,
                   p + "mlp.c_proj.weight": b.down.T.contiguous(), p + "mlp.c_proj.bias": b.down_bias})
    return config, sd


def _mpt_refusal(a) -> str | None:
    """Why this lab ALiBi model does not fit MPT's block, or None when it does."""
    biases = {"LayerNorm": max(max(b.ln1_bias.abs().max(), b.ln2_bias.abs().max()) for b in a.blocks),
              "MLP": max(max(b.up_bias.abs().max(), b.down_bias.abs().max()) for b in a.blocks)}
    biases["LayerNorm"] = max(biases["LayerNorm"], a.ln_f_bias.abs().max())
    problems = [f"{name} biases are non-zero (max |b| = {float(v):.3g})" for name, v in biases.items() if v != 0]
    if a.mlp_hidden != 4 * a.d_model:
        problems.append(f"the MLP width is {a.mlp_hidden} (MPT's is 4 x d_model = {4 * a.d_model})")
    if a.gelu != "none":
        problems.append(f"the GELU is approximate={a.gelu!r} (MPT's is exact)")
    if not problems:
        return None
    return ("scheme alibi exports to MPT, the one transformers architecture that adds ALiBi exactly as the lab "
            "does (after the 1/sqrt(head_dim) scaling, the paper's slopes), but MPT's block has no LayerNorm or MLP "
            f"biases and here {'; '.join(problems)}. BLOOM adds a LayerNorm on the embeddings and uses tanh-GELU; "
            "Falcon (alibi=True) adds the bias before the 1/sqrt(head_dim) scaling and rounds it to bfloat16. "
            "Train the ALiBi model with MPT's bias-free block (posenc lab --bias no; ModelConfig(bias=False)) "
            "to export it")


def _mpt(a, max_positions: int):
    from transformers import MptConfig

    config = MptConfig(
        vocab_size=a.vocab_size, d_model=a.d_model, n_layers=a.n_layers, n_heads=a.n_heads, expansion_ratio=4,
        max_seq_len=max_positions, layer_norm_epsilon=a.ln_eps, no_bias=True, tie_word_embeddings=False,
        attn_config={"alibi": True, "alibi_bias_max": 8}, learned_pos_emb=False, resid_pdrop=0.0, emb_pdrop=0.0,
        bos_token_id=None, eos_token_id=None, architectures=["MptForCausalLM"])
    sd = {"transformer.wte.weight": a.tok_emb * a.embed_scale, "lm_head.weight": a.tok_emb.clone(),
          "transformer.norm_f.weight": a.ln_f_weight}
    for i, b in enumerate(a.blocks):
        p = f"transformer.blocks.{i}."
        sd.update({p + "norm_1.weight": b.ln1_weight, p + "attn.Wqkv.weight": b.qkv,
                   p + "attn.out_proj.weight": b.proj, p + "norm_2.weight": b.ln2_weight,
                   p + "ffn.up_proj.weight": b.up, p + "ffn.down_proj.weight": b.down})
    return config, sd


# ---- the export ----------------------------------------------------------------------------------------------------

def _resolve_source(source, scheme, task, seed) -> Path:
    from posenc.hf.lab_bridge import find_run_checkpoint

    path = Path(source)
    if path.is_dir():
        if not scheme:
            raise ConfigError(f"source {source} is a run folder: pass scheme (--scheme NAME) to pick its checkpoint")
        return find_run_checkpoint(path, scheme, task=task, seed=seed)
    if not path.is_file():
        raise FileNotFoundError(f"source {source}: no such checkpoint file or run folder")
    return path


def _prepare_out(out_dir: Path, overwrite: bool, sources: list[Path]) -> None:
    """``out_dir`` checked before anything loads: replaced as a whole, it may not be a source (the run folder or
    checkpoint) nor hold one, nor be a model file (posenc._internal.outputs; a new folder inside the run is fine)."""
    check_output(out_dir, f"out {out_dir} (--out)", inputs=[("source", s) for s in sources], replaces_folder=True)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"out {out_dir}: exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise ConfigError(f"out {out_dir}: folder exists and is not empty; pass overwrite=True (--overwrite)")
    # the new folder is written beside out_dir, then moved into place: its parent must take new files
    check_writable_folder(out_dir.parent, f"out {out_dir} (--out)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)     # like posenc eval --out: missing parents are made


def _allocation_failed(exc: BaseException) -> bool:
    """True for torch's (RuntimeError) or Python's refusal to allocate memory."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text or "not enough memory" in text))


def _check_position_memory(limit: int, a) -> None:
    """ConfigError naming max_positions when the parts that grow with it cannot fit in the memory available:
    the sinusoidal table (max_positions x d_model float32, held about 4 times while it is built, mapped, stored
    and loaded back) or MPT's ALiBi bias (heads x max_seq_len float32 plus its int32 and float positions, built at
    every forward, the check's included). Checked before anything is built: past the memory, the kernel may kill
    the process rather than refuse the allocation."""
    if a.scheme == "sinusoidal":
        need, what = 4 * limit * a.d_model * 4 + 8 * limit, "the sinusoidal table of max_positions x d_model floats"
    else:
        need, what = (a.n_heads + 2) * limit * 4, "MPT's ALiBi bias of heads x max_positions floats, at every forward"
    avail = available_memory()
    if avail is not None and need > avail:
        raise ConfigError(f"max_positions: {limit} positions need about {need / 2**30:.3g} GiB ({what}), more than "
                          f"the {avail / 2**30:.3g} GiB of memory available; pass a smaller max_positions "
                          f"(default 16 x the training length = {16 * a.max_len})")


@contextlib.contextmanager
def _positions_fit(limit: int | None, a) -> None:
    """Turn a failed allocation while building or checking a position-limited export (the sinusoidal table of
    ``limit`` x d_model floats, MPT's ALiBi tensor of ``limit`` x heads) into a ConfigError naming max_positions."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        if limit is None or not _allocation_failed(exc):
            raise
        what = "sinusoidal table" if a.scheme == "sinusoidal" else "ALiBi bias"
        gib = limit * (a.d_model if a.scheme == "sinusoidal" else a.n_heads) * 4 / 2**30
        raise ConfigError(f"max_positions: {limit} positions do not fit in memory here (the {what} alone is about "
                          f"{gib:.3g} GiB of float32); pass a smaller max_positions (default 16 x the training "
                          f"length = {16 * a.max_len})") from None


@torch.no_grad()
def _check(folder: Path, lab_model, length: int) -> float:
    """Max |hf - lab| / max |lab| of float32 logits on ``length`` pseudo-random bytes (two rows)."""
    from transformers import AutoModelForCausalLM

    from posenc.hf.remote_code import NO_REMOTE_CODE

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True,
                                              **NO_REMOTE_CODE).eval()
    tokens = torch.randint(0, lab_model.cfg.vocab_size, (2, length), generator=torch.Generator().manual_seed(0))
    want = lab_model(tokens).float()
    got = hf(input_ids=tokens, use_cache=False).logits.float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _check_arguments(rope_scaling, factor, max_positions) -> None:
    """ConfigError naming the argument for an extension method the export cannot write, a factor without one (or
    out of range), or a max_positions out of range."""
    from posenc._internal.validate import check_float, check_int
    from posenc.hf.lab_bridge import check_config_method
    from posenc.rope.contexts import MAX_CONTEXT

    if max_positions is not None:
        check_int(max_positions, "max_positions", min=1, max=MAX_CONTEXT, error=ConfigError)
    if rope_scaling is not None:
        check_config_method(rope_scaling, "rope_scaling")
        if factor is None:
            raise ConfigError("factor: rope_scaling needs the extension factor (target / training length), e.g. 4")
    elif factor is not None:
        raise ConfigError(f"factor: {factor!r} given without rope_scaling, and only an extension method uses it: "
                          "--factor needs --method METHOD (e.g. --method yarn --factor 4)")
    if factor is not None:
        check_float(factor, "factor", min=1.0, max=float(MAX_CONTEXT), error=ConfigError)


def _architecture(a, model, max_positions, notes: list[str]):
    """-> (the transformers config, the state dict, the position limit or None) of the architecture that expresses
    the lab model's scheme (GPT-NeoX, GPT-2 or MPT); what the export notes goes into ``notes``."""
    from posenc.hf.lab_bridge import absolute_table

    limit = max_positions or 16 * a.max_len
    if a.scheme in ("rope", "nope"):
        config, sd = _neox(a, rotary=a.scheme == "rope")
        limit = None
        if max_positions is not None:
            notes.append("max_positions ignored: a GPT-NeoX export has no position limit")
    elif a.scheme == "learned":
        if max_positions is not None and max_positions != a.max_len:
            raise ConfigError(f"max_positions: a learned table has exactly max_len = {a.max_len} rows; got "
                              f"{max_positions}")
        limit = a.max_len
        config, sd = _gpt2(a, absolute_table(model, limit))
    elif a.scheme == "sinusoidal":
        _check_position_memory(limit, a)
        with _positions_fit(limit, a):
            config, sd = _gpt2(a, absolute_table(model, limit))
        notes.append(f"the sinusoidal table is stored for positions < {limit} (max_positions); longer inputs "
                     "raise in transformers")
    else:  # alibi
        why = _mpt_refusal(a)
        if why:
            raise ConfigError(why)
        _check_position_memory(limit, a)
        config, sd = _mpt(a, limit)
        notes.append(f"MPT builds its ALiBi bias for max_seq_len = {limit} positions; longer inputs raise")
    return config, sd, limit


def _write_scaling(config, model, a, rope_scaling, factor, notes: list[str]):
    """-> (the config with ``rope_scaling`` at ``factor`` written into it, the scaling written or None); the lab
    model is set to run the same scaling, so the export check compares like with like."""
    if rope_scaling is None:
        return config, None
    from posenc.hf.lab_bridge import lab_methods, set_lab_extension, set_lab_scaling
    from posenc.hf.scaling import extend_for_factor

    # the factor asked for is the factor written, as posenc extend writes it (dynamic NTK: --factor 4 writes
    # 4, where the lab evaluates dynamic with 1.0 at every length)
    result = extend_for_factor(config.to_dict(), rope_scaling, factor, as_given=True)
    config = type(config).from_dict(result.config)
    written_scaling = dict(result.config.get("rope_parameters") or result.config.get("rope_scaling") or {})
    notes += [f"config: {c}" for c in result.changes]
    from posenc.hf.lab_bridge import lab_config_factor

    same_as_lab = lab_config_factor(rope_scaling, factor, a.max_len) == float(factor)
    if rope_scaling in lab_methods() and same_as_lab:  # the check compares with the lab's meaning of the method
        set_lab_extension(model, rope_scaling, factor)
    else:  # a method the lab does not evaluate (longrope): the lab model runs the scaling that was written
        set_lab_scaling(model, {k: v for k, v in written_scaling.items()
                                if k not in ("rope_theta", "partial_rotary_factor")},
                        result.config["max_position_embeddings"])
    return config, written_scaling


def export_lab_model(source: str | os.PathLike, out_dir: str | os.PathLike, *, scheme: str | None = None,
                     task: str = "lm", seed: int | None = None, rope_scaling: str | None = None,
                     factor: float | None = None, max_positions: int | None = None, overwrite: bool = False,
                     check: bool = True) -> ExportResult:
    """Write the lab model in ``source`` as a transformers model folder ``out_dir``; see the module docstring.

    source: a lab checkpoint (.safetensors) or a ``posenc lab`` run folder (then ``scheme`` picks
    ``checkpoints/TASK-SCHEME-seedN``; seed None = the lowest). rope_scaling: an extension method (linear, ntk,
    dynamic, yarn, llama3, longrope) written into config.json at ``factor`` x the training length (RoPE only).
    max_positions: the longest input of the sinusoidal (GPT-2 table) and ALiBi (MPT) exports (default 16 x the
    training length). overwrite: replace a non-empty ``out_dir``. check: load the written folder with transformers
    and compare logits with the lab model (relative 1e-4), before moving it into place.
    Raises ConfigError / CheckpointError (ValueErrors) naming the reason for schemes transformers cannot express.
    """
    from posenc.hf.lab_bridge import anatomy, checkpoint_progress, load_lab_model
    from posenc.hf.tokenizer import save_byte_tokenizer

    _check_arguments(rope_scaling, factor, max_positions)   # nothing is read or written before they pass
    path = _resolve_source(source, scheme, task, seed)
    out_dir = Path(out_dir)
    _prepare_out(out_dir, overwrite, [Path(source), path])
    model, settings = load_lab_model(path)
    a = anatomy(model)
    if scheme is not None and scheme != a.scheme:
        raise ConfigError(f"scheme {scheme!r} given, but checkpoint {path} holds a {a.scheme!r} model")
    if a.scheme in REFUSED:
        raise ConfigError(f"scheme {a.scheme}: cannot export: {REFUSED[a.scheme]}")
    if a.scheme not in ARCHITECTURES:
        raise ConfigError(f"scheme {a.scheme}: no transformers architecture expresses it; exportable schemes: "
                          f"{', '.join(ARCHITECTURES)}")
    if rope_scaling is not None and a.scheme != "rope":
        raise ConfigError(f"rope_scaling: only a RoPE model takes an extension method; this one is {a.scheme}")
    notes: list[str] = []
    progress = checkpoint_progress(path)
    if progress["step"] < progress["steps"] and not progress["stopped_by_criterion"]:
        partial = (f"checkpoint {path} holds step {progress['step']} of {progress['steps']}: an interrupted run's "
                   "model, exported as it is (finish it with posenc lab --resume first)")
        warnings.warn(partial, stacklevel=2)
        notes.append(partial)
    config, sd, limit = _architecture(a, model, max_positions, notes)

    config, written_scaling = _write_scaling(config, model, a, rope_scaling, factor, notes)
    if a.vocab_size != 256:
        notes.append(f"no tokenizer written: the model's vocabulary is {a.vocab_size} tokens, not the 256 bytes")

    from transformers import AutoModelForCausalLM

    sized = limit if a.scheme in ("sinusoidal", "alibi") else None  # memory grows with max_positions
    with _positions_fit(sized, a):
        hf = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
        missing, unexpected = hf.load_state_dict(sd, strict=False)
    if missing or unexpected:  # a transformers release that renamed parameters: refuse rather than guess
        raise PosencError(f"export: {type(hf).__name__} of this transformers does not take the mapped weights "
                          f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
    with atomic_folder(out_dir) as tmp:    # moved into place once written and checked; deleted on a failure
        hf.save_pretrained(str(tmp))
        if a.vocab_size == 256:
            save_byte_tokenizer(tmp)
        err, length = None, None
        if check:
            # 256 tokens keep the check cheap; an extension is checked past the training length too, where it acts
            cap = max(256, a.max_len + 128) if factor else 256
            length = min(limit or 10**9, (int(math.ceil(factor * a.max_len)) if factor else a.max_len), cap)
            with _positions_fit(sized, a):
                err = _check(tmp, model, length)
            if not err <= CHECK_RTOL:
                raise PosencError(f"export check failed: transformers' logits differ from the lab model's by "
                                  f"{err:.3g} (relative; limit {CHECK_RTOL:g}) at length {length}")
        res = ExportResult(out_dir=str(out_dir), checkpoint=str(path), scheme=a.scheme,
                           architecture=type(hf).__name__, max_positions=limit, rope_scaling=written_scaling,
                           check_max_rel_err=err, check_length=length, notes=notes)
        record = {**asdict(res), "train_len": a.max_len, "lab_model": settings, "training": progress}
        (tmp / "posenc_export.json").write_text(json.dumps(record, indent=2) + "\n")
    return res


def format_result(res: ExportResult) -> str:
    lines = [f"export: {res.scheme} -> {res.architecture}  ({res.checkpoint} -> {res.out_dir})"]
    if res.rope_scaling:
        lines.append(f"rope scaling: {json.dumps(res.rope_scaling)}")
    lines.append(f"max positions: {res.max_positions if res.max_positions else 'no limit'}")
    if res.check_max_rel_err is not None:
        lines.append(f"check: transformers vs lab logits at length {res.check_length}: max relative difference "
                     f"{res.check_max_rel_err:.2e} (limit {CHECK_RTOL:g})")
    lines += [f"  - {n}" for n in res.notes]
    return "\n".join(lines)


# ---- command line ------------------------------------------------------------------------------------------------

def add_arguments(parser) -> None:
    from posenc._internal.flags import add_shared
    from posenc.hf.lab_bridge import config_methods

    parser.add_argument("source", help="a lab checkpoint (.safetensors) or a `posenc lab` run folder")
    parser.add_argument("--scheme", help="the scheme whose checkpoint to export (needed for a run folder)")
    add_shared(parser, "out", required=True, help="folder to write (config.json, model.safetensors, tokenizer)")
    parser.add_argument("--task", default="lm", help="the run's task whose checkpoint to take (default lm)")
    add_shared(parser, "seed", default=None, help="the run's seed (default: the lowest present)")
    add_shared(parser, "method", dest="rope_scaling", default=None,
               help="write this extension method into config.json (RoPE models): " + ", ".join(config_methods()))
    add_shared(parser, "factor", default=None,
               help="extension factor for --method (target / training length); needs --method")
    parser.add_argument("--max-positions", type=int, default=None,
                        help="longest input of sinusoidal (GPT-2) and ALiBi (MPT) exports (default 16 x train length; "
                             "at most 2^30)")
    add_shared(parser, "overwrite", help="replace a non-empty --out folder")
    parser.add_argument("--no-check", action="store_true", help="skip loading the result back to compare logits")


def run(args) -> int:
    res = export_lab_model(args.source, args.out, scheme=args.scheme, task=args.task, seed=args.seed,
                           rope_scaling=args.rope_scaling, factor=args.factor, max_positions=args.max_positions,
                           overwrite=args.overwrite, check=not args.no_check)
    print(format_result(res))
    return 0


# the setting names export's messages cite are its flags' own (posenc.cli shows them as the flags)
FLAG_ALIASES: dict[str, str] = {}


def export_main(argv: list[str] | None = None) -> int:
    """``posenc export`` as a function (exit status; errors as one line on stderr)."""
    from posenc.hf.command import run_command

    return run_command("export", add_arguments, run, argv, FLAG_ALIASES)
