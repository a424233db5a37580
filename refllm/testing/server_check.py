"""Any OpenAI-compatible server as a backend: ``refllm check --server URL/v1 --model NAME``.

A server gives what its completions endpoint returns: the chosen tokens and
the log-probabilities of its top ``k`` candidates at each step, as text. So
a server is checked for its greedy continuations (under the near-tie rule)
and for its log-probabilities: on every step both sides agree on so far, the
KL divergence between the reference's and the server's probabilities,
renormalized over the server's top k, must stay within the bound a server
within the profile's logit tolerance cannot pass (``kl_bound``); the share of
steps where both put the same token first is reported too. Prompt
log-probabilities (``echo``) are compared where the server offers them. It
cannot be checked for anything the wire does not carry: full logits, cache
ids, batching, memory.

Every answer must come whole within ``--timeout`` seconds (and the run within
``--run-timeout``) and ``--max-response-mb``, and have the shape the check relies
on (``refllm/testing/server_answers.py``); the first that does not ends the run
with one line saying what was wrong, and exit status 1.

The prompts go as token ids (so both sides see the same tokens; as their
text, said in the output, to a server that takes only text); the
reference is refllm's float32 spec over the same weights (``--reference``,
default ``--model``), and tokens are compared as the text each id decodes to.
"""

from __future__ import annotations

import argparse
import json
import time
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
from refllm.testing.server_answers import (
    AnswerTooLateError,
    ServedSteps,
    ServerAnswerError,
    ServerRefusedError,
    post_json,
    served_steps,
)
from refllm.testing.tolerances import PROFILES, Tolerance, get_profile

DEFAULT_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,")


def server_models(url: str, timeout: float = 10.0) -> list[str] | None:
    """The model ids ``url``/models lists, or None where the server lists none (the run then checks its answers
    all the same). A server that cannot be reached, or a URL that is no OpenAI API for want of /v1, is refused
    in one sentence, before anything loads."""
    url = url.rstrip("/")
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=timeout) as response:
            return [str(model["id"]) for model in json.loads(response.read(1 << 20))["data"]]
    except urllib.error.HTTPError as error:
        if error.code == 404 and not url.endswith("/v1"):
            raise ServerRefusedError(
                f"{url}/models answered HTTP 404; is this an OpenAI API: its base URL usually ends in /v1"
                f" (try {url}/v1)?"
            ) from None
        return None
    except urllib.error.URLError as error:
        if isinstance(error.reason, TimeoutError):
            return None  # a slow server: the run's own deadlines judge it
        raise ServerRefusedError(f"cannot reach {url}: {error.reason}; is the server running there?") from None
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Limits:
    """How long one answer (and the whole run) may take, and how large an answer may be."""

    timeout: float = 120.0
    run_timeout: float = 900.0
    max_bytes: int = 16 << 20


@dataclass(frozen=True)
class StepComparison:
    """One prompt through the server, against the reference."""

    greedy_ok: bool
    greedy_line: str
    kl_top_k: list[float]  # per agreed step
    kl_bounds: list[float]  # the same steps' bounds
    same_top: list[bool]

    @property
    def kl_ok(self) -> bool:
        return all(kl <= bound for kl, bound in zip(self.kl_top_k, self.kl_bounds))

    @property
    def ok(self) -> bool:
        return self.greedy_ok and self.kl_ok

    def line(self, index: int) -> str:
        verdict = f"prompt {index} {'ok' if self.ok else 'FAIL'}: {self.greedy_line}"
        if not self.kl_top_k:
            return verdict
        worst = int(np.argmax(np.subtract(self.kl_top_k, self.kl_bounds)))
        kl = f"KL on the top k: mean {np.mean(self.kl_top_k):.3g}, max {np.max(self.kl_top_k):.3g}"
        if not self.kl_ok:
            kl += f"; past its bound at step {worst}: {self.kl_top_k[worst]:.3g} > {self.kl_bounds[worst]:.3g}"
        return f"{verdict}; {kl}"


def kl_bound(profile: Tolerance, logits: np.ndarray) -> float:
    """The most KL(reference || server) over any renormalized subset of tokens when every server logit is within
    the profile's allowance ``a`` of the reference's: each log-probability then moves by at most 2a, and so the
    KL, a mean of log-ratios, is at most 2a."""
    return 2.0 * float(profile.allowance(logits).item())


class ServerCheck:
    """The reference's distributions, keyed by token text, next to a server's."""

    def __init__(self, server: str, model: str, checkpoint: Checkpoint, top_k: int, limits: Limits = Limits()):
        self.url, self.model, self.top_k, self.limits = server.rstrip("/"), model, top_k, limits
        self.tokenizer = checkpoint.tokenizer
        self.reference = refllm_contiguous(checkpoint)
        self.eos_token_ids = set(checkpoint.config.eos_token_ids)
        self.texts = [self.tokenizer.decode([i]) for i in range(checkpoint.config.vocab_size)]
        self.prompt_as_text = False  # set when the server refuses token-id prompts
        self.run_deadline = time.monotonic() + limits.run_timeout

    def completion(self, ids: list[int], new_tokens: int, echo: bool = False) -> dict:
        """The server's answer for ``ids``: sent as token ids, or as their text where the server takes only text."""
        body = dict(model=self.model, max_tokens=new_tokens, temperature=0.0, logprobs=self.top_k)
        if echo:
            body |= dict(echo=True, max_tokens=1)
        if not self.prompt_as_text:
            try:
                return self._post(body | dict(prompt=ids))
            except ServerRefusedError:
                self.prompt_as_text = True
        return self._post(body | dict(prompt=self.tokenizer.decode(ids)))

    def _post(self, body: dict) -> dict:
        left = self.run_deadline - time.monotonic()
        try:
            timeout = min(self.limits.timeout, left)
            return post_json(f"{self.url}/completions", body, timeout=timeout, max_bytes=self.limits.max_bytes)
        except AnswerTooLateError:
            if left >= self.limits.timeout:
                raise
            raise AnswerTooLateError(
                f"the run passed its deadline of {self.limits.run_timeout:g} s (--run-timeout) before an answer came"
            ) from None

    def by_text(self, logits: np.ndarray) -> dict[str, float]:
        """Log-probabilities by token text; ids that decode alike keep the most likely."""
        logprobs = log_softmax64(logits)
        best: dict[str, float] = {}
        for i in np.argsort(-logprobs, kind="stable")[: 50 * self.top_k]:
            best.setdefault(self.texts[i], float(logprobs[i]))
        return best

    def compare(self, ids: list[int], new_tokens: int, profile: Tolerance) -> StepComparison:
        """The server's greedy answer against the reference; ServerAnswerError when it cannot be judged."""
        served = served_steps(self.completion(ids, new_tokens), new_tokens)
        kl, bounds, same, history = [], [], [], list(ids)
        for step, (token, top) in enumerate(zip(served.tokens, served.top)):
            logits = self.reference.last_logits(history)
            reference = self.by_text(logits)
            ranked = list(reference)
            self._check_top_size(top, logits, step)
            same.append(next(iter(top)) == ranked[0])
            kl.append(top_k_kl(reference, top))
            bounds.append(kl_bound(profile, logits))
            if token != ranked[0]:
                tie = token in ranked[: profile.top_n] and ranked[0] in top
                what = "a near-tie" if tie else "a real divergence"
                return StepComparison(
                    tie, f"greedy: {step} tokens agree, then {what} at step {step} (server {token!r}, reference"
                    f" {ranked[0]!r}; reference's top {profile.top_n}: {ranked[: profile.top_n]}, server's:"
                    f" {list(top)})", kl, bounds, same,
                )  # fmt: skip
            history.append(int(np.argmax(logits)))  # the token both sides chose
        return StepComparison(*self._length_verdict(served, new_tokens, history[-1]), kl, bounds, same)

    def _check_top_size(self, top: dict[str, float], logits: np.ndarray, step: int) -> None:
        """The server's top-k must hold as many texts as the reference's top k ids decode to (fewer when texts
        collide)."""
        expected = len({self.texts[i] for i in np.argsort(-logits, kind="stable")[: self.top_k]})
        if not expected <= len(top) <= self.top_k + 1:
            raise ServerAnswerError(
                f"choices[0].logprobs.top_logprobs[{step}] holds {len(top)} tokens; the top {self.top_k} was asked"
                f" for (the reference's top {self.top_k} is {expected} distinct texts)"
            )

    def _length_verdict(self, served: ServedSteps, new_tokens: int, last: int) -> tuple[bool, str]:
        """All the served tokens agree: the answer may end early only where the reference ends too."""
        if len(served.tokens) == new_tokens or last in self.eos_token_ids:
            return True, f"greedy {len(served.tokens)}/{new_tokens} agree"
        return False, (
            f"greedy: {len(served.tokens)} tokens agree, then the server stopped (finish_reason 'stop') where the"
            f" reference goes on ({new_tokens} tokens were asked for)"
        )

    def prompt_logprobs(self, ids: list[int]) -> str:
        """How the server's log-probabilities of the prompt's own tokens compare (``echo``), in words."""
        try:
            served = self.completion(ids, 1, echo=True)["choices"][0]["logprobs"]
            echoed = served.get("tokens", [])[: len(ids)]
            values = served.get("token_logprobs", [])[1 : len(ids)]
        except ServerRefusedError:
            return "not offered by the server"
        except (ServerAnswerError, KeyError, IndexError, TypeError, AttributeError) as error:
            return f"not compared: the echo answer has no prompt log-probabilities ({error})"
        if echoed != [self.texts[i] for i in ids]:
            return f"not compared: the server echoed other tokens ({echoed[:4]}...), it tokenized the text itself"
        if len(values) != len(ids) - 1 or not all(isinstance(v, (int, float)) for v in values):
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


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value:g} must be a positive number")
    return value


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
    parser.add_argument("--profile", default="float32", choices=sorted(PROFILES), help="near-tie rule and KL bound")
    parser.add_argument("--timeout", type=_positive, default=Limits.timeout, metavar="S",
                        help=f"seconds for a whole answer (default {Limits.timeout:g})")
    parser.add_argument("--run-timeout", type=_positive, default=Limits.run_timeout, metavar="S",
                        help=f"seconds for the whole run (default {Limits.run_timeout:g})")
    parser.add_argument("--max-response-mb", type=_positive, default=Limits.max_bytes / 2**20, metavar="MB",
                        help=f"largest answer read (default {Limits.max_bytes >> 20})")  # fmt: skip
    parser.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    served = server_models(args.server, min(args.timeout, 10.0))  # a dead port, no /v1, a model it lacks: first
    if served is not None and args.model not in served:
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
    limits = Limits(args.timeout, args.run_timeout, int(args.max_response_mb * 2**20))
    check = ServerCheck(args.server, args.model, checkpoint, args.top_k, limits)
    profile = get_profile(args.profile)
    print(f"{args.server} model {args.model} against refllm's float32 spec of {args.reference or args.model}")
    results = []
    for index, ids in enumerate(prompts):
        try:
            results.append(check.compare(ids, args.new_tokens, profile))
        except ServerAnswerError as error:
            print(f"prompt {index} FAIL: {error}", flush=True)
            return 1
        print(results[-1].line(index), flush=True)
    kl = [v for r in results for v in r.kl_top_k]
    bounds = [v for r in results for v in r.kl_bounds]
    same = [v for r in results for v in r.same_top]
    print(f"top-{args.top_k} KL over {len(kl)} steps: mean {np.mean(kl):.4g}, max {np.max(kl):.4g} (bound per step:"
          f" 2 x the {profile.name} profile's logit allowance of {profile.describe()}, here {min(bounds):.3g} to"
          f" {max(bounds):.3g}); same top token {100 * np.mean(same):.1f}%")  # fmt: skip
    if check.prompt_as_text:
        print("the server takes no token-id prompts: prompts were sent as text, which it tokenizes itself")
    print(f"prompt logprobs: {check.prompt_logprobs(prompts[0])}")
    passed = sum(r.ok for r in results)
    print(f"{passed}/{len(results)} prompts pass")
    return 0 if passed == len(results) else 1
