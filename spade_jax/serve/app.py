"""The ASGI app (Starlette): OpenAI's routes over a `Scheduler`, replies whole or as server-sent events.

Each request is validated (`protocol`), queued on the scheduler and answered from the
events the scheduler thread sends it: deltas and finished choices, then exactly one
terminal event (usage, or an error). A client that disconnects, streaming or not, cancels
its job, whose rows free at the next segment. Every error is JSON in OpenAI's shape.

`RequestLog` wraps the app: one line per request on the ``spade_jax.serve`` logger (client,
method, route, status, prompt+completion tokens, seconds, and why when refused). A client
that disconnects (mid-body, mid-reply) is one info line, never a traceback; a server bug is
one error line with its traceback, and the client gets a 500. With ``access_log=False``
only refused, failed and disconnected requests are logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from spade_jax.serve import client_json
from spade_jax.serve.protocol import Limits, Request, ServeError, chat_request, completion_request
from spade_jax.serve.scheduler import Scheduler

MAX_BODY_BYTES = 1 << 20
_DISCONNECT_POLL_S = 0.5
_NOTE = "spade_jax.serve.note"  # the scope key where handlers leave what the log line says
DISCONNECTED = 499  # nginx's "client closed request": logged, never sent
logger = logging.getLogger("spade_jax.serve")


def _note(http: HttpRequest, **fields) -> None:
    http.scope.setdefault(_NOTE, {}).update(fields)


def _error_response(err: ServeError, http: HttpRequest | None = None) -> JSONResponse:
    if http is not None:
        _note(http, error=err.message)
    return JSONResponse(err.body(), status_code=err.status)


async def _json_body(http: HttpRequest) -> object:
    declared = http.headers.get("content-length")
    if declared is not None and (not declared.isascii() or not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
        raise ServeError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ServeError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return client_json.loads(b"".join(chunks), "the request body")


def _chat_logprobs(entries):
    return None if entries is None else {"content": [
        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []} for t, lp in entries]}


def _completion_logprobs(entries, offset: int = 0):
    if entries is None:
        return None
    offsets, at = [], offset
    for t, _ in entries:
        offsets.append(at)
        at += len(t)
    return {"tokens": [t for t, _ in entries], "token_logprobs": [lp for _, lp in entries],
            "top_logprobs": None, "text_offset": offsets}


def create_app(scheduler: Scheduler, limits: Limits, model_id: str, *, access_log: bool = True):
    """The app (Starlette in `RequestLog`); the caller starts and stops `scheduler` (`__main__` ties
    it to the server's lifetime). `access_log` False logs only refused and disconnected requests."""
    tokenizer = scheduler.tokenizer
    created = int(time.time())

    async def models(_: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": created, "owned_by": "spade_jax",
             "max_model_len": limits.context}]})

    async def health(_: HttpRequest) -> Response:
        return JSONResponse({"status": "ok", **scheduler.status()})

    async def generate(http: HttpRequest, kind: str) -> Response:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def deliver(event: dict) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

        try:
            body = await _json_body(http)
            parse = chat_request if kind == "chat" else completion_request
            request = parse(body, tokenizer, limits, model_id)
            job = scheduler.submit(request, deliver)
        except ServeError as err:
            return _error_response(err, http)
        except ClientDisconnect:
            _note(http, disconnected="before the request body was read whole")
            return Response(status_code=DISCONNECTED)
        reply_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)
        if request.stream:
            return StreamingResponse(_sse(scheduler, http, job, events, request, reply_id),
                                     media_type="text/event-stream")
        return await _whole(scheduler, http, job, events, request, reply_id)

    def head(request: Request, reply_id: str, chunk: bool) -> dict:
        kind = {("chat", False): "chat.completion", ("chat", True): "chat.completion.chunk"}
        return {"id": reply_id, "object": kind.get((request.kind, chunk), "text_completion"),
                "created": int(time.time()), "model": model_id}

    async def _whole(scheduler, http, job, events, request: Request, reply_id: str) -> Response:
        choices = {}
        getting = None  # one pending get across polls: a get cancelled by a timeout could drop its event
        try:
            while True:
                getting = getting or asyncio.ensure_future(events.get())
                done, _ = await asyncio.wait({getting}, timeout=_DISCONNECT_POLL_S)
                if not done:
                    if await http.is_disconnected():
                        getting.cancel()
                        scheduler.cancel(job)
                        _note(http, disconnected="before the reply was ready")
                        return Response(status_code=DISCONNECTED)
                    continue
                event, getting = getting.result(), None
                if event["type"] == "error":
                    return _error_response(event["error"], http)
                if event["type"] == "finish":
                    choices[event["index"]] = event
                if event["type"] == "done":
                    break
        except asyncio.CancelledError:
            if getting:
                getting.cancel()
            scheduler.cancel(job)
            raise
        out = []
        for i in sorted(choices):
            e = choices[i]
            if request.kind == "chat":
                message = {"role": "assistant", "content": e["content"]}
                if e["tool_calls"]:
                    message["tool_calls"] = e["tool_calls"]
                out.append({"index": i, "message": message, "logprobs": _chat_logprobs(e["logprobs"]),
                            "finish_reason": e["reason"]})
            else:
                out.append({"index": i, "text": e["text"], "logprobs": _completion_logprobs(e["logprobs"]),
                            "finish_reason": e["reason"]})
        _note(http, usage=event["usage"])
        return JSONResponse({**head(request, reply_id, False), "choices": out, "usage": event["usage"]})

    async def _sse(scheduler, http, job, events, request: Request, reply_id: str):
        def chunk(payload: dict) -> str:
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        def choice_chunk(index: int, delta: dict | str, logprobs, reason=None) -> str:
            if request.kind == "chat":
                body = {"index": index, "delta": delta, "logprobs": _chat_logprobs(logprobs), "finish_reason": reason}
            else:
                body = {"index": index, "text": delta, "logprobs": _completion_logprobs(logprobs, offsets[index]),
                        "finish_reason": reason}
                offsets[index] += len(delta)
            return chunk({**head(request, reply_id, True), "choices": [body]})

        answered = False
        offsets = [0] * request.n  # characters streamed per choice (completions' text_offset)
        try:
            if request.kind == "chat":
                for i in range(request.n):
                    yield choice_chunk(i, {"role": "assistant", "content": ""}, None)
            while True:
                event = await events.get()
                if event["type"] == "delta":
                    if event["text"] or event["logprobs"]:
                        text = event["text"]
                        yield choice_chunk(event["index"], {"content": text} if request.kind == "chat" else text,
                                           event["logprobs"])
                elif event["type"] == "finish":
                    delta: dict | str = {} if request.kind == "chat" else ""
                    if event["tool_calls"]:
                        delta = {"tool_calls": [{"index": k, **call} for k, call in enumerate(event["tool_calls"])]}
                    yield choice_chunk(event["index"], delta, None, event["reason"])
                elif event["type"] == "done":
                    answered = True
                    _note(http, usage=event["usage"])
                    if request.include_usage:
                        yield chunk({**head(request, reply_id, True), "choices": [], "usage": event["usage"]})
                    yield "data: [DONE]\n\n"
                    return
                else:
                    answered = True
                    _note(http, error=event["error"].message)
                    yield chunk(event["error"].body())
                    yield "data: [DONE]\n\n"
                    return
        finally:
            if not answered:
                scheduler.cancel(job)

    async def chat(http: HttpRequest) -> Response:
        return await generate(http, "chat")

    async def completions(http: HttpRequest) -> Response:
        return await generate(http, "completion")

    async def http_error(http: HttpRequest, exc: HTTPException) -> Response:
        return _error_response(ServeError(exc.status_code, str(exc.detail)), http)

    async def server_error(http: HttpRequest, exc: Exception) -> Response:
        return _error_response(ServeError(500, f"internal error: {type(exc).__name__}"), http)

    return RequestLog(Starlette(
        routes=[Route("/v1/models", models, methods=["GET"]), Route("/health", health, methods=["GET"]),
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/completions", completions, methods=["POST"])],
        exception_handlers={HTTPException: http_error, Exception: server_error},
    ), access_log=access_log)


def _printable(text: str, limit: int) -> str:
    """`text` on one line, escaped and cut (paths and messages quote client text)."""
    shown = json.dumps(text[:limit])[1:-1]
    return shown + "..." if len(text) > limit else shown


class RequestLog:
    """ASGI middleware: one log line per HTTP request, and the end of every exception.

    Starlette answers an exception with the 500 handler's response and then raises it again,
    which uvicorn would log as "Exception in ASGI application"; here it ends: a client that
    went away is an info line, anything else an error line with the traceback."""

    def __init__(self, app, *, access_log: bool = True):
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        seen = {"status": None, "complete": False, "disconnect": False}

        async def receiving():
            message = await receive()
            seen["disconnect"] |= message["type"] == "http.disconnect"
            return message

        async def sending(message):
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                seen["complete"] = True
            await send(message)

        note = scope.setdefault(_NOTE, {})
        try:
            await self.app(scope, receiving, sending)
        except ClientDisconnect:
            note.setdefault("disconnected", "mid-reply")
        except Exception:
            logger.exception("%s failed", self._head(scope, seen["status"] or 500))
            return
        if seen["disconnect"] and not seen["complete"]:
            note.setdefault("disconnected", "mid-reply" if seen["status"] else "before the reply")
        status = DISCONNECTED if note.get("disconnected") and not seen["status"] else (seen["status"] or 500)
        refused = status >= 400 or "disconnected" in note
        if not (self.access_log or refused):
            return
        line = self._head(scope, status)
        usage = note.get("usage")
        if usage:
            line += f" tokens={usage['prompt_tokens']}+{usage['completion_tokens']}"
        line += f" {time.perf_counter() - start:.3f}s"
        if "disconnected" in note:
            line += f" client disconnected {note['disconnected']}"
        elif note.get("error"):
            line += " " + _printable(note["error"], 300)
        (logger.warning if status >= 500 and "disconnected" not in note else logger.info)(line)

    @staticmethod
    def _head(scope, status: int) -> str:
        host, port = scope.get("client") or ("-", 0)
        return f"{host}:{port} {scope.get('method', '-')} {_printable(scope.get('path', ''), 200)} {status}"
