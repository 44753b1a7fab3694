"""The evaluation loop of ``posenc eval``: for each method, load the model (the method written into its config, or
applied to attention by posenc.patch), then run every task of the settings on it, and collect the lab's rows.

Nothing here names a task: each one, lm and passkey included, runs through its own ``evaluate(ev)`` on a
``posenc.hf.eval.context.ModelEvaluation`` (the model's tokenizer as ``ev.encode``/``ev.decode``, the scored text
in its tokens as ``ev.run.corpus.val``). Before each length the model runs one token, which makes transformers'
dynamic-NTK rule return to the original frequencies, so every length is scored with its own frequencies (as the
lab does) whatever ran before.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

from posenc._internal.errors import DataError
from posenc.hf.eval.adapter import logits_model, token_stream
from posenc.hf.eval.context import ModelEvaluation, text_codec
from posenc.hf.eval.resume import check_resumable, model_identity
from posenc.hf.eval.settings import EvalSettings, attention_methods, task_settings
from posenc.hf.loading import (DTYPES, check_model_folder, config_method, input_device, load_causal_lm,
                               load_tokenizer, original_context, position_limit)
from posenc._internal.machine import cpu_model


# logits of one forward are [rows, T, vocab] float32: cap them near 256 MiB unless --batch-tokens says otherwise
LOGIT_BUDGET = 1 << 26


def scored_stream(s: EvalSettings, tokenizer, limit: int | None) -> tuple[torch.Tensor, dict, str]:
    """The tokens the tasks that read the corpus score (after --eval-offset) -> (tokens, the data's provenance,
    which part of it is scored in words). DataError naming the numbers when the text is too short for some task's
    measurement (``Task.text_needed``; ``limit``: lengths past the model's positions are not scored): lengths
    scored on fewer tokens than asked, and on different tokens from each other, would be compared as equals."""
    from posenc.hf.lab_bridge import scored_text
    from posenc.lab.tasks import get_task

    data, data_meta, scored = scored_text(s.data, s.data_split)
    cfg = task_settings(s)
    need = [(t, *job) for t in s.tasks for job in get_task(t).text_needed(cfg) if limit is None or job[1] <= limit]
    stream, _ = token_stream(tokenizer, data, s.eval_offset + max((job[1] for job in need), default=2))
    left = len(stream) - s.eval_offset
    short = [job for job in need if job[1] > left]
    if short:
        task, n, L, stride, *budget = max(short, key=lambda job: (job[1], job[3] is None))  # (a tie: eval_tokens)
        text = f"the text ({data_meta.get('source')}, scored on {scored}) has {len(stream)} tokens"
        lead = (f"eval_offset: {text}; skipping {s.eval_offset} leaves {max(0, left)}" if s.eval_offset
                else f"data: {text}")
        setting = budget[0] if budget else None        # None: the length itself needs the text (a haystack)
        asks = (f"{setting} {getattr(s, setting)} reads at length {L}{'' if stride is None else ' (sliding)'}"
                if setting else f"task {task} reads at length {L}")
        lower = (f"lower {'eval_offset or ' if s.eval_offset else ''}{setting}" if setting
                 else f"lower the length{' or eval_offset' if s.eval_offset else ''}")
        raise DataError(f"{lead}, fewer than the {n} that {asks}; every length must score the tokens asked: {lower}"
                        f"{' or score all of the text (data_split all)' if s.data_split == 'validation' else ''}, "
                        "or give a longer text")
    return stream[s.eval_offset:], data_meta, scored


def check_methods(config, s: EvalSettings) -> None:
    """Every method's config edit before the first evaluation: a method this model cannot take (no RoPE, a scaling
    already there without --replace, per-layer RoPE) is refused now, not after the earlier methods have run."""
    from posenc.hf.scaling import extend_for_factor

    attention = attention_methods(s.methods)
    for method in s.methods:
        if method in attention:
            from posenc.hf.attention_patch import check_config

            check_config(config)
        elif method != "none":
            extend_for_factor(config.to_dict(), config_edit(method), s.factor, replace=s.replace_scaling)


def config_edit(method: str) -> str:
    """The frequency method written into the config ``method`` is loaded with: request-sized YaRN loads YaRN at
    --factor (its limit and trained length), and each length then takes its own factor (``request_sizer``)."""
    from posenc.hf.request_yarn import EVAL_METHOD

    return "yarn" if method == EVAL_METHOD else method


def request_sizer(model, model_dir, method: str, s: EvalSettings, meta_entry: dict):
    """For request-sized YaRN: ``sized(n)``, the context manager that runs a length-n call at the smallest factor of
    ``eval_factors(--factor)`` covering n, over the folder's own config (recorded in ``meta_entry``); else None."""
    from posenc.hf.request_yarn import EVAL_METHOD, eval_factors, request_yarn

    if method != EVAL_METHOD:
        return None
    base = check_model_folder(model_dir, s.config, tokenizer=False)
    factors = eval_factors(s.factor)
    meta_entry["request_factors"] = list(factors)
    return lambda n: request_yarn(model, n, factors, base_config=base)


def start_meta(model_dir, s: EvalSettings, byte_level: bool, data_meta, scored) -> dict:
    """The document's meta before any method runs: what is measured, on what, on which machine."""
    return {"model": str(model_dir), "config": s.config, "byte_tokens": byte_level, "settings": s.to_dict(),
            "model_files": model_identity(model_dir, s.config), "methods": {},
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
            "threads": torch.get_num_threads(), "data": data_meta, "scored_text": scored, "timings_s": {},
            "cpu": cpu_model()}


def resume_into(resume: dict, meta: dict, s: EvalSettings, log) -> tuple[list, dict, float]:
    """Continue the interrupted eval ``resume`` (checked against ``meta``): -> (its rows, curves, wall seconds);
    ``meta`` takes its finished methods and timings."""
    check_resumable(resume, meta)
    old = resume["meta"]
    meta.update(methods=dict(old["methods"]), timings_s=dict(old["timings_s"]), started=old["started"],
                resumed=[*old.get("resumed", []), {
                    "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "kept": list(old["timings_s"])}])
    log(f"resuming: kept {', '.join(old['timings_s'])}; running "
        f"{', '.join(m for m in s.methods if m not in old['timings_s'])}")
    return list(resume["results"]), dict(resume["curves"]), float(old.get("wall_s") or 0.0)


@torch.no_grad()
def evaluate_model(model_dir: str, settings: EvalSettings | None = None, *, progress: bool = True,
                   log=print, on_method_done: Callable[[dict], None] | None = None,
                   resume: dict | None = None, out: str | os.PathLike | None = None) -> dict:
    """Measure ``model_dir`` as ``settings`` says; -> {"meta", "results", "curves"} (the lab's row schema).

    ``on_method_done(doc)``: called after each method with the document so far (meta.incomplete names the methods
    still to run), so a caller can save finished work before a long run ends (``posenc eval --out`` does).
    ``resume``: such a document of an interrupted run; its finished methods are kept, not run again, when it was
    made with the same settings, model files and data (ConfigError naming what differs otherwise).
    ``out``: the folder a task may write into (``run.out``; None: a temporary folder, removed after).

    Rows of method "none" carry scaling "none", except with ``settings.config``: then the method that config applies
    (``config_method``: "longrope" for a searched config), so the lab's tables label them "rope + LongRoPE"."""
    from posenc.lab.tasks.registry import needs_corpus

    s = (settings or EvalSettings()).validate()
    config = check_model_folder(model_dir, s.config)
    check_methods(config, s)
    t_start = time.perf_counter()
    tokenizer = load_tokenizer(model_dir)
    codec = text_codec(tokenizer)
    corpus, data_meta, scored = None, None, None
    if needs_corpus(s.tasks):
        stream, data_meta, scored = scored_stream(s, tokenizer, position_limit(config))
        corpus = SimpleNamespace(val=stream, meta=data_meta)
    meta = start_meta(model_dir, s, codec[2], data_meta, scored)
    rows, curves, earlier_wall = [], {}, 0.0  # curves: the per-position losses at the longest length
    if resume is not None:
        rows, curves, earlier_wall = resume_into(resume, meta, s, log)
    for method in s.methods:
        if method in meta["timings_s"]:
            continue                     # finished before the interruption (resume)
        t0 = time.perf_counter()
        rows += run_method(model_dir, method, s, meta=meta, curves=curves, tokenizer=tokenizer, codec=codec,
                           corpus=corpus, progress=progress, log=log, out=out)
        meta["timings_s"][method] = round(time.perf_counter() - t0, 1)
        left = s.methods[s.methods.index(method) + 1:]
        if on_method_done is not None and left:
            partial = {**meta, "incomplete": f"methods still to run: {', '.join(left)}",
                       "wall_s": round(earlier_wall + time.perf_counter() - t_start, 1)}
            on_method_done({"meta": partial, "results": list(rows), "curves": dict(curves)})
    meta["wall_s"] = round(earlier_wall + time.perf_counter() - t_start, 1)
    return {"meta": meta, "results": rows, "curves": curves}


def run_method(model_dir, method: str, s: EvalSettings, *, meta: dict, curves: dict, tokenizer, codec, corpus,
               progress: bool, log, out) -> list[dict]:
    """Load the model for ``method`` (its config edit, or posenc.patch of an attention method), record what it is
    in ``meta["methods"]``, and run every task of ``s`` on it -> their rows."""
    from posenc.hf.attention_patch import attention_path
    from posenc.rope.describe import detect_scheme

    attention = attention_methods(s.methods)
    model, config, extended = load_causal_lm(model_dir, method=None if method in attention else config_edit(method),
                                             factor=s.factor, replace_scaling=s.replace_scaling, device=s.device,
                                             dtype=s.dtype, device_map=s.device_map,
                                             attn_implementation=s.attn_implementation, config_file=s.config,
                                             unscaled=method in attention and s.replace_scaling, log=log,
                                             progress=progress)
    rule = None
    if method not in attention:      # sliding-window layers run only their band (full layers: sdpa as loaded)
        from posenc.hf.band_route import use_band_route

        use_band_route(model, enabled=not s.no_band_attention)
    if method in attention:  # the loaded model's attention runs the method's rule
        from posenc.hf.patch import patch

        base = original_context(config)
        patch(model, method=method, target=None if s.factor is None or base is None else round(s.factor * base),
              **s.options_for(method))
        rule = next(m.rule for m in model.modules() if hasattr(m, "rule") and hasattr(m, "original"))
    scheme = detect_scheme(config.to_dict())[0]
    train_len = extended.original_context if extended else original_context(config, model_dir)
    limit = position_limit(config)
    meta["methods"][method] = {"scheme": scheme, "original_context": train_len, "position_limit": limit,
                               "rope_parameters": getattr(config, "rope_parameters", None),
                               "changes": extended.changes if extended else [],
                               "attention_rule": rule and {"name": rule.name, **rule.params(), "keeps": rule.keeps},
                               "attn_implementation": getattr(model.config, "_attn_implementation", None),
                               "attention_path": attention_path(model),
                               "device_map": getattr(model, "hf_device_map", None)}
    sized = request_sizer(model, model_dir, method, s, meta["methods"][method])
    vocab = model.get_output_embeddings().weight.shape[0]
    labels = dict(sized=sized, scheme=scheme, scaling=method if method != "none" or s.config is None else config_method(config),
                  train_len=train_len, limit=limit,
                  batch_tokens=s.batch_tokens or max(max(s.eval_lens + s.sliding_lens), LOGIT_BUDGET // vocab))
    return [row for task in s.tasks
            for row in run_task(task, model, s, tokenizer=tokenizer, codec=codec, corpus=corpus, meta=meta,
                                curves=curves, progress=progress, model_name=Path(model_dir).name, out=out,
                                **labels)]


def run_task(task_name: str, model, s: EvalSettings, *, scheme: str, scaling: str, train_len: int | None,
             limit: int | None, tokenizer, codec, batch_tokens: int, progress: bool, model_name: str,
             corpus=None, meta: dict | None = None, curves: dict | None = None,
             out: str | os.PathLike | None = None, sized=None) -> list[dict]:
    """Rows of registered task ``task_name`` on a loaded transformers ``model``, through the lab's task interface:
    its own ``evaluate(ev)`` on a ``ModelEvaluation`` (``ev.model`` the LogitsModel adapter, ``logits_model``:
    forward = logits of the model's token ids, generate = greedy; positions past ``limit`` unsupported;
    ``ev.encode``/``ev.decode`` the model's tokenizer, ``codec``). Nothing here names a task: a plug-in task runs
    as the built-ins do, under the lab's contract (``posenc.lab.tasks.checks.evaluate_task``: a row that breaks it
    is the task's error, naming its file). ``run.out`` is ``out`` (--out), else a temporary folder removed after:
    never the current directory. ``sized``: ``logits_model``'s per-call context (request-sized YaRN)."""
    import tempfile

    from posenc.lab.context import Run
    from posenc.lab.tasks import get_task
    from posenc.lab.tasks.checks import evaluate_task

    task = get_task(task_name)
    cfg = task_settings(s, train_len)
    task.check(cfg)
    encode, decode, byte_level = codec
    adapter = logits_model(model, max_len=limit, tokenizer=tokenizer, byte_level=byte_level,
                           batch_tokens=batch_tokens, sized=sized)
    peak_dtype = DTYPES["bfloat16" if s.dtype in ("float32", "fp32") else s.dtype]
    with tempfile.TemporaryDirectory(prefix="posenc-eval-task-") as temporary:
        folder = Path(out if out is not None else temporary)
        folder.mkdir(parents=True, exist_ok=True)
        run = Run(cfg=cfg, corpus=corpus if task.needs_corpus else None, device=input_device(model), out=folder,
                  progress=progress, log=lambda *_: None)
        ev = ModelEvaluation(run=run, model=adapter, task=task_name, scheme=scheme, scaling=scaling, seed=s.seed,
                             curves=curves if curves is not None else {}, encode=encode, decode=decode,
                             batch_tokens=batch_tokens, hf_model=model, model_name=model_name, limit=limit,
                             unit=None if byte_level else "token", meta=meta,
                             peak_settings=(s.device if s.device_map is None else "cpu", peak_dtype))
        return evaluate_task(task, ev)
