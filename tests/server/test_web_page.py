"""The web page ``refllm serve`` shows at ``/``, in a real headless browser, and the endpoint behind its panel.

The browser is Debian's Chromium driven by Playwright (``.ci/run`` installs
both); where either is missing the browser test skips, and the rest still runs.
The page is checked against the tracing API: the logit lens has a row per layer
whose top tokens are ``Trace.logit_lens``'s, and the attention shows a map per
head, for the same conversation and answer.
"""

from __future__ import annotations

import base64
import shutil

import httpx
import numpy as np
import pytest

import refllm
from refllm.runtime.sampling import SamplingParams
from refllm.server import BackgroundServer, create_app
from refllm.server.inside import describe
from refllm.tracing import trace
from tests.helpers.model_directory import write_tiny_model
from tests.helpers.paths import HF_DATA

KEY = "sesame"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return refllm.load_model(write_tiny_model(tmp_path_factory.mktemp("page") / "tiny"))


@pytest.fixture(scope="module")
def server(model):
    with BackgroundServer(create_app(model, model_name="tiny", api_key=KEY)) as running:
        yield running


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no Chromium to drive (apt-get install chromium)")


def conversation_ids(model, messages: list[dict], answer: str) -> tuple[list[int], list[int]]:
    """The token ids the server traces: the chat prompt as the chat endpoint renders it, and the answer."""
    tokenizer = model.tokenizer
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)
    return prompt, tokenizer.encode(answer, add_special_tokens=False)


def test_the_page_chats_streaming_and_shows_inside_the_model(model, server):
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = chromium()
    streamed = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("response", lambda r: streamed.append(r.headers.get("content-type", "")) if "/v1/chat/completions" in r.url else None)
            page.goto(server.url + "/")
            page.wait_for_selector("#key-dialog[open]")  # the server has an API key: the page asks for it
            page.fill("#key", KEY)
            page.click("#key-form button")
            page.locator("#model", has_text="tiny").wait_for()  # (the page's CSP forbids evaluated strings)
            page.click("#settings summary")
            page.fill("#max_tokens", "6")
            page.fill("#prompt", "Hello there")
            page.press("#prompt", "Enter")
            page.wait_for_selector(".message.assistant .look", timeout=60_000)
            answer = page.eval_on_selector(".message.assistant", "e => e.firstChild.textContent")
            page.click(".message.assistant .look")
            page.wait_for_selector("#attention canvas", timeout=60_000)
            lens_rows = page.eval_on_selector_all("#lens tr[data-layer]", "rows => rows.length")
            last_row = page.eval_on_selector_all(
                f"#lens tr[data-layer='{model.config.num_hidden_layers - 1}'] td", "cells => cells.map(c => c.dataset.token)"
            )
            heads = page.eval_on_selector_all("#attention canvas", "cs => cs.map(c => [c.dataset.layer, c.dataset.head])")
            layer_options = page.eval_on_selector_all("#attention-layer option", "os => os.length")
            drawn = page.eval_on_selector("#attention canvas", "c => c.width * c.height > 0")
            assert errors == []
        finally:
            browser.close()
    assert streamed and all(kind.startswith("text/event-stream") for kind in streamed)
    assert answer  # the streamed text arrived
    prompt, answer_ids = conversation_ids(model, [{"role": "user", "content": "Hello there"}], answer)
    traced = trace(model, prompt + answer_ids)
    lens_ids, _ = traced.logit_lens(1, np.arange(len(prompt) - 1, len(prompt) + len(answer_ids) - 1))
    assert lens_rows == layer_options == len(traced.layers) == model.config.num_hidden_layers
    assert len(heads) == traced.layers[-1].attention.shape[0] == model.config.attention.num_heads
    assert {layer for layer, _ in heads} == {str(len(traced.layers) - 1)} and drawn
    assert last_row == [model.tokenizer.decode([int(i)]) for i in lens_ids[-1, :, 0]]


def test_the_page_needs_no_key_but_the_api_does_and_other_sites_are_refused(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert httpx.get(server.url + "/page/inside.js").status_code == 200
    for outside in ("/page/missing.js", "/page/page.py", "/page/..%2Fpage.py", "/page/%2E%2E%2F__init__.py"):
        assert httpx.get(server.url + outside).status_code == 404, outside
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "answer": "Hello"}
    assert httpx.post(server.url + "/v1/inside", json=body).status_code == 401
    authorized = {"Authorization": f"Bearer {KEY}"}
    elsewhere = httpx.post(server.url + "/v1/inside", json=body, headers=authorized | {"Origin": "https://evil.example"})
    assert elsewhere.status_code == 403
    inside = httpx.post(server.url + "/v1/inside", json=body, headers=authorized)
    assert inside.status_code == 200 and inside.json()["layers"] == 2


def test_the_inside_view_is_the_trace_with_the_samplers_cut_offs_and_the_routes():
    model = refllm.load_model(HF_DATA / "mixtral", reference=True)
    ids = [3, 14, 15, 9, 2, 6, 5, 3]
    traced = trace(model, ids)
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05)
    view = describe(traced, 5, params, str)
    producing = np.arange(4, 7)
    attention = np.frombuffer(base64.b64decode(view["attention"][1]), np.uint8).reshape(view["heads"], 3, 7)
    np.testing.assert_allclose(attention / 255, traced.layers[1].attention[:, producing, :7], atol=0.5 / 255)
    assert [e["layer"] for e in view["experts"]] == [0, 1]
    assert view["experts"][0]["ids"] == traced.layers[0].experts[0][producing].tolist()
    step = view["next_token"][0]
    probs = np.exp(traced.logits[4] / 0.7 - np.max(traced.logits[4] / 0.7))
    probs /= probs.sum()
    assert step["top"][0][1] == pytest.approx(probs.max(), abs=1e-5) and step["chosen"] == str(ids[5])
    assert step["kept_by_top_k"] == 5 and step["kept_by_min_p"] <= step["kept_by_top_p"] <= 5
    top_five = np.sort(probs)[::-1][:5] / np.sort(probs)[::-1][:5].sum()  # top-p reads what top-k kept
    kept = top_five[: step["kept_by_top_p"]]
    assert kept[:-1].sum() < 0.9 <= kept.sum() + 1e-12  # the smallest set that reaches 0.9
    assert [bool(kept_flag) for *_, kept_flag in step["top"]].count(True) == step["kept_by_min_p"]
