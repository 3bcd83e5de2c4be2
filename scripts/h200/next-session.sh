#!/usr/bin/env bash
# What the H200 still owes (issues 4/6/10), in priority order, in ONE call (device time is the limit: a fresh
# machine + CUDA build is ~4-5 of the 30 minutes). Carry .export and .whl. Each step has its own timeout and
# results land in $OUT as they come.
#   1. the <= 4-token fix: the bundled model at 16 slots on CUDA (crashed before), slots-vs-0 logit distance,
#      MTP on the trained model at 16 slots;
#   2. issue 7: patch 0008 (host chain overlapping the GPU chain) on vs off, decode and prompt, with MTP;
#   3. stats on/off at 0 slots (the first measurement was confounded by a cold start);
#   4. static vs re-pick under replayed real (code, chat) and uniform routing (what time is left).
# A second call then decides where the MTP head lives (issue 6):
#   MTP=1 REPICK=1 OVERLAP=1 REPICK_SLOTS=32,64 MTP_HEADS="host gpu slots" bash scripts/h200/mtp-repick.sh
set -u
cd "$(dirname "$0")/../.."
MTP=0 ASYNC=1 REPICK=1 DIAG=1 STATS=1 REPICK_SLOTS=${REPICK_SLOTS:-19,32,64} REPICK_S=${REPICK_S:-200} PINNED_S=${PINNED_S:-100} \
  bash scripts/h200/mtp-repick.sh
