"""What a ``posenc`` command may write: never over one of its inputs, never over a model's files.

Every command that writes a file or a folder (extend, search, export, convert, eval --out, plot --out, lab --out)
passes each output path through ``check_output`` before any long work:

- a path that runs into a loop of symbolic links is refused, naming the argument;
- an existing model file is never written over, even with ``--overwrite``: weights (``*.safetensors``, ``*.bin``,
  ``*.pt``, ``*.gguf``, ...), tokenizer files, and the config.json (or generation_config.json, ...) of a model folder
  that holds weights; symlinks are followed, since a write replaces the link's target;
- an output is never one of the command's inputs; a folder replaced as a whole (export, convert) never holds
  one either, since replacing it would delete it. A new path inside an input folder is fine (``RUN/exported``,
  ``MODEL/config.longrope-N.json``): nothing there is replaced but what the rules above allow.

The names of a model folder's files are owned here; ``posenc.hf.evaluate`` reads them to find a model's files.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

from posenc._internal.errors import ConfigError

# the weight files transformers' from_pretrained looks for in a local folder (transformers.utils' *_NAME constants)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# files AutoTokenizer builds a tokenizer from (the fast tokenizer, its config, BPE / WordPiece / SentencePiece vocabs)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tekken.json")
# weights whatever their folder: transformers' shards, torch pickles, GGUF, other frameworks' checkpoints
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx")
# the rest of a model folder: files of the model only where weights sit beside them (a config.json elsewhere, such
# as the one `posenc extend` writes beside a GGUF file, is an ordinary file)
FOLDER_FILES = ("config.json", "generation_config.json", "special_tokens_map.json", "added_tokens.json",
                "chat_template.jinja", "chat_template.json", "preprocessor_config.json")
# weights a folder's config.json describes (a GGUF file is its own config: its folder is not a model folder)
_FOLDER_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _real(path: Path) -> Path:
    """``path`` absolute with every symlink followed (a loop has been refused by then)."""
    return Path(os.path.realpath(path))


def _forms(path: str | os.PathLike) -> set[Path]:
    """``path`` made absolute twice: as written (``..`` folded) and with every symlink followed."""
    return {Path(os.path.abspath(path)), _real(Path(path))}


def has_weights(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a transformers model's weights (a shard, an index or a torch pickle)."""
    try:
        return any(p.name in WEIGHT_FILES or p.suffix.lower() in _FOLDER_WEIGHT_SUFFIXES
                   for p in Path(folder).iterdir() if p.is_file())
    except OSError:
        return False


def _gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def model_file(path: str | os.PathLike) -> str | None:
    """What model file ``path`` (symlinks followed) is, in words ("a model's weights file", "a model's tokenizer
    file", "the config.json of the model folder M, which holds weights"), or None when it is none (or is missing)."""
    real = _real(Path(path))
    if not real.is_file():
        return None
    if real.suffix.lower() in WEIGHT_SUFFIXES or real.name in WEIGHT_FILES or real.name.endswith(
            (".safetensors.index.json", ".bin.index.json")) or _gguf_magic(real):
        return "a model's weights file"
    if real.name in TOKENIZER_FILES:
        return "a model's tokenizer file"
    if real.name in FOLDER_FILES and has_weights(real.parent):
        return f"the {real.name} of the model folder {real.parent}, which holds weights"
    return None


def _refuse_loop(path: Path, what: str) -> None:
    """ConfigError naming ``what`` when ``path`` (or a folder on its way) is a loop of symbolic links."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{what}: the path runs into a loop of symbolic links (a link that leads back to "
                              "itself); give a path that resolves") from None


def check_output(path: str | os.PathLike, what: str, *, inputs: Iterable[tuple[str, object]] = (),
                 replaces_folder: bool = False, writes: Iterable[str] = ()) -> Path:
    """Refuse (ConfigError naming ``what``, e.g. "out runs/x (--out)") an output path that a command may not
    write; -> the path. See the module docstring for the rules.

    inputs: (name, path) pairs of what the command reads ("model", "source", "--data"); None paths are skipped.
    replaces_folder: the command replaces ``path`` as a whole (export, convert): it may not hold an input either.
    writes: names of the files the command writes inside the folder ``path`` (eval's results.json, ...): each is
    checked as a file output too.
    """
    out = Path(path)
    _refuse_loop(out, what)
    kind = model_file(out)
    if kind is not None:
        linked = f" (through a link: {_real(out)})" if _real(out) != Path(os.path.abspath(out)) else ""
        raise ConfigError(f"{what}: is {kind}{linked}; posenc never writes over a model's weights, tokenizer or "
                          "config, even with --overwrite: give a new path")
    given = [(name, Path(p)) for name, p in inputs if p is not None and str(p) != "-"]
    outs = _forms(out)
    for name, src in given:
        srcs = _forms(src)
        same = bool(outs & srcs)
        if replaces_folder and (same or any(o in s.parents for o in outs for s in srcs)):
            raise ConfigError(f"{what}: {'is' if same else 'holds'} the {name} {src}; the command replaces its "
                              "output folder as a whole, which would delete it. Write to a new folder (one inside "
                              "an input folder is fine)")
        if same:
            raise ConfigError(f"{what}: is the {name} {src}, which this command reads; write to a new path")
    for name in writes:
        check_output(out / name, f"{what}, its file {name}", inputs=given)
    return out
