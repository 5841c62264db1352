"""The HTTP adapter over the engine: OpenAI's `/v1/completions` (JSON or SSE), the page, metrics and logs; the one
part of the library that imports FastAPI, uvicorn and prometheus-client (the `[serve]` extra)."""
