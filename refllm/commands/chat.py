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
from refllm.commands.parsing import closest
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
  /show                 the model, its chat template, the settings and how much of the context is used
  /show template        the chat template itself
  /retry                answer the last message again (a new draw when sampling)
  /set                  show the settings
  /set NAME VALUE       change a setting: temperature, top-p, top-k, min-p, repetition-penalty,
                        seed, max-tokens (as the flags of the same names), or system (the system message)
  /save FILE            write the conversation and settings to FILE, as JSON
  /load FILE            read a conversation and settings written by /save
  /image FILE           attach an image to your next message (a vision-language model; repeatable)
  /reset                forget the conversation (the system message stays)
  /exit, /quit, Ctrl-D  quit (or Ctrl-C twice at an empty prompt)
several lines: start and end them with a line of \"\"\", or end each line but the last with \\
Ctrl-C stops an answer, or clears a half-typed line; up and down arrows walk the history"""
BLOCK = '"""'
CANCELLED = None  # what ``_user_lines`` yields for a line (or block of lines) cleared with Ctrl-C
QUIT_HINT = "(to quit: Ctrl-C again, Ctrl-D or /exit)"
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
    if args.model_name is not None and args.model is not None:
        raise UsageError(f"argument MODEL: the model is given twice, as {args.model_name} and with --model")
    name = args.model_name or args.model or catalog.DEFAULT_MODEL
    conversation = Conversation(sampling_params(args), args.system, args.quiet)  # every flag checked before loading
    model = common.load(name, chat=True, context=args.context, **precision(args))
    engine = common.start_engine(model, args.context, name)
    # the engine's model: a first run's moves from the spec ops to the kernels, and /show says which it is on
    conversation.about = lambda: describe_model(name, engine.executor.llm.model, engine.info.context_length)
    if sys.stdin.isatty():
        print(f"chatting with {name}; /help lists the commands", file=sys.stderr)
    try:
        for text in _messages(_user_lines()):
            if text in ("/exit", "/quit"):
                break
            conversation.handle(text, engine, model)
    finally:
        engine.close()
    return 0


def describe_model(name: str, model, context: int) -> dict[str, str]:
    """/show's first rows: the model and what it computes with."""
    c = model.config
    weights = "quantized blocks" if common.has_quantized_weights(model) else f"{model.dtype.name} weights"
    ops = "the spec ops (NumPy)" if model.ops.name == "spec" else "the Numba kernels"
    return {
        "model": f"{name}: {c.model_type}, {c.num_parameters / 1e6:.1f} M parameters, {weights}, {ops}",
        "context": str(context),
    }


class Conversation:
    """A conversation, its system message and its settings; ``handle`` takes one message or command."""

    def __init__(self, params: SamplingParams, system: str | None, quiet: bool):
        self.params, self.system, self.quiet = params, system, quiet
        self.messages: list[dict] = []
        self.about = lambda: {}  # -> what /show says of the model, set once it is loaded
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
            "/show": lambda rest: self._show(rest, model),
            "/retry": lambda rest: self._retry(engine, model),
            "/set": self._set,
            "/save": self._save,
            "/load": self._load,
            "/reset": self._reset,
            "/image": lambda rest: self._image(rest, model),
        }
        if command not in actions:
            _say(f"unknown command {command}{closest(command, actions) or ';'} /help lists the commands")
            return
        try:
            actions[command](rest.strip())
        except (InvalidInputError, OSError) as error:
            _say(f"{command}: {error}")

    def _answer(self, text: str, engine: Engine, model) -> None:
        # text alone stays a string (as /save keeps it); a message with images becomes content parts
        self.messages.append({"role": "user", "content": content_parts(text, len(self.attached)) if self.attached else text})
        images = self.images + self.attached
        if self._reply(engine, model, images):
            self.images, self.attached = images, []
        else:
            self.messages.pop()

    def _reply(self, engine: Engine, model, images: list[np.ndarray]) -> bool:
        """Answer the conversation as it stands -> whether an answer came (one past the context is refused)."""
        try:
            ids, pixels = chat_prompt(model, self.template_messages(), images)
            answer, stats = stream_answer(engine, ids, self.params, ctrl_c_stops=True, images=pixels)
        except InvalidInputError as error:  # a conversation past the context, say: the chat goes on
            _say(f"refllm: {error}; /reset starts a new conversation")
            return False
        self.messages.append({"role": "assistant", "content": answer})
        if stats.stopped == "interrupted":
            _say("(answer stopped)")
        if not self.quiet:
            _say(stats.line())
        return True

    def _retry(self, engine: Engine, model) -> None:
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise InvalidInputError("nothing to retry yet: no answer in this conversation")
        previous = self.messages.pop()
        if not self._reply(engine, model, self.images):
            self.messages.append(previous)

    def _show(self, rest: str, model) -> None:
        template = model.tokenizer.chat_template.source
        if rest == "template":
            _say(template)
            return
        if rest:
            raise UsageError(f"no /show {rest}; /show alone, or /show template")
        used = len(chat_prompt(model, self.template_messages(), self.images)[0]) if self.template_messages() else 0
        about = self.about()
        context = int(about.get("context", 0)) or None
        share = f" ({100 * used / context:.1f}%)" if context else ""
        rows = {
            "model": about.get("model", "?"),
            "template": f"the model's chat template, {len(template.splitlines())} lines (/show template prints it)",
            "context": f"{used:,} of {context or '?':,} tokens used{share}, {len(self.messages)} messages",
        }
        lines = [f"  {key:<20}{value}" for key, value in rows.items()]
        _say("\n".join([*lines, "settings:", self._describe_settings()]))

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
            _say(f"system message: {value}" if value else "no system message")
            return
        field = name.replace("-", "_")
        if field not in SAMPLING_FLAGS:
            raise UsageError(f"no setting named {name!r}; /set alone lists them")
        if not value:
            raise UsageError(f"/set {name} needs a value")
        settings = self._settings() | {field: _parse_setting(field, value)}
        self.params = checked_params(settings, name=lambda f: f.replace("_", "-"), logit_bias=self.params.logit_bias)
        _say(f"{name} = {_shown(getattr(self.params, field))}")

    def _settings(self) -> dict:
        return {field: getattr(self.params, field) for field in SAMPLING_FLAGS}

    def _describe_settings(self) -> str:
        lines = [f"  {field.replace('_', '-'):<20}{_shown(value)}" for field, value in self._settings().items()]
        return "\n".join([*lines, f"  {'system':<20}{_shown(self.system)}"])

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


def _shown(value) -> str:
    """A setting as a person reads it: no value is "none" (never Python's None or quotes)."""
    return "none" if value is None else str(value)


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


def _messages(lines: Iterator[str | None]) -> Iterator[str]:
    """Join the lines of a multi-line message: between two lines of \"\"\", or each ending with a backslash.
    A line cleared with Ctrl-C (``CANCELLED``) drops the message it was part of."""
    for line in lines:
        if line is CANCELLED:
            continue
        text = line.rstrip("\n")
        if text.strip() == BLOCK:
            block, more = [], ""
            for more in lines:
                if more is CANCELLED or more.strip() == BLOCK:
                    break
                block.append(more.rstrip("\n"))
            if more is not CANCELLED:
                yield "\n".join(block).strip()
            continue
        while text is not None and text.endswith("\\"):
            more = next(lines, "")
            text = None if more is CANCELLED else text[:-1] + "\n" + more.rstrip("\n")
        if text is not None:
            yield text.strip()


def _user_lines() -> Iterator[str | None]:
    """Lines typed at a "> " prompt on a terminal, with history, or read from piped stdin; ends at EOF.

    Ctrl-C clears a half-typed line (or the message of several lines being typed: ``CANCELLED``); at an
    empty prompt it says how to quit, and a second Ctrl-C in a row quits."""
    if not sys.stdin.isatty():
        yield from sys.stdin
        return
    history = _start_history()
    in_block = continued = warned = False
    try:
        while True:
            try:
                line = input("... " if in_block or continued else "> ")
            except EOFError:
                print(file=sys.stderr)
                return
            except KeyboardInterrupt:
                typed = in_block or continued or (history is not None and _line_buffer())
                if not typed and warned:
                    print(file=sys.stderr)
                    return
                _say("" if typed else f"\n{QUIT_HINT}")
                warned, in_block, continued = not typed, False, False
                yield CANCELLED
                continue
            warned = False
            if line.strip() == BLOCK:
                in_block = not in_block
            continued = line.endswith("\\")
            yield line
    finally:
        if history is not None:
            _save_history(history)


def _line_buffer() -> str:
    import readline

    return readline.get_line_buffer()


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
