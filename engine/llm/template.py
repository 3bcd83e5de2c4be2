"""A chat as the model reads it: its own chat template (Jinja, from the GGUF) with the generation prompt appended.

Rendered the way the templates are written for (transformers' and llama.cpp's renderers): a sandboxed environment
with trim_blocks and lstrip_blocks, lenient undefined variables (`{%- if tools %}` is false, not an error),
`raise_exception` and `strftime_now`, `bos_token`/`eos_token`.
"""

from __future__ import annotations

import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..api import Message
from ..errors import EngineError
from ..native import lib as native

if TYPE_CHECKING:
    from .model import Model


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=_raise,
                       strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
    return env.from_string(source)


def render(source: str, messages: Sequence[Message], *, add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "") -> str:
    """`source` (a chat template) over `messages`; EngineError with one line when the template cannot be used."""
    try:
        return _compile(source).render(messages=[{"role": m.role, "content": m.content} for m in messages],
                                       add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                                       eos_token=eos_token)
    except Exception as e:  # a damaged or unsupported template is the file's fault: one line
        raise EngineError(f"the model's chat template (tokenizer.chat_template) cannot be used: "
                          f"{type(e).__name__}: {e}") from None


def _special(model: "Model") -> dict[str, Any]:
    L = native.llama()
    out = {}
    for key, fn in (("bos_token", L.llama_vocab_bos), ("eos_token", L.llama_vocab_eos)):
        tok = fn(model.vocab)
        out[key] = model.piece(tok, special=True).decode("utf-8", "replace") if tok >= 0 else ""
    return out


def render_chat(model: "Model", messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
    """The model's own chat template (Jinja, from the GGUF), with the generation prompt appended."""
    tmpl = native.llama().llama_model_chat_template(model.ptr, None)
    if not tmpl:
        return "".join(f"{m.role}: {m.content}\n" for m in messages) + ("assistant: " if add_generation_prompt else "")
    return render(tmpl.decode("utf-8", "replace"), messages, add_generation_prompt=add_generation_prompt,
                  **_special(model))


def generation_start(model: "Model", messages: Sequence[Message], toks: Sequence[int]) -> int:
    """Where the generation prompt begins in `toks` (the tokens of the full prompt): the tokens it shares with the
    chat rendered without it. The next turn re-renders this chat with the reply in place of the generation prompt,
    which templates may write differently (Qwen3.5/3.6 open a `<think>` block here and drop it from the history),
    so this, not the prompt's end, is the last position the next turn surely shares."""
    bare = model.tokenize(render_chat(model, messages, add_generation_prompt=False), add_special=True,
                          parse_special=True)
    q = 0
    for a, b in zip(bare, toks):
        if a != b:
            break
        q += 1
    return q
