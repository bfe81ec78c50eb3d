"""In-graph batched sampler: jitted prefill + `lax.while_loop` decode over a donated KV cache."""

from spade_jax.sampling.sampler import Generation, GenerationStats, generate
