"""``finetune(settings)``: one whole fine-tune, from the checks to DIR/finetune.json.

Order: every check that needs no model (settings, --out), the model's config and trained length, the extended
config (posenc.tools.extend.extend_config, for any registered frequency method) written to DIR and loaded with the
weights (posenc.hf.loading.load_causal_lm), the text (posenc.finetune.data), then training (posenc.finetune.loop)
and the folders: DIR/adapters (peft's adapters; with --train-embeddings-norms the embeddings and norms beside them),
DIR/model (a transformers folder with the adapters merged, what AutoModelForCausalLM and ``posenc eval`` load) and
DIR/finetune.json (settings, steps, tokens, wall time, tokens/s, the losses). Each is written atomically.
"""

from __future__ import annotations

import datetime as _dt
import shutil
from pathlib import Path

import torch

from posenc._internal.errors import ConfigError
from posenc.finetune.settings import FinetuneSettings, check_lengths, check_settings, saved_dtype, train_settings

EXTENDED_CONFIG = "config.extended.json"
CHECKPOINT_DIR = "checkpoint"
OUTPUTS = ("model", "adapters", "finetune.json", EXTENDED_CONFIG, CHECKPOINT_DIR)


def check_out(s: FinetuneSettings, data: str | None = None) -> Path:
    """-> the --out folder, checked: not an input, not a model's file, writable; one that holds an earlier
    fine-tune needs --resume (continue it) or --overwrite (start over: ``finetune`` deletes its checkpoint once
    every check has passed). ``data``: the text's path (``s.data`` with "prose" resolved)."""
    from posenc._internal.atomic import check_writable_folder
    from posenc._internal.outputs import check_output

    what = f"out {s.out} (--out)"
    out = check_output(s.out, what, inputs=[("model", s.model), ("--data", data)], writes=("finetune.json",))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{what}: exists and is not a folder")
    check_writable_folder(out, what)
    held = [name for name in OUTPUTS if (out / name).exists()]
    if held and not (s.resume or s.overwrite):
        raise ConfigError(f"{what}: already holds {', '.join(held)} (an earlier fine-tune); pass --resume to "
                          "continue it, --overwrite to start over, or choose another folder")
    return out


def extended_config(s: FinetuneSettings, config):
    """The model's config extended to ``s.target_length`` with ``s.method`` (posenc.tools.extend's ExtendResult;
    ConfigError for a method a config cannot express)."""
    from posenc.hf.lab_bridge import check_config_method
    from posenc.hf.scaling import transformers_major
    from posenc.tools.extend import extend_config

    check_config_method(s.method, "method")
    return extend_config(config.to_dict(), s.target_length, s.method,
                         transformers_version=5 if transformers_major() >= 5 else 4)


def run_settings(s: FinetuneSettings, window: int, data_meta: dict) -> dict:
    """What a checkpoint records and a resume must match: everything that changes the numbers trained."""
    from dataclasses import asdict

    keys = ("method", "target_length", "chunks", "rank", "alpha", "target_modules", "train_embeddings_norms",
            "full", "batch_size", "seed", "bf16")
    doc = {"train": asdict(train_settings(s)), "finetune": {k: getattr(s, k) for k in keys},
           "window": window, "data": {k: data_meta.get(k) for k in ("source", "files_sha256", "train_bytes")}}
    import json

    return json.loads(json.dumps(doc, sort_keys=True))   # tuples as lists: equal after a checkpoint's reload


def finetune(s: FinetuneSettings, *, stop_after: int | None = None, log=print) -> dict:
    """Run the fine-tune ``s`` describes -> the finetune.json document (see the module docstring).
    ``stop_after``: end after that many steps in all, leaving the checkpoint (an interruption, for tests)."""
    from posenc._internal.atomic import atomic_write_json
    from posenc.finetune import adapters, data, loop
    from posenc.hf.loading import check_model_folder, load_causal_lm, load_tokenizer
    from posenc.rope.contexts import trained_length

    check_settings(s)
    source = data.data_source(s.data)      # "prose" -> its folder (ConfigError when absent)
    out = check_out(s, source)
    config = check_model_folder(s.model)
    window = check_lengths(s, trained_length(config))
    result = extended_config(s, config)
    tokenizer = load_tokenizer(s.model)
    tokens, data_meta = data.training_tokens(tokenizer, source, s.steps * s.batch_size * (window + 1), window)
    windows = data.validation_windows(tokenizer, source, s.target_length, s.eval_windows)
    if s.data == data.PROSE:
        data_meta["name"] = data.PROSE
    # written only once every check has passed: a refused run leaves --out as it was
    out.mkdir(parents=True, exist_ok=True)
    if s.overwrite and not s.resume and (out / CHECKPOINT_DIR).exists():
        shutil.rmtree(out / CHECKPOINT_DIR)      # starting over: the earlier run's state must not be resumed
    atomic_write_json(out / EXTENDED_CONFIG, result.config)
    extension = {"method": result.method, "factor": result.factor, "original_context": result.original_context,
                 "target_length": result.target_length, "changes": result.changes}
    model, _, _ = load_causal_lm(s.model, config_file=str(out / EXTENDED_CONFIG), progress=s.progress, log=log)
    if s.gradient_checkpointing:   # activations recomputed in the backward pass: memory for time
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = adapters.make_trainable(model, full=s.full, rank=s.rank, alpha=s.alpha, target_modules=s.target_modules,
                                    embeddings_norms=s.train_embeddings_norms, seed=s.seed)
    sampler = data.PoseSampler(tokens, window, s.target_length, chunks=s.chunks, batch_size=s.batch_size,
                               seed=s.seed)
    precision = "bf16" if s.bf16 else "fp32"
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    trained = loop.train_model(
        model, sampler, train_settings(s), eval_every=s.eval_every, checkpoint=out / CHECKPOINT_DIR,
        validate=lambda: loop.validation_loss(model, windows, precision=precision),
        run_settings=run_settings(s, window, data_meta), resume=s.resume, precision=precision,
        stop_after=stop_after, progress=s.progress)
    doc = {"settings": s.recorded(), "started": started, "window": window, "extension": extension,
           "data": data_meta, "parameters": adapters.count_parameters(model), "validation_windows": len(windows),
           "validation_tokens": int(windows.shape[0] * (windows.shape[1] - 1)),
           "saved_dtype": saved_dtype(s, config), **_progress(trained, sampler, s),
           **_cost(model, sampler, trained, precision)}
    if trained["step"] < s.steps:        # interrupted (stop_after): the checkpoint is the result so far
        return doc
    write_folders(model, tokenizer, out, s, doc["saved_dtype"])
    atomic_write_json(out / "finetune.json", doc)
    return doc


def _progress(trained: dict, sampler, s: FinetuneSettings) -> dict:
    """Steps, tokens, time and losses for finetune.json."""
    tokens_per_step = sampler.batch_size * sampler.window
    tokens = trained["step"] * tokens_per_step
    rate = tokens / trained["train_s"] if trained["train_s"] > 0 else None
    return {"steps": trained["step"], "resumed_from": trained["resumed_from"], "tokens_per_step": tokens_per_step,
            "tokens": tokens, "wall_s": trained["wall_s"],
            "train_s": trained["train_s"], "tokens_per_s": rate, "train_losses": trained["train"],
            "validation_losses": trained["validation"],
            "final_validation_loss": trained["validation"][-1][1] if trained["validation"] else None,
            "torch_threads": torch.get_num_threads()}


def _cost(model: torch.nn.Module, sampler, trained: dict, precision: str) -> dict:
    """What training cost the machine: the process's peak resident memory (training and validation), the forward
    FLOPs of one step (posenc.hf.throughput.model_flops: every nn.Linear, the output head included, plus causal
    attention over the window), the training FLOP/s counted as 3 x forward (the MFU convention of Kaplan et al.
    2020 and PaLM: the backward pass twice the forward; LoRA's backward skips the frozen weights' gradients, so the
    work it does is nearer 2 x forward) and their fraction of this machine's matmul peak in the training dtype."""
    from posenc.hf.throughput import matmul_peak, model_flops, peak_memory

    forward = model_flops(model, sampler.window, sampler.batch_size)
    peak = matmul_peak(torch.bfloat16 if precision == "bf16" else torch.float32)
    rate = 3.0 * forward * trained["step"] / trained["train_s"] if trained["train_s"] > 0 else None
    return {"peak_rss_bytes": peak_memory()["rss_bytes"], "forward_flops_per_step": forward,
            "train_flops_per_s": rate, "matmul_peak_flops": peak, "matmul_peak_dtype": precision,
            "mfu": rate / peak if rate else None}


def write_folders(model: torch.nn.Module, tokenizer, out: Path, s: FinetuneSettings, dtype: str = "float32") -> None:
    """DIR/adapters (LoRA runs, float32 as trained) and DIR/model (the adapters merged in float32, then its weights
    cast to ``dtype``, with the tokenizer), each atomically."""
    from posenc._internal.atomic import atomic_folder
    from posenc.finetune.adapters import is_peft, merged, save_adapters

    if is_peft(model):
        with atomic_folder(out / "adapters") as tmp:
            save_adapters(model, tmp, s.train_embeddings_norms)
    full = merged(model)
    if getattr(full.config, "quantization_config", None) is not None:
        from posenc.hf.gguf import plain_copy

        full = plain_copy(full)     # a model loaded from GGUF refuses save_pretrained while it keeps that config
    if s.gradient_checkpointing:       # a saved model loads without it, as transformers saves it
        full.gradient_checkpointing_disable()
    full = full.to(getattr(torch, dtype))     # config.dtype follows, so from_pretrained(dtype="auto") loads it so
    with atomic_folder(out / "model") as tmp:
        full.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
