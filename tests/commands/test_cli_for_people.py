"""What a person meets first: flags checked in their own names, the stats line, the chat's commands, models.

Each case of issue 19's "Why" is tried through the real entry point (``python -m
refllm``) on the tiny random model of tests/helpers/model_directory.py, or in-process
where the test must watch what the chat template receives.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import numba
import pytest

from refllm import catalog, progress
from tests.helpers.command_line import chat_messages, read_until, refllm_process, run
from tests.helpers.paths import ROOT
from tests.helpers.real_models import SMOLLM2, real_model_or_skip

STATS = re.compile(
    r"^prompt \d+ tokens, \d+\.\d tokens/s \| generated (\d+) tokens, \d+\.\d tokens/s \| stopped: (.+)$", re.M
)


def test_version():
    done = refllm_process("--version")
    assert done.returncode == 0 and done.stdout == f"refllm {__import__('refllm').__version__}\n"


# ---- usage errors: exit 2, one line, the flag's own name, before any model loads -------------------------


@pytest.mark.parametrize(
    "argv, stdin, message",
    [
        (["generate", "hi", "--top-p", "2"], "", "argument --top-p: 2.0 must be in (0, 1]"),
        (["generate", "hi", "--temperature", "-1"], "", "argument --temperature: -1.0 must be 0 (greedy) or at least"),
        (["generate", "hi", "--temperature", "1e-39"], "", "argument --temperature: 1e-39 must be 0 (greedy) or at"),
        (["generate", "hi", "--logit-bias", "5=300"], "", "argument --logit-bias: the bias 300 is not in [-100, 100]"),
        (["chat", "--logit-bias", "five"], "", "argument --logit-bias: 'five' is not TOKEN_ID=BIAS"),
        (["generate", "hi", "--logit-bias", "5=1", "--logit-bias", "5=2"], "",
         "argument --logit-bias: logit_bias names token 5 twice"),  # fmt: skip
        (["generate", "hi", "--repetition-penalty", "0"], "", "argument --repetition-penalty: 0.0 must be in [0.01,"),
        (["generate", ""], "", "argument PROMPT: the prompt is empty"),
        (["generate", "-"], "", "argument PROMPT: - reads the prompt from standard input, which was empty"),
        (["generate", "hi", "--stop", ""], "", "argument --stop: a stop string cannot be empty"),
        (["generate", "hi", "--context", "0"], "", "argument --context: 0 must be at least 1"),
        (["chat", "--min-p", "3"], "", "argument --min-p: 3.0 must be in [0, 1]"),
        (["perplexity", "README.md", "--window", "8", "--stride", "9"], "", "argument --stride: 9 is longer than"),
        (["serve", "--port", "99999"], "", "argument --port: 99999 is not a port number"),
        (["serve", "--max-batch", "0"], "", "argument --max-batch: 0 must be at least 1"),
        (["generate", "hi", "--seed", "-1"], "", "argument --seed: -1 must be at least 0"),
        (["embed", "a", ""], "", "argument TEXT: text 2 is empty"),
    ],
)
def test_usage_errors_name_the_flag_and_exit_2_before_loading(argv, stdin, message, tmp_path):
    done = refllm_process(*argv, "--model", "no-such-model", stdin=stdin, home=tmp_path)
    command = argv[0]
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"refllm {command}: error: {message}"), done.stderr
    assert done.stderr.rstrip().endswith(f"(see refllm {command} --help)")


# ---- run-time failures: exit 1, one line, naming the file and what is wrong --------------------------------


def test_a_missing_gguf_file_is_one_line(tmp_path):
    for command in (["generate", "hi"], ["serve"]):
        done = refllm_process(*command, "--model", "models/missing.gguf", home=tmp_path)
        assert done.returncode == 1 and done.stderr == "refllm: error: models/missing.gguf: no such file or directory\n"


def test_a_non_utf8_text_file_is_refused_naming_the_file(tiny, tmp_path):
    text = tmp_path / "latin1.txt"
    text.write_bytes("café au lait\n".encode("latin-1"))
    done = refllm_process("perplexity", str(text), "--model", tiny)
    assert done.returncode == 1 and "loading" not in done.stderr  # refused before the model loads
    assert done.stderr == f"refllm: error: {text} is not UTF-8 text: byte 0xe9 at offset 3 (line 1)\n"


def test_a_truncated_gguf_is_refused_in_words(tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + b"\x01\x00")
    done = refllm_process("generate", "hi", "--model", str(path))
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith(f"refllm: error: {path} is not a readable GGUF file")
    assert "cut short" in done.stderr and not re.search("unpack|buffer|struct", done.stderr)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["generate", "hi", "--context", "100000"], "--context 100000"),
        (["chat", "--context", "300"], "--context 300"),
        (["bench", "--prompt-tokens", "200", "--new-tokens", "100"], "--prompt-tokens plus --new-tokens, 300"),
    ],
)
def test_a_context_past_the_models_is_refused_before_loading(argv, flag, tiny):
    done = refllm_process(*argv, "--model", tiny)
    assert done.returncode == 1 and "loading" not in done.stderr
    assert done.stderr == f"refllm: error: {flag} is longer than {tiny}'s context of 256 tokens\n"


def test_a_context_flag_caps_the_answer(tiny):
    done = refllm_process("generate", PROMPT, "--model", tiny, "--context", "16", "--max-tokens", "100")
    assert done.returncode == 0, done.stderr
    prompt_tokens = int(re.search(r"^prompt (\d+) tokens", done.stderr, re.M).group(1))
    assert STATS.findall(done.stderr) == [(str(16 - prompt_tokens), "context full (16 tokens)")]


# ---- generate: stats line, stop strings, stdin, system message ----------------------------------------------


PROMPT = "the quick brown fox"  # the tiny model continues it past 12 tokens (and ends "hello world" at once)


def test_generate_ends_with_a_stats_line_saying_why_it_stopped(tiny):
    done = refllm_process("generate", PROMPT, "--model", tiny, "--max-tokens", "6")
    assert done.returncode == 0, done.stderr
    assert STATS.findall(done.stderr) == [("6", "token limit (--max-tokens 6)")]
    assert done.stderr.rstrip().splitlines()[-1].startswith("prompt ")  # the last line, after the answer
    quiet = refllm_process("generate", PROMPT, "--model", tiny, "--max-tokens", "6", "--quiet")
    assert quiet.stdout == done.stdout and not STATS.search(quiet.stderr)
    eos = refllm_process("generate", "hello world", "--model", tiny, "--max-tokens", "6")
    assert eos.stdout == "hello world\n" and STATS.findall(eos.stderr) == [("1", "end of text (EOS)")]


@pytest.fixture(scope="module")
def model_text(tiny) -> str:
    done = refllm_process("generate", PROMPT, "--model", tiny, "--max-tokens", "12", "--quiet")
    return done.stdout.removeprefix(PROMPT).removesuffix("\n")


def test_generate_stops_before_a_stop_string(tiny, model_text):
    stop = re.search("[a-z]{3}", model_text).group()  # a piece of what the model writes greedily
    done = refllm_process("generate", PROMPT, "--model", tiny, "--max-tokens", "12", "--stop", "zzz", "--stop", stop)
    assert done.returncode == 0, done.stderr
    assert done.stdout == PROMPT + model_text[: model_text.index(stop)] + "\n"
    assert STATS.findall(done.stderr)[0][1] == "stop string"


def test_a_dash_reads_the_prompt_from_stdin(tiny, model_text):
    done = refllm_process("generate", "-", "--model", tiny, "--max-tokens", "12", stdin=PROMPT)
    assert done.returncode == 0 and done.stdout == PROMPT + model_text + "\n"


def test_system_goes_through_the_chat_template(tiny, capsys, monkeypatch):
    seen = chat_messages(monkeypatch)
    code, _, err = run(capsys, "generate", "hi", "--system", "be brief", "--model", tiny, "--max-tokens", "3")
    assert code == 0 and STATS.search(err)
    assert seen == [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]]


def test_the_first_kernel_compilation_is_announced_and_a_cached_run_is_silent(capsys):
    @numba.njit
    def add_one(x):
        return x + 1

    with progress.compiling_kernels():
        add_one(1)
    err = capsys.readouterr().err
    assert err.startswith(progress.COMPILE_NOTICE)
    assert re.search(r"compiled 1 kernels in \d+\.\d s; later runs load them from the cache\n$", err)
    with progress.compiling_kernels():
        add_one(2)
    assert capsys.readouterr().err == ""


# ---- chat: /help, /set, /save, /load, several lines, the stats line ---------------------------------------------


def test_chat_commands_through_the_real_entry_point(tiny, tmp_path):
    saved = tmp_path / "talk.json"
    script = [
        "/help",
        "/set temperature 0.5",
        "/set top-p 2",
        "/set system Be terse.",
        '"""',
        "line one",
        "line two",
        '"""',
        "and a \\",
        "continued line",
        f"/save {saved}",
        "/reset",
        f"/load {saved}",
        "/set",
        "/frobnicate",
    ]
    done = refllm_process("chat", "--model", tiny, "--max-tokens", "3", stdin="\n".join(script) + "\n")
    assert done.returncode == 0 and "Traceback" not in done.stderr
    err = done.stderr
    assert "/save FILE" in err and "/set NAME VALUE" in err  # /help
    assert "temperature = 0.5" in err and "/set: top-p: 2.0 must be in (0, 1]" in err
    assert len(STATS.findall(err)) == 2  # one stats line per answer
    assert "saved 4 messages" in err and "(conversation cleared)" in err and "loaded 4 messages" in err
    assert re.search(r"temperature +0\.5", err) and "unknown command /frobnicate" in err
    talk = json.loads(saved.read_text())
    assert talk["system"] == "Be terse." and talk["settings"]["temperature"] == 0.5
    assert [m["content"] for m in talk["messages"] if m["role"] == "user"] == [
        "line one\nline two",
        "and a \ncontinued line",
    ]


def test_load_restores_the_conversation_and_a_bad_file_changes_nothing(tiny, tmp_path, capsys, monkeypatch):
    talk = tmp_path / "talk.json"
    talk.write_text(
        json.dumps(
            {
                "format": "refllm-chat/1",
                "system": "Be terse.",
                "settings": {"max_tokens": 2},
                "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
            }
        )
    )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "refllm-chat/1", "messages": [{"role": "wizard", "content": 1}]}))
    seen = chat_messages(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"/load {talk}\n/load {bad}\n/load {tmp_path}/none.json\nAgain\n"))
    code, _, err = run(capsys, "chat", "--model", tiny)
    assert code == 0
    assert f'/load: {bad}: "messages" must be a list' in err and "/load: " in err.split("none.json")[0]
    assert seen == [
        [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Again"},
        ]
    ]
    assert STATS.findall(err)[0][0] == "2"  # max_tokens came back with the conversation


def test_chat_on_a_terminal_has_line_editing_and_history(tiny, tmp_path):
    controller, terminal = os.openpty()
    env = os.environ | {"REFLLM_HOME": str(tmp_path), "TERM": "xterm"}
    command = [sys.executable, "-m", "refllm", "chat", "--model", tiny, "--max-tokens", "3"]
    chat = subprocess.Popen(command, stdin=terminal, stdout=terminal, stderr=terminal, cwd=ROOT, env=env)
    os.close(terminal)
    seen: list[str] = []
    try:
        read_until(controller, r"/help lists the commands.*> ", seen)
        os.write(controller, b"hello orld" + b"\x1b[D" * 4 + b"w\r")  # mended with the left arrow: "hello world"
        read_until(controller, r"stopped: [^\n]*\n.*> ", seen)
        os.write(controller, b"\x1b[A\r")  # the up arrow brings the last message back
        read_until(controller, r"(stopped: [^\n]*\n.*){2}> ", seen)
        os.write(controller, b"/exit\r")
        assert chat.wait(timeout=60) == 0
    finally:
        chat.kill()
        os.close(controller)
    shown = "".join(seen)
    assert "^[[A" not in shown and len(STATS.findall(shown.replace("\r", ""))) == 2
    assert "> hello world\r\n" in shown  # the line recalled whole by the up arrow
    assert (tmp_path / "chat_history").read_text().splitlines()[-2:] == ["hello world", "/exit"]  # kept for next time


# ---- models: the catalog says which chat; list and rm -------------------------------------------------------


def test_chat_with_a_base_model_is_refused_before_downloading_it(tmp_path):
    for argv in (["chat"], ["generate", "hi", "--chat"]):
        done = refllm_process(*argv, "--model", "gemma3-270m", home=tmp_path)
        assert done.returncode == 1 and "has no chat template" in done.stderr and "downloading" not in done.stderr
    assert not (tmp_path / "models").exists()


def test_list_shows_pulled_models_with_their_checksum_and_rm_removes_them(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLLM_HOME", str(tmp_path))
    empty = refllm_process("list", home=tmp_path)
    assert empty.returncode == 0 and "no catalog models pulled" in empty.stdout
    path = catalog.model_path("smollm2-135m")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF, but not the one the catalog knows")
    listed = refllm_process("list", home=tmp_path)
    assert listed.returncode == 0
    row = listed.stdout.splitlines()[1].split()
    assert row[:5] == ["smollm2-135m", "39", "B", "MISMATCH:", "pull"] and row[-1] == str(path)
    removed = refllm_process("rm", "smollm2-135m", home=tmp_path)
    assert removed.returncode == 0 and not path.parent.exists()
    again = refllm_process("rm", "smollm2-135m", home=tmp_path)
    assert again.returncode == 1 and again.stderr == "refllm: error: smollm2-135m is not pulled; nothing to remove\n"


# ---- a real model: the answer ends on EOS, and says so ------------------------------------------------------------


@pytest.mark.real_model
def test_a_greedy_chat_answer_from_smollm2_ends_on_eos():
    real_model_or_skip(SMOLLM2)
    done = refllm_process("generate", "What is the capital of France?", "--chat", "--max-tokens", "64")
    assert done.returncode == 0, done.stderr
    assert "Paris" in done.stdout and STATS.findall(done.stderr)[0][1] == "end of text (EOS)"


@pytest.mark.real_model
def test_the_readme_python_snippet_runs_from_another_folder(tmp_path):
    real_model_or_skip(SMOLLM2)
    readme = (ROOT / "README.md").read_text()
    snippet = re.search(r"## Using it from Python.*?```python\n(.*?)```", readme, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Paris"
