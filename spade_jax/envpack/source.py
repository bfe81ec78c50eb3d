"""The admitted environments of a run, read from its environment log (``gallery/envs.jsonl``).

The log holds every environment a run designed or played, one entry per environment and
iteration (`selfplay.runlog.EnvLogEntry`), so it still names environments the memory has
since evicted. An environment is admitted when an entry with its ``env_id`` says so; its first
such entry with code holds the design (code, skill, document, calibration), its last one with a
measurement the latest statistics. Seeds enter the log once the run has played them.

The log is data a run (and so a trained designer) wrote: every field is type-checked, and a
program is taken only when it passes the sandbox's parse stage (``sandbox.policy.check_program``)
and its difficulty levels read cleanly; anything else is skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from spade_jax.envpack.manifest import PackError, finite_or_none
from spade_jax.sandbox.policy import PolicyError, check_program, difficulty_levels
from spade_jax.selfplay.runlog import ENVS_FILE, GALLERY_DIR, EnvLog, EnvLogEntry

_STATS = ("win_rate", "hinted_win_rate", "mean_plain", "mean_hinted", "regret", "designer_reward")


@dataclasses.dataclass(frozen=True)
class AdmittedEnv:
    """One admitted environment: its id, program, and the `PackedEnv` fields the log gives."""

    env_id: str
    code: str
    fields: dict


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _describe(entries: Sequence[EnvLogEntry]) -> AdmittedEnv:
    """The environment the log entries of one ``env_id`` describe (PolicyError when its program is refused)."""
    design = next(e for e in entries if _text(e.code))
    check_program(design.code)
    levels = difficulty_levels(design.code)
    measured = [e for e in entries if finite_or_none(e.win_rate) is not None]
    latest = measured[-1] if measured else None
    level = next((e.level for e in reversed(entries) if _text(e.level)), None)
    if level is not None and level not in levels:
        level = None  # a level the program does not declare cannot be asked of it
    retired = next((e.retired for e in reversed(entries) if _text(e.retired)), None)
    calibration = next((e.calibration for e in entries if isinstance(e.calibration, dict)), None)
    fields = dict(skill=_text(design.skill), doc_id=_text(design.doc_id), is_seed=design.is_seed is True,
                  levels=levels, level=level, calibration=calibration, plays=len(measured),
                  measured_iteration=latest.iteration if latest else None,
                  iteration_added=_int(design.iteration), retired=retired)
    fields.update({k: finite_or_none(getattr(latest, k)) if latest else None for k in _STATS})
    return AdmittedEnv(design.env_id, design.code, fields)


def admitted_envs(workdir: str, include_seeds: bool = True) -> tuple[list[AdmittedEnv], list[tuple[str, str]]]:
    """``(admitted, skipped)``: the run's admitted environments in the order they entered the log,
    and ``(env_id, reason)`` for each admitted one whose program cannot be packed."""
    if not os.path.isdir(workdir):
        raise PackError(f"the run directory {workdir} does not exist")
    log = EnvLog(workdir)
    if not log.path.exists():
        raise PackError(f"{workdir} has no environment log ({GALLERY_DIR}/{ENVS_FILE}): not a self-play run "
                        "directory, or one that has not finished an iteration")
    by_id: dict[str, list[EnvLogEntry]] = {}
    for entry in log.read():
        if _text(entry.env_id):
            by_id.setdefault(entry.env_id, []).append(entry)
    admitted, skipped = [], []
    for env_id, entries in by_id.items():
        if not any(e.admitted is True for e in entries):
            continue
        if not include_seeds and any(e.is_seed is True for e in entries):
            continue
        if not any(_text(e.code) for e in entries):
            skipped.append((env_id, "the log holds no program for it"))
            continue
        try:
            admitted.append(_describe(entries))
        except PolicyError as err:
            skipped.append((env_id, f"its program fails the parse stage: {err}"))
    return admitted, skipped
