"""Qwen3-0.6B (dense) self-play. Weights from a local Hugging Face directory you provide.

    python -m spade_jax.main --config=configs/qwen3_0p6b.py --workdir=workdirs/qwen3_0p6b \
        --config.model.path=/data/models/Qwen3-0.6B
    # TPU pod (weights copied from a bucket to each worker's disk by the launcher):
    bash launch/tpu_pod.sh --name=spade-v4 --zone=us-central2-b --accelerator=v4-8 \
        --model_bucket=gs://my-bucket/Qwen3-0.6B -- --config=configs/qwen3_0p6b.py

Mesh (data, fsdp, tensor): one GPU (1, 1, 1); 8 GPUs (8, 1, 1); TPU v4-8 = 4 chips (4, 1, 1);
v5e-16 (2, 8, 1) with --config.rl.micro_batch_rows=16 (a multiple of data x fsdp). The 0.6B
model fits replicated everywhere; use fsdp for optimizer memory. Compiled for v4-8 ahead of
time (bench/aot_tpu.py): the update peaks at 20.7 GiB of 32 per chip with whole layers
recomputed; keeping the matmul outputs ("dots") needs 31.1 GiB, more than the 30.75 a v4 chip gives.
"""

from spade_jax.selfplay.config import base_config, parse_arg


def get_config(arg=None):
    arg = parse_arg(arg, runlocal=False)
    c = base_config()
    c.num_iterations = 200
    c.model.dtype = "bfloat16"
    c.designer.num_slots = 64
    c.designer.max_new_tokens = 4096
    c.agent.max_new_tokens = 1024
    c.agent.context_budget = 8192
    c.rl.row_length = 8192
    c.rl.micro_batch_rows = 8
    c.rl.remat = "full"
    c.sandbox.num_workers = 16
    if arg.runlocal:
        c.model.dtype = "float32"
        c.num_iterations = 1
        c.designer.num_slots = 2
        c.designer.skills_per_regeneration = 1  # one group of two designs
        c.designer.max_new_tokens = 64
        c.agent.episodes_per_env = 2
        c.agent.hinted_episodes_per_env = 2
        c.agent.max_new_tokens = 32
        c.agent.context_budget = 1024
        c.rl.row_length = 2048
        c.rl.micro_batch_rows = 0
        c.sandbox.num_workers = 2
    return c
