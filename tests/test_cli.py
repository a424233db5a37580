"""The command line, run in-process on a tiny random model, and as ``python -m refllm`` where exits matter.

The tiny model is a random-weight Llama in a Hugging Face directory, with a
byte-level BPE tokenizer trained in memory and a ChatML chat template, so
every command runs in well under a second. Each command's output is checked
against the same computation done directly through refllm's Python API.
"""

from __future__ import annotations

import io
import json
import re
import signal
import sys
from collections import Counter

import gguf
import numpy as np
import pytest

import refllm
from refllm import CacheConfig, cli
from refllm.commands import common
from refllm.errors import InvalidInputError
from refllm.quant.linear import QuantizedTensor
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM
from refllm.runtime.perplexity import perplexity
from refllm.runtime.sampling import SamplingParams
from tests.helpers.command_line import chat_messages, info_rows, refllm_process, run
from tests.helpers.model_directory import CORPUS, write_tiny_model
from tests.helpers.real_models import SMOLLM2, real_model_or_skip


@pytest.fixture(scope="module")
def model(tiny):
    return refllm.load_model(tiny)


def engine_text(model, prompt_ids: list[int], params: SamplingParams) -> str:
    """What the engine generates for the prompt, straight through the Python API."""
    engine = Engine(LLMExecutor(LLM(model), offload=False), model.tokenizer)
    try:
        return engine.generate([prompt_ids], params)[0].completions[0].text
    finally:
        engine.close()


# ---- every command explains itself ------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", ["generate", "chat", "perplexity", "embed", "info", "bench", "pull", "list", "rm", "warmup", "serve"]
)
def test_every_command_explains_itself_with_an_example(command, capsys):
    with pytest.raises(SystemExit) as raised:
        cli.main([command, "--help"])
    out = capsys.readouterr().out
    assert raised.value.code == 0
    assert re.search(rf"examples?:\n  .*refllm {command}", out)


# ---- generate and chat ----------------------------------------------------------------------------------


def test_generate_streams_the_continuation_of_the_prompt(tiny, model, capsys):
    code, out, err = run(capsys, "generate", "hello world", "--model", tiny, "--max-tokens", "12")
    expected = engine_text(model, model.tokenizer.encode("hello world"), SamplingParams(max_tokens=12))
    assert code == 0
    assert out == "hello world" + expected + "\n"
    assert re.search(rf"loading {re.escape(tiny)} \.\.\. done in \d+\.\d s", err)


def test_generate_takes_logit_biases_as_the_engine_does(tiny, model, capsys):
    ids = model.tokenizer.encode("hello world")
    forced = model.tokenizer.encode("x", add_special_tokens=False)[0]
    first = int(np.argmax(LLM(model).prefill("first", ids)))  # the greedy answer's first token
    bias = ["--logit-bias", f"{forced}=100", "--logit-bias", f"{first}=-100"]
    sampled = ["--max-tokens", "5", "--temperature", "1"]
    code, out, _ = run(capsys, "generate", "hello world", "--model", tiny, *sampled, *bias)
    assert code == 0 and out == "hello world" + "x" * 5 + "\n"
    code, out, _ = run(capsys, "generate", "hello world", "--model", tiny, "--max-tokens", "5", bias[2], bias[3])
    expected = engine_text(model, ids, SamplingParams(max_tokens=5, logit_bias={first: -100}))
    assert code == 0 and out == "hello world" + expected + "\n"
    code, _, err = run(capsys, "generate", "hi", "--model", tiny, "--logit-bias", "100000=1")
    assert code == 1 and "logit_bias names token 100000, outside the vocabulary" in err


def test_generate_chat_sends_the_prompt_through_the_chat_template(tiny, model, capsys, monkeypatch):
    prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    ids = model.tokenizer.encode(prompt, add_special_tokens=False)
    expected = engine_text(model, ids, SamplingParams(max_tokens=5))
    seen = chat_messages(monkeypatch)
    code, out, _ = run(capsys, "generate", "hi", "--chat", "--model", tiny, "--max-tokens", "5")
    assert code == 0
    assert seen == [[{"role": "user", "content": "hi"}]]
    assert out == expected + "\n"


def test_chat_keeps_the_conversation_and_reset_clears_it(tiny, capsys, monkeypatch):
    seen = chat_messages(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\nhow are you\n/reset\nBye\n/exit\nnever read\n"))
    code, out, err = run(capsys, "chat", "--model", tiny, "--system", "be brief", "--max-tokens", "4")
    assert code == 0
    assert [[m["role"] for m in conversation] for conversation in seen] == [
        ["system", "user"],
        ["system", "user", "assistant", "user"],
        ["system", "user"],
    ]
    assert [conversation[-1]["content"] for conversation in seen] == ["Hi", "how are you", "Bye"]
    assert seen[0][0] == {"role": "system", "content": "be brief"}
    assert out.count("\n") >= 3 and "(conversation cleared)" in err


def test_ctrl_c_stops_the_answer_and_the_chat_goes_on(tiny, monkeypatch):
    seen = chat_messages(monkeypatch)

    class CtrlCOnFirstWrite(io.StringIO):
        first: str | None = None

        def write(self, text):
            if self.first is None:
                self.first = text
                signal.raise_signal(signal.SIGINT)
            return super().write(text)

    stdout, stderr, handler = CtrlCOnFirstWrite(), io.StringIO(), signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\nagain\n"))
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", stderr)
    assert cli.main(["chat", "--model", tiny, "--max-tokens", "40"]) == 0
    assert "(answer stopped)" in stderr.getvalue()
    assert len(seen) == 2 and seen[1][1] == {"role": "assistant", "content": stdout.first}
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_conversation_past_the_context_is_refused_and_the_chat_goes_on(tiny, capsys, monkeypatch):
    seen = chat_messages(monkeypatch)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello world " * 200 + "\nHi\n"))
    code, _, err = run(capsys, "chat", "--model", tiny, "--max-tokens", "2")
    assert code == 0 and "/reset starts a new conversation" in err
    assert seen[-1] == [{"role": "user", "content": "Hi"}]


def test_chat_refuses_a_model_without_a_chat_template(tmp_path, capsys):
    base = str(write_tiny_model(tmp_path / "base", chat_template=None))
    code, out, err = run(capsys, "chat", "--model", base)
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"refllm: error: {base} has no chat template, so it cannot chat; `refllm generate` continues plain text with it"
    ]


# ---- perplexity -------------------------------------------------------------------------------------------


def reference_perplexity(model, ids: list[int], window: int, stride: int) -> tuple[float, int]:
    """Token by token: token t is scored from the first window holding it and the token before it."""
    spans = [(b, min(b + window, len(ids))) for b in range(0, len(ids), stride)]
    spans = spans[: next(i for i, (_, end) in enumerate(spans) if end == len(ids)) + 1]
    nll = []
    for t in range(1, len(ids)):
        begin = next((b for b, end in spans if b < t < end), None)
        if begin is None:  # non-overlapping windows: a window's first token has nothing before it
            continue
        cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
        logits = model.prefill(np.array([ids[begin:t]]), cache, range(t - begin))[0].astype(np.float64)
        nll.append(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[ids[t]])
    return float(np.exp(np.mean(nll))), len(nll)


@pytest.mark.parametrize("cache", ["paged", "contiguous"])
@pytest.mark.parametrize("window, stride", [(64, 32), (8, 3), (8, 8), (2, 1)])
def test_perplexity_scores_each_token_once_from_its_sliding_window(model, cache, window, stride):
    ids = model.tokenizer.encode(" ".join(CORPUS * 3))[:40]
    expected, count = reference_perplexity(model, ids, window, stride)
    value, scored = perplexity(model, ids, window, stride, cache)
    assert scored == count
    assert value == pytest.approx(expected, rel=1e-5)


def test_perplexity_command_prints_perplexity_and_speed(tiny, model, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(CORPUS))
    ids = model.tokenizer.encode(text.read_text())
    code, out, err = run(capsys, "perplexity", str(text), "--model", tiny, "--window", "16", "--stride", "8")
    expected, count = reference_perplexity(model, ids, 16, 8)
    value = float(re.search(r"perplexity (\S+) over (\d+) tokens", out).group(1))
    assert code == 0 and value == pytest.approx(expected, rel=1e-4)
    assert re.search(rf"^{count} tokens scored in \S+ s: \S+ tokens/s$", out, re.M)
    assert "scoring text.txt ... done in" in err


# ---- embed and info ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_embed_prints_pooled_final_hidden_states_as_json(tiny, model, pooling, capsys):
    code, out, _ = run(capsys, "embed", "hello world", "the lazy dog", "--model", tiny, "--pooling", pooling)
    result = json.loads(out)
    assert code == 0 and result["pooling"] == pooling and result["dimensions"] == 32
    for row, text in zip(result["data"], ["hello world", "the lazy dog"], strict=True):
        ids = model.tokenizer.encode(text)
        hidden = model.prefill_hidden(np.array([ids]), model.create_kv_cache(), range(len(ids)))[0]
        expected = hidden.mean(axis=0) if pooling == "mean" else hidden[-1]
        assert row["text"] == text and row["tokens"] == len(ids)
        np.testing.assert_allclose(row["embedding"], expected, rtol=1e-6, atol=1e-6)


def test_info_describes_a_hugging_face_directory(tiny, model, capsys):
    code, out, _ = run(capsys, "info", tiny, "--context", "40")
    rows = info_rows(out)
    c = model.config
    assert code == 0
    assert rows["architecture"].startswith("llama: 2 layers, hidden size 32")
    assert rows["parameters"].startswith(f"{c.num_parameters:,} ")
    assert rows["tensors"] == f"{2 + 9 * 2 + 1} F32"  # embed, norm, 9 per layer, lm_head
    assert rows["tokenizer"] == "chat template: yes"
    # K and V, 2 layers, 2 KV heads, head dim 8, float32: 256 B a token; 40 tokens take 3 blocks of 16
    assert rows["KV cache"] == "256 B per token; 12.0 KiB for 40 tokens"


def test_info_shows_experts_and_active_parameters(capsys):
    from tests.helpers.paths import HF_DATA

    code, out, _ = run(capsys, "info", str(HF_DATA / "qwen3_moe"))
    rows = info_rows(out)
    c = refllm.load_model(HF_DATA / "qwen3_moe").config
    assert code == 0 and "experts" not in info_rows(run(capsys, "info", str(HF_DATA / "llama"))[1])
    assert rows["experts"] == (
        f"4 per sparse layer (2 of 3 layers), 2 per token: {c.active_parameters:,} parameters active per token"
        f" ({c.active_parameters / 1e6:.1f} M)"
    )
    assert rows["weights"].startswith(common.size(4 * c.num_parameters))  # every expert's weights


def test_info_describes_latent_attention_and_shared_experts(capsys):
    from tests.helpers.paths import HF_DATA

    code, out, _ = run(capsys, "info", str(HF_DATA / "deepseek_v3"))
    rows = info_rows(out)
    c = refllm.load_model(HF_DATA / "deepseek_v3").config
    assert code == 0
    assert rows["architecture"] == "deepseek_v3: 3 layers, hidden size 64"
    assert "attention: latent, 4 heads, KV rank 16, query rank 24, key dims 8 + 8 RoPE, value dims 12" in rows["recipe"]
    assert "MLP: gated silu, 96 wide" in rows["recipe"]
    assert rows["experts"] == (
        f"8 per sparse layer (2 of 3 layers), 3 per token plus 1 shared: {c.active_parameters:,} parameters"
        f" active per token ({c.active_parameters / 1e6:.1f} M)"
    )
    assert c.active_parameters < c.num_parameters
    assert rows["KV cache"].startswith("288 B per token")  # one latent of 16 + 8 per layer, no values


def test_info_counts_the_tensor_types_of_a_gguf_file(tmp_path, capsys):
    from tests.helpers.gguf_convert import convert

    path = convert("llama", tmp_path / "llama.gguf", "Q8_0")
    types = Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)
    code, out, _ = run(capsys, "info", str(path))
    rows = info_rows(out)
    assert code == 0 and set(types) == {"Q8_0", "F32"}
    assert rows["tensors"] == ", ".join(f"{n} {name}" for name, n in types.most_common())
    assert rows["file"].startswith("GGUF, ") and rows["tokenizer"] == "none"
    quantized, float32 = re.match(r"(\S+) KiB as stored, quantized .*; (\S+) KiB dequantized", rows["weights"]).groups()
    assert float(quantized) < float(float32) / 3  # Q8_0: 34 bytes a block of 32 weights
    # the peak running it quantized: its blocks, the KV cache and the runtime's 100 MB
    assert re.search(r" \(peak about 95\.\d MiB with the runtime\);", rows["memory"])


def test_a_quantized_load_keeps_the_matrices_of_a_gguf_file_in_their_blocks(tmp_path):
    from tests.helpers.gguf_convert import convert

    path = str(convert("llama", tmp_path / "llama.gguf", "Q8_0"))
    assert isinstance(common.load(path, text=False, quantized=True).weights.layers[0].attention.q_proj, QuantizedTensor)
    assert isinstance(common.load(path, text=False).weights.layers[0].attention.q_proj, np.ndarray)


@pytest.mark.parametrize("command", [["generate", "hi"], ["chat"], ["bench"]])
@pytest.mark.parametrize("flags, quantized", [([], True), (["--dequantize"], False)])
def test_generation_multiplies_from_quantized_blocks_unless_asked_to_dequantize(command, flags, quantized, monkeypatch):
    asked = {}

    def load(name, **options):
        asked.update(options)
        raise InvalidInputError("stop here")

    monkeypatch.setattr(common, "load", load)
    assert cli.main([*command, *flags]) == 1
    assert asked["quantized"] is quantized


# ---- bench ----------------------------------------------------------------------------------------------------


def test_bench_reports_prefill_decode_and_batch_scaling(tiny, capsys):
    code, out, _ = run(capsys, "bench", "--model", tiny, "--prompt-tokens", "8", "--new-tokens", "3", "--batch", "1,3")
    assert code == 0
    assert re.search(r"^machine .*CPUs", out, re.M) and re.search(r"^threads +\d+ Numba threads, .*NUMBA_NUM", out, re.M)
    assert re.search(r"^vectors +\S+", out, re.M)
    assert re.search(r"^first +token \S+ s after the process started", out, re.M)
    assert re.search(r"^prefill +8 tokens in \S+ s: \S+ tokens/s \(time to first token \S+ s\)$", out, re.M)
    rates = dict(re.findall(r"^ +(\d) +(\S+) +\S+ +\S+x$", out, re.M))
    assert set(rates) == {"1", "3"} and all(float(r) > 0 for r in rates.values())


# ---- errors a user can cause ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "hi", "--model", "no-such-model"], "no-such-model is neither a catalog model"),
        (["generate", "hi", "--model", "no/such/dir"], "no/such/dir: no such file or directory"),
        (["perplexity", "no-such-file.txt"], "no-such-file.txt: no such file"),
        (["info", "tiny", "--context", "100000"], "--context 100000 is longer than"),
    ],
)
def test_user_errors_print_one_line_and_exit_1(argv, message, tiny, capsys):
    code, _, err = run(capsys, *(a.replace("tiny", tiny) for a in argv))
    assert code == 1
    assert len(err.splitlines()) == 1 and err.startswith("refllm: error: ") and message in err


def test_a_model_too_large_for_memory_is_refused_before_loading(tiny, monkeypatch, capsys):
    monkeypatch.setattr(common, "available_memory", lambda: 1000)
    code, out, err = run(capsys, "generate", "hi", "--model", tiny)
    assert code == 1 and out == ""
    assert re.fullmatch(
        f"refllm: error: {re.escape(tiny)} needs about \\S+ KiB for its weights, more than the 1000 B of memory"
        " available\n",
        err,
    )


def test_debug_after_the_command_raises_instead(tiny):
    with pytest.raises(ValueError, match="is longer than"):
        cli.main(["info", tiny, "--context", "100000", "--debug"])


def test_a_bad_flag_value_is_one_line_without_traceback():
    done = refllm_process("generate", "hi", "--max-tokens", "lots")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "refllm generate: error: argument -n/--max-tokens: 'lots' is not a whole number (see refllm generate --help)"
    ]


def test_a_missing_file_is_one_line_and_debug_shows_the_traceback(tmp_path):
    missing = str(tmp_path / "missing.gguf")
    done = refllm_process("info", missing)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stderr == f"refllm: error: {missing}: no such file or directory\n"
    debug = refllm_process("--debug", "info", missing)
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr


def test_chat_reads_piped_stdin(tiny):
    done = refllm_process("chat", "--model", tiny, "--max-tokens", "3", stdin="Hi\n/reset\nBye\n")
    assert done.returncode == 0, done.stderr
    assert "(conversation cleared)" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout.count("\n") >= 2


@pytest.mark.real_model
def test_generate_and_chat_stream_an_answer_from_a_real_model():
    real_model_or_skip(SMOLLM2)
    done = refllm_process("generate", "The capital of France is", "--max-tokens", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("The capital of France is") and len(done.stdout) > len("The capital of France is\n")
    done = refllm_process("chat", "--max-tokens", "3", stdin="What is the capital of France?\n/reset\nHi\n")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) >= 2
