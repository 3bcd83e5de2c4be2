"""The routing donor's traces kept in profiles/data/: code and chat greedy and sampled, prose greedy (the
sixth, prose sampled, is still to record from this donor), each >= 4,000 decode tokens at Qwen3-30B-A3B's expert
topology (48 MoE layers x 128 experts, 8 used), with the facts they claim, small enough for the repository, and
readable as the benchmarks' replay tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moeslots.profiles.locality import locality, uniform_overlap
from moeslots.profiles.simulate import token_matrix
from moeslots.profiles.trace import Trace, read_csv

DATA = Path(__file__).resolve().parents[2] / "profiles" / "data"
PREFIX = "moeslots-donor-qwen3-30b-a3b"
TRACES = [(w, m) for w in ("code", "chat", "prose") for m in ("greedy", "sampled") if (w, m) != ("prose", "sampled")]


@pytest.fixture(scope="module")
def traces() -> dict[tuple[str, str], Trace]:
    return {(w, m): read_csv(DATA / f"{PREFIX}-{w}-{m}.npz") for w, m in TRACES}


def test_all_are_kept_and_small() -> None:
    files = [DATA / f"{PREFIX}-{w}-{m}.npz" for w, m in TRACES]
    assert all(f.is_file() for f in files), [f.name for f in files if not f.is_file()]
    sizes = [f.stat().st_size for f in files]
    assert max(sizes) < 1e6 and sum(sizes) < 3.5e6, sizes                   # 3.3 MB kept (ids sorted, LZMA)


@pytest.mark.parametrize("w,m", TRACES)
def test_facts(traces: dict[tuple[str, str], Trace], w: str, m: str) -> None:
    t = traces[(w, m)]
    f = t.meta
    assert (f["arch"], f["n_layer"], f["n_expert"], f["k"]) == ("glm4moe", "49", "128", "8")   # 48 + the NextN block
    assert "donor" in f["model"] and f["workload"] == w and f["decode"] == m
    assert (float(f["temperature"]) == 0.0) == (m == "greedy")
    assert f["template"] == ("chat" if w == "chat" else "none") and f["ids"] == "sorted"
    assert t.decode_tokens >= 4000 and int(f["tokens"]) == t.decode_tokens
    assert int(f["prompts"]) >= 4000 // 192
    layers, P = token_matrix(t)
    assert layers == list(range(48)) and P.shape == (t.decode_tokens, 48, 8)    # every decode token, every layer
    assert P.max() < 128 and (np.sort(P, axis=2)[:, :, 1:] != np.sort(P, axis=2)[:, :, :-1]).all()   # 8 distinct
    assert (t.pos[~t.decode] < 0).all() and (~t.decode).sum() >= 48 * int(f["prompts"])   # prompt rows too


@pytest.mark.parametrize("w,m", TRACES)
def test_routing_is_not_uniform(traces: dict[tuple[str, str], Trace], w: str, m: str) -> None:
    """What the analysis of docs/profiles.md rests on: the router reuses experts from one token to the next more than
    k of 128 at random would (6.25 %); sampled replies spread over (nearly) all experts of every layer (balanced
    training), greedy ones nearly all too (the donor's greedy text does not fall into short loops)."""
    _, P = token_matrix(traces[(w, m)])
    loc = locality(P, 128, (1, 8))
    assert loc.overlap[1] > 1.5 * uniform_overlap(8, 128, 1), loc.overlap
    used = (np.stack([np.bincount(P[:, j].ravel(), minlength=128) for j in range(48)]) > 0).sum(axis=1)
    assert used.min() >= (125 if m == "sampled" else 120), used              # no loop on a few experts


def test_replayable_by_the_benchmarks() -> None:
    from moeslots.engine.native import replay

    tab = replay.from_trace(DATA / f"{PREFIX}-chat-sampled.npz", 128, 8)
    assert tab.ids.shape[1:] == (48, 8) and tab.n_rows >= 4000 and "128 experts mapped onto 128" in tab.source
    big = replay.from_trace(DATA / f"{PREFIX}-chat-sampled.npz", 256, 8)       # a Qwen3.5/3.6-shaped model
    assert big.ids.max() < 256 and (big.ids % 2 == 0).all()
