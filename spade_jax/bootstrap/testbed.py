"""The testbed's bootstrap: a small policy trained from scratch on the testbed families.

The `testbed` preset (configs/testbed.py) starts from a policy that has seen the
testbed families (`spade_jax.envs.library.testbed`) over the whole trained range of
their knob, most transcripts at the easy end, so that its win rate falls across the range
and agent RL has a frontier to move. `BootstrapConfig` is the seed bootstrap's config
(`build.BootstrapConfig`) with three fields more:

- ``families``: "seed" (the seed library; built by `build`, exactly as before) or
  "testbed" (``envs`` names testbed families; built here);
- ``transcripts``: solution transcripts per family besides the renderings' plays, each at a
  knob value drawn from the trained values by `knob_weights`;
- ``knob_decay``: the weight of the hardest trained value relative to the easiest
  (geometric in between; 1 is uniform).

At their defaults the three fields are left out of ``to_dict``, so a seed bootstrap keeps
the cache key it had before this module existed (`build.cache_key` hashes ``to_dict``,
the seed library's top-level sources and `build`/`data`/`variants`, none of which this
module changes). A testbed key also hashes the testbed programs and this module.

A testbed build does what `build` does with the testbed in place of the seed library:
designer prompts (`designer.prompts.slot_messages`, a memory seeded with the testbed
families) cycling over the skills its families cover, answered with admitted structural
variants (`variants.vary`) of a family of the prompt's skill at a knob value from the
prompt difficulty's third of the trained values; their solution plays (plain and hinted,
`agent_seeds` each); then ``transcripts`` plain solution plays per family of the canonical
program at knob values drawn by `knob_weights`; the model and its training are `build`'s
(`build._compile`, `build._train`: one designer example per row, agent transcripts in the
rest). The tokenizer is trained on the designer examples only (`build` adds the transcripts):
played instances' random contents would become merged pieces. Agent transcripts open with the
observation, no system turn (the reference's actor prompt; the preset sets `agent.system_prompt`
""): a single-answer transcript is half as long without the seed bootstrap's system prompt.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import logging
from jax.sharding import Mesh

from spade_jax.bootstrap import build, data, variants
from spade_jax.designer.corpus import Corpus, CorpusConfig
from spade_jax.designer.memory import EnvironmentMemory
from spade_jax.designer.prompts import DIFFICULTIES, designer_answer, slot_messages
from spade_jax.envs import library
from spade_jax.envs.library import testbed
from spade_jax.models import Policy, SentencePieceTokenizer
from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.admission import AdmissionConfig, admit_batch
from spade_jax.admission.similarity import fingerprint, jaccard

FAMILIES = ("seed", "testbed")
_TESTBED_FIELDS = {"families": "seed", "transcripts": 0, "knob_decay": 1.0}
_TRANSCRIPT_SEED0 = 1_000_000  # transcript seeds start here, apart from the renderings' plays (0, 1, ...)


@dataclasses.dataclass(frozen=True)
class BootstrapConfig(build.BootstrapConfig):
    """`build.BootstrapConfig` plus the testbed's fields (module docstring); with ``families``
    "testbed", ``envs`` names testbed families (any non-empty subset) instead of seed programs."""

    families: str = "seed"
    transcripts: int = 0
    knob_decay: float = 1.0

    def __post_init__(self):
        if self.families not in FAMILIES:
            raise ValueError(f"BootstrapConfig.families must be one of {FAMILIES}, got {self.families!r}")
        if self.transcripts < 0:
            raise ValueError(f"BootstrapConfig.transcripts must be >= 0, got {self.transcripts}")
        if not 0.0 < self.knob_decay <= 1.0:
            raise ValueError(f"BootstrapConfig.knob_decay must be in (0, 1], got {self.knob_decay}")
        if self.families == "seed":
            if self.transcripts or self.knob_decay != 1.0:
                raise ValueError("BootstrapConfig.transcripts and knob_decay need families='testbed'")
            super().__post_init__()
            return
        if not self.envs:
            raise ValueError("BootstrapConfig.envs must name at least one testbed family")
        for name in self.envs:
            testbed.get(name)
        # Every other field is checked as the seed bootstrap checks it, on its own envs.
        build.BootstrapConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(build.BootstrapConfig)
                                 if f.name != "envs"})

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        for name, default in _TESTBED_FIELDS.items():
            if out[name] == default:
                del out[name]
        return out

    @property
    def skills(self) -> tuple[str, ...]:
        """The skills the bootstrap's designer prompts cycle over (a testbed's: those its families cover)."""
        if self.families == "seed":
            return library.SKILLS
        return tuple(dict.fromkeys(testbed.get(name).skill for name in self.envs))


def knob_weights(n: int, decay: float) -> np.ndarray:
    """Probabilities of the ``n`` trained knob values, easiest first: geometric from 1 to ``decay``."""
    if n == 1:
        return np.ones(1)
    weights = decay ** (np.arange(n) / (n - 1))
    return weights / weights.sum()


def sample_knobs(name: str, count: int, decay: float, rng: np.random.Generator) -> list[int]:
    """``count`` knob values of testbed family ``name`` drawn by `knob_weights` over its trained values."""
    values = testbed.get(name).trained
    return [values[i] for i in rng.choice(len(values), size=count, p=knob_weights(len(values), decay))]


def cache_key(cfg: build.BootstrapConfig) -> str:
    """`build.cache_key`; for a testbed config, with the testbed programs and this module hashed too."""
    key = build.cache_key(cfg)
    if getattr(cfg, "families", "seed") == "seed":
        return key
    h = hashlib.sha256(key.encode())
    for path in [*sorted(Path(testbed.__file__).parent.glob("*.py")), Path(__file__)]:
        h.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:20]


def cache_path(cache_dir: str | os.PathLike, cfg: build.BootstrapConfig) -> Path:
    """Where the bootstrap for ``cfg`` lives (or will live) under ``cache_dir``."""
    return Path(cache_dir).expanduser() / f"bootstrap-{cache_key(cfg)}"


def bootstrap_policy(cache_dir: str | os.PathLike, cfg: build.BootstrapConfig = BootstrapConfig(),
                     mesh: Mesh | None = None, progress: bool = True) -> Policy:
    """The bootstrapped policy for ``cfg``: loaded from ``cache_dir``, or trained there first
    (a seed config by `build`, a testbed config here)."""
    path = cache_path(cache_dir, cfg)
    if not (path / build._DONE).exists():
        (build._build if getattr(cfg, "families", "seed") == "seed" else _build)(path, cfg, progress)
    return build.load_bootstrap(path, mesh)


# --------------------------------------------------------------------------- data


def seeded_memory(envs, capacity: int = 200) -> EnvironmentMemory:
    """The testbed preset's memory at iteration 0: the families ``envs``, unmeasured."""
    memory = EnvironmentMemory(capacity)
    for name in envs:
        memory.add_seed(testbed.load_source(name), testbed.get(name).skill, name=name)
    return memory


def designer_slots(n: int, memory: EnvironmentMemory, documents, cfg: BootstrapConfig,
                   rng: np.random.Generator) -> list[data.Slot]:
    """``n`` iteration-0 designer prompts cycling through (skill, difficulty) over ``cfg.skills``,
    each to be answered with a variant of a family of its skill drawn uniformly."""
    skills = cfg.skills
    slots = []
    for i in range(n):
        skill = skills[i % len(skills)]
        difficulty = DIFFICULTIES[(i + i // len(skills)) % len(DIFFICULTIES)]
        document = documents[int(rng.integers(len(documents)))]
        messages = slot_messages(memory, rng, skill, difficulty, document, cfg.prompt)
        choices = [name for name in cfg.envs if testbed.get(name).skill == skill]
        slots.append(data.Slot(skill, difficulty, messages, choices[int(rng.integers(len(choices)))]))
    return slots


def render_programs(keys, n: int, rng: random.Random, rewrite_p: float, max_similarity: float,
                    attempts: int = 50) -> list[data.Program]:
    """``n`` structural variants cycling through the (family, difficulty) ``keys``, the knob from the
    difficulty's third of the trained values; redrawn while as similar as ``max_similarity`` to a family."""
    archive = [fingerprint(testbed.load_source(env.name)) for env in testbed.TESTBED_ENVS]
    programs = []
    for i in range(n):
        name, difficulty = keys[i % len(keys)]
        env = testbed.get(name)
        trained = dataclasses.replace(env, allowed=env.trained)
        for _ in range(attempts):
            knobs = data.knobs_for(trained, difficulty, rng)
            code = variants.vary(testbed.render(name, knobs[env.knob]), rng, rewrite_p)
            if max(jaccard(fingerprint(code), seed) for seed in archive) < max_similarity:
                break
        else:
            raise build.BootstrapError(f"no variant of {name} in {attempts} attempts is below similarity "
                                       f"{max_similarity}")
        programs.append(data.Program(name, difficulty, knobs, code))
    return programs


def knob_transcripts(pool: SandboxPool, cfg: BootstrapConfig, rng: np.random.Generator) -> list[data.Transcript]:
    """``cfg.transcripts`` plain solution transcripts of each family, at knob values drawn by
    `sample_knobs`, each value's plays on distinct seeds."""
    out = []
    for name in cfg.envs:
        counts = collections.Counter(sample_knobs(name, cfg.transcripts, cfg.knob_decay, rng))
        for value, count in sorted(counts.items()):
            seeds = range(_TRANSCRIPT_SEED0, _TRANSCRIPT_SEED0 + count)
            out += data.play_solutions(pool, [testbed.render(name, value)], seeds, (), cfg.agent_max_turns)
    return out


def admit(pool: SandboxPool, programs: list[data.Program], cfg: BootstrapConfig) -> list[data.Program]:
    """The renderings admitted against the testbed sources (every stage but blind, as `build` admits)."""
    archive = [testbed.load_source(env.name) for env in testbed.TESTBED_ENVS]
    reports = admit_batch([designer_answer(p.code) for p in programs],
                          AdmissionConfig(novelty_threshold=cfg.novelty_threshold, batch_novelty=False, blind_seeds=0),
                          archive, pool)
    return [p for p, r in zip(programs, reports) if r.admitted], reports


# --------------------------------------------------------------------------- building


def _build(path: Path, cfg: BootstrapConfig, progress: bool) -> None:
    started = time.perf_counter()
    timings: dict[str, float] = {}
    stats: dict = {"config": cfg.to_dict()}
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        rng = random.Random(cfg.seed)
        np_rng = np.random.default_rng(cfg.seed)
        corpus = Corpus.from_config(CorpusConfig(max_words=cfg.prompt.doc_max_words))
        documents = [corpus.document(i) for i in range(len(corpus))]
        slots = designer_slots(cfg.steps * cfg.rows, seeded_memory(cfg.envs), documents, cfg, np_rng)
        keys = sorted({(slot.env, slot.difficulty) for slot in slots})

        clock = time.perf_counter()
        programs = render_programs(keys, max(cfg.num_programs, len(keys)), rng, cfg.rewrite_p, cfg.max_similarity)
        timings["render_s"] = time.perf_counter() - clock

        with SandboxPool(SandboxConfig(num_workers=cfg.sandbox_workers)) as pool:
            clock = time.perf_counter()
            admitted, reports = admit(pool, programs, cfg)
            timings["admission_s"] = time.perf_counter() - clock
            clock = time.perf_counter()
            plays = data.play_solutions(pool, [p.code for p in admitted], range(cfg.agent_seeds),
                                        range(cfg.agent_seeds, 2 * cfg.agent_seeds), cfg.agent_max_turns,
                                        cfg.hint_mode)
            extra = knob_transcripts(pool, cfg, np_rng)
            timings["transcripts_s"] = time.perf_counter() - clock
        stats["admission"] = {"rendered": len(programs), "admitted": len(admitted),
                              "failures": build._count(f"{r.stage}: {r.reason}" for r in reports if not r.admitted)}
        stats["transcripts"] = {"renderings_won": len(plays), "hinted": sum(t.hint is not None for t in plays),
                                "knob_won": len(extra), "knob_played": cfg.transcripts * len(cfg.envs)}
        logging.info("testbed bootstrap: %d of %d renderings admitted; %d rendering and %d knob transcripts",
                     len(admitted), len(programs), len(plays), len(extra))

        by_key = build._by_key(admitted)
        designer = [(slot.messages, rng.choice(by_key[slot.env, slot.difficulty])) for slot in slots
                    if (slot.env, slot.difficulty) in by_key]
        if len(designer) < len(slots) * 9 // 10:
            raise build.BootstrapError(f"only {len(designer)} of {len(slots)} designer prompts have an admitted "
                                       f"program to answer with: {stats['admission']['failures']}")
        transcripts = plays + extra

        clock = time.perf_counter()
        # The tokenizer learns its pieces from the designer examples (whose programs hold every fixed
        # phrase the games say), not from played instances: their random contents (a row of letters,
        # a list of marks) would become merged pieces that hide their units.
        tokenizer = SentencePieceTokenizer.train(
            data.chat_texts(designer, []), cfg.vocab_size, staging / "tokenizer",
            user_defined_symbols=build.TOKENIZER_SYMBOLS, split_by_unicode_script=False, split_by_whitespace=False,
            max_sentencepiece_length=cfg.max_piece_chars, num_threads=1)
        timings["tokenizer_s"] = time.perf_counter() - clock

        clock = time.perf_counter()
        model_config, policy, trainer = build._compiled_trainer(cfg, tokenizer)
        timings["compile_s"] = time.perf_counter() - clock

        designer_seqs = [data.designer_sequence(tokenizer, m, c) for m, c in designer]
        agent_seqs = [data.agent_sequence(tokenizer, t, "") for t in transcripts]
        stats["sequences"] = {"designer": build._summary([len(s.tokens) for s in designer_seqs]),
                              "agent": build._summary([len(s.tokens) for s in agent_seqs])}
        too_long = sum(len(s.tokens) > cfg.row_length for s in designer_seqs)
        if too_long > len(designer_seqs) // 10:
            raise build.BootstrapError(f"{too_long} of {len(designer_seqs)} designer examples exceed row_length="
                                       f"{cfg.row_length}; raise it or shorten the prompts")

        clock = time.perf_counter()
        drills = build._drills(tokenizer, [t for t in transcripts if t.hint], random.Random(cfg.seed + 1))
        losses = build._train(trainer, designer_seqs, agent_seqs, drills, cfg, np_rng, progress, stats)
        timings["train_s"] = time.perf_counter() - clock
        stats["loss"] = {"first": losses[0], "last": losses[-1], "curve": losses}

        timings["total_s"] = time.perf_counter() - started
        build._commit(staging, path, policy, model_config, stats, timings)
        logging.info("testbed bootstrap: done in %.0fs, cached in %s", timings["total_s"], path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


__all__ = ["FAMILIES", "BootstrapConfig", "bootstrap_policy", "cache_key", "cache_path", "knob_weights",
           "sample_knobs"]
