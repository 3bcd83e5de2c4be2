#!/usr/bin/env bash
# The routing donor's traces replayed through the engine on the H200 box: the 30B-A3B-shape synthetic
# glm4moe + NextN of scripts/h200/common.sh ($G: 48 layers x 128 experts, 8 used, Q4_K) routed as the donor routed,
# static vs re-pick vs hybrid at 10/25/50/75 % slots, plans out of sample (the plan from the greedy trace, the
# replayed rows from the sampled one), beside the simulator; then decode tok/s per slot count.
#
#   STEPS=calib bash scripts/h200/measure.sh     # first: installs the CUDA engine into /tmp/site, synth /tmp/mtp.gguf
#   bash scripts/train/donor_h200.sh             # then this (OUT=/tmp/out: donor-*.json, donor.txt)
#
# Not run yet (no GPU time in the session that wrote it); a CPU smoke run of the same commands on a narrow model of
# the same expert topology is in docs/profiles.md.
set -u
. "$(dirname "$0")/../h200/common.sh"
D=$R/profiles/data/moeslots-donor-qwen3-30b-a3b
[ -f /tmp/mtp.gguf ] || (cd /tmp && $M synth -o /tmp/mtp.part.gguf $G && mv /tmp/mtp.part.gguf /tmp/mtp.gguf)
cd /tmp
{
for w in code chat prose; do
  echo "== $(date +%T) repick $w"
  time $M bench repick /tmp/mtp.gguf --every 0,16 --policy static,hybrid --slots 13,32,64,96 \
    --replay "$D-$w-sampled.npz" --profile-from "$D-$w-greedy.npz" -n 512 --threads 16 --no-mmap \
    --json "$B/donor-repick-$w.json"
done
echo "== $(date +%T) decode"
time $M bench decode /tmp/mtp.gguf --slots 0,13,32,64,96 -n 128 --threads 16 --no-mmap \
  --replay "$D-chat-sampled.npz" --json "$B/donor-decode-chat.json"
} 2>&1 | tee "$OUT/donor.txt"
cp $B/donor-*.json "$OUT/" 2>/dev/null
