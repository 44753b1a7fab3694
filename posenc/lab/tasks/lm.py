"""The ``lm`` task: next-byte prediction on the corpus; perplexity vs length (non-overlapping windows, the ALiBi
paper's protocol, and a sliding window), and the mean loss at each position of the longest window."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from posenc._internal.validate import check_int
from posenc._internal.errors import ConfigError
from posenc.lab.context import supports_length
from posenc.lab.data import LMSampler
from posenc.lab.plots import legend, log_axes, mark_unsupported, note_coinciding, pyplot, save, series, style
from posenc.lab.tables import bands_cell, fmt, markdown, model_label, pivot
from posenc.lab.tasks.registry import Task, register_task
from posenc.perplexity import window_losses

EVAL_BATCH_TOKENS = 16384  # tokens per evaluation forward (rows = EVAL_BATCH_TOKENS // eval_len)


def scored_tokens(n_tokens: int, eval_len: int) -> int:
    """Tokens the non-overlapping protocol scores for a budget of ``n_tokens``: whole windows of ``eval_len``, at
    least one (1024 tokens at length 96 score 960)."""
    return max(1, n_tokens // eval_len) * eval_len


@torch.no_grad()
def lm_eval(model, tokens: torch.Tensor, eval_len: int, *, n_tokens: int, stride: int | None = None,
            device="cpu", batch_tokens: int = EVAL_BATCH_TOKENS) -> dict | None:
    """Perplexity of ``model`` on ``tokens`` (uint8 stream) with windows of ``eval_len``.

    stride None: non-overlapping windows (every token scored once, context restarts at each window start);
    also returns the mean loss at each position of the window, ``per_position`` [eval_len].
    stride S: sliding window; after the first window each pass scores only its S newest tokens, with
    eval_len - S tokens of context. About ``n_tokens`` tokens are scored either way.
    -> {"ppl", "loss", "n_scored", "per_position"?} or None if the model cannot encode eval_len positions.
    Scoring: ``posenc.perplexity.window_losses`` (shared with LongRoPE's search fitness).
    """
    if not supports_length(model, eval_len):
        return None
    if stride is None:
        n_win = scored_tokens(min(n_tokens, len(tokens) - 1), eval_len) // eval_len
        spans = [(w * eval_len, 0) for w in range(n_win)]  # (window start, first scored position)
    else:
        check_int(stride, "stride", min=1, max=eval_len, error=ConfigError)
        last = min(n_tokens, len(tokens) - 1) - eval_len
        spans = [(0, 0)] + [(s, eval_len - stride) for s in range(stride, max(0, last) + 1, stride)]
    if spans[-1][0] + eval_len + 1 > len(tokens):
        raise ConfigError(f"eval_len {eval_len}: the validation text ({len(tokens)} bytes) is too short")
    total, count = 0.0, 0
    pos_sum = torch.zeros(eval_len, dtype=torch.float64)
    batches = window_losses(model, tokens, [start for start, _ in spans], eval_len,
                            batch_size=max(1, batch_tokens // eval_len), device=device)
    for rows, loss in batches:
        for b, r in enumerate(rows):
            first = spans[r][1]
            total += loss[b, first:].sum().item()
            count += eval_len - first
        if stride is None:
            pos_sum += loss.sum(0)
    out = {"loss": total / count, "ppl": math.exp(total / count), "n_scored": count}
    if stride is None:
        out["per_position"] = (pos_sum / len(spans)).tolist()
    return out


def token_unit(rows: list[dict]) -> str:
    """What the rows' lengths and losses count: "byte" (the lab's byte tokens, rows without a ``unit``) or the
    ``unit`` ``posenc eval`` records for a model with its own tokenizer ("token")."""
    return rows[0].get("unit", "byte") if rows else "byte"


def sliding_stride(setting: int, length: int) -> int:
    """The lab's --sliding-stride: S as given, or half the window for -1."""
    return setting if setting > 0 else max(1, length // 2)


@register_task("lm")
class LanguageModelling(Task):
    """Byte-level language modelling on the corpus (CPython stdlib by default)."""

    needs_corpus = True
    metrics = ("ppl",)
    title = "Perplexity"

    def check(self, cfg) -> None:
        shortest = min(cfg.sliding_lens or [max(cfg.eval_lens)])
        if cfg.sliding_stride > shortest:
            raise ConfigError(f"sliding_stride: expected -1 (auto), 0 (off) or 1..{shortest} (the sliding-window "
                              f"length), got {cfg.sliding_stride}")

    def sampler(self, run, seq_len, batch_size, seed):
        return LMSampler(run.corpus.train, seq_len, batch_size, seed)

    def evaluate(self, ev) -> list[dict]:
        cfg, model, val = ev.cfg, ev.model, ev.run.corpus.val
        batch_tokens = ev.batch_tokens or EVAL_BATCH_TOKENS

        def score(L, stride=None):
            n_tokens = cfg.eval_tokens if stride is None else cfg.sliding_tokens
            with ev.measure(L, stride) as meter:
                r = lm_eval(model, val, L, n_tokens=n_tokens, stride=stride, device=ev.device,
                            batch_tokens=batch_tokens)
            return r, meter.cost(r)

        rows = []
        for L, (r, cost) in zip(cfg.eval_lens, ev.map(score, cfg.eval_lens, cost=lambda L: L)):
            rows.append(ev.row(L, "ppl", r and r["ppl"], protocol="non-overlapping", **cost))
            if r is not None and L == max(cfg.eval_lens):
                ev.add_curve(r["per_position"])
        if cfg.sliding_stride:
            lens = cfg.sliding_lens or [max(cfg.eval_lens)]
            strides = {L: sliding_stride(cfg.sliding_stride, L) for L in lens}
            scored = ev.map(lambda L: score(L, strides[L]), lens, cost=lambda L: L)
            for L, (r, cost) in zip(lens, scored):
                rows.append(ev.row(L, "ppl", r and r["ppl"], protocol=f"sliding (stride {strides[L]})", **cost))
        return rows

    def text_needed(self, cfg) -> list[tuple]:
        """(tokens, length, stride or None, the budget setting) for each perplexity measurement: ``lm_eval`` reads its whole windows of
        the eval_tokens budget (non-overlapping) or the sliding_tokens budget itself, and the last window's next
        token."""
        jobs = [(L, None) for L in cfg.eval_lens]
        if cfg.sliding_stride:
            jobs += [(L, sliding_stride(cfg.sliding_stride, L)) for L in cfg.sliding_lens or [max(cfg.eval_lens)]]
        return [((scored_tokens(cfg.eval_tokens, L) if stride is None else max(cfg.sliding_tokens, L)) + 1, L, stride,
                 "eval_tokens" if stride is None else "sliding_tokens") for L, stride in jobs]

    def report(self, results: list[dict]) -> str:
        rows = [r for r in results if r["task"] == self.name]
        if not rows:
            return ""
        unit = "byte-level" if token_unit(rows) == "byte" else "per token of the model's tokenizer"
        parts = [f"Perplexity ({unit}, non-overlapping windows), train length "
                 f"{rows[0]['train_len']}:\n" + lm_table(results)]
        for p in sorted({r["protocol"] for r in rows if r["protocol"].startswith("sliding")}):
            parts.append(f"Perplexity, {p}:\n" + lm_table(results, p))
        return "\n\n".join(parts)

    def plot(self, doc: dict, out: Path) -> list[str]:
        return ppl_plot(doc["results"], out) + position_plot(doc, out)


def lm_table(results: list[dict], protocol: str = "non-overlapping") -> str:
    """Perplexity by evaluation length (x the training length), with the extension methods' band counts."""
    lens, table = pivot(results, "lm", "ppl", protocol)
    if not table:
        return ""
    train_len = next(iter(table.values()))[0]["train_len"]
    has_bands = any(bands_cell(first) for first, _ in table.values())
    header = ["model"] + (["bands k/b/i"] if has_bands else []) + [f"{L} ({L / train_len:g}x)" for L in lens]
    body = [[label] + ([bands_cell(first)] if has_bands else []) + [fmt(cells.get(L)) for L in lens]
            for label, (first, cells) in table.items()]
    return markdown(header, body)


def ppl_plot(results: list[dict], out: Path) -> list[str]:
    lm = series(results, "lm", "ppl", protocol="non-overlapping")
    if not lm:
        return []
    plt = pyplot()
    train_len = results[0]["train_len"]
    fig, ax = plt.subplots(figsize=(8, 5))
    drawn: dict[str, list[tuple]] = {}
    for label, rows in lm.items():
        pts = sorted((r["eval_len"], r["value"]) for r in rows if r["value"] is not None)
        if pts:
            line, = ax.plot(*zip(*pts), label=label, **style(rows[0]))
            mark_unsupported(ax, rows, pts, line)
            drawn[label] = pts
    note_coinciding(ax, drawn)
    ax.axvline(train_len, color="0.6", linewidth=1)
    ax.text(train_len, ax.get_ylim()[1], " train length", va="top", fontsize=8, color="0.4")
    ax.set(xscale="log", yscale="log", xlabel="evaluation length (tokens)", ylabel="perplexity (log)",
           title="Perplexity vs evaluation length (non-overlapping windows)")
    log_axes(ax, {r["eval_len"] for rows in lm.values() for r in rows}, logy=True)
    legend(ax)
    ax.grid(True, which="both", alpha=0.3)
    save(fig, out / "ppl_vs_length.png")
    plt.close(fig)
    return ["ppl_vs_length.png"]


def position_plot(doc: dict, out: Path) -> list[str]:
    """Mean loss at each position of the longest window (first seed of each model)."""
    curves = doc.get("curves") or {}
    if not curves:
        return []
    plt = pyplot()
    train_len = doc["results"][0]["train_len"] if doc["results"] else None
    fig, ax = plt.subplots(figsize=(8, 5))
    seen = set()
    for key, losses in curves.items():
        scheme, scaling, ft, seed, *positions = key.split("|")
        row = {"scheme": scheme, "scaling": scaling, "finetuned": ft == "ft",
               "positions": positions[0] if positions else None}
        label = model_label(row)
        if label in seen:  # first seed only
            continue
        seen.add(label)
        k = max(1, len(losses) // 64)  # average over buckets of k positions; None (diverged) points are skipped
        buckets = [[v for v in losses[i * k:(i + 1) * k] if v is not None] for i in range(len(losses) // k)]
        pts = [(i * k + k / 2, sum(b) / len(b)) for i, b in enumerate(buckets) if b]
        if pts:
            ax.plot(*zip(*pts), label=label, **{**style(row), "marker": None})
    ax.axvline(train_len, color="0.6", linewidth=1)
    unit = token_unit([r for r in doc["results"] if r["task"] == "lm"])
    ax.set(xlabel="position in window", ylabel=f"mean loss (nats/{unit})",
           title="Loss at each position (non-overlapping windows, longest eval length)")
    ax.set_ylim(top=min(ax.get_ylim()[1], 6.0))
    legend(ax)
    ax.grid(True, alpha=0.3)
    save(fig, out / "per_position_loss.png")
    plt.close(fig)
    return ["per_position_loss.png"]
