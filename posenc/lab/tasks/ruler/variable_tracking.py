"""RULER's variable tracking, ``vt`` (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?", github.com/NVIDIA/RULER, scripts/data/synthetic/variable_tracking.py), restated.

A chain "VAR ABCDE = 12345", "VAR FGHIJ = VAR ABCDE ", ... (1 chain of 4 hops: 5 variables of 5 capital letters)
is spread over lines of RULER's noise haystack; the question asks for every variable assigned the value, and the
answer prefix says how many there are. One worked example comes first (RULER's in-context example: a chain of
3-letter names with its answer, the names and the value then redrawn), fitted to 500 tokens as RULER fits it, or to
a quarter of the length when that is shorter (the lab's lengths of a few hundred tokens). Answer budget: 30 tokens.
Score: string_match_all over the 5 variables.
"""

from __future__ import annotations

import random
import re
import string

from posenc.lab.tasks.registry import register_task
from posenc.lab.tasks.ruler.common import NOISE, RulerTask, insert_lines

TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
            "Question: Find all variables that are assigned the value {value} in the text above. Answer: According "
            "to the chain(s) of variable assignment in the text above, {count} variables are assigned the value "
            "{value}, they are: ")
EXAMPLE_TOKENS = 500      # RULER fits its in-context example to 500 tokens


def chains(rng: random.Random, n_chains: int, hops: int, letters: int, value: str | None = None):
    """-> (variables per chain, assignment lines per chain): distinct names of ``letters`` capitals, each chain's
    first variable set to a 5-digit value (``value`` when given), each next one to the previous variable."""
    names: list[str] = []
    while len(names) < n_chains * (hops + 1):
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in names and name != "VAR":
            names.append(name)
    out_vars, out_lines = [], []
    for c in range(n_chains):
        names_c = names[c * (hops + 1):(c + 1) * (hops + 1)]
        lines = [f"VAR {names_c[0]} = {value or rng.randint(10000, 99999)}"]
        lines += [f"VAR {names_c[j + 1]} = VAR {names_c[j]} " for j in range(hops)]
        out_vars.append(names_c)
        out_lines.append(lines)
    return out_vars, out_lines


def vt_prompt(rng: random.Random, n: int, hops: int, letters: int, value: str | None = None):
    """-> (prompt, variables of the first chain, its value): one chain over ``n`` noise lines."""
    names, lines = chains(rng, 1, hops, letters, value)
    context = "\n".join(insert_lines([NOISE] * n, lines[0], rng))
    first = lines[0][0].split("=")[-1].strip()
    return TEMPLATE.format(context=context, value=first, count=hops + 1), names[0], first


@register_task("vt")
class VariableTracking(RulerTask):
    """RULER's vt: one chain of 4 hops in noise lines, after one worked example."""

    family = "variable_tracking"
    budget = 30
    hops = 4

    def example(self, seed: int, n_example: int) -> str:
        """The worked example with ``n_example`` noise lines: 3-letter names and value 12345 answered, then the
        names and value redrawn (RULER's randomize_icl)."""
        rng = random.Random(seed)
        prompt, names, _ = vt_prompt(rng, n_example, self.hops, 3, value="12345")
        text = prompt + " " + " ".join(names) + "\n"
        new = {name: "".join(rng.choices(string.ascii_uppercase, k=3)) for name in names}
        text = re.sub(r"\b[A-Z]{3}\b", lambda m: new.get(m.group(), m.group()), text)
        return text.replace("12345", str(rng.randint(10000, 99999)))

    def build(self, seed, n, source):
        # source: the example's noise lines (fitted by ``sample``); the main chain over n lines after it
        prompt, names, _ = vt_prompt(random.Random(seed), n, self.hops, 5)
        return self.example(seed + 1, source or 0) + "\n" + prompt, names

    def answer_text(self, answers) -> str:
        return " ".join(answers)

    def sample(self, encode, length, seed, index, source=None):
        from posenc.lab.tasks.ruler.common import fit, sample_seed

        s = sample_seed(self.name, length, seed, index)
        budget = min(EXAMPLE_TOKENS, length // 4)
        lines = 0
        while lines < 4 * budget and len(encode(self.example(s + 1, lines + 5))) <= budget:
            lines += 5                     # RULER grows the example 5 noise lines at a time
        return fit(self.build, encode, length, self.budget, s, lines)

    def min_length(self) -> int:
        from posenc.lab.context import byte_encode

        prompt, _ = self.build(0, 0, 0)
        return len(byte_encode(prompt)) + self.budget
