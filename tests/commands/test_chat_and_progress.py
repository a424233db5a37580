"""Chat at a terminal (Ctrl-C, /show, /retry, no Python reprs), a long prompt's progress, a too-long prompt
refused before anything is shown, ``info``'s memory as a run loads it, and the server's request log line."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import re
import subprocess
import sys
import termios
import time

import httpx
import numpy as np

import refllm
from refllm import progress
from refllm.commands import common
from refllm.config import ModelConfig
from refllm.kv import CacheConfig
from refllm.memory import RUNTIME_BYTES, weight_bytes
from refllm.models.decoder import cache_shape_for
from refllm.models.random import random_model
from refllm.runtime.llm import LLM, PREFILL_CHUNK
from refllm.server import BackgroundServer, create_app
from tests.helpers.command_line import chat_messages, read_until, refllm_process, run
from tests.helpers.paths import ROOT


def chat(capsys, monkeypatch, tiny, lines: str, *flags: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    return run(capsys, "chat", tiny, "-n", "3", *flags)


# ---- chat ----------------------------------------------------------------------------------------------------------


def test_show_says_the_model_template_settings_and_context_used(tiny, capsys, monkeypatch):
    code, _, err = chat(capsys, monkeypatch, tiny, "hello\n/show\n/show template\n", "--context", "200")
    assert code == 0
    show = err[err.index("  model"):]
    rows = dict(re.findall(r"^  (\S+) +(.+)$", show, re.M))
    assert rows["model"].startswith(f"{tiny}: llama, ") and "float32 weights" in rows["model"]
    assert rows["template"].startswith("the model's chat template, ")
    used = len(chat_ids_of(tiny, [{"role": "user", "content": "hello"}]))
    assert re.match(rf"\d+ of 200 tokens used \(\d+\.\d%\), 2 messages", rows["context"])
    assert int(rows["context"].split()[0]) > used  # the answer is in it too
    assert rows["temperature"] == "0.0" and rows["seed"] == "none" and rows["system"] == "none"
    assert "{% endfor %}{% if add_generation_prompt %}" in err  # /show template prints it


def chat_ids_of(tiny, messages):
    tokenizer = refllm.load_model(tiny).tokenizer
    return tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)


def test_retry_answers_the_last_message_again_in_its_place(tiny, capsys, monkeypatch):
    seen = chat_messages(monkeypatch)
    code, out, err = chat(capsys, monkeypatch, tiny, "/retry\nhello\n/retry\nmore\n", "--temperature", "1", "--seed", "1")
    assert code == 0 and "/retry: nothing to retry yet" in err
    hello = [{"role": "user", "content": "hello"}]
    assert seen[0] == hello and seen[1] == hello  # the same question, asked again
    assert seen[2][:1] == hello and seen[2][2] == {"role": "user", "content": "more"} and len(seen[2]) == 3
    assert len(out.splitlines()) == 3  # three answers


def test_settings_read_as_words_not_python(tiny, capsys, monkeypatch):
    code, _, err = chat(capsys, monkeypatch, tiny, "/set\n/set seed none\n/set system Be brief.\n/set system\n/shwo\n")
    assert code == 0 and "None" not in err and "'" not in err
    assert re.search(r"^  system +none$", err, re.M) and "seed = none" in err
    assert "system message: Be brief." in err and "no system message" in err
    assert "unknown command /shwo; did you mean /show?" in err


def as_terminal() -> None:
    """In the child: its own session, with the pseudo-terminal on stdin as its controlling terminal, so
    Ctrl-C typed there is a SIGINT, as in a real terminal."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_ctrl_c_at_the_prompt_hints_and_stays_twice_quits_and_clears_a_half_typed_line(tiny, tmp_path):
    controller, terminal = os.openpty()
    env = os.environ | {"REFLLM_HOME": str(tmp_path), "TERM": "xterm"}
    command = [sys.executable, "-m", "refllm", "chat", tiny, "-n", "3"]
    process = subprocess.Popen(
        command, stdin=terminal, stdout=terminal, stderr=terminal, cwd=ROOT, env=env, preexec_fn=as_terminal
    )
    os.close(terminal)
    seen: list[str] = []
    try:

        def ctrl_c() -> None:
            time.sleep(0.5)  # readline takes the terminal just after the prompt shows
            os.write(controller, b"\x03")

        read_until(controller, r"/help lists the commands.*> ", seen)
        ctrl_c()  # Ctrl-C at an empty prompt: a hint, and the chat goes on
        read_until(controller, r"to quit: Ctrl-C again, Ctrl-D or /exit\)\r?\n> ", seen)
        os.write(controller, b"half a thought")
        read_until(controller, "half a thought", seen)
        ctrl_c()  # a half-typed line: cleared, no hint
        read_until(controller, r"half a thought[^\n]*\n> ", seen)
        os.write(controller, b"hello\r")
        read_until(controller, r"stopped: [^\n]*\n.*> ", seen)
        ctrl_c()
        read_until(controller, r"(to quit: Ctrl-C again.*){2}", seen)
        assert process.poll() is None
        ctrl_c()  # a second one in a row quits
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        os.close(controller)
    shown = "".join(seen)
    assert shown.count("to quit: Ctrl-C again") == 2 and "Traceback" not in shown
    assert (tmp_path / "chat_history").read_text().splitlines()[-1:] == ["hello"]  # the cleared line was not sent


# ---- a long prompt: progress; a too-long one: refused before anything shows ------------------------------------------


def test_a_long_prompt_reports_progress_chunk_by_chunk_from_the_start():
    config = ModelConfig.from_hf(dict(
        model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5,
    ))  # fmt: skip
    model = random_model(config)
    llm = LLM(model, CacheConfig(num_blocks=64))
    reports = []
    llm.prefill_progress = lambda done, total: reports.append((done, total))
    prompt = list(np.random.default_rng(0).integers(0, model.config.vocab_size, 600))
    logits = llm.prefill("long", prompt)
    assert reports == [(0, 600), (PREFILL_CHUNK, 600), (2 * PREFILL_CHUNK, 600), (600, 600)]
    whole = model.prefill(np.array([prompt]), model.create_kv_cache(CacheConfig(kind="contiguous")), range(600))[0]
    np.testing.assert_allclose(logits, whole, rtol=1e-4, atol=1e-4)  # chunks: the same logits up to rounding
    reports.clear()
    llm.prefill("again", prompt[:300] + [1])  # the cached prefix is not computed again
    assert reports[0] == (0, 301 - 288) and reports[-1] == (13, 13)


def test_prompt_progress_shows_after_its_delay_and_says_when_it_is_done(capsys):
    assert progress.PromptProgress().delay <= 1.5  # so a 6,000-token prompt shows progress within 2 s
    quick = progress.PromptProgress(delay=5)
    quick(0, 6000)
    quick(6000, 6000)
    one_chunk = progress.PromptProgress(chunk=256, delay=0.01)  # a bar that could not move is not shown
    one_chunk(0, 256)
    time.sleep(0.2)
    one_chunk(256, 256)
    slow = progress.PromptProgress(chunk=256, delay=0.05)
    slow(0, 6000)
    time.sleep(0.3)
    slow(256, 6000)
    slow(6000, 6000)
    err = capsys.readouterr().err
    assert err.count("reading the prompt") == 1  # only the slow one
    assert re.fullmatch(r"reading the prompt \(6,000 tokens\) \.\.\. done in \d+\.\d s\n", err)


def test_a_prompt_too_long_for_the_context_is_refused_before_it_is_echoed(tiny, tmp_path):
    done = refllm_process("generate", "word " * 200, "-m", tiny, "--context", "32", home=tmp_path)
    assert done.returncode == 1 and done.stdout == "" and "context" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 2 and "Traceback" not in done.stderr  # loading, then the error


# ---- info: the memory a run loads ------------------------------------------------------------------------------------


def test_info_reports_memory_for_the_quantized_weights_a_run_loads_and_for_dequantize(tmp_path, capsys):
    from tests.helpers.command_line import info_rows
    from tests.helpers.gguf_convert import convert

    path = str(convert("llama", tmp_path / "llama.gguf", "Q8_0"))
    code, out, _ = run(capsys, "info", path, "--context", "64")
    rows = info_rows(out)
    source = common.open_model(path, quantized=True)
    stored, dequantized = weight_bytes(source, True), weight_bytes(source, False)
    assert code == 0 and stored < dequantized
    assert rows["weights"].startswith(f"{common.size(stored)} as stored, quantized (generate, chat); "
                                      f"{common.size(dequantized)} dequantized")  # fmt: skip
    kv_bytes = 64 * cache_shape_for(source.config).bytes_per_token
    assert rows["memory"].startswith(
        f"{common.size(stored + kv_bytes)} for a run: its quantized weights and the KV cache"
        f" (peak about {common.size(stored + kv_bytes + RUNTIME_BYTES)} with the runtime);"
        f" {common.size(dequantized + kv_bytes)} with --dequantize"
    )


# ---- the server's request log -------------------------------------------------------------------------------------------


def test_the_request_log_line_carries_token_counts_time_to_first_token_and_speed(tiny, caplog, capsys):
    with BackgroundServer(create_app(refllm.load_model(tiny), model_name="tiny")) as server:
        caplog.set_level(logging.INFO, logger="uvicorn.error")
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
        assert httpx.post(server.url + "/v1/completions", json=body).status_code == 200
        assert httpx.post(server.url + "/v1/completions", json=body | {"model": "other"}).status_code == 404
        time.sleep(0.2)
    lines = [line.removeprefix("INFO:     ") for line in capsys.readouterr().err.splitlines() if "/v1/completions" in line]
    prompt_tokens = len(refllm.load_model(tiny).tokenizer.encode("hello"))
    assert re.fullmatch(
        rf'127\.0\.0\.1:\d+ - "POST /v1/completions HTTP/1\.1" 200 OK \| prompt {prompt_tokens} tokens \| generated 5'
        r" tokens, first after \d+\.\d\d s, \d+\.\d tokens/s",
        lines[0],
    ), lines
    assert re.fullmatch(r'127\.0\.0\.1:\d+ - "POST /v1/completions HTTP/1\.1" 404 Not Found', lines[1])
