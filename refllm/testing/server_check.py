"""Any OpenAI-compatible server as a backend: ``refllm check --server URL/v1 --model NAME``.

A server gives what its completions endpoint returns: the chosen tokens and
the log-probabilities of its top ``k`` candidates at each step, as text. So
a server can be checked for its greedy continuations (under the near-tie
rule) and for its top-k distributions: on every step both sides agree on
so far, the KL divergence between the reference's and the server's
probabilities renormalized over the server's top k, and the share of steps
where both put the same token first. Prompt log-probabilities (``echo``)
are compared too where the server offers them. It cannot be checked for
anything the wire does not carry: full logits, cache ids, batching, memory.

The prompts go as token ids (so both sides see the same tokens; as their
text, said in the output, to a server that takes only text); the
reference is refllm's float32 spec over the same weights (``--reference``,
default ``--model``), and tokens are compared as the text each id decodes to.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from refllm import catalog
from refllm.errors import InvalidInputError
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.factories import refllm_contiguous
from refllm.testing.golden import read_prompts
from refllm.testing.kld import log_softmax64
from refllm.testing.tolerances import PROFILES, get_profile

DEFAULT_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,")


class ServerRefusedError(InvalidInputError):
    """The server answered a completions request with an error."""


def server_models(url: str, timeout: float = 10.0) -> list[str]:
    """The model ids ``url``/models lists; a server that cannot be reached, or is no OpenAI API there, is
    refused in one sentence."""
    url = url.rstrip("/")
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=timeout) as response:
            listing = json.loads(response.read())
        return [str(model["id"]) for model in listing["data"]]
    except urllib.error.HTTPError as error:
        hint = f": its base URL usually ends in /v1 (try {url}/v1)" if not url.endswith("/v1") else ""
        raise ServerRefusedError(f"{url}/models answered HTTP {error.code}; is this an OpenAI API{hint}?") from None
    except urllib.error.URLError as error:
        raise ServerRefusedError(f"cannot reach {url}: {error.reason}; is the server running there?") from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ServerRefusedError(f"{url}/models is not an OpenAI model list ({error}); is the URL right?") from None


def post_json(url: str, body: dict, timeout: float = 300.0) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise ServerRefusedError(f"{url}: HTTP {error.code}: {error.read().decode(errors='replace')[:300]}") from None


@dataclass(frozen=True)
class StepComparison:
    """One prompt through the server, against the reference."""

    greedy_ok: bool
    greedy_line: str
    kl_top_k: list[float]  # per agreed step
    same_top: list[bool]

    def line(self, index: int) -> str:
        kl = f"KL on the top k: mean {np.mean(self.kl_top_k):.3g}, max {np.max(self.kl_top_k):.3g}" if self.kl_top_k else ""
        return f"prompt {index} {'ok' if self.greedy_ok else 'FAIL'}: {self.greedy_line}; {kl}".rstrip("; ")


class ServerCheck:
    """The reference's distributions, keyed by token text, next to a server's."""

    def __init__(self, server: str, model: str, checkpoint: Checkpoint, top_k: int):
        self.url, self.model, self.top_k = server.rstrip("/"), model, top_k
        self.tokenizer = checkpoint.tokenizer
        self.reference = refllm_contiguous(checkpoint)
        self.texts = [self.tokenizer.decode([i]) for i in range(checkpoint.config.vocab_size)]
        self.prompt_as_text = False  # set when the server refuses token-id prompts

    def completion(self, ids: list[int], new_tokens: int, echo: bool = False) -> dict:
        """The server's logprobs for ``ids``: sent as token ids, or as their text where the server takes only text."""
        body = dict(model=self.model, max_tokens=new_tokens, temperature=0.0, logprobs=self.top_k)
        if echo:
            body |= dict(echo=True, max_tokens=1)
        if not self.prompt_as_text:
            try:
                return post_json(f"{self.url}/completions", body | dict(prompt=ids))["choices"][0]["logprobs"]
            except ServerRefusedError:
                self.prompt_as_text = True
        text = self.tokenizer.decode(ids)
        return post_json(f"{self.url}/completions", body | dict(prompt=text))["choices"][0]["logprobs"]

    def by_text(self, logits: np.ndarray) -> dict[str, float]:
        """Log-probabilities by token text; ids that decode alike keep the most likely."""
        logprobs = log_softmax64(logits)
        best: dict[str, float] = {}
        for i in np.argsort(-logprobs, kind="stable")[: 50 * self.top_k]:
            best.setdefault(self.texts[i], float(logprobs[i]))
        return best

    def compare(self, ids: list[int], new_tokens: int, top_n: int) -> StepComparison:
        served = self.completion(ids, new_tokens)
        kl, same, history = [], [], list(ids)
        for step, (token, top) in enumerate(zip(served["tokens"], served["top_logprobs"])):
            logits = self.reference.last_logits(history)
            reference = self.by_text(logits)
            ranked = list(reference)
            same.append(max(top, key=top.get) == ranked[0])
            kl.append(top_k_kl(reference, top))
            if token != ranked[0]:
                tie = token in ranked[:top_n] and ranked[0] in top
                what = "a near-tie" if tie else "a real divergence"
                return StepComparison(
                    tie, f"greedy: {step} tokens agree, then {what} at step {step} (server {token!r}, reference"
                    f" {ranked[0]!r}; reference's top {top_n}: {ranked[:top_n]}, server's: {list(top)})", kl, same,
                )  # fmt: skip
            history.append(int(np.argmax(logits)))  # the token both sides chose
        return StepComparison(True, f"greedy {len(served['tokens'])}/{new_tokens} agree", kl, same)

    def prompt_logprobs(self, ids: list[int]) -> str:
        """How the server's log-probabilities of the prompt's own tokens compare (``echo``), in words."""
        try:
            served = self.completion(ids, 1, echo=True)
        except ServerRefusedError:
            return "not offered by the server"
        echoed = served.get("tokens", [])[: len(ids)]
        if echoed != [self.texts[i] for i in ids]:
            return f"not compared: the server echoed other tokens ({echoed[:4]}...), it tokenized the text itself"
        values = served.get("token_logprobs", [])[1 : len(ids)]
        if len(values) != len(ids) - 1 or any(v is None for v in values):
            return "not offered by the server"
        expected = log_softmax64(self.reference.all_logits(ids))[np.arange(len(ids) - 1), ids[1:]]
        return f"max |Δ| {np.abs(np.asarray(values) - expected).max():.3g} over {len(values)} prompt tokens"


def top_k_kl(reference: dict[str, float], served: dict[str, float]) -> float:
    """KL(reference || server) over the server's top-k tokens, each side renormalized over that set."""
    keys = list(served)
    p = np.exp([reference.get(k, -np.inf) for k in keys])
    q = np.exp([served[k] for k in keys])
    if p.sum() == 0:
        return float("inf")
    p, q = p / p.sum(), q / q.sum()
    mask = p > 0
    return float(np.sum(p[mask] * (np.log(p[mask]) - np.log(q[mask]))))


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register ``check`` on a ``refllm``-style subparsers object."""
    parser = subparsers.add_parser(
        "check",
        help="check an OpenAI-compatible server against refllm's reference",
        description="Check an OpenAI-compatible server against refllm: for a few prompts, its greedy tokens and\n"
        "top log-probabilities beside those of refllm's float32 spec over the same weights. The server\n"
        "is asked for its models first, so a wrong URL or model name is said before anything loads.",
        epilog="examples:\n  refllm check --server http://127.0.0.1:8000/v1 --model smollm2-135m\n"
        "  refllm check --server http://127.0.0.1:8080/v1 --model local --reference ./SmolLM2.Q8_0.gguf",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--server", required=True, help="the server's base URL, ending in /v1")
    parser.add_argument("--model", required=True, help="the model name the server knows")
    parser.add_argument("--reference", help="the same weights for refllm: catalog name, .gguf or directory (default --model)")
    parser.add_argument("--prompts", help="one prompt per line, text or a JSON array of ids (default: three built in)")
    parser.add_argument("--new-tokens", type=int, default=16, help="greedy tokens per prompt (default 16)")
    parser.add_argument("--top-k", type=int, default=5, help="top log-probabilities asked for (default 5)")
    parser.add_argument("--profile", default="float32", choices=sorted(PROFILES), help="near-tie rule's top n")
    parser.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    served = server_models(args.server)  # a dead port, a URL without /v1, a name the server lacks: said first
    if args.model not in served:
        raise InvalidInputError(
            f"{args.server} serves {', '.join(served) or 'no model'}, not {args.model}; --model names the server's"
            " model (and --reference the same weights for refllm, where its name is not theirs)"
        )
    reference = args.reference or args.model
    if not (reference in catalog.CATALOG or Path(reference).expanduser().exists()):
        raise InvalidInputError(
            f"refllm has no model {reference} to check {args.server} against: name the same weights with"
            " --reference (a catalog name, .gguf file or Hugging Face directory)"
        )
    checkpoint = Checkpoint.open(reference)
    if args.prompts:
        prompts = [p.token_ids for p in read_prompts(args.prompts, checkpoint.tokenizer)]
    else:
        prompts = [checkpoint.tokenizer.encode(text) for text in DEFAULT_PROMPTS]
    check = ServerCheck(args.server, args.model, checkpoint, args.top_k)
    top_n = get_profile(args.profile).top_n
    print(f"{args.server} model {args.model} against refllm's float32 spec of {args.reference or args.model}")
    results = []
    for index, ids in enumerate(prompts):
        results.append(check.compare(ids, args.new_tokens, top_n))
        print(results[-1].line(index))
    kl = [v for r in results for v in r.kl_top_k]
    same = [v for r in results for v in r.same_top]
    print(f"top-{args.top_k} KL over {len(kl)} steps: mean {np.mean(kl):.4g}, max {np.max(kl):.4g};"
          f" same top token {100 * np.mean(same):.1f}%")  # fmt: skip
    if check.prompt_as_text:
        print("the server takes no token-id prompts: prompts were sent as text, which it tokenizes itself")
    print(f"prompt logprobs: {check.prompt_logprobs(prompts[0])}")
    passed = sum(r.greedy_ok for r in results)
    print(f"{passed}/{len(results)} prompts pass")
    return 0 if passed == len(results) else 1
