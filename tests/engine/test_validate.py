"""GGUF header values that used to stop the process inside llama.cpp (GGML_ASSERT/GGML_ABORT: exit 134, a division
by zero, a hang) are refused before llama.cpp sees the file, with one line naming the key (engine/llm/validate.py). Each
load runs in a subprocess (tests/probe_load.py): on the old code these die instead of printing an error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ggufs
import pytest
from probe_load import run as probe

from moeslots.engine.llm import ggufhead, validate

# (model fixture, key, bad value, what the one line says); the comment: what llama.cpp did with it
CASES = [
    ("tiny_glm", "expert_used_count", 100, "expert_used_count = 100 is more than glm4moe.expert_count = 16"),  # 134
    ("tiny_glm", "expert_count", 4112, "expert_count = 4112: llama.cpp takes at most 1024"),                   # 134
    ("tiny_glm", "nextn_predict_layers", 200, "nextn_predict_layers = 200 but glm4moe.block_count = 4"),       # 134
    ("tiny_glm", "block_count", 0, "block_count = 0: llama.cpp takes 1 to 512"),                               # 134
    ("tiny_glm", "block_count", 600, "block_count = 600: llama.cpp takes 1 to 512"),                           # 134
    ("tiny_glm", "expert_count", 1, "expert_used_count = 4 is more than glm4moe.expert_count = 1"),            # 134
    ("tiny_glm", "attention.layer_norm_rms_epsilon", float("nan"), "norm epsilon must be a finite number"),    # 134
    ("tiny_glm", "attention.layer_norm_rms_epsilon", -1.0, "layer_norm_rms_epsilon = -1"),                     # 134
    ("tiny_glm", "rope.dimension_count", 15, "rope.dimension_count = 15: rotary dimensions come in pairs"),    # 134
    ("tiny_glm", "rope.dimension_count", 0, "rope.dimension_count = 0"),                                       # hang
    ("tiny_glm", "rope.dimension_count", 200, "rope.dimension_count = 200 is more than the head size 32"),     # 134
    ("tiny_glm", "expert_gating_func", 200, "expert_gating_func = 200: llama.cpp knows 0, 1, 2, 3, 4"),       # 134
    ("tiny_glm", "expert_count", 15, "blk.1.ffn_gate_inp.weight has shape [128, 16]; the header says [128, 15]"),
    ("tiny_ds2", "expert_group_count", 3, "expert_group_count = 3 does not divide deepseek2.expert_count = 16"),
    ("tiny_ds2", "expert_group_used_count", 0, "expert_group_used_count = 0: must be 1 to 3"),                 # 134
    ("tiny_ds2", "attention.head_count_kv", 2, "head_count_kv = 2: an MLA model has one latent KV head"),      # 134
    ("tiny_ds2", "attention.key_length", 81, "key_length = 81: MLA wants kv_lora_rank + rotary dims = 80"),    # 134
    ("tiny_ds2", "attention.key_length_mla", 1, "leaves no non-rotary head dimensions"),                       # 134
    ("tiny_q35", "ssm.inner_size", 65, "ssm.inner_size = 65: the delta-net layers want"),                      # 134
    ("tiny_q35", "full_attention_interval", 0, "full_attention_interval = 0: must be at least 1"),             # SIGFPE
    ("tiny_q35", "rope.dimension_sections[2]", 511,                                                            # 134
     ", 511, 0]: each >= 0, the first three not all 0, together at most the head size"),
]


@pytest.mark.parametrize("fixture,key,value,needle", CASES, ids=[f"{c[0]}-{c[1]}={c[2]}" for c in CASES])
def test_a_bad_header_value_is_one_line_not_an_abort(request: pytest.FixtureRequest, tmp_path: Path, fixture: str,
                                                     key: str, value: object, needle: str) -> None:
    src: Path = request.getfixturevalue(fixture)
    arch = str(ggufhead.read_header(src).get("general.architecture"))
    bad = ggufs.write_with(src, tmp_path / "bad.gguf", ggufs.find_slot(src, f"{arch}.{key}"), value)
    line = probe(bad, timeout=30)
    assert line.startswith("error: ") and "has an inconsistent header" in line and needle in line, line


def test_the_issue_cases_through_the_cli(tiny_glm: Path, tmp_path: Path) -> None:
    """expert_used_count 6 -> 100, expert_count 16 -> 4112, nextn_predict_layers 1 -> 200 ended in exit 134
    and a backtrace; now one line, exit 2."""
    for key, value in (("expert_used_count", 100), ("expert_count", 4112), ("nextn_predict_layers", 200)):
        bad = ggufs.write_with(tiny_glm, tmp_path / f"{key}.gguf", ggufs.find_slot(tiny_glm, f"glm4moe.{key}"), value)
        r = subprocess.run([sys.executable, "-m", "moeslots", "generate", str(bad), "-n", "2"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2, (key, r.returncode, r.stderr[-800:])
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("moeslots: error: ") and f"glm4moe.{key} = {value}" in err[0]


def test_a_broken_chat_template_is_one_line(tiny_glm: Path, tmp_path: Path) -> None:
    """A template jinja cannot parse raised a TemplateSyntaxError out of every chat (a traceback in `record`)."""
    slot = ggufs.find_slot(tiny_glm, "tokenizer.chat_template")
    text = bytes(slot.value).replace(b"endfor", b"endfoo")            # type: ignore[arg-type]
    line = probe(ggufs.write_with(tiny_glm, tmp_path / "tmpl.gguf", slot, text))
    assert line.startswith("error: the model's chat template (tokenizer.chat_template) cannot be used"), line


def test_a_damaged_architecture_string_is_one_line(tiny_glm: Path, tmp_path: Path) -> None:
    """A newline or a vertical tab in general.architecture made the refusal span lines (found by the fuzz)."""
    for raw in (b"glm4mo\n", b"\x00\x00\x00\x00\x00\x00\x0b"):
        bad = ggufs.write_with(tiny_glm, tmp_path / "arch.gguf", ggufs.find_slot(tiny_glm, "general.architecture"), raw)
        line = probe(bad)
        assert line.startswith("error: ") and "unreadable general.architecture" in line, line


def test_valid_models_have_no_problems(tiny_glm: Path, tiny_qwen: Path, tiny_ds2: Path, tiny_q35: Path) -> None:
    from moeslots.engine.machine import bundled

    for p in (tiny_glm, tiny_qwen, tiny_ds2, tiny_q35, bundled.model()):
        assert validate.problems(ggufhead.read_header(p)) == [], p


def test_a_split_model_is_checked_across_its_shards() -> None:
    """The shape checks take every shard's tensors (moeslots models); a tensor not in the first shard is no error."""
    h = ggufhead.Header(3, {"general.architecture": "qwen3moe", "qwen3moe.block_count": 2,
                            "qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2,
                            "qwen3moe.embedding_length": 4}, (), 0)
    assert validate.problems(h) == []
    shard2 = [ggufhead.TensorInfo("blk.1.ffn_up_exps.weight", (4, 4, 7), 0, 0)]
    assert validate.problems(h, shard2) == ["blk.1.ffn_up_exps.weight has shape [4, 4, 7]; the header says 8 "
                                            "experts (its last dimension)"]


def test_models_lists_a_bad_file_with_its_reason(tiny_glm: Path, tmp_path: Path) -> None:
    from moeslots.engine.machine import discovery

    bad = ggufs.write_with(tiny_glm, tmp_path / "bad.gguf", ggufs.find_slot(tiny_glm, "glm4moe.expert_count"), 4112)
    info = discovery.describe(discovery.Found(bad, "dir", bad.name))
    assert info.error == "inconsistent header: glm4moe.expert_count = 4112: llama.cpp takes at most 1024 experts " \
                         "per layer"
