"""The SmolLM2 study's plots (scripts/smollm2_study.py collect): perplexity at 16k per method, perplexity against
length, and passkey at 16k, drawn from the collected results.json's rows."""

from __future__ import annotations

from pathlib import Path

from smollm2_study_report import _value, label


def plot_ppl(study: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posenc.tools.evidence import zero_shot

    shown = zero_shot(study, 16384, text="cpython")[::-1]
    base8 = [e["ppl"] for e in zero_shot(study, 8192, text="cpython") if e["method"] == "none"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.barh([label(e["method"]) for e in shown], [e["ppl"] for e in shown],
            xerr=[e["std"] or 0 for e in shown], color="#4477aa", capsize=3)
    for i, e in enumerate(shown):
        ax.text(e["ppl"] + (e["std"] or 0), i, f" {_value(e)}", va="center", fontsize=8)
    if base8:
        ax.axvline(base8[0], color="#cc3311", ls="--", label=f"unscaled at 8192 (trained length): {base8[0]:.2f}")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("perplexity at 16384 tokens (2x the trained 8192), CPython validation text (log scale)")
    w = min((e["windows"] for e in shown), default=0)
    ax.set_title(f"SmolLM2-135M zero-shot, {w} window{'s' if w != 1 else ''} of 16k tokens"
                 + (" (mean ± std)" if w > 1 else "") + ", bf16")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_lengths(study: dict, path: Path) -> None:
    """Perplexity vs length per method (8k: the unscaled model; each method's windows at 16k and 32k)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posenc.tools.evidence import zero_shot

    by: dict = {}
    for length in (8192, 16384, 32768):
        for e in zero_shot(study, length, text="cpython"):
            by.setdefault(e["method"], []).append((length, e["ppl"]))
    base = dict(by.get("none", [])).get(8192)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    colors = plt.get_cmap("tab20").colors
    markers = "osD^v<>ph*X"
    for k, (method, pts) in enumerate(sorted(by.items())):
        if base is not None and pts[0][0] != 8192:
            pts = [(8192, base)] + pts     # every method is the unscaled model at its trained length
        for ax in axes:
            if ax is axes[1] and max(p[1] for p in pts) > 3 * (base or 1):
                continue                   # the zoom leaves out the curves that leave it
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[k % len(markers)],
                    color=colors[(2 * k) % 20 if k < 10 else (2 * k + 1) % 20], label=label(method))
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks([8192, 16384, 32768], ["8k (1x)", "16k (2x)", "32k (4x)"])
    axes[0].set_yscale("log")
    axes[0].set_ylabel("perplexity (log scale)")
    axes[0].set_title("every method")
    axes[1].set_ylabel("perplexity")
    axes[1].set_title("zoom: the methods that stay near the trained value")
    axes[1].legend(fontsize=7)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("SmolLM2-135M zero-shot, CPython text (16k: mean over its windows; 32k: one window)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_passkey(study: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posenc.tools.evidence import passkey_cells

    cells = passkey_cells(study, 16384)
    if not cells:
        return
    depths = sorted({d for c in cells.values() for d in c})
    methods = list(cells)
    grid = [[cells[m].get(d, (float("nan"), 0))[0] for d in depths] for m in methods]
    fig, ax = plt.subplots(figsize=(5.5, 0.5 * len(methods) + 1.5))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_yticks(range(len(methods)), [label(m) for m in methods])
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.0%}", ha="center", va="center", color="w" if v < 0.5 else "k")
    ax.set_xlabel("depth of the key in the prompt (0 = start)")
    most = max(t for c in cells.values() for _, t in c.values())
    fewer = [f"{label(m)} {min(t for _, t in c.values())}" for m, c in cells.items()
             if min(t for _, t in c.values()) < most]
    ax.set_title("SmolLM2-135M passkey at 16,384 tokens (2x), exact match\n"
                 f"({most} trial{'s' if most != 1 else ''} per cell" + ("; " + ", ".join(fewer) if fewer else "")
                 + ")", fontsize=10)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
