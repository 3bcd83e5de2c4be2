"""The bundled model in PyTorch: exactly llama.cpp's `glm4moe` forward (src/models/glm4-moe.cpp of the vendored
llama.cpp), plus its NextN (MTP) block. A *topology* (TOPOLOGIES, `train.py --topology`) picks the shape and the
router: `tiny-glm4moe` is the bundled model; `qwen3-30b-a3b` is the routing donor (Qwen3-30B-A3B's expert
topology: 48 MoE blocks, 128 experts, 8 used, softmax router with normalised top-k, no shared expert, QK-norm and no
Q/K/V bias, balanced by an auxiliary loss; a narrow trunk), still written as glm4moe, whose llama.cpp forward reads
the gating function from the GGUF, takes optional Q/K norms and biases, and carries the NextN block.

Per trunk block: RMSNorm -> attention (Q/K/V with bias, GQA, NeoX RoPE on the first n_rot dims of each head,
causal softmax, output projection) -> residual -> post-attention RMSNorm -> FFN -> residual. Block 0 is a dense
SiLU-gated FFN; the others are MoE: sigmoid router, selection by top-k of (sigmoid + selection bias), weights =
unbiased sigmoid of the chosen experts normalised to sum 1, routed experts + one shared expert. The head is
RMSNorm -> output projection. The NextN block takes RMSNorm(h, hnorm) of the trunk's *normalised* last hidden state
at position i and RMSNorm(embed(x[i+1]), enorm), concatenates [embedding, hidden], projects 2E -> E, runs one
MoE block of its own and predicts x[i+2] through shared_head_norm and the trunk's output matrix (in the
engine's indexing: draft row p = token x[p] with hidden state p-1, see GLM4MoE.forward).

The selection bias is not trained by gradient: it is nudged towards balanced expert load after every step
(auxiliary-loss-free balancing, as in DeepSeek-V3), and exported as `exp_probs_b`. With `balance="aux"` (Qwen3) the
bias stays 0 (exported as zeros: selection = the softmax probabilities) and MoE.last_aux carries the Switch-style
load-balancing loss, n_expert * sum_i(f_i * P_i) over the forward's tokens, that train.py adds.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class Config:
    vocab: int = 6144
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_rot: int = 32                 # GLM's partial rotary: half of each head
    n_layer: int = 7                # trunk blocks; block 0 dense, 1.. MoE
    n_dense_lead: int = 1
    n_ff: int = 768                 # dense FFN of the leading block
    n_expert: int = 64
    n_expert_used: int = 4
    n_ff_exp: int = 64
    rope_base: float = 10000.0
    eps: float = 1e-5
    n_ctx: int = 2048               # written to the GGUF (context length)
    mtp_weight: float = 0.3         # weight of the next-next-token loss
    gating: str = "sigmoid"         # "softmax": probabilities by softmax over the experts (Qwen3); selection = top-k
    qkv_bias: bool = True
    qk_norm: bool = False           # RMSNorm over each head's dims of Q and K before RoPE (Qwen3; glm4moe's optional)
    n_expert_shared: int = 1        # 0: none (the exporter writes the shared expert glm4moe requires as zeros)
    balance: str = "bias"           # "bias": selection-bias nudging; "aux": auxiliary load-balancing loss
    aux_coef: float = 0.01

    @property
    def moe_blocks(self) -> list[int]:
        return [i for i in range(self.n_layer + 1) if i >= self.n_dense_lead]


# Shapes by name (train.py --topology). The donor's trunk is narrow so that it trains on a CPU in about half an hour
# (2 cores) or in minutes on a GPU; its expert topology is Qwen3-30B-A3B's (48 x 128, k 8; there d 2048, expert FFN
# 768, 32 heads / 4 KV heads of 128, no MTP head: the NextN block here is GLM's, for the engine's MTP path).
TOPOLOGIES: dict[str, dict] = {
    "tiny-glm4moe": {},
    "qwen3-30b-a3b": dict(n_layer=48, n_dense_lead=0, n_expert=128, n_expert_used=8, gating="softmax",
                          qkv_bias=False, qk_norm=True, n_expert_shared=0, balance="aux", aux_coef=0.01,
                          n_embd=96, n_head=3, n_head_kv=1, head_dim=32, n_rot=32, n_ff=288, n_ff_exp=32,
                          n_ctx=4096, rope_base=1e6, mtp_weight=0.3),
}


def topology(name: str, overrides: dict | None = None) -> Config:
    if name not in TOPOLOGIES:
        raise SystemExit(f"unknown topology {name!r} (choose from {', '.join(TOPOLOGIES)})")
    return Config(**{**TOPOLOGIES[name], **(overrides or {})})


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_neox(x: torch.Tensor, pos: torch.Tensor, n_rot: int, base: float) -> torch.Tensor:
    """x: [B, T, H, D]; rotates pairs (i, i + n_rot/2) for i < n_rot/2, passes the rest through (ggml NeoX)."""
    half = n_rot // 2
    inv = base ** (-torch.arange(0, half, device=x.device, dtype=torch.float32) * 2.0 / n_rot)
    ang = pos.float()[:, None] * inv[None, :]                 # [T, half]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    xf = x.float()
    x0, x1, rest = xf[..., :half], xf[..., half:n_rot], xf[..., n_rot:]
    out = torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos, rest], dim=-1)
    return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.q = nn.Linear(c.n_embd, c.n_head * c.head_dim, bias=c.qkv_bias)
        self.k = nn.Linear(c.n_embd, c.n_head_kv * c.head_dim, bias=c.qkv_bias)
        self.v = nn.Linear(c.n_embd, c.n_head_kv * c.head_dim, bias=c.qkv_bias)
        self.o = nn.Linear(c.n_head * c.head_dim, c.n_embd, bias=False)
        if c.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(c.head_dim))
            self.k_norm = nn.Parameter(torch.ones(c.head_dim))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        c = self.c
        B, T, _ = x.shape
        q = self.q(x).view(B, T, c.n_head, c.head_dim)
        k = self.k(x).view(B, T, c.n_head_kv, c.head_dim)
        v = self.v(x).view(B, T, c.n_head_kv, c.head_dim)
        if c.qk_norm:
            q, k = rms_norm(q, self.q_norm, c.eps), rms_norm(k, self.k_norm, c.eps)
        q, k = rope_neox(q, pos, c.n_rot, c.rope_base), rope_neox(k, pos, c.n_rot, c.rope_base)
        r = c.n_head // c.n_head_kv                              # q head h reads kv head h // r (ggml broadcast)
        k, v = k.repeat_interleave(r, dim=2), v.repeat_interleave(r, dim=2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=1.0 / math.sqrt(c.head_dim))
        return self.o(y.transpose(1, 2).reshape(B, T, c.n_head * c.head_dim))


class DenseFFN(nn.Module):
    def __init__(self, n_embd: int, n_ff: int):
        super().__init__()
        self.gate = nn.Linear(n_embd, n_ff, bias=False)
        self.up = nn.Linear(n_embd, n_ff, bias=False)
        self.down = nn.Linear(n_ff, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MoE(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        E, d, f = c.n_expert, c.n_embd, c.n_ff_exp
        self.router = nn.Linear(d, E, bias=False)
        self.register_buffer("sel_bias", torch.zeros(E))
        self.gate = nn.Parameter(torch.randn(E, f, d) / math.sqrt(d))
        self.up = nn.Parameter(torch.randn(E, f, d) / math.sqrt(d))
        self.down = nn.Parameter(torch.randn(E, d, f) / math.sqrt(f) * 0.5)
        self.shared = DenseFFN(d, f) if c.n_expert_shared else None
        self.last_ids: torch.Tensor | None = None               # [T, k] of the last forward (stats, balancing)
        self.last_sel: torch.Tensor | None = None               # [T, E] selection scores of the last forward
        self.last_aux: torch.Tensor | None = None               # the load-balancing loss of the last forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.c
        shape = x.shape
        xt = x.reshape(-1, shape[-1])
        T, k, E = xt.shape[0], c.n_expert_used, c.n_expert
        logits = self.router(xt).float()
        probs = torch.softmax(logits, -1) if c.gating == "softmax" else torch.sigmoid(logits)   # [T, E]
        sel = probs + self.sel_bias
        ids = torch.topk(sel, k, dim=-1).indices
        self.last_sel = sel.detach()
        self.last_aux = None
        if c.balance == "aux" and self.training:
            f = torch.bincount(ids.reshape(-1), minlength=E).float() / (T * k)
            p = probs if c.gating == "softmax" else probs / probs.sum(-1, keepdim=True)
            self.last_aux = E * (f * p.mean(0)).sum()
        w = probs.gather(-1, ids)
        w = w / w.sum(-1, keepdim=True).clamp(min=6.103515625e-5)
        self.last_ids = ids.detach()
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        e_sorted = flat[order]
        counts = torch.bincount(flat, minlength=E)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.arange(T * k, device=x.device) - starts[e_sorted]
        tok = order // k
        C = int(counts.max().item())
        buf = xt.new_zeros(E, C, shape[-1])
        buf[e_sorted, slot] = xt[tok]
        h = F.silu(torch.bmm(buf, self.gate.transpose(1, 2).to(buf.dtype))) * \
            torch.bmm(buf, self.up.transpose(1, 2).to(buf.dtype))
        y = torch.bmm(h, self.down.transpose(1, 2).to(h.dtype))  # [E, C, d]
        contrib = y[e_sorted, slot] * w.reshape(-1)[order, None].to(y.dtype)
        out = torch.zeros_like(xt).index_add_(0, tok, contrib.to(xt.dtype))
        if self.shared is not None:
            out = out + self.shared(xt)
        return out.reshape(shape)


class Block(nn.Module):
    def __init__(self, c: Config, moe: bool):
        super().__init__()
        self.c = c
        self.attn_norm = nn.Parameter(torch.ones(c.n_embd))
        self.attn = Attention(c)
        self.post_norm = nn.Parameter(torch.ones(c.n_embd))
        self.ffn: nn.Module = MoE(c) if moe else DenseFFN(c.n_embd, c.n_ff)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(rms_norm(x, self.attn_norm, self.c.eps), pos)
        return x + self.ffn(rms_norm(x, self.post_norm, self.c.eps))


class NextN(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.enorm = nn.Parameter(torch.ones(c.n_embd))
        self.hnorm = nn.Parameter(torch.ones(c.n_embd))
        self.eh_proj = nn.Linear(2 * c.n_embd, c.n_embd, bias=False)
        self.block = Block(c, moe=True)
        self.head_norm = nn.Parameter(torch.ones(c.n_embd))

    def forward(self, h_normed: torch.Tensor, emb_next: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        c = self.c
        z = self.eh_proj(torch.cat([rms_norm(emb_next, self.enorm, c.eps), rms_norm(h_normed, self.hnorm, c.eps)], -1))
        return rms_norm(self.block(z, pos), self.head_norm, c.eps)


class GLM4MoE(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.n_embd)
        nn.init.normal_(self.embed.weight, std=1.0)
        self.blocks = nn.ModuleList([Block(c, moe=i >= c.n_dense_lead) for i in range(c.n_layer)])
        self.out_norm = nn.Parameter(torch.ones(c.n_embd))
        self.output = nn.Linear(c.n_embd, c.vocab, bias=False)
        self.nextn = NextN(c)
        for n, p in self.named_parameters():
            if n.endswith(("o.weight", "down.weight")):
                with torch.no_grad():
                    p.mul_(0.5)

    def moe_layers(self) -> list[MoE]:
        return [b.ffn for b in self.blocks if isinstance(b.ffn, MoE)] + [self.nextn.block.ffn]  # type: ignore[list-item]

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids [B, T] -> the normalised last hidden state (llama.cpp's t_h_nextn) [B, T, E]."""
        pos = torch.arange(x.shape[1], device=x.device)
        h = self.embed(x)
        for b in self.blocks:
            h = b(h, pos)
        return rms_norm(h, self.out_norm, self.c.eps)

    def forward(self, x: torch.Tensor, with_mtp: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits of the next token at every position from the trunk, and from the NextN block.

        NextN row p (the engine's draft-context row at position p) reads token x[p] and the trunk's hidden state
        at p-1 (zeros at p = 0) and predicts x[p+1]: from the hidden state's point of view, the token after
        next. Both outputs have length T and the same targets x[1:]."""
        hn = self.trunk(x)
        logits = self.output(hn)
        if not with_mtp:
            return logits, None
        pos = torch.arange(x.shape[1], device=x.device)
        h_prev = torch.cat([torch.zeros_like(hn[:, :1]), hn[:, :-1]], dim=1)
        m = self.nextn(h_prev, self.embed(x), pos)
        return logits, self.output(m)

    def aux_loss(self) -> torch.Tensor | None:
        """The mean load-balancing loss of the last forward's MoE layers (balance="aux", training), else None."""
        a = [m.last_aux for m in self.moe_layers() if m.last_aux is not None]
        return torch.stack(a).mean() if a else None

    @torch.no_grad()
    def balance(self, rate: float) -> None:
        """Nudge every MoE layer's selection bias towards equal load over the last forward's picks (balance="bias")."""
        if self.c.balance != "bias":
            return
        for moe in self.moe_layers():
            if moe.last_ids is None:
                continue
            load = torch.bincount(moe.last_ids.reshape(-1), minlength=self.c.n_expert).float()
            moe.sel_bias += rate * torch.sign(load.mean() - load)
