"""Sampling from the policy: prompts (token ids) in, continuations and their log-probs out.

- `sampler`: `generate`, the batched sampler: prompts left-padded into power-of-two
  shape buckets, one jitted prefill, then an in-graph `lax.while_loop` decode over a
  donated KV cache; returns a `Generation` (tokens, log-probs under the unmodified
  policy, lengths, which rows stopped) and its `GenerationStats`.
- `batching`: the host-side bucket sizes and left-padded prompt arrays.
- `tokens`: next-token selection inside the loop (greedy, temperature, top-k, top-p)
  and the chosen tokens' log-probs.
- `host_memory`: hands freed KV-cache memory back to the OS after a call on CPU.
- `memory_plan`: per-device memory of a preset's update and sampler, counted from shapes
  (`python -m spade_jax.sampling.memory_plan --config=...`), and the presets' published shapes.
- `engine`: `RowEngine`, decode rows that keep their KV cache between calls (a turn
  appends only its new tokens), finish and refill independently; the agent's episodes
  (`agent.rollout.play_episodes`) run on it, and `generate_on_rows` gives `generate`'s
  contract on it.
- `paged_cache`, `paged_attention`: the engine's paged KV cache (`kv_cache="paged"`): page
  pools, per-row page tables, and attention through them (an XLA gather path, or JAX's
  ragged paged attention kernel on TPU).
- `chat`: `complete_chats`, chats to decoded replies (chat template, `generate_on_rows`,
  decode); the designer, the hint writer and the self-review ask through it.

Shape suffixes follow the legend in `spade_jax.models`.
"""

from spade_jax.sampling.sampler import Generation, GenerationStats, generate
from spade_jax.sampling.engine import EngineStats, RowEngine, generate_on_rows
