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

REPO = Path(__file__).resolve().parents[1]
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
    chat = tools_lib.to_chat(messages, tools_lib.parse_tools(tools, None), tokenizer.escape_special)
    assert chat[0]["role"] == "system" and '"name": "locate"' in chat[0]["content"]
    assert chat[2]["content"] == '<tool_call>{"name": "locate", "arguments": {"city": "Paris"}}</tool_call>'
    assert chat[3] == {"role": "user", "content": "<tool_response>\n48.9N 2.4E\n</tool_response>"}
    assert reply.usage.prompt_tokens == len(tokenizer.apply_chat_template(chat))
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model="random-test", messages=messages, tools=tools, tool_choice="required")


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
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model="random-test", prompt=[3] * (context + 1), max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="exceed the context"):
        client.completions.create(model="random-test", prompt=[3] * (context - 8), max_tokens=16)
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
