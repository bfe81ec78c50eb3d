"""What a side system is to the loop: one of three small interfaces, and the context it gets.

- an **admission stage** runs after the sandbox's admission stages on every design batch; it
  may reject admitted designs (their report's stage becomes the stage's `name`) and returns
  its metrics;
- an **agent component** gives text shown before an episode (`guidance`), the same for a
  held-out program (`heldout_guidance`), and sees every scored iteration's episodes
  (`observe`);
- a **periodic job** runs every `every` iterations on the policy after that many updates
  (`run(step)`, `step` the number of updates) and returns its metrics; `name` is its timing
  key; `at_budget_end` also runs it after the iteration that spends the agent-token budget.

A component with `state_key` is checkpointed: `to_state()` is saved under that key of the
checkpoint's metadata and `load_state(state)` puts it back (`None` for a checkpoint made
without it). Components never see the loop; they get a `Context` when they are built. A side
system with settings of its own declares their config `Section` beside its code.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Protocol, Sequence

import ml_collections

from spade_jax.seeds import derive_seed

# Every random choice of an iteration is drawn from `derive_seed(seed, iteration, PHASES[phase])`.
PHASES = {"design": 1, "hints": 2, "episodes": 3, "review": 4, "replay": 5, "admission": 6, "calibration": 7,
          "trajectories": 8}


@dataclasses.dataclass(frozen=True)
class Section:
    """A side system's settings in the run config: the section at `path` ("calibration",
    "agent.procedure_memory"), made with its defaults by `make()` and read back by `read(config)`
    (a ValueError names what is wrong; the run config's validation prefixes the path)."""

    path: str
    make: Callable[[], ml_collections.ConfigDict]
    read: Callable[[ml_collections.ConfigDict], Any]


@dataclasses.dataclass
class Context:
    """The run's pieces a side system may use. `policy` is the one to sample with (the trainer's
    `sampling_policy`); `memory_records` reads the live memory (a resume replaces it);
    `eval_cfg` and `eval_generation` are held-out evaluation's settings (`config.eval_config`,
    `config.eval_generation`); `heldout_guidance` is the agent components' text for a held-out
    program."""

    config: ml_collections.ConfigDict
    workdir: str
    policy: Any
    pool: Any
    agent_cfg: Any
    main: bool
    memory_records: Callable[[], Sequence[Any]]
    eval_cfg: Any = None
    eval_generation: dict[str, Any] = dataclasses.field(default_factory=dict)
    heldout_guidance: Callable[[str], str | None] | None = None

    @property
    def progress(self) -> bool:
        """Whether to draw progress bars (the main process of a run that asks for them)."""
        return bool(self.config.log.progress) and self.main

    def seed(self, iteration: int, phase: str, *salt: int) -> int:
        """The seed of ``phase`` at ``iteration`` (``salt``: e.g. a designer slot's attempt)."""
        return derive_seed(self.config.seed, iteration, PHASES[phase], *salt)


def merge_metrics(per_call: Sequence[dict[str, float]]) -> dict[str, float]:
    """One dict from the metrics of several calls of the admission stages (one call per designer
    attempt): a `*_mean` value is averaged over the calls that gave a finite one, any other summed."""
    merged: dict[str, float] = {}
    for key in dict.fromkeys(k for m in per_call for k in m):
        values = [float(m[key]) for m in per_call if key in m]
        if key.endswith("_mean"):
            finite = [v for v in values if math.isfinite(v)]
            merged[key] = sum(finite) / len(finite) if finite else math.nan
        else:
            merged[key] = sum(values)
    return merged


class AdmissionStage(Protocol):
    kind: str  # "admission"
    name: str

    def __call__(self, designs: Sequence[Any], iteration: int) -> dict[str, float]: ...


class AgentComponent(Protocol):
    kind: str  # "agent"
    name: str

    def guidance(self, env: Any) -> str | None: ...

    def heldout_guidance(self, program: str) -> str | None: ...

    def observe(self, envs: Sequence[Any], episodes: Sequence[Any]) -> dict[str, float]: ...


class PeriodicJob(Protocol):
    kind: str  # "job"
    name: str
    every: int
    at_budget_end: bool

    def run(self, step: int) -> dict[str, float]: ...
