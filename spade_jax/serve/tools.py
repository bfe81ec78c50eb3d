"""OpenAI messages and tools to the model's chat, and the model's tool calls back to OpenAI's.

The convention is the project's own (and Qwen's Hermes-style template's): the tools are
described in the system message as JSON function schemas, the model calls one as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and a tool's result comes back
in a user turn as ``<tool_response>...</tool_response>`` (consecutive results in one turn).
Every client-supplied string goes through the tokenizer's `escape_special`, so a message can
never close its turn or forge another role's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from typing import Any, Callable

from spade_jax.serve import client_json
from spade_jax.serve.errors import ServeError

TOOL_CALL_OPEN = "<tool_call>"
MAX_TOOLS = 64
MAX_TOOL_CALLS = 16
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    name: str
    schema: dict  # {"name", "description", "parameters"} as the system message shows it


def _bad(message: str, param: str) -> ServeError:
    return ServeError(400, message, param)


def parse_tools(tools: Any, tool_choice: Any) -> tuple[list[ToolSpec], tuple[str, ...]]:
    """The request's function tools and the names a forced call picks from: none for `tool_choice`
    "auto" (the default), every tool's for "required", one for a named function
    (``{"type": "function", "function": {"name": ...}}``); "none" drops the tools."""
    named = isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and isinstance(
        tool_choice.get("function"), dict) and isinstance(tool_choice["function"].get("name"), str)
    if tool_choice not in (None, "auto", "none", "required") and not named:
        raise _bad("'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'function': "
                   "{'name': NAME}}", "tool_choice")
    if tool_choice == "none":
        return [], ()
    if tools is None:
        if tool_choice == "required" or named:
            raise _bad("'tool_choice' forces a tool call but the request declares no 'tools'", "tool_choice")
        return [], ()
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise _bad(f"'tools' must be a list of at most {MAX_TOOLS} tools", "tools")
    specs = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise _bad(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", f"tools[{i}]")
        name, params = fn.get("name"), fn.get("parameters", {})
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise _bad(f"tools[{i}].function.name must be 1-64 characters of [A-Za-z0-9_.-]", f"tools[{i}]")
        if not isinstance(params, dict) or not isinstance(fn.get("description", ""), str):
            raise _bad(f"tools[{i}].function: 'parameters' must be an object, 'description' a string",
                       f"tools[{i}]")
        specs.append(ToolSpec(name, {"name": name, "description": fn.get("description", ""), "parameters": params}))
    if len({s.name for s in specs}) != len(specs):
        raise _bad("tool names must be unique", "tools")
    names = tuple(s.name for s in specs)
    if named:
        name = tool_choice["function"]["name"]
        if name not in names:
            raise _bad(f"'tool_choice' names the function '{name}', which 'tools' does not declare", "tool_choice")
        return specs, (name,)
    if tool_choice == "required" and not specs:
        raise _bad("'tool_choice' is 'required' but 'tools' is empty", "tool_choice")
    return specs, names if tool_choice == "required" else ()


def tools_prompt(specs: list[ToolSpec]) -> str:
    lines = "\n".join(json.dumps(s.schema, ensure_ascii=False) for s in specs)
    return ("You can call these tools, described as JSON function schemas:\n" + lines + "\n"
            "To call one, reply <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call>; "
            "each result comes back as <tool_response>...</tool_response>.")


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (None reads as "")."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise _bad(f"{where}.content must be a string or a list of text parts", where)


def _call_text(call: Any, where: str) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
        raise _bad(f"{where} must have function.name and function.arguments strings", where)
    arguments = client_json.loads(fn["arguments"], f"{where}.function.arguments", where)
    return TOOL_CALL_OPEN + json.dumps({"name": fn["name"], "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


def to_chat(messages: list, specs: list[ToolSpec], escape: Callable[[str], str]) -> list[dict]:
    """OpenAI messages as ``{"role", "content"}`` turns of the model's template."""
    chat: list[dict] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise _bad(f"{where}.role must be one of {', '.join(_ROLES)}", where)
        role, content = m["role"], escape(_text(m.get("content"), where))
        if role == "developer":
            role = "system"
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list) or len(calls) > MAX_TOOL_CALLS:
                raise _bad(f"{where}.tool_calls must be a list of at most {MAX_TOOL_CALLS} calls", where)
            parts = [content] if content else []
            parts += [escape(_call_text(c, f"{where}.tool_calls[{j}]")) for j, c in enumerate(calls)]
            content = "\n".join(parts)
        if role == "tool":
            response = f"<tool_response>\n{content}\n</tool_response>"
            if chat and chat[-1]["role"] == "user" and chat[-1]["content"].endswith("</tool_response>"):
                chat[-1]["content"] += "\n" + response
                continue
            role, content = "user", response
        chat.append({"role": role, "content": content})
    if specs:
        prompt = escape(tools_prompt(specs))
        if chat[0]["role"] == "system":
            chat[0] = {"role": "system", "content": chat[0]["content"] + "\n\n" + prompt}
        else:
            chat.insert(0, {"role": "system", "content": prompt})
    return chat


def openai_call(name: str, arguments: str) -> dict:
    """A tool call in OpenAI's shape (`arguments`: JSON text), with a fresh id."""
    return {"id": "call_" + secrets.token_hex(12), "type": "function", "function": {"name": name, "arguments": arguments}}


def split_tool_calls(text: str, names: tuple[str, ...]) -> tuple[str | None, list[dict]]:
    """`(content, tool_calls)` of a reply: its well-formed calls of declared tools, in OpenAI's
    shape; the text before the first call is the content (None when empty). A reply without
    a well-formed call is all content."""
    calls = []
    for match in _CALL.finditer(text):
        try:  # the model's text: as hostile as a client's (a prompt can ask for a call nested 10,000 deep)
            call = client_json.loads(match.group(1), "a tool call")
        except ServeError:
            continue
        if (isinstance(call, dict) and call.get("name") in names and isinstance(call.get("arguments", {}), dict)
                and len(calls) < MAX_TOOL_CALLS):
            calls.append(openai_call(call["name"], json.dumps(call.get("arguments", {}), ensure_ascii=False)))
    if not calls:
        return text, []
    content = text[: text.index(TOOL_CALL_OPEN)].strip()
    return content or None, calls
