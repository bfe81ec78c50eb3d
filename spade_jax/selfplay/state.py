"""The run state that lives between iterations and goes into every checkpoint (as JSON)."""

from __future__ import annotations

import dataclasses

import numpy as np

from spade_jax.rl.rewards import SkillRewardAverages


def design_env_id(iteration: int, slot: int) -> str:
    """The id of the environment that designer slot ``slot`` of ``iteration`` created."""
    return f"it{iteration:04d}-slot{slot:02d}"


@dataclasses.dataclass
class PoolEnv:
    """An environment the agent plays this period: a new design or a replay from memory.

    `plain` / `hinted` hold `(seed, reward, iteration)` of every episode played since it
    entered the pool; the designer's reward is computed from them when it falls due.
    `step_timeouts` counts the plays that timed out (a plain one is in neither list, a hinted
    one is kept with reward 0).
    """

    env_id: str
    code: str
    skill: str
    doc_id: str | None
    design_iteration: int
    is_replay: bool = False
    hint: str | None = None
    difficulty: str | None = None  # the level calibration chose (None: the program's default)
    plain: list = dataclasses.field(default_factory=list)
    hinted: list = dataclasses.field(default_factory=list)
    step_timeouts: int = 0


@dataclasses.dataclass
class PendingDesign:
    """A designer sample waiting for its reward (`due_iteration`), with its tokens for the update."""

    design_iteration: int
    due_iteration: int
    slot: int
    skill: str
    difficulty: str
    doc_id: str | None
    env_id: str | None  # None when the program was not admitted
    stage: str
    reason: str
    prompt_tokens: list
    tokens: list
    logprobs: list
    attempt: int = 0  # which attempt of its slot (`DesignerConfig.max_attempts`)

    def sequence_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, loss mask, sampler log-probs) of prompt + program."""
        n_prompt, n_gen = len(self.prompt_tokens), len(self.tokens)
        tokens = np.asarray(list(self.prompt_tokens) + list(self.tokens), np.int32)
        mask = np.concatenate([np.zeros(n_prompt, bool), np.ones(n_gen, bool)])
        logprobs = np.concatenate([np.zeros(n_prompt, np.float32), np.asarray(self.logprobs, np.float32)])
        return tokens, mask, logprobs


@dataclasses.dataclass
class LoopState:
    """Everything besides parameters, optimizer, memory and corpus cursor that a resume needs.

    `skill_averages`: each skill's reward averages for the designer reward kind
    "learning_potential" (`rewards.update_learning_potentials`), empty under other kinds.
    `held`: environments of earlier pools whose designs still wait for their reward (a
    reward delay as long as the period trains them in the next pool's first iteration).
    """

    iteration: int = 0  # the next iteration to run
    pool: list[PoolEnv] = dataclasses.field(default_factory=list)
    held: list[PoolEnv] = dataclasses.field(default_factory=list)
    pending: list[PendingDesign] = dataclasses.field(default_factory=list)
    history: list[dict] = dataclasses.field(default_factory=list)  # one metrics dict per iteration
    skill_averages: dict[str, SkillRewardAverages] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "iteration": self.iteration,
            "pool": [dataclasses.asdict(e) for e in self.pool],
            "held": [dataclasses.asdict(e) for e in self.held],
            "pending": [dataclasses.asdict(p) for p in self.pending],
            "history": self.history,
            "skill_averages": {k: dataclasses.asdict(v) for k, v in self.skill_averages.items()},
        }

    @classmethod
    def from_json(cls, data: dict) -> "LoopState":
        """The state `to_json` wrote; a checkpoint of an older layout (plays without their
        iteration, no held pools or skill averages) is refused with `OldCheckpointError`."""
        plays = [p for key in ("pool", "held") for e in data.get(key, []) for p in e["plain"] + e["hinted"]]
        if "held" not in data or "skill_averages" not in data or any(len(p) != 3 for p in plays):
            raise OldCheckpointError(
                "this checkpoint was written by spade_jax before plays kept their iteration and pools were held "
                f"(last read by commit {OLD_LAYOUT_COMMIT}); resume it with spade_jax at that commit")
        return cls(
            iteration=int(data["iteration"]),
            pool=[_pool_env(e) for e in data["pool"]],
            held=[_pool_env(e) for e in data["held"]],
            pending=[PendingDesign(**p) for p in data["pending"]],
            history=list(data["history"]),
            skill_averages={k: SkillRewardAverages(**v) for k, v in data["skill_averages"].items()},
        )


class OldCheckpointError(ValueError):
    """A checkpoint in a layout this code no longer reads."""


OLD_LAYOUT_COMMIT = "36594a1"  # the last commit that read the layouts `LoopState.from_json` refuses


def _pool_env(record: dict) -> PoolEnv:
    e = dict(record)
    e["plain"] = [tuple(x) for x in e["plain"]]
    e["hinted"] = [tuple(x) for x in e["hinted"]]
    return PoolEnv(**e)
