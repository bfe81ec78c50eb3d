"""An OpenAI-compatible HTTP server on the rollout engine (`python -m spade_jax.serve`).

`client_json` parses request bodies with bounds (depth, valid Unicode), `protocol` validates
them (refusing with `errors.ServeError`), `tools` maps OpenAI tools and tool calls to the
model's ``<tool_call>`` syntax, `forced` lays out a forced tool call (`tool_choice`),
`scheduler` batches requests continuously on one `RowEngine`, `app` is the ASGI app
(Starlette, with its request log) and `__main__` the command line (uvicorn).
"""
