"""A pack's program as a Gymnasium environment: text in, text out, every step in the sandbox.

``gymnasium.make("<pack>/<env>-v0")`` (the pack registers its ids on import; ``"<pack>:<pack>/<env>-v0"``
imports it first) gives a `ProgramEnv`:

* observations and actions are `ProgramText`: any string up to the sandbox's observation cap
  that the sandbox's text cleaning leaves as it is (valid Unicode, no control character but
  newline and tab), which is every observation a program can send through the sandbox;
* ``reset(seed=s)`` starts an episode of the program on episode seed ``s`` (the seed the run's
  own episodes use); ``reset()`` draws one from the env's seeded generator, so seeded resets
  replay; ``options={"difficulty": level}`` plays one of the levels the program declares
  (default: the level calibration chose);
* ``step(action)`` sends the action text to the program and returns its observation, its
  reward (clipped to [-1, 1]; SPADE scores the final one), ``terminated`` and ``truncated``;
  ``info`` holds ``won`` at termination and ``error`` when the program failed (which ends the
  episode, truncated); ``solution()`` gives the program's reference actions for the episode.

Each env runs its episodes through a `SandboxPool` of its own, started at the first reset (pass
``pool=`` to share one among envs stepped from one thread, ``sandbox=`` for its settings).
"""

from __future__ import annotations

import gymnasium
from gymnasium import spaces

from spade_jax.envpack.runtime import SandboxEpisode, env_kwargs, resolve_pack, step_info
from spade_jax.envs.contract import EPISODE_SEED_SPACE
from spade_jax.text import clean_text

# What `ProgramText.sample` draws from: printable ASCII and the newline.
_SAMPLE_CHARSET = "".join(map(chr, range(32, 127))) + "\n"
MAX_ACTION_CHARS = 16384


class ProgramText(spaces.Text):
    """Strings of ``min_length..max_length`` characters that `spade_jax.text.clean_text` keeps unchanged.

    `contains` accepts any such string (a program's observation may hold any Unicode); `sample`
    draws printable ASCII and newlines, as `spaces.Text` does from its charset.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed=None):
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length and clean_text(x) == x

    def __repr__(self) -> str:
        return f"ProgramText({self.min_length}, {self.max_length})"


class ProgramEnv(gymnasium.Env[str, str]):
    """One packed program (see the module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, pack, env_id: str, *, max_turns: int | None = None, pool=None, sandbox=None):
        self.pack = resolve_pack(pack)
        self.packed = self.pack.env(env_id)
        self._episode = SandboxEpisode(self.pack.program(env_id), max_turns=max_turns, pool=pool, sandbox=sandbox)
        self.observation_space = ProgramText(self._episode.config.max_observation_chars)
        self.action_space = ProgramText(MAX_ACTION_CHARS)
        self.episode_seed: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        difficulty = options.pop("difficulty", None)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; the one option is 'difficulty'")
        kwargs = env_kwargs(self.packed, difficulty)
        self.episode_seed = seed if seed is not None else int(self.np_random.integers(EPISODE_SEED_SPACE))
        first = self._episode.start(self.episode_seed, kwargs)
        return first.observation, {**first.info, "episode_seed": self.episode_seed, **kwargs}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        result = self._episode.step(action)
        return result.observation, float(result.reward), result.terminated, result.truncated, step_info(result)

    def solution(self) -> str | None:
        """The program's reference actions for this episode, one per line (None: it has none)."""
        return self._episode.solution()

    def close(self) -> None:
        self._episode.close()
