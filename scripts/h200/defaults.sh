#!/usr/bin/env bash
# What a user gets with no flags on this box, beside llama.cpp b11549's own expert cache (docs/performance.md,
# "What you get with no flags"). From the repository root, with the engine's source in .export/ and llama.cpp's in
# .llb/llamacpp-b11549.tar.xz (scripts/sidebyside/prepare.sh):
#   STAGE=build bash scripts/h200/defaults.sh   # the CUDA engine and llama-bench built side by side (llama-bench
#       niced), the 30B-A3B-shape qwen3moe written; then, once both are built (a calibration beside the compiler
#       measures the compiler), the first-run calibration CALS (3) times in a row at each of CAL_THREADS (16,6),
#       pinned: how far its readings agree. Waits up to WAIT s (540) for the builds.
#   STAGE=run bash scripts/h200/defaults.sh     # scripts/sidebyside/run.sh (its default column: the first-run
#       calibration, then auto, and the default after auto's self-check) over LOADS (pinned) x THREADS (16,6) x
#       ROUTING (random tokens and the donor chat trace), each moeslots row REPS (2) times with the policies taking
#       turns (a cell moves 5-10 % between single runs on this box: "within 5 % of the best" needs the medians),
#       detached; returns after LIMIT s (540) with the table so far. STAGE=collect waits for the rest.
#   LLB=0: no llama-bench (the build stage for the extras and the scripts alone; the run stage needs it).
#   EXTRAS (comma-separated, off by default), each run alone on the machine, its output in $OUT/defaults-*.txt:
#       check: scripts/h200/policy-check.sh (the engine's exactness on this GPU: the tier's op tests, every policy's
#           logits), at the build stage as soon as the engine is built, beside llama-bench's build (nothing in it is
#           timed), else at the run stage before the harness;
#       fetchlayer, app, settle: at the build stage, after the builds (in place of the calibrations when CALS=0):
#           scripts/h200/fetch_layer.cu (the tier's fixed GPU time a layer); scripts/open_thread_check.py on the
#           big model at 15 threads (a first-run calibration's thread beside the replies');
#           scripts/h200/settle.py for SETTLE s (120) at CAL_THREADS (6,16 here), within WAIT; handoff, share,
#           worker, residue: at the run stage, before the harness starts, scripts/h200/handoff.cu and
#           share_cpu.cpp at HANDOFF_THREADS (15,6),
#           worker: the fetch and join ops on CUDA (fetch-op.sh) and scripts/h200/worker_speed.py (patch 0010's
#           worker against fetch and the split graph) at THREADS, 64 and 32 slots, and
#           tier_residue.py at 16 threads, 64 slots, RESIDUE_ROUNDS (10) rounds of static paired before and after a
#           tier; each at most 120 s (check: 200 s), started only while LIMIT - 240 s is still ahead by 20-60 s.
set -u
. "$(dirname "$0")/common.sh"
STAGE=${STAGE:-build}; WAIT=${WAIT:-540}; LIMIT=${LIMIT:-540}; N=${N:-64}; REPS=${REPS:-2}
ROUTING=${ROUTING:-random,$R/profiles/data/moeslots-donor-qwen3-30b-a3b-chat-sampled.npz}
L=/tmp/llb; START=$(date +%s)
{
if [ "$STAGE" = build ]; then
  echo "== $(date +%T) machine: $(nproc) cores, $(nvidia-smi --query-gpu=name,memory.free --format=csv,noheader)"
  install_and_build
  [ "${LLB:-1}" = 0 ] || [ -x $L/build/bin/llama-bench ] || setsid nohup nice -n 10 bash -c "bash \
      $R/scripts/sidebyside/build.sh \
      $R/.llb/llamacpp-b11549.tar.xz $L cuda > $B/llb-build.txt 2>&1; echo \"llb rc \$?\" >> $B/llb-build.txt" \
      > /dev/null 2>&1 &
  [ -f /tmp/big.gguf ] || { ( cd /tmp && time $M synth -o /tmp/big.part.gguf $BIGFLAGS > $B/synth-big.txt 2>&1 \
      && mv /tmp/big.part.gguf /tmp/big.gguf ); tail -2 $B/synth-big.txt; }
  while [ $(( $(date +%s) - START )) -lt "$WAIT" ] && ! grep -q "build rc" $B/build.txt 2>/dev/null; do sleep 5; done
  echo "== $(date +%T) after $(( $(date +%s) - START )) s:"; tail -2 $B/build.txt 2>/dev/null
  # the engine's exactness on this GPU while llama-bench still builds (correctness only: nothing here is timed)
  case ",${EXTRAS:-}," in *,check,*)
    [ -f /tmp/site/.moeslots-cuda ] && [ ! -f $B/check.done ] && { timeout --foreground 200 bash \
        scripts/h200/policy-check.sh 2>&1 | grep -E "^(PASS|FAIL)|policy-check:" | tee $B/policy-check.txt; \
        touch $B/check.done; } ;;
  esac
  # (a calibration beside the compiler measures the compiler: llama-bench's build ends first)
  while [ "${LLB:-1}" != 0 ] && [ $(( $(date +%s) - START )) -lt "$WAIT" ] && [ ! -x $L/build/bin/llama-bench ] \
        && ! grep -q "llb rc" $B/llb-build.txt 2>/dev/null; do sleep 5; done
  if [ -f /tmp/site/.moeslots-cuda ] && [ -f /tmp/big.gguf ] && ! pgrep -f "cmake --build" > /dev/null; then
    # how far first-run calibrations in a row agree: CALS of them at each of CAL_THREADS, experts pinned
    [ "${CALS:-3}" -gt 0 ] && (cd /tmp && timeout $(( WAIT + 60 - ($(date +%s) - START) )) python3 -P \
        $R/scripts/h200/layer_trace.py /tmp/big.gguf ${CAL_THREADS:-16,6} - 48 ${CALS:-3} 2>&1 \
        | grep -v "^llama\|^load\|^print_info" | tee $B/calibrations.txt)
    # whether the CPU's rate settles after the load, under the calibration's plan and a shuffled one
    # (--foreground: a stage stopped at its limit takes the reading with it, nothing is left holding the GPU)
    # the tier's own fixed GPU time a layer (needs only nvcc) and a first-run calibration's thread beside the
    # replies' on the big model (the box has no Textual: the app itself is measured elsewhere), each alone
    case ",${EXTRAS:-}," in *,fetchlayer,*)
      G=$R/.export/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml
      /usr/local/cuda/bin/nvcc -std=c++17 -O3 -arch=sm_90 -I$G/include -I$G/src -I$G/src/ggml-cuda \
          $R/scripts/h200/fetch_layer.cu -o /tmp/fetch_layer -Xlinker --unresolved-symbols=ignore-all \
          && timeout 120 /tmp/fetch_layer | tee $B/fetch-layer.txt ;;
    esac
    case ",${EXTRAS:-}," in *,app,*)
      (cd /tmp && timeout 300 python3 -P $R/scripts/open_thread_check.py 15 3 --model=/tmp/big.gguf \
          --profile=$R/profiles/data/moeslots-donor-qwen3-30b-a3b-chat-sampled.npz --slots=64 2>&1 \
          | tee $B/open-thread-check.txt) ;;
    esac
    case ",${EXTRAS:-}," in *,settle,*)
      (cd /tmp && timeout --foreground $(( WAIT + 60 - ($(date +%s) - START) )) python3 -P \
          $R/scripts/h200/settle.py /tmp/big.gguf ${CAL_THREADS:-6,16} ${SETTLE:-120} 64 2>&1 \
          | grep -v "^llama\|^load_\|^load:\|^print_info\|^ggml_cuda\|^  Device" | tee $B/settle.txt) ;;
    esac
  fi
  tail -3 $B/llb-build.txt 2>/dev/null
else
  while ! grep -q "llb rc" $B/llb-build.txt 2>/dev/null || ! grep -q "build rc" $B/build.txt 2>/dev/null; do
    [ $(( $(date +%s) - START )) -gt "$LIMIT" ] && { echo "builds not done after $LIMIT s"; break; }
    sleep 5
  done
  if [ "$STAGE" = run ] && [ ! -f $B/sbs.started ] && [ -x $L/build/bin/llama-bench ]; then
    # engine v3's per-layer cost, both sides, and the tier's residue, before the harness (alone on the machine):
    # each at most 120 s and never past LIMIT - 240 s (the harness starts in this call), each once (a rerun of the
    # stage skips what is done)
    left() { local t=$(( LIMIT - 240 - ($(date +%s) - START) )); [ $t -gt 120 ] && t=120; echo $t; }
    PATH=$PATH:/usr/local/cuda/bin
    case ",${EXTRAS:-}," in *,check,*)
      [ -f $B/check.done ] || [ $(left) -lt 60 ] || { timeout --foreground 200 bash scripts/h200/policy-check.sh 2>&1 \
          | grep -E "^(PASS|FAIL)|policy-check:" | tee $B/policy-check.txt; touch $B/check.done; } ;;
    esac
    case ",${EXTRAS:-}," in *,handoff,*)
      [ -f $B/handoff.done ] || [ $(left) -lt 20 ] || { nvcc -O2 -arch=sm_90 -o /tmp/handoff \
          $R/scripts/h200/handoff.cu && timeout --foreground $(left) /tmp/handoff ${HANDOFF_THREADS:-15,6} 48 100 2>&1 \
          | tee $B/handoff.txt; touch $B/handoff.done; } ;;
    esac
    case ",${EXTRAS:-}," in *,share,*)
      PKG=$(python3 -c "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).resolve().parent)")
      [ -f $B/share.done ] || [ $(left) -lt 20 ] || { g++ -O2 -std=c++17 $R/scripts/h200/share_cpu.cpp \
          -I$PKG/../include -L$PKG/lib -lggml -lggml-base -lggml-cpu -Wl,-rpath,$PKG/lib -o /tmp/share_cpu \
          && timeout --foreground $(left) /tmp/share_cpu ${HANDOFF_THREADS:-15,6} 48 16 20 2>&1 \
          | tee $B/share-cpu.txt; touch $B/share.done; } ;;
    esac
    case ",${EXTRAS:-}," in *,worker,*)
      [ -f $B/worker.done ] || [ $(left) -lt 60 ] || { bash scripts/h200/fetch-op.sh > /dev/null 2>&1; \
          grep -E "FAIL|passed" $OUT/fetch-op.txt | tee $B/worker-ops.txt; (cd /tmp && timeout --foreground $(left) \
          python3 -P $R/scripts/h200/worker_speed.py /tmp/big.gguf ${THREADS:-16,6} 64,32 2 40 2>&1 \
          | grep --line-buffered -v "^llama\|^load_\|^load:\|^print_info\|^ggml_cuda\|^  Device" \
          | tee $B/worker-speed.txt); touch $B/worker.done; } ;;
    esac
    case ",${EXTRAS:-}," in *,residue,*)
      [ -f $B/residue.done ] || [ $(left) -lt 60 ] || { (cd /tmp && timeout --foreground $(left) python3 -P \
          $R/scripts/h200/tier_residue.py /tmp/big.gguf 16 64 ${RESIDUE_ROUNDS:-10} 2>&1 \
          | grep -v "^llama\|^load_\|^load:\|^print_info\|^ggml_cuda\|^  Device" | tee $B/tier-residue.txt); \
          touch $B/residue.done; } ;;
    esac
    touch $B/sbs.started
    setsid nohup bash -c "PYTHON=python3 bash scripts/sidebyside/run.sh /tmp/big.gguf $L/build/bin/llama-bench \
        --out /tmp/sbs --routing '$ROUTING' -n $N -r $REPS --threads ${THREADS:-16,6} --load ${LOADS:-pinned} \
        --policies ${POLICIES:-default,static,fetch,fetch-split,hybrid} > $B/sbs.txt 2>&1; \
        echo \"sbs rc \$?\" >> $B/sbs.txt" > /dev/null 2>&1 &
  fi
  while ! grep -q "sbs rc" $B/sbs.txt 2>/dev/null && [ $(( $(date +%s) - START )) -lt "$LIMIT" ]; do sleep 5; done
  tail -30 $B/sbs.txt
  grep -q "sbs rc" $B/sbs.txt || python3 -P scripts/sidebyside/table.py /tmp/sbs
  cp /tmp/sbs/sidebyside.md /tmp/sbs/sidebyside.json "$OUT/" 2>/dev/null
  tar czf "$OUT/sbs-raw.tgz" -C /tmp/sbs raw manifest.jsonl facts.json config 2>/dev/null
fi
tar czf "$OUT/logs.tgz" -C $B . 2>/dev/null
} 2>&1 | tee "$OUT/defaults-$STAGE.txt"
