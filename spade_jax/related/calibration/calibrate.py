"""Solver-relative difficulty calibration (EvoEnv): the stage after admission.

For each newly admitted program the current agent plays greedily (temperature 0, the
agent's own `max_turns`) on `seeds_per_level` fixed seeds at its default level (None) and
at every level the program declares (`DIFFICULTY_LEVELS`, read with
`sandbox.policy.difficulty_levels`; `candidate_levels`). The environment's own `solution()`
is replayed on the same seeds under the same turn bound. A level is *verified* when its
solution wins on every seed; among the verified levels whose agent solve rate lies in
`band` (inclusive) the last candidate is chosen: the hardest declared level, so the pool
stays at the edge of what the agent can do, or the default when no declared level is in
band. No such level: the program is rejected at stage "calibration", with every level's
rates in the reason.

The solve-verify gap of a level is its solution solve rate minus the agent's: how much of
what the environment can verify the agent cannot yet do in natural language.

All programs x levels x seeds play in one `play_episodes` call (they batch on the engine),
and all solution replays in one batched pass over the sandbox.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from spade_jax.agent import AgentConfig, EpisodeRequest, play_episodes
from spade_jax.envs.contract import EPISODE_SEED_SPACE, is_success
from spade_jax.sandbox import EpisodeSpec
from spade_jax.sandbox.policy import PolicyError, difficulty_levels
from spade_jax.seeds import derive_seed

STAGE = "calibration"


@dataclasses.dataclass(frozen=True)
class CalibrationConfig:
    """The calibration stage (pool rotation out of replay is memory's: `RotationConfig`).

    enabled: calibrate the programs admitted each design iteration (off: every admitted
      program plays at its default level).
    seeds_per_level: fixed seeds (per run seed and iteration, from EPISODE_SEED_SPACE) the
      agent and the solution play at each level.
    band: inclusive agent solve-rate band a level must lie in. The default (0.125, 0.75)
      with 4 seeds admits 1, 2 or 3 wins of 4: at least one win (the agent gets a learning
      signal) and at least one loss (not yet mastered); the lower edge, half a seed's step,
      also admits 1 win of 8 when seeds_per_level is 8.
    """

    enabled: bool = False
    seeds_per_level: int = 4
    band: tuple[float, float] = (0.125, 0.75)

    def __post_init__(self):
        if self.seeds_per_level < 1:
            raise ValueError(f"seeds_per_level must be >= 1, got {self.seeds_per_level}")
        low, high = self.band
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"band must be an ordered pair within [0, 1], got {tuple(self.band)}")


@dataclasses.dataclass(frozen=True)
class CalibrationResult:
    """One program's calibration: per level (None = the default) the agent's and the solution's
    solve rates, the chosen level, the verdict and its reason, and the cost (its episodes, agent
    and solution, and its share of the stage's wall time)."""

    levels: tuple[str | None, ...]
    agent_rates: tuple[float, ...]
    solution_rates: tuple[float, ...]
    level: str | None
    admitted: bool
    reason: str
    episodes: int
    seconds: float

    @property
    def gaps(self) -> tuple[float, ...]:
        """Solve-verify gap per level: solution solve rate - agent solve rate."""
        return tuple(s - a for s, a in zip(self.solution_rates, self.agent_rates))

    @property
    def gap(self) -> float | None:
        """The gap at the chosen level (None when rejected)."""
        return self.gaps[self.levels.index(self.level)] if self.admitted else None

    def to_dict(self) -> dict:
        """JSON-ready, for the admission report, the environment log and the gallery."""
        return {"level": self.level, "levels": list(self.levels), "agent": list(self.agent_rates),
                "solution": list(self.solution_rates), "gap": list(self.gaps), "gap_at_level": self.gap,
                "admitted": self.admitted, "reason": self.reason, "episodes": self.episodes,
                "seconds": round(self.seconds, 3)}


def candidate_levels(code: str) -> tuple[str | None, ...]:
    """The levels calibration plays, in order of preference (last wins a tie in band): the
    default (None), then the declared ones, easiest first."""
    return (None, *difficulty_levels(code))


def choose_level(levels: Sequence[str | None], agent_rates: Sequence[float], solution_rates: Sequence[float],
                 band: tuple[float, float]) -> tuple[int | None, str]:
    """The index of the last verified level whose agent rate lies in ``band`` (None: none) and why;
    ``levels`` in `candidate_levels` order, so the hardest declared level in band, else the default."""
    low, high = band
    shown = ", ".join(f"{'default' if level is None else level} {a:.2f} (solution {s:.2f})"
                      for level, a, s in zip(levels, agent_rates, solution_rates))
    fits = [i for i, (a, s) in enumerate(zip(agent_rates, solution_rates)) if low <= a <= high and s >= 1.0]
    if not fits:
        return None, f"no verified level in band [{low:g}, {high:g}]: agent {shown}"
    chosen = levels[fits[-1]]
    return fits[-1], f"level {'default' if chosen is None else chosen!r} in band [{low:g}, {high:g}]: agent {shown}"


def calibrate(policy, pool, programs: Sequence[str], agent_cfg: AgentConfig, cfg: CalibrationConfig, *,
              seed: int, sample: Callable | None = None,
              progress: Callable[[int], None] | None = None) -> list[CalibrationResult]:
    """Calibrates each admitted program (see the module docstring); results in input order.

    ``seed`` fixes the episode seeds (the same at every level, so levels compare on matched
    instances) and the agent's sampling; ``sample`` goes to `play_episodes` (scripted agents).
    """
    if not programs:
        return []
    started = time.perf_counter()
    seeds = [derive_seed(seed, j) % EPISODE_SEED_SPACE for j in range(cfg.seeds_per_level)]
    levels_of, unreadable = {}, {}
    for p, code in enumerate(programs):
        try:
            levels_of[p] = candidate_levels(code)
        except PolicyError as err:  # a program past admission that does not parse is not played
            unreadable[p] = f"cannot read its difficulty levels: {err}"
    cells = [(p, level) for p, levels in levels_of.items() for level in levels]
    requests = [EpisodeRequest(c, programs[p], s, env_kwargs=_kwargs(level))
                for c, (p, level) in enumerate(cells) for s in seeds]
    agent_won, solved = np.zeros(len(cells)), []
    if requests:
        greedy = dataclasses.replace(agent_cfg, temperature=0.0)
        for t in play_episodes(policy, pool, requests, greedy, seed=seed, sample=sample, progress=progress):
            agent_won[t.request.env_key] += t.won
        solved = replay_solutions(pool, [EpisodeSpec(r.program, seed=r.seed, max_turns=agent_cfg.max_turns,
                                                     env_kwargs=dict(r.env_kwargs)) for r in requests])
    solution_won = np.asarray(solved, float).reshape(len(cells), len(seeds)).sum(axis=1)
    seconds = (time.perf_counter() - started) / len(programs)
    results = []
    for p in range(len(programs)):
        if p in unreadable:
            results.append(CalibrationResult(levels=(), agent_rates=(), solution_rates=(), level=None,
                                             admitted=False, reason=unreadable[p], episodes=0, seconds=seconds))
            continue
        mine = [c for c, (owner, _) in enumerate(cells) if owner == p]
        levels = tuple(cells[c][1] for c in mine)
        agent = tuple(float(agent_won[c] / len(seeds)) for c in mine)
        solution = tuple(float(solution_won[c] / len(seeds)) for c in mine)
        index, reason = choose_level(levels, agent, solution, cfg.band)
        results.append(CalibrationResult(
            levels=levels, agent_rates=agent, solution_rates=solution,
            level=levels[index] if index is not None else None, admitted=index is not None, reason=reason,
            episodes=2 * len(mine) * len(seeds), seconds=seconds))
    return results


def replay_solutions(pool, specs: Sequence[EpisodeSpec]) -> list[bool]:
    """Whether each episode's own `solution()` (one action per line, from a fresh reset) wins
    within the spec's turn bound. All episodes step together, one action each per round."""
    starts = pool.start(list(specs))
    ids = [s.episode_id for s in starts]
    try:
        ready = [i for i, s in enumerate(starts) if s.ok]
        answers = pool.solution_results([ids[i] for i in ready])
        actions = {i: [line for line in (a.solution or "").splitlines() if line.strip()]
                   for i, a in zip(ready, answers) if a.error is None}
        won = [False] * len(specs)
        live, turn = [i for i in ready if actions.get(i)], 0
        while live:
            results = pool.step([ids[i] for i in live], [actions[i][turn] for i in live])
            turn += 1
            going = []
            for i, result in zip(live, results):
                if result.ok and result.terminated:
                    won[i] = is_success(result.reward)
                elif result.ok and not result.truncated and turn < len(actions[i]):
                    going.append(i)
            live = going
        return won
    finally:
        pool.close(ids)


def _kwargs(level: str | None) -> dict:
    return {} if level is None else {"difficulty": level}


__all__ = ["STAGE", "CalibrationConfig", "CalibrationResult", "calibrate", "candidate_levels", "choose_level",
           "replay_solutions"]
