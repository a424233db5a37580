"""Golden dumps, golden checks and perplexity on a local Ray cluster of 2 workers, against their single-process runs.

The cluster starts once for the module (2 CPUs, so 2 actors) and every job
joins it. Each job is also run the single-process way in this process, and the
two must agree exactly: the same golden tensors bit for bit, the same report,
the same perplexity float. A worker is killed mid-job, a driver interrupted and
resumed (with some of its shards damaged meanwhile), and a prompt longer than the
context fails its shard once.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open

from refllm import cli
from refllm.cluster import INSTALL_HINT
from refllm.cluster.golden import check_on_ray, dump_on_ray
from refllm.cluster.perplexity import perplexity_on_ray
from refllm.cluster.pool import ShardsFailedError
from refllm.cluster.shards import Shard, ShardResult, ShardStore, ShardStoreMismatchError, split
from refllm.commands.flags import bare_ray_flag_before_positional
from refllm.errors import InvalidInputError
from refllm.runtime.perplexity import perplexity, sliding_windows
from refllm.testing.backends import as_backend
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.golden import DumpOptions, Golden, Prompt, check, dump
from tests.helpers.command_line import run
from tests.helpers.model_directory import CORPUS, write_tiny_model
from tests.helpers.mutants import interleaved_rope
from tests.helpers.paths import HF_DATA, ROOT

MODEL = HF_DATA / "gemma3_text"  # context 128, vocabulary 128
OPTIONS = DumpOptions(new_tokens=12, top_k=5, positions=4, hidden_states=True)


@pytest.fixture(scope="module")
def local_cluster():
    ray = pytest.importorskip("ray", reason='the cluster extra is not installed: pip install -e ".[cluster]"')
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


def prompts(lengths: list[int]) -> list[Prompt]:
    rng = np.random.default_rng(7)
    return [Prompt(None, rng.integers(0, 128, n).tolist()) for n in lengths]


def single_process_file(tmp_path, dtype: str, listed: list[Prompt]):
    out = tmp_path / f"single-{dtype}.safetensors"
    dump(Checkpoint.open(MODEL, dtype), listed, out, str(MODEL), "float32", **vars(OPTIONS), dtype=dtype)
    return out


def assert_same_golden_file(path, expected_path) -> None:
    """The same metadata and every tensor with the same name, dtype, shape and bytes.

    Not the file's bytes: safetensors writes the metadata in hash order, which differs between two runs.
    """
    with safe_open(str(path), "np") as f, safe_open(str(expected_path), "np") as g:
        assert f.metadata() == g.metadata() and sorted(f.keys()) == sorted(g.keys())
        for name in g.keys():
            got, want = f.get_tensor(name), g.get_tensor(name)
            assert (got.dtype, got.shape, got.tobytes()) == (want.dtype, want.shape, want.tobytes()), name


def write_prompts(path, listed: list[Prompt]) -> str:
    path.write_text("".join(json.dumps(p.token_ids) + "\n" for p in listed))
    return str(path)


# ---- without Ray ----------------------------------------------------------------------------------------


def test_without_ray_the_flag_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails, as where it is not installed
    text = tmp_path / "text.txt"
    text.write_text("some text")
    code, out, err = run(capsys, "perplexity", str(text), "--ray")
    assert (code, out, err) == (1, "", f"refllm: error: {INSTALL_HINT}\n")
    assert 'pip install "refllm[cluster]"' in INSTALL_HINT


@pytest.mark.parametrize(
    "argv, address, file",
    [
        (["perplexity", "--ray", "text.txt"], "local", "text.txt"),
        (["perplexity", "--ray", "auto", "text.txt"], "auto", "text.txt"),
        (["perplexity", "--ray", "10.0.0.5:6379", "text.txt"], "10.0.0.5:6379", "text.txt"),
        (["perplexity", "--ray", "ray://head:10001", "text.txt"], "ray://head:10001", "text.txt"),
        (["perplexity", "text.txt", "--ray", "--workers", "2"], "local", "text.txt"),
        (["perplexity", "text.txt", "--ray"], "local", "text.txt"),
    ],
)
def test_ray_before_the_file_is_not_read_as_its_address(argv, address, file):
    args = cli.build_parser().parse_args(bare_ray_flag_before_positional(argv))
    assert (args.ray, args.file) == (address, file)


def test_cluster_flags_need_ray(capsys):
    code, _, err = run(capsys, "golden", "check", "no-such.safetensors", "--workers", "2")
    assert code == 2 and "argument --workers: only with --ray" in err


def test_importing_refllm_imports_no_ray():
    check = "import sys, refllm, refllm.cli; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "False"


def test_a_shard_folder_of_another_job_is_refused(tmp_path):
    ShardStore(tmp_path / "shards", {"job": "perplexity", "window": "16"})
    assert ShardStore(tmp_path / "shards", {"job": "perplexity", "window": "16"}).finished() == set()
    with pytest.raises(ShardStoreMismatchError, match="its window is '16', this job's '32'"):
        ShardStore(tmp_path / "shards", {"job": "perplexity", "window": "32"})


def flip_a_data_byte(path) -> None:
    """One byte of the file's tensor data changed, the file's size and header kept."""
    data = bytearray(path.read_bytes())
    (header,) = struct.unpack("<Q", data[:8])
    data[8 + header + 3] ^= 0x01
    path.write_bytes(bytes(data))


def stored_shards(directory, manifest: dict, count: int) -> tuple[ShardStore, list[Shard]]:
    store, shards = ShardStore(directory, manifest), split(2 * count, 2)
    for shard in shards:
        tensors = {"nll": np.arange(shard.items.start, shard.items.stop, dtype=np.float64) / 7}
        store.save(ShardResult(shard.index, tensors, {"note": f"shard {shard.index}"}, 5, "worker"), shard)
    return store, shards


def test_a_resumed_shard_store_names_and_drops_every_shard_that_does_not_verify(tmp_path, capsys):
    from safetensors.numpy import save

    manifest = {"job": "perplexity", "window": "16"}
    store, shards = stored_shards(tmp_path / "shards", manifest, 7)
    files = sorted((tmp_path / "shards").glob("shard-*.safetensors"))
    intact = store.resume(shards)
    assert sorted(intact) == list(range(7)) and capsys.readouterr().err == ""
    assert intact[3].tensors["nll"].tolist() == [6 / 7, 7 / 7] and intact[3].info == {"note": "shard 3"}
    flip_a_data_byte(files[1])
    files[2].write_bytes(files[2].read_bytes()[:-5])  # truncated
    files[3].write_bytes(os.urandom(files[3].stat().st_size))  # garbage of the same size
    stored_shards(tmp_path / "other", manifest | {"window": "32"}, 7)  # another job's shard, copied in
    shutil.copyfile(tmp_path / "other" / files[4].name, files[4])
    shutil.copyfile(files[0], files[5])  # shard 0's file as shard 5's
    files[6].write_bytes(save({"nll": np.zeros(2)}, metadata={"tokens": "5", "worker": "w"}))  # no checksum
    resumed = store.resume(shards)
    assert sorted(resumed) == [0] and resumed[0].tensors["nll"].tolist() == intact[0].tensors["nll"].tolist()
    lines = capsys.readouterr().err.splitlines()
    reasons = ["does not match its checksum", "cannot be read", "cannot be read", "was written for another job",
               "holds shard '0:0:2', not '5:10:12'", "carries no checksum"]  # fmt: skip
    for line, file, reason, index in zip(lines, files[1:], reasons, range(1, 7), strict=True):
        assert line.startswith(f"{file} ") and reason in line and line.endswith(f"computing shard {index} again")
    store.save(ShardResult(1, intact[1].tensors, intact[1].info, 5, "worker"), shards[1])  # computed again
    assert sorted(store.resume(shards)) == [0, 1]


def test_a_damaged_job_manifest_is_refused_saying_what_to_delete(tmp_path):
    ShardStore(tmp_path / "shards", {"job": "perplexity"})
    (tmp_path / "shards" / "job.json").write_text('{"job": "perpl')
    with pytest.raises(ShardStoreMismatchError, match=r"job.json is damaged .*; delete it to resume .* or delete"):
        ShardStore(tmp_path / "shards", {"job": "perplexity"})


def test_an_unreachable_cluster_address_fails_at_once_in_one_line(tmp_path):
    pytest.importorskip("ray", reason='the cluster extra is not installed: pip install -e ".[cluster]"')
    text = tmp_path / "text.txt"
    text.write_text(" ".join(CORPUS))
    argv = ["perplexity", str(text), "--model", str(write_tiny_model(tmp_path / "tiny")), "--ray", "127.0.0.1:1"]
    done = subprocess.run(  # ray.init alone retries for minutes
        [sys.executable, "-m", "refllm", *argv], capture_output=True, text=True, cwd=ROOT, timeout=90
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("refllm: error: no Ray cluster answers at 127.0.0.1:1 (")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


# ---- on the cluster ---------------------------------------------------------------------------------------


def interrupt_after(count: int, seen: list[int]):
    """An ``on_result`` that records each shard's index and stops the driver after ``count``, as Ctrl-C does."""

    def record(result) -> None:
        seen.append(result.index)
        if len(seen) == count:
            raise KeyboardInterrupt

    return record


cluster = pytest.mark.cluster


@cluster
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_golden_dump_on_ray_is_the_single_process_file_bit_for_bit(local_cluster, tmp_path, dtype, capsys):
    listed = prompts([9, 1, 30, 17, 4])
    out = tmp_path / "ray.safetensors"
    options = ["--new-tokens", "12", "--top-k", "5", "--positions", "4", "--hidden-states", "--dtype", dtype]
    argv = ["golden", "dump", "--model", str(MODEL), "--prompts", write_prompts(tmp_path / "p.txt", listed)]
    code, _, err = run(capsys, *argv, "--out", str(out), *options, "--ray", "--workers", "2", "--shard-size", "2")
    assert code == 0
    assert_same_golden_file(out, single_process_file(tmp_path, dtype, listed))
    assert not (tmp_path / "ray.safetensors.shards").exists()  # merged, then removed
    assert "3 shards on 2 workers: 121 tokens in" in err  # 61 prompt tokens and 5 x 12 new ones


@cluster
def test_golden_check_on_ray_prints_the_single_process_report(local_cluster, tmp_path, capsys):
    listed = prompts([12, 2, 25, 7])
    golden = tmp_path / "golden.safetensors"
    dump(Checkpoint.open(MODEL), listed, golden, str(MODEL), new_tokens=12, positions=4)
    mutant = ["--backend", "tests.helpers.mutants:interleaved_rope"]  # fails some prompts: a report with FAILs and KL
    single = run(capsys, "golden", "check", str(golden), *mutant)
    on_ray = run(capsys, "golden", "check", str(golden), *mutant, "--ray", "--workers", "2")
    assert single[0] == on_ray[0] == 1
    assert on_ray[1] == single[1] and "FAIL" in single[1] and "KL divergence over" in single[1]


@cluster
def test_an_interrupted_golden_check_resumes_from_its_shards_with_the_same_reports(local_cluster, tmp_path):
    listed = prompts([12, 2, 25, 7, 9])
    path = tmp_path / "golden.safetensors"
    dump(Checkpoint.open(MODEL), listed, path, str(MODEL), new_tokens=12, positions=4)
    golden, shards, seen = Golden.load(path), tmp_path / "shards", []
    args = (path, golden, str(MODEL), "tests.helpers.mutants:interleaved_rope", "float32")
    with pytest.raises(KeyboardInterrupt):
        check_on_ray(*args, shards=shards, on_result=interrupt_after(2, seen))
    assert len(list(shards.glob("shard-*.safetensors"))) == 2
    resumed = []
    reports = check_on_ray(*args, shards=shards, on_result=resumed.append)
    assert sorted(r.index for r in resumed) == sorted(set(range(len(listed))) - set(seen))
    backend = as_backend(interleaved_rope(Checkpoint.open(MODEL)))
    single = check(golden, backend, "float32")
    assert [r.line for r in reports] == [r.line for r in single] and not shards.exists()
    assert any(not r.ok for r in reports)  # the mutant fails some prompts, so the reports carry logits


@cluster
def test_perplexity_on_ray_is_the_single_process_float_and_resumes(local_cluster, tmp_path, capsys):
    tiny = write_tiny_model(tmp_path / "tiny")
    text = tmp_path / "text.txt"
    text.write_text(" ".join(CORPUS * 4))
    flags = ["--model", str(tiny), "--window", "16", "--stride", "6"]
    single = run(capsys, "perplexity", str(text), *flags)
    on_ray = run(capsys, "perplexity", str(text), *flags, "--ray", "--workers", "2", "--shard-size", "3")
    assert single[0] == on_ray[0] == 0
    assert on_ray[1].splitlines()[0] == single[1].splitlines()[0]  # "perplexity X over N tokens (...)"
    model = cli.common.load(str(tiny))
    ids = model.tokenizer.encode(text.read_text())
    precision = {"quantized": False, "dtype": "float32", "reference": None}
    shards, seen = tmp_path / "shards", []
    stop = interrupt_after(2, seen)
    with pytest.raises(KeyboardInterrupt):
        perplexity_on_ray(str(tiny), precision, ids, 16, 6, shard_size=2, shards=shards, on_result=stop)
    resumed = []
    value = perplexity_on_ray(str(tiny), precision, ids, 16, 6, shard_size=2, shards=shards, on_result=resumed.append)
    windows = len(sliding_windows(len(ids), 16, 6))
    assert sorted(seen + [r.index for r in resumed]) == list(range((windows + 1) // 2))  # each shard computed once
    assert value == perplexity(model, ids, 16, 6) and not shards.exists()


@cluster
def test_a_resumed_perplexity_recomputes_damaged_and_foreign_shards_and_is_the_single_process_float(
    local_cluster, tmp_path, capsys
):
    tiny = write_tiny_model(tmp_path / "tiny")
    text = tmp_path / "text.txt"
    text.write_text(" ".join(CORPUS * 4))
    flags = ["--model", str(tiny), "--window", "16", "--stride", "6"]
    single = run(capsys, "perplexity", str(text), *flags)
    ids = cli.common.load(str(tiny)).tokenizer.encode(text.read_text())
    precision = {"quantized": False, "dtype": "float32", "reference": None}
    shards, seen = tmp_path / "shards", []
    stop = interrupt_after(4, seen)
    with pytest.raises(KeyboardInterrupt):
        perplexity_on_ray(str(tiny), precision, ids, 16, 6, shard_size=2, shards=shards, on_result=stop)
    with pytest.raises(KeyboardInterrupt):  # another job: the same model and windows, over other tokens
        perplexity_on_ray(str(tiny), precision, ids[::-1], 16, 6, shard_size=2, shards=tmp_path / "other",
                          on_result=interrupt_after(1, []))  # fmt: skip
    flipped, truncated, foreign, kept = (shards / f"shard-{i:06d}.safetensors" for i in seen)
    flip_a_data_byte(flipped)  # as reported: the resumed run printed another perplexity with exit code 0
    truncated.write_bytes(truncated.read_bytes()[:100])
    shutil.copyfile(next((tmp_path / "other").glob("shard-*")), foreign)
    code, out, err = run(capsys, "perplexity", str(text), *flags, "--ray", "--shard-size", "2", "--shards", str(shards))
    printed = [line for line in out.splitlines() if line.startswith("perplexity ")]  # Ray's actors may log too
    assert code == 0 and printed == single[1].splitlines()[:1] and "Traceback" not in err
    assert f"{flipped} does not match its checksum" in err and f"{truncated} cannot be read" in err
    assert f"{foreign} was written for another job" in err and str(kept) not in err
    assert "resuming: 1 of" in err and not shards.exists()


@cluster
def test_a_killed_worker_shards_run_again_and_the_file_is_the_same(local_cluster, tmp_path):
    listed = prompts([8, 20, 3, 11, 6, 14])
    killed, ran_on = [], []

    def kill_the_first_worker(result) -> None:
        ran_on.append(result.pid)
        if not killed:
            os.kill(result.pid, signal.SIGKILL)  # its next shard is already queued on it
            killed.append(result.pid)

    out = tmp_path / "ray.safetensors"
    checkpoint = Checkpoint.open(MODEL, "float64")
    _, computed = dump_on_ray(
        checkpoint, listed, out, str(MODEL), options=OPTIONS, dtype="float64", on_result=kill_the_first_worker
    )
    assert killed and computed == len(listed)
    assert len(set(ran_on)) == 3  # the two first workers, and the one Ray restarted in place of the killed one
    assert_same_golden_file(out, single_process_file(tmp_path, "float64", listed))


@cluster
def test_an_interrupted_dump_resumes_computing_only_the_missing_shards(local_cluster, tmp_path):
    listed = prompts([5, 9, 13, 2, 7, 10, 4])
    out, seen = tmp_path / "ray.safetensors", []
    checkpoint = Checkpoint.open(MODEL, "float64")
    with pytest.raises(KeyboardInterrupt):
        dump_on_ray(
            checkpoint, listed, out, str(MODEL), options=OPTIONS, dtype="float64", on_result=interrupt_after(3, seen)
        )
    shards = tmp_path / "ray.safetensors.shards"
    assert len(list(shards.glob("shard-*.safetensors"))) == 3 and not out.exists()
    resumed = []
    _, computed = dump_on_ray(
        checkpoint, listed, out, str(MODEL), options=OPTIONS, dtype="float64", on_result=resumed.append
    )
    assert computed == len(listed) - 3
    assert sorted(r.index for r in resumed) == sorted(set(range(len(listed))) - set(seen))
    assert_same_golden_file(out, single_process_file(tmp_path, "float64", listed))


@cluster
def test_a_prompt_longer_than_the_context_fails_its_shard_once_naming_the_prompt(local_cluster, tmp_path, capsys):
    listed = prompts([6, 120, 9])  # 120 + 12 new tokens pass the context of 128
    seen = []
    with pytest.raises(ShardsFailedError, match="1 of 3 shards cannot run on their data"):
        dump_on_ray(Checkpoint.open(MODEL), listed, tmp_path / "g.safetensors", str(MODEL), options=OPTIONS,
                    on_result=seen.append)  # fmt: skip
    assert sorted(r.index for r in seen) == [0, 1, 2]  # each shard ran once: the failing one is not retried
    err = capsys.readouterr().err
    assert "shard 1 failed: prompt 1 has 120 tokens; with 12 new ones it passes the context length 128" in err
    assert sorted(p.name for p in (tmp_path / "g.safetensors.shards").glob("shard-*")) == [
        "shard-000000.safetensors",
        "shard-000002.safetensors",
    ]


@cluster
def test_more_workers_than_cpus_are_refused(local_cluster, tmp_path):
    with pytest.raises(InvalidInputError, match="--workers 3 is more than the 2 CPUs of the cluster"):
        dump_on_ray(Checkpoint.open(MODEL), prompts([4]), tmp_path / "g.safetensors", str(MODEL), workers=3)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@cluster
def test_progress_shows_shards_done_and_tokens_per_second(local_cluster, tmp_path, monkeypatch):
    listed = prompts([4, 6, 8])
    stderr = Terminal()
    monkeypatch.setattr(sys, "stderr", stderr)
    dump_on_ray(Checkpoint.open(MODEL), listed, tmp_path / "g.safetensors", str(MODEL), options=OPTIONS)
    shown = stderr.getvalue()
    assert "golden dump: 100%" in shown and "3/3" in shown and "tokens/s]" in shown
    assert "golden dump ... done in" in shown and "3 shards on 2 workers: 54 tokens in" in shown
