"""Optional self-review of admitted environments (as EvoEnv and the reference's validator).

The policy reads an environment's source and one episode the agent played in it and
answers yes or no: is the environment correct, solvable and sensibly rewarded? Only a
reply that starts with "yes" keeps the environment. One batched sampler call reviews
every new environment of an iteration. Off by default (`designer.self_review`).

The source and the transcript are model- and environment-written, so both enter the
prompt through `conversation.prompt_text` (clean Unicode, the tokenizer's special-token
strings escaped): neither can end the user turn and answer "yes" for the policy.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from spade_jax.agent.conversation import prompt_text
from spade_jax.sampling.chat import complete_chats
from spade_jax.text import clean_text

REVIEW_SYSTEM_PROMPT = "You check training environments for a reasoning agent."
REVIEW_INSTRUCTIONS = (
    "Environment source:\n```python\n{code}\n```\n\nOne episode an agent played in it:\n{transcript}\n\n"
    "Is this environment correct, solvable and sensibly rewarded? Answer yes or no."
)


def render_transcript(messages: Sequence[dict], max_chars: int) -> str:
    """The non-system turns of an episode as `role: content` lines (cleaned: `clean_text`), cut to `max_chars`."""
    text = clean_text("\n".join(f"{m['role']}: {m['content']}" for m in messages if m["role"] != "system"))
    return text if len(text) <= max_chars else text[:max_chars] + "\n[... cut]"


def accepts(reply: str) -> bool:
    return reply.strip().lower().startswith("yes")


@dataclasses.dataclass(frozen=True)
class ReviewConfig:
    """Greedy replies of up to `max_new_tokens`; the prompt shows at most `max_code_chars` of the
    source and `max_transcript_chars` of the episode."""

    max_new_tokens: int = 8
    max_code_chars: int = 6000
    max_transcript_chars: int = 2000


def rejection_reason(reply: str) -> str:
    """The admission reason recorded for an environment the self-review rejected."""
    return f"the policy judged it broken: {reply!r}"


def review(policy, programs: Sequence[str], transcripts: Sequence[Sequence[dict]], cfg: ReviewConfig = ReviewConfig(),
           *, seed: int = 0) -> list[tuple[bool, str]]:
    """`(kept, reply)` for each program, judged by the policy (greedy)."""
    tokenizer = policy.tokenizer
    chats = [
        [
            {"role": "system", "content": REVIEW_SYSTEM_PROMPT},
            {
                "role": "user",
                "content": REVIEW_INSTRUCTIONS.format(
                    code=prompt_text(tokenizer, code[: cfg.max_code_chars]),
                    transcript=prompt_text(tokenizer, render_transcript(messages, cfg.max_transcript_chars)),
                ),
            },
        ]
        for code, messages in zip(programs, transcripts)
    ]
    completions = complete_chats(policy, chats, max_new_tokens=cfg.max_new_tokens, temperature=0.0, seed=seed)
    return [(accepts(c.text), c.text.strip()) for c in completions]
