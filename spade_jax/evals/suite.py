"""The interface every evaluation suite implements, and the records that pass between stages.

A suite lists its items (`Suite.items`), says how each is played — one reply to a chat
(`Item.messages`) or a multi-turn episode of an environment program (`Item.program`), both
through the agent's own sampler and engine — and scores what the policy did (`Suite.score`).
The runner (`evals.runner`) does the rest: batching, k samples per item, the sandbox, files.

A suite that needs a package or a data file that is not there raises `SuiteUnavailable`
with one line saying what to install or where to put the file; the other suites still run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
from typing import Any, Protocol, Sequence

from spade_jax.agent import Trajectory


BENCHMARK_SYSTEM_PROMPT = "You are a helpful assistant."  # under a benchmark's own instructions


class SuiteUnavailable(RuntimeError):
    """The suite cannot run here; the message says what to install or where to put which file."""


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """How a suite's items are sampled: greedy at temperature 0; `samples` per item (pass@k
    for every k up to it); `max_new_tokens` per reply (per turn in episodes)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    samples: int = 1

    def __post_init__(self):
        if self.samples < 1 or self.max_new_tokens < 1 or self.temperature < 0:
            raise ValueError(f"generation settings out of range: {self}")


@dataclasses.dataclass(frozen=True)
class Item:
    """One thing to evaluate. Exactly one of `messages` (a chat the policy answers once) and
    `program` (an environment source played as an episode from `seed`) is set. `group`
    names the sub-score the item counts towards; `reference` is whatever `score` needs."""

    item_id: str
    group: str = ""
    messages: tuple[dict, ...] | None = None
    program: str | None = None
    seed: int = 0
    max_turns: int | None = None
    reference: Any = None

    def __post_init__(self):
        if (self.messages is None) == (self.program is None):
            raise ValueError(f"item {self.item_id}: give exactly one of messages and program")


@dataclasses.dataclass(frozen=True)
class Score:
    """How one sample of an item did: `value` in [0, 1] (partial credit where the benchmark
    gives it), `solved` only for full credit, `details` JSON-serialisable (the parsed answer,
    the checker's verdict, ...)."""

    value: float
    solved: bool
    details: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not 0.0 <= self.value <= 1.0:
            raise ValueError(f"score {self.value} is outside [0, 1]")


@dataclasses.dataclass(frozen=True)
class Context:
    """What a suite may use besides the reply: the sandbox pool (running a program's tests), the
    policy under evaluation (an opponent in self-play, a simulated user) and the run's seed."""

    pool: Any = None
    policy: Any = None
    seed: int = 0


class InProcessPool:
    """The sandbox pool's episode calls for episodes that step in this process (a benchmark's
    own code, not model-written, so no sandbox): episode ids, `solution` (none: evaluation gives
    no hints) and `close`. Subclasses write `start` and `step`, keeping their episodes in
    ``_episodes`` under ids from ``_new_id``, and free what an episode holds in `_release`."""

    def __init__(self):
        self._episodes: dict[int, Any] = {}
        self._ids = itertools.count()

    def _new_id(self) -> int:
        return next(self._ids)

    def solution(self, episode_ids):
        return [None for _ in episode_ids]

    def close(self, episode_ids):
        for episode_id in episode_ids:
            episode = self._episodes.pop(episode_id, None)
            if episode is not None:
                self._release(episode)

    def _release(self, episode) -> None:
        """Frees what ``episode`` holds outside this pool (nothing by default)."""


class Suite(Protocol):
    """A benchmark. `name` is how results are filed; `settings` how items are sampled."""

    name: str
    settings: GenerationSettings

    def items(self, limit: int | None, seed: int) -> Sequence[Item]:
        """The items, in a fixed order; `limit` keeps that many, chosen with ``seed`` (most
        suites by `spread`: the same seed gives the same items)."""

    def score(self, item: Item, reply: str | Trajectory, context: Context) -> Score:
        """Scores one sample: the decoded reply for chat items, the finished episode otherwise.

        A suite whose episodes are not sandbox programs (gymnax games step in-process) also
        has ``episode_pool(context)``, returning an object with the pool's episode calls
        (`start`, `step`, `solution`, `close`). A suite whose pool reads whole replies (a
        benchmark's own call parser) has ``read_action(reply) -> str``; without it the pool
        gets the agent's parsed action (`spade_jax.agent.actions.parse_action`: a tool call
        or answer block, else the last ``\\boxed{}``, else the reply cut to 512 characters).
        A suite with ``system_prompt`` plays its episodes under it instead of the agent's
        (whose answer formats would contradict a benchmark's own instructions), its first
        observation unwrapped by the agent's `user_template`. Evaluation scores every
        episode: cut replies are stepped, timeouts and failed starts score, none is dropped. A suite whose
        scoring runs work that parallelises (code in the sandbox) may also have
        ``score_batch(items, replies, context) -> list[Score]``, which the runner then calls
        once per batch of chat replies."""


def stable_seed(*parts) -> int:
    """A 64-bit seed from ``parts`` that is the same in every process (no ``hash()``)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()[:8], "little")


def spread(groups: Sequence[str], limit: int | None, seed: int, salt: str) -> list[int]:
    """Which items a ``limit`` keeps, given each item's group: all of them without a limit (or
    with one at least their number); else ``limit`` taken from the groups in turn (in order of
    first appearance), each group's items in a ``(salt, seed)``-fixed order, so that a small
    limit still covers every group and the same seed keeps the same items in every process.
    Indices come back in item order."""
    if not limit or limit >= len(groups):
        return list(range(len(groups)))
    queues: dict[str, list[int]] = {}
    for index, group in enumerate(groups):
        queues.setdefault(group, []).append(index)
    for group, queue in queues.items():
        random.Random(stable_seed(salt, seed, group)).shuffle(queue)
    chosen: list[int] = []
    while len(chosen) < limit:
        for queue in queues.values():
            if queue and len(chosen) < limit:
                chosen.append(queue.pop())
    return sorted(chosen)
