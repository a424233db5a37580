"""Running the app: ``serve`` (blocking, as ``refllm serve`` does) and ``BackgroundServer`` (a thread)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from starlette.applications import Starlette

from refllm.models.decoder import DecoderModel
from refllm.runtime.engine import Engine
from refllm.server.app import create_app
from refllm.server.connections import GuardedServer, server_config
from refllm.server.guard import hosts_for
from refllm.server.limits import ServerLimits


def serve(
    engine_or_model: Engine | DecoderModel,
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
    # the app writes each request's line when its answer is sent (refllm/server/access_log.py), not uvicorn
    GuardedServer(server_config(app, host, port, log_level="info", access_log=False)).run()


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
