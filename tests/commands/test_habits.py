"""The habits people bring from other tools (issue 32's "Why", case by case): flags under the names llama.cpp,
ollama and mlx-lm use, the model as a plain argument, "did you mean" for anything unknown, the renamed flags'
old names, help that shows examples and no markup, and ``check`` refusing a wrong server before loading anything.
"""

from __future__ import annotations

import re

import pytest

from refllm import cli
from refllm.commands import common
from refllm.errors import InvalidInputError
from refllm.server import BackgroundServer, create_app
from tests.helpers.command_line import refllm_process, run


def one_usage_line(err: str, command: str) -> str:
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"refllm {command}: error: ") and err.rstrip().endswith(f"(see refllm {command} --help)")
    return err


# ---- the flags and arguments of other tools ---------------------------------------------------------------------


def test_a_prompt_and_the_token_limit_under_the_names_other_tools_use(tiny, capsys):
    expected = run(capsys, "generate", "hello", "--model", tiny, "--max-tokens", "4")
    for argv in (["-p", "hello"], ["--prompt", "hello"]):
        assert run(capsys, "generate", *argv, "-m", tiny, "-n", "4")[:2] == expected[:2]
    code, _, err = run(capsys, "generate", "hello", "-p", "again", "-m", tiny)
    assert code == 2 and "the prompt is given twice" in one_usage_line(err, "generate")
    code, _, err = run(capsys, "generate", "-m", tiny)
    assert code == 2 and "no prompt" in one_usage_line(err, "generate")


def test_the_model_as_the_first_argument_of_chat_and_run(tiny, capsys, monkeypatch):
    import io
    import sys

    def chat(*argv: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
        return run(capsys, *argv)

    by_flag = chat("chat", "--model", tiny, "-n", "3")
    assert by_flag[0] == 0 and by_flag[1]
    assert chat("chat", tiny, "-n", "3")[:2] == by_flag[:2]
    assert chat("run", tiny, "-n", "3")[:2] == by_flag[:2]  # ollama's run: a chat
    assert run(capsys, "run", tiny, "hello", "-n", "3")[:2] == run(capsys, "generate", "hello", "--chat", "-m", tiny, "-n", "3")[:2]
    code, _, err = chat("chat", tiny, "--model", tiny)
    assert code == 2 and "the model is given twice" in one_usage_line(err, "chat")


@pytest.mark.parametrize(
    "argv, command, hint",
    [
        (["generate", "hi", "--max-tokns", "3"], "generate", "did you mean --max-tokens?"),
        (["generate", "hi", "--n-predict", "3"], "generate", "refllm's flag for --n-predict is --max-tokens"),
        (["generate", "hi", "--ctx-size", "64"], "generate", "refllm's flag for --ctx-size is --context"),
        (["generate", "Once", "upon", "a", "time"], "generate", 'quote a text of several words'),
        (["chat", "--sytem", "x"], "chat", "did you mean --system?"),
        (["serve", "--prot", "80"], "serve", "did you mean --port?"),
        (["pull", "smollm2"], "pull", "did you mean smollm2-135m?"),
        (["rm", "gemma-270m"], "rm", "did you mean gemma3-270m?"),
    ],
)
def test_an_unknown_flag_points_at_the_commands_own_help_with_the_closest_one(argv, command, hint, tmp_path):
    done = refllm_process(*argv, home=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert hint in one_usage_line(done.stderr, command)


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["generat", "hi"], "no command 'generat'; did you mean refllm generate?"),
        (["smollm2-135m"], "to talk with it: refllm chat smollm2-135m"),
    ],
)
def test_an_unknown_command_names_the_closest_or_how_to_run_a_model(argv, hint, tmp_path):
    done = refllm_process(*argv, home=tmp_path)
    assert done.returncode == 2 and hint in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_misspelt_model_is_refused_with_the_closest_name_before_any_download(tmp_path):
    for argv in (["generate", "hi", "-m", "smollm2"], ["chat", "smolm2-135m"], ["info", "gemma3"]):
        done = refllm_process(*argv, home=tmp_path)
        assert done.returncode == 1 and "did you mean" in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "models").exists()


# ---- the renamed flags: the old names still work, for one release, and say so ------------------------------------


@pytest.mark.parametrize(
    "argv, old, new, option, value",
    [
        (["generate", "hi", "--float32"], "--float32", "--dequantize", "quantized", False),
        (["chat", "--reference"], "--reference", "--spec-ops", "reference", True),
        (["perplexity", "x.txt", "--reference"], "--reference", "--spec-ops", "reference", True),
    ],
)
def test_old_flag_names_warn_and_mean_the_new_ones(argv, old, new, option, value, monkeypatch, capsys, tmp_path):
    asked = {}

    def load(name, **options):
        asked.update(options)
        raise InvalidInputError("stop here")

    monkeypatch.setattr(common, "load", load)
    (tmp_path / "x.txt").write_text("some text to score")
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 1
    warning = capsys.readouterr().err.splitlines()[0]
    assert f"warning: {old} is deprecated" in warning and f"it means {new}" in warning
    assert asked[option] is value


def test_list_no_verify_and_its_old_name(tmp_path):
    from refllm import catalog

    home = tmp_path
    path = home / "models" / "smollm2-135m" / catalog.CATALOG["smollm2-135m"].filename
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not the real file")
    quick = refllm_process("list", "--no-verify", home=home)
    old = refllm_process("list", "--fast", home=home)
    assert "not checked" in quick.stdout and quick.stdout == old.stdout and quick.stderr == ""
    assert "--fast is deprecated" in old.stderr and "--no-verify" in old.stderr


# ---- help ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["golden"], ["golden", "dump"], ["golden", "check"], ["check"], ["run"]])
def test_help_shows_examples_and_no_markup(argv, capsys):
    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    out = capsys.readouterr().out
    assert re.search(r"^examples?:\n  refllm ", out, re.M), out
    assert "``" not in out


# ---- check: a wrong server, URL or model name is said first, in one sentence -----------------------------------------


def test_check_refuses_a_wrong_server_before_loading_anything(tiny, tmp_path):
    dead = refllm_process("check", "--server", "http://127.0.0.1:9/v1", "--model", "smollm2-135m", home=tmp_path)
    assert dead.returncode == 1 and dead.stderr.startswith("refllm: error: cannot reach http://127.0.0.1:9/v1")
    assert len(dead.stderr.splitlines()) == 1 and "loading" not in dead.stderr
    import refllm

    with BackgroundServer(create_app(refllm.load_model(tiny), model_name="tiny")) as server:
        cases = [
            ([server.url, "tiny"], f"{server.url}/models answered HTTP 404; is this an OpenAI API: its base URL usually"
                                   f" ends in /v1 (try {server.url}/v1)?"),
            ([server.url + "/v1", "smollm2-135m"], f"{server.url}/v1 serves tiny, not smollm2-135m"),
            ([server.url + "/v1", "tiny"], "refllm has no model tiny to check"),
        ]  # fmt: skip
        for (url, model), message in cases:
            done = refllm_process("check", "--server", url, "--model", model, home=tmp_path)
            assert done.returncode == 1 and message in done.stderr and len(done.stderr.splitlines()) == 1
            assert "loading" not in done.stderr and "downloading" not in done.stderr
    assert not (tmp_path / "models").exists()
