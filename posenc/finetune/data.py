"""The text a fine-tune reads, as the model's tokens: training windows with PoSE position ids, and the held-out
windows scored at the target length.

Training: the lab corpus's training split (``--data``: a file or folder, "prose" (``data_source``), default the CPython
standard library; posenc.lab.data),
tokenized as ``posenc eval`` tokenizes (posenc.hf.eval.adapter.token_stream: a byte tokenizer reads the bytes
themselves). Batch ``step`` is a pure function of (seed, step) (posenc.lab.data.batch_generator): its windows are
contiguous slices of the text at random starts, and their position ids are posenc.pose's, drawn from the same
generator, so a resumed run reads exactly what an uninterrupted one reads.
Validation: the corpus's validation split, its first ``eval_windows`` windows of ``target_length`` tokens, at
plain positions 0 .. L - 1 (as the model runs at inference).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from posenc._internal.errors import ConfigError
from posenc.pose import pose_position_ids

# ``--data prose``: the SmolLM2 study's English prose text (the Python 3.11 documentation's reStructuredText sources,
# from Debian's python3.11-doc), which ``python scripts/smollm2_study.py prose`` unpacks into a folder; nothing is
# downloaded here. The folder is PROSE_ENV's value, else PROSE_DEFAULT: the study script's own variable and default
PROSE = "prose"
PROSE_ENV = "SMOLLM2_PROSE"
PROSE_DEFAULT = "/tmp/python3.11-doc-sources"


def data_source(data: str | None) -> str | None:
    """``--data`` as posenc.lab.data.load_corpus reads it: None (the CPython standard library) and a path as given,
    "prose" as its folder (PROSE_ENV, else PROSE_DEFAULT); ConfigError naming data when that folder is absent. A
    folder named prose in the current folder is ``./prose``."""
    if data != PROSE:
        return data
    folder = os.environ.get(PROSE_ENV) or PROSE_DEFAULT
    if not Path(folder).is_dir():
        raise ConfigError(f"data: prose is the English prose text of the SmolLM2 study, read from {folder} "
                          f"({PROSE_ENV}, default {PROSE_DEFAULT}), which is not a folder; get it with `python "
                          f"scripts/smollm2_study.py prose` (with the same {PROSE_ENV}), or give a path")
    return folder


class PoseSampler:
    """PoSE training batches from one token stream.

    ``batch(step, rank=0, world_size=1)`` -> (inputs LongTensor [B, 2, W]: row 0 the token ids, row 1 their PoSE
    position ids in [0, target_length), strictly increasing, first 0; targets LongTensor [B, W]: the next tokens).
    B = batch_size (this rank's rows ``rank::world_size``), W = the window (PoSE's L_c).
    """

    def __init__(self, tokens: torch.Tensor, window: int, target_length: int, *, chunks: int = 2,
                 batch_size: int = 1, seed: int = 0):
        self.tokens = tokens.long()        # [N]
        self.window, self.target_length, self.chunks = window, target_length, chunks
        self.batch_size, self.seed = batch_size, seed

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        from posenc.lab.data import batch_generator

        g = batch_generator(self.seed, step)
        w = self.window
        starts = torch.randint(0, len(self.tokens) - w, (self.batch_size,), generator=g)       # [B]
        rows = self.tokens[starts[:, None] + torch.arange(w + 1)]                               # [B, W + 1]
        positions = pose_position_ids(self.batch_size, w, self.target_length, chunks=self.chunks, generator=g)
        inputs = torch.stack([rows[:, :-1], positions], dim=1)                                  # [B, 2, W]
        return inputs[rank::world_size], rows[rank::world_size, 1:]


def training_tokens(tokenizer, data: str | None, needed: int, window: int) -> tuple[torch.Tensor, dict]:
    """The training split as the model's tokens (at least ``needed`` when the text has them: more is not read)
    -> (LongTensor [N], the corpus's provenance). ConfigError naming data when it holds less than one window."""
    from posenc.hf.eval.adapter import token_stream
    from posenc.hf.lab_bridge import training_bytes

    text, meta = training_bytes(data)
    tokens, _ = token_stream(tokenizer, text, needed)
    if len(tokens) < window + 1:
        raise ConfigError(f"data: the training text ({meta.get('source')}) holds {len(tokens)} tokens, fewer than "
                          f"one chunk of {window} tokens (--chunk-length, capped at the trained length) plus the "
                          "next-token target; give a longer text")
    return tokens.long(), meta


def validation_windows(tokenizer, data: str | None, target_length: int, windows: int) -> torch.Tensor:
    """The held-out windows scored at the target length: LongTensor [n, target_length + 1] (inputs and their next
    tokens), n = ``windows`` or as many as the validation split holds; ConfigError naming data when it holds none."""
    from posenc.hf.eval.adapter import token_stream
    from posenc.hf.lab_bridge import scored_text

    text, meta, _ = scored_text(data, "validation")
    span = target_length + 1
    tokens, _ = token_stream(tokenizer, text, windows * span)
    n = min(windows, len(tokens) // span)
    if n < 1:
        raise ConfigError(f"data: the held-out text ({meta.get('source')}, its validation split) holds "
                          f"{len(tokens)} tokens, fewer than one window of --target-length {target_length} plus "
                          "the next-token target; give a longer text")
    return tokens[:n * span].long().reshape(n, span)
