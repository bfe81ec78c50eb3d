"""Synthesis with a policy: the query writer and verifying agent a policy plays, the programs
a run's memory offers, and the files a synthesis writes. Shared by the command line
(`python -m spade_jax.related.trajectories`) and the self-play job
(`selfplay/components/synthesis.py`)."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable, Sequence

from spade_jax.agent import AgentConfig, play_episodes
from spade_jax.related.trajectories.export import Example, rl_task, sft_record, write_jsonl
from spade_jax.related.trajectories.queries import escape_chats
from spade_jax.related.trajectories.schemas import NotToolUse, ProgramRejected
from spade_jax.related.trajectories.synth import EnvReport, SynthConfig, read_program, summary_table
from spade_jax.sampling.chat import complete_chats


def policy_players(policy, pool, agent_cfg: AgentConfig, cfg: SynthConfig) -> tuple[Callable, Callable]:
    """`(complete, play)` for `synthesize`: the policy writes queries at `cfg.query`'s settings (its
    prompt escaped for the policy's tokenizer) and plays the verifying agent greedily, with room
    for the longest chain plus an answer."""
    agent = dataclasses.replace(agent_cfg, temperature=0.0, max_turns=max(agent_cfg.max_turns, cfg.chain.max_calls + 2))

    def complete(chats):
        return [c.text for c in complete_chats(policy, escape_chats(policy.tokenizer, chats),
                                               max_new_tokens=cfg.query.max_new_tokens,
                                               temperature=cfg.query.temperature, seed=cfg.seed)]

    def play(requests):
        return play_episodes(policy, pool, requests, agent, seed=cfg.seed)

    return complete, play


def newest_tool_programs(records: Sequence, max_envs: int) -> tuple[list[tuple[str, str]], list[EnvReport]]:
    """`(env_id, code)` of the newest `max_envs` tool-use programs among memory `records`, and a
    report with the reason of each newer tool-use program that synthesis cannot use."""
    programs, rejected = [], []
    for record in sorted(records, key=lambda r: r.iteration_added, reverse=True):
        try:
            read_program(record.code)
        except NotToolUse:
            continue
        except ProgramRejected as err:
            rejected.append(EnvReport(record.env_id, error=str(err)))
            continue
        programs.append((record.env_id, record.code))
        if len(programs) == max_envs:
            break
    return programs, rejected


def write_outputs(out_dir: str, examples: Sequence[Example], reports: Sequence[EnvReport]) -> None:
    """`sft.jsonl` (chat records), `rl.jsonl` (tasks) and `summary.md` (a row per environment,
    rejected ones with their reason) in `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    write_jsonl(os.path.join(out_dir, "sft.jsonl"), (sft_record(e) for e in examples))
    write_jsonl(os.path.join(out_dir, "rl.jsonl"), (rl_task(e) for e in examples))
    with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write(summary_table(reports) + "\n")


def metrics(num_programs: int, examples: Sequence[Example], reports: Sequence[EnvReport]) -> dict[str, float]:
    """A synthesis's `trajectories/*` metrics; `reports` include the programs rejected before it."""
    chains = sum(r.chains for r in reports)
    return {"trajectories/envs": num_programs, "trajectories/chains": chains, "trajectories/kept": len(examples),
            "trajectories/acceptance": len(examples) / chains if chains else math.nan,
            "trajectories/by_agent": sum(r.by_agent for r in reports),
            "trajectories/rejected": sum(r.error is not None for r in reports)}
