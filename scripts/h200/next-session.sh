#!/usr/bin/env bash
# The H200 measurements still owed (issues 4, 6, 10), in priority order, in ONE call (device time is the limit:
# a fresh machine + CUDA build costs ~5 of the 30 minutes). Carry .export and .whl; results land in $OUT as they
# come, so a run cut short still returns what it measured. Each step has its own timeout.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site TIMEFORMAT="wall %R s" CUDA_VISIBLE_DEVICES=0
M="python3 -P -m moeslots"
S="--arch qwen3moe --layers 48 --n-embd 2048 --heads 32 --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8 --expert-ff 768 --vocab 151936 --quant q4_k --threads 16"
{
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | grep -v WARN
cd /tmp
echo "== $(date +%T) build"; time $M engine build --cuda --from-source "$R/.export/llama_cpp_python-0.3.36" || exit 1
echo "== $(date +%T) model (Qwen3-30B-A3B shape)"; time $M synth -o /tmp/big.gguf $S --check-tokens 256
echo "== $(date +%T) 1. stats cost at 0 and 64 slots (patch 0005 must have removed the 25 vs 46 tok/s gap)"
timeout 60 $M bench /tmp/big.gguf --slots 0,64 -n 64 --prompt-len 128 --threads 16 --greedy-prompts 0 --no-stats --json "$OUT/nostats.json"
timeout 60 $M bench /tmp/big.gguf --slots 0,64 -n 64 --prompt-len 128 --threads 16 --greedy-prompts 0 --json "$OUT/stats.json"
echo "== $(date +%T) 2. the issue-4 table (mmap experts)"
timeout 150 $M bench /tmp/big.gguf --slots 0,16,32,64,96,128 -n 64 --prompt-len 512 --threads 16 --greedy-prompts 1 --greedy-tokens 64 --json "$OUT/table-mmap.json"
echo "== $(date +%T) 3. best stock baseline: pinned host memory (no mmap)"
timeout 100 $M bench /tmp/big.gguf --slots 0,64 -n 64 --prompt-len 512 --threads 16 --greedy-prompts 0 --no-mmap --json "$OUT/table-pinned.json"
echo "== $(date +%T) 4. MTP (issue 6): NextN synthetic of the same trunk shape, random and const-head"
timeout 90 $M synth -o /tmp/mtp.gguf --arch glm4moe --layers 48 --n-embd 2048 --heads 32 --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8 --expert-ff 768 --ff 4096 --vocab 151936 --quant q4_k --threads 16 --no-check
timeout 120 $M bench /tmp/mtp.gguf --slots 0,64 --mtp 1,2,3 -n 64 --threads 16 --json "$OUT/mtp-random.json"
echo "== $(date +%T) done"
} 2>&1 | tee "$OUT/next-session.txt"
