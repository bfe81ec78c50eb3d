"""Topology-aware chains of concrete tool calls, executed in the sandbox.

A chain is a seeded walk over a `ToolGraph`: the first call is an entry tool (arguments from
the first observation); each next call either follows an edge out of the previous tool (the
edge's argument takes a value from the previous call's output) or starts again at an entry
tool, up to a depth drawn from ``[min_calls, max_calls]``. Argument values are tried in a
scratch episode until one gives a result (`graph.is_failure`); a step no value serves ends
the walk. Then each optional step (one whose output no later step takes: never the last)
is skipped with probability ``skip_prob``, and the chain is replayed in a fresh episode
reset with its seed: the replay's results are the chain's trace, and a chain with a failing
call in the replay (a skipped step changed the state) is dropped.

End state: the ordered results of the chain's calls, and its answer, the last result (what
the chain was walked to find). An agent reaches it when its own calls returned every result
of the chain (as a multiset; independent calls may come in any order): `reaches_end_state`.
Everything is deterministic for a seed.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Sequence

import numpy as np

from spade_jax.envs.contract import EPISODE_SEED_SPACE
from spade_jax.envs.tool_use import normalize_answer
from spade_jax.envs.tool_use import tool_call_action
from spade_jax.related.trajectories.graph import ToolGraph, ToolProbe, assignments, text_values, typed_values


@dataclasses.dataclass(frozen=True)
class ChainConfig:
    """How chains are walked: depth bounds, skip and edge-following probabilities, tries per step."""

    min_calls: int = 1
    max_calls: int = 4
    skip_prob: float = 0.3
    follow_edge_prob: float = 0.7
    max_tries: int = 12

    def __post_init__(self):
        if not 1 <= self.min_calls <= self.max_calls:
            raise ValueError(f"ChainConfig: need 1 <= min_calls <= max_calls, got {self.min_calls}, {self.max_calls}")
        for name in ("skip_prob", "follow_edge_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"ChainConfig.{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.max_tries < 1:
            raise ValueError(f"ChainConfig.max_tries must be >= 1, got {self.max_tries}")


@dataclasses.dataclass(frozen=True)
class Call:
    """One tool call; ``fed`` when an argument took a value from the previous call's output."""

    tool: str
    arguments: dict
    fed: bool = False

    def action(self) -> str:
        return tool_call_action(self.tool, self.arguments)

    def to_dict(self) -> dict:
        return {"name": self.tool, "arguments": self.arguments, "fed": self.fed}


@dataclasses.dataclass(frozen=True)
class EndState:
    """The ordered results of a chain's calls and the answer they support (the last result)."""

    results: tuple[str, ...]

    @property
    def answer(self) -> str:
        return self.results[-1]


@dataclasses.dataclass(frozen=True)
class Chain:
    """A replayed chain: its environment seed, task text, calls and their results (the trace)."""

    seed: int
    task: str
    calls: tuple[Call, ...]
    results: tuple[str, ...]

    @property
    def end_state(self) -> EndState:
        return EndState(self.results)


def reaches_end_state(end_state: EndState, results: Sequence[str]) -> bool:
    """Whether ``results`` (an agent's tool results) hold every result of ``end_state`` (multiset,
    compared after `normalize_answer`)."""
    have = collections.Counter(normalize_answer(r) for r in results)
    need = collections.Counter(normalize_answer(r) for r in end_state.results)
    return all(have[r] >= n for r, n in need.items())


def chain_seeds(seed: int, index: int) -> tuple[int, int]:
    """(environment seed, walk seed) of chain ``index`` under ``seed``."""
    env_seed, walk_seed = np.random.SeedSequence([seed, index]).generate_state(2)
    return int(env_seed) % EPISODE_SEED_SPACE, int(walk_seed)


def sample_chains(probe: ToolProbe, graph: ToolGraph, num: int, cfg: ChainConfig = ChainConfig(), *,
                  seed: int = 0) -> tuple[list[Chain], int]:
    """Walks ``num`` chains (chain i from `chain_seeds(seed, i)`); returns the replayed ones and
    how many were dropped (no entry call served, or the replay failed)."""
    chains, dropped = [], 0
    for index in range(num):
        env_seed, walk_seed = chain_seeds(seed, index)
        chain = sample_chain(probe, graph, env_seed, random.Random(walk_seed), cfg)
        if chain is None:
            dropped += 1
        else:
            chains.append(chain)
    return chains, dropped


def sample_chain(probe: ToolProbe, graph: ToolGraph, env_seed: int, rng: random.Random,
                 cfg: ChainConfig = ChainConfig()) -> Chain | None:
    """One walk, thinned and replayed (module docstring); None when it is dropped."""
    if not graph.entry:
        return None
    episode_id, task = probe.open(env_seed)
    if episode_id is None:
        return None
    try:
        calls = _walk(probe, graph, episode_id, env_seed, task, rng, cfg)
    finally:
        probe.close(episode_id)
    if not calls:
        return None
    calls = _thin(calls, rng, cfg.skip_prob)
    results = replay(probe, env_seed, calls)
    if results is None:
        return None
    return Chain(env_seed, task, tuple(calls), tuple(results))


def replay(probe: ToolProbe, env_seed: int, calls: Sequence[Call]) -> list[str] | None:
    """The results of ``calls`` in a fresh episode reset with ``env_seed``; None if one fails."""
    episode_id, _ = probe.open(env_seed, turns=len(calls) + 1)
    if episode_id is None:
        return None
    try:
        results = []
        for call in calls:
            result = probe.call(episode_id, env_seed, call.tool, call.arguments, ask_rejection=False)
            if result is None:
                return None
            results.append(result)
        return results
    finally:
        probe.close(episode_id)


def _walk(probe: ToolProbe, graph: ToolGraph, episode_id: int, env_seed: int, task: str, rng: random.Random,
          cfg: ChainConfig) -> list[Call]:
    depth = rng.randint(cfg.min_calls, cfg.max_calls)
    known = text_values(task)
    calls: list[Call] = []
    previous_output: str | None = None
    while len(calls) < depth:
        edges = graph.edges_from(calls[-1].tool) if calls else ()
        if edges and (rng.random() < cfg.follow_edge_prob or not graph.entry):
            edge = rng.choice(edges)
            tool_name, fed_argument = edge.target, edge.argument
        else:
            tool_name, fed_argument = rng.choice(graph.entry), None
        tool = probe.tools[tool_name]
        pools = {name: typed_values(known, kind) for name, kind in tool.params}
        if fed_argument is not None:
            pools[fed_argument] = typed_values(text_values(previous_output), dict(tool.params)[fed_argument])
        include = (fed_argument,) if fed_argument else ()
        made = {(c.tool, tool_call_action(c.tool, c.arguments)) for c in calls}
        result = None
        for arguments in assignments(tool, pools, rng, cfg.max_tries, include=include):
            if (tool_name, tool_call_action(tool_name, arguments)) in made:
                continue
            result = probe.call(episode_id, env_seed, tool_name, arguments)
            if result is not None:
                break
        if result is None:
            break
        calls.append(Call(tool_name, arguments, fed=fed_argument is not None))
        previous_output = result
        known = known + text_values(result)
    return calls


def _thin(calls: list[Call], rng: random.Random, skip_prob: float) -> list[Call]:
    """Drops each optional call (its output feeds no next call; never the last) with ``skip_prob``."""
    kept = []
    for i, call in enumerate(calls):
        optional = i + 1 < len(calls) and not calls[i + 1].fed
        if optional and rng.random() < skip_prob:
            continue
        kept.append(call)
    return kept
