"""The reasoning agent: batched multi-turn episodes in the sandbox, action parsing, and the
privileged hints (written by the policy or taken from `solution()`) that regret is measured with."""

from spade_jax.agent.actions import parse_action
from spade_jax.agent.hints import HINT_MODES, HintConfig, clean_hint, matched_requests, write_hints
from spade_jax.agent.rollout import AgentConfig, EpisodeRequest, Trajectory, play_episodes, solution_hint
