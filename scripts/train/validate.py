"""Validate the exported model against the PyTorch reference, through moeslots' patched engine.

Needs torch + tokenizers and the moeslots engine in one interpreter. Prints a markdown report (docs/model.md) and
writes the numbers as JSON:

- tokenizer: llama.cpp's tokenization of every held-out document equals the HF tokenizer's;
- f32: llama.cpp logits vs PyTorch logits on 64 positions of held-out text (trunk, and the NextN head);
- quant: top-1 agreement of the quantized file with the F32 file, teacher-forced over held-out text;
- samples: greedy continuations of a code prompt and a chat prompt (quantized file);
- mtp: draft acceptance through the engine's MTP loop on held-out prompts (draft 1..3), and the NextN head's
  teacher-forced top-1 accuracy on the token after next.

The topology comes from the weights file (model.TOPOLOGIES); `--topology` asserts it. Without `--quant` (the routing
donor, exported F32 only) the quantization check is skipped and samples and MTP run on the F32 file; `--positions`
and `--domains` widen the logits-and-routing check (the donor: 128 positions of code, prose and chat, 48 layers each).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from corpus import read_docs
from model import TOPOLOGIES, Config, GLM4MoE
from tokenizers import Tokenizer

from moeslots.engine.llm import mtp as mtp_mod
from moeslots.engine.llm.model import Context, LoadOptions, Model

CODE_PROMPT = "def read_config(path):\n    \"\"\"Read a configuration file and return a dict.\"\"\"\n"
CHAT_MESSAGES = [("user", "What does `os.path.join` do?")]


def torch_model(weights: Path) -> GLM4MoE:
    c = torch.load(weights, map_location="cpu", weights_only=False)
    m = GLM4MoE(Config(**c["config"]))
    m.load_state_dict({k: v.float() for k, v in (c["weights"] if "weights" in c else c["model"]).items()})
    return m.eval()


def heldout_ids(tok: Tokenizer, corpus: Path, domain: str, n: int, min_len: int) -> list[list[int]]:
    out = []
    for d in read_docs(corpus / "heldout" / f"{domain}.txt"):
        ids = tok.encode(d).ids
        if len(ids) >= min_len:
            out.append(ids)
        if len(out) >= n:
            break
    return out


def check_tokenizer(tok: Tokenizer, m: Model, corpus: Path) -> dict:
    same = total = 0
    first_diff = ""
    for dom in ("code", "prose", "chat"):
        for d in read_docs(corpus / "heldout" / f"{dom}.txt"):
            a = tok.encode(d).ids
            b = m.tokenize(d, add_special=False, parse_special=True)
            total += 1
            same += a == b
            if a != b and not first_diff:
                first_diff = f"{dom}: {d[:60]!r}"
    return {"docs": total, "identical": same, "first_difference": first_diff}


def check_f32(tm: GLM4MoE, path: Path, ids: list[int], threads: int, n_pos: int = 64) -> dict:
    """Logits on 64 positions, trunk and NextN head. Top-k routing is discontinuous: where two experts' selection
    scores are within float rounding of each other the two implementations may pick differently, and that
    position's logits then differ by far more than rounding. Routing is compared per (position, layer) through
    the engine's routing ring; the error bound is stated over positions routed identically, and every flipped
    position is reported with its selection gap (score of the k-th minus the (k+1)-th expert in PyTorch)."""
    ids = ids[:n_pos + 1]
    moes = tm.moe_layers()[:-1]                              # trunk MoE layers, in order
    trunk_moe = [i for i in range(tm.c.n_layer) if i >= tm.c.n_dense_lead]
    with torch.no_grad():
        x = torch.tensor([ids[:n_pos]])
        tm.trunk(x)                                          # fills each MoE layer's last_ids/last_sel
        t_ids = {il: torch.sort(mo.last_ids, -1).values.numpy() for il, mo in zip(trunk_moe, moes)}
        gaps = {}
        for il, mo in zip(trunk_moe, moes):
            top = torch.sort(mo.last_sel, -1, descending=True).values
            gaps[il] = (top[:, tm.c.n_expert_used - 1] - top[:, tm.c.n_expert_used]).numpy()
        ref, ref_mtp = tm(x)
    ref = ref[0].numpy()
    m = Model(path, LoadOptions(load_mtp=True))
    try:
        ctx = Context(m, n_ctx=max(256, 2 * n_pos), n_batch=max(128, n_pos), threads=threads, kv_f32=True)
        ctx.enable_stats(ring_rows=n_pos * (tm.c.n_layer + 1))
        mt = mtp_mod.MTP(m, ctx, n_draft=1, threads=threads)
        ctx.decode(ids[:n_pos], all_logits=True, prompt=True)
        got = np.stack([ctx.logits(i).copy() for i in range(n_pos)])
        ring = ctx.read_stats().ring
        mt.feed(ids, n_pos - 1)                # draft rows 0..n_pos-2
        d_logits, _ = mt._draft_one(ids[n_pos - 1], n_pos - 1, mt.h[n_pos - 2])
        mt.close()
        ctx.close()
    finally:
        m.close()
    flipped: dict[int, list[int]] = {}
    rows_same = rows = 0
    for row in ring:
        p, il = -int(row[0]) - 1, int(row[1])
        if il not in t_ids:
            continue
        rows += 1
        if np.array_equal(np.sort(row[2:]), t_ids[il][p]):
            rows_same += 1
        else:
            flipped.setdefault(p, []).append(il)
    same = np.array([p not in flipped for p in range(n_pos)])
    rel = np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)
    l2 = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    r_mtp = ref_mtp[0, n_pos - 1].numpy()      # the last row: token x[n-1] with h[n-2]
    return {"positions": n_pos, "routing_rows": rows, "routing_rows_same": rows_same,
            "routing_flips": {str(p): {str(il): float(gaps[il][p]) for il in ls} for p, ls in flipped.items()},
            "positions_same_routing": int(same.sum()),
            "max_rel_err_inf": float(rel[same].max()), "max_rel_err_l2": float(l2[same].max()),
            "max_rel_err_inf_all": float(rel.max()),
            "top1_agree": float((got.argmax(1) == ref.argmax(1)).mean()),
            "mtp_rel_err_inf": float(np.abs(d_logits - r_mtp).max() / np.abs(r_mtp).max()),
            "mtp_top1_same": bool(d_logits.argmax() == r_mtp.argmax())}


def teacher_top1(path: Path, seqs: list[list[int]], threads: int) -> list[np.ndarray]:
    m = Model(path, LoadOptions())
    out = []
    try:
        ctx = Context(m, n_ctx=1024, n_batch=512, threads=threads)
        for s in seqs:
            ctx.reset()
            ctx.decode(s, all_logits=True, prompt=True)
            out.append(np.stack([ctx.logits(i).argmax() for i in range(len(s))]))
        ctx.close()
    finally:
        m.close()
    return out


def check_quant(f32: Path, q: Path, seqs: list[list[int]], threads: int) -> dict:
    a, b = teacher_top1(f32, seqs, threads), teacher_top1(q, seqs, threads)
    agree = np.concatenate([x == y for x, y in zip(a, b)])
    return {"positions": int(agree.size), "top1_agreement": float(agree.mean())}


def samples(q: Path, threads: int, n: int = 96) -> dict:
    from moeslots.engine.api import Message
    from moeslots.engine.llm.template import render_chat

    m = Model(q, LoadOptions())
    out = {}
    try:
        ctx = Context(m, n_ctx=512, threads=threads)
        prompts = {"code": CODE_PROMPT,
                   "chat": render_chat(m, [Message(r, c) for r, c in CHAT_MESSAGES])}
        for k, p in prompts.items():
            ctx.reset()
            ids = m.tokenize(p, add_special=False, parse_special=True)
            ctx.decode(ids, prompt=True)
            toks = []
            for _ in range(n):
                t = ctx.argmax()
                if m.is_eog(t):
                    break
                toks.append(t)
                ctx.decode([t])
            out[k] = {"prompt": p, "completion": b"".join(m.piece(t) for t in toks).decode("utf-8", "replace"),
                      "tokens": len(toks), "stopped_at_eog": len(toks) < n}
        ctx.close()
    finally:
        m.close()
    return out


def check_mtp(q: Path, seqs: list[list[int]], threads: int, n_predict: int = 64) -> dict:
    m = Model(q, LoadOptions(load_mtp=True))
    res: dict = {}
    try:
        ctx = Context(m, n_ctx=1024, threads=threads)
        for nd in (1, 2, 3):
            mt = mtp_mod.MTP(m, ctx, n_draft=nd, threads=threads)
            for s in seqs:
                mtp_mod.greedy_tokens(mt, s[:128], n_predict, m.is_eog)
            res[f"draft{nd}"] = {"acceptance": mt.stats.acceptance, "tokens_per_step": mt.stats.tokens_per_step,
                                 "drafted": mt.stats.drafted, "accepted": mt.stats.accepted}
            mt.close()
        # teacher forced: the NextN head's top-1 for x[p+1] from (x[p], h[p-1]) vs the real token
        mt = mtp_mod.MTP(m, ctx, n_draft=1, threads=threads)
        hit = tot = 0
        for s in seqs:
            s = s[:257]
            ctx.reset()
            mt.truncate(0)
            ctx.decode(s[:-1], prompt=True)
            for p in range(1, len(s) - 1):
                lg, _ = mt._draft_one(s[p], p, mt.h[p - 1])
                mt.truncate(p)
                hit += int(lg.argmax() == s[p + 1])
                tot += 1
        mt.close()
        res["teacher_forced_top1"] = hit / max(tot, 1)
        res["teacher_forced_positions"] = tot
        ctx.close()
    finally:
        m.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--f32", type=Path, required=True)
    ap.add_argument("--quant", type=Path, help="the quantized file (skipped without: samples and MTP use --f32)")
    ap.add_argument("--topology", choices=list(TOPOLOGIES), help="assert the weights' topology")
    ap.add_argument("--positions", type=int, default=64, help="positions of the logits and routing check")
    ap.add_argument("--domains", default="code,chat", help="held-out domains of the logits and routing check")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="fewer positions (tests)")
    a = ap.parse_args()
    tok = Tokenizer.from_file(str(a.tokenizer))
    tm = torch_model(a.weights)
    if a.topology and Config(**TOPOLOGIES[a.topology]).n_layer != tm.c.n_layer:
        raise SystemExit(f"{a.weights} is not a {a.topology} model ({tm.c.n_layer} trunk blocks)")
    final = a.quant or a.f32
    rep: dict = {"config": dataclasses.asdict(tm.c)}
    with Model(final, LoadOptions()) as m:
        rep["tokenizer"] = check_tokenizer(tok, m, a.corpus)
    rep["f32"] = {d: check_f32(tm, a.f32, heldout_ids(tok, a.corpus, d, 1, a.positions + 1)[0], a.threads,
                               a.positions) for d in a.domains.split(",")}
    n = 2 if a.quick else 4
    seqs = {d: heldout_ids(tok, a.corpus, d, n, 257) for d in ("code", "prose", "chat")}
    if a.quant:
        rep["quant"] = check_quant(a.f32, a.quant, [s[:256] for v in seqs.values() for s in v], a.threads)
    rep["samples"] = samples(final, a.threads)
    rep["mtp"] = check_mtp(final, [s for v in seqs.values() for s in v][: (2 if a.quick else 6)], a.threads,
                           n_predict=32 if a.quick else 64)
    print(json.dumps(rep, indent=1))
    if a.json:
        a.json.write_text(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
