"""Byte-level BPE tokenizer (GPT-2 pre-tokenization, which llama.cpp's `gpt-2` pre-tokenizer reproduces) with
the chat control tokens at ids 0-3, trained on the corpus; and the chat template the GGUF carries."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from corpus import read_docs
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>"]
EOS = 0
# One message per turn; an assistant turn ends with <|endoftext|>, the model's end-of-generation token. The newline
# after each turn is an expression: chat renderers (transformers, llama.cpp) trim the newline after a block tag.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}<|endoftext|>{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train(corpus: Path, vocab: int, out: Path, seed: int = 0) -> Tokenizer:
    docs = [d for dom in ("code", "prose", "chat") for d in read_docs(corpus / "train" / f"{dom}.txt")]
    random.Random(seed).shuffle(docs)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=SPECIALS, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, tr)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("corpus", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--vocab", type=int, default=6144)
    a = ap.parse_args()
    tok = train(a.corpus, a.vocab, a.out)
    print(f"tokenizer: {tok.get_vocab_size()} tokens -> {a.out}")


if __name__ == "__main__":
    main()
