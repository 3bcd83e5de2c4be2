#!/usr/bin/env bash
# Walking-skeleton check on the H200 box (no internet): build the CUDA engine from the exported source,
# doctor, and greedy generation with experts in host memory on a small and a Qwen3-30B-A3B-shaped model.
# Run from the repo root with .export/ (moeslots engine build --export-source .export/llama_cpp_python-0.3.36)
# and .whl/ (diskcache, gguf wheels) carried. Writes its logs to $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site TIMEFORMAT="wall %R s"
log() { echo "== $(date +%T) $*"; }
{
log "machine"; nproc; free -g | head -2; nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.free --format=csv
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . || exit 1
log "engine build --cuda (cold: no build dir)"
time python3 -P -m moeslots engine build --cuda --from-source .export/llama_cpp_python-0.3.36 || exit 1
log "engine build --cuda again (nothing changed)"
time python3 -P -m moeslots engine build --cuda --from-source .export/llama_cpp_python-0.3.36
log "doctor"; python3 -P -m moeslots doctor
log "small synthetic glm4moe+NextN, experts in host memory, rest on CUDA0"
python3 -P -m moeslots synth -o /tmp/small.gguf --layers 4 --n-embd 256 --experts 32 --experts-used 4 --check-tokens 256
MOESLOTS_VERBOSE=1 python3 -P -m moeslots generate /tmp/small.gguf -p "The expert cache" -n 64 2>/tmp/small-gen.log
grep -E "model buffer size|offloaded|override|tok/s" /tmp/small-gen.log
log "Qwen3-30B-A3B shape, Q4_K blocks written directly"
df -h /tmp | tail -1
time python3 -P -m moeslots synth -o /tmp/big.gguf --arch qwen3moe --layers 48 \
  --n-embd 2048 --heads 32 --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8 --expert-ff 768 \
  --vocab 151936 --quant q4_k --threads 16 --check-tokens 256
log "generate big: experts in host memory (mmap), 16 threads"
for i in 1 2; do MOESLOTS_VERBOSE=1 python3 -P -m moeslots generate /tmp/big.gguf -p "The expert cache" -n 128 --threads 16 2>/tmp/big-gen.log >/dev/null; grep -E "model buffer size|tok/s" /tmp/big-gen.log; done
log "generate big: everything on the GPU (reference)"
python3 -P -m moeslots generate /tmp/big.gguf -p "The expert cache" -n 128 --threads 16 --experts-on-gpu 2>&1 >/dev/null | tail -1
log "done"
} 2>&1 | tee "$OUT/skeleton.txt"
cp ~/.cache/moeslots/build.log "$OUT/cuda-build.log" 2>/dev/null; gzip -f "$OUT/cuda-build.log"
