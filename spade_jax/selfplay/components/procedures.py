"""Procedure memory (ProPlay) as an agent component: preplay guidance for each episode, learned
from the plain episodes the agent finished, checkpointed with the run (a related system:
`related/procedures/`)."""

from __future__ import annotations

import json
import os
from typing import Sequence

from spade_jax.related.procedures.memory import SEED, ProcedureConfig, ProcedureMemory, abstract, provenance
from spade_jax.selfplay.components.base import Context, Section
from spade_jax.selfplay.sections import from_section, section

PROCEDURES_FILE = "procedures.json"  # the memory's summary in the workdir, for the gallery
# ProPlay-style preplay guidance: `config.agent.procedure_memory`.
SECTION = Section("agent.procedure_memory", lambda: section(ProcedureConfig),
                  lambda c: from_section(ProcedureConfig, c.agent.procedure_memory))


class Procedures:
    name = "procedures"
    kind = "agent"
    state_key = "procedures"

    def __init__(self, context: Context):
        self.context = context
        self.cfg = SECTION.read(context.config)
        self.memory = ProcedureMemory(self.cfg)
        self.heldout = tuple(context.config.memory.heldout)

    def guidance(self, env) -> str | None:
        """The preplay text for a pool environment: a seed program's from the seed library's graphs
        only, so that no text a designed program wrote reaches them through the agent following it;
        any other program's from every graph."""
        seed = provenance(env.code, self.heldout) == SEED
        return self.memory.guidance(self.memory.key(env.code, env.skill), seed_library=seed)

    def heldout_guidance(self, program: str) -> str | None:
        """The preplay text for a held-out program (its skill read from its docstring, or its
        family), from the seed library's graphs only: held-out evaluation sees nothing designed."""
        return self.memory.guidance(self.memory.key(program), seed_library=True)

    def observe(self, envs: Sequence, episodes: Sequence) -> dict[str, float]:
        """Counts the plain episodes into memory and writes its summary (`procedures.json`, for the
        gallery). Hinted plays are left out: they follow a privileged hint, and their procedures
        would overstate what the agent does alone. A program that claims a held-out family is not
        learned from (``procedures/heldout_claims`` counts its plain plays); a seed program's plays
        count into the seed library's graphs as well (`related/procedures/memory.py`)."""
        claims = 0
        for t in episodes:
            env = envs[t.request.env_key]
            key = self.memory.key(env.code, env.skill)
            if t.hinted or key is None or not t.turns:
                continue
            source = provenance(env.code, self.heldout)
            if source is None:
                claims += 1
            else:
                self.memory.update(key, abstract(t.messages, t.won, t.end_reason), t.won, seed_library=source == SEED)
        if self.context.main:
            path = os.path.join(self.context.workdir, PROCEDURES_FILE)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(self.memory.summary(), f, indent=1, sort_keys=True)
            os.replace(path + ".tmp", path)
        return {
            "procedures/heldout_claims": claims,
            "procedures/keys": len(self.memory.keys()),
            "procedures/transitions": self.memory.num_transitions,
            "procedures/guided_episodes": sum(t.request.guidance is not None for t in episodes),
        }

    def to_state(self) -> dict:
        return self.memory.to_state()

    def load_state(self, state: dict | None) -> None:
        """A checkpoint from before procedure memory (or without it) starts empty."""
        self.memory = ProcedureMemory.from_state(self.cfg, state or {})


def build(context: Context) -> Procedures | None:
    return Procedures(context) if SECTION.read(context.config).enabled else None
