"""The command line and the demo: the one layer that ties the core, ``encoders``, ``retrieval`` and ``evals`` together."""

from .commands import build_parser, main

__all__ = ["build_parser", "main"]
