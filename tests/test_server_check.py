"""``refllm check --server`` against ``refllm serve`` on a free local port, with the real SmolLM2 weights."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from refllm.cli import main
from refllm.testing.server_check import top_k_kl
from tests.real_models import SMOLLM2, real_model_or_skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_smollm2():
    path = real_model_or_skip(SMOLLM2)
    port = free_port()
    command = [sys.executable, "-m", "refllm", "serve", "--model", str(path), "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/models", timeout=1).read()
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"refllm serve exited: {server.stderr.read().decode()[-2000:]}")
                time.sleep(0.5)
        models = json.loads(urllib.request.urlopen(f"{url}/models", timeout=5).read())
        yield url, models["data"][0]["id"], str(path)
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.real_model
def test_check_server_passes_against_refllm_serve(served_smollm2, capsys):
    url, name, path = served_smollm2
    assert main(["check", "--server", url, "--model", name, "--reference", path, "--new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "3/3 prompts pass" in out and "same top token 100.0%" in out
    assert "prompt logprobs: not offered" in out  # refllm serve does not echo prompts


def test_top_k_kl_is_zero_for_equal_distributions_and_positive_otherwise():
    p = {"a": -0.1, "b": -2.5, "c": -4.0}
    assert top_k_kl(p, p) == pytest.approx(0.0, abs=1e-12)
    assert top_k_kl(p, {"a": -2.5, "b": -0.1, "c": -4.0}) > 0.5
