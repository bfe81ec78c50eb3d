"""What an installed pack runs on: its manifest and programs (`Pack`), and episodes in the sandbox.

`SandboxEpisode` plays one program's episodes, one at a time, through a `SandboxPool` (the one
the caller passes, else its own, started at the first reset): the program is loaded, reset and
stepped in a sandbox worker, never in this process, exactly as the agent's rollouts and
admission run programs. The Gymnasium (`gym_env`) and OpenEnv (`openenv_env`) adapters are
thin layers over it; `pack_cli` is an installed pack's command line.

Standard library only (plus gymnasium when `register_gymnasium` is called): no JAX.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from spade_jax.envpack.manifest import Manifest, PackedEnv, PackError, read_program
from spade_jax.envs.contract import is_success
from spade_jax.sandbox import EpisodeSpec, SandboxConfig, SandboxError, SandboxPool, StepResult

GYM_ENTRY_POINT = "spade_jax.envpack.gym_env:ProgramEnv"


class EpisodeError(RuntimeError):
    """An episode could not start, or a call came at the wrong time (before a reset, after the end)."""


class Pack:
    """A pack's manifest and program files, read from its package directory."""

    def __init__(self, root: Path, manifest: Manifest):
        self.root = Path(root)
        self.manifest = manifest
        self.name = manifest.name
        self._by_key = {}
        for env in manifest.environments:
            self._by_key.update({env.env_id: env, env.gym_id: env})

    @classmethod
    def load(cls, root: str | os.PathLike) -> "Pack":
        return cls(Path(root), Manifest.read(Path(root)))

    @property
    def environments(self) -> tuple[PackedEnv, ...]:
        return self.manifest.environments

    def env(self, key: str) -> PackedEnv:
        """The environment with env id or Gymnasium id ``key``."""
        env = self._by_key.get(key)
        if env is None:
            known = ", ".join(e.env_id for e in self.environments)
            raise PackError(f"pack {self.name} has no environment {key!r}; it has: {known}")
        return env

    def program(self, key: str) -> str:
        return read_program(self.root, self.env(key))

    def register_gymnasium(self) -> list[str]:
        """Registers each environment's Gymnasium id (again, if this pack registered it before); returns the ids."""
        import gymnasium

        for env in self.environments:
            gymnasium.registry.pop(env.gym_id, None)
            gymnasium.register(env.gym_id, entry_point=GYM_ENTRY_POINT,
                               kwargs={"pack": self.name, "env_id": env.env_id})
        return [env.gym_id for env in self.environments]


def resolve_pack(pack: "Pack | str | os.PathLike") -> Pack:
    """A `Pack`, from itself, a pack's package directory, or the name of its (importable) package."""
    if isinstance(pack, Pack):
        return pack
    if os.path.isdir(pack):
        return Pack.load(pack)
    try:
        module = importlib.import_module(str(pack))
    except ImportError as err:
        raise PackError(f"{pack!r} is neither a pack directory nor an importable pack: {err}") from None
    found = getattr(module, "PACK", None)
    if not isinstance(found, Pack):
        raise PackError(f"the package {pack!r} is not a spade_jax environment pack (it has no PACK)")
    return found


def env_kwargs(env: PackedEnv, difficulty: str | None) -> dict:
    """The constructor arguments of an episode: ``difficulty`` (default: the environment's calibrated
    level), which must be one of the levels its program declares."""
    level = difficulty if difficulty is not None else env.level
    if level is None:
        return {}
    if level not in env.levels:
        declared = ", ".join(env.levels) if env.levels else "none"
        raise ValueError(f"{env.env_id} has no difficulty level {level!r}; its program declares: {declared}")
    return {"difficulty": level}


class SandboxEpisode:
    """One program's episodes in the sandbox, one at a time.

    ``pool``: a `SandboxPool` to run in (the caller keeps it, and must use it from one thread);
    without one the episode starts its own (``sandbox``, default one worker) at the first
    `start` and stops it in `close`. ``max_turns`` goes to the program's constructor (None: its
    own default); the sandbox also truncates an episode at that many steps.
    """

    def __init__(self, program: str, *, max_turns: int | None = None, pool: SandboxPool | None = None,
                 sandbox: SandboxConfig | None = None):
        self.program = program
        self.max_turns = max_turns
        self.config = pool.config if pool is not None else (sandbox or SandboxConfig(num_workers=1))
        self._pool, self._owns_pool = pool, pool is None
        self._episode_id: int | None = None
        self._over = True

    def start(self, seed: int, kwargs: dict) -> StepResult:
        """Ends the running episode and starts a new one on ``seed``; EpisodeError when it fails to start."""
        self._end_episode()
        if self._pool is None:
            self._pool = SandboxPool(self.config)
        first = self._pool.start([EpisodeSpec(self.program, seed=seed, max_turns=self.max_turns, env_kwargs=kwargs)])[0]
        self._episode_id = first.episode_id
        if not first.ok:
            self._end_episode()
            raise EpisodeError(f"the environment failed to start ({first.failed_call}"
                               f"{', timed out' if first.timed_out else ''}): {first.error}")
        self._over = False
        return first

    def step(self, action: str) -> StepResult:
        """Steps the running episode with ``action``; the result says how it went (an error ends it)."""
        if not isinstance(action, str):
            raise TypeError(f"an action is the text the program reads, a str; got {type(action).__name__}")
        if self._over:
            raise EpisodeError("no episode is running: reset first (an episode is over once terminated or truncated)")
        result = self._pool.step([self._episode_id], [action])[0]
        self._over = result.done or not result.ok
        return result

    def solution(self) -> str | None:
        """The program's reference actions for the current episode (one per line), None if it has none."""
        if self._episode_id is None:
            raise EpisodeError("no episode: reset first")
        return self._pool.solution([self._episode_id])[0]

    def _end_episode(self) -> None:
        episode_id, self._episode_id, self._over = self._episode_id, None, True
        if episode_id is not None:
            self._pool.close([episode_id])

    def close(self) -> None:
        """Ends the episode, and stops the pool if this episode started it. Idempotent."""
        try:
            self._end_episode()
        except SandboxError:
            pass  # the pool was closed under the episode, which went with it
        if self._owns_pool and self._pool is not None:
            self._pool.close_all()
            self._pool = None


def step_info(result: StepResult) -> dict:
    """A step's info: the program's, plus ``error`` / ``timed_out`` when the step failed and
    ``won`` when the episode terminated (`envs.contract.is_success` of its final reward)."""
    info = dict(result.info)
    if result.error is not None:
        info.update(error=result.error, timed_out=result.timed_out)
    if result.terminated:
        info["won"] = is_success(result.reward)
    return info
