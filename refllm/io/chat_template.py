"""Chat templates: turn a list of messages into the prompt text a model was trained on.

A chat template is a Jinja program shipped with a Hugging Face model (in
`tokenizer_config.json` or `chat_template.jinja`). A wrong character in the
rendered prompt (a missing newline, a doubled BOS) silently degrades the model,
so this module renders templates the way transformers does: the same sandboxed
Jinja environment and options, the same extra filter, globals and tags, the
same variables, and the same clean-up of messages before the template sees them.
Templates come from the Hub and are untrusted code; they run in Jinja's
immutable sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from refllm.errors import InvalidInputError

# Names a message's reasoning arrives under; templates read `reasoning_content` (most) or `thinking` (gpt-oss).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(InvalidInputError):
    """A chat template that does not compile, fails while rendering, or refuses the conversation.

    A template refuses with `{{ raise_exception('...') }}`; that message becomes this error's message.
    """


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: marks assistant text for training masks.

    Rendering keeps the body unchanged; the tag must still parse, or templates that use it would not compile.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        # A call block (not inline nodes) so `{% set %}` inside stays scoped to the block, as in transformers.
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: jinja2.runtime.Macro) -> str:
        return caller()


class _DictConstructor:
    """`dict(...)` and `dict.fromkeys(...)` for templates.

    Jinja's default `dict` global is the type itself, whose unbound methods (`dict.update(d, ...)`) let a
    template mutate data the immutable sandbox otherwise protects.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict:
        return dict.fromkeys(keys, value)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own `tojson` HTML-escapes `<`, `>`, `&` and `'`, which would corrupt tool schemas in the prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictConstructor()
    return env


_ENVIRONMENT = _make_environment()


def _prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate a conversation and return the copy of it that a template sees.

    Each message must be a mapping with a string 'role' and a 'content' key. As in transformers, keys whose
    value is None are dropped (templates test for a missing key, and would print a literal "None"), and
    reasoning given under any of its names is also offered as `reasoning_content` and `thinking`.
    The caller's messages are never modified.
    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InvalidInputError(f"messages must be a list of dicts, got {type(messages).__name__}: {messages!r:.200}")
    if not messages:
        raise InvalidInputError("messages is empty; a chat template needs at least one message")
    prepared = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidInputError(
                f"messages[{index}] must be a dict, got {type(message).__name__}: {message!r:.200}"
            )
        for key in ("role", "content"):
            if key not in message:
                raise InvalidInputError(f"messages[{index}] has no {key!r} key: {message!r:.200}")
        if not isinstance(message["role"], str):
            raise InvalidInputError(f"messages[{index}]['role'] must be a string, got {message['role']!r:.200}")
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


def _check_list_of_dicts(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise InvalidInputError(f"{name} must be a list of dicts or None, got {type(value).__name__}")
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise InvalidInputError(f"{name}[{index}] must be a dict (a JSON schema), got {item!r:.200}")


class ChatTemplate:
    """A compiled chat template.

    `source` is the Jinja text. Compiling happens once, here, so a template with a syntax error is refused
    when it is loaded rather than at the first chat.
    """

    def __init__(self, source: str):
        if not isinstance(source, str):
            raise InvalidInputError(f"a chat template must be a string, got {type(source).__name__}")
        self.source = source
        try:
            self._template = _ENVIRONMENT.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not compile (line {exc.lineno}): {exc.message}") from exc

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """Render `messages` to prompt text.

        `add_generation_prompt` appends the header that starts the assistant's reply. `tools` (JSON schemas)
        and `documents` are always defined for the template, None when not given, because templates test
        `tools is not none`. Any other keyword (`bos_token`, `enable_thinking`, ...) becomes a template variable.
        """
        prepared = _prepare_messages(messages)
        _check_list_of_dicts("tools", tools)
        _check_list_of_dicts("documents", documents)
        try:
            return self._template.render(
                messages=prepared,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                documents=documents,
                **variables,
            )
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError) as exc:
            raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc

    def __repr__(self) -> str:
        return f"ChatTemplate({self.source[:60]!r}{'...' if len(self.source) > 60 else ''})"
