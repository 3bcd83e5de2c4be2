#!/usr/bin/env bash
# Reproduces the analysis in docs/profiles.md on a trained model (written for the bundled moeslots-tiny-glm4moe):
# records two held-out *test* traces that differ from the bundled *train* profiles, then reports skew, per-layer
# coverage and code-vs-chat overlap, and simulates static plans trained on code / chat / merged against the
# dynamic policies at 25 % and 50 % of the experts.
#
# Usage (repo root, venv active):
#   scripts/profiles-analysis.sh MODEL.gguf OUTDIR [TRAIN_PREFIX]
#   e.g. scripts/profiles-analysis.sh engine/assets/moeslots-tiny-glm4moe.gguf /tmp/pa
# TRAIN_PREFIX: the train profiles are TRAIN_PREFIX-{code,chat,merged}.csv (default: the bundled ones,
# profiles/data/moeslots-tiny-glm4moe). Env: TEMP (sampling temperature, default 0.7 as the train traces),
# N (decode-token cap per prompt, default 200). Deterministic: fixed prompts and seeds. ~30 s on 2 cores.
#
# Test traces (never the train prompts):
#   test-code  raw code completion (no chat template): the model continues 12 beginnings of stdlib-style modules
#              written for this script (the train code profile is chat answers to "Write `f` from the `m` module.")
#   test-chat  40 chat questions in the corpus' style ("What does `x` do?", "What is the `m` module for?",
#              "Explain ... in Python.") about names that are not among the held-out questions of the train profiles
set -euo pipefail
MODEL=$1; OUT=$2; TRAIN=${3:-profiles/data/moeslots-tiny-glm4moe}
TEMP=${TEMP:-0.7}; N=${N:-200}
M="python -m moeslots"
for w in code chat merged; do [ -f "$TRAIN-$w.csv" ] || { echo "missing train profile $TRAIN-$w.csv" >&2; exit 2; }; done
mkdir -p "$OUT/prompts-test-code" "$OUT/prompts-test-chat"
rm -f "$OUT"/prompts-test-code/* "$OUT"/prompts-test-chat/*

# --- test-code prompts: one file per snippet, snippets separated by "#%%" lines ---------------------------------
awk -v d="$OUT/prompts-test-code" 'BEGIN{n=0; f=sprintf("%s/%02d.py", d, n)} /^#%%$/{close(f); n++; f=sprintf("%s/%02d.py", d, n); next} {print > f}' <<'EOF'
"""Utilities for reading simple key = value configuration files."""

import os
import re

_LINE = re.compile(r'^\s*(?P<key>[A-Za-z_][\w.]*)\s*=\s*(?P<value>.*)$')


def read_config(path, defaults=None):
    """Return a dict of the key = value pairs in *path*.

    Blank lines and lines starting with '#' are ignored.  Values from
    *defaults* are used for keys that the file does not set.
    """
#%%
"""Simple ring buffer."""

__all__ = ['RingBuffer']


class RingBuffer:
    """A fixed-size buffer that overwrites its oldest items."""

    def __init__(self, size):
        if size <= 0:
            raise ValueError("size must be positive")
        self._data = [None] * size
        self._start = 0
        self._len = 0

    def __len__(self):
        return self._len

    def append(self, item):
#%%
import sys
import time


def retry(func, attempts=3, delay=0.5, exceptions=(OSError,)):
    """Call func() until it succeeds or *attempts* calls have failed.

    The delay doubles after each failure.  The last exception is
    re-raised when every attempt failed.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
#%%
"""Parse and format durations such as '1h30m' or '45s'."""

_UNITS = {'d': 86400, 'h': 3600, 'm': 60, 's': 1}


def parse_duration(text):
    """Return the number of seconds in *text*, e.g. parse_duration('1h30m') == 5400."""
    total = 0
    number = ''
    for ch in text.strip():
#%%
import os
import stat


def walk_files(top, suffixes=None, followlinks=False):
    """Yield the paths of regular files below *top*.

    If *suffixes* is given, only names ending with one of them are yielded.
    """
    for dirpath, dirnames, filenames in os.walk(top, followlinks=followlinks):
#%%
class Stack:
    """Last-in, first-out container."""

    def __init__(self, iterable=()):
        self._items = list(iterable)

    def push(self, item):
        """Put *item* on top of the stack."""
        self._items.append(item)

    def pop(self):
        """Remove and return the top item; raise IndexError if empty."""
#%%
"""Helpers for comma-separated files with a header row."""

import csv
import io


def read_rows(fp, delimiter=','):
    """Return a list of dicts, one per data row of the open file *fp*."""
    reader = csv.DictReader(fp, delimiter=delimiter)
#%%
import threading


class Counter:
    """A thread-safe counter."""

    def __init__(self, value=0):
        self._value = value
        self._lock = threading.Lock()

    def increment(self, n=1):
        with self._lock:
#%%
def chunked(iterable, size):
    """Split *iterable* into lists of at most *size* items.

    >>> list(chunked(range(5), 2))
    [[0, 1], [2, 3], [4]]
    """
    if size < 1:
        raise ValueError('size must be >= 1')
#%%
"""A minimal command dispatcher for interactive tools."""

import shlex


class Dispatcher:
    def __init__(self):
        self.commands = {}

    def register(self, name, func, help=''):
        """Register *func* as the handler of the command *name*."""
        if name in self.commands:
            raise KeyError('command %r already registered' % name)
#%%
import hashlib
import os


def file_digest(path, algorithm='sha256', blocksize=65536):
    """Return the hex digest of the contents of the file *path*."""
    h = hashlib.new(algorithm)
    with open(path, 'rb') as f:
#%%
"""Escape and unescape text for a tiny markup language."""

_ESCAPES = {
    '&': '&amp;',
    '<': '&lt;',
    '>': '&gt;',
}


def escape(text):
    """Replace the special characters of *text* with entities."""
EOF

# --- test-chat prompts: one question per file --------------------------------------------------------------------
i=0
while IFS= read -r q; do printf '%s' "$q" > "$OUT/prompts-test-chat/$(printf %02d $i).txt"; i=$((i + 1)); done <<'EOF'
What does `json.dumps` do?
What does `os.path.join` do?
What does `itertools.chain` do?
What does `functools.lru_cache` do?
What does `re.sub` do?
What does `collections.OrderedDict.move_to_end` do?
What does `string.Template.substitute` do?
What does `shlex.split` do?
What does `glob.glob` do?
What does `fnmatch.fnmatch` do?
What does `base64.b64encode` do?
What does `copy.deepcopy` do?
What does `heapq.merge` do?
What does `textwrap.dedent` do?
What does `pprint.pformat` do?
What does `tempfile.mkdtemp` do?
What does `shutil.rmtree` do?
What does `datetime.timedelta.total_seconds` do?
What does `argparse.ArgumentParser.add_argument` do?
What does `subprocess.run` do?
What does `pathlib.Path.glob` do?
What does `logging.getLogger` do?
What does `unittest.TestCase.assertEqual` do?
What does `threading.Thread.join` do?
What does `queue.Queue.put` do?
What does `urllib.parse.urlsplit` do?
What does `email.utils.parseaddr` do?
What does `zipfile.ZipFile.extractall` do?
What does `tarfile.open` do?
What does `csv.DictReader` do?
What does `configparser.ConfigParser.read` do?
What does `statistics.median` do?
What is the `abc` module for?
What is the `weakref` module for?
What is the `dataclasses` module for?
What is the `contextvars` module for?
Explain generators in Python.
Explain decorators in Python.
Explain context managers in Python.
Explain exceptions in Python.
EOF

# --- record the test traces --------------------------------------------------------------------------------------
# test-code: the app's recorder with the chat template bypassed (raw completion of the code prefix)
python - "$MODEL" "$OUT/test-code.csv" "$TEMP" "$N" "$OUT"/prompts-test-code/*.py <<'EOF'
import sys
from pathlib import Path

import moeslots.engine.runtime.engine as eng
from moeslots.engine.runtime.record import record

eng.render_chat = lambda model, messages: "".join(m.content for m in messages)   # raw completion, no template
model, out, temp, n, files = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
t = record(model, [Path(f) for f in files], out, n_decode=n, temperature=temp, seed=21)
print(f"wrote {out}: {t.n_rows} rows, {t.decode_tokens} decode tokens, {len(files)} prompts (raw completion)")
EOF
$M record "$MODEL" $(printf -- '--prompt-file %s ' "$OUT"/prompts-test-chat/*.txt) -n "$N" \
  --temperature "$TEMP" --seed 22 -o "$OUT/test-chat.csv"

# --- skew, coverage, overlap -------------------------------------------------------------------------------------
E=$(grep -o 'n_expert=[0-9]*' "$OUT/test-code.csv" | head -1 | cut -d= -f2)
S1=$((E / 4)); S2=$((E / 2))
for p in "$TRAIN-code.csv" "$TRAIN-chat.csv" "$OUT/test-code.csv" "$OUT/test-chat.csv"; do
  $M profile show "$p" --slots "$S1" --width 32 | sed -n 1,5p
done
$M profile show "$TRAIN-code.csv" --slots "$S1" --against "$TRAIN-chat.csv" --width 32
$M profile show "$TRAIN-code.csv" --slots "$S2" --against "$TRAIN-chat.csv" --width 32 | sed -n 4,5p
# per-layer numbers over the MoE layers only (`profile show`'s skew also counts the rows of layers without
# routing, e.g. a dense lead layer or a NextN block, as zero-pick pairs), and a locality check: LRU and reelect on
# the same test tokens in a shuffled order (seed 0) — a policy that exploits temporal locality loses hits there
python - "$TRAIN" "$OUT" "$S1" "$S2" "$MODEL" <<'EOF'
import sys
from pathlib import Path

import numpy as np

from moeslots.profiles import profile as prof
from moeslots.profiles import repick as choose
from moeslots.profiles import simulate as sim
from moeslots.profiles.costs import CostModel
from moeslots.profiles.plan import plan_from_counts
from moeslots.profiles.trace import read_csv

train, out, S1, S2, model = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
names = {"train-code": f"{train}-code.csv", "train-chat": f"{train}-chat.csv", "train-merged": f"{train}-merged.csv",
         "test-code": f"{out}/test-code.csv", "test-chat": f"{out}/test-chat.csv"}
tr = {k: read_csv(v) for k, v in names.items()}
pr = {k: prof.from_trace(t) for k, t in tr.items()}
L = pr["train-code"].layers_with_data()
print(f"MoE layers with data: {L}")
print("| trace | decode tokens | top 10 % | top 25 % | top 50 % | per-layer top-10 % (top 6 of 64) share, mean |")
print("|---|---|---|---|---|---|")
for k, p in pr.items():
    c = p.counts[L]
    flat = np.sort(c.ravel())[::-1]
    sk = [flat[:round(s * flat.size)].sum() / flat.sum() for s in (0.10, 0.25, 0.50)]
    pl = np.sort(c, axis=1)[:, ::-1]
    per = (pl[:, :round(0.1 * c.shape[1])].sum(1) / pl.sum(1)).mean()
    print(f"| {k} | {p.decode_tokens} | {100*sk[0]:.1f} | {100*sk[1]:.1f} | {100*sk[2]:.1f} | {100*per:.1f} |")
for S in (S1, S2):
    print(f"\ncoverage at {S} slots per layer (share of the layer's decode picks in its own top {S}), %:")
    print("| trace | " + " | ".join(f"L{l}" for l in L) + " | mean |")
    print("|---|" + "---|" * (len(L) + 1))
    for k, p in pr.items():
        cv = prof.coverage(p, S)[L]
        print(f"| {k} | " + " | ".join(f"{100*x:.1f}" for x in cv) + f" | {100*cv.mean():.1f} |")
    print(f"\ntop-{S} overlap per layer, %:")
    print("| pair | " + " | ".join(f"L{l}" for l in L) + " | mean |")
    print("|---|" + "---|" * (len(L) + 1))
    for a, b in [("train-code", "train-chat"), ("test-code", "test-chat"), ("train-code", "test-code"),
                 ("train-chat", "test-chat"), ("train-merged", "test-code"), ("train-merged", "test-chat")]:
        ov = prof.overlap(pr[a], pr[b], S)[L]
        print(f"| {a} vs {b} | " + " | ".join(f"{100*x:.1f}" for x in ov) + f" | {100*ov.mean():.1f} |")
print("\nlocality check: hit % in the recorded order vs the same tokens shuffled (seed 0); plans from the test itself")
print("| test | slots | lru | lru shuffled | reelect-16 | reelect-16 shuffled | static-oracle |")
print("|---|---|---|---|---|---|---|")
rng = np.random.default_rng(0)
for k in ("test-code", "test-chat"):
    layers, P = sim.token_matrix(tr[k])
    Q = P[rng.permutation(P.shape[0])]
    n_e = tr[k].n_expert
    for S in (S1, S2):
        init = sim.resident_from_plan(plan_from_counts(pr[k].counts, S, layers), layers, n_e)
        lru, lru_s = sim._lru(P, S, n_e)[0], sim._lru(Q, S, n_e)[0]
        re, re_s = sim.reelect(P, S, n_e, 16, 64, init)[0], sim.reelect(Q, S, n_e, 16, 64, init)[0]
        orc = sim.static_hits(P, init)[0]
        print(f"| {k} | {S} | {100*lru:.1f} | {100*lru_s:.1f} | {100*re:.1f} | {100*re_s:.1f} | {100*orc:.1f} |")
print("\nsampling noise: top-S overlap of the first vs the second half (decode tokens) of each trace, mean over layers")
print("| trace | " + " | ".join(f"top-{S}" for S in (S1, S2)) + " |")
print("|---|---|---|")
for k in ("train-code", "train-chat", "test-code", "test-chat"):
    layers, P = sim.token_matrix(tr[k])
    halves = []
    for h in (P[:len(P) // 2], P[len(P) // 2:]):
        c = np.zeros((max(layers) + 1, tr[k].n_expert), np.int64)
        np.add.at(c, (np.broadcast_to(np.array(layers)[None, :, None], h.shape).ravel(), h.ravel()), 1)
        halves.append(prof.Profile(c, c * 0, len(h), 0))
    print(f"| {k} | " + " | ".join(f"{100*prof.overlap(*halves, S)[L].mean():.1f}" for S in (S1, S2)) + " |")
from moeslots.engine.llm.model import LoadOptions, Model

m = Model(model, LoadOptions(experts_on_host=True))
own_slab = m.facts.slab_bytes / 1e6
m.close()
print("\n`--repick auto` (profiles.repick.choose_repick: engine rule, 4 swaps, 25 % margin) on train-merged, H200 costs with the"
      " default slab and with this model's:")
for S in (S1, S2):
    for slab in (CostModel.slab_mb, own_slab):
        n, why = choose.choose_repick(tr["train-merged"], S, CostModel(slab_mb=slab))
        print(f"  {S} slots, slab {slab:g} MB: N={n}: {why}")
EOF

# --- simulator: specialist (all policies), wrong-workload and merged static plans -------------------------------
for S in "$S1" "$S2"; do
  for test in code chat; do
    other=$([ $test = code ] && echo chat || echo code)
    echo "== slots $S, test-$test, plan trained on train-$test (specialist), all policies"
    $M simulate "$OUT/test-$test.csv" --slots "$S" --train "$TRAIN-$test.csv" \
      --policy static-profile --policy static-oracle --policy lru --policy lfu-decay \
      --policy reelect-16 --policy reelect-64 | tail -n +3
    for train in "$other" merged; do
      echo "== slots $S, test-$test, plan trained on train-$train"
      $M simulate "$OUT/test-$test.csv" --slots "$S" --train "$TRAIN-$train.csv" \
        --policy static-profile --policy reelect-16 | tail -n +5
    done
  done
done
