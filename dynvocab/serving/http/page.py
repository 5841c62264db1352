"""The page at ``/``: one HTML file with its script inline (no build step) that streams a completion with phrase spans
highlighted, each showing its source, beside the bare LM's continuation of the same prompt."""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def page_html() -> str:
    """``page.html``, shipped beside this module as package data."""
    return files(__package__).joinpath("page.html").read_text(encoding="utf-8")
