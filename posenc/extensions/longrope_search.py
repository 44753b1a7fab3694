"""The ``longrope-search`` extension method: LongRoPE's evolutionary search (Ding et al. 2024, arXiv:2402.13753)
run on the trained model itself, through the registry's ``fit`` hook.

The lab calls ``fit(spec, ctx)`` once per trained RoPE model before evaluating. The search scores candidates by
perplexity at the target length on a *search* split and picks the winner on a separate *held-out* split; both are
cut from the validation text after the part the lab reports on (``search_splits``), so the reported perplexities
are on text the search never saw. The search state is checkpointed under the run folder (``--resume`` continues
it). ``posenc search`` (posenc/tools/search.py) runs the same search on a saved lab model.

The written config is transformers' ``longrope`` dict (``posenc.longrope_scaling``): long factors as searched,
short factors 1 (the original context unchanged), factor s = target / L0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from posenc._internal.validate import check_int
from posenc._internal.errors import ConfigError, DataError
from posenc._internal.settings import Setting
from posenc.extensions.registry import ExtensionSpec, FitContext, register_method
from posenc.search.fitness import perplexity_fitness
from posenc._internal.fingerprint import state_fingerprint, tensor_fingerprint
from posenc.search.longrope import LongRopeResult, LongRopeSettings, longrope_search
from posenc.search.longrope_space import longrope_scaling


@dataclass(frozen=True)
class SearchBudget:
    """The lab's search knobs: candidates per generation, generations, windows of ``target`` tokens per split.

    The paper's settings are population 64 and 40 generations (``LongRopeSettings``' defaults); the lab's
    defaults (32, 10) are sized for a CPU: 32 + 10 x 16 = 192 fitness evaluations.
    """

    population: int = 32
    generations: int = 10
    windows: int = 4

    def __post_init__(self):
        check_int(self.population, "search_population", min=4, error=ConfigError)
        check_int(self.generations, "search_generations", min=0, error=ConfigError)
        check_int(self.windows, "search_windows", min=1, error=ConfigError)

    def settings(self, seed: int) -> LongRopeSettings:
        return LongRopeSettings(population=self.population, parents=max(2, self.population // 2),
                                generations=self.generations, seed=seed)


def search_splits(text: torch.Tensor, *, reserved: int, length: int, windows: int
                  ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(search tokens, held-out tokens, where they are) from ``text`` after its first ``reserved`` tokens.

    Each split holds ``windows`` windows of ``length`` tokens plus the one token the last window predicts; the
    two do not overlap each other or text[:reserved] (the lab's reported evaluation text). DataError if the text
    is too short.
    """
    need = windows * length + 1
    end = reserved + 2 * need
    if len(text) < end:
        raise DataError(f"longrope-search needs {end} validation tokens ({reserved} reported on, then 2 splits of "
                        f"{windows} x {length} + 1), the text has {len(text)}: lower search_windows or eval_tokens "
                        "(the text reserved for the reported evaluation)")
    a, b = reserved, reserved + need
    where = {"search": [a, a + need], "heldout": [b, b + need], "reserved": reserved}
    return text[a:a + need], text[b:b + need], where


def search_lab_model(model, text: torch.Tensor, spec: ExtensionSpec, *, reserved: int, budget: SearchBudget,
                 seed: int, checkpoint: str | Path | None = None, resume: bool = True, progress: bool = True,
                 device=None, problem: dict | None = None) -> tuple[LongRopeResult, dict]:
    """Run LongRoPE's search on ``model`` (a TinyLM with an extendable RoPE scheme, any device) over ``text``
    (1-D token stream) for ``spec`` -> (result, where the splits are). The model's RoPE is left as the last
    candidate scored: apply the result's config (or reset it) afterwards. ``problem`` (e.g. the model file's
    fingerprint): with it, the checkpoint also records the splits' fingerprints and resumes only the same problem
    (``longrope_search``)."""
    search_tokens, heldout_tokens, where = search_splits(text, reserved=reserved, length=spec.target,
                                                         windows=budget.windows)
    scheme = model.scheme

    def set_factors(rescale, n_hat):
        if n_hat:
            raise ConfigError("longrope-search: the lab model applies a Hugging Face longrope config, which has no "
                              "n_hat; search with n_hat_choices=(0,)")
        scheme.set_rope_scaling(longrope_scaling(rescale.tolist(), factor=spec.factor,
                                                 original_max_position_embeddings=spec.original),
                                max_position_embeddings=spec.target)

    model.eval()
    fitness = perplexity_fitness(model, search_tokens, spec.target, set_factors, device=device)
    heldout = perplexity_fitness(model, heldout_tokens, spec.target, set_factors, device=device)
    result = longrope_search(fitness, heldout=heldout, rotary_dim=spec.rotary_dim, theta=spec.theta,
                             original_length=spec.original, target_length=spec.target, factor=spec.factor,
                             settings=budget.settings(seed), checkpoint=checkpoint, resume=resume,
                             progress=progress,
                             problem=None if problem is None else {
                                 **problem, "search_tokens": tensor_fingerprint(search_tokens),
                                 "heldout_tokens": tensor_fingerprint(heldout_tokens)})
    return result, where


def search_details(result: LongRopeResult, where: dict) -> dict:
    """What results.json records of a search: time, evaluations, scores (the seeds' too), splits, settings."""
    return {"search_s": round(result.wall_s, 2), "evaluations": result.evaluations,
            "heldout_evaluations": result.heldout_evaluations, "fitness": result.fitness,
            "heldout": result.heldout, "seeds_heldout": {k: v.get("heldout") for k, v in result.seeds.items()},
            "best_per_generation": result.best_per_generation, "splits": where,
            "population": result.settings.get("population"), "generations": result.settings.get("generations")}


def _fit(spec: ExtensionSpec, ctx: FitContext) -> tuple[dict, dict]:
    if ctx.corpus is None:
        raise ConfigError(f"extensions: longrope-search scores candidates by perplexity on the text corpus, which "
                          f"the {ctx.task!r} task does not load; use it with the lm task")
    s = ctx.settings
    budget = SearchBudget(population=s["search_population"], generations=s["search_generations"],
                          windows=s["search_windows"])
    from posenc.perplexity import evaluation_prefix

    reserved = evaluation_prefix(s)
    scheme = getattr(ctx.model.cfg, "scheme", "model")
    checkpoint = Path(ctx.out) / "search" / f"{ctx.task}-{scheme}-seed{ctx.seed}-longrope.json" if ctx.out else None
    # the record belongs to this trained model and these splits: a retrained model or other evaluation settings
    # (another reserved prefix) are refused on --resume instead of handed the old search's factors
    result, where = search_lab_model(ctx.model, ctx.corpus.val, spec, reserved=reserved, budget=budget, seed=ctx.seed,
                                 checkpoint=checkpoint, resume=ctx.resume, progress=ctx.progress, device=ctx.device,
                                 problem={"model": state_fingerprint(ctx.model)})
    return result.rope_scaling(), search_details(result, where)


def _write(spec: ExtensionSpec) -> dict:
    raise ConfigError("longrope-search finds its factors by a search on a trained model: run `posenc search` (or "
                      "the lab with --extensions longrope-search), then `posenc extend --method longrope "
                      "--long-factor FILE --short-factor FILE`")


# the lab's search knobs, declared once (posenc lab's --search-population etc.; results.json's settings)
SETTINGS = (
    Setting("search_population", SearchBudget.population, "longrope-search: candidates per generation (paper: 64)",
            kind="int", min=4, max=2**16),
    Setting("search_generations", SearchBudget.generations, "longrope-search: generations (paper: 40)", kind="int",
            min=0, max=2**16),
    Setting("search_windows", SearchBudget.windows, "longrope-search: windows of the target length in its search "
            "and held-out splits (cut from the validation text after the part the lab reports on)", kind="int", min=1,
            max=2**16),
)

register_method("longrope-search", label="LongRoPE (searched)", expects_finetune=False, fit=_fit, needs_corpus=True,
                settings=SETTINGS,
                note="per-pair factors found by LongRoPE's evolutionary search on the model (perplexity at the "
                     "target length on a search split, the winner chosen on a held-out split); the paper reports it "
                     "beats PI, NTK and YaRN without fine-tuning (Ding et al. 2024, LongRoPE Table 1). posenc's lab "
                     "measurements: docs/lab.md.")(_write)
