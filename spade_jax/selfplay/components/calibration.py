"""Difficulty calibration (EvoEnv, a related system: `related/calibration/`) as admission's last
stage: the current agent plays the admitted programs' levels; a program with no level in band is
rejected."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from spade_jax.related.calibration.calibrate import STAGE, CalibrationConfig, calibrate
from spade_jax.selfplay.components.base import Context, Section
from spade_jax.selfplay.console import phase_bar
from spade_jax.selfplay.sections import from_section, section

# Solver-relative difficulty calibration of new designs: `config.calibration`.
SECTION = Section("calibration", lambda: section(CalibrationConfig),
                  lambda c: from_section(CalibrationConfig, c.calibration))


class CalibrationStage:
    """Each admitted report gets the result in ``details["calibration"]``; a rejected one is
    marked at stage "calibration" (its designer sample then earns the failure penalty)."""

    name = STAGE
    kind = "admission"

    def __init__(self, context: Context):
        self.context = context
        self.cfg = SECTION.read(context.config)

    def __call__(self, designs: Sequence, iteration: int) -> dict[str, float]:
        ctx = self.context
        admitted = [d for d in designs if d.admitted]
        with phase_bar("calibration", 1, enabled=ctx.progress) as bar:
            results = calibrate(ctx.policy, ctx.pool, [d.report.code for d in admitted], ctx.agent_cfg, self.cfg,
                                seed=ctx.seed(iteration, "calibration"))
            bar.update(1)
        for d, result in zip(admitted, results):
            d.report.details["calibration"] = result.to_dict()
            if not result.admitted:
                d.report.admitted, d.report.stage, d.report.reason = False, STAGE, result.reason
        gaps = [g for r in results for g in r.gaps]
        rates = [a for r in results for a in r.agent_rates]
        return {
            "calibration/episodes": sum(r.episodes for r in results),
            "calibration/solve_verify_gap_mean": float(np.mean(gaps)) if gaps else math.nan,
            "calibration/agent_solve_rate_mean": float(np.mean(rates)) if rates else math.nan,
        }


def build(context: Context) -> CalibrationStage | None:
    return CalibrationStage(context) if context.config.calibration.enabled else None
