"""spade_jax: SPADE self-play (environment designer + reasoning agent) in JAX.

This top-level package imports nothing heavy: `spade_jax.envs` and `spade_jax.sandbox`
must stay importable in JAX-free sandbox processes.
"""

__version__ = "0.1.0"
