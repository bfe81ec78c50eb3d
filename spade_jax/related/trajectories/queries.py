"""User queries for chains, written by the policy, and the two checks a query must pass.

The writer sees the task text and the chain's trace (argument values and results, not the
tool names) and is asked for the message a user would send: the goal stated in their own
words, no steps, no tool names, no call syntax.

`spelled_out` rejects a query that gives the calls away:
  * call syntax: ``<tool_call>``, ``</tool_call>``, ``"name":`` or ``"arguments":``;
  * a tool name: an identifier-like name (with ``_``, a digit or an inner capital, e.g.
    ``get_price``) anywhere as a word; a plain-word name (``price``) when written as a call
    (``price(``) or quoted in backticks or quotes: plain words stay usable in prose
    ("what is the price of milk?");
  * the exact argument JSON of one of the chain's calls (``{"item": "milk"}``).

`ungrounded` rejects a query that lacks a value the user must supply (an argument value of a
call that no earlier result of the chain holds): no agent could reach the chain from it.

Verification (`verify_queries`): the agent is shown only the query and the tool list (as
`EpisodeRequest.observation`, the environment reset with the chain's seed) and plays; it
passes when its tool results reach the chain's end state (`chains.reaches_end_state`),
``verified_by="agent"``. When it does not, the reference chain is replayed in a fresh
episode and the example kept with ``verified_by="reference"`` if the replay reproduces
the recorded results (else it is dropped: the environment is not deterministic).

Program text reaches the writer escaped (`limits.program_text`: chain task texts and results
already are, `query_prompt` escapes its whole message again), and `escape_chats` applies the
policy tokenizer's own `escape_special` on top; the written query is escaped as well.
Transcript results are compared escaped the same way (`transcript_results`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence

from spade_jax.agent.rollout import EpisodeRequest
from spade_jax.envs.tool_use import TOOL_CALL, render_tool_list
from spade_jax.related.trajectories.chains import Chain, reaches_end_state, replay
from spade_jax.related.trajectories.graph import ToolProbe
from spade_jax.related.trajectories.limits import program_text
from spade_jax.text import clean_text

WRITER_SYSTEM_PROMPT = "You write realistic requests that users send to an assistant."
_CALL_SYNTAX = ("<tool_call>", "</tool_call>", '"name":', '"arguments":')


@dataclasses.dataclass(frozen=True)
class QueryConfig:
    """How queries are written: reply length, sampling temperature, the longest query kept."""

    max_new_tokens: int = 96
    temperature: float = 0.7
    max_query_chars: int = 600

    def __post_init__(self):
        if self.max_new_tokens < 1 or self.max_query_chars < 1:
            raise ValueError("QueryConfig.max_new_tokens and max_query_chars must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"QueryConfig.temperature must be >= 0, got {self.temperature}")


def query_prompt(chain: Chain) -> list[dict]:
    """The chat asking for a user query for ``chain``: task text and trace, no tool names."""
    trace = "\n".join(
        f"{i}. asked with {', '.join(f'{k}={json.dumps(v)}' for k, v in call.arguments.items())} -> {result}"
        for i, (call, result) in enumerate(zip(chain.calls, chain.results), 1))
    user = (
        f"Setting: {chain.task}\n\nAn assistant with tools found out the following, step by step:\n{trace}\n\n"
        "Write the one message a user would send so that the assistant has to find out exactly this. "
        "State what the user wants to know in your own words; do not list steps, do not name tools or "
        "functions, do not write tool calls or JSON. Reply with the message only."
    )
    return [{"role": "system", "content": WRITER_SYSTEM_PROMPT}, {"role": "user", "content": program_text(user)}]


def escape_chats(tokenizer, chats: Sequence[Sequence[dict]]) -> list[list[dict]]:
    """``chats`` with every message's content through ``tokenizer.escape_special`` (the specials
    of the tokenizer that will read them, on top of `limits.program_text`)."""
    return [[{**m, "content": tokenizer.escape_special(m["content"])} for m in chat] for chat in chats]


def clean_query(text: str, max_chars: int) -> str:
    """The reply as a query: one paragraph, outer quotes dropped, escaped, at most ``max_chars``."""
    text = clean_text(text or "", max_chars * 2)
    text = re.sub(r"\s+", " ", text).strip().strip('"').strip()
    return program_text(text)[:max_chars].strip()


def spelled_out(query: str, chain: Chain, tool_names: Sequence[str]) -> str | None:
    """Why ``query`` gives the chain's calls away (module docstring), or None when it does not."""
    lowered = query.lower()
    for marker in _CALL_SYNTAX:
        if marker in lowered:
            return f"call syntax {marker!r}"
    for name in tool_names:
        word = re.escape(name.lower())
        identifier = "_" in name or any(c.isdigit() for c in name) or any(c.isupper() for c in name[1:])
        if identifier and re.search(rf"(?<![\w]){word}(?![\w])", lowered):
            return f"names tool {name!r}"
        if re.search(rf"(?<![\w]){word}\s*\(|[`'\"]{word}[`'\"]", lowered):
            return f"names tool {name!r}"
    for call in chain.calls:
        for separators in ((", ", ": "), (",", ":")):
            if json.dumps(call.arguments, separators=separators).lower() in lowered:
                return "argument JSON"
    return None


def ungrounded(query: str, chain: Chain) -> str | None:
    """Why ``query`` cannot lead to the chain, or None: every argument value the user must supply
    (one found in no earlier result of the chain) has to appear in the query, since the
    verifying agent sees only the query and the tool list."""
    lowered = query.lower()
    seen = ""
    for call, result in zip(chain.calls, chain.results):
        for value in call.arguments.values():
            text = str(value).lower()
            if text not in lowered and text not in seen:
                return f"missing value {str(value)[:40]!r}"
        seen += "\n" + result.lower()
    return None


def write_queries(chains: Sequence[Chain], complete: Callable[[list[list[dict]]], list[str]],
                  cfg: QueryConfig = QueryConfig()) -> list[str]:
    """One cleaned query per chain; ``complete(chats) -> texts`` is the policy (or a stand-in)."""
    if not chains:
        return []
    return [clean_query(text, cfg.max_query_chars) for text in complete([query_prompt(c) for c in chains])]


def agent_observation(query: str, schemas: list[dict]) -> str:
    """What the verifying agent is shown: the query and the tool list."""
    return f"{query}\n\n{render_tool_list(schemas)}"


def transcript_results(messages: Sequence[dict]) -> list[str]:
    """The tool results of a transcript, escaped (`limits.program_text`): ``role="tool"`` messages
    (the export's chat format), or, in an agent transcript, the observation after each assistant
    ``<tool_call>``."""
    results = []
    for i, message in enumerate(messages):
        if message.get("role") == "tool":
            results.append(str(message.get("content", "")))
        elif (message.get("role") == "assistant" and TOOL_CALL.search(str(message.get("content") or ""))
              and i + 1 < len(messages) and messages[i + 1].get("role") == "user"):
            results.append(str(messages[i + 1].get("content", "")))
    return [program_text(r) for r in results]


def verify_queries(chains: Sequence[Chain], queries: Sequence[str], schemas: list[dict], source: str,
              probe: ToolProbe, play: Callable[[list[EpisodeRequest]], list], *, env_key: int = 0,
              env_kwargs: dict | None = None) -> list[str | None]:
    """``verified_by`` per chain: "agent", "reference", or None (dropped); see the module docstring.

    ``play(requests) -> trajectories`` (with ``.messages``) plays the agent, e.g.
    ``functools.partial(play_episodes, policy, pool, cfg=agent_cfg)``.
    """
    if not chains:
        return []
    requests = [EpisodeRequest(env_key, source, chain.seed, env_kwargs=dict(env_kwargs or {}),
                               observation=agent_observation(query, schemas))
                for chain, query in zip(chains, queries)]
    trajectories = play(requests)
    verdicts = []
    for chain, trajectory in zip(chains, trajectories):
        if reaches_end_state(chain.end_state, transcript_results(trajectory.messages)):
            verdicts.append("agent")
        elif replay(probe, chain.seed, chain.calls) == list(chain.results):
            verdicts.append("reference")
        else:
            verdicts.append(None)
    return verdicts
