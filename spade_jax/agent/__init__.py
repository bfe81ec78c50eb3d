"""The reasoning agent: batched multi-turn episodes in the sandbox, action parsing, and the
privileged hints (written by the policy or taken from `solution()`) that regret is measured with."""

from spade_jax.agent.hints import HintConfig, matched_requests, write_hints
from spade_jax.agent.rollout import AgentConfig, EpisodeRequest, Trajectory, play_episodes
