"""The lab's two small contexts, instead of long positional argument lists.

    Run         one ``posenc lab`` run: settings, corpus, device, out folder, resume/progress, log
    Evaluation  one trained model being scored: the run, the model, its labels (task, scheme, scaling method,
                fine-tuned, seed), where results go (rows, per-position curves) and the model's text codec
                (``encode``/``decode``: bytes in the lab, the model's tokenizer in ``posenc eval``)

Tasks (posenc/lab/tasks/) receive a Run when building samplers and an Evaluation when scoring.
"""

from __future__ import annotations

import math
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from posenc.lab.distributed import is_main_process, map_across_ranks


DIVERGED = "diverged (non-finite)"  # the note of a row whose value is NaN/inf: training blew up


@dataclass
class Run:
    """cfg: the LabConfig; corpus: the text corpus (None when no task needs it); device: resolved once."""

    cfg: Any
    corpus: Any
    device: torch.device
    out: Path
    resume: bool = False
    progress: bool = True
    log: Callable = print
    precision: str = "fp32"  # resolved: "fp32" or "bf16" (posenc.lab.precision)

    def bar(self, total: float, desc: str):
        """A tqdm bar (rate and ETA) for ``total`` units of work; silent with progress off or off rank 0."""
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True, mininterval=0.5,
                    disable=not self.progress or not is_main_process(),
                    bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}")


def byte_encode(text: str) -> list[int]:
    """The lab's tokens of ``text``: its UTF-8 bytes."""
    return list(text.encode("utf-8"))


def byte_decode(ids: Sequence[int]) -> str:
    """Text of the lab's byte tokens (invalid UTF-8 becomes U+FFFD)."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class Meter:
    """What ``Evaluation.measure`` yields: ``cost(result)`` is the extra fields of the row scored inside it. The lab
    records no per-length cost (its timings are per model, in meta); ``posenc eval`` records wall and CPU time,
    tokens/s and FLOP/s (``posenc.hf.eval.context``)."""

    def cost(self, result) -> dict:
        return {}


def supports_length(model, length: int) -> bool:
    """False when the model has no encoding for some position < length (a learned table too short)."""
    max_len = model.scheme.max_len
    return max_len is None or length <= max_len


@dataclass
class Evaluation:
    """One trained model under evaluation. ``row`` builds a result row; ``map`` splits work across ranks."""

    run: Run
    model: Any
    task: str
    scheme: str
    scaling: str = "none"
    finetuned: bool = False
    seed: int = 0
    bands: dict | None = None
    curves: dict = field(default_factory=dict)
    positions: str | None = None  # None: plain training positions; "randomized N=1024" (Ruoss et al. 2023)
    # the model's text codec: text -> the token ids the model reads, and back (a tokenizer-aware task, such as a
    # retrieval task, builds its prompts with them and so runs on a lab model and on a real model alike)
    encode: Callable[[str], list[int]] = byte_encode
    decode: Callable[[Sequence[int]], str] = byte_decode
    batch_tokens: int | None = None  # tokens per forward pass; None: the task's own default

    @property
    def cfg(self):
        return self.run.cfg

    @property
    def device(self):
        return self.run.device

    def __post_init__(self):
        # weights with NaN/inf (a blown-up training run, or a checkpoint holding them): every metric of this model
        # is "diverged", not a number (an accuracy from argmax over NaN logits would read as a real 0%)
        self.diverged = not all(bool(torch.isfinite(p).all()) for p in self.model.parameters())

    def supports(self, length: int) -> bool:
        return supports_length(self.model, length)

    @property
    def unsupported_note(self) -> str:
        """The note of a length the model cannot encode (nothing is clamped)."""
        return f"n/a (table = {self.model.scheme.max_len})"

    def curve_key(self) -> str:
        key = f"{self.scheme}|{self.scaling}|{'ft' if self.finetuned else 'zs'}|{self.seed}"
        return key + (f"|{self.positions}" if self.positions else "")

    def row(self, eval_len: int, metric: str, value, **extra) -> dict:
        """A result row; a None value gets the unsupported-length note; a non-finite value, or any value of a model
        whose weights are not finite, is None with the note DIVERGED."""
        row = {"task": self.task, "scheme": self.scheme, "scaling": self.scaling, "finetuned": self.finetuned,
               "train_len": self.cfg.train_len, "eval_len": eval_len, "metric": metric, "value": value,
               "seed": self.seed, "protocol": None, "depth": None}
        row.update(extra)
        if self.bands is not None:
            row["bands"] = self.bands
        if self.positions:
            row["positions"] = self.positions
        if value is None:
            row.setdefault("note", self.unsupported_note)
        elif self.diverged or not math.isfinite(value):
            row["value"], row["note"] = None, DIVERGED
        return row

    @torch.no_grad()
    def generate(self, ids: Sequence[int], n_new: int) -> list[int]:
        """Greedy decoding with the KV cache: the ``n_new`` token ids the model writes after the prompt ``ids``
        (its tokens, ``encode``'s); ``posenc eval`` stops early where the model ends its text (its EOS token)."""
        out = self.model.generate(torch.tensor([list(ids)], device=self.device), n_new)
        return [int(t) for t in out[0].tolist()]

    @contextlib.contextmanager
    def measure(self, length: int, stride: int | None = None):
        """Around the scoring of one length (``stride``: its sliding stride, None for non-overlapping windows):
        yields a ``Meter`` whose ``cost(result)`` is the row's cost fields (none in the lab)."""
        yield Meter()

    def add_curve(self, values) -> None:
        """Record this model's per-position curve (rounded); a non-finite point is stored as None (diverged)."""
        self.curves[self.curve_key()] = [round(float(x), 4) if math.isfinite(x) and not self.diverged else None
                                         for x in values]

    def map(self, fn: Callable, items, *, cost: Callable | None = None) -> list:
        """[fn(item) for item in items]; under torchrun each rank computes a share (balanced by ``cost``).

        Shows a progress bar advanced by ``cost(item)`` (default 1) as each item is done (rank 0's share when
        distributed)."""
        items = list(items)
        costs = [float(cost(item)) if cost else 1.0 for item in items]
        label = self.scheme + (f" ({self.positions})" if self.positions else "")
        label += "" if self.scaling == "none" else f" + {self.scaling}"
        with self.run.bar(sum(costs), f"eval {self.task} {label}{' ft' if self.finetuned else ''} s{self.seed}") as bar:
            def one(i: int):
                out = fn(items[i])
                bar.update(costs[i])
                return out

            return map_across_ranks(one, range(len(items)), cost=lambda i: costs[i])
