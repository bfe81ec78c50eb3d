"""Multi-process runs: every JAX process runs the same program on the same global batch,
and each runs the sandbox episodes of its own shard.

`ShardedPool` has the `SandboxPool` API. Every process calls it with the same global
list of episodes; a process starts and steps only the episodes it owns (index modulo the
process count) in its local pool, then the results of all processes are gathered, so
every process sees the complete, identically ordered results. With one process it is a
thin pass-through.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import jax
import numpy as np

from spade_jax.sandbox import EpisodeSpec, SandboxPool, SolutionResult, StepResult


def is_main_process() -> bool:
    return jax.process_index() == 0


def allgather_json(obj) -> list:
    """Every process's JSON-serialisable `obj`, in process order (a no-op with one process)."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    payload = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = multihost_utils.process_allgather(np.asarray([payload.size], np.int64))
    padded = np.zeros(int(np.max(sizes)), np.uint8)
    padded[: payload.size] = payload
    gathered = multihost_utils.process_allgather(padded)
    return [json.loads(bytes(row[: int(n)]).decode()) for row, n in zip(gathered, np.ravel(sizes))]


class ShardedPool:
    """A `SandboxPool` view over all processes; episode ids are global and identical everywhere."""

    def __init__(self, local: SandboxPool):
        self.local = local
        self.config = local.config
        self.isolation = local.isolation
        self.rank, self.size = jax.process_index(), jax.process_count()
        self._next_id = 0
        self._local_id: dict[int, int] = {}  # global id -> local pool id, for episodes this process owns

    def _owned(self, global_ids: Sequence[int]) -> list[int]:
        return [g for g in global_ids if g % self.size == self.rank]

    def _gather(self, global_ids: Sequence[int], local_results: dict[int, dict]) -> dict[int, dict]:
        merged: dict[int, dict] = {}
        for part in allgather_json({str(k): v for k, v in local_results.items()}):
            merged.update({int(k): v for k, v in part.items()})
        missing = [g for g in global_ids if g not in merged]
        if missing:
            raise RuntimeError(f"no process reported episodes {missing[:5]}")
        return merged

    def start(self, specs: Sequence[EpisodeSpec]) -> list[StepResult]:
        global_ids = list(range(self._next_id, self._next_id + len(specs)))
        self._next_id += len(specs)
        mine = self._owned(global_ids)
        results = self.local.start([specs[g - global_ids[0]] for g in mine])
        local = {}
        for g, r in zip(mine, results):
            self._local_id[g] = r.episode_id
            local[g] = dataclasses.asdict(dataclasses.replace(r, episode_id=g))
        merged = self._gather(global_ids, local)
        return [StepResult.from_dict(merged[g]) for g in global_ids]

    def step(self, episode_ids: Sequence[int], actions: Sequence[str]) -> list[StepResult]:
        by_id = dict(zip(episode_ids, actions))
        mine = self._owned(episode_ids)
        results = self.local.step([self._local_id[g] for g in mine], [by_id[g] for g in mine])
        local = {g: dataclasses.asdict(dataclasses.replace(r, episode_id=g)) for g, r in zip(mine, results)}
        merged = self._gather(episode_ids, local)
        return [StepResult.from_dict(merged[g]) for g in episode_ids]

    def solution_results(self, episode_ids: Sequence[int]) -> list[SolutionResult]:
        mine = self._owned(episode_ids)
        results = self.local.solution_results([self._local_id[g] for g in mine])
        local = {g: dataclasses.asdict(dataclasses.replace(r, episode_id=g)) for g, r in zip(mine, results)}
        merged = self._gather(episode_ids, local)
        return [SolutionResult.from_dict(merged[g]) for g in episode_ids]

    def solution(self, episode_ids: Sequence[int]) -> list[str | None]:
        return [r.solution for r in self.solution_results(episode_ids)]

    def close(self, episode_ids: Sequence[int]) -> None:
        mine = self._owned(episode_ids)
        self.local.close([self._local_id.pop(g) for g in mine if g in self._local_id])

    def close_all(self) -> None:
        self.local.close_all()
