"""Two revisions side by side, interleaved: is a change faster, slower, or within this machine's noise?

    python benchmarks/compare.py main                  # main against the working tree: default lab + RoPE paths
    python benchmarks/compare.py HEAD~3 --against HEAD # two commits
    python benchmarks/compare.py main --rounds 5 --skip-lab          # RoPE paths only, more rounds
    python benchmarks/compare.py main --lab-preset smoke --rounds 2  # a smoke run (seconds)

Why interleave: on a shared machine one run of the same code varies by up to 1.8x, so two revisions timed an
hour apart (or one after the other, once) tell nothing. Here every round runs both revisions back to back, in an
order that alternates from round to round, so a burst of load from elsewhere hits both; the medians over rounds
and the per-round ratios (new / old, with their min-max) say whether a difference is larger than the spread.

What is timed, each in a fresh subprocess that imports the revision's own ``posenc`` (``git archive REV`` into a
temporary folder; the working tree itself for ``--against WORKTREE``, the default):
- ``lab``: wall time of ``python -m posenc lab --preset P --quiet`` (default preset: the README's main job).
  Its printed table is compared between the revisions: "table identical" means digit for digit.
- ``rope``: the public ``posenc.apply_rope_qk`` on q [1, 32, T, 128] and k [1, 8, T, 128] (T = 2048, one thread),
  fp32 and bf16, the default path (fresh outputs) against the clone floor and ``out=`` against the copy floor;
  median of torch.utils.benchmark's blocked_autorange. The floors are reported as ratios (x_floor), which makes
  the row comparable across rounds even when the machine's speed drifts.

The first subprocess of each revision builds and caches its C kernel (``$POSENC_CACHE_DIR``); one untimed RoPE
warm-up per revision keeps that out of the numbers. Results: a table on stdout and, with ``--json FILE``, the
per-round raw numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKTREE = "WORKTREE"

# Runs inside the revision's interpreter environment: only public calls that every revision since the RoPE
# kernels landed has (apply_rope_qk with out=).
ROPE_SNIPPET = r"""
import json, sys, torch, torch.utils.benchmark as tb
import posenc
torch.set_num_threads(1)
T = int(sys.argv[1]); min_run = float(sys.argv[2])
def med(fn):
    for _ in range(3):
        fn()
    return float(tb.Timer(stmt="fn()", globals={"fn": fn}, num_threads=1).blocked_autorange(min_run_time=min_run).median)
out = {}
for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 32, T, 128, generator=g).to(dtype)
    k = torch.randn(1, 8, T, 128, generator=g).to(dtype)
    pos = torch.arange(T)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    default = med(lambda: posenc.apply_rope_qk(q, k, pos, layout="half"))
    into = med(lambda: posenc.apply_rope_qk(q, k, pos, layout="half", out=(qo, ko)))
    copy = med(lambda: (qo.copy_(q), ko.copy_(k)))
    clone = med(lambda: (torch.empty_like(q).copy_(q), torch.empty_like(k).copy_(k)))
    out[name] = {"default_ms": default * 1e3, "out_ms": into * 1e3, "copy_ms": copy * 1e3, "clone_ms": clone * 1e3,
                 "default_x_clone": default / clone, "out_x_copy": into / copy}
print("ROPE_JSON " + json.dumps(out))
"""


def _rev_sha(rev: str) -> str:
    """The full commit hash of ``rev`` (a clear error when git does not know it)."""
    done = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO, capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"compare: error: revision {rev!r} is not a commit of this repository")
    return done.stdout.strip()


def _checkout(rev: str, root: str) -> str:
    """A folder holding ``rev``'s tracked files (the working tree itself for WORKTREE)."""
    if rev == WORKTREE:
        return REPO
    sha = _rev_sha(rev)
    folder = os.path.join(root, sha[:12])
    os.makedirs(folder, exist_ok=True)
    archive = os.path.join(root, sha[:12] + ".tar")
    with open(archive, "wb") as f:
        subprocess.run(["git", "archive", sha], cwd=REPO, stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    os.remove(archive)
    return folder


def _env(folder: str, threads: int) -> dict:
    env = dict(os.environ, PYTHONPATH=folder, OMP_NUM_THREADS=str(threads))
    return env


def run_lab(folder: str, preset: str, threads: int, out: str) -> tuple[float, str]:
    """(wall seconds, the printed table) of ``posenc lab --preset preset`` run from ``folder``'s posenc."""
    cmd = [sys.executable, "-m", "posenc", "lab", "--preset", preset, "--quiet", "--threads", str(threads),
           "--out", out]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=folder, env=_env(folder, threads), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"compare: error: the lab failed in {folder} (exit {done.returncode}):\n{done.stderr[-2000:]}")
    table = "\n".join(line for line in done.stdout.splitlines() if line.startswith("|"))
    return wall, table


def run_rope(folder: str, length: int, min_run: float) -> dict:
    """The RoPE snippet's numbers (see ROPE_SNIPPET) with ``folder``'s posenc."""
    done = subprocess.run([sys.executable, "-c", ROPE_SNIPPET, str(length), str(min_run)], cwd=folder,
                          env=_env(folder, 1), capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("ROPE_JSON "):
            return json.loads(line[len("ROPE_JSON "):])
    sys.exit(f"compare: error: the RoPE timing failed in {folder}:\n{done.stderr[-2000:]}")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def summarise(rounds: list[dict], old: str, new: str) -> list[tuple[str, str, str, str]]:
    """Rows (metric, old median [min-max], new median [min-max], new/old per round: median [min-max])."""
    metrics = sorted({m for r in rounds for m in r[old]})
    rows = []
    for metric in metrics:
        a = [r[old][metric] for r in rounds]
        b = [r[new][metric] for r in rounds]
        ratios = [y / x for x, y in zip(a, b)]
        rows.append((metric, _spread(a), _spread(b), _spread(ratios)))
    return rows


def _flatten(rope: dict) -> dict:
    return {f"rope {dtype} {key}": value for dtype, row in rope.items() for key, value in row.items()
            if key.endswith("_x_clone") or key.endswith("_x_copy") or key in ("default_ms", "out_ms")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="the baseline revision (a branch, tag or commit)")
    parser.add_argument("--against", default=WORKTREE, help="the new revision (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--lab-preset", default="default", help="the lab preset to time (default: default)")
    parser.add_argument("--threads", type=int, default=2, help="threads for the lab (RoPE runs on one)")
    parser.add_argument("--rope-length", type=int, default=2048, help="T of the RoPE shapes (default 2048)")
    parser.add_argument("--min-run", type=float, default=0.5, help="seconds of timing per RoPE row")
    parser.add_argument("--skip-lab", action="store_true", help="time the RoPE paths only")
    parser.add_argument("--skip-rope", action="store_true", help="time the lab only")
    parser.add_argument("--json", help="also write every round's numbers to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.skip_lab and args.skip_rope:
        parser.error("--skip-lab and --skip-rope together leave nothing to time")
    old, new = f"old={args.old}", f"new={args.against}"
    with tempfile.TemporaryDirectory(prefix="posenc-compare-") as root:
        folders = {old: _checkout(args.old, root), new: _checkout(args.against, root)}
        if not args.skip_rope:
            for folder in folders.values():  # builds and caches each revision's kernel, untimed
                run_rope(folder, 64, 0.01)
        rounds, tables = [], {}
        for i in range(args.rounds):
            order = [old, new] if i % 2 == 0 else [new, old]
            result = {}
            for side in order:
                numbers = {}
                if not args.skip_lab:
                    wall, tables[side] = run_lab(folders[side], args.lab_preset, args.threads,
                                                 os.path.join(root, f"lab-{i}-{side[:3]}"))
                    numbers[f"lab {args.lab_preset} s"] = wall
                if not args.skip_rope:
                    numbers.update(_flatten(run_rope(folders[side], args.rope_length, args.min_run)))
                result[side] = numbers
            rounds.append(result)
            print(f"round {i + 1}/{args.rounds} done ({', '.join(order)})", file=sys.stderr, flush=True)
    print(f"| metric | {old} | {new} | new/old per round |")
    print("|---|---|---|---|")
    for row in summarise(rounds, old, new):
        print("| " + " | ".join(row) + " |")
    print(f"(median [min-max] over {args.rounds} interleaved rounds; lab threads {args.threads}, RoPE 1 thread)")
    if not args.skip_lab:
        same = tables.get(old) == tables.get(new)
        print("lab table: identical digit for digit" if same else "lab table: DIFFERS between the revisions")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"old": args.old, "new": args.against, "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
