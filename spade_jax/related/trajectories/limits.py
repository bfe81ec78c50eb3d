"""The bounds synthesis holds program output to, and the one way program text enters its output.

Programs are adversarial (a designer trained by RL writes them), so everything synthesis
takes from one (tool schemas, task texts, tool results) is bounded and escaped before it
reaches the query writer's prompt or an exported record:

* ``MAX_SOURCE_CHARS``: a longer program is not read (admission's own limit, ``max_code_chars``).
* ``MAX_SCHEMA_CHARS`` / ``MAX_SCHEMA_DEPTH`` / ``MAX_TOOLS`` / ``MAX_PARAMS``: the ``tools`` list
  as JSON, its nesting, its length and a tool's parameters; over any of them the program is
  rejected, and the size is counted while the list is read, so shared module constants cannot
  build a huge one first.
* ``MAX_TASK_CHARS``: the task text is cut to it with a marker (``…[N chars cut]``).
* ``MAX_RESULT_CHARS``: a longer tool reply is not a result (the call counts as failed), so no
  chain and no checker holds a cut result that the environment never returned.
* ``MAX_RECORD_CHARS``: an SFT record larger than this as JSON (many calls near the caps) is
  dropped and counted.

`program_text` is the escaping: valid Unicode without control characters
(`spade_jax.text.clean_text`) and every chat-format special-token spelling broken
(`models.tokenizer.escape_chat_markers`: exported records are read with tokenizers not known
here). It is idempotent, so text escaped twice is text escaped once.
"""

from __future__ import annotations

from spade_jax.models.tokenizer import escape_chat_markers
from spade_jax.text import clean_text

MAX_SOURCE_CHARS = 100_000
MAX_SCHEMA_CHARS = 16_384
MAX_SCHEMA_DEPTH = 10
MAX_TOOLS = 32
MAX_PARAMS = 16
MAX_TASK_CHARS = 4_000
MAX_RESULT_CHARS = 2_000
MAX_RECORD_CHARS = 65_536


def program_text(text: str, limit: int | None = None) -> str:
    """``text`` from a program as it may enter a prompt or a record, cut to ``limit`` with a marker."""
    return clean_text(escape_chat_markers(clean_text(text)), limit)


def escape_json(value):
    """A JSON value with every string in it (keys included) passed through `program_text`."""
    if isinstance(value, str):
        return program_text(value)
    if isinstance(value, dict):
        return {escape_json(k): escape_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [escape_json(v) for v in value]
    return value
