"""The policy network: Flax NNX decoder (Llama / Qwen3), sharding rules, checkpoint import, tokenizer."""

from spade_jax.models.config import SUPPORTED_ARCHITECTURES, ModelConfig
from spade_jax.models.sharding import TRAIN_RULES, activation_sharding, make_mesh
from spade_jax.models.transformer import KVCache, Transformer
from spade_jax.models.policy import Policy, abstract_model, init_model, random_policy
from spade_jax.models.loading import CheckpointError, load_pretrained
from spade_jax.models.tokenizer import HFTokenizer, SentencePieceTokenizer, Tokenizer
