"""The environment designer: what it reads, how it is prompted, and how its programs are sampled.

- `corpus`: reference documents (local files or TFDS array_record datasets) sampled in a
  resumable order; `corpus_builder` turns local files into such a dataset.
- `memory`: `EnvironmentMemory`, the bounded archive of admitted environments with their
  measured statistics; it supplies the exemplars of designer prompts.
- `prompts`: `PromptConfig` (how much of the document and the memory a prompt shows) and
  the rendering of one designer slot (`slot_messages`), shared with the bootstrap's data.
- `rollout`: `propose` (one batched sampler call for every slot) and `admit_samples`
  (staged sandbox admission of the batch).
- `review`: the optional self-review of new environments by the policy.
"""
