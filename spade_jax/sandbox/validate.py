"""Trusted-side verdicts on what a worker reports: shape, types, ranges, sizes and text.

Workers are untrusted, so every message is checked here from its raw JSON form
(``protocol.raw_value``) before anything reaches the caller. ``check_message`` runs first
on every decoded frame: exact JSON types only, bounded depth and node count, integers
that fit 64 bits, well-formed tuple/opaque markers, and it walks iteratively, so nothing
a worker sends can make the host recurse without bound or raise an unexpected error.
The later checks return clean Python values (every string through ``text.clean_text``:
no lone surrogates or control characters) or raise ``ContractViolation`` whose message
names what the environment did wrong. Pure functions, standard library only.
"""

from __future__ import annotations

import json
import math

from spade_jax.sandbox.protocol import OPAQUE_KEY, TUPLE_KEY, ProtocolError
from spade_jax.text import clean_text

MAX_ERROR_CHARS = 4000
MAX_INFO_BYTES = 65536
MAX_DEPTH = 40  # the worker marks values nested deeper than 32 opaque; the envelope adds a few
MAX_NODES = 200_000
_INT_BOUND = 1 << 63
_JSON_TYPES = (dict, list, str, int, float, bool, type(None))


class ContractViolation(ValueError):
    """The environment returned a value that breaks the contract."""


class EnvFailure(Exception):
    """The environment raised (or the worker reported a failure); the message is the worker's text."""


def check_message(message) -> object:
    """``message`` unchanged if its shape is acceptable, else ProtocolError naming why.

    Iterative (an explicit stack), so any nesting a hand-written frame holds is refused
    without recursion; types are compared exactly.
    """
    stack, nodes = [(message, 0)], 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ProtocolError(f"message has more than {MAX_NODES} values")
        kind = type(value)
        if kind not in _JSON_TYPES:
            raise ProtocolError(f"message holds a value of type {kind.__name__}")
        if kind is int and not -_INT_BOUND <= value < _INT_BOUND:
            raise ProtocolError("message holds an integer outside 64 bits")
        if kind is dict or kind is list:
            if depth >= MAX_DEPTH:
                raise ProtocolError(f"message is nested deeper than {MAX_DEPTH} levels")
            if kind is dict:
                if (TUPLE_KEY in value and (len(value) != 1 or type(value[TUPLE_KEY]) is not list)) or (
                        OPAQUE_KEY in value and (len(value) != 1 or type(value[OPAQUE_KEY]) is not str)):
                    raise ProtocolError("message holds a malformed tuple or type marker")
                items = value.values()
            else:
                items = value
            stack.extend((item, depth + 1) for item in items)
    return message


def describe(raw) -> str:
    """The Python type name a raw value stands for, for error messages."""
    if type(raw) is dict:
        if TUPLE_KEY in raw:
            return f"tuple of length {len(raw[TUPLE_KEY])}" if type(raw[TUPLE_KEY]) is list else "tuple"
        if OPAQUE_KEY in raw:
            return clean_text(str(raw[OPAQUE_KEY])[:100])
        return "dict"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list"}.get(type(raw), "None")


def unwrap(reply) -> object:
    """The value of a worker reply ``{"ok": true, "value": ...}``; EnvFailure for ``{"ok": false}``."""
    if type(reply) is not dict or type(reply.get("ok")) is not bool:
        raise ProtocolError("reply is not an object with a boolean 'ok'")
    if not reply["ok"]:
        error = reply.get("error")
        raise EnvFailure(clean_text(str(error)[:MAX_ERROR_CHARS]) if error else "unknown failure")
    return reply.get("value")


def check_load(reply) -> dict:
    """What the worker says about the loaded class: name, tool-use kind, tool names, solution(), max_turns.

    Untrusted: used only for choosing probes and bounding episode length.
    """
    value = unwrap(reply)
    if type(value) is not dict:
        raise ProtocolError("load reply is not an object")
    name, tools = value.get("class"), value.get("tools", [])
    if type(name) is not str or type(tools) is not list or not all(type(t) is str for t in tools):
        raise ProtocolError("load reply has wrong field types")
    max_turns = value.get("max_turns")
    if type(max_turns) is not int or max_turns < 1:
        max_turns = None
    return {"class": clean_text(name[:200]), "tool_use": value.get("tool_use") is True,
            "tools": [clean_text(t[:200]) for t in tools[:64]], "has_solution": value.get("has_solution") is True,
            "max_turns": max_turns}


def _tuple(raw, size: int, what: str) -> list:
    if not (type(raw) is dict and type(raw.get(TUPLE_KEY)) is list and len(raw[TUPLE_KEY]) == size):
        raise ContractViolation(f"{what} must return a {size}-tuple, got {describe(raw)}")
    return raw[TUPLE_KEY]


def check_observation(raw, max_chars: int) -> str:
    if type(raw) is not str:
        raise ContractViolation(f"observation must be str, got {describe(raw)}")
    if len(raw) > max_chars:
        raise ContractViolation(f"observation has {len(raw)} characters, more than the limit {max_chars}")
    return clean_text(raw)


def check_info(raw) -> dict:
    if type(raw) is not dict or TUPLE_KEY in raw or OPAQUE_KEY in raw:
        raise ContractViolation(f"info must be a dict, got {describe(raw)}")
    info = _plain(raw, "info")
    if len(json.dumps(info)) > MAX_INFO_BYTES:
        raise ContractViolation(f"info is larger than {MAX_INFO_BYTES} bytes as JSON")
    return info


def _plain(raw, path: str):
    """Raw data back to plain JSON values (tuples become lists); opaque values are violations."""
    kind = type(raw)
    if kind is dict:
        if TUPLE_KEY in raw:
            return [_plain(v, f"{path}[{i}]") for i, v in enumerate(raw[TUPLE_KEY])]
        if OPAQUE_KEY in raw:
            raise ContractViolation(f"{path} holds a {describe(raw)}, which is not JSON-serialisable")
        return {clean_text(k): _plain(v, f"{path}[{k[:40]!r}]") for k, v in raw.items()}
    if kind is list:
        return [_plain(v, f"{path}[{i}]") for i, v in enumerate(raw)]
    if kind is float and not math.isfinite(raw):
        raise ContractViolation(f"{path} holds a non-finite float")
    if kind is str:
        return clean_text(raw)
    return raw


def check_reward(raw) -> float:
    if type(raw) not in (int, float):
        raise ContractViolation(f"reward must be a real number, got {describe(raw)}")
    reward = float(raw)
    if not math.isfinite(reward):
        raise ContractViolation(f"reward must be finite, got {reward}")
    return reward


def check_flag(raw, name: str) -> bool:
    if type(raw) is not bool:
        raise ContractViolation(f"{name} must be bool, got {describe(raw)}")
    return raw


def check_reset(raw, max_chars: int) -> tuple[str, dict]:
    """``reset(seed)`` must return ``(observation: str, info: dict)``."""
    obs, info = _tuple(raw, 2, "reset()")
    return check_observation(obs, max_chars), check_info(info)


def check_step(raw, max_chars: int) -> tuple[str, float, bool, bool, dict]:
    """``step(action)`` must return ``(observation: str, reward: real, terminated: bool, truncated: bool, info: dict)``."""
    obs, reward, terminated, truncated, info = _tuple(raw, 5, "step()")
    return (check_observation(obs, max_chars), check_reward(reward), check_flag(terminated, "terminated"),
            check_flag(truncated, "truncated"), check_info(info))


def check_solution(raw, max_chars: int) -> str:
    """``solution()`` must return a str of reference actions, one per line."""
    if type(raw) is not str:
        raise ContractViolation(f"solution() must return str, got {describe(raw)}")
    if len(raw) > max_chars:
        raise ContractViolation(f"solution() returned {len(raw)} characters, more than the limit {max_chars}")
    return clean_text(raw)


def clip_reward(reward: float) -> float:
    """Episode rewards live in [-1, 1] (DESIGN: episode reward)."""
    return min(1.0, max(-1.0, reward))
