"""Train the bundled model: next-token + next-next-token (NextN) loss, time-budgeted and resumable.

`--topology` picks the shape (model.TOPOLOGIES): the bundled `tiny-glm4moe` (default) or the routing donor
`qwen3-30b-a3b`. `--device` picks where it trains: `auto` is CUDA when torch sees a GPU (bf16 autocast),
else the CPU (float32; `--threads` sets torch's thread count: on a busy shared box 1 thread beats 2 busy-waiting
OpenMP threads by ~5x). The routing donor, one command per machine (fixed seed 0):

    scripts/train/donor.sh WORK 120 cpu       # 2 CPU cores: step 150 of 300 (45 minutes on the busy dev box)
    scripts/train/donor.sh WORK 12 cuda       # the H200 box, same script, the GPU (3,000 steps of 64 x 256)

Every run continues from <out>/ckpt.pt when it exists (model, optimizer, step, tokens seen) and stops cleanly
after --minutes (checkpoint every --save-every seconds and at the end), so training can run in short pieces on a
shared GPU box. The learning rate follows a warm-up + cosine over the run's own time budget; a resumed run
starts its cosine at --resume-lr-scale of the peak. With --steps N the schedule is over N steps instead (warm-up +
cosine by step, the same across resumes) and training ends at step N (or at --max-steps), whatever the time: an
uninterrupted run with a fixed seed gives the same model however busy the machine is (a resumed run draws other
batches after the resume: the batch generator restarts at seed + step). Besides ckpt.pt it writes weights.pt
(float16 weights, selection biases and config: what the exporter needs) and a log line every --log-every steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from corpus import read_docs
from model import Config, GLM4MoE, topology
from tok import EOS

DOMAINS = {"code": 0.45, "prose": 0.20, "chat": 0.35}


def parse_mix(text: str) -> dict[str, float]:
    """"code=0.34,prose=0.33,chat=0.33" -> the domain weights of the batches (every domain of DOMAINS named)."""
    mix = {k.strip(): float(v) for k, _, v in (x.partition("=") for x in text.split(",") if x.strip())}
    if set(mix) != set(DOMAINS) or any(v < 0 for v in mix.values()) or not sum(mix.values()):
        raise SystemExit(f"--mix wants weights for {', '.join(DOMAINS)}: got {text!r}")
    return mix


def tokenize_corpus(corpus: Path, tokenizer: Path, out: Path) -> dict[str, np.ndarray]:
    """{split/domain: uint16 ids}, documents joined with <|endoftext|>; cached in out/tokens.npz."""
    cache = out / "tokens.npz"
    if cache.exists():
        return dict(np.load(cache))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    arrays = {}
    for split in ("train", "heldout"):
        for d in DOMAINS:
            docs = read_docs(corpus / split / f"{d}.txt")
            ids: list[int] = []
            for e in tok.encode_batch(docs):
                ids += e.ids + [EOS]
            arrays[f"{split}/{d}"] = np.array(ids, dtype=np.uint16)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(cache, **arrays)
    return arrays


def batch(arrs: dict[str, torch.Tensor], split: str, B: int, T: int, g: torch.Generator,
          device: str, mix: dict[str, float] | None = None) -> torch.Tensor:
    """[B, T+1] windows; each row from one domain drawn with the mix's weights (default DOMAINS)."""
    mix = mix or DOMAINS
    names = list(mix)
    p = torch.tensor([mix[n] for n in names])
    dom = torch.multinomial(p, B, replacement=True, generator=g)
    rows = []
    for i in range(B):
        a = arrs[f"{split}/{names[int(dom[i])]}"]
        o = int(torch.randint(0, len(a) - T - 1, (1,), generator=g))
        rows.append(a[o:o + T + 1])
    return torch.stack(rows).to(device, non_blocking=True).long()


def losses(model: GLM4MoE, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(next-token loss, NextN loss); model.aux_loss() then holds the load-balancing loss (balance="aux")."""
    x = w[:, :-1]
    logits, mtp = model(x)
    main = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
    assert mtp is not None
    nn_ = F.cross_entropy(mtp[:, 1:].float().reshape(-1, mtp.shape[-1]), w[:, 2:].reshape(-1))  # row 0 has no h
    return main, nn_


@torch.no_grad()
def evaluate(model: GLM4MoE, arrs: dict[str, torch.Tensor], T: int, device: str, amp: bool) -> dict[str, float]:
    model.eval()
    res = {}
    for d in DOMAINS:
        a = arrs[f"heldout/{d}"]
        n = min(16, (len(a) - 1) // (T + 1))
        w = torch.stack([a[i * (T + 1):(i + 1) * (T + 1)] for i in range(n)]).to(device).long()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            m, k = losses(model, w)
        res[d], res[d + "_mtp"] = float(m), float(k)
    model.train()
    return res


def save(model: GLM4MoE, opt: torch.optim.Optimizer, state: dict, out: Path) -> None:
    tmp = out / "ckpt.pt.part"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state,
                "config": dataclasses.asdict(model.c)}, tmp)
    tmp.replace(out / "ckpt.pt")
    w = {k: (v.half() if v.is_floating_point() and not k.endswith("sel_bias") else v).cpu()
         for k, v in model.state_dict().items()}
    torch.save({"weights": w, "config": dataclasses.asdict(model.c), "state": state}, out / "weights.pt.part")
    (out / "weights.pt.part").replace(out / "weights.pt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--resume-lr-scale", type=float, default=0.3)
    ap.add_argument("--balance-rate", type=float, default=1e-3)
    ap.add_argument("--save-every", type=float, default=120.0)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (tests)")
    ap.add_argument("--steps", type=int, default=0, help="total steps: the schedule is by step and ends there")
    ap.add_argument("--config", default="{}", help="JSON overrides of model.Config (new runs only)")
    ap.add_argument("--topology", default="tiny-glm4moe", help="model.TOPOLOGIES entry (new runs only)")
    ap.add_argument("--mix", default=None, help="domain weights, e.g. code=0.34,prose=0.33,chat=0.33 (default "
                    + ",".join(f"{k}={v}" for k, v in DOMAINS.items()) + ")")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--warmup", type=int, default=100, help="warm-up steps of a new run")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    amp = device == "cuda"
    mix = parse_mix(a.mix) if a.mix else DOMAINS
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)          # Adam's second moments of rarely picked experts go denormal: 10x slower
    torch.manual_seed(a.seed)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    arrs = {k: torch.from_numpy(v.astype(np.int32)) for k, v in tokenize_corpus(a.corpus, a.tokenizer, a.out).items()}
    ck = a.out / "ckpt.pt"
    if ck.exists():
        c = torch.load(ck, map_location="cpu", weights_only=False)
        model = GLM4MoE(Config(**c["config"])).to(device)
        model.load_state_dict(c["model"])
        state = c["state"]
        peak = a.lr if a.steps else a.lr * a.resume_lr_scale
        print(f"resuming at step {state['step']} ({state['tokens'] / 1e6:.1f} M tokens)")
    else:
        model = GLM4MoE(topology(a.topology, json.loads(a.config))).to(device)
        c, state, peak = None, {"step": 0, "tokens": 0, "runs": 0, "seconds": 0.0}, a.lr
    n_par = sum(p.numel() for p in model.parameters())
    print(f"model: {n_par / 1e6:.1f} M parameters; tokens: " +
          ", ".join(f"{k} {len(v) / 1e6:.2f} M" for k, v in arrs.items()))
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    other = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}],
                            lr=peak, betas=(0.9, 0.95), eps=1e-8)
    if c is not None:
        opt.load_state_dict(c["opt"])
    g = torch.Generator().manual_seed(a.seed + state["step"])
    budget = a.minutes * 60
    t0 = last_save = time.time()
    warm = a.warmup if c is None or a.steps else 20
    step0 = state["step"]
    tok_s, n_log = 0.0, 0
    tl = time.time()
    while True:
        el = time.time() - t0
        if el > budget or (a.max_steps and state["step"] - step0 >= a.max_steps) or \
                (a.steps and state["step"] >= a.steps):
            break
        i = state["step"] if a.steps else state["step"] - step0
        frac = state["step"] / a.steps if a.steps else el / budget
        lr = peak * min(1.0, (i + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        for gr in opt.param_groups:
            gr["lr"] = lr
        w = batch(arrs, "train", a.batch, a.seq, g, device, mix)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            m, k = losses(model, w)
            loss = m + model.c.mtp_weight * k
            aux = model.aux_loss()
            if aux is not None:
                loss = loss + model.c.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.balance(a.balance_rate)
        state["step"] += 1
        state["tokens"] += a.batch * a.seq
        n_log += 1
        if state["step"] % a.log_every == 0:
            dt = time.time() - tl
            tok_s = n_log * a.batch * a.seq / dt
            tl, n_log = time.time(), 0
            bal = f" aux {float(aux.detach()):.3f}" if aux is not None else ""
            print(f"step {state['step']} tok {state['tokens'] / 1e6:.2f}M loss {float(m):.3f} mtp {float(k):.3f}{bal} "
                  f"lr {lr:.2e} {tok_s / 1e3:.1f}k tok/s t {el:.0f}s", flush=True)
        if time.time() - last_save > a.save_every:
            state["seconds"] += time.time() - last_save
            last_save = time.time()
            save(model, opt, state, a.out)
    state["seconds"] += time.time() - last_save
    state["runs"] += 1
    ev = evaluate(model, arrs, a.seq, device, amp)
    state["heldout"] = ev
    save(model, opt, state, a.out)
    print("heldout loss " + " ".join(f"{k} {v:.3f}" for k, v in ev.items()))
    print(json.dumps(state))


if __name__ == "__main__":
    main()
