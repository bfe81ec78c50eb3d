"""The CPU default: a small policy bootstrapped on this machine from the seed library, then self-play.

    bash launch/run_local.sh                                   # this preset, workdir workdirs/tiny
    python -m spade_jax.main --config=configs/tiny.py --workdir=workdirs/tiny
    python -m spade_jax.main --config=configs/tiny.py:runlocal --workdir=/tmp/tiny_smoke

The first run trains the bootstrap (`spade_jax/bootstrap/`: a SentencePiece
tokenizer and a small Llama-family model trained from scratch on renderings of the seed
library and on solution transcripts) and caches it under `bootstrap.cache_dir` (default:
`<workdir>/bootstrap`; point several runs at one directory to train it once). Later runs
load it in seconds. The bootstrap is trained on the designer prompts this config
describes (`designer.prompt`): changing their sizes trains a new bootstrap.

`runlocal` swaps in a minute-sized bootstrap and a few short episodes: a check of the
mechanism (the tests use it), not a policy that writes working programs.

Mesh (data, fsdp, tensor): (-1, 1, 1), every CPU device on the data axis.
"""

import dataclasses

from spade_jax.agent.rollout import AGENT_SYSTEM_PROMPT
from spade_jax.bootstrap import BootstrapConfig
from spade_jax.envs import library
from spade_jax.selfplay.config import base_config, parse_arg, section

# The minute-sized bootstrap of `runlocal`: enough to exercise every stage, not to design.
RUNLOCAL_BOOTSTRAP = dict(
    num_programs=12, agent_seeds=1, vocab_size=768, hidden_size=64, intermediate_size=128, num_layers=1,
    num_heads=2, head_dim=32, steps=8, warmup_steps=2, rows=1, micro_batch_rows=1, row_length=4096, lr=1e-2,
)


def get_config(arg=None):
    arg = parse_arg(arg, runlocal=False)
    boot = BootstrapConfig(**(RUNLOCAL_BOOTSTRAP if arg.runlocal else {}))
    c = base_config()
    c.model.source = "bootstrap"
    # The prompt is the designer's (`designer.prompt`); "" caches under <workdir>/bootstrap.
    with c.unlocked():
        c.bootstrap = section(BootstrapConfig, exclude=("prompt",), cache_dir="",
                              **{k: v for k, v in dataclasses.asdict(boot).items() if k != "prompt"})

    # What the bootstrap was trained for: its prompt sizes, turns, the agent's system prompt and
    # first turn (the observation alone). Its policy cannot write hints from source, so regret
    # is measured with the rule-derived strategy hints (`agent/strategy.py`: strategy and answer
    # format, never an instance's answer); its pretraining transcripts show solution plans
    # (`BootstrapConfig.hint_mode`, whose docstring says why).
    c.designer.prompt.update(dataclasses.asdict(boot.prompt))
    c.agent.max_turns = boot.agent_max_turns
    c.agent.system_prompt = AGENT_SYSTEM_PROMPT
    c.agent.user_template = "{observation}"
    c.hints.mode = "strategy"
    # Novelty against memory rejects only exact repeats (same shape, same constants): the bootstrap's
    # repertoire is its training renderings, so at a lower threshold its admission collapses after
    # the first design round, from near-repeats of earlier designs (experiments/bootstrap/designer_repeats.py).
    # The reference has no novelty stage at all.
    c.admission.novelty_threshold = 1.0

    c.designer.max_new_tokens = 400
    c.designer.temperature = 0.5
    c.admission.num_seeds = 2
    c.agent.max_new_tokens = 48
    c.agent.context_budget = 1024
    c.agent.replay_envs = 2
    # Design every 2 iterations and train a design 2 iterations later on the plays of both
    # iterations of its pool (the reference's recipe regenerates every 4 and delays by 4: with 10
    # iterations that is 3 designs);
    # two updates per batch so the PPO ratio moves; lr 1e-4, large enough to move a small model
    # trained from scratch within ten iterations (1e-5 does not).
    c.designer.regeneration_period = 2
    c.designer.reward_delay = 2
    c.rl.lr = 1e-4
    c.rl.updates_per_iteration = 2
    c.rl.weight_decay = 0.0
    c.rl.row_length = 1024
    c.rl.micro_batch_rows = 8  # bounds activation memory; divisible by 1, 2, 4 and 8 devices

    # Held out: the seed programs the bootstrap does not render stay out of memory (never replayed,
    # never a novelty reference) and are scored, greedy, every 5 iterations.
    c.memory.heldout = tuple(env.name for env in library.SEED_ENVS if env.name not in boot.envs)
    c.eval.suites = "envs:" + ",".join(str(library.source_path(name)) for name in c.memory.heldout)
    c.eval.every = 5

    if arg.runlocal:
        c.num_iterations = 2
        c.designer.num_slots = 2
        c.designer.skills_per_regeneration = 1  # one group of two designs
        c.designer.max_new_tokens = 48
        c.agent.episodes_per_env = 2
        c.agent.hinted_episodes_per_env = 2
        c.agent.max_turns = 2
        c.agent.max_new_tokens = 12
        c.agent.context_budget = 768
        c.agent.replay_envs = 1
        c.designer.regeneration_period = 1
        c.designer.reward_delay = 0  # the reference's default: a design trained in its own iteration
        c.rl.updates_per_iteration = 1
        c.rl.row_length = 2048
        c.rl.micro_batch_rows = 0
        c.log.progress = False
        c.eval.every = 0
    return c
