"""Qwen3-30B-A3B-Instruct-2507 (MoE: 128 experts, 8 per token) self-play, the reference's tool-use recipe.

    python -m spade_jax.main --config=configs/qwen3_30b_a3b.py --workdir=workdirs/qwen3_30b_a3b \
        --config.model.path=/data/models/Qwen3-30B-A3B-Instruct-2507

Mesh (data, fsdp, tensor). Experts are sharded over fsdp (each device holds 128 / fsdp experts,
their width split over tensor), so fsdp must divide 128; every other weight is sharded over fsdp along embed and
over tensor along heads, MLP and vocab. The default (1, 8, -1) keeps 16 experts per device and
gives the rest of the slice to tensor:
- TPU v5p-64 (32 chips, 95 GiB): (1, 8, 4), the default as is. Compiled for it ahead of time
  (bench/aot_tpu.py): the update peaks at 38.4 GiB per chip, a decode step at 7.1.
- TPU v4-128 (64 chips, 32 GiB): (1, 8, 8) with 8k rows: --config.rl.row_length=8192
  --config.agent.context_budget=8192 --config.designer.max_new_tokens=4096.
- 8x H200 (141 GB): --config.mesh.shape=1,4,2 --config.rl.micro_batch_rows=4.
- 8x H100 (80 GB): as H200 plus --config.model.param_dtype=bfloat16 (f32 master weights,
  Adam moments and the KL reference do not fit beside the update).
The other three come from the memory plan, not from a compile:
`python -m spade_jax.sampling.memory_plan --config=configs/qwen3_30b_a3b.py --devices=N --chip=...`
prints the per-device plan of each (with the same overrides).
"""

from spade_jax.selfplay.config import base_config, parse_arg, reference_recipe


def get_config(arg=None):
    arg = parse_arg(arg, runlocal=False)
    c = base_config()
    c.num_iterations = 200
    c.model.dtype = "bfloat16"
    # Each expert's dispatch buffer holds twice its fair share of a dispatch (at least 64 rows,
    # so decode steps never drop); the update reports `router_dropped`. 0 (dropless) would size
    # every buffer for all assignments: 128x the experts' FLOPs (models/moe.py).
    c.model.moe_capacity_factor = 2.0
    c.mesh.shape = (1, 8, -1)

    # Memory: one 16k row per fsdp rank per micro-batch, whole layers recomputed in the
    # backward pass. The reference trains on 32k contexts; here attention materialises a
    # query block's scores and each device gathers its fsdp group's tokens for the experts,
    # so 16k rows are what the slices above hold with headroom (32k is not compiled).
    c.rl.row_length = 16384
    c.rl.micro_batch_rows = 8
    c.rl.remat = "full"
    c.agent.context_budget = 16384
    c.agent.max_new_tokens = 2048
    c.designer.max_new_tokens = 6144

    # From the reference (docs/DESIGN.md, reference behaviour): KL 0.005 to the initial policy for
    # the 30B tool-use recipe; the schedule and sampling of the published recipe
    # (`reference_recipe`). Adam (lr 1e-6, wd 0.1, betas 0.9/0.98) and the clip range 0.2/0.28
    # are the base config's defaults.
    c.rl.kl_coef = 0.005
    reference_recipe(c)

    c.sandbox.num_workers = 64
    if arg.runlocal:
        c.num_iterations = 1
        c.designer.num_slots = 2
        c.designer.skills_per_regeneration = 1  # one group of two designs
        c.agent.episodes_per_env = 2
        c.agent.hinted_episodes_per_env = 2
    return c
