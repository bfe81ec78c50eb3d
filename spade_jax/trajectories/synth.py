"""The synthesis pipeline over a set of tool-use programs: graph, chains, queries, calibration.

Per environment: the tool graph (`graph.probe_graph`), ``chains_per_env`` walks
(`chains.sample_chains`), one query per chain (`queries.write_queries`), the spell-out and grounding checks,
then calibration of the rest (`queries.calibrate`). `EnvReport` counts each stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from spade_jax.envs import library
from spade_jax.progress import progress_bar
from spade_jax.trajectories.chains import ChainConfig, sample_chains
from spade_jax.trajectories.export import Example
from spade_jax.trajectories.graph import NotToolUse, ToolGraph, ToolProbe, probe_graph, read_tool_schemas
from spade_jax.trajectories.queries import QueryConfig, calibrate, spelled_out, ungrounded, write_queries


@dataclasses.dataclass(frozen=True)
class SynthConfig:
    """How much to synthesize per environment and how (chain walks, query writing)."""

    chains_per_env: int = 8
    probe_seeds: int = 3
    seed: int = 0
    chain: ChainConfig = ChainConfig()
    query: QueryConfig = QueryConfig()

    def __post_init__(self):
        if self.chains_per_env < 1 or self.probe_seeds < 1:
            raise ValueError("SynthConfig.chains_per_env and probe_seeds must be >= 1")


@dataclasses.dataclass
class EnvReport:
    """What became of one environment's chains, stage by stage."""

    env: str
    graph: ToolGraph | None = None
    chains: int = 0
    dropped_chains: int = 0
    queries: int = 0
    spelled_out: int = 0
    ungrounded: int = 0
    kept: int = 0
    by_agent: int = 0
    by_reference: int = 0
    error: str | None = None

    @property
    def acceptance(self) -> float:
        """Kept examples per sampled chain."""
        return self.kept / self.chains if self.chains else 0.0


class NoToolPrograms(ValueError):
    """The directory (or list) holds no tool-use program."""


def load_programs(where: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(name, source) of the tool-use programs in ``where`` and (name, reason) of files skipped.

    ``where`` is a directory (its ``*.py``), a comma-separated list of files, or ``library``
    (the seed library's tool-use programs). NoToolPrograms when none is a tool-use program.
    """
    if where == "library":
        found = [(env.name, library.load_source(env.name)) for env in library.SEED_ENVS if env.kind == "tool_use"]
    else:
        path = Path(where)
        if path.is_dir():
            files = sorted(p for p in path.glob("*.py") if p.name != "__init__.py")
        else:
            files = [Path(p) for p in where.split(",") if p]
            missing = [str(p) for p in files if not p.is_file()]
            if missing:
                raise NoToolPrograms(f"--envs: not a directory nor files: {', '.join(missing)}")
        found = [(p.stem, p.read_text(encoding="utf-8", errors="replace")) for p in files]
    programs, skipped = [], []
    for name, source in found:
        try:
            read_tool_schemas(source)
            programs.append((name, source))
        except NotToolUse as err:
            skipped.append((name, str(err)))
    if not programs:
        detail = "; ".join(f"{n}: {r}" for n, r in skipped[:5]) or "no .py files"
        raise NoToolPrograms(f"{where} holds no tool-use program (a class with a literal tools list): {detail}")
    return programs, skipped


def synthesize(pool, programs: Sequence[tuple[str, str]], complete: Callable[[list[list[dict]]], list[str]],
               play: Callable[[list], list], cfg: SynthConfig = SynthConfig(), *,
               progress: bool = True) -> tuple[list[Example], list[EnvReport]]:
    """Kept examples of every program, and one report per program (module docstring).

    ``complete(chats) -> texts`` writes queries; ``play(requests) -> trajectories`` plays the
    calibrating agent. A program whose sandbox start fails is reported with its error.
    """
    examples, reports = [], []
    with progress_bar(len(programs), "trajectories", unit="envs", enabled=progress) as bar:
        for key, (name, source) in enumerate(programs):
            report = EnvReport(name)
            reports.append(report)
            kept = _one_env(pool, key, name, source, complete, play, cfg, report)
            examples += kept
            bar.set_postfix(env=name, kept=f"{report.kept}/{report.chains}")
            bar.update()
    return examples, reports


def _one_env(pool, key, name, source, complete, play, cfg: SynthConfig, report: EnvReport) -> list[Example]:
    schemas = read_tool_schemas(source)
    probe = ToolProbe(pool, source, schemas)
    report.graph = probe_graph(pool, source, seeds=range(cfg.probe_seeds), max_tries=cfg.chain.max_tries,
                               seed=cfg.seed)
    if not report.graph.entry:
        report.error = "no entry tool: no tool gave a result from the observation's values"
        return []
    chains, report.dropped_chains = sample_chains(probe, report.graph, cfg.chains_per_env, cfg.chain, seed=cfg.seed)
    report.chains = len(chains)
    queries = write_queries(chains, complete, cfg.query)
    report.queries = sum(bool(q) for q in queries)
    names = list(probe.tools)
    clean = [(c, q) for c, q in zip(chains, queries) if q and spelled_out(q, c, names) is None]
    report.spelled_out = report.queries - len(clean)
    passed = [(c, q) for c, q in clean if ungrounded(q, c) is None]
    report.ungrounded = len(clean) - len(passed)
    verdicts = calibrate([c for c, _ in passed], [q for _, q in passed], schemas, source, probe, play, env_key=key)
    kept = [Example(name, source, schemas, c, q, v) for (c, q), v in zip(passed, verdicts) if v is not None]
    report.kept = len(kept)
    report.by_agent = sum(e.verified_by == "agent" for e in kept)
    report.by_reference = sum(e.verified_by == "reference" for e in kept)
    return kept


def summary_table(reports: Sequence[EnvReport]) -> str:
    """A markdown table: per environment the graph, chains, queries, kept, acceptance, verified by."""
    lines = ["| env | tools / edges / entry | chains | queries | spelled out | ungrounded | kept | acceptance | "
             "by agent | by reference |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in reports:
        graph = f"{len(r.graph.nodes)} / {len(r.graph.edges)} / {len(r.graph.entry)}" if r.graph else "-"
        note = f" ({r.error})" if r.error else ""
        lines.append(f"| {r.env}{note} | {graph} | {r.chains} | {r.queries} | {r.spelled_out} | {r.ungrounded} | {r.kept} | "
                     f"{r.acceptance:.0%} | {r.by_agent} | {r.by_reference} |")
    total = EnvReport("all", chains=sum(r.chains for r in reports), queries=sum(r.queries for r in reports),
                      spelled_out=sum(r.spelled_out for r in reports), ungrounded=sum(r.ungrounded for r in reports),
                      kept=sum(r.kept for r in reports),
                      by_agent=sum(r.by_agent for r in reports), by_reference=sum(r.by_reference for r in reports))
    lines.append(f"| all | | {total.chains} | {total.queries} | {total.spelled_out} | {total.ungrounded} | {total.kept} | "
                 f"{total.acceptance:.0%} | {total.by_agent} | {total.by_reference} |")
    return "\n".join(lines)
