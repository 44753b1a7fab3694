"""``posenc tune``'s measurements through ``posenc eval``'s loop (``evaluate_model``, the one owner of scoring): one
candidate on one window of the held-out text (the window's ``eval_offset``, so every candidate scores the same
tokens), and retrieval (passkey, RULER's tasks) on the race's survivors. Each measurement is kept in ``Measurements`` by its key, so a resumed
tune measures nothing twice."""

from __future__ import annotations

import math

from posenc.hf.tune.plan import Candidate


def eval_settings(c: Candidate, *, length: int, trained: int, target: int, window: int, data, dtype: str,
                  device: str, tasks=("lm",), options: dict | None = None, replace: bool = False,
                  band: bool = True):
    """The EvalSettings that measure candidate ``c`` on window ``window`` (tokens [window x length, (window + 1) x
    length) of the scored text) at ``length``: its method as eval runs it (a config edit at factor target /
    trained, or the attention rule with its options); the model as configured (``c.configured``, and the
    reference "none") loads as its config says, and a searched candidate (``c.searched``) as the search's config
    file says (eval's --config). ``replace``: the config holds a scaling that the method replaces
    (eval's --replace: computed from the original RoPE parameters). ``band`` False: sliding-window layers run
    sdpa's masked square (eval's --no-band-attention)."""
    from posenc.hf.eval.settings import EvalSettings

    method = "none" if c.configured or c.searched else c.method
    factor = None if method == "none" else target / trained
    return EvalSettings(eval_lens=[length], tasks=list(tasks), methods=[method], factor=factor,
                        method_options={f"{method}.{k}": v for k, v in c.options.items()}, data=data,
                        eval_tokens=length, eval_offset=window * length, sliding_stride=0, dtype=dtype,
                        device=device, options=dict(options or {}), replace_scaling=replace and method != "none",
                        config=c.searched or None, no_band_attention=not band)


def window_loss(model_dir: str, settings) -> float:
    """Mean log-perplexity (nats per token) of the one window ``settings`` scores; inf when it diverged."""
    from posenc.hf.eval.loop import evaluate_model

    doc = evaluate_model(model_dir, settings, progress=False, log=lambda *_: None)
    ppl = next(r["value"] for r in doc["results"] if r["metric"] == "ppl")
    return math.log(ppl) if ppl else math.inf


def passkey_rate(model_dir: str, settings) -> float | None:
    """Mean passkey accuracy over the depths of ``settings`` (tasks=["passkey"])."""
    from posenc.hf.eval.loop import evaluate_model

    doc = evaluate_model(model_dir, settings, progress=False, log=lambda *_: None)
    values = [r["value"] for r in doc["results"] if r["value"] is not None]
    return sum(values) / len(values) if values else None


def ruler_scores(model_dir: str, settings) -> dict[str, dict]:
    """Each RULER task of ``settings`` (tasks, options["ruler_samples"]) at its one length: {task: {"value": mean
    string_match_all, "n": samples scored, "ci_low", "ci_high": Wilson 95%}}; value None (n 0) with the row's note
    where the template does not fit the length."""
    from posenc.hf.eval.loop import evaluate_model

    doc = evaluate_model(model_dir, settings, progress=False, log=lambda *_: None)
    out = {}
    for r in doc["results"]:
        if r["value"] is None:
            out[r["task"]] = {"value": None, "n": 0, "ci_low": None, "ci_high": None, "note": r.get("note")}
        else:
            out[r["task"]] = {"value": r["value"], "n": r["n_samples"], "ci_low": r["ci_low"],
                              "ci_high": r["ci_high"]}
    return out


class Measurements:
    """The measurements made so far, by key (``"yarn@64#0"``: candidate, length, window): what results.json keeps,
    and what ``--resume`` reads back so that nothing is measured twice."""

    def __init__(self, done: dict | None = None, on_new=None):
        self.done = dict(done or {})
        self.on_new = on_new             # called after each new measurement (saves results.json)

    def get(self, key: str, measure):
        if key not in self.done:
            self.done[key] = measure()
            if self.on_new is not None:
                self.on_new()
        return self.done[key]

    def put(self, measured: dict) -> None:
        """Keep several new measurements (key -> value) made by one call, and save once."""
        self.done.update(measured)
        if self.on_new is not None:
            self.on_new()
