"""A pack as an OpenEnv environment: one server for all its programs, every step in the sandbox.

OpenEnv (``openenv-core``) is the environment interface TRL, torchforge, SkyRL and Unsloth train
against and that verifiers' ``OpenEnvTaskset`` (``base_url=...``) plays: an environment is a
server (FastAPI; one session per WebSocket) and trainers talk to it through an ``EnvClient``.

* `PackEnvironment` is the server-side ``Environment``: ``reset(env_id=..., seed=...,
  difficulty=...)`` picks one of the pack's programs (default: the server's ``--env``, else the
  first) and starts an episode of it in a sandbox worker; ``step(TextAction(text=...))`` sends
  the text to the program. A `TextObservation` carries the program's observation ``text``, its
  reward, ``done`` (terminated or truncated), ``truncated``, ``won`` at termination, the
  program's ``info`` and ``error`` when it failed. Each session runs its episodes in a
  `SandboxPool` of its own, started at its first reset and stopped when the session closes.
* `create_pack_app` is the FastAPI app (``openenv.core.create_app``), `serve_pack` runs it
  with uvicorn (``python -m <pack> serve``).
* `PackEnvClient` is the typed client (``PackEnvClient(base_url=...).sync()``); any OpenEnv
  client works, e.g. ``GenericEnvClient`` with ``step({"text": ...})``.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from openenv.core.client_types import StepResult as ClientStepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field

from spade_jax.envpack.runtime import Pack, SandboxEpisode, env_kwargs, resolve_pack, step_info
from spade_jax.envs.contract import EPISODE_SEED_SPACE
from spade_jax.sandbox import SandboxConfig, SandboxPool


class TextAction(Action):
    text: str = Field(description="The agent's reply as the program reads it, e.g. \\boxed{7} or a <tool_call>")


class TextObservation(Observation):
    text: str = Field(default="", description="The program's observation")
    truncated: bool = Field(default=False, description="The episode ended without terminating (turns, error)")
    won: bool | None = Field(default=None, description="At termination: whether the final reward is a win")
    info: dict[str, Any] = Field(default_factory=dict, description="The program's info dict")
    error: str | None = Field(default=None, description="Why the program failed (the episode is over)")


class PackState(State):
    env_id: str | None = Field(default=None, description="The program being played")
    episode_seed: int | None = Field(default=None, description="The seed its reset was given")
    difficulty: str | None = Field(default=None, description="The difficulty level played (None: the default)")


class PackEnvironment(Environment[TextAction, TextObservation, PackState]):
    """The pack's programs behind one OpenEnv environment (see the module docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, pack, env_id: str | None = None, *, max_turns: int | None = None,
                 sandbox: SandboxConfig | None = None):
        super().__init__()
        self.pack = resolve_pack(pack)
        self.default_env = self.pack.env(env_id).env_id if env_id else self.pack.environments[0].env_id
        self.max_turns = max_turns
        self.sandbox = sandbox or SandboxConfig(num_workers=1)
        self._pool: SandboxPool | None = None
        self._episode: SandboxEpisode | None = None
        self._state = PackState()
        self._rng = random.Random()

    def reset(self, seed: int | None = None, episode_id: str | None = None, env_id: str | None = None,
              difficulty: str | None = None) -> TextObservation:
        packed = self.pack.env(env_id or self.default_env)
        kwargs = env_kwargs(packed, difficulty)
        if seed is None:
            seed = self._rng.randrange(EPISODE_SEED_SPACE)
        if self._pool is None:
            self._pool = SandboxPool(self.sandbox)
        if self._episode is not None:
            self._episode.close()
        self._episode = SandboxEpisode(self.pack.program(packed.env_id), max_turns=self.max_turns, pool=self._pool)
        first = self._episode.start(seed, kwargs)
        self._state = PackState(episode_id=episode_id or str(uuid.uuid4()), step_count=0, env_id=packed.env_id,
                                episode_seed=seed, difficulty=kwargs.get("difficulty"))
        return TextObservation(text=first.observation, reward=0.0, done=False, info=dict(first.info))

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        if self._episode is None:
            raise RuntimeError("no episode is running: reset first")
        result = self._episode.step(action.text)
        self._state.step_count += 1
        info = step_info(result)
        return TextObservation(text=result.observation, reward=float(result.reward), done=result.done or not result.ok,
                               truncated=result.truncated, won=info.pop("won", None), error=info.pop("error", None),
                               info=info)

    @property
    def state(self) -> PackState:
        return self._state

    def solution(self) -> str | None:
        """The program's reference actions for the current episode (one per line; None if it has none)."""
        if self._episode is None:
            raise RuntimeError("no episode: reset first")
        return self._episode.solution()

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=self.pack.name, version=self.pack.manifest.version,
                                   description=f"{len(self.pack.environments)} environments designed by spade_jax; "
                                               "reset(env_id=...) picks one, every step runs in its sandbox")

    def close(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None
        if self._pool is not None:
            self._pool.close_all()
            self._pool = None


def create_pack_app(pack: Pack | str, env_id: str | None = None, *, max_sessions: int = 8,
                    max_turns: int | None = None, sandbox: SandboxConfig | None = None):
    """The OpenEnv FastAPI app of ``pack`` (one `PackEnvironment` per session)."""
    pack = resolve_pack(pack)
    if env_id is not None:
        pack.env(env_id)  # an unknown id is refused now, not at the first reset

    def factory() -> PackEnvironment:
        return PackEnvironment(pack, env_id, max_turns=max_turns, sandbox=sandbox)

    return create_app(factory, TextAction, TextObservation, env_name=pack.name, max_concurrent_envs=max_sessions)


def serve_pack(pack: Pack | str, env_id: str | None = None, *, host: str = "127.0.0.1", port: int = 8000,
               max_sessions: int = 8) -> None:
    """Serves ``pack`` over OpenEnv until interrupted."""
    import uvicorn

    uvicorn.run(create_pack_app(pack, env_id, max_sessions=max_sessions), host=host, port=port)


class PackEnvClient(EnvClient[TextAction, TextObservation, PackState]):
    """The typed OpenEnv client of a pack server."""

    def _step_payload(self, action: TextAction) -> dict[str, Any]:
        return {"text": action.text}

    def _parse_result(self, payload: dict[str, Any]) -> ClientStepResult[TextObservation]:
        observation = TextObservation(**payload.get("observation", {}), reward=payload.get("reward"),
                                      done=payload.get("done", False))
        return ClientStepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> PackState:
        return PackState(**payload)
