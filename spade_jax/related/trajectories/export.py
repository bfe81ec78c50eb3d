"""Kept examples as JSONL: chat-format SFT records and RL tasks with their checker.

SFT record (what transformers' chat templates take for tool use, ``apply_chat_template(
record["messages"], tools=record["tools"])``)::

    {"messages": [{"role": "system", ...}, {"role": "user", "content": query},
                  {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                   "function": {"name": ..., "arguments": {...}}}]},
                  {"role": "tool", "name": ..., "content": result}, ...,
                  {"role": "assistant", "content": "<answer>last result</answer>"}],
     "tools": [schemas], "meta": {env, program_sha256, seed, env_kwargs, chain, results, verified_by}}

RL task: the query, the program source, its seed and constructor kwargs, the tools, and the
checker ``{"kind": "end_state", "results": [...]}``; `score_transcript` says whether an
agent transcript (chat format, or the agent's own ``<tool_call>`` turns) reached it.

Every string of a record is escaped (`limits.escape_json`: no chat-format special-token
spelling, no control character), whatever the example holds, except an RL task's
``program``: that is code to run in the sandbox, kept byte for byte (``program_sha256``),
and never text for a prompt. The checker's results are escaped too, and `score_transcript`
compares a transcript's results escaped the same way.

The files hold no literal special token even so (`spade_jax.text.json_text`): every ``<`` and ``>`` is
written ``\u003c`` / ``\u003e``, which breaks every special token of the tokenizers the
project ships (each holds one: the tests read them from the SmolLM2 GGUF and the bootstrap's
SentencePiece), so a consumer that tokenizes a line whole meets no live chat marker, and
``json.loads`` gives the program back byte for byte.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Sequence

from spade_jax.related.trajectories.chains import Call, Chain, EndState, reaches_end_state
from spade_jax.related.trajectories.limits import escape_json
from spade_jax.related.trajectories.queries import transcript_results
from spade_jax.text import json_text

SFT_SYSTEM_PROMPT = ("You are a helpful assistant with tools. Call tools to find what the user needs, "
                     "then give the answer as <answer>...</answer>.")
CHECKER_KIND = "end_state"


@dataclasses.dataclass(frozen=True)
class Example:
    """One kept trajectory: the environment it came from, its chain, query and who verified it."""

    env: str
    source: str
    schemas: list
    chain: Chain
    query: str
    verified_by: str
    env_kwargs: dict = dataclasses.field(default_factory=dict)

    @property
    def program_sha256(self) -> str:
        return hashlib.sha256(self.source.encode("utf-8", "surrogatepass")).hexdigest()


def sft_record(example: Example, system_prompt: str = SFT_SYSTEM_PROMPT) -> dict:
    """The chat-format record of ``example`` (module docstring)."""
    chain = example.chain
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": example.query}]
    for call, result in zip(chain.calls, chain.results):
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": call.tool, "arguments": call.arguments}}]})
        messages.append({"role": "tool", "name": call.tool, "content": result})
    messages.append({"role": "assistant", "content": f"<answer>{chain.end_state.answer}</answer>"})
    meta = {"env": example.env, "program_sha256": example.program_sha256, "seed": chain.seed,
            "env_kwargs": example.env_kwargs, "chain": [c.to_dict() for c in chain.calls],
            "results": list(chain.results), "verified_by": example.verified_by}
    return escape_json({"messages": messages, "tools": example.schemas, "meta": meta})


def rl_task(example: Example) -> dict:
    """The RL task of ``example``: play the program on its seed from the query; `score_transcript` checks it."""
    task = escape_json({"query": example.query, "env": example.env, "program_sha256": example.program_sha256,
                        "seed": example.chain.seed, "env_kwargs": example.env_kwargs, "tools": example.schemas,
                        "checker": {"kind": CHECKER_KIND, "results": list(example.chain.results)},
                        "verified_by": example.verified_by})
    return {"program": example.source, **task}


def record_chars(example: Example) -> int:
    """The size of the example's SFT record as JSON (`limits.MAX_RECORD_CHARS` bounds it)."""
    return len(json.dumps(sft_record(example), ensure_ascii=False))


def score_transcript(task: dict, messages: Sequence[dict]) -> bool:
    """Whether ``messages`` reached the task's end state: every checker result among its tool results."""
    checker = task["checker"]
    if checker.get("kind") != CHECKER_KIND:
        raise ValueError(f"unknown checker kind {checker.get('kind')!r}")
    return reaches_end_state(EndState(tuple(checker["results"])), transcript_results(messages))


def record_calls(record: dict) -> list[Call]:
    """The tool calls of an SFT record's assistant messages, in order."""
    return [Call(tc["function"]["name"], tc["function"]["arguments"])
            for m in record["messages"] if m.get("role") == "assistant" for tc in m.get("tool_calls") or ()]


def write_jsonl(path: str, records: Iterable[dict]) -> int:
    """Writes one JSON object per line (`json_text`); returns how many."""
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json_text(record) + "\n")
            count += 1
    return count


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
