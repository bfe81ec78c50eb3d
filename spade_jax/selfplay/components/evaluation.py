"""Held-out evaluation as a periodic job: every `eval.every` iterations and after the iteration
that spends the agent-token budget, the suites of `eval.suites` (`evals/runner.py`) on the policy
after that many updates; files in `<workdir>/evals/<step>/`."""

from __future__ import annotations

import os

from spade_jax.evals import runner
from spade_jax.selfplay.components.base import Context


class Evaluation:
    name = "eval"
    kind = "job"
    at_budget_end = True

    def __init__(self, context: Context):
        self.context = context
        self.cfg = context.eval_cfg
        self.generation = context.eval_generation
        self.every = self.cfg.every
        self.evaluator: runner.Evaluator | None = None  # built (suites listed) at the first evaluation

    def run(self, step: int) -> dict[str, float]:
        ctx = self.context
        out_dir = os.path.join(ctx.workdir, "evals", str(step)) if ctx.main else None
        if self.evaluator is None:
            self.evaluator = runner.Evaluator(self.cfg, self.generation)
        results = self.evaluator.run(ctx.policy, ctx.pool, ctx.agent_cfg, out_dir, progress=ctx.progress,
                                     guidance=ctx.heldout_guidance)
        if ctx.main:
            print(runner.table(results), flush=True)
        return runner.metrics(results)


def build(context: Context) -> Evaluation | None:
    cfg = context.eval_cfg
    return Evaluation(context) if cfg is not None and cfg.every and cfg.specs else None
