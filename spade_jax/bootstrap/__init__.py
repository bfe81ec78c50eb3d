"""The tiny preset's bootstrap: a small policy trained from scratch on this CPU before self-play.

`data` turns the seed library into training examples (designer prompts answered with
structural variants of seed programs, from `variants`; solution transcripts played in the
sandbox); `build` trains a SentencePiece tokenizer and a small Llama on them with the RL
`Trainer` (objective "nll") and caches the result under a key of everything it depends on.
Training-data tooling lives here, not in `envs.library`, which sandbox workers import.
"""

from spade_jax.bootstrap.build import (BOOTSTRAP_VERSION, BootstrapConfig, BootstrapError, bootstrap_policy,
                                       bootstrap_stats, cache_key, cache_path, load_bootstrap)

__all__ = ["BOOTSTRAP_VERSION", "BootstrapConfig", "BootstrapError", "bootstrap_policy", "bootstrap_stats",
           "cache_key", "cache_path", "load_bootstrap"]
