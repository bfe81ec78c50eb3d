"""Environment directories (`envs:PATH`): every program in PATH that passes admission, played plain.

PATH is a directory (its ``*.py``) or a comma-separated list of program files
(``envs:lib/tallest.py,lib/shopping.py``: a held-out part of a library). This is how the
learning study scores held-out environment families and how a user scores any set of
environments they write: each program goes through the
sandbox's admission stages (parse, load, contract, determinism, not trivial, feasibility;
no archive, so novelty passes) under the run's admission config and sandbox
(``EvalConfig.admission``) with the evaluation's turn bound (``eval.default_turns``); each admitted program is played ``eval.plays_per_program``
times from seeds fixed by ``eval.seed``, as a plain multi-turn episode of the agent's own
engine. Score 1 for a won episode; the summary also gives the mean episode reward, per
program (group) and overall. Rejected programs are listed in the summary's notes. Given
procedure memory's ``guidance`` (`runner.run_suite`), each play's first observation carries it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from spade_jax.admission import AdmissionConfig, admit_batch
from spade_jax.envs.contract import EPISODE_SEED_SPACE
from spade_jax.evals.registry import register
from spade_jax.evals.suite import Context, GenerationSettings, Item, Score, SuiteUnavailable, spread


@dataclasses.dataclass
class EnvironmentSuite:
    name: str
    paths: list[Path]
    settings: GenerationSettings
    plays_per_program: int
    max_turns: int
    admission: AdmissionConfig
    notes: list = dataclasses.field(default_factory=list)
    guided = True  # plays take procedure memory's guidance when the caller gives it (`runner.run_suite`)

    def items(self, limit, seed):
        paths = self.paths
        sources = [p.read_text(encoding="utf-8") for p in paths]
        admission = dataclasses.replace(self.admission, batch_novelty=False, max_turns=self.max_turns)
        reports = admit_batch(sources, admission, seed=seed)
        self.notes = [f"{p.name}: not admitted ({r.stage}: {r.reason})" for p, r in zip(paths, reports) if not r.admitted]
        items = []
        for index, (path, source, report) in enumerate(zip(paths, sources, reports)):
            if not report.admitted:
                continue
            seeds = np.random.default_rng([seed, index]).choice(EPISODE_SEED_SPACE, self.plays_per_program,
                                                                replace=False)
            items += [Item(f"{path.stem}/seed{int(s)}", group=path.stem, program=source, seed=int(s),
                           max_turns=self.max_turns) for s in seeds]
        return [items[i] for i in spread([item.group for item in items], limit, seed, "envs")]

    def score(self, item: Item, trajectory, context: Context) -> Score:
        return Score(1.0 if trajectory.won else 0.0, trajectory.won,
                     {"reward": trajectory.reward, "turns": trajectory.turns, "end": trajectory.end_reason})


@register("envs", GenerationSettings(temperature=0.0, max_new_tokens=256))
def make(argument: str, settings: GenerationSettings, eval_config) -> EnvironmentSuite:
    """Environment programs of a directory or a list of files, played plain (win rate, mean reward)."""
    if not argument:
        raise SuiteUnavailable("envs needs a directory or files: --suites=envs:PATH (PATH holds *.py environment "
                               "programs) or envs:FILE.py,FILE.py")
    given = [Path(part).expanduser() for part in argument.split(",") if part]
    if len(given) == 1 and given[0].is_dir():
        paths = sorted(given[0].glob("*.py"))
        if not paths:
            raise SuiteUnavailable(f"{given[0]} holds no *.py environment programs")
        name = f"envs-{given[0].name}"
    else:
        missing = [str(p) for p in given if not p.is_file()]
        if missing:
            raise SuiteUnavailable(f"{', '.join(missing)}: not a directory of environment programs nor a program file")
        paths = given
        name = "envs-" + "+".join(p.stem for p in paths) if len(paths) <= 3 else f"envs-{len(paths)}-programs"
    return EnvironmentSuite(name, paths, settings, eval_config.plays_per_program, eval_config.default_turns,
                            eval_config.admission or AdmissionConfig())
