"""Small GGUF files with real headers and tensors, written by the tests (model discovery, the picker)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_moe(path: Path, *, arch: str = "qwen3moe", n_expert: int = 8, k: int = 2, layers: tuple[int, ...] = (0, 1),
              n_block: int = 2, vocab: int = 0, dense: bool = False, split: tuple[int, int] | None = None) -> Path:
    """A small GGUF with real headers and tensors: expert tensors of `layers` (8 x 4 x 4 f32 each) and an
    attention tensor per layer; vocab: a token list that long (a big header)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(path.stem)
    w.add_block_count(n_block)
    if not dense:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(k)
    if split:
        w.add_uint16("split.no", split[0])
        w.add_uint16("split.count", split[1])
    if vocab:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}".encode() for i in range(vocab)])
    for il in layers:
        w.add_tensor(f"blk.{il}.attn_q.weight", np.zeros((4, 4), np.float32))
        if not dense:
            for name in ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"):
                w.add_tensor(f"blk.{il}.{name}.weight", np.ones((n_expert, 4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
