"""The bundled model is talked to in the format it was trained on: its GGUF chat template, rendered as chat
renderers do (transformers and llama.cpp trim the newline after a block tag), gives scripts/train's turn format,
and a greedy reply to a plain question runs on instead of ending at once (a template that lost the newline after
the question made the model end every reply after one token)."""

from __future__ import annotations

from moeslots.engine.api import EngineConfig, Message
from moeslots.engine.llm.ggufhead import read_header
from moeslots.engine.llm.template import render
from moeslots.engine.machine import bundled
from moeslots.engine.runtime.engine import Engine

TRAINED = "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\nhello<|endoftext|>\n<|user|>\nand then?\n<|assistant|>\n"


def test_the_template_renders_the_trained_turn_format() -> None:
    source = str(read_header(bundled.model()).meta["tokenizer.chat_template"])
    msgs = [Message("system", "be brief"), Message("user", "hi"), Message("assistant", "hello"),
            Message("user", "and then?")]
    assert render(source, msgs) == TRAINED


def test_a_greedy_reply_runs_past_its_first_tokens() -> None:
    eng = Engine(EngineConfig(model=str(bundled.model()), mtp=False, max_tokens=64))
    try:
        done = list(eng.chat([Message("user", "Write a Python function that reads a CSV file and returns the rows "
                                           "as dictionaries.")]))[-1]
        assert done.stats.tokens == 64, (done.stats.tokens, done.text)
    finally:
        eng.close()
