"""Designer rollouts: one batched sampler call for every designer slot (`propose`), then
staged admission of every program at once (`admit_samples`).

Each slot gets a skill, a difficulty, a corpus document and exemplars drawn from the
environment memory. Every sampled program goes through the sandbox's admission in one
concurrent batch; a program that passes but nearly duplicates an earlier program of the
same batch is rejected at the novelty stage too. Failures keep their stage and reason:
they become the configured penalty reward for the designer.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from spade_jax.designer.corpus import Corpus
from spade_jax.designer.memory import EnvironmentMemory
from spade_jax.designer.prompts import designer_messages
from spade_jax.sampling import generate
from spade_jax.sandbox.admission import AdmissionConfig, AdmissionReport, admit_batch
from spade_jax.sandbox.similarity import fingerprint, jaccard


@dataclasses.dataclass(frozen=True)
class DesignerConfig:
    num_slots: int = 8
    skills: tuple[str, ...] = ()
    skills_per_regeneration: int = 6
    difficulties: tuple[str, ...] = ("easy", "medium", "hard")
    max_new_tokens: int = 2048
    temperature: float = 1.0
    top_p: float = 1.0
    n_positive: int = 2
    n_negative: int = 1


@dataclasses.dataclass
class DesignSample:
    """One designer slot: its prompt, what the policy wrote, and the admission verdict."""

    slot: int
    skill: str
    difficulty: str
    doc_id: str
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


def slot_messages(
    memory: EnvironmentMemory, rng: np.random.Generator, skill: str, difficulty: str, doc, cfg: DesignerConfig
) -> list[dict]:
    """The chat messages of one designer slot (self-play and bootstrap data share this)."""
    exemplars = memory.exemplars(rng, n_positive=cfg.n_positive, n_negative=cfg.n_negative)
    return designer_messages(skill, difficulty, doc.as_reference(), exemplars)


def propose(
    policy, memory: EnvironmentMemory, corpus: Corpus, cfg: DesignerConfig, *, seed: int
) -> list[DesignSample]:
    """Samples `cfg.num_slots` programs in one batched call; `report` is still None."""
    rng = np.random.default_rng(seed)
    tokenizer = policy.tokenizer
    slots = assign_slots(cfg, rng)
    documents = corpus.sample(len(slots))
    prompts = [
        tokenizer.apply_chat_template(slot_messages(memory, rng, skill, difficulty, doc, cfg), add_generation_prompt=True)
        for (skill, difficulty), doc in zip(slots, documents)
    ]
    generation = generate(
        policy,
        prompts,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        seed=seed,
    )
    samples = []
    for i, ((skill, difficulty), doc) in enumerate(zip(slots, documents)):
        n = int(generation.lengths[i])
        samples.append(
            DesignSample(
                slot=i,
                skill=skill,
                difficulty=difficulty,
                doc_id=doc.doc_id,
                doc_excerpt=" ".join(doc.text.split()[:60]),
                prompt_tokens=np.asarray(prompts[i], np.int32),
                tokens=generation.tokens[i, :n],
                logprobs=generation.logprobs[i, :n],
                text=tokenizer.decode(generation.tokens[i, :n]),
            )
        )
    return samples


def admit_samples(
    samples: Sequence[DesignSample],
    pool,
    memory: EnvironmentMemory,
    admission: AdmissionConfig,
    seed: int | None = None,
) -> list[DesignSample]:
    """Runs staged admission on every sample at once (novelty against memory and the batch).

    ``seed`` draws the admission's probe seeds and actions (None: OS entropy).
    """
    archive = [record.code for record in memory.records()]
    reports = reject_batch_duplicates(
        admit_batch([s.text for s in samples], config=admission, archive=archive, pool=pool, seed=seed), admission
    )
    return [dataclasses.replace(s, report=r) for s, r in zip(samples, reports)]


def reject_batch_duplicates(reports: Sequence[AdmissionReport], admission: AdmissionConfig) -> list[AdmissionReport]:
    """Rejects an admitted program that nearly duplicates an earlier admitted one of the same batch."""
    kept: list[tuple[int, frozenset]] = []
    out = []
    for i, report in enumerate(reports):
        if report.admitted:
            mine = fingerprint(report.code)
            twin = next((j for j, other in kept if jaccard(mine, other) >= admission.novelty_threshold), None)
            if twin is not None:
                report = dataclasses.replace(
                    report,
                    admitted=False,
                    stage="novelty",
                    reason=f"near-duplicate of program {twin} of the same batch",
                )
            else:
                kept.append((i, mine))
        out.append(report)
    return out
