"""An OpenAI-compatible HTTP server over one continuous-batching Engine.

    refllm serve --model smollm2-135m --port 8000       # the command line
    serve(model, port=8000)                              # the same, from Python
    app = create_app(engine_or_model)                    # the Starlette app, to mount or run yourself
    with BackgroundServer(app) as server: ...            # on a thread, port 0 by default (tests, notebooks)

Endpoints: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (both
with SSE streaming), ``/v1/embeddings``, ``/v1/model/info`` and ``/health``; limits
on what one client may ask, an API key and Host/Origin checks. See docs/server.md.
"""

from refllm.server.app import create_app
from refllm.server.limits import ServerLimits
from refllm.server.run import BackgroundServer, serve

__all__ = ["BackgroundServer", "ServerLimits", "create_app", "serve"]
