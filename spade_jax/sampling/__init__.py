"""Sampling from the policy: prompts (token ids) in, continuations and their log-probs out.

- `sampler`: `generate`, the batched sampler: prompts left-padded into power-of-two
  shape buckets, one jitted prefill, then an in-graph `lax.while_loop` decode over a
  donated KV cache; returns a `Generation` (tokens, log-probs under the unmodified
  policy, lengths, which rows stopped) and its `GenerationStats`.
- `batching`: the host-side bucket sizes and left-padded prompt arrays.
- `tokens`: next-token selection inside the loop (greedy, temperature, top-k, top-p)
  and the chosen tokens' log-probs.
- `host_memory`: hands freed KV-cache memory back to the OS after a call on CPU.
- `chat`: `complete_chats`, chats to decoded replies (chat template, one `generate`
  call, decode); the designer, the hint writer and the self-review ask through it.

Shape suffixes follow the legend in `spade_jax.models`.
"""

from spade_jax.sampling.sampler import Generation, GenerationStats, generate
