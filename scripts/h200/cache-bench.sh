#!/usr/bin/env bash
# Expert-cache benchmark on the H200 box (one call: build, model, benches). Carry .export and .whl.
# Writes progressively to $OUT so a run cut short still returns what it measured.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site TIMEFORMAT="wall %R s" CUDA_VISIBLE_DEVICES=0
M="python3 -P -m moeslots"
{
echo "== $(date +%T) machine"; nproc; nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | grep -v WARN
cd /tmp
echo "== $(date +%T) build"; time $M engine build --cuda --from-source "$R/.export/llama_cpp_python-0.3.36" || exit 1
$M doctor | head -3
echo "== $(date +%T) model"
time $M synth -o /tmp/big.gguf --arch qwen3moe --layers 48 --n-embd 2048 --heads 32 --kv-heads 4 --head-dim 128 \
  --experts 128 --experts-used 8 --expert-ff 768 --vocab 151936 --quant q4_k --threads 16 --check-tokens 256
echo "== $(date +%T) bench: mmap (CPU_Mapped experts), stats on"
timeout 130 $M bench /tmp/big.gguf --slots 0,16,32,64,96,128 -n 64 --prompt-len 512 --threads 16 \
  --greedy-prompts 2 --greedy-tokens 32 --json "$OUT/bench-mmap.json"
echo "== $(date +%T) bench: stats off"
timeout 45 $M bench /tmp/big.gguf --slots 0,64 -n 64 --prompt-len 512 --threads 16 --greedy-prompts 0 --no-stats \
  --json "$OUT/bench-nostats.json"
echo "== $(date +%T) bench: no mmap (pinned CUDA_Host experts, the best stock CPU placement)"
timeout 60 $M bench /tmp/big.gguf --slots 0,64 -n 64 --prompt-len 512 --threads 16 --greedy-prompts 0 --no-mmap \
  --json "$OUT/bench-pinned.json"
echo "== $(date +%T) done"
} 2>&1 | tee "$OUT/cache-bench.txt"
