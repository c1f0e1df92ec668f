"""Whole generations in one call: the loop runs in C without the GIL.

``session.generate(prompt, max_new_tokens)`` drafts, verifies every drafted
token in one target batch, processes, accepts and trims the KV cache, round
after round, inside the extension. ``session.generate_batch(prompts, ...)``
runs several sequences with one verify batch per round for all of them;
``session.stream(...)`` yields tokens as they are accepted; and
``context.generate(...)`` is plain decoding with the same sampler, for
comparisons.

Sampling goes through llama.cpp's sampler chain (logit bias, penalties,
grammar, top-k, typical-p, top-p, min-p, temperature) and is lossless either
way drafts are verified: ``verify="rejection"`` (the default) keeps a drafted
token with probability min(1, p/q) and resamples a rejected position from
max(0, p - q); ``verify="match"`` keeps drafted tokens while they equal the
target's own samples, one random draw per output token, so that a seed gives
the same tokens with or without speculation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Sequence

import numpy as np

from eagle3 import _core
from eagle3._validate import as_int, int32_array
from eagle3.errors import ArgumentTypeError, InvalidArgumentError
from eagle3.sampling import SamplingParams, sampling_params
from eagle3.stats import GenerationStats

__all__ = ["Generation", "BatchGeneration", "GenerationStats", "TokenStream"]


@dataclasses.dataclass
class Generation:
    """The result of one generated sequence."""

    tokens: np.ndarray
    """Generated token ids (int32), the stop token included."""
    text: str
    """What the generated tokens add to the prompt's text (``prompt + text`` reads as one),
    cut before a stop string."""
    finish_reason: str
    """``"length"``, ``"stop"`` (end-of-generation token, stop token or stop string), ``"context"``
    (the context is full) or ``"cancelled"`` (``cancel()``, ``close()`` from another thread)."""
    stats: GenerationStats
    """This sequence's own counters (in a batch, the batch's totals are :attr:`BatchGeneration.stats`)."""
    logprobs: np.ndarray | None = None
    """With ``logprobs=k``: each token's log-probability under the target after the sampler's
    transforms (greedy: at temperature 1), float32, one per token."""
    top_tokens: np.ndarray | None = None
    """With ``logprobs=k``: the k most probable tokens at each position, int32 (n, k); -1 where
    fewer were left after the transforms."""
    top_logprobs: np.ndarray | None = None
    """Their log-probabilities, float32 (n, k); -inf where :attr:`top_tokens` is -1."""
    trace: dict[str, np.ndarray] | None = None
    """With ``trace=True``, one entry per round this sequence took part in: ``round`` (the
    target pass), ``n_drafted``, ``n_accepted``, ``drafted`` (int32 (rounds, n_draft_max),
    -1 padded), ``draft_p`` (the draft's probability of each drafted token, float32, NaN
    padded), ``t_draft_s`` and ``t_verify_s``."""


@dataclasses.dataclass
class BatchGeneration:
    """The results of :meth:`generate_batch`: one :class:`Generation` per prompt."""

    generations: list[Generation]
    stats: GenerationStats
    """Counters of the whole batched run."""

    def __len__(self) -> int:
        return len(self.generations)

    def __getitem__(self, i: int) -> Generation:
        return self.generations[i]

    def __iter__(self) -> Iterator[Generation]:
        return iter(self.generations)

    @property
    def tokens(self) -> list[np.ndarray]:
        return [g.tokens for g in self.generations]

    @property
    def values(self) -> np.ndarray:
        """Every sequence's tokens, concatenated (see :attr:`offsets`)."""
        return np.concatenate(self.tokens) if self.generations else np.zeros(0, np.int32)

    @property
    def offsets(self) -> np.ndarray:
        """Sequence i is ``values[offsets[i]:offsets[i + 1]]`` (int64)."""
        return np.concatenate([[0], np.cumsum([len(t) for t in self.tokens])]).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Validated generation arguments: what the extension's e3_request is filled from."""

    max_new_tokens: int
    sampling: SamplingParams  # its seed resolved: never None here
    stop_tokens: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    n_draft: int = 0  # 0: the session's n_draft_max; k: at most k; _core.DRAFT_AUTO: "auto"
    logprobs: int = 0
    trace: bool = False
    reuse: bool = True


def settings(max_new_tokens: Any, sampling: Any = None, *, stop_tokens: Any = (), stop_strings: Any = (),
             n_draft_max: Any = None, logprobs: Any = 0, trace: Any = False, reuse: Any = True,
             json_schema: Any = None, **sampling_overrides: Any) -> Settings:
    """A generation call's arguments, checked for type (the ranges are the engine's,
    e3_engine_start); ``sampling_overrides`` are :class:`SamplingParams` fields."""
    params = sampling_params(sampling, json_schema, **sampling_overrides)
    params = params.replace(seed=params.resolved_seed())
    max_new = as_int(max_new_tokens, "max_new_tokens")
    for name, flag in (("trace", trace), ("reuse", reuse)):
        if not isinstance(flag, bool):
            raise ArgumentTypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if not isinstance(stop_strings, (list, tuple)):
        raise ArgumentTypeError(f"stop_strings must be a list of strings, got {type(stop_strings).__name__}")
    strings = tuple(stop_strings)
    if not all(isinstance(s, str) for s in strings):
        raise ArgumentTypeError("stop_strings must be strings")
    tokens = tuple(as_int(t, "stop token") for t in np.asarray(stop_tokens, dtype=object).reshape(-1))
    if n_draft_max == "auto":
        n_draft = _core.DRAFT_AUTO
    elif n_draft_max is None:
        n_draft = 0
    else:
        n_draft = as_int(n_draft_max, "n_draft_max", 1)  # (0 stands for None)
    return Settings(max_new, params, tokens, strings, n_draft, as_int(logprobs, "logprobs", 0), trace, reuse)


def prompt_tokens(model, prompt: Any) -> np.ndarray:
    if isinstance(prompt, str):
        return model.tokenize(prompt)
    if np.ndim(prompt) != 1:
        raise InvalidArgumentError("a prompt is a string or a one-dimensional array of token ids")
    return int32_array(prompt, "prompt tokens")  # (an empty one: the engine refuses it)


def continuation(model, prompt: np.ndarray, tokens: np.ndarray) -> str:
    """What ``tokens`` add to the text of ``prompt``: the text of both joined, less the
    prompt's (a tokenizer may render a token's leading space only after other text)."""
    base = model.detokenize(prompt)
    full = model.detokenize(np.concatenate([np.asarray(prompt, np.int64), np.asarray(tokens, np.int64)]))
    return full[len(base):] if full.startswith(base) else model.detokenize(tokens)


def _text(model, prompt: np.ndarray, tokens: np.ndarray, stops: Sequence[str]) -> str:
    text = continuation(model, prompt, tokens)
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return text[:cut] if cut >= 0 else text


def _results(pair: _core.Pair, model, prompts: Sequence[np.ndarray], stops: Sequence[str],
             trace: bool = False) -> BatchGeneration:
    """The finished generation: each request's tokens, text and own counters, and the call's totals."""
    out = []
    for i, prompt in enumerate(prompts):
        tokens = pair.tokens(i).copy()
        logprobs = pair.logprobs(i)
        g = Generation(tokens, _text(model, prompt, tokens, stops), pair.finish_reason(i),
                       GenerationStats(**pair.generation_counters(i)))
        if logprobs is not None:
            g.logprobs, g.top_tokens, g.top_logprobs = (a.copy() for a in logprobs)
        if trace:
            g.trace = pair.trace(i)
        out.append(g)
    return BatchGeneration(out, GenerationStats(**pair.generation_counters(-1)))


class TokenStream:
    """Iterator over the tokens (or, with ``text=True``, the text) of a streamed generation;
    ``generation`` is set when it ends."""

    def __init__(self, items: Iterator[Any]):
        self._items = items
        self.generation: Generation | None = None

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._items)
        except StopIteration as stop:
            self.generation = stop.value
            raise


def one_by_one(rounds: Iterator[np.ndarray]) -> Iterator[int]:
    """The tokens of a stream of rounds, one at a time; returns what the rounds return."""
    while True:
        try:
            new = next(rounds)
        except StopIteration as stop:
            return stop.value
        for token in new:
            yield int(token)


def stream_text(model, prompt: np.ndarray, rounds: Iterator[np.ndarray]) -> Iterator[str]:
    """Text pieces of a stream of token rounds: each what its tokens add to the text before
    them, held back while it ends inside a UTF-8 character; joined, they are the generation's
    text (before a stop string)."""
    context = np.asarray(prompt, np.int64)[-8:]  # enough before a piece for its leading space
    pending = np.zeros(0, np.int64)
    while True:
        try:
            new = next(rounds)
        except StopIteration as stop:
            if len(pending):
                yield continuation(model, context, pending)
            return stop.value
        pending = np.concatenate([pending, np.asarray(new, np.int64)])
        piece = continuation(model, context, pending)
        if piece and not piece.endswith("\ufffd"):
            yield piece
            context = np.concatenate([context, pending])[-8:]
            pending = pending[:0]


def run(pair: _core.Pair, model, prompts: list[np.ndarray], s: Settings) -> BatchGeneration:
    """A whole generation, prompt i on sequence i (the caller holds the pair)."""
    pair.start(range(len(prompts)), prompts, s)
    pair.run()
    return _results(pair, model, prompts, s.stop_strings, s.trace)


def stream(pair: _core.Pair, model, prompt: np.ndarray, s: Settings, check) -> Iterator[np.ndarray]:
    """Yield the tokens of one sequence as the engine accepts them, a round at a time (int32
    arrays); returns its Generation.

    Between rounds the pair is free: a call that uses it in the meantime ends
    the stream with SessionStateError at its next round."""
    with pair:
        check()
        generation = pair.start([0], [prompt], s)
    sent = 0
    while True:
        with pair:
            check()
            pair.check_current(generation)
            new = pair.tokens(0)[sent:].copy()
            result = (_results(pair, model, [prompt], s.stop_strings, s.trace)[0]
                      if pair.finish_reason(0) is not None else None)
        if len(new):
            yield new
        sent += len(new)
        if result is not None:
            return result
        with pair:
            check()
            pair.step(generation)
