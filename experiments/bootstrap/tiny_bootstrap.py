"""The tiny preset's bar, measured from the bootstrap checkpoint at self-play iteration 0.

Runs the bootstrap (or loads it from the cache), then does what the designer and agent do
at iteration 0: designer prompts built from a memory seeded with the library (exemplars
drawn from it, documents from the shipped corpus, skills and difficulties cycled), one
batched engine call (`generate_on_rows`), admission of every program through all eight stages with the seed
sources as the novelty archive, then plain and hinted episodes on every admitted program.

Admission counts as in the loop: all eight stages, then no near-duplicate of an earlier
program of the same designer batch (``--batch``, the tiny preset's designer.num_slots).
The bar: at least half of the designed programs are admitted, and the agent's plain win
rate over the admitted pool is strictly between 0 and 1.

    python -m experiments.bootstrap.tiny_bootstrap                      # bootstrap (cached) + bar
    python -m experiments.bootstrap.tiny_bootstrap --fresh --samples 48 --temperature 0.6
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import logging

from spade_jax.admission import STAGES, AdmissionConfig, admit_batch
from spade_jax.agent.rollout import AGENT_SYSTEM_PROMPT, AgentConfig, EpisodeRequest, play_episodes
from spade_jax.designer.corpus import Corpus, CorpusConfig
from spade_jax.sampling import generate_on_rows
from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.bootstrap import build as bootstrap
from spade_jax.bootstrap import data


def _rss_mb(who=resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


def _overrides(assignments: list[str]) -> dict:
    """``["steps=400", "envs=a,b"]`` -> typed BootstrapConfig overrides."""
    defaults = bootstrap.BootstrapConfig()
    out = {}
    for item in assignments:
        field, _, value = item.partition("=")
        current = getattr(defaults, field)
        out[field] = tuple(value.split(",")) if isinstance(current, tuple) else type(current)(value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache_dir", default=os.path.expanduser("~/.cache/spade_jax"))
    parser.add_argument("--fresh", action="store_true", help="bootstrap into a new temporary cache directory")
    parser.add_argument("--samples", type=int, default=24, help="designer programs to write")
    parser.add_argument("--temperature", type=float, default=0.6, help="designer sampling temperature")
    parser.add_argument("--top_p", type=float, default=1.0, help="designer nucleus mass")
    parser.add_argument("--top_k", type=int, default=0, help="designer top-k (0: off)")
    parser.add_argument("--load", help="evaluate this finished bootstrap directory instead of building one")
    parser.add_argument("--max_new_tokens", type=int, default=1024, help="designer max_new_tokens")
    parser.add_argument("--batch", type=int, default=8, help="designer batch (tiny: designer.num_slots)")
    parser.add_argument("--episodes", type=int, default=4, help="plain (and as many hinted) episodes per program")
    parser.add_argument("--agent_temperature", type=float, default=1.0)
    parser.add_argument("--agent_max_new_tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a BootstrapConfig field (repeatable), e.g. --set steps=400")
    parser.add_argument("--show", type=int, default=2, help="rejected programs to print")
    args = parser.parse_args()
    logging.set_verbosity(logging.INFO)

    cfg = bootstrap.BootstrapConfig(**_overrides(args.set))
    cache_dir = tempfile.mkdtemp(prefix="tiny-bootstrap-") if args.fresh else args.cache_dir
    rows: list[tuple[str, str]] = []

    clock = time.perf_counter()
    path = Path(args.load) if args.load else bootstrap.cache_path(cache_dir, cfg)
    cached = (path / "DONE").exists()
    policy = bootstrap.load_bootstrap(path) if args.load else bootstrap.bootstrap_policy(cache_dir, cfg)
    bootstrap_s = time.perf_counter() - clock
    stats = bootstrap.bootstrap_stats(path)
    rss_after_bootstrap = _rss_mb()
    rows += [
        ("bootstrap", f"{'loaded from cache' if cached else 'built'} in {bootstrap_s:.1f}s ({cache_dir})"),
        ("bootstrap build time (recorded)", " ".join(f"{k}={v:.0f}s" for k, v in stats["timings"].items())),
        ("model", f"{policy.config.num_params / 1e6:.2f}M params, vocab {policy.config.vocab_size}, "
                  f"{stats['train_tokens']} train tokens at {stats['tokens_per_s']:.0f} tok/s"),
        ("bootstrap loss", f"{stats['loss']['first']:.3f} -> {stats['loss']['last']:.3f}"),
        ("training renderings admitted", f"{stats['admission']['admitted']}/{stats['admission']['rendered']}, "
                                         f"max similarity to a seed {stats['admission']['similarity']}"),
    ]

    prompt = cfg.prompt
    memory = data.seeded_memory()
    corpus = Corpus.from_config(CorpusConfig(max_words=prompt.doc_max_words, seed=args.seed))
    rng = np.random.default_rng(args.seed)
    documents = corpus.sample(args.samples)
    messages = [slot.messages for slot in data.designer_slots(args.samples, memory, documents, prompt, cfg.envs, rng)]
    prompts = [policy.tokenizer.apply_chat_template(m, add_generation_prompt=True) for m in messages]

    clock = time.perf_counter()
    generation = generate_on_rows(policy, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                  top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    design_s = time.perf_counter() - clock
    texts = [policy.tokenizer.decode(generation.row_tokens(i)) for i in range(len(prompts))]

    archive = [record.code for record in memory.records()]
    with SandboxPool(SandboxConfig(num_workers=cfg.sandbox_workers)) as pool:
        clock = time.perf_counter()
        admission_cfg = AdmissionConfig(novelty_threshold=cfg.novelty_threshold)
        # What the loop admits: batches of `--batch` programs (one designer batch per iteration),
        # each program also no near-duplicate of an earlier one of its batch.
        reports = [r for start in range(0, len(texts), args.batch)
                   for r in admit_batch(texts[start:start + args.batch], admission_cfg, archive, pool)]
        admission_s = time.perf_counter() - clock
        admitted = [r.code for r in reports if r.admitted]
        failures = {stage: sum(1 for r in reports if not r.admitted and r.stage == stage) for stage in STAGES}
        in_batch = sum(r.reason.startswith("near-duplicate of program") for r in reports if not r.admitted)
        by_game: dict[str, list[int]] = {}
        for text, report in zip(texts, reports):
            found = re.search(r"class (\w+Env)\b", text)
            by_game.setdefault(found.group(1) if found else "?", [0, 0])[report.admitted] += 1
        similarity = [r.details["max_similarity"] for r in reports if "max_similarity" in r.details]

        # the prompts the tiny preset plays with: the system turn and bare first observation the
        # bootstrap was trained on
        agent_cfg = AgentConfig(max_turns=cfg.agent_max_turns, max_new_tokens=args.agent_max_new_tokens,
                                temperature=args.agent_temperature, system_prompt=AGENT_SYSTEM_PROMPT,
                                user_template="{observation}")
        requests = [EpisodeRequest(env_key=k, program=code, seed=s, hinted=hinted, hint_from_solution=True)
                    for k, code in enumerate(admitted) for hinted in (False, True) for s in range(args.episodes)]
        clock = time.perf_counter()
        trajectories = play_episodes(policy, pool, requests, agent_cfg, seed=args.seed) if requests else []
        episodes_s = time.perf_counter() - clock

    plain = [t for t in trajectories if not t.hinted]
    hinted = [t for t in trajectories if t.hinted]
    per_env = [np.mean([t.won for t in plain if t.request.env_key == k]) for k in range(len(admitted))]
    win_plain = float(np.mean([t.won for t in plain])) if plain else float("nan")
    win_hinted = float(np.mean([t.won for t in hinted])) if hinted else float("nan")
    admission_rate = len(admitted) / len(texts)
    finished = int(generation.finished.sum())
    rows += [
        ("designer samples", f"{len(texts)} at temperature {args.temperature} ({finished} ended on the stop token, "
                             f"mean {generation.lengths.mean():.0f} tokens)"),
        ("designer sampling", f"{design_s:.1f}s (compile {generation.stats.compile_s:.1f}s)"),
        ("ADMITTED", f"{len(admitted)}/{len(texts)} = {admission_rate:.2f}   (bar: >= 0.5)"),
        ("failures by stage", ", ".join(f"{s}={n}" for s, n in failures.items() if n) or "none"),
        ("admitted by class", ", ".join(f"{name} {ok}/{bad + ok}" for name, (bad, ok) in sorted(by_game.items()))),
        ("of which in-batch duplicates", f"{in_batch} (passed every stage, but near-duplicates of an earlier "
                                         f"program of their batch of {args.batch})"),
        ("max similarity to a seed", f"mean {np.mean(similarity):.3f}, max {np.max(similarity):.3f} "
                                     f"(threshold {cfg.novelty_threshold})" if similarity else "-"),
        ("admission time", f"{admission_s:.1f}s ({admission_s / len(texts):.2f}s per program)"),
        ("AGENT PLAIN WIN RATE", f"{win_plain:.3f} over {len(plain)} episodes on {len(admitted)} programs   "
                                 "(bar: strictly between 0 and 1)"),
        ("agent hinted win rate", f"{win_hinted:.3f} over {len(hinted)} episodes"),
        ("programs with plain wins", f"{sum(w > 0 for w in per_env)} of {len(per_env)}; all won: "
                                     f"{sum(w == 1 for w in per_env)}"),
        ("episodes time", f"{episodes_s:.1f}s"),
        ("peak RSS", f"this process {max(rss_after_bootstrap, _rss_mb()):.0f} MB "
                     f"(after bootstrap {rss_after_bootstrap:.0f} MB), sandbox host {_rss_mb(resource.RUSAGE_CHILDREN):.0f} MB"),
    ]
    bar = admission_rate >= 0.5 and 0.0 < win_plain < 1.0
    rows.append(("BAR", "MET" if bar else "NOT MET"))

    shown = 0
    for text, report in zip(texts, reports):
        if not report.admitted and shown < args.show:
            shown += 1
            print(f"--- rejected at {report.stage}: {report.reason}\n{text[:1500]}\n")
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    print("\nreproduce: python -m experiments.bootstrap.tiny_bootstrap " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
