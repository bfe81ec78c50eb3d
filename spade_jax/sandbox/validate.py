"""Trusted-side verdicts on what a worker reports: types, ranges and sizes.

Workers are untrusted, so every reply is checked here from its raw JSON form
(``protocol.raw_value``) before anything reaches the caller. Each check returns clean
Python values or raises ``ContractViolation`` whose message names what the
environment did wrong. Pure functions, standard library only.
"""

from __future__ import annotations

import json
import math

from spade_jax.sandbox.protocol import OPAQUE_KEY, TUPLE_KEY, ProtocolError

MAX_ERROR_CHARS = 4000
MAX_INFO_BYTES = 65536


class ContractViolation(ValueError):
    """The environment returned a value that breaks the contract."""


class EnvFailure(Exception):
    """The environment raised (or the worker reported a failure); the message is the worker's text."""


def describe(raw) -> str:
    """The Python type name a raw value stands for, for error messages."""
    if isinstance(raw, dict):
        if TUPLE_KEY in raw:
            return f"tuple of length {len(raw[TUPLE_KEY])}" if isinstance(raw[TUPLE_KEY], list) else "tuple"
        if OPAQUE_KEY in raw:
            return str(raw[OPAQUE_KEY])[:100]
        return "dict"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list"}.get(type(raw), "None")


def unwrap(reply) -> object:
    """The value of a worker reply ``{"ok": true, "value": ...}``; EnvFailure for ``{"ok": false}``."""
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise ProtocolError("reply is not an object with a boolean 'ok'")
    if not reply["ok"]:
        error = reply.get("error")
        raise EnvFailure(str(error)[:MAX_ERROR_CHARS] if error else "unknown failure")
    return reply.get("value")


def check_load(reply) -> dict:
    """What the worker says about the loaded class: name, tool-use kind, tool names, solution(), max_turns.

    Untrusted: used only for choosing probes and bounding episode length.
    """
    value = unwrap(reply)
    if not isinstance(value, dict):
        raise ProtocolError("load reply is not an object")
    name, tools = value.get("class"), value.get("tools", [])
    if not isinstance(name, str) or not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise ProtocolError("load reply has wrong field types")
    max_turns = value.get("max_turns")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        max_turns = None
    return {"class": name[:200], "tool_use": value.get("tool_use") is True,
            "tools": [t[:200] for t in tools[:64]], "has_solution": value.get("has_solution") is True,
            "max_turns": max_turns}


def _tuple(raw, size: int, what: str) -> list:
    if not (isinstance(raw, dict) and isinstance(raw.get(TUPLE_KEY), list) and len(raw[TUPLE_KEY]) == size):
        raise ContractViolation(f"{what} must return a {size}-tuple, got {describe(raw)}")
    return raw[TUPLE_KEY]


def check_observation(raw, max_chars: int) -> str:
    if not isinstance(raw, str):
        raise ContractViolation(f"observation must be str, got {describe(raw)}")
    if len(raw) > max_chars:
        raise ContractViolation(f"observation has {len(raw)} characters, more than the limit {max_chars}")
    return raw


def check_info(raw) -> dict:
    if not isinstance(raw, dict) or TUPLE_KEY in raw or OPAQUE_KEY in raw:
        raise ContractViolation(f"info must be a dict, got {describe(raw)}")
    info = _plain(raw, "info")
    if len(json.dumps(info)) > MAX_INFO_BYTES:
        raise ContractViolation(f"info is larger than {MAX_INFO_BYTES} bytes as JSON")
    return info


def _plain(raw, path: str):
    """Raw data back to plain JSON values (tuples become lists); opaque values are violations."""
    if isinstance(raw, dict):
        if TUPLE_KEY in raw:
            return [_plain(v, f"{path}[{i}]") for i, v in enumerate(raw[TUPLE_KEY])]
        if OPAQUE_KEY in raw:
            raise ContractViolation(f"{path} holds a {describe(raw)}, which is not JSON-serialisable")
        return {k: _plain(v, f"{path}[{k!r}]") for k, v in raw.items()}
    if isinstance(raw, list):
        return [_plain(v, f"{path}[{i}]") for i, v in enumerate(raw)]
    if isinstance(raw, float) and not math.isfinite(raw):
        raise ContractViolation(f"{path} holds a non-finite float")
    return raw


def check_reward(raw) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ContractViolation(f"reward must be a real number, got {describe(raw)}")
    reward = float(raw)
    if not math.isfinite(reward):
        raise ContractViolation(f"reward must be finite, got {reward}")
    return reward


def check_flag(raw, name: str) -> bool:
    if not isinstance(raw, bool):
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
    if not isinstance(raw, str):
        raise ContractViolation(f"solution() must return str, got {describe(raw)}")
    if len(raw) > max_chars:
        raise ContractViolation(f"solution() returned {len(raw)} characters, more than the limit {max_chars}")
    return raw


def clip_reward(reward: float) -> float:
    """Episode rewards live in [-1, 1] (DESIGN: episode reward)."""
    return min(1.0, max(-1.0, reward))
