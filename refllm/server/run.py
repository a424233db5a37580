"""Running the app: ``serve`` (blocking, as ``refllm serve`` does), ``BackgroundServer`` (a thread), the CLI."""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from starlette.applications import Starlette

from refllm import catalog
from refllm.models.llama import LlamaFamilyModel
from refllm.runtime.engine import Engine
from refllm.server.app import create_app
from refllm.server.connections import GuardedServer, server_config
from refllm.server.guard import hosts_for
from refllm.server.limits import ServerLimits

API_KEY_VARIABLE = "REFLLM_API_KEY"


def serve(
    engine_or_model: Engine | LlamaFamilyModel,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    max_batch_size: int | None = None,
    limits: ServerLimits | None = None,
    api_key: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    cors_origins: Sequence[str] = (),
) -> None:
    """Serve until interrupted (Ctrl-C). ``allowed_hosts`` defaults to the names of ``host`` (any, for 0.0.0.0)."""
    app = create_app(
        engine_or_model,
        model_name=model_name,
        max_batch_size=max_batch_size,
        limits=limits,
        api_key=api_key,
        allowed_hosts=hosts_for(host) if allowed_hosts is None else allowed_hosts,
        cors_origins=cors_origins,
    )
    GuardedServer(server_config(app, host, port, log_level="info")).run()


class BackgroundServer:
    """The app served on a thread, for tests and notebooks; ``url`` is its base, with the real port when 0 is asked.

        with BackgroundServer(create_app(model)) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    """

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 30.0):
        config = server_config(app, host, port, log_level="warning", timeout_graceful_shutdown=5)
        self._server = GuardedServer(config)
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
        "streaming), /embeddings and /model/info. Concurrent requests share one continuous-batching engine.",
        epilog="examples:\n  refllm serve\n  refllm serve --model gemma3-270m --port 8080 --max-batch 8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        default=catalog.DEFAULT_MODEL,
        help=f"catalog name, .gguf file or Hugging Face directory (default {catalog.DEFAULT_MODEL})",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument("--max-batch", type=int, default=16, help="most sequences decoded together (default 16)")
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
        "--max-body-mb", type=float, default=8.0, help="largest request body, in MB (default 8; larger: 413)"
    )
    parser.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from refllm.loading import load_model

    hosts = hosts_for(args.host)  # None (any) for a wildcard address, unless --allowed-host names some
    if args.allowed_host:
        hosts = (*(hosts or ()), *args.allowed_host)
    limits = ServerLimits(max_body_bytes=int(args.max_body_mb * 1e6))
    model = load_model(args.model)
    serve(
        model,
        host=args.host,
        port=args.port,
        model_name=model_id(args.model),
        max_batch_size=args.max_batch,
        limits=limits,
        api_key=args.api_key or None,
        allowed_hosts=hosts,
        cors_origins=args.cors_origin,
    )
    return 0


def model_id(name_or_path: str) -> str:
    """The id clients ask for: the catalog name, or the file or directory name without ``.gguf``."""
    if name_or_path in catalog.CATALOG:
        return name_or_path
    return Path(name_or_path).name.removesuffix(".gguf")
