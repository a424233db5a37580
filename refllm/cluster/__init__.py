"""Corpus-scale jobs on a Ray cluster: golden dumps, golden checks (with their KL report) and perplexity.

A job is split into shards (prompts, or perplexity windows with their
overlap); a pool of Ray actors, each holding the model loaded once, runs them
and sends each result back as it finishes. A shard runs the same function the
single-process command runs for that prompt or window, so the merged result is
the same. Finished shards are kept on disk, so an interrupted job resumes
where it stopped. docs/cluster.md shows how to run it.

Ray is an optional extra (``pip install "refllm[cluster]"``): nothing here
imports it until a job starts, and ``import refllm`` never does.
"""

from __future__ import annotations

import socket

from refllm.errors import InvalidInputError

LOCAL = "local"  # --ray without an address: start a cluster on this machine
INSTALL_HINT = '--ray needs Ray, which is not installed here: pip install "refllm[cluster]"'
CONNECT_SECONDS = 5.0  # to reach a cluster's address before it counts as unreachable


class RayMissingError(InvalidInputError):
    """Ray is not installed, so a job cannot run on a cluster."""


class ClusterUnreachableError(ConnectionError):
    """Nothing answers at the cluster address given."""


def check_reachable(address: str, timeout: float = CONNECT_SECONDS) -> None:
    """Refuse within ``timeout`` seconds a HOST:PORT (or ray://HOST:PORT) where nothing accepts a connection:
    ``ray.init`` would retry for minutes. ``local`` and ``auto`` are left to Ray, which answers those at once."""
    if address in (LOCAL, "auto"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout).close()
    except (OSError, ValueError) as error:
        raise ClusterUnreachableError(
            f"no Ray cluster answers at {address} ({error}); start one there (ray start --head) or check the address"
        ) from None


def import_ray():
    """The ``ray`` module, or a RayMissingError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RayMissingError(INSTALL_HINT) from None
    return ray
