"""A trained policy out of the project: a Hugging Face model directory (`python -m spade_jax.export`).

- `hf`: `export_hf(policy, out_dir)`, the model as `config.json`, safetensors shards (float32 or
  bfloat16) with their index and `generation_config.json`, gathered one parameter at a time;
  `hf_config`, the `config.json` of a `ModelConfig`.
- `tokenizer_files`: `save_tokenizer`, the policy's tokenizer and chat template as files
  `AutoTokenizer.from_pretrained` loads.
- `__main__`: the command line, a run's checkpoint (`--workdir`, `--step`) or a preset's base
  weights (`--config`).

The directory loads with `load_pretrained` back into bit-identical float32 parameters.
"""

from spade_jax.export.hf import (DEFAULT_MAX_SHARD_BYTES, EXPORT_DTYPES, ExportError, ExportResult, check_destination,
                                export_hf, hf_config)

__all__ = ["DEFAULT_MAX_SHARD_BYTES", "EXPORT_DTYPES", "ExportError", "ExportResult", "check_destination", "export_hf",
           "hf_config"]
