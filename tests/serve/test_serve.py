"""`python -m spade_jax.serve` as a real process on loopback, driven by the official `openai` client.

One server per module: a one-layer random model (untied head, so sampled text varies with
the seed) with a 512-piece SentencePiece tokenizer; the SIGTERM test runs last and stops it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

REPO = Path(__file__).resolve().parents[2]
CONFIG = '''from spade_jax.selfplay.config import base_config


def get_config(arg=None):
    c = base_config()
    c.model.source = "random"
    c.model.tokenizer_path = {tokenizer!r}
    c.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                        head_dim=16, tie_word_embeddings=False)
    c.mesh.shape = (1, 1, 1)
    c.log.progress = False
    return c
'''
ROWS, QUEUE, MAX_TOKENS = 4, 4, 4096  # no test but the queue test sends more than QUEUE at once


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from spade_jax.envs import library
    from spade_jax.models.tokenizer import SentencePieceTokenizer

    root = tmp_path_factory.mktemp("serve")
    texts = [library.load_source(env.name) for env in library.SEED_ENVS]
    tokenizer = SentencePieceTokenizer.train(texts, vocab_size=512, model_prefix=root / "sp")
    (root / "random.py").write_text(CONFIG.format(tokenizer=str(root / "sp.model")))
    port = _free_port()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "spade_jax.serve", f"--config={root / 'random.py'}", f"--workdir={root / 'run'}",
         "--step=none", f"--port={port}", f"--rows={ROWS}", f"--max_queue={QUEUE}", f"--max_tokens={MAX_TOKENS}",
         "--shutdown_timeout=2", "--model_name=random-test"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "JAX_PLATFORMS": "cpu",
                                                         "XLA_FLAGS": "--xla_backend_optimization_level=0"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("server did not start:\n" + (root / "server.log").read_text()[-3000:])
            time.sleep(0.2)
    yield {"url": url, "proc": proc, "tokenizer": tokenizer, "log": root / "server.log"}
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key="unused", max_retries=0, timeout=60)


def _post(server, path: str, body, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(server["url"] + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _health(server) -> dict:
    return json.loads(urllib.request.urlopen(server["url"] + "/health", timeout=5).read())


def _chat(client, content="Write a program.", **kwargs):
    return client.chat.completions.create(model="random-test", messages=[{"role": "user", "content": content}],
                                          **kwargs)


def test_models_and_chat(client):
    assert [m.id for m in client.models.list().data] == ["random-test"]
    reply = _chat(client, max_tokens=20, temperature=1.5, seed=1)
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
    assert reply.usage.completion_tokens <= 20 and reply.usage.prompt_tokens > 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_seeds_reproduce_and_differ(client):
    texts = [_chat(client, max_tokens=40, temperature=1.5, seed=seed).choices[0].message.content
             for seed in (7, 7, 8)]
    assert texts[0] == texts[1] != texts[2]
    # Batched with other traffic, the seeded request still draws the same tokens.
    others = [threading.Thread(target=_chat, args=(client,), kwargs={"max_tokens": 40, "temperature": 1.5})
              for _ in range(2)]
    for t in others:
        t.start()
    again = _chat(client, max_tokens=40, temperature=1.5, seed=7).choices[0].message.content
    for t in others:
        t.join()
    assert again == texts[0]


def test_stream_equals_whole_reply(client):
    whole = _chat(client, max_tokens=40, temperature=1.5, seed=3, logprobs=True).choices[0]
    chunks = list(_chat(client, max_tokens=40, temperature=1.5, seed=3, stream=True,
                        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.finish_reason
    assert chunks[-1].usage.completion_tokens == len(whole.logprobs.content) + (whole.finish_reason == "stop")
    assert all(t.logprob <= 0 for t in whole.logprobs.content)


def test_completions_n_and_token_prompts(client, server):
    prompt = server["tokenizer"].encode("def solve(")
    reply = client.completions.create(model="random-test", prompt=prompt, max_tokens=12, temperature=1.5, seed=5, n=3)
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert len({c.text for c in reply.choices}) > 1  # each choice draws its own stream
    text = client.completions.create(model="random-test", prompt="def solve(", max_tokens=12, temperature=1.5,
                                     seed=5, n=3)
    assert [c.text for c in text.choices] == [c.text for c in reply.choices]


def test_stop_sequences(client):
    greedy = _chat(client, "Stop test.", max_tokens=30, temperature=0).choices[0].message.content
    assert len(greedy) > 6
    stop = greedy[3:5]
    stopped = _chat(client, "Stop test.", max_tokens=30, temperature=0, stop=[stop, "\x00never"]).choices[0]
    assert stopped.message.content == greedy[: greedy.find(stop)] and stopped.finish_reason == "stop"
    streamed = _chat(client, "Stop test.", max_tokens=30, temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == greedy[: greedy.find(stop)]


def test_tool_round_trip_renders_the_calls(client, server):
    from spade_jax.serve import tools as tools_lib

    tools = [{"type": "function", "function": {"name": "locate", "description": "Where a city is.",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "Where is Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "locate", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "48.9N 2.4E"}]
    reply = client.chat.completions.create(model="random-test", messages=messages, tools=tools, max_tokens=4)
    tokenizer = server["tokenizer"]
    chat = tools_lib.to_chat(messages, tools_lib.parse_tools(tools, None)[0], tokenizer.escape_special)
    assert chat[0]["role"] == "system" and '"name": "locate"' in chat[0]["content"]
    assert chat[2]["content"] == '<tool_call>{"name": "locate", "arguments": {"city": "Paris"}}</tool_call>'
    assert chat[3] == {"role": "user", "content": "<tool_response>\n48.9N 2.4E\n</tool_response>"}
    assert reply.usage.prompt_tokens == len(tokenizer.apply_chat_template(chat))


TOOLS = [{"type": "function", "function": {"name": name, "description": f"The {name} tool.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
         for name in ("locate", "lookup", "forecast")]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_and_named_force_a_parseable_call(client, stream):
    """A random model never calls a tool by itself; forced, every reply is one call of a declared
    tool (of the named one) whose arguments parse as a JSON object."""
    messages = [{"role": "user", "content": "Where is Seoul?"}]
    for choice, names in (("required", {"locate", "lookup", "forecast"}),
                          ({"type": "function", "function": {"name": "lookup"}}, {"lookup"})):
        for seed in range(3):
            reply = client.chat.completions.create(model="random-test", messages=messages, tools=TOOLS,
                                                   tool_choice=choice, max_tokens=40, temperature=1.5, seed=seed,
                                                   stream=stream)
            if stream:
                chunks = list(reply)
                assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
            else:
                calls = reply.choices[0].message.tool_calls
            (call,) = calls
            assert call.function.name in names and isinstance(json.loads(call.function.arguments), dict)


BAD_REQUESTS = [
    ("/v1/chat/completions", {"model": "random-test"}, 400, "messages"),
    ("/v1/chat/completions", {"model": "random-test", "messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("/v1/chat/completions", {"model": "random-test", "messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ("/v1/chat/completions", {"model": "random-test", "messages": [{"role": "user", "content": "x"}],
                              "temperature": 3}, 400, "temperature"),
    ("/v1/chat/completions", {"model": "random-test", "messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "'n'"),
    ("/v1/chat/completions", {"model": "random-test", "messages": [{"role": "user", "content": "x"}],
                              "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/v1/chat/completions", {"model": "random-test", "messages": [{"role": "user", "content": "x"}],
                              "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": "random-test", "messages": [{"role": "user", "content": "x"}],
                              "top_logprobs": 3}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}, 404, "gpt-9"),
    ("/v1/chat/completions", [1, 2], 400, "JSON object"),
    ("/v1/completions", {"model": "random-test", "prompt": [1, 99999]}, 400, "token ids"),
    ("/v1/completions", {"model": "random-test", "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": "random-test", "prompt": "x", "echo": True}, 400, "echo"),
]


@pytest.mark.parametrize("path,body,status,needle", BAD_REQUESTS)
def test_bad_requests_get_4xx_with_a_message(server, path, body, status, needle):
    code, error = _post(server, path, body)
    assert code == status and needle in error["error"]["message"], error


def test_malformed_and_oversize_bodies(server, client):
    code, error = _post(server, "/v1/chat/completions", None, raw=b"{not json")
    assert code == 400 and "not JSON" in error["error"]["message"]
    connection = http.client.HTTPConnection(server["url"].removeprefix("http://"), timeout=30)
    connection.request("POST", "/v1/completions", body=b"{}", headers={"Content-Length": str(2 << 20)})
    response = connection.getresponse()  # refused on the declared size, before the body is read
    assert response.status == 413 and "bytes" in json.loads(response.read())["error"]["message"]
    connection.close()
    code, error = _post(server, "/v1/nothing", {})
    assert code == 404 and error["error"]["message"]
    context = client.models.list().data[0].model_extra["max_model_len"]
    for prompt, max_tokens in ((context + 1, None), (context - 8, 16)):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="random-test", prompt=[3] * prompt, **(
                {"max_tokens": max_tokens} if max_tokens else {}))
        assert err.value.code == "context_length_exceeded" and err.value.type == "invalid_request_error"
        assert err.value.body["message"].startswith(f"This model's maximum context length is {context} tokens")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        _chat(client, max_tokens=MAX_TOKENS + 1)


def test_full_queue_gets_503_and_every_request_is_answered_once(server):
    results = []

    def one(i, max_tokens):
        results.append((i, *_post(server, "/v1/chat/completions", {
            "model": "random-test", "messages": [{"role": "user", "content": f"load {i}"}], "max_tokens": max_tokens,
            "temperature": 0})))

    # Fill every row, then the queue, with long greedy replies; then three more requests arrive.
    done_before = _health(server).get("answered_done", 0)
    busy = [threading.Thread(target=one, args=(i, MAX_TOKENS // 4)) for i in range(ROWS + QUEUE)]
    deadline = time.monotonic() + 30
    for threads, field, count in ((busy[:ROWS], "decoding", ROWS), (busy[ROWS:], "queued", QUEUE)):
        for t in threads:
            t.start()
        while (h := _health(server))[field] < count:
            assert time.monotonic() < deadline and h.get("answered_done", 0) == done_before, h
            time.sleep(0.01)
    for i in range(ROWS + QUEUE, ROWS + QUEUE + 3):
        one(i, 8)
    for t in busy:
        t.join()
    assert sorted(i for i, _, _ in results) == list(range(ROWS + QUEUE + 3))
    codes = {i: code for i, code, _ in results}
    assert [codes[i] for i in range(ROWS + QUEUE)] == [200] * (ROWS + QUEUE), [b for _, _, b in results]
    assert [codes[i] for i in range(ROWS + QUEUE, ROWS + QUEUE + 3)] == [503] * 3
    assert all("queue is full" in body["error"]["message"] for _, code, body in results if code == 503)
    ids = [body["id"] for _, code, body in results if code == 200]
    assert len(set(ids)) == len(ids) == ROWS + QUEUE


def _answered(health: dict) -> int:
    return sum(v for k, v in health.items() if k.startswith("answered_"))


def test_survives_a_client_that_disconnects_mid_stream(server, client):
    """The disconnect cancels the row. The random model may sample its stop token and finish the
    reply before the server sees the disconnect (a quiet machine decodes hundreds of tokens in
    that time): such a try is answered, not cancelled, and is made again; a server that never
    cancels fails every try."""
    body = json.dumps({"model": "random-test", "messages": [{"role": "user", "content": "long"}],
                       "max_tokens": MAX_TOKENS, "stream": True}).encode()
    outcomes = []
    for _ in range(5):
        health = _health(server)
        cancelled, answered = health.get("rows_cancelled", 0), _answered(health)
        req = urllib.request.Request(server["url"] + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        response = urllib.request.urlopen(req, timeout=30)
        while b'"content": ""' in (line := response.readline()) or not line.strip():  # past the role chunk
            assert line, "the stream ended before its first delta"
        assert line.startswith(b"data: ") and b'"finish_reason": null' in line
        response.close()
        deadline = time.monotonic() + 60  # a liveness bound, not a speed one
        while (health := _health(server)).get("rows_cancelled", 0) == cancelled and _answered(health) == answered:
            assert time.monotonic() < deadline, health
            time.sleep(0.1)
        outcomes.append("cancelled" if health.get("rows_cancelled", 0) > cancelled else "answered first")
        if outcomes[-1] == "cancelled":
            break
    assert outcomes[-1] == "cancelled", outcomes
    assert _health(server)["decoding"] == 0
    assert _chat(client, max_tokens=5).choices[0].finish_reason in ("stop", "length")


def test_the_acebench_simulated_user_can_be_this_server(server):
    from spade_jax.evals.suites.acebench_agent import EndpointUser

    user = EndpointUser(server["url"] + "/v1", 8, seed=0)
    assert user.model == "random-test"
    hello, again, long = user([[{"role": "user", "content": "hi"}]] * 2 + [[{"role": "user", "content": "x " * 9000}]])
    assert isinstance(hello, str) and hello == again and long is None  # greedy; a chat past the context: no line


LITELLM_SCRIPT = """
import json, sys
import litellm

url, tools = sys.argv[1], json.loads(sys.argv[2])
out = {}
for provider in ("openai", "hosted_vllm"):
    try:
        litellm.completion(model=provider + "/random-test", api_base=url, api_key="unused", max_tokens=4,
                           messages=[{"role": "user", "content": "x " * 9000}], num_retries=0)
        out[provider] = "answered"
    except litellm.ContextWindowExceededError:
        out[provider] = "ContextWindowExceededError"
    except Exception as err:
        out[provider] = type(err).__name__
reply = litellm.completion(model="openai/random-test", api_base=url, api_key="unused", max_tokens=40, tools=tools,
                           tool_choice="required", messages=[{"role": "user", "content": "Where is Seoul?"}])
call = reply.choices[0].message.tool_calls[0].function
out["call"] = [call.name, json.loads(call.arguments)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def litellm_python(side_python) -> str:
    """An interpreter with litellm: this one, or the side venv's (litellm's dependencies, boto3's
    python-dateutil<3 among them, do not install beside the test extras)."""
    import importlib.util

    return sys.executable if importlib.util.find_spec("litellm") is not None else side_python("litellm")


def test_litellm_sees_a_context_window_error_and_a_forced_call(server, litellm_python):
    """litellm's own error mapping turns the overflow refusal into ContextWindowExceededError (which
    its context-window fallbacks act on), through both of its OpenAI-compatible providers."""
    proc = subprocess.run([litellm_python, "-c", LITELLM_SCRIPT, server["url"] + "/v1", json.dumps(TOOLS)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["openai"] == out["hosted_vllm"] == "ContextWindowExceededError", out
    name, arguments = out["call"]
    assert name in {"locate", "lookup", "forecast"} and isinstance(arguments, dict)


def _hang_up(server, head: bytes, body: bytes, pause_s: float = 0.0) -> None:
    """Sends a request's head and part of its body on a raw socket, then closes it."""
    host, port = server["url"].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)
        time.sleep(pause_s)
        sock.sendall(body)


@pytest.mark.parametrize("head,body,pause_s", [
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
     b"Content-Length: 400\r\n\r\n", b'{"model": "random-test", "messages": [', 0.0),  # shorter than declared
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
     b'10\r\n{"model": "random\r\n', 0.0),  # a chunked body never terminated
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 60\r\n\r\n{\"model\": ",
     b'"random-test", "pro', 0.3),  # gone mid-body, between two sends
], ids=["short body", "unterminated chunked body", "mid-body"])
def test_a_client_that_hangs_up_mid_body_is_one_info_line(server, head, body, pause_s):
    before = server["log"].read_text().count("client disconnected")
    _hang_up(server, head, body, pause_s)
    deadline = time.monotonic() + 30  # a liveness bound
    while (log := server["log"].read_text()).count("client disconnected") == before:
        assert time.monotonic() < deadline, log[-2000:]
        time.sleep(0.05)
    time.sleep(0.2)  # a second line or a traceback would follow at once
    log = server["log"].read_text()
    assert log.count("client disconnected") == before + 1
    line = [l for l in log.splitlines() if "client disconnected" in l][-1]
    assert " INFO " in line and "before the request body was read whole" in line
    assert "Traceback" not in log and "Exception in ASGI application" not in log


def test_every_request_has_an_access_line_and_the_log_has_no_traceback(server, client):
    _chat(client, max_tokens=3)
    with pytest.raises(openai.BadRequestError):
        _chat(client, temperature=9)
    time.sleep(0.2)
    lines = server["log"].read_text().splitlines()
    assert any("POST /v1/chat/completions 200 tokens=" in l for l in lines)
    assert any(" 400 " in l and "'temperature' must be in" in l for l in lines)
    assert any("GET /health 200" in l for l in lines) and any("POST /v1/nothing 404" in l for l in lines)
    assert not any("Traceback" in l or "Exception in ASGI application" in l for l in lines)


def test_sigterm_finishes_or_fails_in_flight_requests(server, client):
    """Last: stops the module's server."""
    outcome = {}

    def stream():
        try:
            chunks = list(_chat(client, "until shutdown", max_tokens=MAX_TOKENS, stream=True))
            outcome["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        except openai.APIError as err:
            outcome["error"] = str(err)

    thread = threading.Thread(target=stream)
    thread.start()
    deadline = time.monotonic() + 120  # a liveness bound: under load the first decode can take long
    while _health(server)["decoding"] == 0 and thread.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(server["proc"].pid, signal.SIGTERM)
    thread.join(timeout=30)
    assert server["proc"].wait(timeout=30) == 0
    assert outcome.get("finish") in ("stop", "length") or "shut down" in outcome.get("error", ""), outcome
    assert "server stopped" in server["log"].read_text()
    with pytest.raises(openai.APIConnectionError):
        _chat(client, max_tokens=2)
