"""SmolLM2-135M-Instruct, the pip-packaged GGUF, playing both roles.

    python -m spade_jax.main --config=configs/smollm2_135m.py --workdir=workdirs/smollm2
    python -m spade_jax.main --config=configs/smollm2_135m.py:runlocal --workdir=/tmp/smollm2_smoke

A real pretrained instruct model, but a small one: it rarely writes a program that passes
admission, so expect most designer rewards to be the failure penalty. Use it to exercise the pipeline with real weights; `tiny` is the CPU default
that actually designs and plays.

Mesh (data, fsdp, tensor): CPU (-1, 1, 1); one GPU (1, 1, 1); 8 GPUs (8, 1, 1).
"""

from spade_jax.selfplay.config import base_config, parse_arg


def get_config(arg=None):
    arg = parse_arg(arg, runlocal=False)
    c = base_config()
    c.num_iterations = 20
    c.model.path = "packaged"
    c.designer.prompt.doc_max_words = 300
    c.designer.max_new_tokens = 1024
    c.designer.temperature = 0.7
    c.agent.episodes_per_env = 8
    c.agent.max_new_tokens = 256
    c.agent.context_budget = 2048
    c.rl.row_length = 3072
    if arg.runlocal:
        c.num_iterations = 2
        c.designer.num_slots = 2
        c.designer.skills_per_regeneration = 1  # one group of two designs
        c.designer.max_new_tokens = 128
        c.agent.episodes_per_env = 2
        c.agent.hinted_episodes_per_env = 2
        c.agent.max_turns = 2
        c.agent.max_new_tokens = 32
        c.agent.context_budget = 1024
        c.rl.row_length = 2048
    return c
