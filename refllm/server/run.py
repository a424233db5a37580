"""Running the app: ``serve`` (blocking, as ``refllm serve`` does), ``BackgroundServer`` (a thread), the CLI."""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

import uvicorn
from starlette.applications import Starlette

from refllm import catalog
from refllm.commands import common
from refllm.commands.flags import add_precision_flags, port_number, positive_int, precision
from refllm.errors import InvalidInputError
from refllm.models.llama import LlamaFamilyModel
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.server.app import create_app


def serve(
    engine_or_model: Engine | LlamaFamilyModel,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    max_batch_size: int | None = None,
) -> None:
    """Serve until interrupted (Ctrl-C)."""
    app = create_app(engine_or_model, model_name=model_name, max_batch_size=max_batch_size)
    uvicorn.run(app, host=host, port=port, log_level="info")


class BackgroundServer:
    """The app served on a thread, for tests and notebooks; ``url`` is its base, with the real port when 0 is asked.

        with BackgroundServer(create_app(model)) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    """

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 30.0):
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="refllm-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + startup_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start on {host}:{port}")
            time.sleep(0.01)
        bound_port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{host}:{bound_port}"

    def stop(self) -> None:
        """Shut down (open streams get a few seconds to finish) and wait for the thread."""
        self._server.should_exit = True
        self._thread.join()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


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
    parser.add_argument(
        "--model",
        default=catalog.DEFAULT_MODEL,
        help=f"catalog name, .gguf file or Hugging Face directory (default {catalog.DEFAULT_MODEL})",
    )
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
    add_precision_flags(parser, float32=False)
    parser.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    _check_can_listen(args.host, args.port)  # before the slow part
    model = common.load(args.model, context=args.context, **precision(args))
    llm = common.warm_llm(model, args.context)
    engine = Engine(LLMExecutor(llm), model.tokenizer, max_batch_size=args.max_batch)
    name = model_id(args.model)
    where = f"http://{args.host}:{args.port}/v1"
    print(f"serving {name} ({model.config.model_type}, {args.model}) at {where}", file=sys.stderr)
    serve(engine, host=args.host, port=args.port, model_name=name)
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
