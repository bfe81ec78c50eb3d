"""The policy network: the decoder both roles sample from and train, where its weights live, how it is loaded.

- `config`: `ModelConfig`, the hyper-parameters of the supported decoder families
  (Llama / SmolLM2, Qwen3 dense, Qwen3-MoE), read from a Hugging Face `config.json` or GGUF metadata.
- `transformer`: the Flax NNX decoder (`Transformer`) and its `KVCache`. One call
  serves training and scoring (no cache, layers under `lax.scan`) and sampling
  (prefill and decode over a cache).
- `moe`: Qwen3-MoE's router and its expert dispatch (tokens sorted into per-expert buffers,
  dropless by default, a capacity for large presets; experts sharded over fsdp), and the
  router statistics the update reports.
- `sharding`: logical axis names -> the `(data, fsdp, tensor)` device mesh
  (`TRAIN_RULES`, `make_mesh`), and `constrain` for activations inside jitted code.
- `policy`: `Policy` (model, config, tokenizer, mesh, rules), random initialisation
  straight onto the parameters' shardings, and a plain forward pass for tests and tools.
- `loading`: `load_pretrained`, a safetensors directory or GGUF file -> a placed `Policy`.
- `tokenizer`: the `Tokenizer` interface, its Hugging Face and SentencePiece (ChatML)
  implementations, and the escaping of special-token strings in text put into prompts.

Shape suffixes. An array's name ends in one capital letter per axis, in order, e.g.
`logits_BTV` is `(batch, positions, vocab)` and a weight stored `(out, in)`, as
torch.nn.Linear stores it, reads `q_NHD` (heads, head_dim, embed). The letters:

    B  batch rows (prompts in the sampler, sequences in a forward pass)
    T  positions (tokens) of the current call
    S  key positions attended to: the KV cache's slots, or the sequence itself
       without a cache (`mask_BTS`); in `sampling/engine.py`, `stops_S` is the
       (padded) list of stop-token ids
    V  vocabulary
    D  model width (`hidden_size`, the "embed" axis)
    F  MLP width (`intermediate_size`, the "mlp" axis)
    N  query heads in `models/`; in `sampling/`, new-token positions (the
       `max_new_tokens` bucket: `tokens_BN`, `logprobs_BN`)
    K  key/value heads
    G  query heads per key/value head (N // K), in grouped-query attention
    H  head_dim; H2 is head_dim / 2 (the rotary frequencies)
    E  heads and head_dim flattened (N * H), the input of the output projection
    I  input features of `linear`; O its output features
    R  rows: packed training rows in `rl/` (`tokens_RT`, in the role of B); in
       `linear`, its input's leading axes flattened (`y_OR`); in `moe.py`, the rows of
       the expert dispatch buffer (assignments sorted by expert)
    C  a chunk of positions (the chunked LM head in `rl/train.py`); a lowercase n
       prefix is the number of chunks (`hidden_nRCD`)
    L  layers (the leading axis of per-layer weights as they are drawn or stacked)
    E  experts of a sparse (MoE) layer; `El` the ones a device holds
    P  the experts each token picks (`num_experts_per_tok`) in `moe.py`
    M  a call's tokens flattened (B * T), and A their assignments to experts (M * P), in `moe.py`
    1  an axis of size 1

Local size variables use the same letters (`B, T = tokens_BT.shape`).
"""

from spade_jax.models.config import SUPPORTED_ARCHITECTURES, ModelConfig
from spade_jax.models.sharding import TRAIN_RULES, activation_sharding, make_mesh
from spade_jax.models.transformer import KVCache, Transformer
from spade_jax.models.policy import Policy, abstract_model, init_model, random_policy
from spade_jax.models.loading import CheckpointError, load_pretrained
from spade_jax.models.tokenizer import HFTokenizer, SentencePieceTokenizer, Tokenizer
