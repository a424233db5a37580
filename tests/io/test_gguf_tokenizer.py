"""Tokenizers rebuilt from GGUF metadata reproduce llama.cpp's conformance suite.

The suite (vocabulary-only GGUF files with texts and golden ids made by the original Hugging Face
tokenizers) lives in the shared folder beside the repository; the tests skip without it. Where
transformers' own GGUF conversion tokenizes differently, the suite and llama.cpp decide, and each
such case is named below with the reason.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from refllm.io.gguf_tokenizer import (
    PRE_TOKENIZERS,
    MissingTokenizerKeyError,
    UnsupportedTokenizerError,
    backend_from_gguf,
    read_tokenizer_metadata,
    tokenizer_from_gguf,
)
from tests.helpers.paths import TOKENIZER_SUITE

SEPARATOR = "\n__ggml_vocab_test__\n"
NO_SUITE = pytest.mark.skip(reason=f"no tokenizer suite at {TOKENIZER_SUITE}")


def _vocabularies() -> list[str]:
    files = TOKENIZER_SUITE.glob("ggml-vocab-*.gguf")
    names = (path.name.removeprefix("ggml-vocab-").removesuffix(".gguf") for path in files)
    return sorted(names)


def _cases() -> list:
    """(vocabulary, index of the text in its .inp file) for every text of every vocabulary."""
    cases = [(name, i) for name in _vocabularies() for i in range(len(_texts(name)))]
    return cases or [pytest.param(None, None, marks=NO_SUITE)]


def _path(name: str) -> Path:
    return TOKENIZER_SUITE / f"ggml-vocab-{name}.gguf"


@functools.cache
def _texts(name: str) -> list[str]:
    """The .inp texts: each is followed by a separator line, which the newline before it belongs to."""
    return _path(name).with_suffix(".gguf.inp").read_text(encoding="utf-8").split(SEPARATOR)[:-1]


@functools.cache
def _golden(name: str) -> list[list[int]]:
    """The .out lines: the ids of each text, encoded without BOS/EOS."""
    lines = _path(name).with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")
    return [[int(token) for token in line.split()] for line in lines[: len(_texts(name))]]


@functools.cache
def _fields(name: str) -> dict:
    return read_tokenizer_metadata(_path(name))


@functools.cache
def _backend(name: str):
    return backend_from_gguf(_fields(name))


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


# --- the conformance suite --------------------------------------------------------------------


@pytest.mark.parametrize(("name", "index"), _cases())
def test_golden_ids(name, index):
    tokenizer, _ = _backend(name)
    assert _encode(tokenizer, _texts(name)[index]) == _golden(name)[index]


# deepseek-llm lists 13 single characters (ø, ü, ...) as user-defined tokens. In the byte-level
# alphabet each one spells a byte that never occurs in UTF-8 (0xC0, 0xC1, 0xF5-0xFF), and the
# byte-level decoder reads them that way, giving U+FFFD, as the original tokenizer does. (llama.cpp
# prints user-defined tokens as written instead.) Every other suite text round-trips.
def _deepseek_undecodable() -> set[str]:
    fields = _fields("deepseek-llm")
    pairs = zip(fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"], strict=True)
    return {token for token, kind in pairs if kind == 4 and len(token) == 1}


@pytest.mark.parametrize("name", _vocabularies() or [pytest.param(None, marks=NO_SUITE)])
def test_decode_inverts_encode(name):
    tokenizer, _ = _backend(name)
    lossy = _deepseek_undecodable() if name == "deepseek-llm" else set()
    for text in _texts(name):
        expected = "".join("\ufffd" if char in lossy else char for char in text)
        assert tokenizer.decode(_encode(tokenizer, text), skip_special_tokens=False) == expected


@pytest.mark.skipif(not _path("llama-spm").is_file(), reason="no llama-spm vocabulary")
def test_where_sentencepiece_does_not_round_trip():
    """SentencePiece writes a space as U+2581, so that character itself comes back as a space; and
    the text after a special token gets its own dummy prefix (as in llama.cpp), which decodes to a
    space that was not there."""
    tokenizer, _ = _backend("llama-spm")
    assert tokenizer.decode(_encode(tokenizer, "a\u2581b c")) == "a b c"
    assert tokenizer.decode(_encode(tokenizer, "a</s>b"), skip_special_tokens=False) == "a</s> b"


@pytest.mark.parametrize("name", _vocabularies() or [pytest.param(None, marks=NO_SUITE)])
def test_special_tokens_match_whole_and_bos_follows_the_flags(name):
    tokenizer, info = _backend(name)
    fields = _fields(name)
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    for token_id, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind in (2, 3, 4):  # unknown, control, user-defined
            assert token_id in _encode(tokenizer, f"x{token}y"), token
    # llama.cpp's defaults where the file is silent: BOS for SentencePiece, none for byte-level BPE.
    expected_bos = fields.get("tokenizer.ggml.add_bos_token", fields["tokenizer.ggml.model"] == "llama")
    assert info.add_bos_token == expected_bos
    ids = tokenizer.encode("Hello", add_special_tokens=True).ids
    assert (ids[0] == info.bos_token_id) == expected_bos
    assert ids[int(expected_bos) :] == _encode(tokenizer, "Hello")


@pytest.mark.skipif(not _path("starcoder").is_file(), reason="no starcoder vocabulary")
def test_smollm_uses_starcoders_rules():
    """SmolLM's pre-tokenizer (`smollm`) is StarCoder's: digits one by one, then GPT-2's regex."""
    assert PRE_TOKENIZERS["smollm"] == PRE_TOKENIZERS["starcoder"]
    tokenizer, _ = backend_from_gguf(_fields("starcoder") | {"tokenizer.ggml.pre": "smollm"})
    assert [_encode(tokenizer, text) for text in _texts("starcoder")] == _golden("starcoder")


# --- against transformers' GGUF conversion ----------------------------------------------------

SAMPLE = {
    "words": "Hello world",
    "leading_space": " Hello  world ",
    "whitespace": "tabs\tand\t\tmore\n\n\nlines \n \r\n end  ",
    "digits": "1 12 123 1234 12345 3.14159 1,000,000",
    "contractions": "I'm we're they've he'd you'll it's DON'T",
    "punctuation": '!?... ,;: ()[]{} <>+=^~|`$ #@%&* -- "quotes"',
    "emoji": "😀🎉👍🏽 🇫🇷 ❤️",
    "european": "Ελληνικά Русский Español Führer",
    "cjk": "中文字符 日本語のテキスト 한국어",
    "rtl_indic_thai": "العربية עברית हिन्दी ภาษาไทย",
    "code": "def f(x):\n    return x**2  # comment\n",
}

# (vocabulary, sample) where transformers' conversion tokenizes differently: why, and a run of our
# tokens that shows llama.cpp's (and the original tokenizer's) rule at work.
TRANSFORMERS_DIFFERS = {
    ("llama-spm", "leading_space"): (
        "its Metaspace(prepend_scheme='first') adds no dummy prefix to text that starts with a space; "
        "llama.cpp always does, and so do the suite's goldens for ' Hello world'",
        ["▁", "▁Hello"],
    ),
    ("llama-spm", "specials"): (
        "its Metaspace prefixes only the start of the text; llama.cpp (and the original Prepend "
        "normalizer) also prefix the text after each special token",
        ["<s>", "▁b"],
    ),
    ("phi-3", "specials"): (
        "it gives no added token rstrip; Phi-3's chat tokens and </s> swallow the whitespace after them",
        ["</s> ", "▁c"],
    ),
    ("deepseek-llm", "whitespace"): (
        "it splits with GPT-2's regex for every unknown pre-tokenizer; DeepSeek's `\\s?` letter rule keeps "
        "a tab with the word after it",
        ["tabs", "ĉand"],
    ),
    ("deepseek-llm", "rtl_indic_thai"): (
        "GPT-2's regex splits at every space; DeepSeek's regexes leave scripts outside their letter "
        "classes as one piece, so BPE merges across the space",
        ["Ø", "©Ġ"],
    ),
    ("deepseek-llm", "specials"): (
        "it skips control tokens spelled outside the byte alphabet, so <｜begin▁of▁sentence｜> is not matched whole",
        ["a", "<｜begin▁of▁sentence｜>", "b"],
    ),
    ("falcon", "digits"): (
        "GPT-2's regex keeps a digit run whole; Falcon's pre-tokenizer cuts it into groups of three",
        ["Ġ", "123", "4", "Ġ"],
    ),
    ("falcon", "code"): (
        "Falcon's pre-tokenizer isolates punctuation first, so the spaces before '#' end a piece",
        ["2", "ĠĠ", "#"],
    ),
}


def _samples(name: str) -> dict[str, str]:
    """The shared sample, plus text around the vocabulary's first and last three added tokens."""
    fields = _fields(name)
    pairs = zip(fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"], strict=True)
    added = [token for token, kind in pairs if kind in (3, 4)]
    return SAMPLE | {"specials": "".join(f"a{t}b {t} c{t}\n" for t in dict.fromkeys(added[:3] + added[-3:]))}


def _contains_run(tokens: list[str], run: list[str]) -> bool:
    return any(tokens[i : i + len(run)] == run for i in range(len(tokens)))


@functools.cache
def _transformers_backend(name: str):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    architecture, tokenizer_dict, config = get_gguf_tokenizer(str(_path(name)))
    return convert_gguf_tokenizer(architecture, tokenizer_dict)[0], config


@pytest.mark.parametrize("name", _vocabularies() or [pytest.param(None, marks=NO_SUITE)])
def test_agrees_with_transformers_except_named_cases(name):
    pytest.importorskip("transformers")
    ours, info = _backend(name)
    theirs, config = _transformers_backend(name)
    assert info.add_bos_token == config.get("add_bos_token", False)
    for key, text in _samples(name).items():
        mine = ours.encode(text, add_special_tokens=False)
        if (name, key) in TRANSFORMERS_DIFFERS:
            reason, run = TRANSFORMERS_DIFFERS[name, key]
            assert _encode(theirs, text) != mine.ids, f"transformers now agrees on {key}: {reason}"
            assert _contains_run(mine.tokens, run), (key, mine.tokens)
        else:
            assert _encode(theirs, text) == mine.ids, key


@pytest.mark.skipif(not _path("gpt-2").is_file(), reason="no gpt-2 vocabulary")
@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2"])
def test_llama3_and_qwen2_rules_match_their_original_regex(pre):
    """llama.cpp spells the original `(?i:'s|...)` out in ASCII cases. Both spellings tokenize the
    sample alike (on GPT-2's vocabulary); transformers keeps the original."""
    pytest.importorskip("transformers")
    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    ours, info = backend_from_gguf(_fields("gpt-2") | {"tokenizer.ggml.pre": pre})
    original = Tokenizer.from_str(ours.to_str())
    original.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(GGUF_PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    for text in SAMPLE.values():
        assert _encode(ours, text) == _encode(original, text), text
    # Llama 3 takes a word that is a token whole and starts with BOS, as llama.cpp defaults it.
    llama3 = pre == "llama-bpe"
    assert (PRE_TOKENIZERS[pre].ignore_merges, info.add_bos_token) == (llama3, llama3)


# --- a Gemma-style SentencePiece vocabulary ---------------------------------------------------

CONTROL, UNKNOWN, USER_DEFINED, NORMAL, BYTE = 3, 2, 4, 1, 6
GEMMA_TEMPLATE = "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory) -> Path:
    """A small vocabulary shaped like Gemma's GGUF files, written with gguf's own writer.

    As llama.cpp's converter writes Gemma: no dummy prefix (`add_space_prefix` false), byte
    fallback tokens, and runs of spaces as user-defined tokens spelled with real spaces.
    """
    gguf = pytest.importorskip("gguf")
    normal = ["▁", "\n", "\n\n", *"Helowrdus", "ll", "He", "llo", "Hello", "or", "ld", "wor", "world"]
    normal += ["▁w", "▁world", "er", "us", "user"]
    entries = [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN)]
    entries += [("<start_of_turn>", CONTROL), ("<end_of_turn>", CONTROL)]
    entries += [(f"<0x{byte:02X}>", BYTE) for byte in range(256)] + [("  ", USER_DEFINED), ("   ", USER_DEFINED)]
    entries += [(token, NORMAL) for token in normal]
    scores = [-float(i) if kind == NORMAL else -1000.0 for i, (_, kind) in enumerate(entries)]
    path = tmp_path_factory.mktemp("gemma") / "gemma-vocab.gguf"
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([token for token, _ in entries])
    writer.add_token_scores(scores)
    writer.add_token_types([kind for _, kind in entries])
    writer.add_pad_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_bos_token_id(2)
    writer.add_unk_token_id(3)
    writer.add_eot_token_id(5)
    writer.add_add_space_prefix(False)
    writer.add_add_bos_token(True)
    writer.add_chat_template(GEMMA_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


GEMMA_CASES = {
    "Hello world": ["Hello", "▁world"],  # no dummy prefix
    " Hello": ["▁", "Hello"],
    "Hello  world": ["Hello", "  ", "world"],  # user-defined spaces matched whole in the text
    "Hé!": ["H", "<0xC3>", "<0xA9>", "<0x21>"],  # byte fallback
    "<start_of_turn>user\nHello<end_of_turn>\n": ["<start_of_turn>", "user", "\n", "Hello", "<end_of_turn>", "\n"],
    "world\n\nHello": ["world", "\n\n", "Hello"],
}


def test_gemma_style_vocabulary(gemma_gguf):
    tokenizer, info = backend_from_gguf(read_tokenizer_metadata(gemma_gguf))
    assert (info.add_space_prefix, info.add_bos_token, info.extra_eos_tokens) == (False, True, ("<end_of_turn>",))
    for text, tokens in GEMMA_CASES.items():
        encoding = tokenizer.encode(text, add_special_tokens=False)
        assert encoding.tokens == tokens
        assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == text
    # Four spaces: the longest user-defined run first, as llama.cpp matches them, then U+2581.
    assert tokenizer.encode("world    ", add_special_tokens=False).tokens == ["world", "   ", "▁"]


def test_gemma_style_vocabulary_agrees_with_transformers(gemma_gguf):
    """transformers respells the space tokens as U+2581 runs and reaches them by merges instead;
    that ends the same way on the texts above, but not on runs longer than any one token."""
    pytest.importorskip("transformers")
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    ours, _ = backend_from_gguf(read_tokenizer_metadata(gemma_gguf))
    theirs = convert_gguf_tokenizer(*get_gguf_tokenizer(str(gemma_gguf))[:2])[0]
    for text in GEMMA_CASES:
        assert _encode(ours, text) == _encode(theirs, text), text
    assert _encode(ours, "world    ") != _encode(theirs, "world    ")


def test_tokenizer_from_gguf(gemma_gguf):
    tokenizer = tokenizer_from_gguf(gemma_gguf)
    hello = tokenizer.token_to_id("Hello")
    assert tokenizer.encode("Hello") == [tokenizer.bos_token_id, hello]
    assert tokenizer.eos_token_ids == (1, 5)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert tokenizer.encode(prompt, add_special_tokens=False)[:2] == [4, tokenizer.token_to_id("user")]


# --- refusals ---------------------------------------------------------------------------------


def _minimal(**fields) -> dict:
    tokens = ["<unk>", "<s>", "</s>", "▁", "a", "▁a"]
    base = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -3.0],
        "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1],
    }
    return base | fields


def test_minimal_sentencepiece():
    tokenizer, info = backend_from_gguf(_minimal())
    assert (info.bos_token, info.eos_token, info.add_bos_token) == ("<s>", "</s>", True)
    assert tokenizer.encode("a a").tokens == ["<s>", "▁a", "▁a"]


def test_unknown_model_is_refused_by_name():
    with pytest.raises(UnsupportedTokenizerError, match=r"'bert'.*gpt2, llama") as error:
        backend_from_gguf(_minimal(**{"tokenizer.ggml.model": "bert"}))
    assert isinstance(error.value, ValueError)


def test_unknown_pre_tokenizer_is_refused_by_name():
    fields = _minimal(**{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "tekken", "tokenizer.ggml.merges": []})
    supported = "deepseek-llm, falcon, gpt-2, llama-bpe, qwen2, smollm, starcoder"
    with pytest.raises(UnsupportedTokenizerError, match=rf"'tekken'.*{supported}"):
        backend_from_gguf(fields)


def test_missing_key_is_a_key_error():
    fields = _minimal()
    del fields["tokenizer.ggml.scores"]
    with pytest.raises(MissingTokenizerKeyError, match="tokenizer.ggml.scores") as error:
        backend_from_gguf(fields)
    assert isinstance(error.value, KeyError)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tokenizer.ggml.bos_token_id": 6}, "outside"),
        ({"tokenizer.ggml.token_type": [1]}, "token_type"),
        ({"tokenizer.ggml.tokens": ["a", "a", "b", "c", "d", "e"]}, "more than once"),
        # gpt2's default BOS id (11) lies outside this vocabulary, so there is no BOS to add.
        (
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "gpt-2",
                "tokenizer.ggml.merges": [],
                "tokenizer.ggml.add_bos_token": True,
            },
            "add_bos_token is true",
        ),
    ],
)
def test_bad_values_are_refused(fields, message):
    with pytest.raises(UnsupportedTokenizerError, match=message):
        backend_from_gguf(_minimal(**fields))
