"""Designer rollouts: one batched sampler call for every designer slot still open (`propose`),
then staged admission of every program at once (`admit_samples`); the loop repeats both for
the slots whose program failed, up to `DesignerConfig.max_attempts` attempts.

Slots are spread round-robin over the skills of a regeneration (`assign_slots`), so a skill's
group holds several designs, as the reference's 24 games over 3 skills hold 8 each. Each
attempt gets a fresh corpus document and fresh exemplars drawn from the environment memory's
records of its skill (`prompts.slot_messages`; the reference's `_augment_prompt_with_memory`
filters by the slot's skill too, orchestrator.py:1213,1224, and its corpus orchestrator
samples a document per attempt, corpus_orchestrator.py:87-89). Every sampled program goes
through the sandbox's admission in one concurrent batch, whose novelty stage also rejects a
program that nearly duplicates an earlier one of the same batch or an admitted attempt of an
earlier one. Failures keep their stage and reason: under the reference's rule they are never
trained (its rejected files), under `designer.reward.rejected=penalty` they earn the penalty.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from spade_jax.admission import AdmissionConfig, AdmissionReport, admit_batch
from spade_jax.designer.corpus import Corpus
from spade_jax.designer.memory import EnvironmentMemory
from spade_jax.designer.prompts import DIFFICULTIES, PromptConfig, slot_messages
from spade_jax.envs.library import SKILLS
from spade_jax.sampling.chat import complete_chats


@dataclasses.dataclass(frozen=True)
class DesignerConfig:
    """How designer slots are drawn (skills, difficulties) and sampled, and what their prompts show.

    `skills_per_regeneration` skills share the `num_slots` slots round-robin; a skill with one
    slot has a group of one, whose centred advantage is always 0 (the reference's recipe:
    24 slots over 3 skills). `max_attempts`: how often a slot whose program failed is sampled
    again from a fresh prompt (the reference's Slime rollout passes 5, spade_rollout.py:487).
    """

    num_slots: int = 8
    skills: tuple[str, ...] = SKILLS
    skills_per_regeneration: int = 2
    max_attempts: int = 5
    difficulties: tuple[str, ...] = DIFFICULTIES
    max_new_tokens: int = 2048
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    prompt: PromptConfig = PromptConfig()


@dataclasses.dataclass
class DesignSample:
    """One designer slot: its prompt, what the policy wrote, and the admission verdict."""

    slot: int
    skill: str
    difficulty: str
    doc_id: str | None
    doc_excerpt: str
    prompt_tokens: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    text: str
    report: AdmissionReport | None = None
    attempt: int = 0  # 0 for a slot's first program, k for its k-th retry

    @property
    def admitted(self) -> bool:
        return self.report is not None and self.report.admitted


def assign_slots(cfg: DesignerConfig, rng: np.random.Generator) -> list[tuple[str, str]]:
    """(skill, difficulty) per slot: `skills_per_regeneration` skills drawn, slots spread over them."""
    if not cfg.skills:
        raise ValueError("designer.skills is empty: list at least one skill")
    k = min(cfg.skills_per_regeneration, len(cfg.skills))
    chosen = [cfg.skills[i] for i in rng.choice(len(cfg.skills), size=k, replace=False)]
    return [(chosen[i % k], cfg.difficulties[rng.integers(len(cfg.difficulties))]) for i in range(cfg.num_slots)]


def propose(
    policy, memory: EnvironmentMemory | None, corpus: Corpus | None, cfg: DesignerConfig, *, seed: int,
    slots: dict[int, tuple[str, str]] | None = None, attempt: int = 0,
) -> list[DesignSample]:
    """Samples one program per slot in one batched call; `report` is still None. ``slots``:
    ``{slot: (skill, difficulty)}`` of the slots to sample (default: every slot, as
    `assign_slots` draws them from ``seed``); ``attempt`` is recorded in each sample. Without
    ``memory`` the prompts show no exemplars, without ``corpus`` no document."""
    rng = np.random.default_rng(seed)
    if slots is None:
        slots = dict(enumerate(assign_slots(cfg, rng)))
    documents = corpus.sample(len(slots)) if corpus is not None else [None] * len(slots)
    chats = [slot_messages(memory, rng, skill, difficulty, doc, cfg.prompt)
             for (skill, difficulty), doc in zip(slots.values(), documents)]
    completions = complete_chats(policy, chats, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                 top_p=cfg.top_p, top_k=cfg.top_k, seed=seed)
    return [
        DesignSample(
            slot=i,
            skill=skill,
            difficulty=difficulty,
            doc_id=doc.doc_id if doc is not None else None,
            doc_excerpt=" ".join(doc.text.split()[:60]) if doc is not None else "",
            prompt_tokens=np.asarray(completion.prompt_tokens, np.int32),
            tokens=completion.tokens,
            logprobs=completion.logprobs,
            text=completion.text,
            attempt=attempt,
        )
        for (i, (skill, difficulty)), doc, completion in zip(slots.items(), documents, completions)
    ]


def admit_samples(
    samples: Sequence[DesignSample],
    pool,
    memory: EnvironmentMemory | None,
    admission: AdmissionConfig,
    seed: int | None = None,
    earlier: Sequence[str] = (),
) -> list[DesignSample]:
    """Runs staged admission on every sample at once (novelty against memory, if any, the
    ``earlier`` programs admitted in this regeneration and the batch).

    ``seed`` draws the admission's probe seeds and actions (None: OS entropy).
    """
    archive = [record.code for record in memory.records()] if memory is not None else []
    reports = admit_batch([s.text for s in samples], config=admission, archive=archive + list(earlier), pool=pool,
                          seed=seed)
    return [dataclasses.replace(s, report=r) for s, r in zip(samples, reports)]


def design_with_retries(slots: dict[int, tuple[str, str]], max_attempts: int, attempt) -> list[DesignSample]:
    """Every attempt of every slot: ``attempt(open_slots, k, earlier)`` designs and judges the
    open slots' k-th programs (``earlier``: the programs admitted so far, for novelty); a slot
    stays open until one of its programs is admitted or it has had ``max_attempts``."""
    designs: list[DesignSample] = []
    for k in range(max_attempts):
        batch = attempt(slots, k, [d.report.code for d in designs if d.admitted])
        designs += batch
        slots = {d.slot: slots[d.slot] for d in batch if not d.admitted}
        if not slots:
            break
    return designs


def design_metrics(designs: Sequence[DesignSample], num_slots: int, stages: Sequence[str]) -> dict[str, float]:
    """A regeneration's design counts from every attempt of its ``num_slots`` slots.

    ``designer/admission_rate`` counts per slot (a slot is admitted when one of its attempts
    is), ``designer/attempt_admission_rate`` per attempt; ``designer/attempts`` and
    ``designer/attempt_tokens`` are what the retries cost; ``designer/rejected/<stage>``
    counts rejected attempts by the stage that rejected them."""
    admitted = sum(d.admitted for d in designs)
    metrics = {
        "designer/proposed": num_slots,
        "designer/admitted": admitted,
        "designer/admission_rate": admitted / max(num_slots, 1),
        "designer/attempts": len(designs),
        "designer/attempt_admission_rate": admitted / max(len(designs), 1),
        "designer/attempt_tokens": sum(len(d.tokens) for d in designs),
    }
    for stage in stages:
        metrics[f"designer/rejected/{stage}"] = sum(not d.admitted and d.report.stage == stage for d in designs)
    return metrics
