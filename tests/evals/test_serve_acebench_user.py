"""ACEBench multi_turn's simulated user from an OpenAI-compatible endpoint (`eval.user_endpoint`),
against a scripted loopback server that records what it was sent."""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
from pathlib import Path

import pytest

from spade_jax.evals.suite import GenerationSettings
from spade_jax.evals.suites import acebench_agent as agent
from spade_jax.sandbox.records import EpisodeSpec

FIXTURE = Path(__file__).parent / "fixtures" / "acebench" / "agent"


@dataclasses.dataclass(frozen=True)
class _Config:  # the fields of evals.runner.EvalConfig the suite reads
    limit: int = 0
    seed: int = 0
    acebench_dir: str = ""
    user_endpoint: str = ""


@pytest.fixture
def endpoint():
    """A loopback server: /v1/models names 'scripted-user'; chat completions answer 'line N', or
    400 (context) for a chat mentioning 'too long', 500 for one mentioning 'crash'."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, {"object": "list", "data": [{"id": "scripted-user", "object": "model"}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            text = json.dumps(body["messages"])
            if "too long" in text:
                return self._send(400, {"error": {"message": "the prompt exceeds the context of 64 tokens"}})
            if "crash" in text:
                return self._send(500, {"error": {"message": "boom"}})
            self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": f" line {len(seen)} "},
                                          "finish_reason": "stop"}]})

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    server.shutdown()
    server.server_close()


def test_the_endpoint_user_sends_greedy_seeded_chats(endpoint):
    url, seen = endpoint
    user = agent.EndpointUser(url, 32, seed=5)
    assert user.model == "scripted-user" and user.name == f"scripted-user at {url}"
    chats = [[{"role": "user", "content": "hello"}], [{"role": "user", "content": "too long"}]]
    lines = user(chats)
    assert lines[0].startswith("line ") and lines[1] is None
    assert all(path == "/v1/chat/completions" for path, _ in seen)
    body = next(b for _, b in seen if b["messages"] == chats[0])
    assert body["model"] == "scripted-user" and body["temperature"] == 0.0 and body["max_tokens"] == 32
    assert isinstance(body["seed"], int)
    with pytest.raises(RuntimeError, match="HTTP 500"):
        user([[{"role": "user", "content": "crash"}]])
    with pytest.raises(ValueError, match="http"):
        agent.EndpointUser("ftp://x", 8, 0)


def test_multi_turn_plays_the_endpoint_user_and_records_it(endpoint):
    url, seen = endpoint
    suite = agent.make(str(FIXTURE), GenerationSettings(), _Config(user_endpoint=url))
    assert suite.notes[0] == f"agent_multi_turn: the simulated user is scripted-user at {url} (upstream: gpt-4o)"
    item = next(i for i in suite.items(0, 0) if i.group == "agent_multi_turn")
    pool = suite.episode_pool(context=None)
    (start,) = pool.start([EpisodeSpec(program=item.program)])
    assert start.observation.endswith("user:line 1\n")
    (reply,) = pool.step([start.episode_id], ["What should I do?"])
    assert reply.observation == "user:line 2"
    assert seen[-1][1]["messages"][-1] == {"role": "user", "content": "What should I do?"}
    import types

    trajectory = types.SimpleNamespace(messages=[{"role": "assistant", "content": "What should I do?"}], turns=1,
                                       end_reason="max_turns")
    assert suite.score(item, trajectory).details["user"] == f"scripted-user at {url}"
    default = agent.make(str(FIXTURE), GenerationSettings(), _Config())
    assert default.user_name == agent.POLICY_USER and "eval.user_endpoint" in default.notes[0]
