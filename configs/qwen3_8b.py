"""Qwen3-8B (dense) self-play.

    python -m spade_jax.main --config=configs/qwen3_8b.py --workdir=workdirs/qwen3_8b \
        --config.model.path=/data/models/Qwen3-8B

Mesh (data, fsdp, tensor): 8x H100/H200 (1, 8, 1) or (1, 4, 2); TPU v4-64 = 32 chips
(1, 8, 4); v5p-64 (1, 8, 4). bf16 activations, f32 master weights; rl.micro_batch_rows must
be a multiple of data x fsdp. Compiled for v4-64 ahead of time (bench/aot_tpu.py): the update
peaks at 18.0 GiB of 32 per chip with whole layers recomputed; (2, 16, 1) needs 40 GiB.
"""

from spade_jax.selfplay.config import base_config, parse_arg, reference_recipe


def get_config(arg=None):
    arg = parse_arg(arg, runlocal=False)
    c = reference_recipe(base_config())  # the published recipe's schedule and sampling
    c.num_iterations = 200
    c.model.dtype = "bfloat16"
    c.mesh.shape = (1, -1, 1)
    c.designer.num_slots = 128
    c.designer.max_new_tokens = 6144
    c.agent.max_new_tokens = 2048
    c.agent.context_budget = 16384
    c.rl.row_length = 16384
    c.rl.micro_batch_rows = 8
    c.rl.remat = "full"
    c.sandbox.num_workers = 64
    if arg.runlocal:
        c.num_iterations = 1
        c.designer.num_slots = 2
        c.designer.skills_per_regeneration = 1  # one group of two designs
        c.agent.episodes_per_env = 2
        c.agent.hinted_episodes_per_env = 2
    return c
