"""A chat as the model reads it: its own chat template (Jinja, from the GGUF) with the generation prompt appended."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import jinja2

from . import native
from .api import Message
from .errors import EngineError

if TYPE_CHECKING:
    from .model import Model


def render_chat(model: "Model", messages: Sequence[Message]) -> str:
    """The model's own chat template (Jinja, from the GGUF), with the generation prompt appended."""
    tmpl = native.llama().llama_model_chat_template(model.ptr, None)
    if not tmpl:
        return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant: "
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    try:
        return env.from_string(tmpl.decode("utf-8", "replace")).render(
            messages=[{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - a damaged or unsupported template is the file's fault: one line
        raise EngineError(f"the model's chat template (tokenizer.chat_template) cannot be used: "
                          f"{type(e).__name__}: {e}") from None
