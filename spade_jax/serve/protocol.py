"""OpenAI request bodies to `Request`s: every field checked and bounded, errors in OpenAI's shape.

A request is adversarial input: unknown roles, wrong types, out-of-range sampling values,
oversize prompts and unsupported options are refused with a 4xx `ServeError` that names
the field, before anything reaches the scheduler; a prompt past the context in OpenAI's and
vLLM's words and code (`context_exceeded`), which clients act on. Unknown fields the official
clients send (`user`, `stream_options`, `metadata`, ...) are accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from spade_jax.serve import tools as tools_lib
from spade_jax.serve.errors import ServeError

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 64
MAX_CHOICES = 8
MAX_MESSAGES = 1024


@dataclasses.dataclass(frozen=True)
class Sampling:
    """What a request's replies sample with (each on its own engine row, beside any other settings)."""

    temperature: float
    top_p: float
    top_k: int = 0  # vLLM's extension: 0 (or -1) keeps every token


@dataclasses.dataclass(frozen=True)
class Request:
    """One validated generation request: `n` replies to `prompt_tokens`."""

    kind: str  # "chat" or "completion"
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    sampling: Sampling
    stop: tuple[str, ...]
    seed: int | None
    n: int
    logprobs: bool
    stream: bool
    include_usage: bool
    tools: tuple[str, ...]  # declared tool names (chat): replies' tool calls are parsed out
    forced: tuple[str, ...] = ()  # a forced call's candidate names (`tool_choice` "required" or named)


@dataclasses.dataclass(frozen=True)
class Limits:
    """The server's bounds on one request."""

    context: int  # prompt + max_tokens
    max_tokens: int  # per reply
    max_choices: int  # n, at most the engine's rows


def _bad(message: str, param: str | None = None) -> ServeError:
    return ServeError(400, message, param)


def _number(body: dict, name: str, default: float, low: float, high: float, *, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"'{name}' must be a number, got {type(value).__name__}", name)
    if not (low < value if low_open else low <= value) or value > high:
        raise _bad(f"'{name}' must be in {'(' if low_open else '['}{low}, {high}], got {value}", name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer, got {type(value).__name__}", name)
    if not low <= value <= high:
        raise _bad(f"'{name}' must be in [{low}, {high}], got {value}", name)
    return value


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"'{name}' must be a boolean, got {type(value).__name__}", name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP_STRINGS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise _bad(f"'stop' takes at most {MAX_STOP_STRINGS} non-empty strings of at most {MAX_STOP_CHARS} "
                   "characters", "stop")
    return tuple(stops)


def _refuse_unsupported(body: dict) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise _bad(f"'{name}' is not supported (only 0)", name)
    if body.get("logit_bias"):
        raise _bad("'logit_bias' is not supported", "logit_bias")
    if body.get("top_logprobs") not in (None, 0):
        raise _bad("'top_logprobs' is not supported (only 0): logprobs gives the chosen tokens' log-probs",
                   "top_logprobs")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise _bad("'response_format' is not supported (only {'type': 'text'})", "response_format")


def context_exceeded(context: int, prompt: int, completion: int, kind: str) -> ServeError:
    """The overflow refusal in OpenAI's (and vLLM's) words and code, which clients act on: litellm
    raises its ContextWindowExceededError on "This model's maximum context length is" (its
    context-window fallbacks then run), the `openai` client's error carries the code."""
    where = "messages" if kind == "chat" else "prompt"
    return ServeError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                      f"{prompt + completion} tokens ({prompt} in the {where}, {completion} in the completion). "
                      f"Please reduce the length of the {where} or completion.", where, code="context_length_exceeded")


def _common(body: dict, kind: str, prompt_tokens: list[int], limits: Limits, tools: tuple[str, ...],
            model_id: str, forced: tuple[str, ...] = ()) -> Request:
    model = body.get("model")
    if not isinstance(model, str):
        raise _bad("'model' must be a string", "model")
    if model != model_id:
        raise ServeError(404, f"the model '{model}' does not exist; this server serves '{model_id}'", "model",
                         "model_not_found")
    _refuse_unsupported(body)
    room = limits.context - len(prompt_tokens)
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, name, None, 1, limits.max_tokens)
    if max_tokens is None and room < 1:
        raise context_exceeded(limits.context, len(prompt_tokens), 1, kind)
    if max_tokens is None:
        max_tokens = min(room, limits.max_tokens)
    elif max_tokens > room:
        raise context_exceeded(limits.context, len(prompt_tokens), max_tokens, kind)
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    logprobs = body.get("logprobs")
    if kind == "completion" and isinstance(logprobs, int) and not isinstance(logprobs, bool):
        if logprobs != 0 and logprobs != 1:
            raise _bad("'logprobs' above 1 is not supported: only the chosen token's log-prob", "logprobs")
        logprobs = True
    return Request(
        kind=kind, prompt_tokens=tuple(prompt_tokens), max_tokens=max_tokens,
        sampling=Sampling(_number(body, "temperature", 1.0, 0.0, 2.0),
                          _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
                          max(0, _integer(body, "top_k", 0, -1, 2**31 - 1))),
        stop=_stop(body), seed=_integer(body, "seed", None, -(2**63), 2**64 - 1),
        n=_integer(body, "n", 1, 1, limits.max_choices),
        logprobs=_boolean({"logprobs": logprobs}, "logprobs"), stream=_boolean(body, "stream"),
        include_usage=bool((stream_options or {}).get("include_usage")), tools=tools, forced=forced,
    )


def chat_request(body: Any, tokenizer, limits: Limits, model_id: str) -> Request:
    """A `/v1/chat/completions` body: messages (and tools) rendered through the model's chat template."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list", "messages")
    if len(messages) > MAX_MESSAGES:
        raise _bad(f"at most {MAX_MESSAGES} messages", "messages")
    tool_specs, forced = tools_lib.parse_tools(body.get("tools"), body.get("tool_choice"))
    chat = tools_lib.to_chat(messages, tool_specs, tokenizer.escape_special)
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    return _common(body, "chat", prompt, limits, tuple(t.name for t in tool_specs), model_id, forced)


def completion_request(body: Any, tokenizer, limits: Limits, model_id: str) -> Request:
    """A `/v1/completions` body: one prompt, as text (raw, no chat template) or as token ids."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("'prompt' is empty", "prompt")
        tokens = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if min(prompt) < 0 or max(prompt) >= tokenizer.vocab_size:
            raise _bad(f"'prompt' token ids must be in [0, {tokenizer.vocab_size})", "prompt")
        tokens = list(prompt)
    else:
        raise _bad("'prompt' must be one non-empty string or one non-empty list of token ids", "prompt")
    for name in ("echo", "suffix"):
        if body.get(name):
            raise _bad(f"'{name}' is not supported", name)
    if body.get("best_of") not in (None, 1):
        raise _bad("'best_of' is not supported (only 1)", "best_of")
    if not tokens:
        raise _bad("'prompt' encodes to no tokens", "prompt")
    return _common(body, "completion", tokens, limits, (), model_id)
