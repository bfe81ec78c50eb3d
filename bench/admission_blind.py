"""False rejects and cost of admission on programs that must all be admitted.

    python bench/admission_blind.py [--sets library,bootstrap,renderings] [--per-key 3] [--seed 0]

Admits, with the default AdmissionConfig, three sets of fair programs: ``library`` (every
seed program), ``bootstrap`` (the renderings the tiny bootstrap admits: BootstrapConfig's
own keys, count and rng) and ``renderings`` (``--per-key`` renderings of every seed program
at each difficulty third of its knob ranges). Renderings are admitted against the seed
sources, as the bootstrap does. Prints per set: admitted / total, the rejections by stage
with their reasons, the wall time per program (the batch's wall time over its size: the
batch runs concurrently over the pool) and the mean sandbox call time per program, and
per stage the batch's wall time. Run by hand; on a shared machine the times are noisy.
"""

from __future__ import annotations

import argparse
import collections
import random
import time

import numpy as np

from spade_jax.admission import STAGES, AdmissionConfig, admit_batch
from spade_jax.bootstrap import build, data
from spade_jax.designer.corpus import Corpus, CorpusConfig
from spade_jax.designer.prompts import designer_answer
from spade_jax.envs import library
from spade_jax.sandbox import SandboxConfig, SandboxPool


def bootstrap_renderings() -> list[str]:
    """The programs `bootstrap.build._build` renders before admitting them (same keys, rng, count)."""
    cfg = build.BootstrapConfig()
    corpus = Corpus.from_config(CorpusConfig(max_words=cfg.prompt.doc_max_words))
    documents = [corpus.document(i) for i in range(len(corpus))]
    slots = data.designer_slots(cfg.steps * cfg.rows, data.seeded_memory(), documents, cfg.prompt, cfg.envs,
                                np.random.default_rng(cfg.seed))
    keys = sorted({(slot.env, slot.difficulty) for slot in slots})
    programs = data.render_programs(keys, max(cfg.num_programs, len(keys)), random.Random(cfg.seed),
                                    cfg.rewrite_p, cfg.max_similarity)
    return [p.code for p in programs]


def all_renderings(per_key: int, seed: int) -> list[str]:
    keys = [(env.name, difficulty) for env in library.SEED_ENVS for difficulty in ("easy", "medium", "hard")]
    return [p.code for p in data.render_programs(keys, per_key * len(keys), random.Random(seed), 0.7)]


def measure(name: str, texts: list[str], archive: list[str], pool: SandboxPool, seed: int) -> None:
    started = time.perf_counter()
    reports = admit_batch([designer_answer(t) for t in texts], AdmissionConfig(batch_novelty=False), archive,
                          pool, seed=seed)
    wall = time.perf_counter() - started
    admitted = sum(r.admitted for r in reports)
    sandbox = sum(r.details.get("sandbox_time_s", 0.0) for r in reports) / len(reports)
    print(f"{name}: admitted {admitted}/{len(reports)}; wall {wall / len(reports):.2f} s/program "
          f"({wall:.1f} s for the batch), sandbox calls {sandbox:.2f} s/program")
    cells = [(r.class_name, level, cell) for r in reports for level, cell in r.details.get("blind", {}).items()]
    if cells:
        share = max(cells, key=lambda x: max(x[2]["wins"]) / x[2]["seeds"])
        free = max(cells, key=lambda x: len(x[2]["won_whatever_the_answer"]))
        print(f"  blind margins: highest fixed-answer share {max(share[2]['wins'])}/{share[2]['seeds']} "
              f"({share[0]}, {share[1]}); most seeds won whatever the answer "
              f"{len(free[2]['won_whatever_the_answer'])}/{free[2]['seeds']} ({free[0]}, {free[1]})")
    stages = {stage: max(r.timings.get(stage, 0.0) for r in reports) for stage in STAGES}
    print("  stage wall (s): " + ", ".join(f"{s} {t:.1f}" for s, t in stages.items()))
    for (stage, reason), n in collections.Counter((r.stage, r.reason) for r in reports if not r.admitted).items():
        print(f"  rejected x{n} at {stage}: {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="library,bootstrap,renderings")
    parser.add_argument("--per-key", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="admission seed (probe seeds and actions)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    seeds = [library.load_source(env.name) for env in library.SEED_ENVS]
    with SandboxPool(SandboxConfig(num_workers=args.workers, load_timeout_s=10.0, call_timeout_s=5.0)) as pool:
        for name in args.sets.split(","):
            if name == "library":
                measure(name, seeds, [], pool, args.seed)
            elif name == "bootstrap":
                measure(name, bootstrap_renderings(), seeds, pool, args.seed)
            elif name == "renderings":
                measure(name, all_renderings(args.per_key, args.seed), seeds, pool, args.seed)
            else:
                raise SystemExit(f"unknown set {name!r}; choose from library, bootstrap, renderings")


if __name__ == "__main__":
    main()
