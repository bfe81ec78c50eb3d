"""The bootstrap: a small policy trained from scratch on this CPU before self-play.

`data` turns the seed library into training examples (designer prompts answered with
structural variants of seed programs, from `variants`; solution transcripts played in the
sandbox); `build` trains a SentencePiece tokenizer and a small Llama on them with the RL
`Trainer` (objective "nll") and caches the result under a key of everything it depends on.
`testbed` does the same for the testbed families (`envs.library.testbed`), with transcripts
drawn over their knob; its `BootstrapConfig` (exported here) is `build`'s plus the fields that
choose it, and `bootstrap_policy`/`cache_key`/`cache_path` here serve both.
Training-data tooling lives here, not in `envs.library`, which sandbox workers import.
"""

from spade_jax.bootstrap.build import BOOTSTRAP_VERSION, BootstrapError, bootstrap_stats, load_bootstrap
from spade_jax.bootstrap.testbed import BootstrapConfig, bootstrap_policy, cache_key, cache_path

__all__ = ["BOOTSTRAP_VERSION", "BootstrapConfig", "BootstrapError", "bootstrap_policy", "bootstrap_stats",
           "cache_key", "cache_path", "load_bootstrap"]
