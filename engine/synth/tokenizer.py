"""The synthetic models' tokenizer: byte-level BPE learned on a small corpus, padded with filler tokens, plus the
control tokens the chat template uses."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter
from typing import Iterator

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


def _filler(space: str) -> Iterator[str]:
    """Two-letter strings, then with a leading space, then three letters, four... A reply of random tokens from a
    150k+ vocabulary stays a few bytes per token, so it re-tokenizes to a few tokens each, not dozens."""
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    for n in itertools.count(2):
        for lead in ("", space):
            for combo in itertools.product(letters, repeat=n):
                yield lead + "".join(reversed(combo))


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
    # filler: short printable strings (never produced by merges, but decodable text when sampled)
    filler = _filler(b2u[ord(" ")])
    while len(tokens) < n_normal:
        piece = next(filler)
        if piece not in known:
            tokens.append(piece)
            known.add(piece)
    types = [1] * len(tokens)
    for c in CONTROL_TOKENS:
        tokens.append(c)
        types.append(3)
    eos = tokens.index("<|endoftext|>")
    return Tokenizer(tokens, types, merges, eos=eos, bos=eos)
