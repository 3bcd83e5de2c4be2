#!/usr/bin/env bash
# The static expert cache on the H200 box: decode and prompt speed at 0..128 of 128 slots on the 30B-A3B shape
# (qwen3moe, 48 layers, 128 experts, 8 used, Q4_K; the model's router on random tokens), experts mapped and pinned,
# the cost of the routing stats, and greedy text against 0 slots — the first table of docs/performance.md.
# moeslots and the CUDA engine installed (scripts/h200/first-run.sh or measure.sh install them). From the
# repository root:   bash scripts/h200/cache-bench.sh
# $OUT: cache-bench.txt (log), bench.tgz (the JSONs).
set -u
. "$(dirname "$0")/common.sh"
BIG=/tmp/big.gguf
{
echo "== $(date +%T) machine"; nproc; nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader
cd /tmp
$M doctor | head -3
[ -f $BIG ] || { echo "== $(date +%T) model"; time $M synth -o $BIG --arch qwen3moe --layers 48 --n-embd 2048 \
  --heads 32 --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8 --expert-ff 768 --vocab 151936 --quant q4_k \
  --threads 16 --check-tokens 256; }
echo "== $(date +%T) decode at each slot count, experts mapped (mmap)"
$M bench decode $BIG --slots 0,16,32,64,96,128 -n 64 --prompt-len 512 --threads 16 --json $B/decode-mmap.json; pack
echo "== $(date +%T) experts in pinned host memory"
$M bench decode $BIG --slots 0,64 -n 64 --prompt-len 512 --threads 16 --no-mmap --json $B/decode-pinned.json; pack
echo "== $(date +%T) routing stats off (their cost)"
$M bench decode $BIG --slots 0,64 -n 64 --prompt-len 128 --threads 16 --no-stats --json $B/decode-nostats.json; pack
echo "== $(date +%T) greedy text against 0 slots"
$M bench compare $BIG --slots 64 --prompts 4 --tokens 256 --threads 16 --json $B/compare.json; pack
echo "== $(date +%T) done"
} 2>&1 | tee "$OUT/cache-bench.txt"
