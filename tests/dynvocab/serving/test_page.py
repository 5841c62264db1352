"""The page at ``/``: served by the same app; in headless Chromium it streams phrases that show their source."""

import os
import shutil
from pathlib import Path

import pytest

from .documents import DOCS

INSTALL = "apt-get install -y chromium && pip install playwright (or: make test-browser)"


def test_the_page_is_served_at_the_root(make_client):
    reply = make_client().get("/")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html")
    for needle in ('id="prompt"', 'name="mode" value="documents"', 'id="bare"', 'fetch("/v1/completions"',
                   'body.state_threshold = Number($("state").value)',
                   'draft_tokens: Number($("drafts").value)'):
        assert needle in reply.text


def chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


def test_the_page_streams_phrases_that_show_their_source_in_a_browser(live_server, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason=f"needs Playwright and Chromium: {INSTALL}")
    if chromium() is None:
        pytest.skip(f"needs Chromium: {INSTALL}")
    url = live_server(phrases_win=True)
    screenshot = Path(os.environ.get("DYNVOCAB_PAGE_SCREENSHOT", tmp_path / "page.png"))
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        page.goto(url)
        page.fill("#prompt", "The city")
        page.check("input[name=mode][value=documents]")
        page.fill("#phrase-text", DOCS[0]["text"] + "\n\n" + DOCS[1]["text"])
        page.fill("#max-tokens", "12")
        page.fill("#agreement", "0")
        page.click("#run")
        page.wait_for_selector("#bare-stats[data-done=true]", timeout=60_000)
        phrases = page.locator("#dynamic mark.phrase")
        assert phrases.count() > 0
        phrases.first.hover()
        assert "document 0" in page.inner_text("#source") or "document 1" in page.inner_text("#source")
        assert page.locator("#bare mark.phrase").count() == 0  # the bare LM has no phrases
        assert "characters per step" in page.inner_text("#dynamic-stats")
        page.screenshot(path=str(screenshot), full_page=True)
        browser.close()
    assert screenshot.stat().st_size > 0
