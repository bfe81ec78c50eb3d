"""Reading the action out of a model response.

The environment receives only the action, never the reasoning around it:
a tool call or final answer block (tool-use environments), else the last
``\\boxed{...}`` (reasoning games), else the raw text cut to a bounded length so a
malformed reply still reaches the environment and is judged there.
"""

from __future__ import annotations

import re

from spade_jax.envs.contract import extract_boxed

_BLOCK = re.compile(r"<(tool_call|answer)>.*?</\1>", re.DOTALL)
MAX_RAW_ACTION_CHARS = 512


def parse_action(response: str, max_raw_chars: int = MAX_RAW_ACTION_CHARS) -> str:
    """The action an environment should see for one model response."""
    block = _BLOCK.search(response)
    if block:
        return block.group(0).strip()
    boxed = extract_boxed(response)
    if boxed is not None:
        return f"\\boxed{{{boxed}}}"
    return response.strip()[:max_raw_chars]
