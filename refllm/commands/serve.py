"""``refllm serve``: the server's command line, its flags checked before the model loads."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from refllm import catalog
from refllm.commands import common
from refllm.commands.warm_start import SWITCHED
from refllm.commands.flags import add_model_flag, add_precision_flags, port_number, positive_int, positive_number, precision
from refllm.errors import InvalidInputError
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.server.guard import hosts_for
from refllm.server.limits import ServerLimits
from refllm.server.run import serve

API_KEY_VARIABLE = "REFLLM_API_KEY"


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` on a ``refllm``-style subparsers object."""
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve the model at http://HOST:PORT/v1: /models, /completions, /chat/completions (with\n"
        "streaming), /embeddings and /model/info; /health answers when it is up. Concurrent requests\n"
        "share one continuous-batching engine. Each request is logged in one line.",
        epilog="examples:\n  refllm serve\n  refllm serve --model gemma3-270m --port 8080 --max-batch 8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flag(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8000, help="port to listen on (default 8000)")
    parser.add_argument(
        "--max-batch", type=positive_int, default=16, help="most sequences decoded together (default 16)"
    )
    parser.add_argument(
        "--context",
        type=positive_int,
        metavar="N",
        help="most tokens of a request, prompt and answer (default: the model's)",
    )
    add_precision_flags(parser, dequantize=False)
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_VARIABLE),
        help=f"require 'Authorization: Bearer KEY' on every endpoint but /health (default: ${API_KEY_VARIABLE})",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a Host header to answer besides the bind address (repeatable; behind a proxy, say)",
    )
    parser.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web origin (https://example.com) whose pages may call the API (repeatable; default none)",
    )
    parser.add_argument(
        "--max-body-mb", type=positive_number, default=8.0, help="largest request body, in MB (default 8; larger: 413)"
    )
    parser.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    _check_can_listen(args.host, args.port)  # before the slow part
    hosts = hosts_for(args.host)  # None (any) for a wildcard address, unless --allowed-host names some
    if args.allowed_host:
        hosts = (*(hosts or ()), *args.allowed_host)
    limits = ServerLimits(max_body_bytes=int(args.max_body_mb * 1e6))
    model = common.load(args.model, context=args.context, **precision(args))
    llm = common.warm_llm(model, args.context, name=args.model, on_switch=lambda: print(SWITCHED, file=sys.stderr))
    engine = Engine(LLMExecutor(llm), model.tokenizer, max_batch_size=args.max_batch)
    name = model_id(args.model)
    where = f"http://{args.host}:{args.port}/v1"
    print(f"serving {name} ({model.metadata.architecture}, {args.model}) at {where}", file=sys.stderr)
    serve(
        engine,
        host=args.host,
        port=args.port,
        model_name=name,
        limits=limits,
        api_key=args.api_key or None,
        allowed_hosts=hosts,
        cors_origins=args.cors_origin,
    )
    return 0


def _check_can_listen(host: str, port: int) -> None:
    """Refuse, in one line, an address the server could not listen on (taken, not this machine's, not an address)."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as error:
        reason = (error.strerror or str(error)).split(" (while attempting")[0]
        raise InvalidInputError(f"cannot listen on {host}:{port}: {reason}") from None


def model_id(name_or_path: str) -> str:
    """The id clients ask for: the catalog name, or the file or directory name without ``.gguf``."""
    if name_or_path in catalog.CATALOG:
        return name_or_path
    return Path(name_or_path).name.removesuffix(".gguf")
