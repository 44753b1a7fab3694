"""RULER's aggregation tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?", github.com/NVIDIA/RULER, scripts/data/synthetic/common_words_extraction.py and freq_words_extraction.py),
restated.

    cwe  common-words extraction: a numbered list of words in which 10 words repeat more often than the rest; the
         answer is those 10. Below 4096 tokens each common word appears 6 times and every other once, after one
         worked example of 20 words (3 and 1 repeats); from 4096 on, 30 and 3 times, after an example of 40 words
         (10 and 3). Words: posenc's generated list (RULER draws from wonderwords). Answer budget: 120 tokens.
    fwe  frequent-words extraction: coded 6-letter words drawn from a Zipf law (alpha 2) over a vocabulary of
         (length - budget) / 50 words, the most frequent one replaced by "..." (noise); the answer is the next
         three. Answer budget: 50 tokens.

Score: string_match_all over the 10 (cwe) or 3 (fwe) words.
"""

from __future__ import annotations

import math
import random
import string

from posenc.lab.tasks.registry import register_task
from posenc.lab.tasks.ruler.common import RulerTask, fit, sample_seed, word_list

CWE_TEMPLATE = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
                "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above "
                "list? Answer: The top 10 words that appear most often in the list are:")
FWE_TEMPLATE = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
                "the dots '....'. What are the three most frequently appeared words in the above coded text? Answer: "
                "According to the coded text above, the three most frequently appeared words are:")
COMMON = 10                 # common words asked (RULER's num_cw)
LONG = 4096                 # from this length on RULER repeats common words 30 times, others 3 times
ZETA_2 = math.pi ** 2 / 6   # Riemann zeta(2): the normaliser of the Zipf law with alpha 2


def numbered(words) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def word_example(rng: random.Random, n_other: int, common_repeats: int, other_repeats: int):
    """-> (numbered list, the common words): ``COMMON`` words repeated ``common_repeats`` times and ``n_other``
    others ``other_repeats`` times, shuffled."""
    pool = word_list()
    words = rng.sample(pool, min(len(pool), COMMON + n_other))
    common, other = words[:COMMON], words[COMMON:]
    items = common * common_repeats + other * other_repeats
    rng.shuffle(items)
    return numbered(items), common


@register_task("cwe")
class CommonWords(RulerTask):
    """RULER's cwe: the 10 most common words of a numbered list, after one worked example."""

    family = "common_words_extraction"
    budget = 120

    def build(self, seed, n, source):
        # source: the target length (RULER's repeats depend on it); n: words that are not common
        rng = random.Random(seed)
        long = (source or 0) >= LONG
        ex_list, ex_answer = word_example(rng, 30 if long else 10, 10 if long else 3, 3 if long else 1)
        main_list, answer = word_example(rng, n, 30 if long else 6, 3 if long else 1)
        shot = CWE_TEMPLATE.format(context=ex_list) + " " + numbered(ex_answer)
        return shot + "\n" + CWE_TEMPLATE.format(context=main_list), answer

    def answer_text(self, answers) -> str:
        return " " + numbered(answers)

    def sample(self, encode, length, seed, index, source=None):
        return fit(self.build, encode, length, self.budget, sample_seed(self.name, length, seed, index), length)


def coded_vocabulary(rng: random.Random, size: int) -> list[str]:
    """``size`` distinct random 6-letter lowercase words in random order, the first replaced by "..." (RULER's noise
    word: the most frequent one)."""
    vocab: set[str] = set()
    while len(vocab) < size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=6)))
    out = sorted(vocab)
    rng.shuffle(out)
    out[0] = "..."
    return out


@register_task("fwe")
class FrequentWords(RulerTask):
    """RULER's fwe: the three most frequent coded words of a Zipf-distributed text (the top one is noise)."""

    family = "freq_words_extraction"
    budget = 50

    def build(self, seed, n, source):
        # source: the target length (the vocabulary's size follows it); n: words drawn (before rounding down)
        rng = random.Random(seed)
        vocab = coded_vocabulary(rng, max(4, ((source or 0) - self.budget) // 50))
        words = [w for k, w in enumerate(vocab, 1) for _ in range(int(n * k ** -2.0 / ZETA_2))]
        rng.shuffle(words)
        return FWE_TEMPLATE.format(context=" ".join(words)), vocab[1:4]

    def answer_text(self, answers) -> str:
        return " " + " ".join(answers)

    def sample(self, encode, length, seed, index, source=None):
        return fit(self.build, encode, length, self.budget, sample_seed(self.name, length, seed, index), length)
