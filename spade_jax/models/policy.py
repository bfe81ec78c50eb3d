"""`Policy`: the NNX model, its config, its tokenizer and where it lives on the mesh."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spade_jax.models.config import ModelConfig
from spade_jax.models.sharding import TRAIN_RULES, Rules, activation_sharding, make_mesh, param_shardings
from spade_jax.models.transformer import Transformer, at_least_float32


@dataclasses.dataclass
class Policy:
    """The one LLM policy both roles share."""

    model: Transformer
    config: ModelConfig
    tokenizer: Any  # spade_jax.models.tokenizer.Tokenizer, or None for token-level tests
    mesh: Mesh
    rules: Rules = TRAIN_RULES

    def logits(
        self,
        tokens_BT: np.ndarray,
        segment_ids_BT: np.ndarray | None = None,
        positions_BT: np.ndarray | None = None,
    ) -> np.ndarray:
        """Logits `(B, T, V)` in float32 (float64 for a float64 model), for tests and tools.

        Rows are unpadded by default; with `segment_ids_BT` (0 = padding) positions
        default to each token's index within its segment.
        """
        tokens_BT = np.asarray(tokens_BT, np.int32)
        segments_BT = (
            np.ones(tokens_BT.shape, np.int32)
            if segment_ids_BT is None
            else np.asarray(segment_ids_BT, np.int32)
        )
        if positions_BT is None:
            positions_BT = segment_positions(segments_BT)
        positions_BT = np.asarray(positions_BT, np.int32)
        graphdef, state = nnx.split(self.model)
        batch = NamedSharding(self.mesh, PartitionSpec())
        args = [jax.device_put(a, batch) for a in (tokens_BT, positions_BT, segments_BT)]
        return np.asarray(_forward(graphdef, state, *args, mesh=self.mesh, rules=self.rules))


def segment_positions(segment_ids_BT: np.ndarray) -> np.ndarray:
    """Index of each token within its segment (a run of equal ids); 0 for padding (id 0)."""
    segment_ids_BT = np.asarray(segment_ids_BT)
    B, T = segment_ids_BT.shape
    t_BT = np.broadcast_to(np.arange(T), (B, T))
    starts_BT = np.ones((B, T), bool)
    starts_BT[:, 1:] = segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]
    start_index_BT = np.maximum.accumulate(np.where(starts_BT, t_BT, 0), axis=1)
    return np.where(segment_ids_BT != 0, t_BT - start_index_BT, 0).astype(np.int32)


@jax.jit(static_argnames=("graphdef", "mesh", "rules"))
def _forward(graphdef, state, tokens_BT, positions_BT, segments_BT, *, mesh, rules):
    model = nnx.merge(graphdef, state)
    with activation_sharding(mesh, rules):
        logits_BTV, _ = model(tokens_BT, positions_BT, segments_BT)
    return logits_BTV.astype(at_least_float32(logits_BTV.dtype))


def abstract_model(config: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """Graph and shape-only state of a model, without allocating parameters."""
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    return nnx.split(abstract)


def init_model(
    config: ModelConfig, *, seed: int = 0, mesh: Mesh | None = None, rules: Rules = TRAIN_RULES
) -> Transformer:
    """A randomly initialised model whose parameters are created directly on their shardings."""
    mesh = mesh or make_mesh((1, 1, 1), jax.devices()[:1])
    graphdef, abstract_state = abstract_model(config)
    shardings = nnx.to_pure_dict(param_shardings(abstract_state, mesh, rules))

    @jax.jit(out_shardings=shardings)
    def init():
        return nnx.to_pure_dict(nnx.state(Transformer(config, rngs=nnx.Rngs(seed))))

    state = abstract_state
    nnx.replace_by_pure_dict(state, init())
    return nnx.merge(graphdef, state)


def random_policy(
    config: ModelConfig,
    tokenizer: Any = None,
    *,
    seed: int = 0,
    mesh: Mesh | None = None,
    rules: Rules = TRAIN_RULES,
) -> Policy:
    """A `Policy` with random weights (tests, from-scratch training)."""
    mesh = mesh or make_mesh((1, 1, 1), jax.devices()[:1])
    return Policy(init_model(config, seed=seed, mesh=mesh, rules=rules), config, tokenizer, mesh, rules)
