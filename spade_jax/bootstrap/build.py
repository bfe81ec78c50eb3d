"""The tiny preset's bootstrap: a small policy, trained from scratch on this CPU, that knows the contract.

A randomly initialised model writes no valid programs, so the CPU preset starts from a
policy trained once on the seed library (`bootstrap.data`):

1. render ``num_programs`` structural variants of seed programs and keep those that pass
   all eight admission stages against the seed sources (the iteration-0 archive);
2. play each admitted program by its own ``solution()`` in the sandbox, plain and hinted
   (on disjoint seeds);
3. train a SentencePiece tokenizer on every training text;
4. train a small Llama-family model with `rl.train.Trainer` (objective "nll" on the
   assistant tokens) on rows that pack one designer example with agent transcripts.

The result (tokenizer, parameters, config, data and training statistics) is cached in
``cache_dir`` under a key hashing the config, the library and corpus sources, the prompt
constants and this code, so later calls load it in seconds. Same config, same result.

    policy = bootstrap_policy("~/.cache/spade_jax", BootstrapConfig())
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import inspect
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

import jax
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import Mesh

import spade_jax.agent.conversation
import spade_jax.designer.memory
import spade_jax.designer.prompts
import spade_jax.models.tokenizer
from spade_jax.admission import AdmissionConfig, admit_batch
from spade_jax.agent import strategy
from spade_jax.agent.rollout import AGENT_SYSTEM_PROMPT, HINT_SEPARATOR, solution_hint
from spade_jax.designer.corpus import PACKAGED_CORPUS, Corpus, CorpusConfig
from spade_jax.designer.prompts import PromptConfig, designer_answer, slot_messages
from spade_jax.envs import library
from spade_jax.models import ModelConfig, Policy, SentencePieceTokenizer, make_mesh
from spade_jax.models.loading import place_params
from spade_jax.progress import progress_bar
from spade_jax.models.policy import init_model
from spade_jax.models.sharding import TRAIN_RULES
from spade_jax.rl.batch import ROLE_IDS, TrainBatch, TrainSequence, pack
from spade_jax.rl.train import LossConfig, OptimConfig, Trainer
from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.bootstrap import data, variants

BOOTSTRAP_VERSION = "3"  # 2: parameters per layer (layers/{i}/...); 3: weights stored (out, in)
TOKENIZER_SYMBOLS = ("<tool_call>", "</tool_call>", "<answer>", "</answer>", "\\boxed{")
_DONE = "DONE"
_MISSES_PER_BATCH = 4  # agent transcripts that did not fit, after which a training batch is full
# How prompts, exemplars, conversations and chat templates are rendered: part of the cache key.
_RENDERING_MODULES = (spade_jax.designer.prompts, spade_jax.designer.memory, spade_jax.agent.conversation,
                      spade_jax.models.tokenizer)


class BootstrapError(RuntimeError):
    """The bootstrap could not produce its training data or its cache is unusable."""


@dataclasses.dataclass(frozen=True)
class BootstrapConfig:
    """What the bootstrap trains on and how.

    Prompts: ``prompt`` sizes the designer prompts trained on; a run passes its own
    `config.designer.prompt`, so the bootstrap is trained on the prompts its designer
    builds. No exemplars by default: the small model wrote broken programs for prompts
    whose exemplars differed from its training ones (experiments/bootstrap/README.md); without them the
    prompts it answers look the same at every iteration.
    Data: designer answers are structural variants of the seed programs named in ``envs``
    (one per prompt skill at least), ``num_programs`` of them rendered (each rewrite
    applied with probability ``rewrite_p``, redrawn while the similarity to a seed reaches
    ``max_similarity``) and kept only when admitted against the seed sources with
    ``novelty_threshold``; solution plays of each on ``agent_seeds`` seeds plain and on as
    many other seeds hinted (a transcript per won play) with ``agent_max_turns`` (the
    preset's agent max_turns); a hinted transcript shows the hint of ``hint_mode``
    (`data.HINT_MODES`): "solution" (the default) the whole plan, "strategy" the program's
    strategy hint as self-play's hint mode `strategy` shows it, never the instance's answer.
    These are pretraining transcripts, not self-play's hints (`tiny` measures regret with
    `strategy` hints either way): with "strategy" the 300-step build's designer wrote
    admissible programs for 4 of 24 iteration-0 prompts, with "solution" for 14 of 24
    (experiments/bootstrap/README.md, 2026-12-04). A share ``hint_drill_share`` of the agent transcripts in
    the rows can be hint drills (`data.hint_drill`: a hinted transcript relabelled at
    random, so only its plan predicts its actions), drawn fresh each time so that none
    repeats and copying the plan is the only way to predict them (a drill shows a plan, so
    it needs ``hint_mode`` "solution"). Off by default: at 600
    steps, shares 0.5 and 0.75 taught the plan's form, not its content, and cut the sampled
    hinted win rate at iteration 0 (2026-12-02: experiments/bootstrap/README.md, experiments/hints/README.md).
    Model: Llama family, SentencePiece with ``vocab_size`` pieces of up to
    ``max_piece_chars`` characters (whole code lines become single tokens), untied embeddings.
    Training: ``steps`` AdamW steps of ``rows`` packed rows of ``row_length`` tokens
    (one designer example per row, agent transcripts in the rest), ``micro_batch_rows``
    rows at a time, linear warmup then cosine decay to lr/10. 300 steps build in about 6
    minutes on 2 cores at 2000 tokens/s; 600 took twice as long, admitted 13 of 24 designs at
    iteration 0 against 15 of 24 and won more plain plays (0.21 against 0.07; experiments/bootstrap/README.md).
    """

    seed: int = 0
    prompt: PromptConfig = PromptConfig(doc_max_words=40, exemplars_positive=0, exemplars_negative=0,
                                        exemplar_max_chars=400)
    envs: tuple[str, ...] = ("shopping", "tallest", "nearest_city", "repeat_pattern", "knapsack",
                             "plant_experiment")
    num_programs: int = 48
    rewrite_p: float = 0.7
    max_similarity: float = 0.75
    novelty_threshold: float = 0.85
    agent_seeds: int = 2
    agent_max_turns: int = 8
    hint_mode: str = "solution"
    hint_drill_share: float = 0.0
    vocab_size: int = 8192
    max_piece_chars: int = 64
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 4
    num_heads: int = 2
    head_dim: int = 128
    max_position_embeddings: int = 4096
    steps: int = 300
    rows: int = 4
    micro_batch_rows: int = 2
    row_length: int = 512
    lr: float = 6e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    b2: float = 0.99
    sandbox_workers: int = 2

    def __post_init__(self):
        if self.rows < 1 or self.rows & (self.rows - 1):
            raise ValueError(f"BootstrapConfig.rows must be a power of two, got {self.rows}")
        if self.num_programs < len(library.SKILLS):
            raise ValueError(f"BootstrapConfig.num_programs must be >= {len(library.SKILLS)} (one per skill)")
        if self.steps <= self.warmup_steps:
            raise ValueError("BootstrapConfig.steps must exceed warmup_steps")
        if self.hidden_size != self.num_heads * self.head_dim:
            raise ValueError("BootstrapConfig.hidden_size must equal num_heads * head_dim")
        if self.micro_batch_rows < 0 or (self.micro_batch_rows and self.rows % self.micro_batch_rows):
            raise ValueError(f"BootstrapConfig.micro_batch_rows ({self.micro_batch_rows}) must divide rows "
                             f"({self.rows}); 0 = all rows at once")
        if self.hint_mode not in data.HINT_MODES:
            raise ValueError(f"BootstrapConfig.hint_mode must be one of {data.HINT_MODES}, got {self.hint_mode!r}")
        if self.hint_drill_share and self.hint_mode != "solution":
            raise ValueError("BootstrapConfig.hint_drill_share needs hint_mode 'solution' (a drill shows a plan)")
        missing = set(library.SKILLS) - {library.get(name).skill for name in self.envs}
        if missing:
            raise ValueError(f"BootstrapConfig.envs {list(self.envs)} has no seed program for skill(s) "
                             f"{sorted(missing)}; add one of each")

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(
            vocab_size=vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_layers=self.num_layers, num_heads=self.num_heads, num_kv_heads=self.num_heads,
            head_dim=self.head_dim, max_position_embeddings=self.max_position_embeddings,
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def cache_key(cfg: BootstrapConfig) -> str:
    """Hash of everything the training data depends on: the config, the library and its variants,
    the corpus, how prompts, exemplars, conversations and tokenizers are rendered, and this code."""
    h = hashlib.sha256(f"spade-bootstrap/{BOOTSTRAP_VERSION}".encode())
    h.update(json.dumps(cfg.to_dict(), sort_keys=True).encode())
    for text in (AGENT_SYSTEM_PROMPT, HINT_SEPARATOR, inspect.getsource(solution_hint),
                 inspect.getsource(slot_messages)):
        h.update(b"\0" + text.encode())
    sources = sorted(Path(library.__file__).parent.glob("*.py"))
    sources += [Path(module.__file__) for module in _RENDERING_MODULES + (data, variants, strategy)]
    sources += [Path(__file__), PACKAGED_CORPUS]
    for path in sources:
        h.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:20]


def cache_path(cache_dir: str | os.PathLike, cfg: BootstrapConfig) -> Path:
    """Where the bootstrap for ``cfg`` lives (or will live) under ``cache_dir``."""
    return Path(cache_dir).expanduser() / f"bootstrap-{cache_key(cfg)}"


def bootstrap_policy(cache_dir: str | os.PathLike, cfg: BootstrapConfig = BootstrapConfig(),
                     mesh: Mesh | None = None, progress: bool = True) -> Policy:
    """The bootstrapped policy for ``cfg``: loaded from ``cache_dir``, or trained there first."""
    path = cache_path(cache_dir, cfg)
    if not (path / _DONE).exists():
        _build(path, cfg, progress)
    return load_bootstrap(path, mesh)


def load_bootstrap(path: str | os.PathLike, mesh: Mesh | None = None) -> Policy:
    """A policy saved by `bootstrap_policy`, placed on ``mesh`` (default: the first local device)."""
    path = Path(path)
    if not (path / _DONE).exists():
        raise BootstrapError(f"{path} holds no finished bootstrap (no {_DONE} marker); delete it and rerun")
    meta = json.loads((path / "meta.json").read_text())
    tokenizer = SentencePieceTokenizer(path / "tokenizer.model")
    config = ModelConfig(**meta["model_config"])
    mesh = mesh or make_mesh((1, 1, 1), jax.local_devices()[:1])
    with np.load(path / "params.npz") as saved:
        model = place_params(config, mesh, TRAIN_RULES, {name: lambda name=name: saved[name] for name in saved.files})
    return Policy(model, config, tokenizer, mesh, TRAIN_RULES)


def bootstrap_stats(path: str | os.PathLike) -> dict:
    """The statistics a finished bootstrap recorded (data, admission, losses, timings)."""
    return json.loads((Path(path) / "meta.json").read_text())["stats"]


def _key_name(key_path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in key_path)


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
        memory = data.seeded_memory()
        slots = data.designer_slots(cfg.steps * cfg.rows, memory, documents, cfg.prompt, cfg.envs, np_rng)
        keys = sorted({(slot.env, slot.difficulty) for slot in slots})

        clock = time.perf_counter()
        programs = data.render_programs(keys, max(cfg.num_programs, len(keys)), rng, cfg.rewrite_p,
                                           cfg.max_similarity)
        timings["render_s"] = time.perf_counter() - clock
        logging.info("bootstrap: rendered %d variants of %d seed programs in %.1fs", len(programs),
                     len({name for name, _ in keys}), timings["render_s"])

        with SandboxPool(SandboxConfig(num_workers=cfg.sandbox_workers)) as pool, \
                concurrent.futures.ThreadPoolExecutor(1) as background:
            clock = time.perf_counter()
            plays = data.play_solutions(pool, [p.code for p in programs], range(cfg.agent_seeds),
                                        range(cfg.agent_seeds, 2 * cfg.agent_seeds), cfg.agent_max_turns,
                                        cfg.hint_mode)
            timings["transcripts_s"] = time.perf_counter() - clock
            # Admission runs in the background (the pool is only used there from now on) while
            # the tokenizer trains and the update compiles; nothing is trained on before it ends.
            admission = background.submit(_admit, pool, programs, cfg)

            clock = time.perf_counter()
            rendered = _by_key(programs)
            vocabulary_pairs = [(slot.messages, _cycle(rendered[slot.env, slot.difficulty], i))
                                for i, slot in enumerate(slots)]
            tokenizer = SentencePieceTokenizer.train(
                data.chat_texts(vocabulary_pairs, plays), cfg.vocab_size, staging / "tokenizer",
                user_defined_symbols=TOKENIZER_SYMBOLS, split_by_unicode_script=False, split_by_whitespace=False,
                max_sentencepiece_length=cfg.max_piece_chars, num_threads=1)
            timings["tokenizer_s"] = time.perf_counter() - clock
            logging.info("bootstrap: trained a %d-token SentencePiece tokenizer in %.1fs", tokenizer.vocab_size,
                         timings["tokenizer_s"])

            clock = time.perf_counter()
            model_config, policy, trainer = _compiled_trainer(cfg, tokenizer)
            timings["compile_s"] = time.perf_counter() - clock
            logging.info("bootstrap: compiled the %.1fM-parameter model's update in %.1fs",
                         model_config.num_params / 1e6, timings["compile_s"])

            admitted, stats["admission"], timings["admission_s"] = admission.result()
        logging.info("bootstrap: %d of %d renderings admitted in %.1fs (max similarity to a seed: %s)",
                     len(admitted), len(programs), timings["admission_s"], stats["admission"]["similarity"])
        admitted_codes = {p.code for p in admitted}
        transcripts = [t for t in plays if t.program in admitted_codes]
        stats["transcripts"] = {"plays": len(admitted) * cfg.agent_seeds * 2, "won": len(transcripts),
                                "hinted": sum(t.hint is not None for t in transcripts)}
        logging.info("bootstrap: %d solution plays of admitted programs won of %d (%d hinted) in %.1fs",
                     len(transcripts), stats["transcripts"]["plays"], stats["transcripts"]["hinted"],
                     timings["transcripts_s"])

        by_key = _by_key(admitted)
        designer = [(slot.messages, rng.choice(by_key[slot.env, slot.difficulty])) for slot in slots
                    if (slot.env, slot.difficulty) in by_key]
        if len(designer) < len(slots) * 9 // 10:
            raise BootstrapError(f"only {len(designer)} of {len(slots)} designer prompts have an admitted program "
                                 f"to answer with: {stats['admission']['failures']}")

        designer_seqs = [data.designer_sequence(tokenizer, m, c) for m, c in designer]
        agent_seqs = [data.agent_sequence(tokenizer, t) for t in transcripts]
        drills = _drills(tokenizer, [t for t in transcripts if t.hint], random.Random(cfg.seed + 1))
        stats["sequences"] = {
            "designer": _summary([len(s.tokens) for s in designer_seqs]),
            "designer_answer": _summary([int(s.loss_mask.sum()) for s in designer_seqs]),
            "agent": _summary([len(s.tokens) for s in agent_seqs]),
            "agent_action": _summary([int(n) for s in agent_seqs for n in _run_lengths(s.loss_mask)]),
        }
        too_long = sum(len(s.tokens) > cfg.row_length for s in designer_seqs)
        if too_long > len(designer_seqs) // 10:
            raise BootstrapError(f"{too_long} of {len(designer_seqs)} designer examples exceed row_length="
                                 f"{cfg.row_length}; raise it or shorten the prompts")

        clock = time.perf_counter()
        losses = _train(trainer, designer_seqs, agent_seqs, drills, cfg, np_rng, progress, stats)
        timings["train_s"] = time.perf_counter() - clock
        stats["loss"] = {"first": losses[0], "last": losses[-1], "curve": losses}

        timings["total_s"] = time.perf_counter() - started
        _commit(staging, path, policy, model_config, stats, timings)
        logging.info("bootstrap: done in %.0fs, cached in %s", timings["total_s"], path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _compiled_trainer(cfg: BootstrapConfig, tokenizer) -> tuple:
    """(model config, a freshly initialised policy, its `nll` Trainer with the update compiled)."""
    model_config = cfg.model_config(tokenizer.vocab_size)
    mesh = make_mesh((1, 1, 1), jax.local_devices()[:1])
    policy = Policy(init_model(model_config, seed=cfg.seed, mesh=mesh), model_config, tokenizer, mesh)
    optim = OptimConfig(lr=cfg.lr, weight_decay=cfg.weight_decay, b2=cfg.b2,
                        warmup_steps=cfg.warmup_steps, schedule="cosine", total_steps=cfg.steps)
    trainer = Trainer(policy, optim, LossConfig(objective="nll", micro_batch_rows=cfg.micro_batch_rows))
    _compile(trainer, cfg)
    return model_config, policy, trainer


def _commit(staging: Path, path: Path, policy, model_config, stats: dict, timings: dict) -> None:
    """Writes the trained weights, meta.json and the done marker into ``staging``, then moves it to ``path``."""
    _save_params(staging / "params.npz", nnx.to_pure_dict(nnx.state(policy.model)))
    stats["timings"] = timings
    meta = {"version": BOOTSTRAP_VERSION, "model_config": dataclasses.asdict(model_config), "stats": stats}
    (staging / "meta.json").write_text(json.dumps(meta, indent=1))
    (staging / _DONE).write_text("")
    if path.exists():
        shutil.rmtree(path)
    os.replace(staging, path)


def _by_key(programs: list[data.Program]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for program in programs:
        out.setdefault((program.name, program.difficulty), []).append(program.code)
    return out


def _cycle(items: list, i: int):
    return items[i % len(items)]


def _admit(pool: SandboxPool, programs: list[data.Program], cfg: BootstrapConfig):
    """The programs that pass admission against the seed sources (every stage but blind), with statistics."""
    clock = time.perf_counter()
    archive = [library.load_source(env.name) for env in library.SEED_ENVS]
    # No blind stage: the renderings are variants of seed programs the blind stage passes
    # (bench/admission_blind.py), and its fixed-answer plays were most of this step's time.
    reports = admit_batch([designer_answer(p.code) for p in programs],
                          AdmissionConfig(novelty_threshold=cfg.novelty_threshold, batch_novelty=False, blind_seeds=0),
                          archive, pool)
    admitted = [p for p, r in zip(programs, reports) if r.admitted]
    stats = {
        "rendered": len(programs), "admitted": len(admitted),
        "failures": _count(f"{r.stage}: {r.reason}" for r in reports if not r.admitted),
        "similarity": _summary([r.details.get("max_similarity") for r in reports if r.admitted]),
    }
    return admitted, stats, time.perf_counter() - clock


def _compile(trainer: Trainer, cfg: BootstrapConfig) -> None:
    """Compiles the update and the log-probs on a dummy batch of the training shape, then restores
    the initial parameters and optimizer state exactly (so training is as if it had not run)."""
    initial = trainer.state_dict()
    shardings = jax.tree.map(lambda a: a.sharding, {"params": initial["params"], "opt_state": initial["opt_state"]})
    saved = jax.device_get({"params": initial["params"], "opt_state": initial["opt_state"]})
    half = cfg.row_length // 2
    dummy = pack([TrainSequence(np.zeros(half, np.int32), np.ones(half, bool), np.zeros(half, np.float32), 0.0)
                  for _ in range(2 * cfg.rows)], cfg.row_length)
    trainer.update(dummy)
    trainer.logprobs(dummy)
    restored = jax.device_put(saved, shardings)
    trainer.load_state_dict({**restored, "step": initial["step"]})


def _drills(tokenizer, hinted: list[data.Transcript], rng: random.Random) -> Iterator[TrainSequence]:
    """Endless fresh hint drills of the ``hinted`` transcripts, as training sequences."""
    words = data.action_words(hinted)
    while hinted:
        yield data.agent_sequence(tokenizer, data.hint_drill(rng.choice(hinted), words, rng))


def _train(trainer: Trainer, designer: list[TrainSequence], agent: list[TrainSequence],
           drills: Iterator[TrainSequence], cfg: BootstrapConfig, rng: np.random.Generator, progress: bool,
           stats: dict) -> list[float]:
    batches = _batches(designer, agent, drills, cfg, rng)
    held_out = next(batches)  # never trained on: per-role losses are measured on it
    losses, tokens, train_time = [], 0, 0.0
    stats["held_out_nll"] = []
    cpu_start = time.process_time()
    with progress_bar(cfg.steps, "bootstrap", unit="steps", enabled=progress) as bar:
        for step in range(cfg.steps):
            batch = next(batches)
            metrics = trainer.update(batch)
            losses.append(round(metrics["loss"], 4))
            tokens += int((batch.segment_ids_RT > 0).sum())
            train_time += metrics["step_time_s"]
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", tok_s=f"{tokens / max(train_time, 1e-9):.0f}")
            bar.update()
            if (step + 1) % max(cfg.steps // 4, 1) == 0 or step == cfg.steps - 1:
                nll = _role_nll(trainer, held_out)
                stats["held_out_nll"].append({"step": step + 1, **nll})
                logging.info("bootstrap: step %d/%d loss %.4f, held-out nll designer %.4f agent %.4f",
                             step + 1, cfg.steps, metrics["loss"], nll["designer"], nll["agent"])
    stats["train_cpu_s"] = time.process_time() - cpu_start  # both cores busy: about twice the quiet wall time
    stats["train_tokens"] = tokens
    stats["tokens_per_s"] = tokens / max(train_time, 1e-9)
    return losses


def _role_nll(trainer: Trainer, batch: TrainBatch) -> dict[str, float]:
    """Mean negative log-likelihood of the trained tokens of each role in ``batch``."""
    logprobs_RT = trainer.logprobs(batch)
    out = {}
    for role, role_id in ROLE_IDS.items():
        mask_RT = batch.target_mask_RT & (batch.roles_RT == role_id)
        out[role] = round(float(-(logprobs_RT * mask_RT).sum() / max(mask_RT.sum(), 1)), 4)
    return out


def _batches(designer: list[TrainSequence], agent: list[TrainSequence], drills: Iterator[TrainSequence],
             cfg: BootstrapConfig, rng: np.random.Generator):
    """Batches of exactly ``cfg.rows`` rows: ``cfg.rows`` designer examples, then agent transcripts (each a
    fresh hint drill with probability ``cfg.hint_drill_share``) for as long as first-fit-decreasing
    packing keeps them in ``cfg.rows`` rows, until `_MISSES_PER_BATCH` do not fit. A transcript that
    does not fit is tried first in the next batch and dropped if it does not fit there either, so a
    long transcript never stops the others."""
    designer = [s for s in designer if len(s.tokens) <= cfg.row_length]
    agent_order = list(rng.permutation(len(agent))) if agent else []
    cursor = 0

    def next_transcript() -> TrainSequence | None:
        nonlocal cursor
        drill = next(drills, None) if rng.random() < cfg.hint_drill_share else None
        if drill is not None or not agent_order:
            return drill
        cursor += 1
        return agent[agent_order[(cursor - 1) % len(agent_order)]]

    waiting: list[TrainSequence] = []
    for start in range(0, 10**9, cfg.rows):
        members = [designer[(start + k) % len(designer)] for k in range(cfg.rows)]
        batch = pack(members, cfg.row_length)
        retry, waiting, misses = waiting, [], 0
        while misses < _MISSES_PER_BATCH:
            retried = bool(retry)
            candidate = retry.pop() if retried else next_transcript()
            if candidate is None:
                break
            trial = pack(members + [candidate], cfg.row_length)
            if trial.num_rows <= cfg.rows:
                members.append(candidate)
                batch = trial
            else:
                misses += 1
                if not retried:
                    waiting.append(candidate)
        yield batch


def _run_lengths(mask: np.ndarray) -> list[int]:
    """Lengths of the runs of True in ``mask`` (one per assistant turn)."""
    edges = np.diff(np.r_[0, mask.astype(np.int8), 0])
    return list(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1))


def _save_params(path: Path, params: dict) -> None:
    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    np.savez(path, **{_key_name(k): np.asarray(v) for k, v in leaves})


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def _summary(values) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0}
    array = np.asarray(values, np.float64)
    return {"n": len(values), "mean": round(float(array.mean()), 4), "min": round(float(array.min()), 4),
            "max": round(float(array.max()), 4)}


__all__ = ["BOOTSTRAP_VERSION", "BootstrapConfig", "BootstrapError", "bootstrap_policy",
           "bootstrap_stats", "cache_key", "cache_path", "load_bootstrap"]
