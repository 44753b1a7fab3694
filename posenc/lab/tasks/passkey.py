"""The ``passkey`` task: filler text with "The pass key is NNNNN. Remember it." at a depth, then "What is the pass
key? The pass key is "; trained as episodes (loss on the key digits), scored by greedy decoding with the KV cache
over a length x depth grid (exact match)."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from posenc._internal.errors import ConfigError, DataError
from posenc.lab.context import supports_length
from posenc.lab.data import IGNORE, batch_generator
from posenc.lab.plots import accuracy_plot
from posenc.lab.tables import markdown, model_label, sort_key
from posenc._internal.settings import Setting
from posenc.lab.tasks.registry import HELD_OUT, Task, register_task

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = "What is the pass key? The pass key is "
KEY_DIGITS = 5


def _needle(key: str) -> str:
    return f"The pass key is {key}. Remember it. "


def passkey_example(length: int, depth: float, key: str) -> tuple[str, str]:
    """-> (prompt, answer) with len(prompt) + len(answer) == length; the key sentence starts at ``depth`` of
    the filler (0 = start, 1 = just before the question)."""
    needle = _needle(key)
    n_filler = length - len(needle) - len(QUESTION) - len(key)
    if n_filler < 0:
        raise DataError(f"passkey length {length}: too short; needs at least {length - n_filler} characters")
    filler = (FILLER * (n_filler // len(FILLER) + 1))[:n_filler]
    cut = round(depth * n_filler)
    return filler[:cut] + needle + filler[cut:] + QUESTION, key


def passkey_min_len() -> int:
    """Shortest passkey episode: the key sentence, the question and the answer with no filler."""
    return len(_needle("0" * KEY_DIGITS)) + len(QUESTION) + KEY_DIGITS


def encode(text: str) -> list[int]:
    """ASCII text -> byte tokens."""
    return list(text.encode("ascii"))


class PasskeySampler:
    """Passkey episodes of exactly ``seq_len`` tokens, random key and depth; the loss scores the key digits."""

    def __init__(self, seq_len: int, batch_size: int, seed: int):
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        passkey_example(seq_len, 0.0, "0" * KEY_DIGITS)  # raises if seq_len is too short

    def batch(self, step: int, rank: int = 0, world_size: int = 1):
        rng = random.Random(int(batch_generator(self.seed, step).initial_seed()))
        inputs, targets = [], []
        for _ in range(self.batch_size):
            key = "".join(rng.choice("0123456789") for _ in range(KEY_DIGITS))
            prompt, answer = passkey_example(self.seq_len, rng.random(), key)
            seq = encode(prompt + answer)
            inputs.append(seq[:-1] + [ord(" ")])  # pad to seq_len; the final position is not scored
            tgt = [IGNORE] * self.seq_len
            for i, t in enumerate(encode(answer)):  # position len(prompt)-1+i predicts answer[i]
                tgt[len(prompt) - 1 + i] = t
            targets.append(tgt)
        return torch.tensor(inputs[rank::world_size]), torch.tensor(targets[rank::world_size])


def episode_chars(encode, n_tokens: int) -> int | None:
    """Characters of the longest passkey episode whose text ``encode`` (the model's tokenizer; the lab's bytes)
    makes at most ``n_tokens`` tokens; None when no episode fits. For bytes it is ``n_tokens`` itself."""
    def count(chars):
        prompt, answer = passkey_example(chars, 0.5, "0" * KEY_DIGITS)
        return len(encode(prompt + answer))

    try:
        chars = n_tokens
        for _ in range(4):  # proportional steps, then walk down to the largest that fits
            chars = max(1, int(chars * n_tokens / count(chars)))
        while count(chars) > n_tokens:
            chars -= max(1, (count(chars) - n_tokens) * 2)
        return chars
    except ValueError:  # passkey_example: too short for the key sentence and question
        return None


@torch.no_grad()
def passkey_eval(model, length: int, depth: float, *, n_trials: int, seed: int, device="cpu") -> float | None:
    """Exact-match rate of greedy decoding (KV cache) of the pass key, in episodes of ``length`` characters with
    the key sentence at ``depth`` (0..1). None when the model cannot encode ``length`` positions."""
    if not supports_length(model, length):
        return None
    return key_rate(model, length, depth, n_trials=n_trials, seed=seed, device=device)


@torch.no_grad()
def key_rate(model, length: int, depth: float, *, n_trials: int, seed: int, device="cpu") -> float:
    """``passkey_eval`` without the length check: ``length`` counts the episode's characters, which the caller has
    fitted to the model's positions (``episode_chars``)."""
    rng = random.Random(seed * 104729 + length * 1009 + round(depth * 1000))
    keys = ["".join(rng.choice("0123456789") for _ in range(KEY_DIGITS)) for _ in range(n_trials)]
    prompts = torch.tensor([encode(passkey_example(length, depth, k)[0]) for k in keys], device=device)
    out = model.generate(prompts, KEY_DIGITS).cpu()
    got = ["".join(chr(c) for c in row.tolist()) for row in out]
    return sum(g == k for g, k in zip(got, keys)) / n_trials


@register_task("passkey")
class Passkey(Task):
    """Retrieve a 5-digit key hidden at a depth of filler text (greedy decoding, exact match)."""

    metrics = ("exact_match",)
    title = "Passkey retrieval (greedy decode, exact match)"
    settings = (
        Setting("passkey_depths", [0.0, 0.25, 0.5, 0.75, 1.0], "where the key sits in the prompt, fractions in [0, 1] "
                "(comma-separated)",
                kind="floats", min=0.0, max=1.0),
        Setting("passkey_trials", 20, "passkey episodes per length x depth cell", kind="int", min=1, max=2**20),
    )

    def check(self, cfg) -> None:
        if not cfg.options["passkey_depths"]:
            raise ConfigError("passkey_depths: expected at least one entry, got none")
        if getattr(cfg, "scores_only", False):
            return   # an evaluation of a given model: a length no episode fits is an n/a row (evaluate)
        shortest = min([cfg.train_len] + list(cfg.eval_lens))
        if shortest < passkey_min_len():
            raise ConfigError(f"train_len/eval_lens: passkey episodes need at least {passkey_min_len()} tokens, "
                              f"got {shortest}")

    def sampler(self, run, seq_len, batch_size, seed):
        return PasskeySampler(seq_len, batch_size, seed)

    def criterion(self, run, model, seed: int) -> float:
        """Retrieval rate at the training length over the depths, on held-out keys (another draw than the test's)."""
        cfg = run.cfg
        rates = [passkey_eval(model, cfg.train_len, depth, n_trials=cfg.options["passkey_trials"],
                              seed=HELD_OUT + seed,
                              device=run.device) for depth in cfg.options["passkey_depths"]]
        return sum(rates) / len(rates)

    def evaluate(self, ev) -> list[dict]:
        """Each length's episodes hold as many characters as ``ev.encode`` fits into it (the length itself for the
        lab's bytes; rows record it as ``chars``); a length no episode fits is an n/a row."""
        cfg = ev.cfg
        chars = {L: episode_chars(ev.encode, L) for L in cfg.eval_lens}
        grid = [(L, depth) for L in cfg.eval_lens for depth in cfg.options["passkey_depths"]]

        def rate(item):
            L, depth = item
            if chars[L] is None or not ev.supports(L):
                return None
            return key_rate(ev.model, chars[L], depth, n_trials=cfg.options["passkey_trials"], seed=ev.seed,
                            device=ev.device)

        rows = []
        for (L, depth), v in zip(grid, ev.map(rate, grid, cost=lambda item: item[0])):
            extra = ({"note": "n/a (too short for the passkey episode)"} if chars[L] is None
                     else {"chars": chars[L]})
            rows.append(ev.row(L, "exact_match", v, depth=depth, **extra))
        return rows

    def report(self, results: list[dict]) -> str:
        rows = [r for r in results if r["task"] == self.name]
        if not rows:
            return ""
        lens = sorted({r["eval_len"] for r in rows})
        depths = sorted({r["depth"] for r in rows})
        by_model: dict[str, dict] = {}
        for r in sorted(rows, key=sort_key):
            by_model.setdefault(model_label(r), {})[(r["eval_len"], r["depth"])] = r
        body = []
        for label, cells in by_model.items():
            row = [label]
            for L in lens:
                vals = [cells[(L, d)]["value"] for d in depths if (L, d) in cells]
                row.append(cells[(L, depths[0])].get("note", "n/a") if None in vals
                           else f"{100 * sum(vals) / len(vals):.0f}% (" + " ".join(f"{100 * v:.0f}" for v in vals) + ")")
            body.append(row)
        depth_txt = ", ".join(f"{d:g}" for d in depths)
        return f"{self.title}:\n" + markdown(["model"] + [f"{L}: mean (depths {depth_txt})" for L in lens], body)

    def plot(self, doc: dict, out: Path) -> list[str]:
        return accuracy_plot(doc["results"], self.name,
                             [("exact_match", "Passkey retrieval: exact match (mean over depths)")],
                             out, "passkey_accuracy.png")
