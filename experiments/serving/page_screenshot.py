"""The screenshot of the server's page in docs/serving-page.png: headless Chromium (Debian's package, driven by
Playwright) on a running `dynvocab serve`, the Hudson River prompt, retrieval k=8, 32 greedy steps, a phrase hovered.

    dynvocab serve &                     # make serve: SmolLM2, the shipped encoder, the Wikipedia index
    python experiments/serving/page_screenshot.py --url http://127.0.0.1:8000 --output docs/serving-page.png
"""

from __future__ import annotations

import argparse
import shutil


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the running server")
    parser.add_argument("--output", default="docs/serving-page.png")
    parser.add_argument("--prompt", default="The Hudson River is")
    parser.add_argument("--max-tokens", default="32")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 820})
        page.goto(args.url)
        page.fill("#prompt", args.prompt)
        page.fill("#max-tokens", args.max_tokens)
        page.click("#run")
        page.wait_for_selector("#bare-stats[data-done=true]", timeout=300_000)
        phrases = page.locator("#dynamic mark.phrase")
        if phrases.count():
            phrases.nth(min(1, phrases.count() - 1)).hover()
        print(page.inner_text("#dynamic-stats"), "|", page.inner_text("#source"))
        page.screenshot(path=args.output, full_page=True)
        browser.close()


if __name__ == "__main__":
    main()
