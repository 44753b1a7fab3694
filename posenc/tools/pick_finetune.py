"""The picker's fine-tuning evidence: a committed fine-tune study of this very model (``"study":
"real-model-finetune"``; scripts/smollm2_finetune.py writes docs/results/smollm2-finetune/, shipped as
posenc/tools/measured/smollm2-finetune/results.json).

For ``posenc pick --budget finetune`` on the model a study fine-tuned, ``finetune_evidence`` cites what was measured:
each fine-tuned method's perplexity at the target length beside the best zero-shot method's on the same window,
its passkey retrieval there, and what the fine-tune cost (steps, tokens, CPU time). When another fine-tuned method
measured better than the recommended one, a note says so; the recommendation itself stays the papers' (a study of
one model at one length is evidence, not a rule).
"""

from __future__ import annotations

from typing import Any

from posenc.tools.pick_rules import Recommendation

STUDY = "real-model-finetune"


def finetune_study(config, root=None) -> tuple[Any, dict[str, Any]] | None:
    """(path, document) of the fine-tune study of the model ``config`` describes, or None."""
    from posenc.tools._io import read_config
    from posenc.tools.evidence import differing_keys, identity, studies

    mine = identity(read_config(config))
    for path, doc in studies(root, kind=STUDY):
        if not differing_keys(mine, doc["model"]):
            return path, doc
    return None


def _method(run: dict) -> str:
    from posenc.extensions import method_label

    method = (run.get("extension") or {}).get("method") or "?"
    return method_label(method) if method != "?" else method


def _passkey(rows: list[dict], run: str, length: int) -> str:
    cells = [r for r in rows if r.get("run") == run and r.get("task") == "passkey" and r.get("eval_len") == length
             and r.get("value") is not None]
    return f"; passkey {sum(round(float(r['value'])) for r in cells)}/{len(cells)}" if cells else ""


def finetune_evidence(rec: Recommendation, config, T: int, root=None) -> None:
    """Cite the fine-tune study of this model at T (a reason), or say which lengths it measured (a note)."""
    found = finetune_study(config, root)
    if found is None:
        return
    path, study = found
    where = study.get("report") or str(path)
    rows = [r for r in study.get("rows", []) if r.get("task") == "lm" and r.get("text", "cpython") == "cpython"
            and r.get("eval_len") == T and r.get("value") is not None]
    if not rows:
        lens = sorted({r["eval_len"] for r in study.get("rows", []) if r.get("task") == "lm"})
        rec.notes.append(f"the fine-tune study of this model ({where}) measured lengths {lens}, not {T:,}")
        return
    runs = study.get("runs", {})
    parts = []
    for r in sorted(rows, key=lambda r: r["value"]):
        run = runs.get(r["run"], {})
        zero = r.get("zero_shot") or {}
        best = min(zero.items(), key=lambda kv: kv[1]) if zero else None
        minutes = (run.get("train_s") or 0) / 60
        parts.append(f"{_method(run)} fine-tuned with PoSE + LoRA ({run.get('steps')} steps, "
                     f"{run.get('tokens') or 0:,} tokens, {minutes:.0f} min of training on "
                     f"{run.get('torch_threads')} CPU threads) {r['value']:.2f}"
                     + (f" against the best zero-shot method's ({best[0]}) {best[1]:.2f} on the same window"
                        if best else "") + _passkey(study.get("rows", []), r["run"], T))
    rec.reasons.insert(0, f"measured on this model ({study.get('name', 'real model')}; {where}): perplexity at "
                          f"{T:,} tokens of the CPython validation text, bf16: " + "; ".join(parts))
    best_run = runs.get(min(rows, key=lambda r: r["value"])["run"], {})
    measured_best = (best_run.get("extension") or {}).get("method")
    recommended = rec.parameters.get("rope_type")
    if measured_best and recommended and measured_best != recommended:
        rec.notes.append(f"in that study {_method(best_run)} measured better after the same fine-tune than the "
                         f"recommended {recommended}; the recommendation keeps the papers' choice (one model, one "
                         "length)")
