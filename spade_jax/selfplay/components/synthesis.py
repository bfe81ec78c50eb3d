"""Tool-use trajectory synthesis (EnvFactory, a related system: `related/trajectories/`) as a
periodic job: every `trajectories.every` iterations, from the newest `trajectories.max_envs`
tool-use environments of memory, with the policy after that many updates; files in
`<workdir>/trajectories/<step>/` (`related/trajectories/run.py`).
A tool-use program that synthesis cannot use is a row of the table with its reason (counted in
`trajectories/rejected`); no program's failure stops synthesis or the run."""

from __future__ import annotations

import dataclasses
import os

from spade_jax.related.trajectories import run as synthesis
from spade_jax.related.trajectories.synth import SynthConfig, synthesize
from spade_jax.selfplay.components.base import Context, Section
from spade_jax.selfplay.sections import from_section, section


def _read(c) -> SynthConfig:
    if c.trajectories.every < 0 or c.trajectories.max_envs < 1:
        raise ValueError(f"every must be >= 0 (0: never) and max_envs >= 1, got {c.trajectories.every}, "
                         f"{c.trajectories.max_envs}")
    return from_section(SynthConfig, c.trajectories, seed=c.seed)


# `config.trajectories`: synthesis's settings (its seed is the run's), and how often (`every`, 0: never)
# from how many of the newest tool-use environments (`max_envs`).
SECTION = Section("trajectories", lambda: section(SynthConfig, exclude=("seed",), every=0, max_envs=8), _read)


class Synthesis:
    name = "trajectories"
    kind = "job"
    at_budget_end = False

    def __init__(self, context: Context):
        self.context = context
        self.cfg = SECTION.read(context.config)
        self.every = context.config.trajectories.every
        self.max_envs = context.config.trajectories.max_envs

    def run(self, step: int) -> dict[str, float]:
        ctx = self.context
        cfg = dataclasses.replace(self.cfg, seed=ctx.seed(step - 1, "trajectories"))
        programs, rejected = synthesis.newest_tool_programs(ctx.memory_records(), self.max_envs)
        complete, play = synthesis.policy_players(ctx.policy, ctx.pool, ctx.agent_cfg, cfg)
        examples, reports = synthesize(ctx.pool, programs, complete, play, cfg, progress=ctx.progress)
        reports = rejected + reports
        if ctx.main:
            synthesis.write_outputs(os.path.join(ctx.workdir, "trajectories", str(step)), examples, reports)
        return synthesis.metrics(len(programs), examples, reports)


def build(context: Context) -> Synthesis | None:
    return Synthesis(context) if context.config.trajectories.every else None
