#!/usr/bin/env bash
# One prepared GPU session (run by hand on a CUDA machine, e.g. through the device tool):
# the CUDA tests, then the GPU benchmarks, each bounded in time. Results go to $OUT (default ./out).
# The package is put on the path through a shim, so nothing needs installing there.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
REPO=$(cd "$(dirname "$0")/.." && pwd)
SHIM=$(mktemp -d); mkdir -p "$SHIM/exactformer"
cp "$REPO/exactformer/__init__.py" "$SHIM/exactformer/__init__.py"
for p in constructions precision verify; do ln -s "$REPO/$p" "$SHIM/exactformer/$p"; done
export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$REPO"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
echo "== CUDA tests"; timeout 240 python3 -m pytest -q -m cuda -p no:cacheprovider tests 2>&1 | tail -15 | tee "$OUT/cuda_tests.txt"
echo "== Index Lookup, random code, n = 2^20, certify on the GPU"
timeout 240 python3 benchmarks/bench_index_lookup.py --case random-certify --device cuda --n 1048576 2>&1 | tail -3 | tee "$OUT/il_random_2p20.json"
echo "== Index Lookup, sampled verification on the GPU, n = 2^16"
timeout 120 python3 benchmarks/bench_index_lookup.py --case sample --device cuda --n 65536 --samples 20000 2>&1 | tail -3 | tee "$OUT/il_sample_2p16.json"
echo "== k-hop, n = 2^12, k = 16, sampled verification on the GPU (the goal: >= 200 inputs/s)"
timeout 180 python3 benchmarks/bench_sample.py --case k-hop --device cuda --samples 256 --repeats 1 2>&1 | tail -12 | tee "$OUT/khop_sample_cuda.json"
echo "== fixed-point softmax on the GPU"
timeout 90 python3 benchmarks/bench_precision_softmax.py --device cuda --repeat 2 2>&1 | tail -30 | tee "$OUT/softmax_cuda.txt"
echo "== to_torch on the GPU: Index Lookup and k-hop (k = 16) at N = 2^16, one input (the goal on 2 CPU cores: <= 2 GB, <= 2x the dense FLOP time)"
timeout 300 python3 benchmarks/bench_torch_scale.py --case module --device cuda --repeats 1 2>&1 | tail -45 | tee "$OUT/torch_module_cuda.json"
echo "== sampled verification on the GPU, N = 4096: the exact executor's torch backend and the float32 torch module, same inputs"
timeout 240 python3 benchmarks/bench_torch_scale.py --case sampling --device cuda --repeats 1 --samples 2000 200 8 2>&1 | tail -60 | tee "$OUT/sampling_cuda.json"
