"""Running the ``refllm`` command: in-process through ``cli.main``, or as ``python -m refllm``, the real entry
point; reading what it prints and what its chat sends to the template."""

from __future__ import annotations

import copy
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from refllm import cli
from refllm.io.tokenizer import Tokenizer
from tests.helpers.paths import ROOT


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``refllm ARGV`` in this process -> (exit code, stdout, stderr)."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refllm_process(*argv: str, stdin: str = "", home: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m refllm ARGV``, the real entry point; ``home``: its $REFLLM_HOME."""
    command = [sys.executable, "-m", "refllm", *argv]
    env = os.environ | ({"REFLLM_HOME": str(home)} if home is not None else {})
    return subprocess.run(command, input=stdin, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def chat_messages(monkeypatch) -> list[list[dict]]:
    """Record the conversation the chat template renders at every turn."""
    seen, render = [], Tokenizer.apply_chat_template

    def spy(self, messages, *args, **kwargs):
        seen.append(copy.deepcopy(list(messages)))
        return render(self, messages, *args, **kwargs)

    monkeypatch.setattr(Tokenizer, "apply_chat_template", spy)
    return seen


def info_rows(out: str) -> dict[str, str]:
    """Each row of ``refllm info`` by its name; a row of several lines (the recipe) joined by "; "."""
    rows: dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith(" "):  # the next line of the row above
            rows[key] += "; " + line.strip()
        else:
            key, value = re.match(r"(\S+(?: cache)?)\s{2,}(.*)", line).groups()
            rows[key] = value
    return rows


def read_until(fd: int, pattern: str, seen: list[str], timeout: float = 120) -> None:
    """Read the terminal into ``seen`` until its text matches ``pattern``."""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, "".join(seen), re.S):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"waited for {pattern!r}; the terminal shows: {''.join(seen)[-2000:]!r}"
        seen.append(os.read(fd, 65536).decode("utf-8", "replace"))
