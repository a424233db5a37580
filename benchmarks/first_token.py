"""Time to the first token of a fresh install's first ``refllm generate``, and of the run after it.

Each of ``--runs`` rounds makes a new virtual environment, installs this
checkout into it (not editable: the Numba kernel cache lives beside the
installed package, so it starts empty), and times:

- first: the first ``refllm generate`` in it, from starting the process to the first
  byte of the answer on stdout (the kernels are not compiled: it answers on the spec
  ops while they compile in the background);
- later: once that background compile is done, the next ``refllm generate``
  (kernels loaded from the cache), the same way;
- foreground: for comparison, a first run in another fresh environment that waits for
  the compile as refllm did before (``REFLLM_COMPILE=foreground``); only with ``--foreground``,
  as it takes a minute or more a round.

The model comes from ``$REFLLM_HOME`` (pulled once, beforehand, so no download is
timed). Prints the machine, each round and the medians, and the figures as JSON.

    python benchmarks/first_token.py [--runs 3] [--model smollm2-135m] [--foreground]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from refllm import catalog
from refllm.machine import cpu_name, thread_settings

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The capital of France is"


def make_environment(where: Path, wheel: Path) -> Path:
    """A new virtual environment at ``where`` with refllm installed from ``wheel`` -> its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, str(wheel)], check=True)
    return where / "bin"


def first_token(bin_dir: Path, model: str, max_tokens: int, extra_env: dict[str, str]) -> tuple[float, float]:
    """Run ``refllm generate`` -> (seconds to the first byte after the echoed prompt, seconds to exit)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "REFLLM_COMPILE")} | extra_env
    command = [str(bin_dir / "refllm"), "generate", PROMPT, "-m", model, "-n", str(max_tokens), "--quiet"]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=bin_dir)
    seen, first = b"", None
    while True:
        ready, _, _ = select.select([process.stdout], [], [], 600)
        chunk = os.read(process.stdout.fileno(), 4096) if ready else b""
        if not chunk:
            break
        seen += chunk
        if first is None and len(seen) > len(PROMPT.encode()):
            first = time.perf_counter() - start
    process.wait()
    if process.returncode != 0 or first is None:
        raise RuntimeError(f"{' '.join(command)} failed (exit status {process.returncode}): {seen!r}")
    return first, time.perf_counter() - start


def wait_for_background_compile(bin_dir: Path) -> float:
    """Block until the environment's background compile has finished -> seconds waited."""
    start = time.perf_counter()
    script = "from refllm.commands.warm_start import wait_for_compiling; wait_for_compiling()"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    # run from the environment's folder: -c puts the current folder first on the path, and this checkout's
    # refllm (with its own kernel cache and lock) must not shadow the installed one
    subprocess.run([str(bin_dir / "python"), "-c", script], check=True, env=env, cwd=bin_dir)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh environments (default 3); medians are reported")
    parser.add_argument("--model", default=catalog.DEFAULT_MODEL, help="a catalog model, pulled beforehand")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens each run generates (default 8)")
    parser.add_argument("--foreground", action="store_true", help="also time a first run that waits for the compile")
    args = parser.parse_args()
    if args.model in catalog.CATALOG and not catalog.is_pulled(args.model):
        sys.exit(f"pull {args.model} first (refllm pull {args.model}): a download is not part of the timing")
    print(f"machine   {cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}")
    print(f"threads   {thread_settings()}")
    print(f"python    {platform.python_version()}; model {args.model}; {args.max_tokens} tokens after {PROMPT!r}")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="refllm-first-token-") as scratch:
        wheels = Path(scratch) / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(ROOT)], check=True
        )
        wheel = next(wheels.glob("refllm-*.whl"))
        for run in range(args.runs):
            bin_dir = make_environment(Path(scratch) / f"env{run}", wheel)
            first, whole = first_token(bin_dir, args.model, args.max_tokens, {})
            compiled = wait_for_background_compile(bin_dir)
            later, _ = first_token(bin_dir, args.model, args.max_tokens, {})
            row = {"first": first, "first_run_whole": whole, "compile_after": compiled, "later": later}
            if args.foreground:
                other = make_environment(Path(scratch) / f"fg{run}", wheel)
                row["foreground"], _ = first_token(other, args.model, args.max_tokens, {"REFLLM_COMPILE": "foreground"})
            rounds.append(row)
            print(f"round {run + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in row.items()), flush=True)
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print("median  " + ", ".join(f"{k} {v:.1f} s" for k, v in medians.items()))
    print(json.dumps({"machine": cpu_name(), "cpus": os.cpu_count(), "rounds": rounds, "median": medians}))


if __name__ == "__main__":
    main()
