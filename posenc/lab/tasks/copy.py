"""The ``copy`` task (the lesson's exercise 3): random bytes, a separator, then the same bytes; exact match and
token accuracy per length, teacher forced.

Episode: [x_1..x_n, SEP, x_1..x_n, pad...]; the loss scores only the copied half. With a deterministic copy,
teacher-forced exact match equals greedy decoding's (greedy reproduces the teacher-forced prefix until its first
wrong token).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from posenc.errors import DataError
from posenc.lab.context import supports_length
from posenc.lab.data import IGNORE, batch_generator
from posenc.lab.plots import accuracy_plot
from posenc.lab.tables import fmt, markdown, pivot
from posenc.lab.tasks.registry import Task, register_task

COPY_SEP = 0  # never drawn as a content token (content bytes are 1..255)


def copy_example(n: int, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """One copy episode padded to ``length`` tokens -> (inputs, targets) with targets IGNORE outside the copy."""
    xs = [rng.randrange(1, 256) for _ in range(n)]
    seq = xs + [COPY_SEP] + xs
    seq = seq + [COPY_SEP] * (length + 1 - len(seq))
    targets = [IGNORE] * length
    for i in range(n):  # input position n + i (SEP, then x_1..) predicts x_{i+1}
        targets[n + i] = xs[i]
    return seq[:length], targets


def copy_len(length: int) -> int:
    """Longest copy that fits a sequence of ``length`` tokens: 2n + 1 <= length."""
    return (length - 1) // 2


class CopySampler:
    """Copy episodes of length ``seq_len`` with n drawn uniformly from 1..copy_len(seq_len)."""

    def __init__(self, seq_len: int, batch_size: int, seed: int):
        if seq_len < 3:
            raise DataError(f"seq_len: the copy task needs at least 3 tokens, got {seq_len}")
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed

    def batch(self, step: int, rank: int = 0, world_size: int = 1):
        rng = random.Random(int(batch_generator(self.seed, step).initial_seed()))
        rows = [copy_example(rng.randint(1, copy_len(self.seq_len)), self.seq_len, rng)
                for _ in range(self.batch_size)][rank::world_size]
        return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])


def _batches(n: int, per_batch: int):
    for i in range(0, n, per_batch):
        yield range(i, min(n, i + per_batch))


@torch.no_grad()
def copy_eval(model, length: int, *, n_examples: int, seed: int, device="cpu",
              batch_tokens: int = 16384) -> dict | None:
    """Copy task at sequence ``length`` (copy of copy_len(length) random bytes), teacher-forced.

    -> {"exact_match", "token_accuracy"} or None when the model cannot encode ``length`` positions.
    """
    if not supports_length(model, length):
        return None
    rng = random.Random(seed * 7919 + length)
    rows = [copy_example(copy_len(length), length, rng) for _ in range(n_examples)]
    exact, correct, scored = 0, 0, 0
    for idx in _batches(n_examples, max(1, batch_tokens // length)):
        inputs = torch.tensor([rows[i][0] for i in idx], device=device)
        targets = torch.tensor([rows[i][1] for i in idx], device=device)
        mask = targets != IGNORE
        hit = (model(inputs).argmax(-1) == targets) & mask
        correct += hit.sum().item()
        scored += mask.sum().item()
        exact += (hit.sum(1) == mask.sum(1)).sum().item()
    return {"exact_match": exact / n_examples, "token_accuracy": correct / scored}


@register_task("copy")
class Copy(Task):
    """Copy a random byte string after a separator (exact match / token accuracy per length)."""

    metrics = ("exact_match", "token_accuracy")
    title = "Copy task (teacher-forced argmax; exact match / token accuracy)"

    def sampler(self, run, seq_len, batch_size, seed):
        return CopySampler(seq_len, batch_size, seed)

    def evaluate(self, ev) -> list[dict]:
        cfg = ev.cfg
        results = ev.map(lambda L: copy_eval(ev.model, L, n_examples=cfg.copy_examples, seed=ev.seed,
                                             device=ev.device), cfg.eval_lens, cost=lambda L: L)
        return [ev.row(L, metric, r and r[metric]) for L, r in zip(cfg.eval_lens, results) for metric in self.metrics]

    def report(self, results: list[dict]) -> str:
        lens, em = pivot(results, self.name, "exact_match")
        _, acc = pivot(results, self.name, "token_accuracy")
        if not em:
            return ""
        body = []
        for label, (first, cells) in em.items():
            acc_cells = acc.get(label, (None, {}))[1]
            body.append([label] + [_pair(cells.get(L), acc_cells.get(L)) for L in lens])
        return f"{self.title}:\n" + markdown(["model"] + [f"{L} (EM / token acc)" for L in lens], body)

    def plot(self, doc: dict, out: Path) -> list[str]:
        return accuracy_plot(doc["results"], self.name, [("exact_match", "Copy task: exact match"),
                                                         ("token_accuracy", "Copy task: token accuracy")],
                             out, "copy_accuracy.png")


def _pair(em: dict | None, acc: dict | None) -> str:
    if em is None or em["value"] is None:
        return fmt(em)
    return f"{fmt(em, percent=True)} / {fmt(acc, percent=True)}"
