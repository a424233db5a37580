"""``refllm chat``: a conversation at a prompt with line editing and history, commands, and a stats line.

On a terminal, the standard library's ``readline`` gives line editing and a
history kept from one chat to the next in ``$REFLLM_HOME/chat_history``. Piped input
works the same, one message a line. A message spans several lines between two
lines of ``\"\"\"``, or with a backslash at the end of each line but the last.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from refllm import catalog
from refllm.commands import common
from refllm.commands.answer import stream_answer
from refllm.commands.flags import SAMPLING_FLAGS, UsageError, checked_params, precision, sampling_params
from refllm.errors import InvalidInputError
from refllm.io.images import read_image
from refllm.io.tokenizer import Tokenizer
from refllm.io.vision_prompt import content_parts, encode_chat
from refllm.runtime.engine import Engine
from refllm.runtime.sampling import SamplingParams

HELP = """\
commands:
  /help                 this list
  /set                  show the settings
  /set NAME VALUE       change a setting: temperature, top-p, top-k, min-p, repetition-penalty,
                        seed, max-tokens (as the flags of the same names), or system (the system message)
  /save FILE            write the conversation and settings to FILE, as JSON
  /load FILE            read a conversation and settings written by /save
  /image FILE           attach an image to your next message (a vision-language model; repeatable)
  /reset                forget the conversation (the system message stays)
  /exit, /quit, Ctrl-D  quit
several lines: start and end them with a line of \"\"\", or end each line but the last with \\
Ctrl-C stops an answer; up and down arrows walk the history"""
BLOCK = '"""'
FORMAT = "refllm-chat/1"  # the "format" field of a saved conversation


def chat_ids(tokenizer: Tokenizer, messages: list[dict]) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)


def chat_prompt(model, messages: list[dict], images: list[np.ndarray]) -> tuple[list[int], list[np.ndarray]]:
    """A conversation -> (prompt ids, pixel batches). A vision-language model reads its messages as content
    parts, images (uint8 [H, W, 3], one per image part, in order) through its image processor."""
    if model.metadata.vision is None:
        if images:
            raise InvalidInputError(
                f"{model.metadata.architecture} reads text only; images need a vision-language model"
                " (SmolVLM, Gemma 3 with vision)"
            )
        return chat_ids(model.tokenizer, messages), []
    return encode_chat(model.tokenizer, model.image_processor, messages, images)


def cmd_chat(args: argparse.Namespace) -> int:
    conversation = Conversation(sampling_params(args), args.system, args.quiet)  # every flag checked before loading
    model = common.load(args.model, chat=True, context=args.context, **precision(args))
    engine = common.start_engine(model, args.context)
    if sys.stdin.isatty():
        print(f"chatting with {args.model}; /help lists the commands", file=sys.stderr)
    try:
        for text in _messages(_user_lines()):
            if text in ("/exit", "/quit"):
                break
            conversation.handle(text, engine, model)
    finally:
        engine.close()
    return 0


class Conversation:
    """A conversation, its system message and its settings; ``handle`` takes one message or command."""

    def __init__(self, params: SamplingParams, system: str | None, quiet: bool):
        self.params, self.system, self.quiet = params, system, quiet
        self.messages: list[dict] = []
        self.images: list[np.ndarray] = []  # the conversation's images, in the order their messages hold them
        self.attached: list[np.ndarray] = []  # /image's, waiting for the next message

    def template_messages(self) -> list[dict]:
        """What the chat template renders: the system message, if any, then the conversation."""
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.messages

    def handle(self, text: str, engine: Engine, model) -> None:
        command, _, rest = text.partition(" ")
        if not text:
            return
        if not text.startswith("/"):
            self._answer(text, engine, model)
            return
        actions = {
            "/help": self._help,
            "/set": self._set,
            "/save": self._save,
            "/load": self._load,
            "/reset": self._reset,
            "/image": lambda rest: self._image(rest, model),
        }
        if command not in actions:
            _say(f"unknown command {command}; /help lists the commands")
            return
        try:
            actions[command](rest.strip())
        except (InvalidInputError, OSError) as error:
            _say(f"{command}: {error}")

    def _answer(self, text: str, engine: Engine, model) -> None:
        # text alone stays a string (as /save keeps it); a message with images becomes content parts
        self.messages.append({"role": "user", "content": content_parts(text, len(self.attached)) if self.attached else text})
        images = self.images + self.attached
        try:
            ids, pixels = chat_prompt(model, self.template_messages(), images)
            answer, stats = stream_answer(engine, ids, self.params, ctrl_c_stops=True, images=pixels)
        except InvalidInputError as error:  # a conversation past the context, say: the chat goes on
            self.messages.pop()
            _say(f"refllm: {error}; /reset starts a new conversation")
            return
        self.images, self.attached = images, []
        self.messages.append({"role": "assistant", "content": answer})
        if stats.stopped == "interrupted":
            _say("(answer stopped)")
        if not self.quiet:
            _say(stats.line())

    def _help(self, rest: str) -> None:
        _say(HELP)

    def _reset(self, rest: str) -> None:
        self.messages, self.images, self.attached = [], [], []
        _say("(conversation cleared)")

    def _image(self, rest: str, model) -> None:
        if not rest:
            raise UsageError("/image needs an image file")
        if model.metadata.vision is None:
            raise InvalidInputError(f"{model.metadata.architecture} reads text only; /image needs a vision-language model")
        self.attached.append(read_image(rest))
        _say(f"(image {rest} goes with your next message)")

    def _set(self, rest: str) -> None:
        if not rest:
            _say(self._describe_settings())
            return
        name, _, value = rest.partition(" ")
        value = value.strip()
        if name == "system":
            self.system = value or None
            _say(f"system message: {value!r}" if value else "no system message")
            return
        field = name.replace("-", "_")
        if field not in SAMPLING_FLAGS:
            raise UsageError(f"no setting named {name!r}; /set alone lists them")
        if not value:
            raise UsageError(f"/set {name} needs a value")
        settings = self._settings() | {field: _parse_setting(field, value)}
        self.params = checked_params(settings, name=lambda f: f.replace("_", "-"), logit_bias=self.params.logit_bias)
        _say(f"{name} = {getattr(self.params, field)}")

    def _settings(self) -> dict:
        return {field: getattr(self.params, field) for field in SAMPLING_FLAGS}

    def _describe_settings(self) -> str:
        lines = [f"  {field.replace('_', '-'):<20}{value}" for field, value in self._settings().items()]
        return "\n".join([*lines, f"  {'system':<20}{self.system!r}"])

    def _save(self, rest: str) -> None:
        if not rest:
            raise UsageError("/save needs a file name")
        if self.images or self.attached:
            raise InvalidInputError("/save keeps text conversations; this one holds images")
        saved = {"format": FORMAT, "system": self.system, "settings": self._settings(), "messages": self.messages}
        Path(rest).expanduser().write_text(json.dumps(saved, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        _say(f"saved {len(self.messages)} messages to {rest}")

    def _load(self, rest: str) -> None:
        if not rest:
            raise UsageError("/load needs a file name")
        path = Path(rest).expanduser()
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InvalidInputError(f"{rest} is not a conversation saved by /save: {error}") from None
        messages, system, settings = _read_saved(saved, rest)
        params = checked_params(
            settings, name=lambda f: f"{rest}: setting {f.replace('_', '-')}", logit_bias=self.params.logit_bias
        )
        self.messages, self.system, self.params = messages, system, params  # all checked: now change
        _say(f"loaded {len(messages)} messages from {rest}")


def _read_saved(saved, name: str) -> tuple[list[dict], str | None, dict]:
    """A /save file's (messages, system message, settings), each checked; nothing half-read is kept."""
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise InvalidInputError(f'{name} is not a conversation saved by /save (no "format": "{FORMAT}")')
    messages, system, settings = saved.get("messages"), saved.get("system"), saved.get("settings", {})
    roles = ("user", "assistant")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and m.get("role") in roles and isinstance(m.get("content"), str) for m in messages
    ):
        raise InvalidInputError(f'{name}: "messages" must be a list of {{"role": user|assistant, "content": text}}')
    if system is not None and not isinstance(system, str):
        raise InvalidInputError(f'{name}: "system" must be text or null')
    if not isinstance(settings, dict) or set(settings) - set(SAMPLING_FLAGS):
        raise InvalidInputError(f"{name}: \"settings\" may hold only {', '.join(SAMPLING_FLAGS)}")
    return [{"role": m["role"], "content": m["content"]} for m in messages], system, settings


def _parse_setting(field: str, value: str) -> int | float | None:
    whole = field in ("top_k", "seed", "max_tokens")
    if field == "seed" and value == "none":
        return None
    try:
        number = int(value) if whole else float(value)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise UsageError(f"{field.replace('_', '-')} must be {kind}, not {value!r}") from None
    if field == "seed" and number < 0:
        raise UsageError(f"seed must be 0 or more (or none), not {number}")
    return number


def _messages(lines: Iterator[str]) -> Iterator[str]:
    """Join the lines of a multi-line message: between two lines of \"\"\", or each ending with a backslash."""
    for line in lines:
        text = line.rstrip("\n")
        if text.strip() == BLOCK:
            block = []
            for more in lines:
                if more.strip() == BLOCK:
                    break
                block.append(more.rstrip("\n"))
            yield "\n".join(block).strip()
            continue
        while text.endswith("\\"):
            text = text[:-1] + "\n" + next(lines, "").rstrip("\n")
        yield text.strip()


def _user_lines() -> Iterator[str]:
    """Lines typed at a "> " prompt on a terminal, with history, or read from piped stdin; ends at EOF or Ctrl-C."""
    if not sys.stdin.isatty():
        yield from sys.stdin
        return
    history = _start_history()
    in_block = continued = False
    try:
        while True:
            try:
                line = input("... " if in_block or continued else "> ")
            except (EOFError, KeyboardInterrupt):
                print(file=sys.stderr)
                return
            if line.strip() == BLOCK:
                in_block = not in_block
            continued = line.endswith("\\")
            yield line
    finally:
        if history is not None:
            _save_history(history)


def _start_history() -> Path | None:
    """Turn on readline's line editing with the history of earlier chats -> the history file (None: no readline)."""
    try:
        import readline
    except ImportError:  # Windows without pyreadline: plain input() still works
        return None
    path = catalog.refllm_home() / "chat_history"
    readline.set_history_length(1000)
    if path.exists():
        readline.read_history_file(path)
    return path


def _save_history(path: Path) -> None:
    import readline

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(path)
    except OSError as error:
        _say(f"(history not saved: {error})")


def _say(text: str) -> None:
    print(text, file=sys.stderr)
