"""``refllm list``, ``refllm rm`` and ``refllm warmup``: the pulled models, and the kernels compiled ahead.

refllm list                  pulled catalog models: size, path, and whether the file still matches its checksum
refllm rm gemma3-270m        delete a pulled model
refllm warmup                compile the Numba kernels once, so a later first run starts at once
"""

from __future__ import annotations

import argparse

from refllm import catalog
from refllm.commands import common
from refllm.commands.flags import DeprecatedName, add_command, add_dequantize_flag, add_model_flag, catalog_name
from refllm.runtime.sampling import SamplingParams


def cmd_list(args: argparse.Namespace) -> int:
    names = catalog.pulled()
    if not names:
        print(f"no catalog models pulled into {catalog.refllm_home()} yet; `refllm pull NAME` fetches one")
        return 0
    rows = [("model", "size", "checksum", "chat", "path")]
    for name in names:
        path = catalog.model_path(name)
        if args.no_verify:
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
    """Compile what generation needs (cached by Numba for every later process), then generate one token:
    for a model with quantized blocks both ways it can run, from its blocks and dequantized (--dequantize, serve)."""
    ways = (False,) if args.dequantize else (True, False)
    warmed = []
    for quantized in ways:
        model = common.load(args.model, quantized=quantized, text=False)
        if quantized and not common.has_quantized_weights(model):
            continue  # nothing kept in blocks (a Hugging Face directory): the dequantized run is the same
        engine = common.start_engine(model)
        try:
            engine.generate([[0, 0]], SamplingParams(max_tokens=2))  # the sampling and batched decode paths too
        finally:
            engine.close()
        warmed.append("its quantized blocks (generate, chat)" if quantized else "dequantized (--dequantize, serve)")
    print(
        f"the kernels for {args.model} are compiled and cached, {' and '.join(warmed)}; --spec-ops and"
        " --dtype float64 need none, and a model with other quantized formats needs its own warm-up"
    )
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
    listing.add_argument("--no-verify", action="store_true", help="skip the checksums")
    listing.add_argument("--fast", dest="no_verify", action=DeprecatedName, new_name="--no-verify")
    remove = add_command(
        commands,
        "rm",
        cmd_rm,
        "delete a pulled catalog model",
        "Delete a pulled catalog model's folder.",
        "refllm rm gemma3-270m",
    )
    remove.add_argument("name", type=catalog_name, metavar="NAME", help=f"one of {', '.join(catalog.CATALOG)}")
    warmup = add_command(
        commands,
        "warmup",
        cmd_warmup,
        "compile the Numba kernels ahead of the first run",
        "Load the model and run one short generation each way generate, chat and serve can run it\n"
        "(from its quantized blocks, and dequantized), so the Numba kernels they need are compiled and\n"
        "cached on disk; a later first run then starts on the kernels at once. (Without it, a first run\n"
        "answers on the slower spec ops while they compile in the background.)",
        "refllm warmup",
        "refllm warmup -m gemma3-270m",
    )
    add_model_flag(warmup)
    add_dequantize_flag(warmup, "warm only the dequantized run (as --dequantize and serve load the model)", False)
