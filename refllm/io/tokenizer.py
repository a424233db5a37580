"""Text <-> token ids for Hugging Face model directories, and detokenization for streaming.

`Tokenizer` wraps the `tokenizers` library (which does the actual tokenization) with the settings that live
beside `tokenizer.json` in a model directory: the BOS/EOS tokens, whether to add them, and the chat template.
`IncrementalDetokenizer` turns generated ids into text one token at a time without ever emitting half of a
character that byte-level tokens split.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from refllm.errors import InvalidInputError, RefllmKeyError, TokenOutOfRangeError
from refllm.io.chat_template import ChatTemplate, ChatTemplateError
from refllm.io.json_file import read_json_object

# Decoding a byte sequence that stops inside a UTF-8 character yields this character at the end.
_REPLACEMENT_CHAR = "\ufffd"


class UnknownTokenError(RefllmKeyError):
    """A token string that is not in the tokenizer's vocabulary."""


class TokenizerFileError(InvalidInputError):
    """A tokenizer file in a model directory that cannot be read, or a field in it with the wrong form."""


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the special-token settings and chat template of a model.

    `add_bos_token` decides the BOS when `encode(..., add_special_tokens=True)`:
      None  -- leave it to the backend's post-processor (what `tokenizer.json` alone says);
      True  -- make BOS the first id, adding it only if the post-processor did not;
      False -- never start with a BOS the post-processor added (a BOS written in the text stays).
    `add_eos_token=True` makes EOS the last id in the same way. `extra_eos_tokens` are further tokens that end
    generation (e.g. `<|eot_id|>` beside `<|end_of_text|>`); `eos_token_ids` lists them after the EOS.
    `chat_template` is kept compiled, as a `ChatTemplate` (its `source` is the text), or None.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        add_bos_token: bool | None = None,
        add_eos_token: bool = False,
        chat_template: str | None = None,
        extra_eos_tokens: tuple[str, ...] = (),
    ):
        if not isinstance(backend, tokenizers.Tokenizer):
            raise InvalidInputError(f"backend must be a tokenizers.Tokenizer, got {type(backend).__name__}")
        if add_bos_token and bos_token is None:
            raise InvalidInputError("add_bos_token=True needs a bos_token")
        if add_eos_token and eos_token is None:
            raise InvalidInputError("add_eos_token=True needs an eos_token")
        if isinstance(extra_eos_tokens, str):
            raise InvalidInputError(f"extra_eos_tokens must be a tuple of token strings, got {extra_eos_tokens!r}")
        self.backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos_token = add_bos_token
        self.add_eos_token = add_eos_token
        self.chat_template = None if chat_template is None else ChatTemplate(chat_template)
        # Added tokens may sit above the base vocabulary, so the id range is set by the largest id.
        self._vocab_size = max(backend.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        self._bos_token_id = None if bos_token is None else self.token_to_id(bos_token)
        self._eos_token_id = None if eos_token is None else self.token_to_id(eos_token)
        eos_tokens = ([] if eos_token is None else [eos_token]) + list(extra_eos_tokens)
        self._eos_token_ids = tuple(dict.fromkeys(self.token_to_id(token) for token in eos_tokens))

    @classmethod
    def from_directory(cls, path: str | Path) -> Tokenizer | None:
        """Load the tokenizer of a Hugging Face model directory, or None if it has no `tokenizer.json`.

        Reads `tokenizer.json`, then from `tokenizer_config.json` the BOS/EOS tokens (plain strings or
        `{"content": ...}` dicts), `add_bos_token`, `add_eos_token` and `chat_template` (a string, or a list of
        `{"name", "template"}` of which "default" is used). `special_tokens_map.json` supplies BOS/EOS the
        config does not name, and `chat_template.jinja` replaces the config's template, as transformers does.
        The config's `add_bos_token`/`add_eos_token` override the post-processor in `tokenizer.json`, as
        llama.cpp's converter does (transformers 5 ignores them once `tokenizer.json` exists); without them
        the post-processor decides.
        """
        directory = Path(path)
        if not directory.is_dir():
            raise InvalidInputError(f"{directory} is not a directory")
        tokenizer_file = directory / "tokenizer.json"
        if not tokenizer_file.is_file():
            return None
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the library raises a bare Exception for malformed files
            raise TokenizerFileError(f"{tokenizer_file} cannot be read: {exc}") from exc
        config = _read_json_object(directory / "tokenizer_config.json")
        special_tokens_map = _read_json_object(directory / "special_tokens_map.json")

        def special_token(name: str) -> str | None:
            source = config if name in config else special_tokens_map
            return _token_content(source.get(name), f"{name} in {directory}")

        def flag(name: str) -> bool | None:
            value = config.get(name)
            if value is not None and not isinstance(value, bool):
                raise TokenizerFileError(f"{name} in {directory} must be true, false or null, got {value!r}")
            return value

        return cls(
            backend,
            bos_token=special_token("bos_token"),
            eos_token=special_token("eos_token"),
            add_bos_token=flag("add_bos_token"),
            add_eos_token=bool(flag("add_eos_token")),
            chat_template=_chat_template_source(directory, config),
        )

    @property
    def vocab_size(self) -> int:
        """One more than the largest token id, added tokens included: valid ids are [0, vocab_size)."""
        return self._vocab_size

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: the EOS first, then the extra EOS tokens, without repeats."""
        return self._eos_token_ids

    def token_to_id(self, token: str) -> int:
        token_id = self.backend.token_to_id(token) if isinstance(token, str) else None
        if token_id is None:
            raise UnknownTokenError(f"token {token!r} is not in the vocabulary")
        return token_id

    def id_to_token(self, token_id: int) -> str:
        token = self.backend.id_to_token(self._check_id(token_id))
        if token is None:
            raise TokenOutOfRangeError(f"token id {token_id} has no token in the vocabulary")
        return token

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with `add_special_tokens`, BOS/EOS as the constructor's flags say."""
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        encoding = self.backend.encode(text, add_special_tokens=add_special_tokens)
        return self._with_special_tokens(encoding, add_special_tokens)

    def encode_many(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """``encode`` of each text, in one call that lets other Python threads run meanwhile (a server's, say)."""
        if not all(isinstance(text, str) for text in texts):
            raise InvalidInputError("texts must be a list of str")
        encodings = self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)  # releases the GIL
        return [self._with_special_tokens(encoding, add_special_tokens) for encoding in encodings]

    @functools.cached_property
    def longest_token_chars(self) -> int:
        """The most characters any token of the vocabulary spells: a text of N characters is at least
        N / longest_token_chars tokens long, which bounds a text's length before it is tokenized."""
        return max(len(token) for token in self.backend.get_vocab(with_added_tokens=True))

    def _with_special_tokens(self, encoding: tokenizers.Encoding, add_special_tokens: bool) -> list[int]:
        ids = encoding.ids
        if not add_special_tokens:
            return ids
        bos, eos = self._bos_token_id, self._eos_token_id
        # The post-processor's own tokens are the ones that belong to no input sequence.
        if self.add_bos_token is False and ids and ids[0] == bos and encoding.sequence_ids[0] is None:
            ids = ids[1:]
        if self.add_bos_token and ids[:1] != [bos]:
            ids = [bos, *ids]
        if self.add_eos_token and ids[-1:] != [eos]:
            ids = [*ids, eos]
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids` (any ints, NumPy ints included), each checked to lie in [0, vocab_size)."""
        return self.backend.decode([self._check_id(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render a conversation to prompt text with the model's chat template.

        The template sees `bos_token` and `eos_token` (only those that are set, so an unset one renders as
        empty, not "None"), `tools=None`, `documents=None`, and every keyword given, which overrides them.
        Templates usually write the BOS themselves, so encode the result with `add_special_tokens=False`.
        """
        if self.chat_template is None:
            raise ChatTemplateError("this tokenizer has no chat template")
        special_tokens = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        variables = {name: token for name, token in special_tokens.items() if token is not None} | kwargs
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **variables)

    def _check_id(self, token_id: Any) -> int:
        try:
            token_id = operator.index(token_id)
        except TypeError:
            raise InvalidInputError(f"token ids must be integers, got {token_id!r}") from None
        if not 0 <= token_id < self._vocab_size:
            raise TokenOutOfRangeError(f"token id {token_id} is outside [0, {self._vocab_size})")
        return token_id

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self._vocab_size}, bos_token={self.bos_token!r}, eos_token={self.eos_token!r}, "
            f"add_bos_token={self.add_bos_token}, chat_template={self.chat_template is not None})"
        )


class IncrementalDetokenizer:
    """Text of a growing id sequence, handed out piece by piece as ids arrive (for streaming).

    Each `add` returns only text that is complete. A character split across byte-level tokens (an emoji in
    byte-level BPE, a `<0xF0>` byte-fallback token) decodes to a trailing U+FFFD until its last byte arrives,
    so text ending in U+FFFD is held back. Each step decodes only a window of recent ids, not everything, to
    stay cheap; the window starts one emitted piece back, so decoders that treat the first token specially
    (SentencePiece dropping its leading space) see the same context as a full decode.

    `context` are ids already shown, e.g. the prompt (or its last few ids, starting at a character boundary):
    the first new token is then decoded after them, so its leading space survives. The pieces, followed by
    `flush()`, concatenate to `decode(context + ids)[len(decode(context)):]`.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = False, context: Sequence[int] = ()):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids = [tokenizer._check_id(i) for i in context]
        self._prefix_offset = 0  # start of the decoding window
        self._read_offset = len(self._ids)  # ids before this have been emitted

    def add(self, token_id: int) -> str:
        """Take one more id; return the text it completes (often "", e.g. mid-character)."""
        self._ids.append(self._tokenizer._check_id(token_id))
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Return the text held back, even if it ends in an incomplete character (the sequence has ended)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return new_text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.backend.decode(ids, skip_special_tokens=self._skip_special_tokens)


def _read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, or {} if there is no such file."""
    if not path.is_file():
        return {}
    return read_json_object(path, TokenizerFileError)


def _token_content(value: Any, where: str) -> str | None:
    """A special token given as a string, as an AddedToken dict `{"content": ...}`, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerFileError(f"{where} must be a string or a {{'content': ...}} dict, got {value!r}")


def _chat_template_source(directory: Path, config: Mapping[str, Any]) -> str | None:
    """The default chat template: `chat_template.jinja` if present, else the config's `chat_template`."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list) and all(isinstance(t, dict) and {"name", "template"} <= t.keys() for t in template):
        named = {t["name"]: t["template"] for t in template}
        if "default" not in named:
            raise TokenizerFileError(f"chat_template in {directory} has no 'default' among {sorted(named)}")
        return named["default"]
    raise TokenizerFileError(
        f"chat_template in {directory} must be a string or a list of {{'name', 'template'}}, got {template!r:.200}"
    )
