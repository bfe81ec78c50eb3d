"""A scripted player for studies of the designer alone: an agent whose frontier is known.

It plays each environment's own `solution()` in the sandbox and finishes it with a probability
that falls with the solution's length: for a solution of L actions it plays all of them with
probability ``sigmoid((budget - L) / width)``, else all but the last (the play runs out, ends
unterminated and scores 0 by the episode rule). Hinted plays have the larger
``hinted_budget``, so regret, ``sigmoid((hinted_budget - L) / w) - sigmoid((budget - L) / w)``,
peaks at ``L = (budget + hinted_budget) / 2``, and the blend's plateau (plain win rate in
[0.4, 0.6]) sits at ``L ~ budget``: a designer trained against it should move its designs
there. The environment decides every outcome (a solution that does not win scores what the
environment says), and every step runs in the sandbox as the policy's plays do.

This is an option for studies (`agent.player = "scripted"`, rung 2b of experiments/ladder/loop.py),
never the method: it generates no tokens, so the agent trains nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from spade_jax.agent.rollout import STEP_ERROR_REWARD, AgentConfig, EpisodeRequest, Trajectory
from spade_jax.envs.contract import episode_reward, is_success
from spade_jax.sandbox import EpisodeSpec
from spade_jax.seeds import derive_seed

PLAYERS = ("policy", "scripted")


@dataclasses.dataclass(frozen=True)
class ScriptedConfig:
    """The scripted player's budgets (in solution actions) for plain and hinted plays and the
    width of its logistic fall-off."""

    budget: float = 2.5
    hinted_budget: float = 4.5
    width: float = 0.5

    def __post_init__(self):
        if self.width <= 0:
            raise ValueError(f"agent.scripted.width must be > 0, got {self.width}")
        if self.hinted_budget < self.budget:
            raise ValueError(f"agent.scripted.hinted_budget ({self.hinted_budget}) must be >= budget ({self.budget})")

    def finish_probability(self, length: int, hinted: bool) -> float:
        """The chance a play of a solution of ``length`` actions plays all of them."""
        budget = self.hinted_budget if hinted else self.budget
        return 1.0 / (1.0 + math.exp((length - budget) / self.width))

    def frontier(self) -> float:
        """The solution length at which regret (hinted minus plain finish probability) peaks."""
        return (self.budget + self.hinted_budget) / 2


def solution_actions(solution: str | None) -> list[str]:
    """The actions of a `solution()` text, one per non-empty line."""
    return [line for line in (solution or "").splitlines() if line.strip()]


def solution_lengths(pool, programs: Sequence[str], seed: int, max_turns: int) -> list[int | None]:
    """The number of actions of each program's `solution()` on episode seed ``seed`` (None where
    the program does not start or has no solution): the difficulty the scripted player reads."""
    starts = pool.start([EpisodeSpec(program=p, seed=seed, max_turns=max_turns) for p in programs])
    ids = [s.episode_id for s in starts]
    live = [i for i, s in enumerate(starts) if s.ok]
    solutions = dict(zip(live, pool.solution([ids[i] for i in live]))) if live else {}
    pool.close(ids)
    return [len(solution_actions(solutions[i])) if solutions.get(i) is not None else None
            for i in range(len(programs))]


def play_scripted(pool, requests: Sequence[EpisodeRequest], agent_cfg: AgentConfig, cfg: ScriptedConfig, *,
                  seed: int) -> list[Trajectory]:
    """Plays every request with the scripted player, all episodes stepped together turn by turn.

    A play whose environment fails to start, whose `solution()` fails or whose step times
    out follows the policy's rules (`rollout` module docstring): dropped when plain, scored 0
    when hinted; a step that raises scores -1. The trajectories
    carry no tokens; `turns` is the number of actions stepped."""
    starts = pool.start([EpisodeSpec(program=r.program, seed=r.seed, max_turns=agent_cfg.max_turns,
                                     env_kwargs=dict(r.env_kwargs)) for r in requests])
    ids = [s.episode_id for s in starts]
    live = [i for i, s in enumerate(starts) if s.ok]
    solutions = dict(zip(live, pool.solution([ids[i] for i in live]))) if live else {}
    plans, messages = {}, {i: [{"role": "user", "content": s.observation}] for i, s in enumerate(starts)}
    for i in live:
        actions = solution_actions(solutions[i])
        rng = np.random.default_rng(derive_seed(seed, i))
        finish = rng.random() < cfg.finish_probability(len(actions), requests[i].hinted)
        plans[i] = actions if finish else actions[:-1]
    last = {i: starts[i] for i in range(len(requests))}
    turns = dict.fromkeys(range(len(requests)), 0)
    active = [i for i in live if plans[i] and solutions[i] is not None]
    while active:
        results = pool.step([ids[i] for i in active], [plans[i][turns[i]] for i in active])
        for i, result in zip(active, results):
            messages[i] += [{"role": "assistant", "content": plans[i][turns[i]]},
                            {"role": "user", "content": result.observation or result.error or ""}]
            turns[i] += 1
            last[i] = result
        active = [i for i in active if not (last[i].terminated or last[i].truncated or last[i].error)
                  and turns[i] < len(plans[i])]
    pool.close(ids)
    return [_trajectory(r, last[i], turns[i], messages[i], agent_cfg, started=starts[i].ok,
                        solved=i in solutions and solutions[i] is not None)
            for i, r in enumerate(requests)]


def _trajectory(request: EpisodeRequest, result, turns: int, messages: list, cfg: AgentConfig, *, started: bool,
                solved: bool) -> Trajectory:
    """The outcome of one scripted play under the rollout's rules (its module docstring)."""
    if result.timed_out:
        reward, dropped, reason = 0.0, not request.hinted, "timeout"
    elif not started or not solved:
        reward, dropped, reason = 0.0, not (request.hinted or cfg.every_play_counts), "error"
    elif result.error and result.failed_call == "step":
        reward, dropped, reason = STEP_ERROR_REWARD, False, "error"
    else:
        reward = episode_reward(result.reward, result.terminated)
        dropped = False
        reason = "terminated" if result.terminated else ("truncated" if result.truncated else "max_turns")
    return Trajectory(request=request, tokens=np.zeros(0, np.int32), loss_mask=np.zeros(0, bool),
                      sampler_logprobs=np.zeros(0, np.float32), reward=float(reward),
                      won=bool(result.terminated and not result.error and is_success(result.reward)), turns=turns,
                      end_reason=reason, error=result.error, messages=messages, dropped=dropped)
