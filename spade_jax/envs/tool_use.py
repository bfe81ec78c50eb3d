"""`ToolUseEnv`: the base class for tool-use environments.

A subclass writes only the task and its tools:

    class LibraryEnv(ToolUseEnv):
        tools = [{"type": "function", "function": {
            "name": "lookup", "description": "Find a book by title.",
            "parameters": {"type": "object",
                           "properties": {"title": {"type": "string"}},
                           "required": ["title"]}}}]

        def reset(self, seed=None):
            rng = random.Random(seed)
            self.shelves = {...}
            self.expected_answer = "..."
            return "Which shelf holds ...?", {}

        def tool_lookup(self, title):
            return self.shelves.get(title, "not found")

        def solution(self):
            return '<tool_call>{"name": "lookup", "arguments": {"title": "..."}}</tool_call>\\n<answer>...</answer>'

The base keeps the turn count, appends the tool list and the call format to the
first observation, parses each action, dispatches ``<tool_call>`` to
``tool_<name>`` and scores ``<answer>`` with ``check_answer`` (normalised string
equality with ``self.expected_answer`` unless overridden). A wrong answer scores 0,
or, for an environment made with ``partial_credit=True``, ``PARTIAL_CREDIT_SCALE``
times ``closeness(answer)`` (a subclass that can grade how near an answer is
overrides it; the default grades nothing).

Standard library only: this runs inside sandbox workers.
"""

from __future__ import annotations

import functools
import json
import re

from spade_jax.envs.contract import PARTIAL_CREDIT_SCALE, SUCCESS_REWARD

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)  # a tool-call block in an action
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FORMAT = (
    'Call a tool with <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call> '
    "(one call per turn). When you know the answer, reply <answer>your answer</answer>."
)


def tool_call_action(name: str, arguments: dict) -> str:
    """The action that calls tool ``name`` with ``arguments``, in the format `ToolUseEnv` reads."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def normalize_answer(text: str) -> str:
    """Lower-case, trim, collapse whitespace and drop trailing punctuation."""
    return re.sub(r"\s+", " ", str(text)).strip().strip(".").strip().lower()


def render_tool_list(tools: list[dict]) -> str:
    """The tool list and call format shown to the agent, from the tool schemas alone (the
    trusted side renders it without instantiating an environment)."""
    lines = ["Tools:"]
    for tool in tools:
        fn = tool.get("function", tool)
        params = fn.get("parameters", {}).get("properties", {})
        args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in params.items())
        lines.append(f"- {fn['name']}({args}): {fn.get('description', '')}")
    lines.append(_FORMAT)
    return "\n".join(lines)


class ToolUseEnv:
    """Base for environments played through tool calls and a final answer."""

    tools: list[dict] = []
    expected_answer: str = ""

    def __init__(self, max_turns: int = 10, partial_credit: bool = False, **kwargs):
        self.max_turns = max_turns
        self.partial_credit = partial_credit
        self.turn = 0
        self.done = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "reset" in cls.__dict__:
            cls.reset = _wrap_reset(cls.__dict__["reset"])

    def tool_instructions(self) -> str:
        """The tool list and call format appended to the first observation."""
        return render_tool_list(self.tools)

    def check_answer(self, answer: str) -> bool:
        return normalize_answer(answer) == normalize_answer(self.expected_answer)

    def closeness(self, answer: str) -> float:
        """How near a wrong answer is, in [0, 1]; scored only with ``partial_credit``."""
        return 0.0

    def step(self, action: str):
        if self.done:
            return "The episode is over.", 0.0, True, False, {"error": "episode over"}
        self.turn += 1
        reward, terminated, info = 0.0, False, {}
        answer = _ANSWER.search(action or "")
        call = TOOL_CALL.search(action or "")
        if answer and (not call or answer.start() < call.start()):
            correct = bool(self.check_answer(answer.group(1)))
            if correct:
                reward = SUCCESS_REWARD
            elif self.partial_credit:
                reward = PARTIAL_CREDIT_SCALE * min(1.0, max(0.0, float(self.closeness(answer.group(1)))))
            terminated = True
            observation = "Correct." if correct else "Incorrect."
            info["correct"] = correct
        elif call:
            observation = self._dispatch(call.group(1), info)
        else:
            observation = "No tool call or answer found. " + _FORMAT
            info["error"] = "format"
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        return observation, reward, terminated, truncated, info

    def _dispatch(self, payload: str, info: dict) -> str:
        try:
            request = json.loads(payload)
            name = request["name"]
            arguments = request.get("arguments", {}) or {}
            if not isinstance(arguments, dict):
                raise TypeError("arguments must be an object")
        except (ValueError, KeyError, TypeError) as err:
            info["error"] = "bad_call"
            return f"Error: malformed tool call ({err}). {_FORMAT}"
        method = getattr(self, f"tool_{name}", None) if isinstance(name, str) else None
        known = [t.get("function", t)["name"] for t in self.tools]
        if method is None or name not in known:
            info["error"] = "unknown_tool"
            return f"Error: unknown tool {name!r}. Available: {', '.join(known)}."
        try:
            result = method(**arguments)
        except Exception as err:  # a tool's bug or a hostile argument is the agent's observation
            info["error"] = "tool_error"
            return f"Error: {name} failed: {err}"
        info["tool"] = name
        return result if isinstance(result, str) else json.dumps(result, default=str)


def _wrap_reset(user_reset):
    @functools.wraps(user_reset)
    def reset(self, seed=None):
        self.turn = 0
        self.done = False
        observation, info = user_reset(self, seed)
        return f"{observation}\n\n{self.tool_instructions()}", info

    return reset
