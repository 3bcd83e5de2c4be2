#!/usr/bin/env bash
# One H200 call: the CUDA engine build (CPU) and the bundled model's training (GPU) run side by side, the big
# synthetic model is written meanwhile; then the issue-4 measurements. Carry .export and .whl.
# $OUT: log, train.tgz.part-* (weights, tokenizer, held-out corpus, training log), bench.tgz (JSON).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(pwd)
MIN=${TRAIN_MINUTES:-5}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site TIMEFORMAT="wall %R s" CUDA_VISIBLE_DEVICES=0
M="python3 -P -m moeslots"
S="--arch qwen3moe --layers 48 --n-embd 2048 --heads 32 --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8 --expert-ff 768 --vocab 151936 --quant q4_k --threads 16"
B=/tmp/bench; mkdir -p $B
{
echo "== $(date +%T) machine"; nproc; nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader
python3 -c "import torch, tokenizers; print('torch', torch.__version__, 'tokenizers', tokenizers.__version__)"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | grep -v WARN
( cd /tmp && time $M engine build --cuda --from-source "$R/.export/llama_cpp_python-0.3.36" > $B/build.txt 2>&1; echo "build rc $?" >> $B/build.txt ) &
BUILD=$!
( cd /tmp && time $M synth -o /tmp/big.gguf $S --no-check > $B/synth.txt 2>&1; echo "synth rc $?" >> $B/synth.txt ) &
SYN=$!
echo "== $(date +%T) train ($MIN min)"
time scripts/train/run.sh /tmp/train "$MIN" train-only 2>&1 | grep -v "^step [0-9]*[1-9]00 \|^step [0-9]*50 " 
( cd /tmp/train && tar czf /tmp/train.tgz tokenizer.json weights.pt train.log corpus/manifest.json corpus/heldout ) \
  && split -b 15m /tmp/train.tgz "$OUT/train.tgz.part-" && ls -la "$OUT"
echo "== $(date +%T) waiting for build and synth"; wait $BUILD; cat $B/build.txt | tail -4; wait $SYN; tail -3 $B/synth.txt
[ -f /tmp/big.gguf ] || { cd /tmp && time $M synth -o /tmp/big.gguf $S --no-check; cd "$R"; }
cd /tmp
$M doctor | head -3
echo "== $(date +%T) 1. stats cost at 0 and 64 slots"
timeout 60 $M bench /tmp/big.gguf --slots 0,64 -n 64 --prompt-len 128 --threads 16 --greedy-prompts 0 --no-stats --json $B/nostats.json
timeout 60 $M bench /tmp/big.gguf --slots 0,64 -n 64 --prompt-len 128 --threads 16 --greedy-prompts 0 --json $B/stats.json
tar czf "$OUT/bench.tgz" -C $B .
echo "== $(date +%T) 2. the issue-4 table (mmap experts)"
timeout 170 $M bench /tmp/big.gguf --slots 0,16,32,64,96,128 -n 64 --prompt-len 512 --threads 16 --greedy-prompts 4 --greedy-tokens 256 --greedy-slots 64 --json $B/table-mmap.json
tar czf "$OUT/bench.tgz" -C $B .
echo "== $(date +%T) 3. stock baseline in pinned host memory (no mmap)"
timeout 80 $M bench /tmp/big.gguf --slots 0,64 -n 64 --prompt-len 512 --threads 16 --greedy-prompts 0 --no-mmap --json $B/table-pinned.json
tar czf "$OUT/bench.tgz" -C $B .
echo "== $(date +%T) done"
} 2>&1 | tee "$OUT/train-and-bench.txt"
