"""Tool-use trajectory synthesis (EnvFactory-style) from verified tool environments.

For each tool-use program: a tool dependency graph from its schemas and from probing in the
sandbox (`graph`), seeded topology-aware chains of concrete calls executed in the sandbox
(`chains`), a user query per chain written by the policy and kept only when it does not
spell the calls out and the agent (or, flagged, the replayed reference chain) reaches the
chain's end state (`queries`), exported as chat-format SFT JSONL and RL tasks with a checker
(`export`). `synth` runs the stages over many programs; ``python -m spade_jax.related.trajectories``
is the command. The trusted side reads programs only with ``ast`` (`schemas`: JSON literals of
the class the sandbox runs, bounded); they run in the sandbox. Everything taken from a program is
bounded and escaped (`limits`), and a program's failure is its rejection with a reason, never
the run's.
"""

from spade_jax.related.trajectories.chains import Call, Chain, ChainConfig, EndState, reaches_end_state, sample_chains
from spade_jax.related.trajectories.export import Example, rl_task, score_transcript, sft_record
from spade_jax.related.trajectories.graph import Edge, ToolGraph, ToolProbe, probe_graph
from spade_jax.related.trajectories.queries import QueryConfig, verify_queries, spelled_out, write_queries
from spade_jax.related.trajectories.schemas import NotToolUse, ProgramRejected, read_tool_schemas
from spade_jax.related.trajectories.synth import EnvReport, SynthConfig, load_programs, summary_table, synthesize

__all__ = ["Call", "Chain", "ChainConfig", "Edge", "EndState", "EnvReport", "Example", "NotToolUse", "ProgramRejected",
           "QueryConfig", "SynthConfig", "ToolGraph", "ToolProbe", "verify_queries", "load_programs", "probe_graph", "reaches_end_state",
           "read_tool_schemas", "rl_task", "sample_chains", "score_transcript", "sft_record", "spelled_out",
           "summary_table", "synthesize", "write_queries"]
