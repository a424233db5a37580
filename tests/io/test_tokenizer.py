"""Tokenizer, chat templates and incremental detokenization.

Test tokenizers are trained in memory on a small ASCII corpus, so anything outside it (accents, CJK, emoji)
falls back to single bytes and multi-byte characters split across tokens, which is the hard case for
streaming. Two families are covered: byte-level BPE (GPT-2, Llama 3, Qwen) and SentencePiece-style BPE with
byte fallback and a decoder that strips the first leading space (Llama 2, Mistral). Where transformers is
installed it is the oracle for loading, BOS handling and chat-template rendering.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime

import numpy as np
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from refllm.errors import InvalidInputError, TokenOutOfRangeError
from refllm.io.chat_template import ChatTemplate, ChatTemplateError
from refllm.io.tokenizer import IncrementalDetokenizer, Tokenizer, TokenizerFileError, UnknownTokenError
from tests.helpers.byte_level import BOS, CHATML, CORPUS, EOS, EOT, byte_level_backend

# Pieces of text with the characters that break naive streaming: 2-, 3- and 4-byte UTF-8, joiners and modifiers.
TRICKY_CHARS = ["😀", "👍🏽", "👨‍👩‍👧", "你", "好", "世界", "é", "ß", "\u200d", "🇫🇷", " ", "a", "\n"]
texts = st.lists(
    st.one_of(st.characters(codec="utf-8"), st.sampled_from(TRICKY_CHARS)), max_size=30
).map("".join)


@functools.cache
def _byte_fallback_json() -> str:
    # Learn merges on words, then rebuild with the 256 byte tokens and Llama 2's normalizer and decoder.
    trained = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{byte:02X}>": 3 + byte for byte in range(256)}
    for token in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(merge) for merge in learned["merges"]]
    backend = tokenizers.Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    backend.add_special_tokens(["<unk>", "<s>", "</s>"])
    return backend.to_str()


def byte_fallback_backend() -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_str(_byte_fallback_json())


def added_token(content: str) -> dict:
    """A special token in the dict form older tokenizer_config.json files use (transformers needs `__type`)."""
    return {
        "__type": "AddedToken",
        "content": content,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "single_word": False,
        "special": True,
    }


def write_model_dir(path, backend: tokenizers.Tokenizer, config: dict | None = None, files: dict | None = None):
    """A model directory with tokenizer.json, tokenizer_config.json (if given) and other files by name."""
    path.mkdir(parents=True, exist_ok=True)
    backend.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    for name, text in (files or {}).items():
        (path / name).write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- encode / decode


@settings(max_examples=60, deadline=None)
@given(text=texts)
def test_byte_level_round_trip(text):
    tokenizer = Tokenizer(byte_level_backend())
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_encode_decode_known_text():
    tokenizer = Tokenizer(byte_level_backend(), bos_token=BOS, add_bos_token=True)
    ids = tokenizer.encode("the quick fox")
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids) == BOS + "the quick fox"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "the quick fox"
    assert tokenizer.decode(np.array(ids, dtype=np.int64)) == BOS + "the quick fox"
    # Special tokens written in text are matched as single tokens.
    assert tokenizer.encode(f"hi{EOT}", add_special_tokens=False)[-1] == tokenizer.token_to_id(EOT)


@pytest.mark.parametrize("bos_post_processor", [False, True])
@pytest.mark.parametrize("add_bos_token", [None, True, False])
def test_bos_modes(bos_post_processor, add_bos_token):
    tokenizer = Tokenizer(byte_level_backend(bos_post_processor), bos_token=BOS, add_bos_token=add_bos_token)
    bos = tokenizer.bos_token_id
    text_ids = tokenizer.encode("hello world", add_special_tokens=False)
    expects_bos = bos_post_processor if add_bos_token is None else add_bos_token
    assert tokenizer.encode("hello world") == ([bos] if expects_bos else []) + text_ids
    assert tokenizer.encode("") == ([bos] if expects_bos else [])
    # A BOS written in the text is kept; with add_bos_token=True it is already first, so none is added.
    written = tokenizer.encode(BOS + "hello world")
    if add_bos_token is True and not bos_post_processor:
        assert written == [bos] + text_ids
    else:
        assert written == ([bos] if expects_bos else []) + [bos] + text_ids


def test_add_eos_token_appends_once():
    tokenizer = Tokenizer(byte_level_backend(), eos_token=EOS, add_eos_token=True)
    eos = tokenizer.eos_token_id
    assert tokenizer.encode("hi") == tokenizer.encode("hi", add_special_tokens=False) + [eos]
    assert tokenizer.encode("hi" + EOS).count(eos) == 1
    assert eos not in tokenizer.encode("hi", add_special_tokens=False)


def test_special_token_ids():
    tokenizer = Tokenizer(byte_level_backend(), bos_token=BOS, eos_token=EOS, extra_eos_tokens=(EOT, EOS))
    backend = tokenizer.backend
    assert tokenizer.bos_token_id == backend.token_to_id(BOS)
    assert tokenizer.eos_token_ids == (backend.token_to_id(EOS), backend.token_to_id(EOT))
    assert tokenizer.vocab_size == backend.get_vocab_size(with_added_tokens=True)
    assert tokenizer.id_to_token(tokenizer.token_to_id("<|im_end|>")) == "<|im_end|>"
    bare = Tokenizer(byte_level_backend())
    assert (bare.bos_token_id, bare.eos_token_id, bare.eos_token_ids) == (None, None, ())


def test_refusals_name_the_bad_value():
    tokenizer = Tokenizer(byte_level_backend())
    with pytest.raises(UnknownTokenError, match="<nope>"):
        tokenizer.token_to_id("<nope>")
    with pytest.raises(KeyError):
        Tokenizer(byte_level_backend(), eos_token="<nope>")
    with pytest.raises(KeyError, match="<nope>"):
        Tokenizer(byte_level_backend(), extra_eos_tokens=("<nope>",))
    for bad in (-1, tokenizer.vocab_size):
        with pytest.raises(TokenOutOfRangeError, match=str(bad)):
            tokenizer.decode([1, bad])
        with pytest.raises(TokenOutOfRangeError, match=str(bad)):
            tokenizer.id_to_token(bad)
    with pytest.raises(InvalidInputError, match="1.5"):
        tokenizer.decode([1.5])
    with pytest.raises(InvalidInputError, match="bytes"):
        tokenizer.encode(b"hi")
    with pytest.raises(InvalidInputError, match="bos_token"):
        Tokenizer(byte_level_backend(), add_bos_token=True)
    with pytest.raises(InvalidInputError, match="tokenizers.Tokenizer"):
        Tokenizer("tokenizer.json")


# ---------------------------------------------------------------- loading a directory

NAMED_TEMPLATES = [{"name": "rag", "template": "R"}, {"name": "default", "template": "D"}]


@pytest.mark.parametrize(
    "config, files, expected",
    [
        pytest.param({"bos_token": BOS, "eos_token": EOS, "chat_template": "A"}, {}, (BOS, EOS, "A"), id="strings"),
        pytest.param(
            {"bos_token": added_token(BOS), "eos_token": {"content": EOS}},
            {},
            (BOS, EOS, None),
            id="added-token-dicts",
        ),
        pytest.param(
            {"eos_token": EOS, "chat_template": NAMED_TEMPLATES},
            {},
            (None, EOS, "D"),
            id="template-list",
        ),
        pytest.param(
            {"bos_token": BOS, "chat_template": "old"},
            {"chat_template.jinja": "new"},
            (BOS, None, "new"),
            id="jinja-file",
        ),
        pytest.param(
            {"eos_token": EOT},
            {"special_tokens_map.json": json.dumps({"bos_token": added_token(BOS), "eos_token": EOS})},
            (BOS, EOT, None),
            id="special-tokens-map",
        ),
        pytest.param(None, {}, (None, None, None), id="tokenizer-json-only"),
    ],
)
def test_from_directory_config_spellings(tmp_path, config, files, expected):
    tokenizer = Tokenizer.from_directory(write_model_dir(tmp_path, byte_level_backend(), config, files))
    template = tokenizer.chat_template and tokenizer.chat_template.source
    assert (tokenizer.bos_token, tokenizer.eos_token, template) == expected


def test_from_directory_flags_override_post_processor(tmp_path):
    config = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True}
    tokenizer = Tokenizer.from_directory(write_model_dir(tmp_path / "a", byte_level_backend(), config))
    assert tokenizer.encode("hi") == [tokenizer.bos_token_id, *tokenizer.encode("hi", False), tokenizer.eos_token_id]
    config = {"bos_token": BOS, "add_bos_token": False}
    tokenizer = Tokenizer.from_directory(write_model_dir(tmp_path / "b", byte_level_backend(True), config))
    assert tokenizer.encode("hi") == tokenizer.encode("hi", add_special_tokens=False)


def test_from_directory_without_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert Tokenizer.from_directory(tmp_path) is None


def test_from_directory_refusals(tmp_path):
    with pytest.raises(InvalidInputError, match="not a directory"):
        Tokenizer.from_directory(tmp_path / "missing")
    rag_only = {"chat_template": [{"name": "rag", "template": "R"}]}
    no_default = write_model_dir(tmp_path / "a", byte_level_backend(), rag_only)
    with pytest.raises(TokenizerFileError, match="'rag'"):
        Tokenizer.from_directory(no_default)
    bad_token = write_model_dir(tmp_path / "b", byte_level_backend(), {"bos_token": 7})
    with pytest.raises(TokenizerFileError, match="bos_token"):
        Tokenizer.from_directory(bad_token)
    broken = write_model_dir(tmp_path / "c", byte_level_backend())
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerFileError, match="tokenizer.json"):
        Tokenizer.from_directory(broken)
    bad_flag = write_model_dir(tmp_path / "e", byte_level_backend(), {"add_bos_token": "yes"})
    with pytest.raises(TokenizerFileError, match="add_bos_token"):
        Tokenizer.from_directory(bad_flag)
    bad_config = write_model_dir(tmp_path / "d", byte_level_backend())
    (bad_config / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(TokenizerFileError, match="JSON object"):
        Tokenizer.from_directory(bad_config)


# Only flags that agree with tokenizer.json's post-processor: transformers 5 ignores add_bos_token and
# add_eos_token whenever tokenizer.json exists, where refllm (like llama.cpp) lets them override it.
@pytest.mark.parametrize(
    "bos_post_processor, flags",
    [
        (True, {}),
        (True, {"add_bos_token": True, "add_eos_token": False}),
        (False, {}),
        (False, {"add_bos_token": False}),
    ],
)
def test_special_tokens_match_transformers(tmp_path, bos_post_processor, flags):
    transformers = pytest.importorskip("transformers")
    config = {"bos_token": BOS, "eos_token": added_token(EOS), **flags}
    path = write_model_dir(tmp_path, byte_level_backend(bos_post_processor), config)
    ours, theirs = Tokenizer.from_directory(path), transformers.PreTrainedTokenizerFast.from_pretrained(path)
    for text in ["hello world", "", BOS + "the fox", "é😀"]:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)


# ---------------------------------------------------------------- chat templates

LLAMA3 = """\
{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {{- "You may call these functions:\\n\\n" }}
    {%- for tool in tools %}
        {{- tool | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role not in ['user', 'assistant', 'tool'] %}
        {{- raise_exception("Unknown role '" + message.role + "': use user, assistant or tool") }}
    {%- endif %}
    {%- if message.content is defined and message.content == '' %}{% continue %}{% endif %}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}
    {%- if message.tool_calls is defined %}
        {%- for call in message.tool_calls %}
            {{- '{"name": "' + call.function.name + '", "parameters": ' + call.function.arguments | tojson + '}' }}
            {%- break %}
        {%- endfor %}
    {%- elif message.content is string %}
        {{- message.content | trim }}
    {%- else %}
        {{- message.content | tojson }}
    {%- endif %}
    {{- '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <now> & later in a city, e.g. Zürich",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]

CONVERSATIONS = {
    "one-turn": [{"role": "user", "content": "Hello!"}],
    "multi-turn": [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "héllo 😀 <b>&amp;</b>"},
        {"role": "assistant", "content": "Hi.", "reasoning": "The user greets me."},
        {"role": "user", "content": "Again\nplease"},
    ],
}

LLAMA3_ONLY = {
    "tool-call": [
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
                {"function": {"name": "ignored", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": [{"temperature": 21}]},
        {"role": "user", "content": ""},
    ],
}


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize(
    "template, conversation",
    [(CHATML, name) for name in CONVERSATIONS] + [(LLAMA3, name) for name in [*CONVERSATIONS, *LLAMA3_ONLY]],
    ids=lambda value: "chatml" if value == CHATML else "llama3" if value == LLAMA3 else value,
)
def test_chat_template_matches_transformers(tmp_path, template, conversation, add_generation_prompt):
    transformers = pytest.importorskip("transformers")
    messages = (CONVERSATIONS | LLAMA3_ONLY)[conversation]
    config = {"bos_token": BOS, "eos_token": EOT, "chat_template": template}
    path = write_model_dir(tmp_path, byte_level_backend(), config)
    ours, theirs = Tokenizer.from_directory(path), transformers.PreTrainedTokenizerFast.from_pretrained(path)
    kwargs = {"tools": TOOLS, "date_string": "26 Jul 2024"} if template == LLAMA3 else {}

    text = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)
    expected = theirs.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )
    assert text == expected
    expected_ids = theirs.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)
    assert ours.encode(text, add_special_tokens=False) == expected_ids["input_ids"]


def test_chat_template_variables():
    template = ChatTemplate("{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|{{ documents is none }}|{{ x }}")
    assert template.render([{"role": "user", "content": "a"}], x=3) == "||True|True|3"
    tokenizer = Tokenizer(byte_level_backend(), bos_token=BOS, chat_template=template.source)
    # An unset special token is left undefined (renders empty), not passed as None (would render "None").
    assert tokenizer.apply_chat_template([{"role": "user", "content": "a"}], x=3) == f"{BOS}||True|True|3"
    assert tokenizer.apply_chat_template([{"role": "user", "content": "a"}], bos_token="B") == "B||True|True|"
    year = ChatTemplate("{{ strftime_now('%Y') }}").render([{"role": "user", "content": ""}])
    assert year in {str(datetime.now().year - 1), str(datetime.now().year)}


def test_tojson_keeps_text_as_is():
    template = ChatTemplate("{{ messages[0] | tojson }}\n{{ messages[0] | tojson(indent=2) }}")
    rendered = template.render([{"role": "user", "content": "<b>é & 😀</b>"}])
    compact = '{"role": "user", "content": "<b>é & 😀</b>"}'
    assert rendered == compact + "\n" + json.dumps(json.loads(compact), indent=2, ensure_ascii=False)


def test_none_values_are_dropped_and_reasoning_aliased():
    template = ChatTemplate(
        "{% for m in messages %}{{ m.content is defined }},{{ m.thinking }},{{ m.reasoning_content }};{% endfor %}"
    )
    messages = [
        {"role": "assistant", "content": None, "reasoning": "r"},
        {"role": "user", "content": "x", "thinking": None},
    ]
    assert template.render(messages) == "False,r,r;True,,;"
    assert messages[0] == {"role": "assistant", "content": None, "reasoning": "r"}


def test_raise_exception_is_a_value_error():
    tokenizer = Tokenizer(byte_level_backend(), bos_token=BOS, chat_template=LLAMA3)
    with pytest.raises(ChatTemplateError, match="Unknown role 'robot'") as caught:
        tokenizer.apply_chat_template([{"role": "robot", "content": "beep"}], date_string="1 Jan 2025")
    assert isinstance(caught.value, ValueError)


def test_template_refusals():
    with pytest.raises(ChatTemplateError, match="line 1"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        Tokenizer(byte_level_backend()).apply_chat_template([{"role": "user", "content": "a"}])
    # The sandbox lets no template change the caller's data, not even through the `dict` global.
    data = {"a": 1}
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ dict.update(data, {'b': 2}) }}").render([{"role": "user", "content": ""}], data=data)
    assert data == {"a": 1}
    assert ChatTemplate("{{ dict(a=1) }}{{ dict.fromkeys(['b']) }}").render([{"role": "user", "content": ""}]) == (
        "{'a': 1}{'b': None}"
    )


@pytest.mark.parametrize(
    "messages, match",
    [
        ("hello", "list of dicts"),
        ({"role": "user", "content": "hi"}, "list of dicts"),
        ([], "empty"),
        ([{"role": "user", "content": "hi"}, "oops"], r"messages\[1\] must be a dict"),
        ([{"content": "hi"}], r"messages\[0\] has no 'role'"),
        ([{"role": "user"}], r"messages\[0\] has no 'content'"),
        ([{"role": 3, "content": "hi"}], r"messages\[0\]\['role'\] must be a string"),
    ],
)
def test_message_validation(messages, match):
    with pytest.raises(InvalidInputError, match=match):
        ChatTemplate(CHATML).render(messages)


def test_tools_must_be_schemas():
    with pytest.raises(InvalidInputError, match=r"tools\[0\]"):
        ChatTemplate(LLAMA3).render([{"role": "user", "content": "a"}], tools=[len], bos_token="", date_string="")


# ---------------------------------------------------------------- incremental detokenization


def stream(tokenizer: Tokenizer, ids: list[int], context: Sequence[int] = ()) -> list[str]:
    """The pieces an IncrementalDetokenizer hands out for `ids`, the flush last; each checked on the way."""
    detokenizer = IncrementalDetokenizer(tokenizer, context=context)
    full = tokenizer.decode([*context, *ids])[len(tokenizer.decode(context)) :]
    pieces = []
    for token_id in ids:
        pieces.append(detokenizer.add(token_id))
        # Emitted text is final: always a prefix of the whole text, so never a broken character.
        assert full.startswith("".join(pieces))
        assert not pieces[-1].endswith("\ufffd")
    pieces.append(detokenizer.flush())
    assert "".join(pieces) == full
    return pieces


@settings(max_examples=80, deadline=None)
@given(text=texts)
def test_detokenizer_byte_level(text):
    tokenizer = Tokenizer(byte_level_backend())
    stream(tokenizer, tokenizer.encode(text, add_special_tokens=False))


@settings(max_examples=80, deadline=None)
@given(text=texts, split=st.integers(0, 40))
def test_detokenizer_byte_fallback_with_context(text, split):
    tokenizer = Tokenizer(byte_fallback_backend(), bos_token="<s>")
    ids = tokenizer.encode(text)
    split = min(split, len(ids))
    # The context must end on a character boundary; otherwise move the split left until it does.
    while split and tokenizer.decode(ids[:split]).endswith("\ufffd"):
        split -= 1
    stream(tokenizer, ids[split:], context=ids[:split])


def test_detokenizer_holds_split_characters():
    tokenizer = Tokenizer(byte_level_backend())
    ids = tokenizer.encode("a😀b", add_special_tokens=False)
    assert len(ids) == 6  # the emoji is four byte tokens
    assert stream(tokenizer, ids) == ["a", "", "", "", "😀", "b", ""]


def test_detokenizer_keeps_leading_space_with_context():
    tokenizer = Tokenizer(byte_fallback_backend(), bos_token="<s>")
    ids = tokenizer.encode("the quick fox")
    split = ids.index(tokenizer.token_to_id("▁quick"))
    assert "".join(stream(tokenizer, ids[split:])) == "quick fox"  # a fresh start drops it, as decode does
    assert "".join(stream(tokenizer, ids[split:], context=ids[:split])) == " quick fox"


def test_detokenizer_skips_special_tokens():
    tokenizer = Tokenizer(byte_level_backend(), eos_token=EOS)
    ids = tokenizer.encode("hi" + EOS, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
    assert "".join(detokenizer.add(i) for i in ids) + detokenizer.flush() == "hi"
    with pytest.raises(TokenOutOfRangeError):
        detokenizer.add(tokenizer.vocab_size)
