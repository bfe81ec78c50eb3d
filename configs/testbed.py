"""The testbed: task families a small policy trained from scratch on this CPU can learn, one knob each.

    python -m spade_jax.main --config=configs/testbed.py --workdir=workdirs/testbed
    python -m spade_jax.main --config=configs/testbed.py:runlocal --workdir=/tmp/testbed_smoke
    python -m experiments.ladder.sanity --preset testbed --rung 1 --load CACHE_DIR --out DIR   # rung 1: agent RL alone

The `tiny` preset with the testbed families (`spade_jax/envs/library/testbed/`: bisect,
code_lock, carry_add, sort_list, letter_count) in place of the seed library: its bootstrap
(`spade_jax/bootstrap/testbed.py`) renders them for the designer and plays their solutions for
the agent over the whole trained range of each family's knob, most transcripts at the easy end
(`knob_decay`), so the initial agent wins the easy end and rarely the hard end; the designer's
skills are those the families cover; the agent's conversation opens with the observation, no
system turn, as its transcripts do. Everything else is `tiny`'s (configs/tiny.py).

Left to the run (not built here): the loop seeds its memory from the seed library only, so
`memory.seed_library` is off; hints are the `solution` mode (the bootstrap's hinted transcripts
show the plan), since the rule-derived `strategy` hints cover the seed library's families only.

`runlocal` swaps in a minute-sized bootstrap and a few short episodes, as `tiny`'s does.
"""

import dataclasses

from configs import tiny
from spade_jax.bootstrap import BootstrapConfig
from spade_jax.envs.library import testbed
from spade_jax.selfplay.config import parse_arg, section

FAMILIES = tuple(env.name for env in testbed.TESTBED_ENVS)
# The bootstrap: every family over its trained knob values, transcripts concentrated at the easy end.
TESTBED_BOOTSTRAP = dict(
    families="testbed", envs=FAMILIES, transcripts=3000, knob_decay=0.1, agent_max_turns=12, steps=500,
    rows=4, micro_batch_rows=2, row_length=1024,
)
RUNLOCAL_BOOTSTRAP = dict(tiny.RUNLOCAL_BOOTSTRAP, families="testbed", envs=FAMILIES, transcripts=2, knob_decay=0.1,
                          num_programs=len(FAMILIES) * 3)


def get_config(arg=None):
    arg = parse_arg(arg, runlocal=False)
    c = tiny.get_config("runlocal" if arg.runlocal else None)
    boot = BootstrapConfig(**(RUNLOCAL_BOOTSTRAP if arg.runlocal else TESTBED_BOOTSTRAP))
    with c.unlocked():
        c.bootstrap = section(BootstrapConfig, exclude=("prompt",), cache_dir="",
                              **{k: v for k, v in dataclasses.asdict(boot).items() if k != "prompt"})
    c.designer.skills = boot.skills
    c.agent.system_prompt = ""  # the bootstrap's transcripts open with the observation
    c.memory.seed_library = False
    c.memory.heldout = ()
    c.hints.mode = "solution"
    c.eval.suites = "envs:" + ",".join(str(testbed.source_path(name)) for name in FAMILIES)
    if not arg.runlocal:
        c.agent.max_turns = boot.agent_max_turns
        c.agent.max_new_tokens = 64
    return c
