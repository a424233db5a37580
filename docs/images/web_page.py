"""Take docs/images/web-page.png: the page `refllm serve` shows, with one answer's inside view open.

Serves SmolLM2-135M (pulled on first use) on a free port, asks it a question in
Chromium (Debian's, driven by Playwright), opens the panel on the answer's second
token and saves the whole page.

    python docs/images/web_page.py [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from playwright.sync_api import sync_playwright

import refllm
from refllm.server import BackgroundServer, create_app

OUT = Path(__file__).resolve().parent / "web-page.png"
SETTINGS = {"temperature": "0.7", "top_k": "20", "top_p": "0.9", "min_p": "0.05", "max_tokens": "40"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the browser to drive")
    args = parser.parse_args()
    model = refllm.load_model("smollm2-135m", quantized=True)
    with BackgroundServer(create_app(model, model_name="smollm2-135m")) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(server.url + "/")
        page.click("#settings summary")
        for field, value in SETTINGS.items():
            page.fill(f"#{field}", value)
        page.click("#settings summary")
        page.fill("#prompt", "What is the capital of France?")
        page.press("#prompt", "Enter")
        page.wait_for_selector(".message.assistant .look", timeout=300_000)
        page.click(".message.assistant .look")
        page.wait_for_selector("#attention canvas", timeout=300_000)
        page.click("#token-strip .token >> nth=1")
        page.select_option("#attention-layer", "3")
        page.screenshot(path=str(OUT), full_page=True)
        browser.close()
    print(OUT)


if __name__ == "__main__":
    main()
