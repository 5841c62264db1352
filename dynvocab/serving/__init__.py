"""The HTTP server (``dynvocab serve``, the ``[serve]`` extra): OpenAI-compatible completions with per-request phrase
sets, batched together. Beside the command line at the top floor: it ties the core, ``retrieval`` and ``encoders``."""

from .config import API_KEY_ENV, ServerConfig

__all__ = ["API_KEY_ENV", "ServerConfig"]
