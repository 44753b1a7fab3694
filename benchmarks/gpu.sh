#!/usr/bin/env bash
# Every GPU measurement the project records, in one run on a CUDA machine (under 9 minutes on one H200):
# the GPU tests, benchmarks/rope.py and benchmarks/alibi.py on CUDA, and the default lab preset on the GPU.
# Logs and JSON go to $OUT (or benchmarks/results/gpu/). Optional wheels in .whl/ (e.g. liger-kernel, the RoPE
# peer) are installed into /tmp/site first. Usage: bash benchmarks/gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $py -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__)"; } 2>&1 | tee "$out/env.txt"
timeout 30 $py benchmarks/triton_compile.py 2>&1 | tee "$out/compile.txt"      # registers, access widths
timeout 90 $py -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -15 | tee "$out/tests.txt"
timeout 180 $py benchmarks/rope.py --device cuda --markdown --out "$out/rope-cuda.json" 2>&1 | tee "$out/rope.txt"
timeout 45 $py benchmarks/triton_sweep.py --layouts half 2>&1 | tee "$out/sweep.txt"      # tile sizes vs the copy
# ALiBi: the public call (FlexAttention on CUDA) beside flex compiled with static shapes, and the compile counters;
# no memory subprocesses (each would compile FlexAttention afresh: the first run of this script timed out there)
TORCH_LOGS=recompiles,graph_breaks timeout 100 $py benchmarks/alibi.py --device cuda --threads 1 --no-memory \
  --variants sdpa_no_bias sdpa_prebuilt posenc flex_static --out "$out/alibi-cuda.json" 2>&1 | tee "$out/alibi.txt"
timeout 45 $py benchmarks/alibi.py --device cuda --threads 1 --no-memory --dtype bf16 --mode causal \
  --variants sdpa_no_bias posenc flex_static --out "$out/alibi-cuda-bf16.json" 2>&1 | tee "$out/alibi-bf16.txt"
timeout 90 $py -m posenc lab --device cuda --out /tmp/posenc-lab-gpu 2>&1 | tail -25 | tee "$out/lab.txt"
cp /tmp/posenc-lab-gpu/results.json "$out/lab-results.json" 2>/dev/null
