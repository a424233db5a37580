"""The ``refllm`` command line: one entry point, a sub-command per task.

    refllm generate PROMPT     continue a prompt, streaming the text
    refllm chat                talk with a model through its chat template
    refllm perplexity FILE     sliding-window perplexity of a text file
    refllm embed TEXT...       pooled final hidden states, as JSON
    refllm info [MODEL]        architecture, parameters, tensor types, memory estimates
    refllm bench               prefill and decode tokens/s, and how decode scales with batch size
    refllm pull NAME           fetch a catalog model

Results go to stdout, progress and messages to stderr. Flags are checked
before anything loads (a bad one exits 2); every other error a user can cause
prints one line and exits 1; ``--debug`` shows the traceback. The pieces the
commands share, and chat, info and bench, live in ``refllm.commands``. Other
modules add their own sub-commands (golden, serve, list, rm, warmup) through an
``add_cli(commands)`` function listed in ``PLUGINS``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

import refllm
from refllm import catalog, progress
from refllm.cluster.perplexity import perplexity_on_ray
from refllm.commands import common
from refllm.commands.answer import stream_answer
from refllm.commands.chat import chat_prompt, cmd_chat
from refllm.commands.flags import (
    MODEL_HELP,
    UsageError,
    add_cluster_flags,
    add_command,
    add_dequantize_flag,
    add_generation_flags,
    add_model_flag,
    add_precision_flags,
    bare_ray_flag_before_positional,
    batch_sizes,
    catalog_name,
    cluster_options,
    positive_int,
    precision,
    prompt_argument,
    read_prompt,
    sampling_params,
)
from refllm.commands.parsing import EXIT_USAGE, CommandParser, Parser, check_command, usage_error
from refllm.commands.measure import cmd_bench, cmd_info
from refllm.errors import InvalidInputError
from refllm.io.images import read_image
from refllm.io.vision_prompt import content_parts
from refllm.runtime.embedding import POOLINGS, pooled_hidden_states
from refllm.runtime.perplexity import perplexity, sliding_windows

EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130
PLUGINS = (
    "refllm.commands.golden",
    "refllm.testing.server_check",
    "refllm.commands.serve",
    "refllm.commands.models",
)  # modules whose add_cli(commands) registers more sub-commands


# ---- generate ---------------------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    prompt = prompt_argument(args)  # every flag checked before loading
    params = sampling_params(args, stop=tuple(args.stop))
    images = [read_image(path) for path in args.image]  # files read (and refused) before the model loads
    # a system message or an image goes through the chat template
    chat = args.chat or args.system is not None or bool(images)
    model = common.load(args.model, chat=chat, context=args.context, images=bool(images), **precision(args))
    engine = common.start_engine(model, args.context, args.model)
    try:
        pixels = []
        if chat:
            system = [{"role": "system", "content": args.system}] if args.system else []
            user = {"role": "user", "content": content_parts(prompt, len(images)) if images else prompt}
            prompt_ids, pixels = chat_prompt(model, [*system, user], images)
        else:
            prompt_ids = model.tokenizer.encode(prompt)
        _, stats = stream_answer(engine, prompt_ids, params, echo="" if chat else prompt, images=pixels)
    finally:
        engine.close()
    if not args.quiet:
        print(stats.line(), file=sys.stderr)
    return 0


# ---- run ---------------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    """ollama's ``run``: with a prompt, one answer (through the chat template where the model has one)."""
    args.model = args.model_name
    if args.prompt is None:
        args.model_name = None
        return cmd_chat(args)
    chats = catalog.CATALOG[args.model].chat if args.model in catalog.CATALOG else None
    if chats is None:
        chats = common.open_checked(args.model).tokenizer.chat_template is not None
    args.chat, args.stop, args.prompt_flag, args.image = chats, [], None, []
    return cmd_generate(args)


# ---- perplexity --------------------------------------------------------------------------------------


def cmd_perplexity(args: argparse.Namespace) -> int:
    if args.window < 2:
        raise UsageError(f"argument --window: {args.window} is too short: a window scores tokens after its first")
    if args.stride is not None and args.stride > args.window:
        raise UsageError(f"argument --stride: {args.stride} is longer than --window {args.window}")
    on_ray = cluster_options(args)
    path = Path(args.file)
    text = _read_text(path)
    if on_ray is None:
        model = common.load(args.model, context=args.window, context_flag="--window", **precision(args))
        tokenizer = model.tokenizer
    else:  # the workers load the weights; here only the tokenizer is needed
        tokenizer = common.open_checked(
            args.model, dtype=args.dtype, context=args.window, context_flag="--window"
        ).tokenizer
    ids = tokenizer.encode(text)
    if len(ids) < 2:
        raise InvalidInputError(f"{path} holds {len(ids)} token(s); perplexity needs at least 2")
    stride = args.stride or args.window // 2
    spans = sliding_windows(len(ids), args.window, stride)
    start = time.perf_counter()
    if on_ray is None:
        with progress.task(f"scoring {path.name}", total=len(spans), unit="window") as bar:
            value, scored = perplexity(model, ids, args.window, stride, args.cache, bar.update)
    else:
        value, scored = perplexity_on_ray(args.model, precision(args), ids, args.window, stride, args.cache, **on_ray)
    seconds = time.perf_counter() - start
    print(f"perplexity {value:.4f} over {scored} tokens ({len(spans)} windows of {args.window}, stride {stride})")
    print(f"{scored} tokens scored in {seconds:.1f} s: {scored / seconds:.1f} tokens/s")
    return 0


def _read_text(path: Path) -> str:
    """The text of a UTF-8 file; a missing file or other bytes are refused naming the file."""
    if not path.is_file():
        raise InvalidInputError(f"{path}: no such file")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise InvalidInputError(
            f"{path} is not UTF-8 text: byte 0x{data[error.start]:02x} at offset {error.start} (line {line})"
        ) from None


# ---- embed -------------------------------------------------------------------------------------------


def cmd_embed(args: argparse.Namespace) -> int:
    empty = [index + 1 for index, text in enumerate(args.texts) if not text]
    if empty:
        raise UsageError(f"argument TEXT: text {empty[0]} is empty; there is nothing to embed")
    model = common.load(args.model)
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
    common.write("\n")
    return 0


# ---- pull --------------------------------------------------------------------------------------------


def cmd_pull(args: argparse.Namespace) -> int:
    print(catalog.pull(args.name, progress=not args.quiet))
    return 0


# ---- the parser --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="refllm",
        description="A NumPy reference implementation of LLM inference that runs on a laptop CPU.",
        epilog="Run 'refllm COMMAND --help' for a command's flags and an example.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    parser.add_argument("--version", action="version", version=f"refllm {refllm.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)

    def command(*how) -> argparse.ArgumentParser:
        return add_command(commands, *how)

    generate = command(
        "generate",
        cmd_generate,
        "continue a prompt, streaming the text",
        "Continue PROMPT with the model, printing each piece of text as it is generated, then a line\n"
        "of stats on stderr. With --chat the prompt is sent as a user message through the model's\n"
        "chat template.",
        'refllm generate "The capital of France is" --max-tokens 20',
        'refllm generate "Write a haiku about the sea." --chat --temperature 0.7 --seed 1',
        'refllm generate "List three colours:" --stop "4." --stop "\\n\\n"',
        'refllm generate "What is in this picture?" --image photo.jpg --model path/to/SmolVLM-256M-Instruct',
        "cat question.txt | refllm generate - --chat",
    )
    generate.add_argument(
        "prompt", nargs="?", metavar="PROMPT", help="the text to continue; - reads it from standard input"
    )
    generate.add_argument("-p", "--prompt", dest="prompt_flag", metavar="TEXT", help="the same as PROMPT")
    add_model_flag(generate)
    generate.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    generate.add_argument("--system", metavar="TEXT", help="a system message before the prompt (implies --chat)")
    generate.add_argument(
        "--image", action="append", default=[], metavar="FILE",
        help="an image to ask about, for a vision-language model (repeatable; implies --chat)",
    )  # fmt: skip
    generate.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="stop before this text (repeatable)"
    )
    add_precision_flags(generate)
    add_generation_flags(generate, max_tokens=128)

    chat = command(
        "chat",
        cmd_chat,
        "talk with a model, keeping the conversation",
        "Read messages line by line (typed, or piped on stdin) and stream each answer.\n"
        "The conversation so far goes through the model's chat template with every message.\n"
        "/help lists the commands: /show, /retry, /set changes a setting, /save and /load keep a conversation.",
        "refllm chat",
        "refllm chat smollm2-135m --temperature 0.7",
        "printf 'Hi!\\n/reset\\nWhat is 2 + 2?\\n' | refllm chat -n 40",
    )
    chat.add_argument("model_name", nargs="?", metavar="MODEL", help=f"the model, as --model (default {catalog.DEFAULT_MODEL})")
    add_model_flag(chat, default=None)
    chat.add_argument("--system", metavar="TEXT", help="a system message that starts the conversation")
    add_precision_flags(chat)
    add_generation_flags(chat, max_tokens=256)

    run = command(
        "run",
        cmd_run,
        "chat with a model, or answer one prompt (as ollama run)",
        "With MODEL alone, a chat (as refllm chat MODEL). With a PROMPT too, one answer to it through the\n"
        "model's chat template (as refllm generate PROMPT --chat), or, for a model without one, its\n"
        "continuation of the prompt.",
        "refllm run smollm2-135m",
        'refllm run smollm2-135m "Why is the sky blue?"',
    )
    run.add_argument("model_name", metavar="MODEL", help=MODEL_HELP)
    run.add_argument("prompt", nargs="?", metavar="PROMPT", help="one prompt to answer; without it, a chat")
    run.add_argument("--system", metavar="TEXT", help="a system message first")
    add_precision_flags(run)
    add_generation_flags(run, max_tokens=256)

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
    add_model_flag(ppl)
    add_precision_flags(ppl, dequantize=False)
    ppl.add_argument("--window", type=positive_int, default=512, metavar="N", help="tokens per window (default 512)")
    ppl.add_argument(
        "--stride", type=positive_int, metavar="S", help="tokens between window starts (default: half the window)"
    )
    ppl.add_argument(
        "--cache",
        choices=("paged", "contiguous"),
        default="paged",
        help="the paged arena (default) or the contiguous cache; with --spec-ops, contiguous is the reference",
    )
    add_cluster_flags(ppl, "keep finished shards here, so an interrupted run resumes")

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
    add_model_flag(embed)
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
        type=positive_int,
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
    add_model_flag(bench)
    add_dequantize_flag(bench)
    bench.add_argument(
        "--prompt-tokens", type=positive_int, default=256, metavar="N", help="prompt length (default 256)"
    )
    bench.add_argument(
        "--new-tokens", type=positive_int, default=64, metavar="N", help="decode steps per batch (default 64)"
    )
    bench.add_argument(
        "--batch",
        type=batch_sizes,
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
        "name", type=catalog_name, metavar="NAME", help=f"catalog name: {', '.join(catalog.CATALOG)}"
    )
    pull.add_argument("--quiet", action="store_true", help="no progress output")

    for module in PLUGINS:
        importlib.import_module(module).add_cli(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = bare_ray_flag_before_positional(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    check_command(argv, commands, catalog.CATALOG)
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `refllm generate ... | head`: the reader is gone, so stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when stdout is flushed
        return EXIT_USER_ERROR
    except UsageError as error:
        if args.debug:
            raise
        sys.stderr.write(usage_error(f"refllm {args.command}", str(error)))
        return EXIT_USAGE
    except (ValueError, KeyError, OSError, MemoryError) as error:
        if args.debug:
            raise
        message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
        message = " ".join(message.split()) or type(error).__name__  # one line, whatever the message
        print(f"refllm: error: {message}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
