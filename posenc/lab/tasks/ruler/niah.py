"""RULER's needle-in-a-haystack tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?", github.com/NVIDIA/RULER, scripts/data/synthetic/niah.py and scripts/synthetic.yaml), restated.

A needle is "One of the special magic {numbers} for {key} is: {value}."; the prompt asks for the value(s) of one or
more keys and ends with the answer prefix, so the model continues with the values. Haystacks: "noise" (one sentence
group repeated, a line each), "essay" (RULER's Paul Graham essays; here the text posenc has: the lab's corpus,
``posenc eval --data``), "needle" (distracting needles with other keys). Keys and values: 7-digit numbers, UUIDs
or "word-word" pairs (posenc's generated word list standing in for wonderwords' adjectives and nouns).

    task              haystack  key    value    keys  values per key  keys asked
    niah_single_1     noise     word   number   1     1               1
    niah_single_2     essay     word   number   1     1               1
    niah_single_3     essay     word   uuid     1     1               1
    niah_multikey_1   essay     word   number   4     1               1
    niah_multikey_2   needle    word   number   1     1               1
    niah_multikey_3   needle    uuid   uuid     1     1               1
    niah_multivalue   essay     word   number   1     4               1
    niah_multiquery   essay     word   number   4     1               4

Answer budget: 128 tokens (RULER's). Score: string_match_all over the asked values.
"""

from __future__ import annotations

import random
import uuid

from posenc.lab.tasks.registry import register_task
from posenc.lab.tasks.ruler.common import NOISE, RulerTask, insert_at_depths, insert_lines, word_list

NEEDLE = "One of the special magic {kind} for {key} is: {value}."
# the task's template with its answer prefix; RULER words it in the singular when one value is asked
PLURAL = ("Some special magic {kind} are hidden within the following text. Make sure to memorize it. I will quiz "
          "you about the {kind} afterwards.\n{context}\nWhat are all the special magic {kind} for {query} "
          "mentioned in the provided text? The special magic {kind} for {query} mentioned in the provided text are")
SINGULAR = ("A special magic {kind} is hidden within the following text. Make sure to memorize it. I will quiz you "
            "about the {kind} afterwards.\n{context}\nWhat is the special magic {kind} for {query} mentioned in the "
            "provided text? The special magic {kind} for {query} mentioned in the provided text is")


def random_item(kind: str, rng: random.Random) -> str:
    """A random key or value: a 7-digit number, a UUID (version 4) or a "word-word" pair."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    words = word_list()
    return f"{rng.choice(words)}-{rng.choice(words)}"


def query_text(queries: list[str]) -> str:
    """"a", or "a, b, and c" (RULER's list of the keys asked)."""
    return queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]


class Niah(RulerTask):
    """One NIAH configuration (class attributes: haystack, key and value kinds, numbers of keys, values, queries)."""

    family = "niah"
    budget = 128
    haystack = "essay"
    key_kind, value_kind = "words", "numbers"
    n_keys, n_values, n_queries = 1, 1, 1

    @property
    def needs_corpus(self) -> bool:
        return self.haystack == "essay"

    def build(self, seed, n, source):
        rng = random.Random(seed)
        keys, values, needles = [], [], []
        for _ in range(max(self.n_keys, self.n_queries)):
            keys.append(random_item(self.key_kind, rng))
            values.append([random_item(self.value_kind, rng) for _ in range(self.n_values)])
            needles += [NEEDLE.format(kind=self.value_kind, key=keys[-1], value=v) for v in values[-1]]
        rng.shuffle(needles)
        if self.haystack == "essay":
            context = insert_at_depths(source or [], n, needles, rng)
        else:
            lines = ([NOISE] * n if self.haystack == "noise" else
                     [NEEDLE.format(kind=self.value_kind, key=random_item(self.key_kind, rng),
                                    value=random_item(self.value_kind, rng)) for _ in range(n)])
            context = "\n".join(insert_lines(lines, needles, rng))
        asked = rng.sample(range(len(keys)), self.n_queries)
        answers = [v for i in asked for v in values[i]]
        single = self.n_queries * self.n_values == 1
        template, kind = (SINGULAR, self.value_kind[:-1]) if single else (PLURAL, self.value_kind)
        return template.format(kind=kind, context=context, query=query_text([keys[i] for i in asked])), answers


def _niah(name: str, **config):
    cls = type(name.title().replace("_", ""), (Niah,), {"__doc__": f"RULER's {name}: {config}.", **config})
    cls.__module__ = __name__
    return register_task(name)(cls)


NiahSingle1 = _niah("niah_single_1", haystack="noise")
NiahSingle2 = _niah("niah_single_2", haystack="essay")
NiahSingle3 = _niah("niah_single_3", haystack="essay", value_kind="uuids")
NiahMultikey1 = _niah("niah_multikey_1", haystack="essay", n_keys=4)
NiahMultikey2 = _niah("niah_multikey_2", haystack="needle")
NiahMultikey3 = _niah("niah_multikey_3", haystack="needle", key_kind="uuids", value_kind="uuids")
NiahMultivalue = _niah("niah_multivalue", haystack="essay", n_values=4)
NiahMultiquery = _niah("niah_multiquery", haystack="essay", n_queries=4)
