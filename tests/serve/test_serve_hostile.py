"""Hostile requests through the ASGI app in-process (a scripted engine): every attack gets a 4xx that
says why, never a 500, and the server serves on; and the request log (one line a request, a
disconnect one info line, a server bug one error line, never an exception out of the app).
The real server's side (uvicorn, its sockets) is tests/serve/test_serve.py's."""

from __future__ import annotations

import json
import logging

import pytest

from tests.serve.test_serve_units import _call, _scripted_app

CHAT = "/v1/chat/completions"
LONE = "\\ud800"  # as a client escapes it in JSON text
TOOL = {"type": "function", "function": {"name": "locate", "description": "Where.", "parameters": {"type": "object"}}}


def _chat(content="hi", **extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 2, **extra}


def _call_args(arguments: str) -> dict:
    return {"model": "m", "max_tokens": 2, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "locate", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"}], "tools": [TOOL]}


def _raw(body: dict, lone_at: str) -> bytes:
    """`body` as JSON text with the placeholder string `lone_at` replaced by an escaped lone surrogate."""
    return json.dumps(body).replace(lone_at, LONE).encode()


ATTACKS = [  # (name, path, raw body, status, what the message names)
    ("surrogate in content", CHAT, _raw(_chat("@@"), "@@"), 400, "messages[0].content"),
    ("surrogate in a text part", CHAT, _raw(_chat([{"type": "text", "text": "@@"}]), "@@"), 400,
     "messages[0].content[0].text"),
    ("surrogate in a tool description", CHAT, _raw(_chat(tools=[
        {"type": "function", "function": {"name": "locate", "description": "@@"}}]), "@@"), 400,
     "tools[0].function.description"),
    ("surrogate in tool-call arguments", CHAT, json.dumps(_call_args('{"city": "' + LONE + '"}')).encode(), 400,
     "function.arguments"),
    ("surrogate in a completions prompt", "/v1/completions", _raw({"model": "m", "prompt": "@@"}, "@@"), 400,
     "prompt"),
    ("surrogate in the model", CHAT, _raw({**_chat(), "model": "@@"}, "@@"), 400, "model"),
    ("surrogate in a stop string", CHAT, _raw(_chat(stop=["@@"]), "@@"), 400, "stop[0]"),
    ("surrogate in a key", CHAT, _raw(_chat(metadata={"@@": 1}), "@@"), 400, "a key of metadata"),
    ("raw CESU-8 bytes", CHAT, json.dumps(_chat("@@")).encode().replace(b"@@", b"\xed\xa0\x80"), 400,
     "messages[0].content"),
    ("invalid UTF-8 bytes", CHAT, json.dumps(_chat("@@")).encode().replace(b"@@", b"\xff\xfe"), 400, "not JSON"),
    ("a body nested 10,000 deep", CHAT, b"[" * 10000 + b"]" * 10000, 400, "nested more than 64"),
    ("an unclosed body nested 100,000 deep", CHAT, b'{"a": ' + b"[" * 100000, 400, "nested more than 64"),
    ("a body nested 65 deep", CHAT, json.dumps({**_chat(), "metadata": json.loads("[" * 64 + "]" * 64)}).encode(),
     400, "nested more than 64"),
    ("tool-call arguments nested 5,000 deep", CHAT, json.dumps(_call_args("[" * 5000 + "]" * 5000)).encode(), 400,
     "function.arguments is nested"),
    ("tool-call arguments nested 100,000 deep", CHAT, json.dumps(_call_args("[" * 100000)).encode(), 400,
     "function.arguments is nested"),
    ("NaN temperature", CHAT, json.dumps(_chat()).replace('"max_tokens"', '"temperature": NaN, "max_tokens"').encode(),
     400, "NaN is not a JSON value"),
    ("an integer of 5,000 digits", CHAT, json.dumps(_chat()).replace('"max_tokens": 2', '"max_tokens": ' + "9" * 5000)
     .encode(), 400, "not JSON"),
]


@pytest.fixture(scope="module")
def scripted(small_tokenizer):
    scheduler, app = _scripted_app(small_tokenizer, "ok", segment=4)
    yield scheduler, app
    scheduler.shutdown(0.0)


@pytest.mark.parametrize("name,path,raw,status,needle", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_an_attack_gets_a_4xx_that_says_why(scripted, name, path, raw, status, needle):
    scheduler, app = scripted
    code, data = _call(app, path, None, raw=raw)
    error = json.loads(data)["error"]
    assert code == status and needle in error["message"], error
    assert error["type"] == "invalid_request_error" and error["code"] == status
    code, data = _call(app, CHAT, _chat())  # and it serves on
    assert code == 200 and json.loads(data)["choices"][0]["message"]["content"] == "ok"


def test_the_404_quotes_an_odd_model_name_safely(scripted):
    _, app = scripted
    code, data = _call(app, CHAT, _chat(), raw=json.dumps({**_chat(), "model": "gpt\u2028\U0001f600"}).encode())
    assert code == 404 and "gpt\u2028\U0001f600" in json.loads(data)["error"]["message"]


def test_a_refusal_quoting_a_lone_surrogate_is_still_encodable():
    """`ServeError` escapes what it quotes: the defence behind the entry check."""
    from spade_jax.serve.errors import ServeError

    err = ServeError(404, "the model '\ud800' does not exist")
    assert json.dumps(err.body(), ensure_ascii=False).encode() and "\\ud800" in err.message


@pytest.fixture
def served(small_tokenizer, caplog):
    """`served(access_log)`: a scripted app whose log records (``spade_jax.serve``) the test reads."""
    made = []

    def make(access_log=True):
        scheduler, app = _scripted_app(small_tokenizer, "ok", segment=4, access_log=access_log)
        made.append(scheduler)
        return scheduler, app

    caplog.set_level(logging.INFO, logger="spade_jax.serve")
    yield make
    for scheduler in made:
        scheduler.shutdown(0.0)


def _lines(caplog) -> list[logging.LogRecord]:
    records = [r for r in caplog.records if r.name == "spade_jax.serve"]
    caplog.clear()
    return records


def test_one_access_line_per_request_and_the_flag_keeps_only_refusals(served, caplog):
    _, app = served()
    assert _call(app, CHAT, _chat())[0] == 200
    (line,) = _lines(caplog)
    assert line.levelno == logging.INFO and "POST /v1/chat/completions 200 tokens=" in line.getMessage()
    prompt, completion = line.getMessage().split("tokens=")[1].split()[0].split("+")
    assert int(prompt) > 0 and int(completion) == 2 and line.getMessage().endswith("s")
    assert _call(app, CHAT, _chat(temperature=7))[0] == 400
    (line,) = _lines(caplog)
    assert " 400 " in line.getMessage() and "'temperature' must be in [0.0, 2.0], got 7" in line.getMessage()
    _, quiet = served(access_log=False)
    assert _call(quiet, CHAT, _chat())[0] == 200 and _lines(caplog) == []
    assert _call(quiet, CHAT, _chat(n=99))[0] == 400
    (line,) = _lines(caplog)
    assert "'n' must be in" in line.getMessage()


def test_a_log_line_cannot_be_forged_by_the_request(served, caplog):
    _, app = served()
    _call(app, CHAT, {**_chat(), "model": "x\n2026-01-01 INFO 127.0.0.1:1 POST /v1/chat/completions 200"})
    (line,) = _lines(caplog)
    assert "\n" not in line.getMessage() and " 404 " in line.getMessage()


@pytest.mark.parametrize("how,kwargs,says", [
    ("a body shorter than its Content-Length", {"incoming": [
        {"type": "http.request", "body": b'{"model": "m", "mess', "more_body": True}]},
     "client disconnected before the request body was read whole"),
    ("gone before the reply", {"incoming": []}, "client disconnected before the request body was read whole"),
    ("gone mid-stream", {"send_error": OSError("broken pipe")}, "client disconnected mid-reply"),
])
def test_a_disconnect_is_one_info_line(served, caplog, how, kwargs, says):
    scheduler, app = served(access_log=False)
    status, _ = _call(app, CHAT, _chat(stream=True), **kwargs)  # never raises out of the app
    (line,) = _lines(caplog)
    assert line.levelno == logging.INFO and line.exc_info is None and says in line.getMessage(), line.getMessage()
    assert _call(app, CHAT, _chat())[0] == 200


def test_a_server_bug_is_a_500_and_one_error_line_with_its_traceback(served, caplog, monkeypatch):
    scheduler, app = served(access_log=False)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(scheduler, "submit", broken)
    status, data = _call(app, CHAT, _chat())
    assert status == 500 and json.loads(data)["error"]["message"] == "internal error: RuntimeError"
    (line,) = _lines(caplog)
    assert line.levelno == logging.ERROR and line.exc_info[0] is RuntimeError and " 500 " in line.getMessage()
