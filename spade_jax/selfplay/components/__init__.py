"""The side systems of a run, one registration line each (`REGISTRY`), built from the config.

A side system is a file in this package with a `build(context) -> component | None` (None when
its config switches it off) returning one of the interfaces of `base.py`, named by its `kind`
("admission", "agent" or "job"). Adding one is that file, one line in `REGISTRY` and, for
settings of its own, its `SECTION` in `SECTIONS` (the run config adds the section); neither the
loop nor the run config is touched.

The related systems (calibration, procedure memory, trajectory synthesis: methods of other
papers, not SPADE) are joined to the run only here: no other module of the core imports them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from spade_jax.selfplay.components import calibration, evaluation, procedures, synthesis
from spade_jax.selfplay.components.base import (PHASES, AdmissionStage, AgentComponent, Context, PeriodicJob,
                                                Section, merge_metrics)

REGISTRY = (
    calibration.build,  # admission stage: difficulty calibration against the current agent
    procedures.build,  # agent component: procedure memory's preplay guidance
    synthesis.build,  # periodic job: tool-use trajectory synthesis
    evaluation.build,  # periodic job: held-out evaluation
)
# The side systems' own sections of the run config (held-out evaluation's, `eval`, is the config's).
SECTIONS: tuple[Section, ...] = (calibration.SECTION, procedures.SECTION, synthesis.SECTION)


@dataclasses.dataclass
class Components:
    """The built side systems by interface, in registration order."""

    admission: list[AdmissionStage]
    agent: list[AgentComponent]
    jobs: list[PeriodicJob]

    def stateful(self) -> list[Any]:
        return [c for c in self.admission + self.agent + self.jobs if hasattr(c, "state_key")]

    def named(self, name: str):
        """The built side system called `name` (KeyError when it is not switched on)."""
        for c in self.admission + self.agent + self.jobs:
            if c.name == name:
                return c
        raise KeyError(f"no side system {name!r} in this run")

    def guidance(self, env) -> str | None:
        """The first agent component's preplay text for `env` (None: no guidance)."""
        return _first(c.guidance(env) for c in self.agent)

    def heldout_guidance(self, program: str) -> str | None:
        """The first agent component's preplay text for a held-out program."""
        return _first(c.heldout_guidance(program) for c in self.agent)


def build(context: Context, registry=REGISTRY) -> Components:
    """Every registered side system its config switches on; held-out guidance wired to the agent's."""
    built = [c for c in (b(context) for b in registry) if c is not None]
    unknown = [c for c in built if c.kind not in ("admission", "agent", "job")]
    if unknown:
        raise TypeError(f"side systems of unknown kind: {unknown} (kind: 'admission', 'agent' or 'job')")
    components = Components(admission=[c for c in built if c.kind == "admission"],
                            agent=[c for c in built if c.kind == "agent"],
                            jobs=[c for c in built if c.kind == "job"])
    if components.agent:
        context.heldout_guidance = components.heldout_guidance
    return components


def _first(texts) -> str | None:
    return next((t for t in texts if t is not None), None)


__all__ = ["PHASES", "REGISTRY", "SECTIONS", "AdmissionStage", "AgentComponent", "Components", "Context", "PeriodicJob",
           "Section", "build", "merge_metrics"]
