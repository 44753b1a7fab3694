"""The model-agnostic perplexity fitness, checked against a tiny transformers Llama (random weights, no download):
its own loss is the oracle, and the search runs end to end on it with factors set through a callback."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from posenc import LongRopeSettings, lm_perplexity, longrope_scaling, longrope_search, perplexity_fitness
from posenc._internal.errors import DataError, PosencError

transformers = pytest.importorskip("transformers", reason="a tiny transformers Llama is the oracle here")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

transformers.logging.set_verbosity_error()

HEAD_DIM, L0, TARGET, VOCAB = 16, 16, 64, 61
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
            vocab_size=VOCAB, initializer_range=0.3, attn_implementation="eager")


def tiny_llama(rope: dict, max_len: int = TARGET) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(**TINY, max_position_embeddings=max_len, rope_parameters={**rope, "rope_theta": 10000.0})
    return LlamaForCausalLM(config).eval()


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def logits_of(model):
    return lambda ids: model(input_ids=ids, use_cache=False).logits


def hf_perplexity(model, stream: torch.Tensor, length: int, windows: int) -> float:
    """transformers' own causal-LM loss (labels = inputs, shifted inside), averaged over equal windows."""
    losses = []
    with torch.no_grad():
        for w in range(windows):
            ids = stream[w * length:(w + 1) * length + 1].unsqueeze(0)
            losses.append(model(input_ids=ids, labels=ids, use_cache=False).loss.item())
    return math.exp(sum(losses) / len(losses))


@pytest.mark.parametrize("batch_size", [1, 3])
def test_lm_perplexity_matches_transformers_loss(batch_size):
    model = tiny_llama({"rope_type": "default"})
    stream = tokens(5 * 40 + 1)
    got = lm_perplexity(model, stream, 40, batch_size=batch_size)                       # HF output: .logits
    assert got == pytest.approx(hf_perplexity(model, stream, 40, windows=5), rel=1e-5)
    assert lm_perplexity(logits_of(model), stream, 40, windows=2) == pytest.approx(
        hf_perplexity(model, stream, 40, windows=2), rel=1e-5)


def test_lm_perplexity_bad_input():
    model = tiny_llama({"rope_type": "default"})
    with pytest.raises(DataError, match="at least length \\+ 1"):
        lm_perplexity(model, tokens(40), 40)
    with pytest.raises(DataError, match="1-D integer"):
        lm_perplexity(model, torch.zeros(100), 40)
    with pytest.raises(PosencError, match="logits"):
        lm_perplexity(lambda ids: ids.float(), tokens(100), 40)
    with pytest.raises(PosencError, match="windows"):
        lm_perplexity(model, tokens(100), 40, windows=0)


def set_llama_factors(model: LlamaForCausalLM):
    """The callback a transformers model needs: rebuild its rotary embedding from the candidate's longrope dict."""

    def set_factors(rescale: torch.Tensor, n_hat: int) -> None:
        if n_hat:
            raise PosencError("transformers' longrope has no n_hat")
        config = copy.deepcopy(model.config)
        config.rope_parameters = {**longrope_scaling(rescale, factor=TARGET / L0, original_max_position_embeddings=L0),
                                  "rope_theta": 10000.0}
        model.model.rotary_emb = LlamaRotaryEmbedding(config)

    return set_factors


def test_perplexity_fitness_scores_what_the_written_config_gives():
    model = tiny_llama({"rope_type": "default"}, max_len=L0)
    stream = tokens(3 * TARGET + 1)
    fitness = perplexity_fitness(model, stream, TARGET, set_llama_factors(model), windows=3)
    rescale = torch.linspace(1.0, 4.0, HEAD_DIM // 2, dtype=torch.float64)
    # oracle: the same weights loaded into a model configured with the longrope dict from the start
    written = tiny_llama(longrope_scaling(rescale, factor=TARGET / L0, original_max_position_embeddings=L0))
    written.load_state_dict(model.state_dict())
    assert fitness(rescale, 0) == pytest.approx(hf_perplexity(written, stream, TARGET, windows=3), rel=1e-5)
    with pytest.raises(PosencError, match="set_factors"):
        perplexity_fitness(model, stream, TARGET, None)


def test_search_runs_end_to_end_on_a_model():
    model = tiny_llama({"rope_type": "default"}, max_len=L0)
    set_factors = set_llama_factors(model)
    search = perplexity_fitness(model, tokens(2 * TARGET + 1, seed=1), TARGET, set_factors)
    heldout = perplexity_fitness(model, tokens(2 * TARGET + 1, seed=2), TARGET, set_factors)
    result = longrope_search(search, heldout=heldout, rotary_dim=HEAD_DIM, theta=10000.0, original_length=L0,
                             target_length=TARGET, settings=LongRopeSettings(population=8, parents=4, generations=2,
                                                                             heldout_top=2), progress=False)
    assert math.isfinite(result.fitness) and math.isfinite(result.heldout)
    assert result.fitness <= min(entry["fitness"] for entry in result.seeds.values())   # elitism keeps the seeds
    assert result.evaluations == 8 + 2 * 4
