"""The ``copy`` task (the lesson's exercise 3): a separator, random bytes, the separator again, then the same bytes;
exact match and token accuracy per length, teacher forced.

Episode: [SEP, x_1..x_n, SEP, x_1..x_n, pad...]; the loss scores only the copied half. With a deterministic copy,
teacher-forced exact match equals greedy decoding's (greedy reproduces the teacher-forced prefix until its first
wrong token).

Why the leading separator: every copied byte, the first included, is then "the byte after the previous occurrence
of the current token" (an induction step, Olsson et al. 2022). Without it the first byte sits at absolute position
0 with nothing before it, and a relative scheme must locate the sequence start from n + 1 tokens away: T5 and
FIRE models copied 98% of the tokens yet almost no string exactly, all failing on that one byte (docs/lab.md).

Two options (lab settings ``copy_distinct`` and ``copy_min_fraction``):
- distinct bytes: x_1..x_n drawn without replacement, so every byte occurs once and "the byte after the one I just
  copied" names a single source position. With repeats (the default) a 63-byte string of bytes holds ~7 repeated
  bytes and an exact copy must also track where it is in the source; a 4-layer CPU-sized model then needs several
  times more steps to copy exactly (docs/lab.md, exercise 3). At most 255 bytes, i.e. lengths up to 512.
- the copy lengths trained on: n uniform in [ceil(f * n_max), n_max] instead of [1, n_max] (f = 0): long copies
  carry more scored tokens per batch, and the test copies are the longest, n_max = copy_len(length).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import torch

from posenc._internal.errors import ConfigError, DataError
from posenc.lab.context import supports_length
from posenc.lab.data import IGNORE, batch_generator
from posenc.lab.plots import accuracy_plot
from posenc.lab.tables import fmt, markdown, pivot
from posenc._internal.settings import Setting
from posenc.lab.tasks.registry import HELD_OUT, Task, register_task

COPY_SEP = 0  # never drawn as a content token (content bytes are 1..255)
CONTENT = range(1, 256)
MAX_DISTINCT_LEN = 2 * len(CONTENT) + 2  # longest sequence whose copy_len fits 255 distinct bytes
CONFIRM = 500_009  # seed offset of the criterion's second held-out set


def copy_example(n: int, length: int, rng: random.Random, *, distinct: bool = False) -> tuple[list[int], list[int]]:
    """One copy episode padded to ``length`` tokens -> (inputs, targets) with targets IGNORE outside the copy.
    ``distinct``: the n bytes are drawn without replacement (n <= 255)."""
    xs = rng.sample(CONTENT, n) if distinct else [rng.choice(CONTENT) for _ in range(n)]
    seq = [COPY_SEP] + xs + [COPY_SEP] + xs
    seq = seq + [COPY_SEP] * (length + 1 - len(seq))
    targets = [IGNORE] * length
    for i in range(n):  # input position n + 1 + i (the second SEP, then x_1..) predicts x_{i+1}
        targets[n + 1 + i] = xs[i]
    return seq[:length], targets


def copy_len(length: int) -> int:
    """Longest copy that fits a sequence of ``length`` tokens: 2n + 1 <= length (the inputs hold SEP, the n bytes,
    SEP and the first n - 1 copied bytes; the last copied byte is only a target)."""
    return (length - 1) // 2


def shortest_copy(length: int, min_fraction: float) -> int:
    """Shortest copy trained on at sequence ``length``: ceil(min_fraction * copy_len(length)), at least 1."""
    return max(1, math.ceil(min_fraction * copy_len(length) - 1e-9))


class CopySampler:
    """Copy episodes of length ``seq_len`` with n drawn uniformly from shortest_copy(seq_len, min_fraction) to
    copy_len(seq_len); ``distinct``: bytes without repeats."""

    def __init__(self, seq_len: int, batch_size: int, seed: int, *, distinct: bool = False,
                 min_fraction: float = 0.0):
        if seq_len < 3:
            raise DataError(f"seq_len: the copy task needs at least 3 tokens, got {seq_len}")
        if distinct and seq_len > MAX_DISTINCT_LEN:
            raise DataError(f"seq_len: copies of distinct bytes fit sequences up to {MAX_DISTINCT_LEN} tokens, "
                            f"got {seq_len}")
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.distinct, self.shortest = distinct, shortest_copy(seq_len, min_fraction)

    def batch(self, step: int, rank: int = 0, world_size: int = 1):
        rng = random.Random(int(batch_generator(self.seed, step).initial_seed()))
        rows = [copy_example(rng.randint(self.shortest, copy_len(self.seq_len)), self.seq_len, rng,
                             distinct=self.distinct)
                for _ in range(self.batch_size)][rank::world_size]
        return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])


def _batches(n: int, per_batch: int):
    for i in range(0, n, per_batch):
        yield range(i, min(n, i + per_batch))


# strings per batch of a check that may stop early (``copy_eval(need=...)``)
_NEED_BATCH = 32


@torch.no_grad()
def copy_eval(model, length: int, *, n_examples: int, seed: int, device="cpu", distinct: bool = False,
              batch_tokens: int = 16384, need: float | None = None, held_out: bool = False) -> dict | None:
    """Copy task at sequence ``length`` (copy of copy_len(length) random bytes; ``distinct``: without repeats),
    teacher-forced.

    ``held_out``: the strings of a training criterion (seed >= HELD_OUT), else the test strings of model ``seed``.
    ``need``: a pass/fail check against this exact-match fraction. Batches of 32 strings, stopping as soon as
    too many strings have failed for the fraction to reach ``need``; the pass/fail answer is the full count's,
    and an early stop returns exact_match = the most it could still have been (< need) and the token accuracy
    of the strings scored.
    -> {"exact_match", "token_accuracy"} or None when the model cannot encode ``length`` positions.
    """
    if not supports_length(model, length):
        return None
    # test strings: a string-seeded stream, disjoint from the integer-seeded training batches (seed * 7919 + length,
    # kept for the held-out criterion strings, made seed 0's test strings at length L those of training step L)
    rng = random.Random(seed * 7919 + length if held_out else f"copy-test:{seed}:{length}")
    rows = [copy_example(copy_len(length), length, rng, distinct=distinct) for _ in range(n_examples)]
    exact, correct, scored = 0, 0, 0
    per_batch = max(1, batch_tokens // length)
    if need is not None:
        per_batch = min(per_batch, _NEED_BATCH)
    for idx in _batches(n_examples, per_batch):
        if need is not None and (exact + n_examples - idx.start) < need * n_examples:
            return {"exact_match": (exact + n_examples - idx.start) / n_examples, "token_accuracy": correct / scored}
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
    settings = (
        Setting("copy_examples", 64, "copy-task test sequences per length", kind="int", min=1, max=2**20),
        Setting("copy_distinct", False, f"copy strings of distinct bytes, no repeats (yes/no; lengths up to "
                f"{MAX_DISTINCT_LEN})", kind="bool"),
        Setting("copy_min_fraction", 0.0, "shortest copy trained on, as a fraction of the longest that fits "
                "--train-len (0: from one byte)", kind="float", min=0.0, max=1.0),
    )

    def check(self, cfg) -> None:
        longest = max([cfg.train_len] + list(cfg.eval_lens))
        if cfg.options["copy_distinct"] and longest > MAX_DISTINCT_LEN:
            raise ConfigError(f"train_len/eval_lens: copies of distinct bytes (copy_distinct) fit sequences up to "
                              f"{MAX_DISTINCT_LEN} tokens (255 distinct bytes), got {longest}")

    def sampler(self, run, seq_len, batch_size, seed):
        cfg = run.cfg
        return CopySampler(seq_len, batch_size, seed, distinct=cfg.options["copy_distinct"],
                           min_fraction=cfg.options["copy_min_fraction"])

    def criterion(self, run, model, seed: int) -> float:
        """Exact match at the training length on held-out strings (other draws than the test's): the lower of
        two independent sets of copy_examples strings, the second scored only when the first reaches
        ``train_until``. One set alone let a model stop on a lucky check: a model that copies 96% of strings
        scores >= 98% on some 128-string check about one time in ten, and one such model then tested at 94.5%."""
        cfg = run.cfg

        def exact(offset: int) -> float:  # a failing set stops at the batch that decides it (copy_eval's need)
            return copy_eval(model, cfg.train_len, n_examples=cfg.options["copy_examples"],
                             seed=HELD_OUT + offset + seed,
                             device=run.device, distinct=cfg.options["copy_distinct"], need=cfg.train_until,
                             held_out=True)["exact_match"]

        first = exact(0)
        if cfg.train_until is None or first < cfg.train_until:
            return first
        return min(first, exact(CONFIRM))

    def evaluate(self, ev) -> list[dict]:
        cfg = ev.cfg
        results = ev.map(lambda L: copy_eval(ev.model, L, n_examples=cfg.options["copy_examples"], seed=ev.seed,
                                             device=ev.device, distinct=cfg.options["copy_distinct"]),
                         cfg.eval_lens, cost=lambda L: L)
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
