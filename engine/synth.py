"""Synthetic MoE GGUFs for tests and benchmarks: `glm4moe` (+ NextN/MTP block) and `qwen3moe`.

Weights are random but chosen so routing is realistic, not degenerate (shared/h200-box.md, "Lesson"): every
matrix is zero-mean (directly written Q4_K blocks are symmetric around zero by construction), the router is a
zero-mean Gaussian scaled so its logits are ~N(0, 1) on the normalised hidden state, and token embeddings are
independent, so router logits vary from token to token. `routing_check()` measures this through the engine.

Tensors are streamed: header and tensor infos first, then one tensor at a time, so a 17 GB model never sits in
RAM. Small models are written as F32/F16 and can be quantized through the engine (Q8_0, Q4_K_M); big ones can be
written as Q4_K blocks directly (`quant="q4_k"`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np

from moeslots.engine.errors import EngineError

QK_K = 256
Q4_K_BLOCK_BYTES = 144

CONTROL_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "[gMASK]", "<sop>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# A small English + code corpus for the BPE merges (written for this project).
_CORPUS = """
The expert cache keeps a fixed set of experts in video memory and computes the others on the processor.
A router picks a few experts for every token in every layer; the picks change from token to token.
When the picked expert is resident, the graphics card computes it; when it is not, the processor does.
The two partial results are added, and the sum is exactly the result of the full layer.
def route(hidden, weights, k):
    logits = hidden @ weights
    return logits.argsort()[-k:]
for layer in range(n_layers):
    ids = route(x, gate[layer], top_k)
    out = sum(w * expert(x) for w, expert in zip(weights, ids))
class Cache:
    def __init__(self, slots):
        self.slots = slots
    def hit(self, expert):
        return expert in self.slots
Tokens per second rise with the number of slots, and nothing crosses the bus while the model is decoding.
The profile counts which experts were used while decoding code and while chatting, and the plan keeps the most used.
"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (the published algorithm)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    eos: int
    bos: int


def build_tokenizer(n_vocab: int) -> Tokenizer:
    """Byte-level BPE: 256 byte tokens, merges learned on a small corpus, then filler tokens, then controls."""
    n_normal = n_vocab - len(CONTROL_TOKENS)
    if n_normal < 256:
        raise ValueError(f"vocab must be at least {256 + len(CONTROL_TOKENS)}")
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    known = set(tokens)
    merges: list[str] = []
    words = Counter(tuple(b2u[b] for b in w.encode()) for w in re.findall(r" ?\w+| ?[^\s\w]+|\s+", _CORPUS))
    seqs = {w: list(w) for w in words}
    while len(tokens) < n_normal:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, cnt in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += cnt
        pairs = Counter({p: c for p, c in pairs.items() if c >= 2 and p[0] + p[1] not in known})
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        known.add(a + b)
        for w in seqs:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    # filler: printable two-letter strings (never produced by merges, but decodable text when sampled)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    i = 0
    while len(tokens) < n_normal:
        s = b2u[ord(" ")] * (i // (26 * 26) % 2) + letters[i % 26] + letters[(i // 26) % 26] + "x" * (i // (2 * 26 * 26))
        i += 1
        if s not in known:
            tokens.append(s)
            known.add(s)
    types = [1] * len(tokens)
    for c in CONTROL_TOKENS:
        tokens.append(c)
        types.append(3)
    eos = tokens.index("<|endoftext|>")
    return Tokenizer(tokens, types, merges, eos=eos, bos=eos)


@dataclasses.dataclass(frozen=True)
class SynthSpec:
    arch: str = "glm4moe"          # "glm4moe" (first layer dense, shared expert, sigmoid router) | "qwen3moe"
    n_layer: int = 4               # trunk layers (the NextN block comes on top for glm4moe)
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int | None = None    # default n_embd // n_head
    n_expert: int = 32
    n_expert_used: int = 4
    n_ff_exp: int = 256
    n_ff: int = 512                # dense FFN (glm4moe layer 0)
    n_vocab: int = 512
    n_ctx: int = 4096
    nextn: bool = True             # glm4moe only: a NextN (MTP) block at blk.<n_layer>
    const_head: bool = False       # zero output norms: all logits 0, every head agrees (MTP always accepts)
    dtype: str = "f16"             # "f32" | "f16" for non-quantized matrices
    seed: int = 0
    branch_scale: float | None = None  # std factor of every residual branch output; None: auto (see below)

    def __post_init__(self) -> None:
        if self.arch not in ("glm4moe", "qwen3moe"):
            raise ValueError(f"unknown arch {self.arch!r}")
        if self.nextn and self.arch != "glm4moe":
            raise ValueError("only glm4moe synthetic models carry a NextN block")
        if self.n_embd % self.n_head:
            raise ValueError("n_embd must be divisible by n_head")
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError("need 0 < experts used <= experts")
        if self.dtype not in ("f32", "f16"):
            raise ValueError("dtype must be f32 or f16")
        if self.n_layer < (2 if self.arch == "glm4moe" else 1):
            raise ValueError("glm4moe needs at least 2 trunk layers (the first is dense)")

    @property
    def hd(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    @property
    def branch(self) -> float:
        """Deep random nets drift: attention averages over positions, and each layer adds that shared part to
        every token's residual stream, until deep layers see nearly the same normalised hidden state for every
        token and route degenerately (48 layers: 63 of 128 experts, top 10 % = 72 % of picks, measured on the
        H200 box). Scaling every branch output keeps the token embedding dominant in the stream."""
        return self.branch_scale if self.branch_scale is not None else min(1.0, 2.0 / self.n_block)

    @property
    def n_dense_lead(self) -> int:
        return 1 if self.arch == "glm4moe" else 0

    @property
    def n_block(self) -> int:
        return self.n_layer + (1 if self.nextn else 0)

    def moe_layers(self) -> list[int]:
        return [i for i in range(self.n_block) if i >= self.n_dense_lead]


@dataclasses.dataclass(frozen=True)
class TensorPlan:
    name: str
    ne: tuple[int, ...]      # ggml order (ne0 first)
    kind: str                # "norm" | "zero" | "matrix" | "router" | "embed"
    std: float = 0.0

    @property
    def n(self) -> int:
        return int(np.prod(self.ne))


def tensor_plan(spec: SynthSpec) -> list[TensorPlan]:
    E, V, hd = spec.n_embd, spec.n_vocab, spec.hd
    q_dim, kv_dim = spec.n_head * hd, spec.n_head_kv * hd
    b = spec.branch
    t: list[TensorPlan] = [TensorPlan("token_embd.weight", (E, V), "embed", 1.0)]
    t.append(TensorPlan("output_norm.weight", (E,), "zero" if spec.const_head else "norm"))
    t.append(TensorPlan("output.weight", (E, V), "matrix", 1 / np.sqrt(E)))
    for i in range(spec.n_block):
        p = f"blk.{i}."
        t += [TensorPlan(p + "attn_norm.weight", (E,), "norm"),
              TensorPlan(p + "attn_q.weight", (E, q_dim), "matrix", 1 / np.sqrt(E)),
              TensorPlan(p + "attn_k.weight", (E, kv_dim), "matrix", 1 / np.sqrt(E)),
              TensorPlan(p + "attn_v.weight", (E, kv_dim), "matrix", 1 / np.sqrt(E)),
              TensorPlan(p + "attn_output.weight", (q_dim, E), "matrix", b / np.sqrt(q_dim))]
        if spec.arch == "qwen3moe":
            t += [TensorPlan(p + "attn_q_norm.weight", (hd,), "norm"),
                  TensorPlan(p + "attn_k_norm.weight", (hd,), "norm"),
                  TensorPlan(p + "ffn_norm.weight", (E,), "norm")]
        else:
            t.append(TensorPlan(p + "post_attention_norm.weight", (E,), "norm"))
        F = spec.n_ff_exp
        if i >= spec.n_dense_lead:
            t += [TensorPlan(p + "ffn_gate_inp.weight", (E, spec.n_expert), "router", 1 / np.sqrt(E))]
            if spec.arch == "glm4moe":
                t.append(TensorPlan(p + "exp_probs_b.bias", (spec.n_expert,), "zero"))
            t += [TensorPlan(p + "ffn_gate_exps.weight", (E, F, spec.n_expert), "matrix", 1 / np.sqrt(E)),
                  TensorPlan(p + "ffn_up_exps.weight", (E, F, spec.n_expert), "matrix", 1 / np.sqrt(E)),
                  TensorPlan(p + "ffn_down_exps.weight", (F, E, spec.n_expert), "matrix", b / np.sqrt(F))]
            if spec.arch == "glm4moe":
                t += [TensorPlan(p + "ffn_gate_shexp.weight", (E, F), "matrix", 1 / np.sqrt(E)),
                      TensorPlan(p + "ffn_up_shexp.weight", (E, F), "matrix", 1 / np.sqrt(E)),
                      TensorPlan(p + "ffn_down_shexp.weight", (F, E), "matrix", b / np.sqrt(F))]
        else:
            t += [TensorPlan(p + "ffn_gate.weight", (E, spec.n_ff), "matrix", 1 / np.sqrt(E)),
                  TensorPlan(p + "ffn_up.weight", (E, spec.n_ff), "matrix", 1 / np.sqrt(E)),
                  TensorPlan(p + "ffn_down.weight", (spec.n_ff, E), "matrix", b / np.sqrt(spec.n_ff))]
        if i >= spec.n_layer:  # NextN block
            t += [TensorPlan(p + "nextn.eh_proj.weight", (2 * E, E), "matrix", 1 / np.sqrt(2 * E)),
                  TensorPlan(p + "nextn.enorm.weight", (E,), "norm"),
                  TensorPlan(p + "nextn.hnorm.weight", (E,), "norm"),
                  TensorPlan(p + "nextn.shared_head_norm.weight", (E,), "zero" if spec.const_head else "norm")]
    return t


# ---------------------------------------------------------------------------------------------------------------
# value generation


def _rng(spec: SynthSpec, name: str) -> np.random.Generator:
    h = hashlib.sha256(f"{spec.seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


def tensor_values(spec: SynthSpec, tp: TensorPlan) -> np.ndarray:
    """float32 values in numpy order (reverse of ne)."""
    shape = tuple(reversed(tp.ne))
    if tp.kind == "norm":
        return np.ones(shape, np.float32)
    if tp.kind == "zero":
        return np.zeros(shape, np.float32)
    return (_rng(spec, tp.name).standard_normal(shape, dtype=np.float32) * np.float32(tp.std))


def q4_k_random_blocks(rng: np.random.Generator, n_blocks: int, std: float) -> np.ndarray:
    """Random zero-mean Q4_K blocks as uint8 [n_blocks, 144].

    Per sub-block scale sc in {2,4,6,8} and min m = 7.5*sc with dmin = d, so every value is d*sc*(q - 7.5):
    symmetric around 0 for uniform 4-bit q. E[sc^2] = 30, Var(q - 7.5) = 255/12, so d = std / sqrt(30*255/12).
    """
    out = np.empty((n_blocks, Q4_K_BLOCK_BYTES), np.uint8)
    d0 = std / np.sqrt(30 * 255 / 12)
    d = (d0 * rng.uniform(0.8, 1.2, n_blocks)).astype(np.float16)
    out[:, 0:2] = d.view(np.uint8).reshape(n_blocks, 2)
    out[:, 2:4] = out[:, 0:2]                        # dmin = d
    sc = (rng.integers(1, 5, (n_blocks, 8), dtype=np.uint8) * 2)     # 2,4,6,8
    m = (sc.astype(np.uint16) * 15 // 2).astype(np.uint8)            # 7.5*sc: 15,30,45,60
    scales = np.empty((n_blocks, 12), np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    out[:, 4:16] = scales
    out[:, 16:] = np.frombuffer(rng.bytes(n_blocks * 128), np.uint8).reshape(n_blocks, 128)
    return out


# ---------------------------------------------------------------------------------------------------------------
# writer


@dataclasses.dataclass(frozen=True)
class SynthInfo:
    path: Path
    file_bytes: int
    n_params: int
    seconds: float


def _encoding(spec: SynthSpec, tp: TensorPlan, direct_q4k: bool) -> str:
    if tp.kind in ("norm", "zero", "router") or len(tp.ne) == 1:
        return "f32"
    if direct_q4k and tp.ne[0] % QK_K == 0:
        return "q4_k"
    return spec.dtype


def _write_metadata(w, spec: SynthSpec, tok: Tokenizer, name: str) -> None:  # noqa: ANN001 (gguf.GGUFWriter)
    import gguf

    w.add_name(name)
    w.add_block_count(spec.n_block)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff if spec.arch == "glm4moe" else spec.n_ff_exp * spec.n_expert_used)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.hd)
    w.add_value_length(spec.hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    w.add_expert_feed_forward_length(spec.n_ff_exp)
    if spec.arch == "glm4moe":
        w.add_rope_dimension_count(spec.hd // 2)     # GLM's partial rotary
        w.add_expert_shared_count(1)
        w.add_leading_dense_block_count(spec.n_dense_lead)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(1.0)
        w.add_nextn_predict_layers(1 if spec.nextn else 0)
    else:
        w.add_rope_dimension_count(spec.hd)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tok.tokens)
    w.add_token_types(tok.types)
    w.add_token_merges(tok.merges)
    w.add_bos_token_id(tok.bos)
    w.add_eos_token_id(tok.eos)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_string("moeslots.synth.spec", repr(spec))


def write_model(spec: SynthSpec, out: Path, *, quant: str = "none", name: str | None = None,
                progress: Callable[[int, int], None] | None = None,
                log: Callable[[str], None] | None = None, threads: int | None = None) -> SynthInfo:
    """Write spec to out (atomically). quant: none | q4_k (direct blocks) | q8_0 | q4_k_m (through the engine)."""
    if quant not in ("none", "q4_k", "q8_0", "q4_k_m"):
        raise ValueError(f"unknown quant {quant!r}")
    t0 = time.perf_counter()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    name = name or out.stem
    if quant in ("q8_0", "q4_k_m"):
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            src = Path(tmp) / "src.gguf"
            _stream_write(spec, src, direct_q4k=False, name=name, progress=progress)
            if log:
                log(f"quantizing to {quant.upper()} through the engine")
            quantize(src, out, quant, threads=threads)
    else:
        _stream_write(spec, out, direct_q4k=quant == "q4_k", name=name, progress=progress)
    n_params = sum(tp.n for tp in tensor_plan(spec))
    return SynthInfo(out, out.stat().st_size, n_params, time.perf_counter() - t0)


def _stream_write(spec: SynthSpec, out: Path, *, direct_q4k: bool, name: str,
                  progress: Callable[[int, int], None] | None) -> None:
    import gguf

    plan = tensor_plan(spec)
    tok = build_tokenizer(spec.n_vocab)
    tmp = out.with_name(out.name + ".part")
    w = gguf.GGUFWriter(str(tmp), spec.arch)
    _write_metadata(w, spec, tok, name)
    encs = []
    total = 0
    for tp in plan:
        enc = _encoding(spec, tp, direct_q4k)
        encs.append(enc)
        shape = tuple(reversed(tp.ne))
        if enc == "q4_k":
            nbytes = tp.n // QK_K * Q4_K_BLOCK_BYTES
            byte_shape = shape[:-1] + (tp.ne[0] // QK_K * Q4_K_BLOCK_BYTES,)
            w.add_tensor_info(tp.name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        else:
            dt = np.dtype(np.float16 if enc == "f16" else np.float32)
            nbytes = tp.n * dt.itemsize
            w.add_tensor_info(tp.name, shape, dt, nbytes)
        total += nbytes
    if direct_q4k:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    else:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if spec.dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        done = 0
        for tp, enc in zip(plan, encs):
            if enc == "q4_k":
                blocks = q4_k_random_blocks(_rng(spec, tp.name), tp.n // QK_K, tp.std)
                data = blocks.reshape(tuple(reversed(tp.ne[1:])) + (tp.ne[0] // QK_K * Q4_K_BLOCK_BYTES,))
            else:
                data = tensor_values(spec, tp)
                if enc == "f16":
                    data = data.astype(np.float16)
            w.write_tensor_data(data)
            done += data.nbytes
            del data
            if progress:
                progress(done, total)
        w.close()
        os.replace(tmp, out)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise


LLAMA_FTYPE = {"q8_0": 7, "q4_k_m": 15}


def quantize(src: Path, dst: Path, quant: str, threads: int | None = None) -> None:
    from moeslots.engine import native

    L = native.llama()
    params = L.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE[quant]
    params.nthread = threads or (os.cpu_count() or 1)
    tmp = dst.with_name(dst.name + ".part")
    rc = L.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise EngineError(f"quantizing to {quant} failed (code {rc}): {native.recent_log(5).strip()}")
    os.replace(tmp, dst)


# ---------------------------------------------------------------------------------------------------------------
# routing check


@dataclasses.dataclass(frozen=True)
class RoutingCheck:
    n_tokens: int
    n_expert: int
    k: int
    distinct: dict[int, int]       # layer -> distinct experts used over the tokens
    top10_share: dict[int, float]  # layer -> share of picks carried by the top 10 % experts

    @property
    def expected_distinct(self) -> float:
        """Uniform routing: each expert is missed by a token with probability 1 - k/n."""
        return self.n_expert * (1 - (1 - self.k / self.n_expert) ** self.n_tokens)

    @property
    def mean_distinct(self) -> float:
        return float(np.mean(list(self.distinct.values())))

    @property
    def mean_top10(self) -> float:
        return float(np.mean(list(self.top10_share.values())))

    @property
    def degenerate(self) -> bool:
        return self.mean_distinct < 0.5 * self.expected_distinct or self.mean_top10 > 0.5

    def render(self) -> str:
        uni_top10 = max(1, round(0.1 * self.n_expert)) / self.n_expert
        lines = [f"routing check over {self.n_tokens} random tokens ({self.n_expert} experts, {self.k} used):",
                 f"  distinct experts per layer: mean {self.mean_distinct:.1f} (uniform routing: "
                 f"{self.expected_distinct:.1f}); min {min(self.distinct.values())}, max {max(self.distinct.values())}",
                 f"  share of picks in the top 10 % of experts: mean {100 * self.mean_top10:.1f} % "
                 f"(uniform: ~{100 * uni_top10:.0f} %, degenerate: > 50 %)",
                 f"  regime: {'DEGENERATE' if self.degenerate else 'non-degenerate'}"]
        return "\n".join(lines)


def summarize_routing(picks: dict[int, np.ndarray], n_expert: int, k: int) -> RoutingCheck:
    """picks: layer -> int array [n_tokens, k]."""
    from moeslots.engine.stats import regime

    distinct, top10 = {}, {}
    n_tokens = 0
    for il, ids in sorted(picks.items()):
        distinct[il], top10[il] = regime(np.bincount(ids.ravel(), minlength=n_expert))
        n_tokens = max(n_tokens, ids.shape[0])
    return RoutingCheck(n_tokens, n_expert, k, distinct, top10)


def routing_check(path: Path, n_tokens: int = 256, threads: int | None = None, seed: int = 1) -> RoutingCheck:
    """Run n_tokens random tokens through the engine (one batch, all rows output) and trace the router."""
    from moeslots.engine import trace

    tr = trace.trace_random_tokens(Path(path), n_tokens=n_tokens, threads=threads, seed=seed)
    return summarize_routing(tr.picks, tr.n_expert, tr.k)
