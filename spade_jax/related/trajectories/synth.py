"""The synthesis pipeline over a set of tool-use programs: graph, chains, queries, verification.

Per environment: the tool graph (`graph.probe_graph`), ``chains_per_env`` walks
(`chains.sample_chains`), one query per chain (`queries.write_queries`), the spell-out and grounding checks,
then verification of the rest (`queries.verify_queries`). `EnvReport` counts each stage.

Synthesis is total: whatever a program does, its failure is that program's `EnvReport.error`
(a `schemas.ProgramRejected` reason, or ``internal error: <type>: <message>`` for any other
exception raised while it was processed) and the next program runs. Kept examples whose SFT
record exceeds ``limits.MAX_RECORD_CHARS`` are dropped and counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from spade_jax.envs import library
from spade_jax.progress import progress_bar
from spade_jax.related.trajectories.chains import ChainConfig, sample_chains
from spade_jax.related.trajectories.export import Example, record_chars
from spade_jax.related.trajectories.graph import ToolGraph, ToolProbe, probe_graph
from spade_jax.related.trajectories.limits import MAX_RECORD_CHARS, MAX_RESULT_CHARS, MAX_SOURCE_CHARS
from spade_jax.related.trajectories.queries import QueryConfig, verify_queries, spelled_out, ungrounded, write_queries
from spade_jax.related.trajectories.schemas import ProgramRejected, read_tool_schemas
from spade_jax.text import display_line

_REASON_CHARS = 300  # the longest reason the summary table shows


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
    oversized: int = 0  # kept examples dropped: their record exceeded MAX_RECORD_CHARS
    error: str | None = None

    @property
    def acceptance(self) -> float:
        """Kept examples per sampled chain."""
        return self.kept / self.chains if self.chains else 0.0


class NoToolPrograms(ValueError):
    """The directory (or list) holds no tool-use program."""


def read_program(source: str) -> list[dict]:
    """The program's tool schemas (`schemas.read_tool_schemas`). Any failure is a `ProgramRejected`
    with its reason (`NotToolUse` when it declares no tools), never another exception."""
    try:
        return read_tool_schemas(source)
    except ProgramRejected:
        raise
    except Exception as err:  # a reader bug must cost one program, not the run
        raise ProgramRejected(internal_error(err)) from None


def internal_error(err: BaseException) -> str:
    return f"internal error: {type(err).__name__}: {display_line(str(err), _REASON_CHARS)}"


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
            files = sorted(p for p in path.glob("*.py") if p.name != "__init__.py" and p.is_file())
        else:
            files = [Path(p) for p in where.split(",") if p]
            missing = [str(p) for p in files if not p.is_file()]
            if missing:
                raise NoToolPrograms(f"--envs: not a directory nor files: {', '.join(missing)}")
        found = [(p.stem, _read_file(p)) for p in files]
    programs, skipped = [], []
    for name, source in found:
        if source is None:
            skipped.append((name, f"the file has more than {MAX_SOURCE_CHARS} characters"))
            continue
        try:
            read_program(source)
            programs.append((name, source))
        except ProgramRejected as err:
            skipped.append((name, str(err)))
    if not programs:
        detail = "; ".join(f"{n}: {r}" for n, r in skipped[:5]) or "no .py files"
        raise NoToolPrograms(f"{where} holds no tool-use program (a class with a literal tools list): {detail}")
    return programs, skipped


def _read_file(path: Path) -> str | None:
    """The file's text, or None when it is too large to be a program (not read whole)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read(MAX_SOURCE_CHARS + 1)
    return text if len(text) <= MAX_SOURCE_CHARS else None


def synthesize(pool, programs: Sequence[tuple[str, str]], complete: Callable[[list[list[dict]]], list[str]],
               play: Callable[[list], list], cfg: SynthConfig = SynthConfig(), *,
               progress: bool = True) -> tuple[list[Example], list[EnvReport]]:
    """Kept examples of every program, and one report per program (module docstring).

    ``complete(chats) -> texts`` writes queries; ``play(requests) -> trajectories`` plays the
    verifying agent. A program that fails, at any stage, is reported with the reason (module docstring).
    """
    examples, reports = [], []
    with progress_bar(len(programs), "trajectories", unit="envs", enabled=progress) as bar:
        for key, (name, source) in enumerate(programs):
            report = EnvReport(name)
            reports.append(report)
            try:
                kept = _one_env(pool, key, name, source, complete, play, cfg, report)
            except ProgramRejected as err:
                report.error, kept = str(err), []
            except Exception as err:  # noqa: BLE001  (module docstring: one program never stops synthesis)
                report.error, kept = internal_error(err), []
            report.kept = len(kept)
            examples += kept
            bar.set_postfix(env=name, kept=f"{report.kept}/{report.chains}")
            bar.update()
    return examples, reports


def _one_env(pool, key, name, source, complete, play, cfg: SynthConfig, report: EnvReport) -> list[Example]:
    schemas = read_program(source)
    graph_probe, probe = ToolProbe(pool, source, schemas), ToolProbe(pool, source, schemas)
    report.graph = probe_graph(pool, source, seeds=range(cfg.probe_seeds), max_tries=cfg.chain.max_tries,
                               seed=cfg.seed, probe=graph_probe)
    if not report.graph.entry:
        report.error = "no entry tool: no tool gave a result from the observation's values"
        if graph_probe.oversized:
            report.error += f" ({graph_probe.oversized} replies over {MAX_RESULT_CHARS} characters are no results)"
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
    verdicts = verify_queries([c for c, _ in passed], [q for _, q in passed], schemas, source, probe, play, env_key=key)
    kept = [Example(name, source, schemas, c, q, v) for (c, q), v in zip(passed, verdicts) if v is not None]
    bounded = [e for e in kept if record_chars(e) <= MAX_RECORD_CHARS]
    report.oversized = len(kept) - len(bounded)
    kept = bounded
    report.by_agent = sum(e.verified_by == "agent" for e in kept)
    report.by_reference = sum(e.verified_by == "reference" for e in kept)
    return kept


def summary_table(reports: Sequence[EnvReport]) -> str:
    """A markdown table: per environment the graph, chains, queries, kept, acceptance, verified by."""
    lines = ["| env | tools / edges / entry | chains | queries | spelled out | ungrounded | kept | acceptance | "
             "by agent | by reference |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in reports:
        graph = f"{len(r.graph.nodes)} / {len(r.graph.edges)} / {len(r.graph.entry)}" if r.graph else "-"
        notes = [r.error] if r.error else []
        if r.oversized:
            notes.append(f"{r.oversized} records over {MAX_RECORD_CHARS} characters dropped")
        note = f" ({_cell('; '.join(notes))})" if notes else ""
        lines.append(f"| {_cell(r.env)}{note} | {graph} | {r.chains} | {r.queries} | {r.spelled_out} | {r.ungrounded} | {r.kept} | "
                     f"{r.acceptance:.0%} | {r.by_agent} | {r.by_reference} |")
    total = EnvReport("all", chains=sum(r.chains for r in reports), queries=sum(r.queries for r in reports),
                      spelled_out=sum(r.spelled_out for r in reports), ungrounded=sum(r.ungrounded for r in reports),
                      kept=sum(r.kept for r in reports),
                      by_agent=sum(r.by_agent for r in reports), by_reference=sum(r.by_reference for r in reports))
    lines.append(f"| all | | {total.chains} | {total.queries} | {total.spelled_out} | {total.ungrounded} | {total.kept} | "
                 f"{total.acceptance:.0%} | {total.by_agent} | {total.by_reference} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """``text`` as one markdown table cell: one escaped line, bounded, no column separator, and
    ``<`` / ``>`` as HTML entities (a rejection reason may quote a program: no special token of a
    tokenizer appears literally in an exported file)."""
    return display_line(text, _REASON_CHARS).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
