"""``posenc tune`` on a model whose config already holds a RoPE scaling (a ``posenc finetune`` output, a released
long-context checkpoint): the model as configured is one candidate, and every other candidate starts from the
config's original (unscaled) RoPE parameters at factor L / original context, as ``posenc extend --replace`` and
``posenc eval --replace`` compute them.

Why this is tune's behaviour and not a flag: a factor L / original applied on top of an existing scaling would
scale twice, and an attention method on top of it would extend twice, so without replacing there is nothing else
coherent to race; and tune writes nothing into the model, while the model as configured stays a candidate that
wins when it is the best. A config whose scaling cannot be removed by extend (a query temperature tied to the
scaling) is raced as before: its frequency methods are left out with extend's reason. RoPE per layer type (Gemma
3) is no such case: extend removes and replaces the global (full-attention) entry's scaling only.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from posenc._internal.errors import ConfigError


@dataclass(frozen=True)
class Configured:
    """A config's own scaling as tune races it: its rope type, the label the candidate carries, and the
    fine-tune's record when posenc finetune wrote the model (DIR/../finetune.json)."""

    rope_type: str
    label: str                       # "as configured (fine-tuned)" or "as configured"
    record: dict | None

    def to_dict(self) -> dict:
        from posenc.tools.finetune_record import describe

        return {"rope_type": self.rope_type, "label": self.label,
                "fine_tuned": describe(self.record) if self.record else None}


def configured(config: dict, model_dir) -> Configured | None:
    """The config's own scaling when it has one tune can replace (``unscaled_config`` takes it off), else None:
    a config of plain RoPE, or one extend cannot rewrite (then tune races it as an unscaled config would be)."""
    from posenc.rope.layers import global_rope_config
    from posenc.tools.extend import unscaled_config

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # reading the scaling's type only (Gemma 3: the global layers')
            rope_type = global_rope_config(config).rope_type
        if rope_type == "default":
            return None
        unscaled_config(config)
    except (ConfigError, ValueError, KeyError, TypeError):
        return None
    from posenc.tools.finetune_record import finetune_record

    try:
        record = finetune_record(model_dir)
    except ConfigError:              # a damaged record costs only the label, not the tune
        record = None
    return Configured(rope_type, "as configured (fine-tuned)" if record else "as configured", record)


def same_frequencies(a: dict, b: dict, length: int) -> bool:
    """Whether configs ``a`` and ``b`` give the same RoPE at ``length`` (inverse frequencies, attention scaling and
    trained length): a re-extension that rebuilds the configured scaling is that candidate again."""
    import torch

    from posenc.rope.contexts import trained_length
    from posenc.rope.layers import global_rope_config
    from posenc.rope.scaling import rope_parameters

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # RoPE per layer type: the global layers', the only ones extend rescales
        (rc_a, rc_b) = (global_rope_config(c) for c in (a, b))
        (inv_a, att_a), (inv_b, att_b) = (rope_parameters(rc, length) for rc in (rc_a, rc_b))
        same_length = trained_length(rc_a) == trained_length(rc_b)
    return same_length and inv_a.shape == inv_b.shape and bool(torch.allclose(inv_a, inv_b, rtol=1e-6)) \
        and abs(float(att_a) - float(att_b)) <= 1e-6 * max(1.0, abs(float(att_a)))
