"""Request-sized YaRN on a loaded transformers model: each request runs with the smallest YaRN factor of a set that
covers its prompt plus its new tokens (``posenc.extensions.request.request_factor``), so a short request runs with
the model's own frequencies and a long one exactly as a model loaded with static YaRN at that factor.

    >>> out = generate(model, input_ids, max_new_tokens=64, factors=(1, 2, 4))

The YaRN config of a factor is ``posenc.hf.scaling.extend_for_factor``'s (as ``posenc eval --methods yarn`` and
``posenc extend`` write it); for the request the model's ``rotary_emb`` is replaced by one built from that config, and
the config's rope parameters and max_position_embeddings carry it, all restored after the request, an exception
included. The model must have one ``rotary_emb`` (a transformers 5 text decoder, ``posenc.hf.families``).
"""

from __future__ import annotations

import contextlib

from posenc._internal.errors import ConfigError
from posenc.extensions.request import DEFAULT_FACTORS, check_factors, request_factor

# posenc eval's method name for request-sized YaRN (each scored length takes its own factor)
EVAL_METHOD = "yarn-request"
# the config fields a YaRN extension changes (transformers 5; its rope_scaling is a deprecated alias of the first)
_CONFIG_FIELDS = ("rope_parameters", "max_position_embeddings")


def eval_factors(factor: float) -> tuple[float, ...]:
    """The factors ``posenc eval --methods yarn-request --factor F`` chooses from: 1, the powers of two below F, F."""
    top = check_factors([factor], "factor")[0]
    return check_factors([*(2.0 ** k for k in range(64) if 2.0 ** k < top), top], "factor")


def trained_length(config) -> int:
    """The context ``config`` was trained for, as extend reads it (ConfigError when posenc cannot tell)."""
    from posenc.hf.loading import original_context

    length = original_context(config)
    if not length:
        raise ConfigError("model: request-sized YaRN needs the trained context length, and the config gives none")
    return int(length)


def factor_config(config, factor: float):
    """``config`` with YaRN at ``factor`` written in (``extend_for_factor``); ``config`` itself at factor 1."""
    from posenc.hf.scaling import extend_for_factor

    if factor == 1:
        return config
    return type(config).from_dict(extend_for_factor(config.to_dict(), "yarn", factor).config)


@contextlib.contextmanager
def yarn_factor(model, factor: float, *, base_config=None):
    """Run the body with ``model`` at YaRN ``factor`` over ``base_config`` (default: the model's config; 1: unscaled),
    then restore its rotary embedding and config fields, also after an exception."""
    from posenc.hf.families import find_rotary

    parent, attr, old = find_rotary(model, "request-sized YaRN")
    config = factor_config(base_config if base_config is not None else model.config, factor)
    rotary = type(old)(config=config).to(old.inv_freq.device)
    saved = {k: getattr(model.config, k) for k in _CONFIG_FIELDS if hasattr(model.config, k)}
    setattr(parent, attr, rotary)
    try:
        for key in saved:
            setattr(model.config, key, getattr(config, key, saved[key]))
        yield config
    finally:
        setattr(parent, attr, old)
        for key, value in saved.items():
            setattr(model.config, key, value)


@contextlib.contextmanager
def request_yarn(model, needed_tokens: int, factors=DEFAULT_FACTORS, *, base_config=None):
    """``yarn_factor`` at the smallest factor of ``factors`` covering ``needed_tokens`` (ConfigError if none does)."""
    config = base_config if base_config is not None else model.config
    with yarn_factor(model, request_factor(needed_tokens, trained_length(config), factors),
                     base_config=base_config) as scaled:
        yield scaled


def generate(model, input_ids, max_new_tokens: int, factors=DEFAULT_FACTORS, **kwargs):
    """``model.generate(input_ids, max_new_tokens=..., **kwargs)`` with the YaRN factor this request needs: the
    smallest of ``factors`` whose factor x trained length covers the prompt plus ``max_new_tokens`` (1: the model
    unscaled). The model's rotary embedding and config are restored after the call."""
    from posenc._internal.validate import check_int

    new = check_int(max_new_tokens, "max_new_tokens", min=1, error=ConfigError)
    with request_yarn(model, int(input_ids.shape[-1]) + new, factors):
        return model.generate(input_ids, max_new_tokens=new, **kwargs)
