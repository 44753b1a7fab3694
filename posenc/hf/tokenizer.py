"""The byte-level tokenizer written beside an exported lab model: 256 tokens, token id = byte value.

The lab reads text as UTF-8 bytes (posenc.lab.data), so its models need a tokenizer that maps each byte to the id
equal to its value and back. Built with the ``tokenizers`` library, which transformers already depends on: a BPE
model with no merges over the 256 byte symbols of the ByteLevel pre-tokenizer (GPT-2's reversible byte-to-unicode
alphabet, Radford et al. 2019), no regex split, no added prefix space, and the ByteLevel decoder. Saved as
tokenizer.json + tokenizer_config.json, it loads offline with ``AutoTokenizer.from_pretrained(DIR)``:

    tokenizer("héllo")["input_ids"] == list("héllo".encode("utf-8"))
    tokenizer.decode(ids) == bytes(ids).decode("utf-8", errors="replace")
"""

from __future__ import annotations

import os
from pathlib import Path


def byte_tokenizer():
    """A transformers fast tokenizer whose ids are the UTF-8 bytes of the text (vocab 256, no special tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbol = bytes_to_unicode()  # byte value -> the printable character ByteLevel uses for it
    vocab = {symbol[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False,
                                   model_max_length=int(1e30))


def save_byte_tokenizer(out_dir: str | os.PathLike) -> Path:
    """Write the byte tokenizer's files into ``out_dir``; returns the folder."""
    byte_tokenizer().save_pretrained(str(out_dir))
    return Path(out_dir)


def is_byte_tokenizer(tokenizer) -> bool:
    """True when ``tokenizer`` maps text to its UTF-8 bytes one for one (ids = byte values, no special tokens),
    checked on a probe holding ASCII, whitespace runs and multi-byte characters."""
    probe = "def f(x):\n\t  return x  # \u00e9\u65e5\u672c \r\n"
    try:
        ids = tokenizer(probe, add_special_tokens=True)["input_ids"]
    except Exception:  # any tokenizer that cannot even encode the probe is not ours
        return False
    return list(ids) == list(probe.encode("utf-8")) and len(tokenizer) == 256
