"""An OpenAI-compatible HTTP server on the rollout engine (`python -m spade_jax.serve`).

`protocol` validates request bodies (refusing with `errors.ServeError`), `tools` maps OpenAI tools and tool calls to the
model's ``<tool_call>`` syntax, `scheduler` batches requests continuously on one
`RowEngine`, `app` is the ASGI app (Starlette) and `__main__` the command line (uvicorn).
"""
