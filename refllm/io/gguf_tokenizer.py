"""A `tokenizers.Tokenizer` built from a GGUF file's `tokenizer.ggml.*` metadata.

A GGUF carries no `tokenizer.json`: only the vocabulary, each token's type and score (or the BPE
merges), the special token ids and a few flags, under llama.cpp's key names. llama.cpp is the
program those files are written for, so this module rebuilds the tokenizer llama.cpp runs
(`src/llama-vocab.cpp`) out of the `tokenizers` library's parts:

- `tokenizer.ggml.model == "llama"` (SentencePiece): llama.cpp repeatedly joins the adjacent pair
  whose joined text is the highest-scoring token, so a BPE model whose merges are ranked by those
  scores does the same; characters outside the vocabulary fall back to `<0xXX>` byte tokens.
  Spaces become U+2581, and each stretch of text gets one in front (the dummy prefix) unless
  `tokenizer.ggml.add_space_prefix` is false, as Gemma's files say.
- `tokenizer.ggml.model == "gpt2"` (byte-level BPE): the file's merges, after the text is cut
  into words by the regexes llama.cpp uses for `tokenizer.ggml.pre` (table `PRE_TOKENIZERS`).

Control and unknown tokens become special added tokens and user-defined ones plain added tokens,
so each is matched whole in the raw text before the model sees the rest, as llama.cpp does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from refllm.errors import RefllmKeyError

if TYPE_CHECKING:
    from refllm.io.tokenizer import Tokenizer as RefllmTokenizer

# llama.cpp's token types (gguf.TokenType), by value.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

MODELS = ("gpt2", "llama")


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp cuts text into words for byte-level BPE, for one `tokenizer.ggml.pre`.

    The regexes apply in order, each to the pieces the one before left; the text between two
    matches stays a piece too. `ignore_merges` takes a word that is itself a token whole, before
    any merging (Llama 3). `add_bos` is llama.cpp's default where the file has no add_bos_token.
    """

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False


_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_DIGITS_THEN_GPT2 = PreTokenizer((r"\p{N}", _GPT2))
# Llama 3's and Qwen2's `(?i:'s|'t|...)`, spelled out in ASCII cases as llama.cpp has it; they
# differ only in how many digits make one word.
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

# DeepSeek LLM's: newlines alone, runs of cased letters (its own list of ranges, written as
# escapes so that no Unicode normalisation of this file can change a code point), ASCII and
# full-width punctuation, trailing whitespace, CJK and Hangul, digits.
_DEEPSEEK_LLM = (
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57"
    "\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
    "\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d"
    "\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b"
    "\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f"
    "\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}+",
)

# `tokenizer.ggml.pre` -> its rules. They are llama.cpp's, which reproduce each model's original
# Hugging Face pre-tokenizer.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "gpt-2": PreTokenizer((_GPT2,)),
    # StarCoder's and SmolLM's `Digits(individual_digits)` + `ByteLevel`.
    "starcoder": _DIGITS_THEN_GPT2,
    "smollm": _DIGITS_THEN_GPT2,
    # Falcon's `Punctuation` + `ByteLevel` + groups of three digits.
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    "llama-bpe": PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True),
    "qwen2": PreTokenizer((_QWEN2,)),
    "deepseek-llm": PreTokenizer(_DEEPSEEK_LLM),
}

# Phi-3's chat tokens swallow the whitespace after them, except these (as in its tokenizer.json;
# llama.cpp sets the same `rstrip` attribute).
_PHI3_KEEP_RIGHT_SPACE = frozenset({"<unk>", "<s>", "<|endoftext|>"})


class UnsupportedTokenizerError(ValueError):
    """GGUF tokenizer metadata this module cannot rebuild: an unknown model or pre-tokenizer, or bad values."""


class MissingTokenizerKeyError(RefllmKeyError):
    """A `tokenizer.ggml.*` key the tokenizer needs is not in the file."""


@dataclass(frozen=True)
class GGUFTokenizerInfo:
    """What a GGUF says about its tokenizer beside the vocabulary: special tokens and flags.

    Ids (and their token strings) are None where neither the file nor llama.cpp's default for the
    model type names one. `extra_eos_tokens` are the end-of-turn/end-of-message tokens the file
    names, which llama.cpp also stops generation at.
    """

    model: str
    pre: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    padding_token_id: int | None
    bos_token: str | None
    eos_token: str | None
    padding_token: str | None
    extra_eos_tokens: tuple[str, ...]
    add_bos_token: bool
    add_eos_token: bool
    add_space_prefix: bool
    chat_template: str | None


def read_tokenizer_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The `tokenizer.*` keys and `general.architecture` of a GGUF file, as plain Python values."""
    from refllm.io.gguf_header import map_file

    mapped, header = map_file(path)
    with mapped:
        return tokenizer_metadata(header.metadata)


def tokenizer_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a GGUF file's metadata that describe its tokenizer."""
    wanted = (key for key in metadata if key.startswith("tokenizer.") or key == "general.architecture")
    return {key: metadata[key] for key in wanted}


def tokenizer_from_gguf(source: str | os.PathLike[str] | Mapping[str, Any]) -> RefllmTokenizer:
    """refllm's `Tokenizer` for a GGUF file, or for the metadata `tokenizer_metadata` picked from one."""
    from refllm.io.tokenizer import Tokenizer as RefllmTokenizer

    backend, info = backend_from_gguf(source if isinstance(source, Mapping) else read_tokenizer_metadata(source))
    return RefllmTokenizer(
        backend,
        bos_token=info.bos_token,
        eos_token=info.eos_token,
        add_bos_token=info.add_bos_token,
        add_eos_token=info.add_eos_token,
        chat_template=info.chat_template,
        extra_eos_tokens=info.extra_eos_tokens,
    )


def backend_from_gguf(fields: Mapping[str, Any]) -> tuple[Tokenizer, GGUFTokenizerInfo]:
    """The `tokenizers.Tokenizer` and the special-token facts that GGUF metadata describe.

    `fields` maps GGUF keys to plain values, as `read_tokenizer_metadata` returns them. With
    `encode(..., add_special_tokens=True)` the backend adds BOS/EOS as the file's flags say, or
    else as llama.cpp does by default: BOS for SentencePiece, nothing for byte-level BPE.
    """
    model = _require(fields, "tokenizer.ggml.model")
    tokens: list[str] = list(_require(fields, "tokenizer.ggml.tokens"))
    types: list[int] = list(fields.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise UnsupportedTokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise UnsupportedTokenizerError("tokenizer.ggml.tokens lists a token more than once")

    if model == "llama":
        info = _info(fields, tokens, bos=1, eos=2, add_bos=True, add_space_prefix=True)
        tokenizer = _sentencepiece(fields, tokens, vocab, types, info.add_space_prefix)
    elif model == "gpt2":
        rules = _pre_tokenizer(fields)
        info = _info(fields, tokens, bos=11, eos=11, add_bos=rules.add_bos, add_space_prefix=False)
        tokenizer = _byte_level(fields, vocab, rules)
    else:
        raise UnsupportedTokenizerError(
            f"tokenizer.ggml.model {model!r} is not supported; supported: {', '.join(MODELS)}"
        )
    _add_special_tokens(tokenizer, tokens, types, rstrip=fields.get("general.architecture") == "phi3")
    tokenizer.post_processor = _post_processor(info)
    return tokenizer, info


def _require(fields: Mapping[str, Any], key: str) -> Any:
    if key not in fields:
        raise MissingTokenizerKeyError(f"GGUF metadata has no {key!r}")
    return fields[key]


def _sentencepiece(
    fields: Mapping[str, Any], tokens: list[str], vocab: dict[str, int], types: list[int], add_space_prefix: bool
) -> Tokenizer:
    """SentencePiece BPE as llama.cpp runs it: score-ranked merges, byte fallback, U+2581 for space."""
    scores: list[float] = list(_require(fields, "tokenizer.ggml.scores"))
    if len(scores) != len(tokens):
        raise UnsupportedTokenizerError(f"tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
    unk_id = fields.get("tokenizer.ggml.unknown_token_id", 0)
    unk = tokens[unk_id] if 0 <= unk_id < len(tokens) else None
    tokenizer = Tokenizer(
        models.BPE(vocab, _merges_from_scores(vocab, types, scores), unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    prefix = [normalizers.Prepend("\u2581")] if add_space_prefix else []
    tokenizer.normalizer = normalizers.Sequence([*prefix, normalizers.Replace(" ", "\u2581")])
    # Decoding undoes the escaping, then drops the dummy prefix once, at the start of the text.
    strip = [decoders.Strip(" ", 1, 0)] if add_space_prefix else []
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return tokenizer


def _merges_from_scores(vocab: dict[str, int], types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """Every split of a normal token into two vocabulary tokens, the best-scoring token's first.

    BPE joins the adjacent pair of lowest merge rank, llama.cpp the pair that makes the highest
    scoring token; ranking each token's splits by its score makes the two the same. Ties go to the
    lower id, which is how SentencePiece ranks its pieces. Only normal tokens are made by joining:
    the others are bytes, or added tokens matched whole in the text.
    """
    ranked = []
    for token, i in vocab.items():
        if types[i] != NORMAL:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


def _pre_tokenizer(fields: Mapping[str, Any]) -> PreTokenizer:
    pre = fields.get("tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedTokenizerError(
            f"tokenizer.ggml.pre {pre!r} is not supported; supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    return PRE_TOKENIZERS[pre]


def _byte_level(fields: Mapping[str, Any], vocab: dict[str, int], rules: PreTokenizer) -> Tokenizer:
    """GPT-2 style byte-level BPE, its text cut into words by the file's `tokenizer.ggml.pre` rules."""
    merges = [_split_merge(merge) for merge in _require(fields, "tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=rules.ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in rules.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _split_merge(merge: str) -> tuple[str, str]:
    """'a b' -> ('a', 'b'), cut at the first space after the first character, as llama.cpp cuts it."""
    cut = merge.find(" ", 1)
    if cut < 0:
        raise UnsupportedTokenizerError(f"tokenizer.ggml.merges entry {merge!r} has no space")
    return merge[:cut], merge[cut + 1 :]


def _info(
    fields: Mapping[str, Any], tokens: list[str], *, bos: int, eos: int, add_bos: bool, add_space_prefix: bool
) -> GGUFTokenizerInfo:
    """Special tokens and flags: the file's values over llama.cpp's defaults for the model type.

    A default id outside a small vocabulary means no such token, as in llama.cpp.
    """

    def token_id(key: str, default: int | None = None) -> int | None:
        value = fields.get(f"tokenizer.ggml.{key}")
        if value is None:
            return default if default is not None and default < len(tokens) else None
        if not 0 <= value < len(tokens):
            raise UnsupportedTokenizerError(f"tokenizer.ggml.{key} = {value} is outside [0, {len(tokens)})")
        return value

    def token(token_id: int | None) -> str | None:
        return None if token_id is None else tokens[token_id]

    bos_id, eos_id, pad_id = token_id("bos_token_id", bos), token_id("eos_token_id", eos), token_id("padding_token_id")
    turn_ends = (token_id("eot_token_id"), token_id("eom_token_id"))
    info = GGUFTokenizerInfo(
        model=fields["tokenizer.ggml.model"],
        pre=fields.get("tokenizer.ggml.pre"),
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        padding_token_id=pad_id,
        bos_token=token(bos_id),
        eos_token=token(eos_id),
        padding_token=token(pad_id),
        extra_eos_tokens=tuple(dict.fromkeys(tokens[i] for i in turn_ends if i is not None and i != eos_id)),
        add_bos_token=bool(fields.get("tokenizer.ggml.add_bos_token", add_bos)),
        add_eos_token=bool(fields.get("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=bool(fields.get("tokenizer.ggml.add_space_prefix", add_space_prefix)),
        chat_template=fields.get("tokenizer.chat_template"),
    )
    for flag, special in (("add_bos_token", info.bos_token), ("add_eos_token", info.eos_token)):
        if getattr(info, flag) and special is None:
            raise UnsupportedTokenizerError(f"tokenizer.ggml.{flag} is true, but the file names no such token")
    return info


def _add_special_tokens(tokenizer: Tokenizer, tokens: list[str], types: list[int], *, rstrip: bool) -> None:
    """Control and unknown tokens as special added tokens, user-defined ones as plain added tokens.

    All are matched in the raw text, before normalization, as llama.cpp matches them before it
    tokenizes the stretches between them. `rstrip` gives Phi-3's tokens their swallowing of the
    whitespace that follows them.
    """
    added = [
        AddedToken(
            token,
            special=kind != USER_DEFINED,
            normalized=False,
            rstrip=rstrip and token not in _PHI3_KEEP_RIGHT_SPACE,
        )
        for token, kind in zip(tokens, types, strict=True)
        if kind in (UNKNOWN, CONTROL, USER_DEFINED)
    ]
    tokenizer.add_special_tokens([token for token in added if token.special])
    tokenizer.add_tokens([token for token in added if not token.special])


def _post_processor(info: GGUFTokenizerInfo) -> processors.TemplateProcessing:
    """BOS/EOS around each sequence when the flags say so, as llama.cpp adds them."""
    bos = [info.bos_token] if info.add_bos_token else []
    eos = [info.eos_token] if info.add_eos_token else []
    ids = {info.bos_token: info.bos_token_id, info.eos_token: info.eos_token_id}
    return processors.TemplateProcessing(
        single=[*bos, "$A", *eos],
        pair=[*bos, "$A", *eos, *(f"{t}:1" for t in bos), "$B:1", *(f"{t}:1" for t in eos)],
        special_tokens=[(token, ids[token]) for token in dict.fromkeys(bos + eos)],
    )
