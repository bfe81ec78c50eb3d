"""How fast does novelty against memory use up a designer's repertoire? Admission round by round, untrained.

Samples ``--rounds`` designer batches of ``--slots`` programs from a policy at once (the
iteration-0 prompts of `experiments.bootstrap.tiny_bootstrap`: a memory seeded with the library,
documents from the shipped corpus, skills and difficulties cycled), then admits them
round by round as the loop does: each round against an archive of the seed programs the
preset keeps in memory plus every program admitted in earlier rounds, and against the
round's own earlier programs. It does so once per novelty setting (``--settings``), so the
same programs show how much of the admission rate each setting costs. The policy is not
trained between rounds: this measures the repertoire a designer starts with, not what RL
does to it.

    python -m experiments.bootstrap.designer_repeats --load /work/boot/<dir>/bootstrap-<key>
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from spade_jax.admission import AdmissionConfig, admit_batch
from spade_jax.bootstrap import build as bootstrap
from spade_jax.bootstrap import data
from spade_jax.designer.corpus import Corpus, CorpusConfig
from spade_jax.envs import library
from spade_jax.sampling import generate_on_rows
from spade_jax.sandbox import SandboxConfig, SandboxPool


def _setting(text: str) -> AdmissionConfig:
    """``off``, ``constants@0.85``, ``structure@0.9`` -> the admission config of that novelty setting."""
    mode, _, threshold = text.partition("@")
    return AdmissionConfig(novelty=mode, **({"novelty_threshold": float(threshold)} if threshold else {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", required=True, help="a finished bootstrap directory")
    parser.add_argument("--rounds", type=int, default=5, help="designer batches (tiny: 10 iterations / period 2)")
    parser.add_argument("--slots", type=int, default=8, help="programs per batch (tiny: designer.num_slots)")
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--max_new_tokens", type=int, default=400)
    parser.add_argument("--settings", default="constants@0.85,constants@0.95,constants@1.0,off",
                        help="novelty settings, mode@threshold, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    policy = bootstrap.load_bootstrap(args.load)
    cfg = bootstrap.BootstrapConfig()
    n = args.rounds * args.slots
    rng = np.random.default_rng(args.seed)
    documents = Corpus.from_config(CorpusConfig(max_words=cfg.prompt.doc_max_words, seed=args.seed)).sample(n)
    slots = data.designer_slots(n, data.seeded_memory(), documents, cfg.prompt, cfg.envs, rng)
    prompts = [policy.tokenizer.apply_chat_template(s.messages, add_generation_prompt=True) for s in slots]
    generation = generate_on_rows(policy, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                  seed=args.seed)
    texts = [policy.tokenizer.decode(generation.row_tokens(i)) for i in range(n)]
    seeds = [library.load_source(name) for name in cfg.envs]  # what tiny keeps in memory (the rest is held out)

    settings = args.settings.split(",")
    table: dict[str, list[str]] = {}
    with SandboxPool(SandboxConfig(num_workers=2)) as pool:
        for setting in settings:
            archive = list(seeds)
            cells = []
            for r in range(args.rounds):
                batch = texts[r * args.slots:(r + 1) * args.slots]
                reports = admit_batch(batch, _setting(setting), archive, pool, seed=args.seed + r)
                archive += [report.code for report in reports if report.admitted]
                novelty = sum(not report.admitted and report.stage == "novelty" for report in reports)
                cells.append(f"{sum(report.admitted for report in reports)} ({novelty})")
            table[setting] = cells
            print(f"{setting}: {cells}", flush=True)
    print(f"\n{n} programs sampled at temperature {args.temperature} from {args.load}")
    print("admitted of " + str(args.slots) + " per round (rejected at novelty)\n")
    print("| setting | " + " | ".join(f"round {r + 1}" for r in range(args.rounds)) + " |")
    print("| --- |" + " --- |" * args.rounds)
    for setting, cells in table.items():
        print(f"| {setting} | " + " | ".join(cells) + " |")
    print("\nreproduce: python -m experiments.bootstrap.designer_repeats " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
