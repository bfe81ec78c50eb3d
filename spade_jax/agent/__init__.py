"""The reasoning agent: batched multi-turn episodes, action parsing, hints."""

from spade_jax.agent.actions import parse_action
from spade_jax.agent.hints import HINT_MODES, HintConfig, clean_hint, write_hints
from spade_jax.agent.rollout import AgentConfig, EpisodeRequest, Trajectory, play_episodes, solution_hint
