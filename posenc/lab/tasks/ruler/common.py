"""What RULER's synthetic tasks share (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?", github.com/NVIDIA/RULER, scripts/data/synthetic/): the seeding of a sample, the fitting of a
prompt to a length in the model's own tokens, the haystacks, the word list, and ``RulerTask`` (the task interface:
evaluation by greedy decoding with the KV cache, training episodes for the lab, the report and heat map).

A family module (niah.py, variable_tracking.py, words.py) subclasses ``RulerTask`` with ``build(seed, n, source)``:
the (prompt, answers) of one sample whose haystack has ``n`` units (sentences, lines, words), a pure function of
its arguments. ``fit`` finds the largest ``n`` whose prompt plus the task's answer budget fits the length, as RULER's
generators do with a binary search over the haystack size, counting tokens with the model's tokenizer (``ev.encode``).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from posenc._internal.errors import ConfigError
from posenc._internal.settings import Setting
from posenc.lab.context import byte_decode, byte_encode
from posenc.lab.data import IGNORE
from posenc.lab.tasks.registry import Task
from posenc.lab.tasks.ruler.report import ruler_heatmap, ruler_report, score_rows
from posenc.lab.tasks.ruler.scoring import clean_prediction, string_match_all

# RULER's "noise" haystack: one sentence group repeated (the passkey task's filler)
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
# RULER's 40 insertion depths, percent of the haystack: round(linspace(0, 100, 40))
DEPTHS = tuple(round(100 * i / 39) for i in range(40))
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sample_seed(*parts) -> int:
    """A seed that is a pure function of ``parts`` (task, length, seed, index): sha256, not Python's salted hash."""
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


def _syllable_words(count: int, seed: int) -> list[str]:
    """``count`` distinct pronounceable nonsense words (2 or 3 consonant-vowel syllables, a final consonant half the
    time), deterministic in ``seed``."""
    rng = random.Random(seed)
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    words: dict[str, None] = {}
    while len(words) < count:
        word = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.choice((2, 3))))
        words[word + (rng.choice(consonants) if rng.random() < 0.5 else "")] = None
    return list(words)


_WORDS: list[str] = []


def word_list() -> list[str]:
    """posenc's stand-in for RULER's wonderwords lists (nouns, adjectives, verbs): 20,000 nonsense words generated
    here, so nothing is downloaded or shipped; the same list on every machine."""
    if not _WORDS:
        _WORDS.extend(_syllable_words(20_000, seed=2024))
    return _WORDS


def corpus_words(tokens, decode, n_tokens: int) -> list[str]:
    """The first ``n_tokens`` of a token stream as text, split into words at whitespace (RULER splits its essays
    so): the "essay" haystack, which posenc takes from the text it has (the lab's corpus, ``posenc eval --data``)."""
    text = decode([int(t) for t in tokens[:n_tokens]])
    return [w for w in re.sub(r"\s+", " ", text).split(" ") if w]


def insert_at_depths(words: list[str], n: int, needles: list[str], rng: random.Random) -> str:
    """The first ``n`` haystack words (repeated when there are fewer) with ``needles`` inserted in order at depths
    drawn from RULER's 40 (without replacement), at sentence ends as RULER does; at word boundaries when the
    text has fewer than 40 sentences (source code has few)."""
    text = " ".join((words * (n // max(1, len(words)) + 1))[:n]) if words else ""
    units = _SENTENCE_END.split(text.strip()) if text.strip() else []
    if len(units) < len(DEPTHS):
        units = text.split()
    cuts = sorted(int(len(units) * d / 100) for d in rng.sample(DEPTHS, len(needles)))
    parts, last = [], 0
    for cut, needle in zip(cuts, needles):
        parts += units[last:cut] + [needle]
        last = cut
    return " ".join(parts + units[last:])


def insert_lines(lines: list[str], needles: list[str], rng: random.Random) -> list[str]:
    """``lines`` with ``needles`` inserted at random places (distinct gaps while there are enough), in order."""
    gaps = range(len(lines) + 1)
    at = sorted(rng.sample(gaps, len(needles)) if len(needles) <= len(gaps) else rng.choices(gaps, k=len(needles)))
    out, last = [], 0
    for gap, needle in zip(at, needles):
        out += lines[last:gap] + [needle]
        last = gap
    return out + lines[last:]


@dataclass(frozen=True)
class Sample:
    """One prompt (its answer prefix included: the model continues it) and the strings its answer must contain."""

    prompt: str
    answers: tuple[str, ...]
    haystack: int           # units of haystack the fitting chose
    tokens: int             # the prompt's tokens in the model's tokenizer


def fit(build, encode, length: int, budget: int, seed: int, source=None) -> Sample | None:
    """The sample of ``build(seed, n, source)`` with the most haystack units ``n`` whose prompt, in ``encode``'s
    tokens, plus ``budget`` answer tokens fits ``length`` (RULER's rule); None when even no haystack does not."""
    def tokens(n):
        prompt, _ = build(seed, n, source)
        return len(encode(prompt))

    room = length - budget
    if room <= 0 or tokens(0) > room:
        return None
    probe = 16
    per_unit = max(1e-3, (tokens(probe) - tokens(0)) / probe)
    lo, hi = 0, max(probe, int(3 * room / per_unit) + 16)
    while lo < hi:                      # the largest n that fits: tokens(lo) <= room throughout
        mid = (lo + hi + 1) // 2
        if tokens(mid) <= room:
            lo = mid
        else:
            hi = mid - 1
    prompt, answers = build(seed, lo, source)
    return Sample(prompt, tuple(answers), lo, len(encode(prompt)))


class RulerTask(Task):
    """One RULER task: ``build`` (the family's generator), ``budget`` (RULER's tokens_to_generate), ``answer_text``
    (the ideal continuation, the lab's training target). Scored by greedy decoding with the KV cache of ``budget``
    tokens and RULER's string_match_all; rows carry the Wilson 95% interval over the samples."""

    family = ""
    budget = 128
    metrics = ("string_match_all",)
    settings = (
        Setting("ruler_samples", 10, "RULER tasks: samples per task and length (each reproducible from the task, "
                "length, seed and index)", kind="int", min=1, max=100_000),
        Setting("ruler_threshold", 0.856, "RULER tasks: the score a length must reach to count in the effective "
                "length (RULER's: Llama-2-7B's 85.6% at 4k)", kind="float", min=0.0, max=1.0),
    )

    def build(self, seed: int, n: int, source) -> tuple[str, list[str]]:
        raise NotImplementedError

    def answer_text(self, answers) -> str:
        """The continuation that answers ``answers`` (what the lab's models are trained to write)."""
        return " " + ", ".join(answers) + "."

    # the haystack source: corpus words for the essay tasks, None for the others
    def source(self, corpus_tokens, decode, length: int):
        if not self.needs_corpus:
            return None
        return corpus_words(corpus_tokens, decode, 2 * length + 4096)

    def sample(self, encode, length: int, seed: int, index: int, source=None) -> Sample | None:
        """Sample ``index`` of this task at ``length`` tokens of ``encode`` (None: the template does not fit)."""
        return fit(self.build, encode, length, self.budget, sample_seed(self.name, length, seed, index), source)

    def min_length(self) -> int:
        """Bytes of the shortest episode: the template, needles and answer budget with no haystack."""
        prompt, _ = self.build(sample_seed(self.name, 0), 0, [] if self.needs_corpus else None)
        return len(byte_encode(prompt)) + self.budget

    def check(self, cfg) -> None:
        if getattr(cfg, "scores_only", False):
            return      # an evaluation of a given model: a length the template does not fit is an n/a row
        if cfg.train_len < self.min_length():
            raise ConfigError(f"train_len: task {self.name} trains on episodes of at least {self.min_length()} "
                              f"tokens (its template and answer budget of {self.budget}), got {cfg.train_len}")

    def text_needed(self, cfg):
        return [(L, L, None) for L in cfg.eval_lens] if self.needs_corpus else []

    def sampler(self, run, seq_len, batch_size, seed):
        source = self.source(run.corpus.train, byte_decode, seq_len) if self.needs_corpus else None
        return EpisodeSampler(self, seq_len, batch_size, seed, source)

    def evaluate(self, ev) -> list[dict]:
        cfg = ev.cfg
        n = cfg.options["ruler_samples"]
        sources = {L: self.source(ev.run.corpus.val, ev.decode, L) if self.needs_corpus else None
                   for L in cfg.eval_lens}

        def one(item):
            L, index = item
            if not ev.supports(L):
                return None
            s = self.sample(ev.encode, L, ev.seed, index, sources[L])
            if s is None:
                return "too short"
            got = clean_prediction(ev.decode(ev.generate(ev.encode(s.prompt), self.budget)))
            return {"score": string_match_all(got, s.answers), "tokens": s.tokens, "null": not got}

        items = [(L, i) for L in cfg.eval_lens for i in range(n)]
        done = ev.map(one, items, cost=lambda item: item[0])
        return score_rows(ev, cfg.eval_lens, [[d for (L2, _), d in zip(items, done) if L2 == L]
                                              for L in cfg.eval_lens])

    def report(self, results: list[dict]) -> str:
        return ruler_report(self, results)

    def plot(self, doc: dict, out: Path) -> list[str]:
        return ruler_heatmap(self, doc, out)


class EpisodeSampler:
    """The lab's training episodes of a RULER task: a sample fitted to ``seq_len`` bytes, its ideal answer after
    the prompt (the loss scores the answer's bytes), padded with spaces; a pure function of (seed, step)."""

    def __init__(self, task: RulerTask, seq_len: int, batch_size: int, seed: int, source):
        self.task, self.seq_len, self.batch_size, self.seed, self.source = task, seq_len, batch_size, seed, source

    def batch(self, step: int, rank: int = 0, world_size: int = 1):
        inputs, targets = [], []
        for b in range(self.batch_size):
            s = self.task.sample(byte_encode, self.seq_len, f"train-{self.seed}", step * self.batch_size + b,
                                 self.source)
            prompt = byte_encode(s.prompt)
            answer = byte_encode(self.task.answer_text(s.answers))[:self.seq_len - len(prompt)]
            seq = (prompt + answer + [ord(" ")] * self.seq_len)[:self.seq_len + 1]
            tgt = [IGNORE] * self.seq_len
            for i, t in enumerate(answer):     # position len(prompt)-1+i predicts answer[i]
                tgt[len(prompt) - 1 + i] = t
            inputs.append(seq[:self.seq_len])
            targets.append(tgt)
        return torch.tensor(inputs[rank::world_size]), torch.tensor(targets[rank::world_size])
