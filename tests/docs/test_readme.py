"""The README's front door holds: its python blocks run as written (in order, one namespace, from the repository
root, as a newcomer pastes them), the two commands are the ones scripts/ provides, and it stays short."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(lang: str) -> list[str]:
    return [body for tag, body in FENCE.findall(README.read_text()) if tag == lang]


def test_readme_python_blocks_run(tmp_path):
    code = blocks("python")
    assert len(code) >= 5  # the tour's four steps and the scheme
    script = tmp_path / "readme_blocks.py"
    script.write_text("\n\n".join(code))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    # a subprocess: the blocks register a scheme ("mine"), which must not leak into this test session's registry
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # what the tour's comments promise is what it prints
    assert "29 6 29" in result.stdout
    assert "'rope_type': 'yarn', 'factor': 8.0, 'original_max_position_embeddings': 4096" in result.stdout
    assert "{'kept': 21, 'blended': 25, 'interpolated': 18, 'removed': 0}" in result.stdout


def test_readme_names_the_two_commands_and_they_exist():
    shell = "\n".join(blocks("bash"))
    for script in ("scripts/lab.sh", "scripts/test.sh"):
        assert f"bash {script}" in shell
        assert (ROOT / script).is_file()


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 220
    # histories live in CHANGELOG.md and the docs pages that own a measurement, not here
    assert not re.search(r"\b[0-9a-f]{7}\b(?![\w.])", re.sub(r"```.*?```", "", text, flags=re.S)), "a commit hash"
    assert "load average" not in text and "EPYC" not in text and "Xeon" not in text
