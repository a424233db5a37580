"""The command line's parsers: a usage error is one line that points at the sub-command's own help,
with the closest valid flag, command or model name where one is close ("did you mean").

Flags people bring from other tools (llama.cpp's ``--n-predict``, ``--temp``,
``--ctx-size``; ollama's and mlx-lm's) are not accepted under those names, but
an error names refllm's flag for the same thing.
"""

from __future__ import annotations

import argparse
import difflib
import sys

EXIT_USAGE = 2

# Other tools' flags -> refllm's flag for the same setting (only for suggestions).
FOREIGN_FLAGS = {
    "--n-predict": "--max-tokens",
    "--num-predict": "--max-tokens",
    "--max-new-tokens": "--max-tokens",
    "--temp": "--temperature",
    "--ctx-size": "--context",
    "--ctx": "--context",
    "--num-ctx": "--context",
    "-c": "--context",
    "--system-prompt": "--system",
    "-sys": "--system",
    "-s": "--seed",
    "--repeat-penalty": "--repetition-penalty",
    "--file": "-p - (the prompt from standard input)",
    "-f": "-p - (the prompt from standard input)",
}


def usage_error(prog: str, message: str) -> str:
    return f"{prog}: error: {message} (see {prog} --help)\n"


def closest(word: str, candidates, what: str = "") -> str:
    """ "; did you mean X?" for the candidate closest to ``word``, or "" when none is close."""
    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {what}{match[0]}?" if match else ""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line that points at --help."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, usage_error(self.prog, message))


class CommandParser(Parser):
    """A sub-command's parser (a plugin's too): it takes ``--debug`` after the command as well, and refuses
    an argument it does not know itself, naming its own help and the closest flag it has."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            self.error(self._unrecognized(extras))
        return namespace, extras

    def _unrecognized(self, extras: list[str]) -> str:
        message = f"unrecognized arguments: {' '.join(extras)}"
        flag = next((e.split("=")[0] for e in extras if e.startswith("-") and e != "-"), None)
        if flag is None:
            return message + "; quote a text of several words, as in \"Once upon a time\""
        if flag in FOREIGN_FLAGS:
            return message + f"; refllm's flag for {flag} is {FOREIGN_FLAGS[flag]}"
        return message + closest(flag, self._option_string_actions)


def check_command(argv: list[str], commands: dict[str, argparse.ArgumentParser], models) -> None:
    """Refuse an unknown COMMAND in one line with the closest command, or the way to run a model of that name."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] in commands:
        return
    if {"-h", "--help", "--version"} & set(argv[: argv.index(words[0])]):
        return
    word = words[0]
    if word in models:
        hint = f"; to talk with it: refllm chat {word} (or refllm run {word} PROMPT)"
    else:
        hint = closest(word, commands, "refllm ")
    sys.stderr.write(usage_error("refllm", f"no command {word!r}{hint}"))
    sys.exit(EXIT_USAGE)
