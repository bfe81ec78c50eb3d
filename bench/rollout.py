"""Multi-turn episodes per second: the rollout engine against lock-step turns and a transformers loop.

    python bench/rollout.py --model=smollm2                                  # SmolLM2-135M-Instruct, f32
    python bench/rollout.py --model=tiny --bootstrap=workdirs/tiny/bootstrap/bootstrap-<hash>
    python bench/rollout.py --model=smollm2 --engines=engine,lockstep --episodes=8
    python bench/rollout.py --model=tiny --bootstrap=<dir> --engines=engine,paged     # contiguous vs paged cache

Every engine plays the same requests: `--episodes` episodes of eight library
environments (six tool-use, two games that go on for many turns), `--max_turns` turns,
replies of up to `--max_new_tokens` tokens sampled at `--temperature` (so reply lengths
vary), in a real sandbox pool. A reply cut at `--max_new_tokens` is stepped
(`AgentConfig.every_play_counts`; `--end_at_cut` keeps the reference's rule, which ends the
episode there): under that rule SmolLM2's 64-token replies end most episodes at their first
turn (1.9 turns on average), and the bench would no longer time multi-turn episodes. Engines:

- `engine`: `play_episodes` as the loop runs it: the `RowEngine` keeps each row's KV
  cache across turns, refills rows as replies finish, steps the sandbox while it decodes;
- `paged`: the same with the engine's paged KV cache (`kv_cache="paged"`, `--page_size`
  slots a page): pages instead of resized rows, decode chunks over the active rows only;
- `lockstep`: `play_episodes(sample=generate_on_rows)`: every turn one fresh engine call over
  every live episode, each conversation written into the cache from its first token;
- `hf`: the same lock-step driver with transformers' `generate` as the sampler (left-padded
  batch, the conversation re-sent each turn, log-probs from the returned logits): what a
  PyTorch user would write. For `tiny` the bootstrap's weights are copied into a
  `LlamaForCausalLM` (the logits are checked against ours).

Each engine runs in its own subprocess (peak RSS is per engine, loading included). Wall
times leave out compilation (reported apart: the seconds the JAX engines spent building
programs). Throughput counts generated tokens (replies only). Engines sample differently (keys per
episode and turn against keys per call and prompt), so their episodes differ; the table shows the
turns and tokens each played. torch is a test-only dependency (requirements-test.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ENVS = ("shopping", "tallest", "nearest_city", "hidden_rule", "shortest_path", "plant_experiment",
        "number_guess", "grid_walk")


def load_policy(args):
    if args.model == "smollm2":
        from bench.sampler_vs_hf import gguf_path
        from spade_jax.models import load_pretrained

        return load_pretrained(gguf_path(), dtype="float32", progress=False)
    from spade_jax.bootstrap.build import load_bootstrap

    if not args.bootstrap:
        sys.exit("--model=tiny needs --bootstrap=<a finished bootstrap directory> (see configs/tiny.py)")
    return load_bootstrap(args.bootstrap)


def requests(n: int):
    from spade_jax.agent import EpisodeRequest
    from spade_jax.envs import library

    return [EpisodeRequest(i, library.load_source(ENVS[i % len(ENVS)]), 1000 + i) for i in range(n)]


def hf_sampler(policy, cores: int):
    """A `generate_on_rows`-like function backed by transformers (torch, float32) on `policy`'s weights."""
    import numpy as np
    import torch

    from spade_jax.sampling import Generation, GenerationStats

    torch.set_num_threads(cores)
    model = hf_model(policy)
    pad = int(policy.tokenizer.pad_id)
    eos = list(policy.tokenizer.eos_token_ids)

    @torch.no_grad()
    def sample(_, prompts, *, max_new_tokens, temperature, top_p, top_k, seed):
        torch.manual_seed(seed)
        T = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), T), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, T - len(p):] = torch.tensor(p)
            mask[i, T - len(p):] = 1
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                             temperature=temperature or None, top_p=top_p, top_k=top_k or None, eos_token_id=eos,
                             pad_token_id=pad, output_logits=True, return_dict_in_generate=True)
        tokens = out.sequences[:, T:].numpy().astype(np.int32)
        logits = torch.stack(out.logits, 1).float()
        logprobs = torch.log_softmax(logits, -1).gather(-1, out.sequences[:, T:, None])[..., 0].numpy()
        is_stop = np.isin(tokens, eos)
        finished = is_stop.any(1)
        lengths = np.where(finished, is_stop.argmax(1) + 1, tokens.shape[1]).astype(np.int32)
        return Generation(tokens, logprobs.astype(np.float32), lengths, finished,
                          GenerationStats(0.0, 0.0, 0.0, tokens.shape[1], tokens.shape))

    return sample


def hf_model(policy):
    """transformers model with `policy`'s weights: SmolLM2 from its GGUF, tiny copied into a LlamaForCausalLM."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if policy.config.num_params > 50e6:  # SmolLM2
        from bench.sampler_vs_hf import gguf_path

        path = gguf_path()
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                    dtype=torch.float32).eval()
    c = policy.config
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=c.tie_word_embeddings,
    )).eval()
    m = policy.model
    t = lambda x: torch.from_numpy(np.asarray(x[...], np.float32))  # noqa: E731
    weights = {"model.embed_tokens.weight": t(m.embed_VD), "model.norm.weight": t(m.final_norm_D)}
    if not c.tie_word_embeddings:
        weights["lm_head.weight"] = t(m.lm_head_VD)
    for i, layer in enumerate(m.layers):
        p = f"model.layers.{i}."
        a = layer.attn
        weights.update({
            p + "input_layernorm.weight": t(layer.attn_norm_D), p + "post_attention_layernorm.weight": t(layer.mlp_norm_D),
            p + "self_attn.q_proj.weight": t(a.q_NHD).reshape(-1, c.hidden_size),
            p + "self_attn.k_proj.weight": t(a.k_KHD).reshape(-1, c.hidden_size),
            p + "self_attn.v_proj.weight": t(a.v_KHD).reshape(-1, c.hidden_size),
            p + "self_attn.o_proj.weight": t(a.o_DNH).reshape(c.hidden_size, -1),
            p + "mlp.gate_proj.weight": t(layer.mlp.gate_FD), p + "mlp.up_proj.weight": t(layer.mlp.up_FD),
            p + "mlp.down_proj.weight": t(layer.mlp.down_DF),
        })
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or [k for k in missing if "rotary" not in k and not (c.tie_word_embeddings and "lm_head" in k)]:
        raise RuntimeError(f"weight copy mismatch: missing {missing}, unexpected {unexpected}")
    ids = np.arange(1, 33, dtype=np.int64)[None] % c.vocab_size
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids)).logits.numpy()
    diff = float(np.abs(policy.logits(ids.astype(np.int32)) - theirs).max())
    if diff > 1e-3:
        raise RuntimeError(f"the transformers copy disagrees with the policy: max logit difference {diff}")
    return model


# ----------------------------------------------------------------------- child


def child(args) -> None:
    if args.engine != "hf":
        sys.modules["torch"] = None  # keep torch out of the JAX engines' memory
    from spade_jax.agent import AgentConfig, play_episodes
    from spade_jax.agent.rollout import RolloutStats
    from spade_jax.sampling import generate_on_rows
    from spade_jax.sandbox import SandboxConfig, SandboxPool

    policy = load_policy(args)
    cfg = AgentConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, context_budget=args.context,
                      temperature=args.temperature, rows=args.rows, refill_fraction=args.refill_fraction,
                      overlap_sandbox=args.overlap, kv_cache="paged" if args.engine == "paged" else "contiguous",
                      page_size=args.page_size, every_play_counts=not args.end_at_cut)
    sample = {"engine": None, "paged": None, "lockstep": generate_on_rows,
              "hf": hf_sampler(policy, args.cores) if args.engine == "hf" else None}[args.engine]
    reqs = requests(args.episodes)
    compile_s = 0.0

    def counted(policy, prompts, **kw):
        nonlocal compile_s
        generation = sample(policy, prompts, **kw)
        compile_s += generation.stats.compile_s
        return generation

    stats = RolloutStats()
    with SandboxPool(SandboxConfig(num_workers=2)) as pool:
        start = time.perf_counter()
        trajectories = play_episodes(policy, pool, reqs, cfg, seed=args.seed, sample=counted if sample else None,
                                     stats=stats)
        wall = time.perf_counter() - start
    if sample is None:
        compile_s = stats.engine.compile_s
    generated = sum(int(t.loss_mask.sum()) for t in trajectories)
    turns = [t.turns for t in trajectories]
    print(json.dumps(dict(
        engine=args.engine, wall_s=wall - compile_s, compile_s=compile_s, episodes=len(trajectories),
        generated_tokens=generated,
        turns_mean=sum(turns) / len(turns), turns_min=min(turns), turns_max=max(turns),
        context_tokens=sum(len(t.tokens) for t in trajectories),
        engine_stats={k: v for k, v in vars(stats.engine).items() if k != "compiled"} if sample is None else None,
        device_busy=stats.device_busy_fraction if sample is None else None,
        sandbox_wait_s=stats.sandbox_wait_s if sample is None else None,
        chunks=stats.engine.chunks if sample is None else None,
        compiled=dict(stats.engine.compiled) if sample is None else None,
        end_reasons={r: sum(t.end_reason == r for t in trajectories) for r in {t.end_reason for t in trajectories}},
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )))


# ----------------------------------------------------------------------- parent


def main() -> None:
    from spade_jax.agent import AgentConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--bootstrap", help="tiny: a finished bootstrap directory")
    parser.add_argument("--engines", default="engine,lockstep,hf")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--rows", type=int, default=32, help="engine rows (concurrent episodes)")
    parser.add_argument("--refill_fraction", type=float, default=AgentConfig.refill_fraction)
    parser.add_argument("--overlap", action="store_true", default=AgentConfig.overlap_sandbox,
                        help="engine: step the sandbox while the next chunk decodes")
    parser.add_argument("--page_size", type=int, default=AgentConfig.page_size, help="paged: slots per page")
    parser.add_argument("--max_turns", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--end_at_cut", action="store_true",
                        help="end an episode at a reply cut at --max_new_tokens (the loop's default), as the reference does")
    parser.add_argument("--context", type=int, default=2048, help="context budget per episode")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--engine", help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args()
    if args.engine:
        child(args)
        return

    results = []
    for engine in args.engines.split(","):
        argv = [a for a in sys.argv[1:] if not a.startswith("--engines")]
        command = [sys.executable, __file__, *argv, f"--engine={engine}"]
        print(f"[{engine}] {' '.join(command[1:])}", file=sys.stderr, flush=True)
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        if done.returncode:
            sys.exit(f"{engine} failed:\n{done.stderr[-4000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    by = {r["engine"]: r for r in results}
    print(f"\n{args.model}: {args.episodes} episodes, up to {args.max_turns} turns, replies <= {args.max_new_tokens} "
          f"tokens at temperature {args.temperature}, {args.cores} cores\n")
    print("| engine | wall s | episodes/s | generated tok/s | turns (mean, min-max) | generated tokens | "
          "compile s | device busy | peak RSS MB | vs lockstep | vs hf |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        rate = r["generated_tokens"] / r["wall_s"]
        ratio = lambda other: f"{rate / (by[other]['generated_tokens'] / by[other]['wall_s']):.2f}x" if other in by else "-"  # noqa: E731
        busy = f"{r['device_busy']:.0%}" if r["device_busy"] is not None else "-"
        print(f"| {r['engine']} | {r['wall_s']:.1f} | {r['episodes'] / r['wall_s']:.2f} | {rate:.0f} | "
              f"{r['turns_mean']:.1f} ({r['turns_min']}-{r['turns_max']}) | {r['generated_tokens']} | "
              f"{r['compile_s']:.0f} | {busy} | {r['peak_rss_mb']:.0f} | {ratio('lockstep')} | {ratio('hf')} |")
    for r in results:
        print(f"{r['engine']}: end reasons {r['end_reasons']}" + (f"; compiled {r['compiled']}; sandbox wait "
                                                                  f"{r['sandbox_wait_s']:.2f}s; {r['engine_stats']}"
                                                                  if r["compiled"] else ""))
    if args.out:
        Path(args.out).write_text(json.dumps(dict(args=vars(args), results=results), indent=1))


if __name__ == "__main__":
    main()
