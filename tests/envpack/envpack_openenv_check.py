"""Plays every environment of environment packs through OpenEnv, with the real openenv-core.

Run by tests/envpack/test_envpack.py with the python of the venv `launch/setup_side_env.sh openenv` makes
(openenv-core cannot share .venv); spade_jax comes from PYTHONPATH.

    python tests/envpack/envpack_openenv_check.py PACK_DIR [PACK_DIR ...]   # prints one JSON line

For each pack (the directory `python -m spade_jax.envpack` wrote): serves it with
`create_pack_app` under uvicorn on a free loopback port, then for each environment takes the
program's reference actions for episode seed 3 (from an in-process `PackEnvironment`, whose
program runs in its own sandbox pool) and plays them over the WebSocket with the typed
`PackEnvClient`, and the first environment once more with OpenEnv's `GenericEnvClient` and raw
action dicts. The JSON line holds, per pack and environment, the rewards, whether the episode
ended and was won, and the state the server reports; an unknown env id's error message, and the
fields its action schema requires (``/schema``, which verifiers' OpenEnvTaskset reads: a reply goes
whole into an action's one required field). The first pack is also served by its own command,
``python -m <pack> serve``, whose /health and /schema are read.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
import uvicorn
from openenv import GenericEnvClient

from spade_jax.envpack.openenv_env import PackEnvClient, PackEnvironment, TextAction, create_pack_app
from spade_jax.envpack.runtime import Pack

SEED = 3


def _serve(app) -> tuple[uvicorn.Server, threading.Thread, str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the OpenEnv server did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, f"http://127.0.0.1:{port}"


def _actions(pack: Pack, env_id: str) -> list[str]:
    local = PackEnvironment(pack)
    try:
        local.reset(seed=SEED, env_id=env_id)
        return [line for line in (local.solution() or "").splitlines() if line.strip()]
    finally:
        local.close()


def _play(client, env_id: str, actions: list[str], typed: bool) -> dict:
    first = client.reset(env_id=env_id, seed=SEED)
    rewards, last = [], first
    for action in actions:
        last = client.step(TextAction(text=action) if typed else {"text": action})
        rewards.append(last.reward)
        if last.done:
            break
    observation = last.observation
    won = observation.won if typed else observation.get("won")
    state = client.state()
    return {"rewards": rewards, "done": last.done, "won": won, "first_observation": bool(
        first.observation.text if typed else first.observation.get("text")),
        "state": state.model_dump() if typed else dict(state)}


def serve_command(pack_dir: str) -> dict:
    """`python -m <pack> serve` in a process of its own: its /health and /schema, then SIGTERM."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    package = Path(pack_dir)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package.parent), os.environ.get("PYTHONPATH", "")]))
    server = subprocess.Popen([sys.executable, "-m", package.name, "serve", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
                break
            except requests.ConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"`python -m {package.name} serve` did not start: {server.stderr.read()}")
                time.sleep(0.2)
        schema = requests.get(f"http://127.0.0.1:{port}/schema", timeout=5).json()
    finally:
        server.terminate()
        server.wait(timeout=30)
    return {"health": health, "action_required": schema["action"].get("required")}


def check(pack_dir: str) -> dict:
    pack = Pack.load(pack_dir)
    server, thread, url = _serve(create_pack_app(pack, max_sessions=4))
    out = {"name": pack.name, "typed": {}, "generic": {}}
    try:
        out["action_required"] = requests.get(f"{url}/schema", timeout=30).json()["action"].get("required")
        with PackEnvClient(base_url=url).sync() as client:
            for env in pack.environments:
                out["typed"][env.env_id] = _play(client, env.env_id, _actions(pack, env.env_id), typed=True)
            try:
                client.reset(env_id="no-such-env")
            except RuntimeError as err:
                out["unknown_env_error"] = str(err)
        first = pack.environments[0].env_id
        with GenericEnvClient(base_url=url).sync() as client:
            out["generic"][first] = _play(client, first, _actions(pack, first), typed=False)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    return out


if __name__ == "__main__":
    print(json.dumps({"packs": [check(path) for path in sys.argv[1:]], "serve_command": serve_command(sys.argv[1])}))
