"""Images through the faces: ``refllm generate --image``, ``/image`` in chat, and ``image_url`` parts sent by the
official openai client to the server, each checked against the same computation through the Python API.

Decoding image files needs Pillow (the ``vision`` extra); these tests skip without it.
"""

from __future__ import annotations

import base64
import io
import sys

import httpx
import numpy as np
import pytest

import refllm
from refllm.commands.chat import chat_prompt
from refllm.io.images import read_image
from refllm.io.vision_prompt import content_parts
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM
from refllm.runtime.sampling import SamplingParams
from tests.helpers.command_line import run
from tests.helpers.model_directory import write_tiny_model
from tests.helpers.paths import HF_DATA

pytest.importorskip("PIL")
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
CASES = ["idefics3", "gemma3_vision"]


@pytest.fixture(scope="module")
def models() -> dict:
    return {case: refllm.load_model(HF_DATA / case) for case in CASES}


def api_answer(model, messages: list[dict], images: list[np.ndarray], params: SamplingParams = GREEDY) -> str:
    """What the engine answers, straight through the Python API."""
    ids, pixels = chat_prompt(model, messages, images)
    engine = Engine(LLMExecutor(LLM(model), offload=False), model.tokenizer)
    try:
        return engine.submit(ids, params, pixels).result().completions[0].text
    finally:
        engine.close()


@pytest.mark.parametrize("case", CASES)
def test_generate_with_images_answers_as_the_api_does(models, case, capsys):
    files = [str(HF_DATA / case / "images" / name) for name in ("wide.png", "small.png")]
    argv = ["generate", "what is in these?", "--model", str(HF_DATA / case), "--temperature", "0", "--max-tokens", "12"]
    code, out, err = run(capsys, *argv, "--image", files[0], "--image", files[1])
    assert code == 0, err
    messages = [{"role": "user", "content": content_parts("what is in these?", 2)}]
    assert out == api_answer(models[case], messages, [read_image(f) for f in files]) + "\n"


def test_chat_attaches_an_image_to_the_next_message(models, capsys, monkeypatch):
    image = str(HF_DATA / "gemma3_vision" / "images" / "tall.png")
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"/image {image}\ndescribe it\nand now?\n"))
    code, out, err = run(capsys, "chat", "--model", str(HF_DATA / "gemma3_vision"), "--temperature", "0",
                         "--max-tokens", "12")  # fmt: skip
    assert code == 0, err
    model = models["gemma3_vision"]
    first = api_answer(model, [{"role": "user", "content": content_parts("describe it", 1)}], [read_image(image)])
    history = [{"role": "user", "content": content_parts("describe it", 1)}, {"role": "assistant", "content": first},
               {"role": "user", "content": "and now?"}]  # fmt: skip
    second = api_answer(model, history, [read_image(image)])
    assert out == first + "\n" + second + "\n"
    assert "goes with your next message" in err


def test_images_for_a_text_model_and_bad_files_are_one_line_errors(tmp_path, capsys):
    text_model = str(write_tiny_model(tmp_path / "text"))
    image = str(HF_DATA / "idefics3" / "images" / "wide.png")
    code, _, err = run(capsys, "generate", "hi", "--model", text_model, "--image", image)
    assert code == 1 and "reads text only" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "not-an-image.png").write_bytes(b"plain text, not a picture")
    for bad in (str(tmp_path / "not-an-image.png"), str(tmp_path / "missing.png")):
        code, _, err = run(capsys, "generate", "hi", "--model", str(HF_DATA / "idefics3"), "--image", bad)
        assert code == 1 and err.startswith("refllm: error:") and len(err.strip().splitlines()) == 1


# ---- the server ------------------------------------------------------------------------------------------


def data_url(path) -> str:
    return "data:image/png;base64," + base64.b64encode(open(path, "rb").read()).decode()


@pytest.fixture(scope="module")
def server(models):
    from refllm.server import BackgroundServer, create_app

    with BackgroundServer(create_app(models["idefics3"], model_name="smolvlm-tiny")) as server:
        yield server


def test_the_openai_client_sends_an_image_as_a_data_url(models, server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    path = HF_DATA / "idefics3" / "images" / "tall.png"
    content = [{"type": "image_url", "image_url": {"url": data_url(path)}}, {"type": "text", "text": "what is this?"}]
    reply = client.chat.completions.create(
        model="smolvlm-tiny", messages=[{"role": "user", "content": content}], temperature=0, max_tokens=12
    )
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is this?"}]}]
    assert reply.choices[0].message.content == api_answer(models["idefics3"], messages, [read_image(path)])
    info = httpx.get(server.url + "/v1/model/info").json()
    assert info["capabilities"]["vision"] is True and info["architecture"] == "idefics3"


BAD_IMAGES = {
    "a remote URL": ("https://example.com/cat.png", 400, "not fetched"),
    "not base64": ("data:image/png;base64,@@@", 400, "not valid base64"),
    "not an image": ("data:image/png;base64," + base64.b64encode(b"hello").decode(), 400, "not an image"),
}


@pytest.mark.parametrize("name", list(BAD_IMAGES))
def test_bad_images_get_openai_errors_naming_the_part(server, name):
    url, status, words = BAD_IMAGES[name]
    content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"model": "smolvlm-tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    error = response.json()["error"]
    assert response.status_code == status and words in error["message"]
    assert error["param"] == "messages[0].content[1].image_url"


def test_an_image_past_the_pixel_limit_is_refused_before_decoding(models):
    from PIL import Image

    from refllm.server import BackgroundServer, create_app
    from refllm.server.limits import ServerLimits

    buffer = io.BytesIO()
    Image.new("RGB", (400, 300), "white").save(buffer, format="PNG")  # 120,000 pixels, a small file
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    limits = ServerLimits(max_image_pixels=100_000)
    with BackgroundServer(create_app(models["idefics3"], model_name="m", limits=limits)) as server:
        content = [{"type": "image_url", "image_url": {"url": url}}]
        body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
        response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["code"] == "image_too_large"
        health = httpx.get(server.url + "/v1/model/info").json()
        assert health["kv_cache"]["live_caches"] == 0
