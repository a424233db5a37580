"""Golden files: ``refllm golden dump`` and ``refllm golden check``, driven through their argparse parser."""

from __future__ import annotations

import argparse
import json
import shutil

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from refllm.commands.golden import add_cli
from refllm.testing.golden import FORMAT, GoldenFormatError, GoldenModelMismatchError, read_prompts
from tests.helpers.paths import HF_DATA

MODEL = HF_DATA / "gemma3_text"  # sliding and global layers, q/k norm, (1 + w) norms, tied embeddings


def refllm_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="refllm")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    directory = tmp_path_factory.mktemp("golden")
    prompts = directory / "prompts.txt"
    prompts.write_text("[3, 17, 4, 99, 5, 6, 7, 8, 9, 10, 11, 12]\n\n[40, 41]\n[7]\n")
    out = directory / "golden.safetensors"
    argv = ["golden", "dump", "--model", str(MODEL), "--prompts", str(prompts), "--out", str(out)]
    assert refllm_cli(argv + ["--new-tokens", "24", "--positions", "4", "--hidden-states"]) == 0
    return out


def test_dump_writes_the_documented_layout(golden):
    with safe_open(str(golden), "np") as f:
        metadata = f.metadata()
    assert metadata["format"] == FORMAT and metadata["format_version"] == "1"
    assert metadata["model"] == str(MODEL) and metadata["tolerance_profile"] == "float32"
    assert json.loads(metadata["config"])["model_type"] == "gemma3_text"
    assert json.loads(metadata["prompts"]) == [None, None, None] and metadata["num_prompts"] == "3"
    assert len(metadata["weights_sha256"]) == 64
    tensors = load_file(str(golden))
    assert tensors["prompt.0.token_ids"].tolist() == [3, 17, 4, 99, 5, 6, 7, 8, 9, 10, 11, 12]
    assert tensors["prompt.0.positions"].tolist() == [0, 4, 7, 11]  # spread out, ending at the last
    assert tensors["prompt.0.logits"].shape == (4, 128) and tensors["prompt.0.last_logits"].shape == (128,)
    np.testing.assert_array_equal(tensors["prompt.0.logits"][-1], tensors["prompt.0.last_logits"])
    top = tensors["prompt.0.topk_ids"]
    assert top.shape == (4, 10) and (top[:, 0] == tensors["prompt.0.logits"].argmax(-1)).all()
    np.testing.assert_array_equal(
        tensors["prompt.0.topk_logits"], np.take_along_axis(tensors["prompt.0.logits"], top, -1)
    )
    assert tensors["prompt.1.greedy_ids"].shape == (24,) and tensors["prompt.1.greedy_topk_ids"].shape == (24, 10)
    assert tensors["prompt.2.hidden_states"].shape == (3, 1, 64)  # embeddings + 2 layers, 1 token, D = 64


@pytest.mark.parametrize("backend", ["refllm.testing.factories:refllm_paged", "refllm.testing.factories:refllm_llm"])
def test_check_passes_refllm(golden, backend, capsys):
    assert refllm_cli(["golden", "check", str(golden), "--backend", backend]) == 0
    out = capsys.readouterr().out
    assert "prompt 0 (12 tokens) ok: logits max |Δ|" in out and "at 4 positions; greedy 24/24 agree" in out
    assert "prompt 2 (1 token) ok" in out and "at 1 position;" in out and "hidden states agree" in out
    assert out.rstrip().endswith("3/3 prompts pass")


def test_check_fails_a_mutant_with_a_per_prompt_report(golden, capsys):
    assert refllm_cli(["golden", "check", str(golden), "--backend", "tests.helpers.mutants:interleaved_rope"]) == 1
    out = capsys.readouterr().out
    assert "prompt 0 (12 tokens) FAIL: logits differ" in out
    assert "hidden states first diverge at the output of layer 0" in out
    assert "prompt 2 (1 token) ok" in out  # one position: RoPE rotates nothing at position 0
    assert out.rstrip().endswith("1/3 prompts pass")


def test_check_refuses_other_weights(golden, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(MODEL, other)
    tensors = load_file(str(other / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1
    save_file(tensors, str(other / "model.safetensors"))
    with pytest.raises(GoldenModelMismatchError, match="was made from"):
        refllm_cli(["golden", "check", str(golden), "--model", str(other)])


def test_bad_files_are_refused(golden, tmp_path):
    plain = tmp_path / "plain.safetensors"
    save_file({"x": np.zeros(2, np.float32)}, str(plain), metadata={"format": "pt"})
    with pytest.raises(GoldenFormatError, match="its format is 'pt'"):
        refllm_cli(["golden", "check", str(plain)])
    with pytest.raises(GoldenFormatError, match="not a readable safetensors file"):
        refllm_cli(["golden", "check", str(MODEL / "config.json")])
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    with pytest.raises(GoldenFormatError, match="prompts.txt:1: a text prompt needs a model with a tokenizer"):
        read_prompts(prompts, tokenizer=None)
    prompts.write_text("[1, 2.5]\n")
    with pytest.raises(GoldenFormatError, match="is not a non-empty list of token ids"):
        read_prompts(prompts, tokenizer=None)
