"""The ``refllm`` command line: one entry point, a sub-command per task.

    refllm generate PROMPT     continue a prompt, streaming the text
    refllm chat                talk with a model through its chat template
    refllm perplexity FILE     sliding-window perplexity of a text file
    refllm embed TEXT...       pooled final hidden states, as JSON
    refllm info [MODEL]        architecture, parameters, tensor types, memory estimates
    refllm bench               prefill and decode tokens/s, and how decode scales with batch size
    refllm pull NAME           fetch a catalog model

Results go to stdout, progress and messages to stderr. Every error a user can
cause prints one line and exits non-zero; ``--debug`` shows the traceback.
Other modules add their own sub-commands through an ``add_cli(commands)``
function listed in ``PLUGINS``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import platform
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numba
import numpy as np

from refllm import catalog, progress
from refllm.errors import InvalidInputError
from refllm.io.gguf import GGUFSource
from refllm.io.tokenizer import Tokenizer
from refllm.kernels.threads import cpu_name, thread_settings
from refllm.kv import CacheConfig, CacheShape
from refllm.loading import open_source
from refllm.models.contract import ModelSource
from refllm.models.llama import DTYPES, LlamaFamilyModel
from refllm.models.weights import checkpoint_shapes
from refllm.quant.linear import QuantizedTensor, kernel_reads
from refllm.runtime.embedding import POOLINGS, pooled_hidden_states
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.generate import generate_stream
from refllm.runtime.llm import LLM, blocks_for
from refllm.runtime.sampling import SamplingParams

EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130
PLUGINS = ("refllm.testing.golden", "refllm.testing.server_check", "refllm.server")  # modules whose add_cli(commands) registers more sub-commands
FLOAT32_HELP = "dequantize a GGUF file's weights to float32 instead of multiplying from its blocks"
DTYPE_HELP = "float32 (default), or float64: ground truth, every step in float64 with the spec ops (slow)"
REFERENCE_HELP = "run the spec ops (the functions of refllm/nn, plain NumPy) instead of their Numba twins"
MODEL_HELP = (
    f"catalog name ({', '.join(catalog.CATALOG)}), .gguf file or Hugging Face directory"
    f" (default {catalog.DEFAULT_MODEL})"
)


# ---- generate ---------------------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    params = _sampling_params(args)
    model = _load(args.model, chat=args.chat, **_precision(args))
    if args.chat:
        prompt_ids = _chat_ids(model.tokenizer, [{"role": "user", "content": args.prompt}])
    else:
        prompt_ids = model.tokenizer.encode(args.prompt)
        _write(args.prompt)
    for step in generate_stream(model, prompt_ids, params):
        _write(step.text)
    _write("\n")
    return 0


# ---- chat --------------------------------------------------------------------------------------------

CHAT_HELP = "/reset clears the conversation, /exit (or Ctrl-D) quits, Ctrl-C stops an answer"


def cmd_chat(args: argparse.Namespace) -> int:
    params = _sampling_params(args)
    model = _load(args.model, chat=True, **_precision(args))
    engine = Engine(LLMExecutor(LLM(model), offload=False), model.tokenizer)
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    if sys.stdin.isatty():
        print(f"chatting with {args.model}: {CHAT_HELP}", file=sys.stderr)
    try:
        for line in _user_lines():
            text = line.strip()
            if text in ("/exit", "/quit"):
                break
            if text == "/reset":
                messages = list(start)
                print("(conversation cleared)", file=sys.stderr)
            elif text.startswith("/"):
                print(f"unknown command {text}; {CHAT_HELP}", file=sys.stderr)
            elif text:
                messages.append({"role": "user", "content": text})
                try:
                    answer = _answer(engine, model.tokenizer, messages, params)
                except InvalidInputError as error:  # a conversation past the context, say: the chat goes on
                    messages.pop()
                    print(f"refllm: {error}; /reset starts a new conversation", file=sys.stderr)
                    continue
                messages.append({"role": "assistant", "content": answer})
    finally:
        engine.close()
    return 0


def _user_lines() -> Iterator[str]:
    """Lines typed at a "> " prompt on a terminal, or read from piped stdin; ends at EOF (or Ctrl-C at the prompt)."""
    if not sys.stdin.isatty():
        yield from sys.stdin
        return
    while True:
        try:
            yield input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return


def _answer(engine: Engine, tokenizer: Tokenizer, messages: list[dict], params: SamplingParams) -> str:
    """Stream the model's reply to ``messages``; Ctrl-C ends the reply early. -> the text shown."""
    handle = engine.submit(_chat_ids(tokenizer, messages), params)
    parts = []
    with _ctrl_c_sets_flag() as interrupted:
        for delta in handle:
            _write(delta.text)
            parts.append(delta.text)
            if interrupted.is_set():
                handle.cancel()
                break
    _write("\n")
    if interrupted.is_set():
        print("(answer stopped)", file=sys.stderr)
    return "".join(parts)


@contextlib.contextmanager
def _ctrl_c_sets_flag() -> Iterator[threading.Event]:
    """While inside, Ctrl-C sets the yielded flag instead of raising KeyboardInterrupt.

    The engine then finishes its step and the reply is cancelled cleanly, between steps.
    """
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():  # only the main thread receives signals
        yield flag
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def _chat_ids(tokenizer: Tokenizer, messages: list[dict]) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)


# ---- perplexity --------------------------------------------------------------------------------------


def cmd_perplexity(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise InvalidInputError(f"{path}: no such file")
    if args.window < 2:
        raise InvalidInputError(f"--window {args.window} is too short: a window scores tokens after its first")
    if args.stride is not None and args.stride > args.window:
        raise InvalidInputError(f"--stride {args.stride} is longer than --window {args.window}")
    model = _load(args.model, **_precision(args))
    context = model.config.context_length
    if args.window > context:
        raise InvalidInputError(f"--window {args.window} is longer than {args.model}'s context of {context} tokens")
    ids = model.tokenizer.encode(path.read_text(encoding="utf-8"))
    if len(ids) < 2:
        raise InvalidInputError(f"{path} holds {len(ids)} token(s); perplexity needs at least 2")
    stride = args.stride or args.window // 2
    spans = sliding_windows(len(ids), args.window, stride)
    start = time.perf_counter()
    with progress.task(f"scoring {path.name}", total=len(spans), unit="window") as bar:
        value, scored = perplexity(model, ids, args.window, stride, args.cache, bar.update)
    seconds = time.perf_counter() - start
    print(f"perplexity {value:.4f} over {scored} tokens ({len(spans)} windows of {args.window}, stride {stride})")
    print(f"{scored} tokens scored in {seconds:.1f} s: {scored / seconds:.1f} tokens/s")
    return 0


def sliding_windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """[begin, end) of each window: starts ``stride`` apart, until one reaches the last token."""
    spans = []
    for begin in range(0, num_tokens, stride):
        spans.append((begin, min(begin + window, num_tokens)))
        if spans[-1][1] == num_tokens:
            break
    return spans


def perplexity(
    model: LlamaFamilyModel, ids: list[int], window: int, stride: int, cache_kind: str = "paged", advance=None
) -> tuple[float, int]:
    """Sliding-window perplexity of ``ids`` [T] -> (perplexity, tokens scored).

    transformers' recipe: each window scores only the tokens no earlier window
    scored (after the first, at most its last ``stride``), each from the logits
    of the position before it, so a token is scored once, with up to
    ``window - 1`` tokens of context; a window's first token is never scored.
    ``advance`` is called once per window (a progress bar's ``update``).
    """
    block_size = CacheConfig().block_size
    cache = model.create_kv_cache(
        CacheConfig(kind=cache_kind, num_blocks=blocks_for(window, block_size), prefix_caching=False)
    )
    ids = np.asarray(ids)
    nll, scored, scored_end = 0.0, 0, 0  # tokens before scored_end have been scored (or cannot be)
    for begin, end in sliding_windows(len(ids), window, stride):
        logits = model.prefill_all_logits(ids[None, begin:end], cache, range(end - begin))[0]  # [T, V]
        cache.free(0)
        targets = np.arange(max(scored_end, begin + 1), end)  # absolute positions scored in this window
        rows = logits[targets - 1 - begin]  # [n, V]: position t - 1 predicts token t
        top = rows.max(axis=1)
        log_z = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
        nll += float(np.sum(log_z - rows[np.arange(len(targets)), ids[targets]], dtype=np.float64))
        scored, scored_end = scored + len(targets), end
        if advance is not None:
            advance()
    return math.exp(nll / scored), scored


# ---- embed -------------------------------------------------------------------------------------------


def cmd_embed(args: argparse.Namespace) -> int:
    model = _load(args.model)
    data = []
    for index, text in enumerate(args.texts):
        ids = model.tokenizer.encode(text)
        if not ids:
            raise InvalidInputError(f"text {index + 1} ({text!r}) has no tokens to embed")
        vector = pooled_hidden_states(model, ids, args.pooling)
        # str() of a float32 is the shortest decimal that reads back as the same float32.
        data.append({"text": text, "tokens": len(ids), "embedding": [float(str(v)) for v in vector]})
    out = {"model": args.model, "pooling": args.pooling, "dimensions": model.config.hidden_size, "data": data}
    json.dump(out, sys.stdout)
    _write("\n")
    return 0


# ---- info --------------------------------------------------------------------------------------------


def cmd_info(args: argparse.Namespace) -> int:
    source = _open(args.model)
    c = source.config
    context = args.context or c.context_length
    if context > c.context_length:
        raise InvalidInputError(f"--context {context} is longer than {args.model}'s context of {c.context_length}")
    kv_per_token = CacheShape(c.num_hidden_layers, c.num_key_value_heads, c.head_dim).bytes_per_token
    block_size = CacheConfig().block_size
    kv = blocks_for(context, block_size) * block_size * kv_per_token
    weights = weight_bytes(source, quantized=False)
    available = available_memory()
    tokenizer = source.tokenizer
    file, tensor_types = _storage(source)
    rows = {
        "model": args.model,
        "architecture": (
            f"{c.model_type}: {c.num_hidden_layers} layers, hidden size {c.hidden_size}, MLP {c.intermediate_size},"
            f" {c.num_attention_heads} query / {c.num_key_value_heads} KV heads of {c.head_dim}"
        ),
        "parameters": f"{c.num_parameters:,} ({c.num_parameters / 1e6:.1f} M)",
        "vocabulary": f"{c.vocab_size:,} tokens",
        "context": f"{c.context_length:,} tokens",
        "file": file,
        "tensors": tensor_types,
        "tokenizer": "none" if tokenizer is None else f"chat template: {'yes' if tokenizer.chat_template else 'no'}",
        "weights": f"{_size(weights)} as float32"
        + (f"; {_size(weight_bytes(source, quantized=True))} quantized" if isinstance(source, GGUFSource) else ""),
        "KV cache": f"{_size(kv_per_token)} per token; {_size(kv)} for {context:,} tokens",
        "memory": f"{_size(weights + kv)} for float32 weights and the KV cache"
        + ("" if available is None else f"; {_size(available)} available"),
    }
    width = max(map(len, rows))
    for key, value in rows.items():
        print(f"{key:<{width}}  {value}")
    return 0


def _storage(source: ModelSource) -> tuple[str, str]:
    """-> (file format, size on disk and path; how many tensors of each type: GGML type or safetensors dtype)."""
    if isinstance(source, GGUFSource):
        kind, path, files = "GGUF", source.path, {source.path}
        types = Counter(tensor.type.name for tensor in source.header.tensors)
    else:
        entries = source.checkpoint.entries.values()
        kind, path, files = "safetensors", source.directory, {entry.file for entry in entries}
        types = Counter(entry.dtype for entry in entries)
    counts = ", ".join(f"{n} {name}" for name, n in types.most_common())
    return f"{kind}, {_size(sum(f.stat().st_size for f in files))}: {path}", counts


# ---- bench -------------------------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    prompt_len, new_tokens, batches = args.prompt_tokens, args.new_tokens, args.batch
    model = _load(args.model, text=False, quantized=not args.float32)
    if prompt_len + new_tokens > model.config.context_length:
        raise InvalidInputError(
            f"--prompt-tokens plus --new-tokens is {prompt_len + new_tokens}, past {args.model}'s context"
            f" of {model.config.context_length}"
        )
    block_size = CacheConfig().block_size
    blocks = max(batches) * blocks_for(prompt_len + new_tokens, block_size)
    llm = LLM(model, CacheConfig(block_size=block_size, num_blocks=blocks, prefix_caching=False))
    prompts = np.random.default_rng(0).integers(0, model.config.vocab_size, size=(max(batches), prompt_len))
    decode_rates = {}
    with progress.task("benchmarking", total=1 + len(batches) * new_tokens, unit="step") as bar:
        _greedy(llm, prompts[:1], 1)  # warm-up: compiles the kernels, touches every weight
        start = time.perf_counter()
        llm.prefill(0, prompts[0])
        prefill_seconds = time.perf_counter() - start
        llm.reset()
        bar.update()
        for batch in batches:
            seconds = _greedy(llm, prompts[:batch], new_tokens, bar.update)
            decode_rates[batch] = batch * new_tokens / seconds
    c = model.config
    print(f"machine   {cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}")
    print(f"software  Python {platform.python_version()}, NumPy {np.__version__}, Numba {numba.__version__}")
    print(f"threads   {thread_settings()}")
    quantized = any(isinstance(w, QuantizedTensor) for w in vars(model.weights.layers[0]).values())
    weights = "quantized matrices" if quantized else "float32 weights"
    print(f"model     {args.model}: {c.model_type}, {c.num_parameters:,} parameters, {weights}")
    print(f"prefill   {prompt_len} tokens in {prefill_seconds:.2f} s: {prompt_len / prefill_seconds:.1f} tokens/s")
    print(f"decode    {new_tokens} tokens per sequence after a {prompt_len}-token prompt")
    print(f"{'batch':>10}  {'tokens/s':>9}  {'per sequence':>12}  {f'vs batch {batches[0]}':>10}")
    for batch, rate in decode_rates.items():
        speedup = rate / decode_rates[batches[0]]
        print(f"{batch:>10}  {rate:>9.1f}  {rate / batch:>12.1f}  {speedup:>9.2f}x")
    return 0


def _greedy(llm: LLM, prompts: np.ndarray, new_tokens: int, advance=lambda: None) -> float:
    """Prefill each row of prompts [B, T], then decode ``new_tokens`` greedy steps as one batch -> decode seconds."""
    tokens = [int(np.argmax(llm.prefill(b, prompt))) for b, prompt in enumerate(prompts)]
    start = time.perf_counter()
    for step in range(new_tokens):
        rows = llm.decode_batch([(b, token, prompts.shape[1] + step) for b, token in enumerate(tokens)])
        tokens = [int(np.argmax(row)) for row in rows]
        advance()
    seconds = time.perf_counter() - start
    llm.reset()
    return seconds


# ---- pull --------------------------------------------------------------------------------------------


def cmd_pull(args: argparse.Namespace) -> int:
    print(catalog.pull(args.name, progress=not args.quiet))
    return 0


# ---- models: open, check, load -----------------------------------------------------------------------


def _precision(args: argparse.Namespace) -> dict:
    """The --float32 / --dtype / --reference flags -> _load's keywords: quantized blocks only for the float32 fast path."""
    dtype, reference = getattr(args, "dtype", "float32"), getattr(args, "reference", False) or None
    return {
        "quantized": not getattr(args, "float32", True) and dtype == "float32" and not reference,
        "dtype": dtype,
        "reference": reference,
    }


def _add_precision_flags(parser: argparse.ArgumentParser, float32: bool = True) -> None:
    if float32:
        parser.add_argument("--float32", action="store_true", help=FLOAT32_HELP)
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help=DTYPE_HELP)
    parser.add_argument("--reference", action="store_true", help=REFERENCE_HELP)


def _open(name: str, quantized: bool = False, dtype: str = "float32") -> ModelSource:
    """A catalog name (pulled on first use), a .gguf file or a Hugging Face directory -> its ModelSource.

    ``quantized``: a GGUF file's matrices stay in their blocks where a quantized kernel reads them.
    """
    if name in catalog.CATALOG:
        return open_source(catalog.pull(name), quantized=quantized, dtype=dtype)
    if not Path(name).expanduser().exists():
        raise InvalidInputError(
            f"{name} is neither a catalog model ({', '.join(catalog.CATALOG)}) nor an existing file or directory"
        )
    return open_source(name, quantized=quantized, dtype=dtype)


def _load(
    name: str,
    *,
    text: bool = True,
    chat: bool = False,
    quantized: bool = False,
    dtype: str = "float32",
    reference: bool | None = None,
) -> LlamaFamilyModel:
    """Open the model, refuse what cannot work (before the slow part), then load its weights with progress."""
    source = _open(name, quantized, dtype)
    if text and source.tokenizer is None:
        raise InvalidInputError(f"{name} has no tokenizer, so it cannot read or write text")
    if chat and source.tokenizer.chat_template is None:
        raise InvalidInputError(
            f"{name} has no chat template, so it cannot chat; `refllm generate` continues plain text with it"
        )
    needed, available = weight_bytes(source, quantized, dtype), available_memory()
    if available is not None and needed > available:
        raise InvalidInputError(
            f"{name} needs about {_size(needed)} for its weights, more than the {_size(available)} of memory available"
        )
    with progress.task(f"loading {name}", total=len(checkpoint_shapes(source.config)), unit="tensor") as bar:
        return LlamaFamilyModel.load(_CountingSource(source, bar.update), dtype, reference)


class _CountingSource:
    """A ModelSource that calls ``advance`` after every tensor it reads (a progress bar's ``update``)."""

    def __init__(self, source: ModelSource, advance):
        self.source, self.advance = source, advance
        self.config, self.tokenizer = source.config, source.tokenizer

    def tensor_names(self) -> list[str]:
        return self.source.tensor_names()

    def tensor(self, name: str) -> np.ndarray | QuantizedTensor:
        array = self.source.tensor(name)
        self.advance()
        return array

    def where(self, name: str | None) -> str:
        return self.source.where(name)


def weight_bytes(source: ModelSource, quantized: bool, dtype: str = "float32") -> int:
    """Bytes of the loaded weights: 4 a parameter (8 in float64), except the matrices a quantized GGUF
    load keeps in blocks."""
    if not (quantized and isinstance(source, GGUFSource)):
        return np.dtype(dtype).itemsize * source.config.num_parameters
    total = 0
    for tensor in source.header.tensors:
        total += tensor.nbytes if kernel_reads(tensor.type.name, tensor.shape) else 4 * tensor.num_elements
    return total


def available_memory() -> int | None:
    """Bytes of memory available to a new process (MemAvailable), or None where /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _size(num_bytes: float) -> str:
    """1536 -> "1.5 KiB"."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while num_bytes >= 1024 and power < len(units) - 1:
        num_bytes, power = num_bytes / 1024, power + 1
    return f"{num_bytes:.0f} B" if power == 0 else f"{num_bytes:.1f} {units[power]}"


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# ---- the parser --------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line that points at --help."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _batch_sizes(text: str) -> list[int]:
    return [_positive_int(part) for part in text.split(",")]


def _sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        max_tokens=args.max_tokens,
    )


def _add_sampling_flags(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    flag = parser.add_argument
    flag(
        "--max-tokens", type=_positive_int, default=max_tokens, metavar="N", help=f"most tokens (default {max_tokens})"
    )
    flag("--temperature", type=float, default=0.0, metavar="T", help="0 is greedy (default); higher is more random")
    flag("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (default 1.0: off)")
    flag("--top-k", type=int, default=0, metavar="K", help="sample among the k most likely (default 0: off)")
    flag("--min-p", type=float, default=0.0, metavar="P", help="drop tokens below P x the top one (default 0: off)")
    flag("--repetition-penalty", type=float, default=1.0, metavar="R", help="(default 1.0: off)")
    flag("--seed", type=int, default=None, metavar="S", help="makes sampling reproducible")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="refllm",
        description="A NumPy reference implementation of LLM inference that runs on a laptop CPU.",
        epilog="Run 'refllm COMMAND --help' for a command's flags and an example.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    debug = argparse.ArgumentParser(add_help=False)  # --debug after the command works too
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")

    def command(name: str, handler, summary: str, description: str, *examples: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=summary,
            description=description,
            epilog="example" + "s" * (len(examples) > 1) + ":\n" + "\n".join(f"  {e}" for e in examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[debug],
        )
        sub.set_defaults(handler=handler)
        return sub

    generate = command(
        "generate",
        cmd_generate,
        "continue a prompt, streaming the text",
        "Continue PROMPT with the model, printing each piece of text as it is generated.\n"
        "With --chat the prompt is sent as a user message through the model's chat template.",
        'refllm generate "The capital of France is" --max-tokens 20',
        'refllm generate "Write a haiku about the sea." --chat --temperature 0.7 --seed 1',
    )
    generate.add_argument("prompt", metavar="PROMPT", help="the text to continue")
    generate.add_argument("--model", default=catalog.DEFAULT_MODEL, help=MODEL_HELP)
    generate.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    _add_precision_flags(generate)
    _add_sampling_flags(generate, max_tokens=128)

    chat = command(
        "chat",
        cmd_chat,
        "talk with a model, keeping the conversation",
        "Read messages line by line (typed, or piped on stdin) and stream each answer.\n"
        "The conversation so far goes through the model's chat template with every message.\n"
        f"Commands: {CHAT_HELP}.",
        "refllm chat",
        "printf 'Hi!\\n/reset\\nWhat is 2 + 2?\\n' | refllm chat --max-tokens 40",
    )
    chat.add_argument("--model", default=catalog.DEFAULT_MODEL, help=MODEL_HELP)
    chat.add_argument("--system", metavar="TEXT", help="a system message that starts the conversation")
    _add_precision_flags(chat)
    _add_sampling_flags(chat, max_tokens=256)

    ppl = command(
        "perplexity",
        cmd_perplexity,
        "perplexity of a text file, in sliding windows",
        "Score every token of FILE (after the first) given the text before it, in windows of --window\n"
        "tokens that start --stride tokens apart; each window scores only the tokens no earlier window\n"
        "scored. Prints the perplexity and the tokens scored per second.",
        "refllm perplexity book.txt --window 512 --stride 256",
    )
    ppl.add_argument("file", metavar="FILE", help="a UTF-8 text file")
    ppl.add_argument("--model", default=catalog.DEFAULT_MODEL, help=MODEL_HELP)
    _add_precision_flags(ppl, float32=False)
    ppl.add_argument("--window", type=_positive_int, default=512, metavar="N", help="tokens per window (default 512)")
    ppl.add_argument(
        "--stride", type=_positive_int, metavar="S", help="tokens between window starts (default: half the window)"
    )
    ppl.add_argument(
        "--cache",
        choices=("paged", "contiguous"),
        default="paged",
        help="the paged arena (default) or the contiguous cache; with --reference, contiguous is the reference",
    )

    embed = command(
        "embed",
        cmd_embed,
        "embed texts as pooled final hidden states (JSON)",
        "Run each TEXT through the model and pool its final hidden states (after the final norm):\n"
        "the mean over every token, or the last token's. Prints JSON:\n"
        '{"model", "pooling", "dimensions", "data": [{"text", "tokens", "embedding"}, ...]}.',
        'refllm embed "a cat" "a dog" --pooling mean',
    )
    embed.add_argument("texts", nargs="+", metavar="TEXT", help="texts to embed, one vector each")
    embed.add_argument("--model", default=catalog.DEFAULT_MODEL, help=MODEL_HELP)
    embed.add_argument("--pooling", choices=POOLINGS, default="mean", help="how to pool (default mean)")

    info = command(
        "info",
        cmd_info,
        "describe a model and estimate its memory, without loading its weights",
        "Print MODEL's architecture, parameter count, file format and tensor types (GGML types for\n"
        "GGUF, dtypes for safetensors), the memory of its weights (as float32, and for GGUF also kept\n"
        "quantized), and of its KV cache per token and for --context tokens. No weights are loaded.",
        "refllm info gemma3-270m --context 4096",
    )
    info.add_argument("model", nargs="?", metavar="MODEL", default=catalog.DEFAULT_MODEL, help=MODEL_HELP)
    info.add_argument(
        "--context",
        type=_positive_int,
        metavar="N",
        help="tokens to size the KV cache for (default: the model's context)",
    )

    bench = command(
        "bench",
        cmd_bench,
        "measure prefill and decode speed",
        "Time one prefill of --prompt-tokens random tokens, then greedy decoding of --new-tokens tokens\n"
        "for batches of each --batch size, and print tokens/s with how decode scales with the batch,\n"
        "beside the machine and its thread settings.",
        "refllm bench --prompt-tokens 256 --new-tokens 64 --batch 1,4,8",
    )
    bench.add_argument("--model", default=catalog.DEFAULT_MODEL, help=MODEL_HELP)
    bench.add_argument("--float32", action="store_true", help=FLOAT32_HELP)
    bench.add_argument(
        "--prompt-tokens", type=_positive_int, default=256, metavar="N", help="prompt length (default 256)"
    )
    bench.add_argument(
        "--new-tokens", type=_positive_int, default=64, metavar="N", help="decode steps per batch (default 64)"
    )
    bench.add_argument(
        "--batch",
        type=_batch_sizes,
        default=[1, 4, 8],
        metavar="B,B,...",
        help="batch sizes, comma-separated (default 1,4,8)",
    )

    pull = command(
        "pull",
        cmd_pull,
        "download a catalog model",
        "Fetch a catalog model into $REFLLM_HOME (default ~/.cache/refllm), verify its checksum and print\n"
        "its path. Pulling a model that is already there does nothing.",
        "refllm pull gemma3-270m",
    )
    pull.add_argument(
        "name", choices=sorted(catalog.CATALOG), metavar="NAME", help=f"catalog name: {', '.join(catalog.CATALOG)}"
    )
    pull.add_argument("--quiet", action="store_true", help="no progress output")

    for module in PLUGINS:
        importlib.import_module(module).add_cli(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `refllm generate ... | head`: the reader is gone, so stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when stdout is flushed
        return EXIT_USER_ERROR
    except (ValueError, KeyError, OSError, MemoryError) as error:
        if args.debug:
            raise
        message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
        message = " ".join(message.split()) or type(error).__name__  # one line, whatever the message
        print(f"refllm: error: {message}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
