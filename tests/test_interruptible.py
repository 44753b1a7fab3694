"""Runs that cannot be stopped, closed as a class: every length-like lab setting is bounded at validation (or its
attention memory refused past the machine), and Ctrl-C / SIGTERM end a command even inside one long C call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from posenc.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset", "smoke", "--tasks", "lm", "--schemes", "rope", "--seeds", "0", "--threads", "1", "--quiet"]
# one causal attention call over this many tokens runs for minutes on a CPU core (d 32: ~T^2 * 64 flops)
LONG_CALL = "torch.nn.functional.scaled_dot_product_attention(*(torch.randn(1, 1, 300_000, 32),) * 3, is_causal=True)"


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "internal error" not in err, err
    return err


@pytest.mark.parametrize("flags, flag", [
    (["--finetune-steps", "1", "--extensions", "linear", "--finetune-len", "1000000"], "--finetune-len"),
    (["--eval-lens", "96,1000000"], "--eval-lens"),
    (["--train-len", str(2**18)], "--train-len"),
    (["--sliding-lens", str(2**17 + 1), "--sliding-stride", "48"], "--sliding-lens"),
    (["--finetune-steps", "1", "--extensions", "linear", "--finetune-len", str(2**40)], "--finetune-len"),
])
def test_every_length_setting_is_bounded_before_any_work(tmp_path, capsys, flags, flag):
    assert main(["lab", *TINY, *flags, "--out", str(tmp_path / "o")]) == 2
    err = _one_line(capsys)
    assert f"{flag} must be at most 131,072" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("scheme", ["alibi", "t5", "rope+alibi", "kerple"])
def test_a_bias_schemes_attention_memory_is_refused_past_the_machine(tmp_path, capsys, monkeypatch, scheme):
    from posenc.lab import presets

    monkeypatch.setattr(presets, "device_memory_bytes", lambda device: 2**30)   # a 1 GiB machine
    argv = ["lab", *TINY, "--schemes", scheme, "--eval-lens", "96,16384", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = _one_line(capsys)
    assert f"--eval-lens: the {scheme} scheme biases the attention logits" in err and "GiB" in err
    # rope keeps no [T, T] tensor (SDPA's fused causal path): the same lengths pass this check
    monkeypatch.setattr(presets, "device_memory_bytes", lambda device: 2**30)
    cfg = presets.get_preset("smoke", tasks=["lm"], schemes=["rope"], eval_lens=[96, 16384])
    assert cfg.longest_sequence() == ("eval_lens", 16384)


def _start(code: str, tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the child never started its long call"
        time.sleep(0.05)
    time.sleep(0.3)  # inside the C call by now


@pytest.mark.parametrize("signum, status, word", [(signal.SIGINT, 130, "interrupted"),
                                                  (signal.SIGTERM, 143, "terminated")])
def test_a_signal_ends_one_long_c_call_within_the_grace(tmp_path, signum, status, word):
    proc = _start(f"""
        import signal, torch
        from pathlib import Path
        from posenc._internal.faults import signals_stop_c_calls, sigterm_raises
        with signals_stop_c_calls("posenc test", grace_s=0.5), sigterm_raises():
            Path("started").write_text("x")
            {LONG_CALL}
        print("returned")
    """, tmp_path)
    _wait_for(tmp_path / "started", proc)
    sent = time.monotonic()
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10, "the signal waited for the C call"
    assert proc.returncode == status and "returned" not in out
    assert err.strip() == (f"posenc test: {word} inside a long computation that did not return within 0.5 s; "
                           "stopped at once (files written before stay; unfinished writes are removed)"), err


def test_a_signal_between_steps_still_cleans_up_in_python(tmp_path):
    """The watchdog steps aside when Python gets the signal in time: the usual KeyboardInterrupt path runs."""
    proc = _start("""
        import time
        from pathlib import Path
        from posenc._internal.faults import signals_stop_c_calls
        try:
            with signals_stop_c_calls("posenc test", grace_s=0.5):
                Path("started").write_text("x")
                while True:
                    time.sleep(0.01)
        except KeyboardInterrupt:
            time.sleep(1.5)   # a cleanup longer than the grace is not cut short
            print("cleaned up")
    """, tmp_path)
    _wait_for(tmp_path / "started", proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.strip() == "cleaned up" and not err.strip(), (out, err)


def test_ctrl_c_stops_a_posenc_command_stuck_in_a_plugins_c_call(tmp_path):
    """Through the CLI (the default grace): a plug-in whose import runs one long C call."""
    (tmp_path / "slow.py").write_text(f"import torch\nfrom pathlib import Path\nPath('started').write_text('x')\n"
                                      f"{LONG_CALL}\n")
    proc = subprocess.Popen([sys.executable, "-m", "posenc", "lab", *TINY, "--plugin", "slow.py", "--out", "o"],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(tmp_path / "started", proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert err.strip().startswith("posenc lab: interrupted inside a long computation"), err


def test_every_size_limit_names_its_setting():
    """The class: each bounded lab setting one past its bound is refused, naming the setting (no run starts)."""
    from posenc._internal.errors import ConfigError
    from posenc.lab.presets import SIZE_LIMITS, get_preset

    list_settings = {"eval_lens", "sliding_lens"}
    for name, limit in SIZE_LIMITS.items():
        value = [96, 2 * limit] if name in list_settings else 2 * limit     # (even: d_model must split in heads)
        with pytest.raises(ConfigError, match=rf"^{name} must be at most {limit:,}, got {2 * limit:,}"):
            get_preset("smoke", tasks=["lm"], schemes=["rope"], **{name: value})


@pytest.mark.parametrize("flag, value", [("--eval-lens", str(2**30 + 1)), ("--sliding-lens", str(2**30 + 1)),
                                         ("--eval-tokens", str(2**30 + 1)), ("--sliding-tokens", str(2**31)),
                                         ("--passkey-trials", str(2**20 + 1)), ("--batch-tokens", str(2**31)),
                                         ("--factor", "1e12")])
def test_eval_bounds_every_length_and_count(tmp_path, capsys, flag, value):
    extra = ["--methods", "none,yarn"] if flag == "--factor" else []
    assert main(["eval", str(tmp_path), flag, value, *extra, "--out", str(tmp_path / "o")]) == 2
    err = _one_line(capsys)
    assert f"{flag} must be" in err and ("at most" in err or "in [" in err), err
