"""``refllm list``, ``refllm rm`` and ``refllm warmup``: the pulled models, and the kernels compiled ahead.

refllm list                  pulled catalog models: size, path, and whether the file still matches its checksum
refllm rm gemma3-270m        delete a pulled model
refllm warmup                compile the Numba kernels once, so a later first run starts at once
"""

from __future__ import annotations

import argparse

from refllm import catalog
from refllm.commands import common
from refllm.commands.flags import MODEL_HELP, add_command
from refllm.runtime.sampling import SamplingParams


def cmd_list(args: argparse.Namespace) -> int:
    names = catalog.pulled()
    if not names:
        print(f"no catalog models pulled into {catalog.refllm_home()} yet; `refllm pull NAME` fetches one")
        return 0
    rows = [("model", "size", "checksum", "chat", "path")]
    for name in names:
        path = catalog.model_path(name)
        if args.fast:
            state = "not checked"
        else:
            state = "ok" if catalog.verify(name) == catalog.VERIFIED else "MISMATCH: pull it again"
        chat = "yes" if catalog.CATALOG[name].chat else "no"
        rows.append((name, common.size(path.stat().st_size), state, chat, str(path)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    print(f"removed {catalog.remove(args.name)}")
    return 0


def cmd_warmup(args: argparse.Namespace) -> int:
    """Compile what generation needs (cached by Numba for every later process), then generate one token."""
    model = common.load(args.model, quantized=not args.float32, text=False)
    engine = common.start_engine(model)
    try:
        engine.generate([[0, 0]], SamplingParams(max_tokens=2))  # the sampling and batched decode paths too
    finally:
        engine.close()
    print(f"the kernels for {args.model} are compiled and cached; later runs start without the wait")
    return 0


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register ``list``, ``rm`` and ``warmup`` on a ``refllm``-style subparsers object."""

    listing = add_command(
        commands,
        "list",
        cmd_list,
        "list the pulled catalog models",
        "List the catalog models pulled into $REFLLM_HOME (default ~/.cache/refllm): size on disk,\n"
        "whether the file still has the catalog's SHA-256 (read in full, a second or so), whether it\n"
        "chats, and its path.",
        "refllm list",
    )
    listing.add_argument("--fast", action="store_true", help="skip the checksums")
    remove = add_command(
        commands,
        "rm",
        cmd_rm,
        "delete a pulled catalog model",
        "Delete a pulled catalog model's folder.",
        "refllm rm gemma3-270m",
    )
    remove.add_argument(
        "name", choices=sorted(catalog.CATALOG), metavar="NAME", help=f"one of {', '.join(catalog.CATALOG)}"
    )
    warmup = add_command(
        commands,
        "warmup",
        cmd_warmup,
        "compile the Numba kernels ahead of the first run",
        "Load the model and run one short generation, so the Numba kernels it needs are compiled and\n"
        "cached on disk; a later first `generate`, `chat` or `serve` then starts without that wait.",
        "refllm warmup",
    )
    warmup.add_argument("--model", default=catalog.DEFAULT_MODEL, help=MODEL_HELP)
    warmup.add_argument("--float32", action="store_true", help="warm the float32 spec path instead")
