"""Sampling from the policy: prompts (token ids) in, continuations and their log-probs out.

- `engine`: `RowEngine`, decode rows that keep their KV cache between calls (a turn
  appends only its new tokens), finish and refill independently; the agent's episodes
  (`agent.rollout.play_episodes`) and the server run on it. `generate_on_rows`, one reply per
  prompt on an engine, returns a `Generation` (tokens, log-probs under the unmodified policy,
  lengths, which rows stopped) and its `GenerationStats`; the demo and the benchmarks call it.
- `paged_cache`, `paged_attention`: the engine's paged KV cache (`kv_cache="paged"`): page
  pools, per-row page tables, and attention through them (an XLA gather path, or JAX's
  ragged paged attention kernel on TPU).
- `chat`: `complete_chats`, chats to decoded replies (chat template, `generate_on_rows`,
  decode); the designer, the hint writer and the self-review ask through it.
- `batching`: shape buckets (powers of two).
- `tokens`: next-token selection inside the decode loop (greedy, temperature, top-k, top-p)
  and the chosen tokens' log-probs.
- `host_memory`: hands freed KV-cache memory back to the OS on CPU.
- `memory_plan`: per-device memory of a preset's update and sampler, counted from shapes
  (`python -m spade_jax.sampling.memory_plan --config=...`), and the presets' published shapes.

Shape suffixes follow the legend in `spade_jax.models`.
"""

from spade_jax.sampling.engine import EngineStats, Generation, GenerationStats, RowEngine, generate_on_rows
