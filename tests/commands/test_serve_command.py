"""``refllm serve`` as a person runs it: one line for every start-up failure, then a server that says what it serves.

The server runs as ``python -m refllm serve`` over the tiny random model of
tests/helpers/model_directory.py and is driven over HTTP by the official openai client.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.helpers.command_line import refllm_process
from tests.helpers.paths import ROOT


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


def test_a_port_in_use_is_one_line_before_loading(tiny):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = refllm_process("serve", "--model", tiny, "--port", str(port))
    assert done.returncode == 1 and "loading" not in done.stderr
    assert done.stderr == f"refllm: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_an_address_not_of_this_machine_is_one_line(tiny):
    done = refllm_process("serve", "--model", tiny, "--host", "192.0.2.1", "--port", "0")  # TEST-NET-1, not ours
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("refllm: error: cannot listen on 192.0.2.1:0: ")


def test_serve_names_its_model_answers_health_and_logs_one_line_per_request(tiny):
    port = free_port()
    command = [sys.executable, "-m", "refllm", "serve", "--model", tiny, "--port", str(port), "--debug"]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                health = httpx.get(url + "/health")
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        answer = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=3, temperature=0
        )
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="tiny", prompt="hi", max_tokens=3, top_p=2)
    finally:
        server.send_signal(signal.SIGINT)
        log = server.communicate(timeout=60)[0]  # uvicorn logs requests on stdout
    assert health.status_code == 200 and health.json() == {"status": "ok", "model": "tiny"}
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert f"serving tiny (llama, {tiny}) at http://127.0.0.1:{port}/v1" in log
    requests = [line for line in log.splitlines() if '"GET /health' in line or '"POST /v1/' in line]
    assert len(requests) == 3 and '"POST /v1/completions HTTP/1.1" 400' in requests[-1]
    assert "Traceback" not in log
