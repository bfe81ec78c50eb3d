"""The environment contract, the `ToolUseEnv` base and the seed environment library.

Standard library only: sandbox workers import this package.
"""

from spade_jax.envs.contract import PARTIAL_CREDIT_SCALE, SUCCESS_REWARD, extract_boxed, is_success
from spade_jax.envs.tool_use import ToolUseEnv, normalize_answer

__all__ = ["PARTIAL_CREDIT_SCALE", "SUCCESS_REWARD", "ToolUseEnv", "extract_boxed", "is_success", "normalize_answer"]
