"""A transformers causal LM as the lab's tasks see a model: ``logits_model`` (posenc.hf.lab_bridge.LogitsModel:
forward = logits of token ids, generate = greedy, per-token losses computed a chunk at a time), the scored text as
the model's tokens (``token_stream``) and the passkey episode that fills a length in the model's tokens."""

from __future__ import annotations

import contextlib

import torch

from posenc.hf.loading import input_device


def token_stream(tokenizer, data: torch.Tensor, needed: int) -> tuple[torch.Tensor, bool]:
    """The validation text as the model's tokens (at least ``needed`` when the text has them) -> (tokens, bytes?).

    A byte tokenizer gets the bytes themselves (exactly the lab's stream); any other encodes the UTF-8 text,
    growing the encoded prefix until ``needed`` tokens are there.
    """
    from posenc.hf.tokenizer import is_byte_tokenizer

    if is_byte_tokenizer(tokenizer):
        return data, True
    raw = bytes(data.numpy().tobytes())
    chars = max(4 * needed, 4096)
    while True:
        text = raw[:chars].decode("utf-8", errors="replace")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= needed or chars >= len(raw):
            return torch.tensor(ids, dtype=torch.long), False
        chars *= 2


def logits_model(model, *, max_len: int | None, bar=None, tokenizer=None, byte_level: bool = True,
                 batch_tokens: int = 1 << 16, sized=None):
    """A ``LogitsModel`` over a transformers causal LM: forward = logits of input_ids (no cache), generate = greedy.

    ``sized(n)``: a context manager each call runs inside, given the tokens it needs (a window's length; a prompt
    plus its new tokens): request-sized YaRN's factor for that length (``posenc.hf.request_yarn``). None: nothing.

    For the byte tokenizer, generate continues the byte prompts directly; otherwise prompts are decoded to text,
    encoded with ``tokenizer`` and the continuation decoded back to characters (ASCII codes, '?' for others).
    """
    from posenc.hf.lab_bridge import LogitsModel

    device = input_device(model)
    pad = getattr(tokenizer, "pad_token_id", None) or getattr(tokenizer, "eos_token_id", None) or 0
    sized = sized or (lambda n: contextlib.nullcontext())

    def forward(tokens):
        with sized(tokens.shape[1]):
            out = model(input_ids=tokens.to(device), use_cache=False).logits
        if bar is not None:
            bar.tick()
        return out

    scored = chunked_losses(model)

    def token_losses(tokens, targets):
        with sized(tokens.shape[1]):
            out = scored(tokens, targets)
        if bar is not None:
            bar.tick()
        return out

    def generate(prompts, n_new):
        rows = max(1, batch_tokens // max(1, prompts.shape[1]))
        outs = []
        for chunk in prompts.split(rows):
            if byte_level:
                with sized(chunk.shape[1] + n_new):
                    got = model.generate(chunk.to(device), max_new_tokens=n_new, min_new_tokens=n_new,
                                         do_sample=False, pad_token_id=pad)[:, chunk.shape[1]:]
                outs.append(got.cpu())
                continue
            for row in chunk.tolist():
                ids = tokenizer(bytes(row).decode("ascii", errors="replace"), return_tensors="pt")["input_ids"]
                with sized(ids.shape[1] + n_new + 3):
                    got = model.generate(ids.to(device), max_new_tokens=n_new + 3, do_sample=False,
                                         pad_token_id=pad)
                text = tokenizer.decode(got[0, ids.shape[1]:], skip_special_tokens=True).lstrip()[:n_new]
                text = text.ljust(n_new, "?")
                outs.append(torch.tensor([[ord(c) if ord(c) < 128 else ord("?") for c in text]]))
                if bar is not None:
                    bar.tick()
        return torch.cat(outs)

    return LogitsModel(forward, generate, max_len=max_len, parameters=model.parameters,
                       token_losses=scored and token_losses)


# positions whose logits are computed at once by chunked_losses: [rows, 1024, vocab] float32 (200 MB at 49k words)
LOSS_CHUNK = 1024


def chunked_losses(model, chunk: int = LOSS_CHUNK):
    """-> ``losses(ids [B, T], targets [B, T]) -> float32 [B, T]``: next-token cross-entropy computed from the
    decoder's hidden states [B, T, hidden] with the output head applied ``chunk`` positions at a time, so the
    [B, T, vocab] float32 logits (6.4 GB at 32k tokens and 49k words) never exist at once. None for a model whose
    logits are not plainly head(hidden) (a final soft-cap, a logit scale...): checked once against the model's own
    forward on a few tokens, and such a model is scored from its full logits instead."""
    import torch.nn.functional as F

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings()
    if decoder is None or head is None:
        return None
    device = input_device(model)

    def losses(ids, targets):
        ids, targets = ids.to(device), targets.to(device)
        hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
        out = torch.empty(targets.shape, dtype=torch.float32)
        for s in range(0, ids.shape[1], chunk):
            logits = head(hidden[:, s:s + chunk]).float()
            out[:, s:s + chunk] = F.cross_entropy(logits.transpose(1, 2), targets[:, s:s + chunk],
                                                  reduction="none").cpu()
        return out

    probe = torch.arange(1, 9, device=device)[None] % model.get_input_embeddings().weight.shape[0]
    try:
        with torch.no_grad():
            mine = head(decoder(input_ids=probe, use_cache=False).last_hidden_state).float()
            theirs = model(input_ids=probe, use_cache=False).logits.float()
    except (TypeError, AttributeError, ValueError):
        return None
    # (rounding apart, equal: another matmul kernel may sum in another order; a soft-cap or scale is far off)
    scale = float(theirs.abs().max()) or 1.0
    return losses if torch.allclose(mine, theirs, rtol=1e-3, atol=1e-4 * scale) else None


def passkey_chars(tokenizer, n_tokens: int, byte_level: bool) -> int | None:
    """Characters of a passkey episode that fill ``n_tokens`` of the model's tokens (None if none fits): the
    passkey task's ``episode_chars`` with the model's codec (``posenc.hf.eval.context.text_codec``)."""
    from posenc.hf.eval.context import text_codec
    from posenc.hf.lab_bridge import passkey_episode_chars

    from posenc.lab.context import byte_encode

    encode = byte_encode if byte_level else text_codec(tokenizer)[0]
    return passkey_episode_chars(encode, n_tokens)
