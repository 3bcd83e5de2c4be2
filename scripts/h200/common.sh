# Sourced by the H200 scripts (measure.sh, cache-bench.sh, app-speed.sh) from the repository root: where results go
# ($OUT), how moeslots runs there ($M: the package and engine installed into /tmp/site), the 30B-A3B-shape synthetic
# model's flags ($G: glm4moe, 48 layers, 128 experts, 8 used, Q4_K, NextN), the bundled model and its traces.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site TIMEFORMAT="wall %R s" CUDA_VISIBLE_DEVICES=0 XDG_CONFIG_HOME=/tmp/cfg
M="python3 -P -m moeslots"
G="--arch glm4moe --layers 48 --n-embd 2048 --heads 32 --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8 --expert-ff 768 --ff 4096 --vocab 151936 --quant q4_k --threads 16 --no-check"
# the 30B-A3B shape as qwen3moe (no NextN): the model of the side-by-side table in shared/h200-box.md
BIGFLAGS="--arch qwen3moe --layers 48 --n-embd 2048 --heads 32 --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8 --expert-ff 768 --vocab 151936 --quant q4_k --threads 16 --no-check"
B=/tmp/bench; mkdir -p $B
P=$R/profiles/data/moeslots-tiny-glm4moe
TINY=$R/engine/assets/moeslots-tiny-glm4moe.gguf
pack() { tar czf "$OUT/bench.tgz" -C $B . ; }
# moeslots and the wheels this box lacks into /tmp/site, then the CUDA engine built from .export/ in the background
# (its log $B/build.txt ends with "build rc N"; /tmp/site/.moeslots-cuda marks a built one, so a rerun skips it)
install_and_build() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | grep -v WARN
  [ -f /tmp/site/.moeslots-cuda ] || setsid nohup bash -c "cd /tmp && $M engine build --cuda --from-source \
      $R/.export/llama_cpp_python-0.3.36 --cmake-arg=-DGGML_CUDA_FA=OFF > $B/build.txt 2>&1; \
      echo \"build rc \$?\" >> $B/build.txt; grep -q 'build rc 0' $B/build.txt && touch /tmp/site/.moeslots-cuda" \
      > /dev/null 2>&1 &
}
