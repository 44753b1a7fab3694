"""Training throughput of the lab under torch.distributed: tokens/s for 1 vs 2 CPU processes (1 vs N GPUs when
there are GPUs), with the scaling efficiency.

    python benchmarks/distributed.py            # CPU: 1 proc x 1 thread, 1 proc x 2 threads, 2 procs x 1 thread
    python benchmarks/distributed.py --quick    # fewer steps, one launch per configuration (default: best of 2)

Every configuration runs under torchrun (one process is torchrun with --nproc-per-node 1), the same path as
`posenc lab --nproc N`, and times the lab's own training step (DDP + sharded loss + AdamW) on a fixed global
batch, so the processes split the same work. Data are random bytes (throughput does not depend on them).

    speedup     tokens/s divided by the 1-process, 1-thread run's
    efficiency  speedup / processes (1.0 = perfect data-parallel scaling; thread count per process held at 1)
    vs_threads  tokens/s divided by 1 process using all the threads (same cores: processes vs intra-op threads)

Results: benchmarks/results/distributed-cpu.json (and distributed-cuda.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS_DIR, environment, print_table, save_json  # noqa: E402

MODELS = {  # the lab's small model at a length where attention matters; the GPU one is larger
    "cpu": dict(model=dict(scheme="rope", d_model=128, n_layers=2, n_heads=4, max_len=256), batch=16, seq=256),
    "cuda": dict(model=dict(scheme="rope", d_model=512, n_layers=8, n_heads=8, max_len=1024), batch=64, seq=1024),
}


def worker(args) -> None:
    """One torchrun worker: time the training step; rank 0 writes {"tokens_per_s", ...} to args.out."""
    from posenc.lab import distributed as D
    from posenc.lab.data import LMSampler
    from posenc.lab.train import TrainSettings, lm_loss, make_optimizer
    from posenc.nn.model import ModelConfig, TinyLM

    torch.set_num_threads(args.threads)
    spec = MODELS[args.device]
    with D.session(args.device) as (info, device):
        torch.manual_seed(0)
        model = TinyLM(ModelConfig(**spec["model"])).to(device).train()
        tokens = torch.randint(0, 256, (1_000_000,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
        sampler = LMSampler(tokens, spec["seq"], spec["batch"], seed=0)
        opt = make_optimizer(model, TrainSettings())
        net = D.ddp_wrap(model) if info.distributed else model

        def step(i):
            inputs, targets = sampler.batch(i, info.rank, info.world_size)
            inputs, targets = inputs.to(device), targets.to(device)
            if info.distributed:
                loss, _ = D.sharded_lm_loss(net(inputs), targets)
            else:
                loss = lm_loss(net(inputs), targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        for i in range(args.warmup):
            step(i)
        _sync(device)
        D.barrier()
        t0 = time.perf_counter()
        for i in range(args.warmup, args.warmup + args.steps):
            step(i)
        _sync(device)
        D.barrier()
        seconds = time.perf_counter() - t0
        if info.is_main:
            with open(args.out, "w") as f:
                json.dump({"tokens_per_s": args.steps * spec["batch"] * spec["seq"] / seconds,
                           "s_per_step": seconds / args.steps, "threads": torch.get_num_threads()}, f)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(device: str, nproc: int, threads: int, steps: int, warmup: int) -> dict:
    """Launch one configuration under torchrun; -> the worker's measurement."""
    from posenc.lab.launch import torchrun_command

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = torchrun_command(nproc, [os.path.abspath(__file__), "--worker", "--device", device, "--threads",
                                       str(threads), "--steps", str(steps), "--warmup", str(warmup), "--out", out])
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(out):
            raise SystemExit(f"{nproc} x {device} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=None,
                        help="launches per configuration, interleaved; the best is kept (default 2, --quick 1)")
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    steps = args.steps or (5 if args.quick else 20)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if device == "cpu":
        n = 2
        configs = [(1, 1), (1, n), (n, 1)]  # (processes, threads per process)
    else:
        n = torch.cuda.device_count()
        configs = [(1, 1)] + ([(n, 1)] if n > 1 else [])
    spec = MODELS[device]
    repeats = args.repeats or (1 if args.quick else 2)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    samples: dict = {c: [] for c in configs}
    for _ in range(repeats):  # interleaved, so a burst of load from other jobs hits every configuration alike
        for nproc, threads in configs:
            r = measure(device, nproc, threads, steps, args.warmup)
            samples[(nproc, threads)].append(r)
            print(f"{nproc} proc x {threads} thread: {r['tokens_per_s']:.0f} tokens/s", file=sys.stderr, flush=True)
    rows = []
    for (nproc, threads), runs in samples.items():
        best = max(runs, key=lambda r: r["tokens_per_s"])
        rows.append({"config": f"{nproc} proc x {threads} thread" if device == "cpu" else f"{nproc} GPU",
                     "processes": nproc, "threads_per_process": threads, **best,
                     "all_tokens_per_s": [round(r["tokens_per_s"], 1) for r in runs]})
    base = rows[0]["tokens_per_s"]
    all_threads = next((r["tokens_per_s"] for r in rows if r["processes"] == 1 and r["threads_per_process"] == n),
                       None)
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / base
        r["efficiency"] = r["speedup"] / r["processes"]
        r["vs_threads"] = r["tokens_per_s"] / all_threads if all_threads else None
    title = (f"lab training step, {device}: model {spec['model']}, global batch {spec['batch']} x {spec['seq']} "
             f"tokens, {steps} timed steps, best of {repeats}")
    shown = [{**r, "tokens_per_s": f"{r['tokens_per_s']:.0f}", "s_per_step": f"{r['s_per_step']:.3f}",
              **{k: f"{r[k]:.2f}" for k in ("speedup", "efficiency", "vs_threads") if r[k] is not None}}
             for r in rows]
    print_table(shown, ["config", "tokens_per_s", "s_per_step", "speedup", "efficiency", "vs_threads"], title=title)
    note = (f"CPU with {cores} cores shared with other jobs: numbers are noisy. The 2-process run uses 1 thread per "
            "process; '1 proc x 2 thread' uses both cores in one process." if device == "cpu" else "")
    if note:
        print(note)
    path = save_json({"benchmark": "distributed", "environment": environment(device), "cores": cores,
                      "model": spec["model"], "global_batch": spec["batch"], "seq_len": spec["seq"],
                      "timed_steps": steps, "warmup_steps": args.warmup, "repeats": repeats, "note": note,
                      "load_average_1m": {"before": load_before and round(load_before[0], 2),
                                          "after": load_before and round(os.getloadavg()[0], 2)},
                      "rows": rows},
                     os.path.join(RESULTS_DIR, f"distributed-{device}.json"))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
