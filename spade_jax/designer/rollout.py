"""Designer rollouts: one batched sampler call for every designer slot (`propose`), then
staged admission of every program at once (`admit_samples`).

Each slot gets a skill, a difficulty, a corpus document and exemplars drawn from the
environment memory's records of that skill (`prompts.slot_messages`; the reference's
`_augment_prompt_with_memory` filters by the slot's skill too, orchestrator.py:1213,1224). Every sampled program goes through the
sandbox's admission in one concurrent batch, whose novelty stage also rejects a program
that nearly duplicates an earlier one of the same batch. Failures keep their stage and
reason: they become the configured penalty reward for the designer.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from spade_jax.designer.corpus import Corpus
from spade_jax.designer.memory import EnvironmentMemory
from spade_jax.designer.prompts import DIFFICULTIES, PromptConfig, slot_messages
from spade_jax.envs.library import SKILLS
from spade_jax.sampling.chat import complete_chats
from spade_jax.sandbox.admission import AdmissionConfig, AdmissionReport, admit_batch


@dataclasses.dataclass(frozen=True)
class DesignerConfig:
    """How designer slots are drawn (skills, difficulties) and sampled, and what their prompts show."""

    num_slots: int = 8
    skills: tuple[str, ...] = SKILLS
    skills_per_regeneration: int = 6
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
    policy, memory: EnvironmentMemory | None, corpus: Corpus | None, cfg: DesignerConfig, *, seed: int
) -> list[DesignSample]:
    """Samples `cfg.num_slots` programs in one batched call; `report` is still None. Without
    ``memory`` the prompts show no exemplars, without ``corpus`` no document."""
    rng = np.random.default_rng(seed)
    slots = assign_slots(cfg, rng)
    documents = corpus.sample(len(slots)) if corpus is not None else [None] * len(slots)
    chats = [slot_messages(memory, rng, skill, difficulty, doc, cfg.prompt)
             for (skill, difficulty), doc in zip(slots, documents)]
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
        )
        for i, (((skill, difficulty), doc), completion) in enumerate(zip(zip(slots, documents), completions))
    ]


def admit_samples(
    samples: Sequence[DesignSample],
    pool,
    memory: EnvironmentMemory | None,
    admission: AdmissionConfig,
    seed: int | None = None,
) -> list[DesignSample]:
    """Runs staged admission on every sample at once (novelty against memory, if any, and the batch).

    ``seed`` draws the admission's probe seeds and actions (None: OS entropy).
    """
    archive = [record.code for record in memory.records()] if memory is not None else []
    reports = admit_batch([s.text for s in samples], config=admission, archive=archive, pool=pool, seed=seed)
    return [dataclasses.replace(s, report=r) for s, r in zip(samples, reports)]
