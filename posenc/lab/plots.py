"""PNG plots of a lab run: perplexity vs length, per-position loss, copy and passkey accuracy vs length."""

from __future__ import annotations

from pathlib import Path

from posenc._atomic import atomic_path
from posenc.lab.report import _sort_key, model_label

COLORS = {"nope": "tab:gray", "sinusoidal": "tab:orange", "learned": "tab:brown", "rope": "tab:blue",
          "alibi": "tab:green", "rope+alibi": "tab:purple"}
EXT_COLORS = {"linear": "tab:red", "ntk": "tab:cyan", "dynamic": "tab:olive", "yarn": "tab:pink",
              "llama3": "black"}


def _style(row: dict) -> dict:
    if row["scaling"] == "none":
        return dict(color=COLORS.get(row["scheme"]), linestyle=":" if row["finetuned"] else "-", linewidth=2.2,
                    marker="o")
    return dict(color=EXT_COLORS.get(row["scaling"]), linestyle=":" if row["finetuned"] else "--", linewidth=1.4,
                marker="s", markersize=4)


def _series(results, task, metric, **match):
    groups: dict[str, list[dict]] = {}
    for r in sorted(results, key=_sort_key):
        if r["task"] == task and r["metric"] == metric and all(r.get(k) == v for k, v in match.items()):
            groups.setdefault(model_label(r), []).append(r)
    return groups


def _save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")


def _log_axes(ax, ticks, ticker, logy=False):
    """Plain-number labels on log axes: the evaluation lengths on x, ppl values on y."""
    ax.set_xticks(sorted(ticks))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    if logy:
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))


def make_plots(doc: dict, out: Path) -> list[str]:
    """Write every plot that the run has data for; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res, written = doc["results"], []
    train_len = res[0]["train_len"] if res else None

    lm = _series(res, "lm", "ppl", protocol="non-overlapping")
    if lm:
        fig, ax = plt.subplots(figsize=(8, 5))
        for label, rows in lm.items():
            pts = sorted((r["eval_len"], r["value"]) for r in rows if r["value"] is not None)
            if pts:
                ax.plot(*zip(*pts), label=label, **_style(rows[0]))
        ax.axvline(train_len, color="0.6", linewidth=1)
        ax.text(train_len, ax.get_ylim()[1], " train length", va="top", fontsize=8, color="0.4")
        ax.set(xscale="log", yscale="log", xlabel="evaluation length (tokens)", ylabel="perplexity (log)",
               title="Perplexity vs evaluation length (non-overlapping windows)")
        _log_axes(ax, {r["eval_len"] for rows in lm.values() for r in rows}, matplotlib.ticker, logy=True)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(True, which="both", alpha=0.3)
        _save(fig, out / "ppl_vs_length.png")
        plt.close(fig)
        written.append("ppl_vs_length.png")

    curves = doc.get("curves") or {}
    if curves:
        fig, ax = plt.subplots(figsize=(8, 5))
        seen = set()
        for key, losses in curves.items():
            scheme, scaling, ft, seed = key.split("|")
            label = model_label({"scheme": scheme, "scaling": scaling, "finetuned": ft == "ft"})
            if label in seen:  # first seed only
                continue
            seen.add(label)
            k = max(1, len(losses) // 64)  # average over buckets of k positions
            xs = [i * k + k / 2 for i in range(len(losses) // k)]
            ys = [sum(losses[i * k:(i + 1) * k]) / k for i in range(len(losses) // k)]
            ax.plot(xs, ys, label=label, **{**_style({"scheme": scheme, "scaling": scaling, "finetuned": ft == "ft"}),
                                             "marker": None})
        ax.axvline(train_len, color="0.6", linewidth=1)
        ax.set(xlabel="position in window", ylabel="mean loss (nats/byte)",
               title="Loss at each position (non-overlapping windows, longest eval length)")
        ax.set_ylim(top=min(ax.get_ylim()[1], 6.0))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(True, alpha=0.3)
        _save(fig, out / "per_position_loss.png")
        plt.close(fig)
        written.append("per_position_loss.png")

    for task, metric, title, name in [("copy", "exact_match", "Copy task: exact match", "copy_accuracy.png"),
                                      ("passkey", "exact_match", "Passkey retrieval: exact match (mean over depths)",
                                       "passkey_accuracy.png")]:
        series = _series(res, task, metric)
        if not series:
            continue
        fig, axes = plt.subplots(1, 2 if task == "copy" else 1, figsize=(12 if task == "copy" else 8, 5),
                                 squeeze=False)
        metrics = [("exact_match", title)] + ([("token_accuracy", "Copy task: token accuracy")] if task == "copy" else [])
        for ax, (m, t) in zip(axes[0], metrics):
            for label, rows in _series(res, task, m).items():
                by_len: dict[int, list[float]] = {}
                for r in rows:
                    if r["value"] is not None:
                        by_len.setdefault(r["eval_len"], []).append(r["value"])
                pts = sorted((L, sum(v) / len(v)) for L, v in by_len.items())
                if pts:
                    ax.plot(*zip(*pts), label=label, **_style(rows[0]))
            ax.axvline(train_len, color="0.6", linewidth=1)
            ax.set(xscale="log", xlabel="sequence length (tokens)", ylabel="accuracy", title=t, ylim=(-0.03, 1.03))
            _log_axes(ax, {r["eval_len"] for rows in series.values() for r in rows}, matplotlib.ticker)
            ax.grid(True, alpha=0.3)
        axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        _save(fig, out / name)
        plt.close(fig)
        written.append(name)
    return written
