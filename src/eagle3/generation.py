"""Whole generations in one call: the loop runs in C without the GIL.

``session.generate(prompt, max_new_tokens)`` drafts, verifies every drafted
token in one target batch, processes, accepts and trims the KV cache, round
after round, inside the extension. ``session.generate_batch(prompts, ...)``
runs several sequences with one verify batch per round for all of them;
``session.stream(...)`` yields tokens as they are accepted; and
``context.generate(...)`` is plain decoding with the same sampler, for
comparisons.

Sampling is lossless: at temperature > 0 each position samples the target's
own distribution (top-k, top-p and min-p on the raw distribution, then
temperature) and drafted tokens are kept while they equal the samples. Each
output token costs one random draw, so a seed gives the same tokens with or
without speculation (up to float rounding between batched and single decodes).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterator, Sequence

import numpy as np

from eagle3 import _core
from eagle3._validate import as_int
from eagle3.errors import ArgumentTypeError, InvalidArgumentError, SessionStateError

FINISH_REASONS = ("length", "stop", "context")


@dataclasses.dataclass
class GenerationStats:
    """Counters and timings of one generation (or a sum of them)."""

    n_prompt: int = 0
    n_generated: int = 0
    n_rounds: int = 0
    """Target passes over a verify batch."""
    n_seq_rounds: int = 0
    """Sequences verified, summed over the rounds."""
    n_draft_calls: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    n_plain_rounds: int = 0
    """Rounds decoded without a draft because speculation did not pay (``n_draft_max="auto"``)."""
    accepted_per_position: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    """Rounds that accepted more than k drafted tokens, for each draft position k (int64)."""
    draft_lengths: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    """Sequence-rounds by the length k of the draft they verified, k = 0 .. n_draft_max
    (int64; 0: no draft): the lengths ``n_draft_max="auto"`` chose."""
    t_prefill_s: float = 0.0
    t_draft_s: float = 0.0
    t_verify_s: float = 0.0
    t_process_s: float = 0.0
    t_sample_s: float = 0.0
    t_total_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tau: tokens gained per sequence per target pass (accepted drafts + the target's own token)."""
        return (self.n_accepted + self.n_seq_rounds) / self.n_seq_rounds if self.n_seq_rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of the whole call, prefill included."""
        return self.n_generated / self.t_total_s if self.t_total_s > 0 else 0.0

    def __add__(self, other: GenerationStats) -> GenerationStats:
        out = GenerationStats()
        for field in dataclasses.fields(self):
            a, b = getattr(self, field.name), getattr(other, field.name)
            if isinstance(a, np.ndarray):
                n = max(len(a), len(b))
                total = np.zeros(n, np.int64)
                total[:len(a)] += a
                total[:len(b)] += b
                setattr(out, field.name, total)
            else:
                setattr(out, field.name, a + b)
        return out

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
                 tokens_per_s=self.tokens_per_s)
        return d


@dataclasses.dataclass
class Generation:
    """The result of one generated sequence."""

    tokens: np.ndarray
    """Generated token ids (int32), the stop token included."""
    text: str
    """The generated text, cut before a stop string."""
    finish_reason: str
    """``"length"``, ``"stop"`` (end-of-generation token, stop token or stop string) or ``"context"``."""
    stats: GenerationStats


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
    """Validated generation arguments."""

    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int
    stop_tokens: tuple[int, ...]
    stop_strings: tuple[str, ...]
    n_draft: int       # 0: the session's n_draft_max
    adaptive: bool


def settings(max_new_tokens: Any, temperature: Any = 0.0, top_k: Any = 0, top_p: Any = 1.0, min_p: Any = 0.0,
             seed: Any = None, stop_tokens: Any = (), stop_strings: Any = (), n_draft_max: Any = None,
             session_n_draft_max: int = 0) -> Settings:
    max_new = as_int(max_new_tokens, "max_new_tokens", 1)
    floats = {}
    for name, value, lo, hi in (("temperature", temperature, 0.0, 1e6), ("top_p", top_p, 0.0, 1.0),
                                ("min_p", min_p, 0.0, 1.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ArgumentTypeError(f"{name} must be a number, got {type(value).__name__}")
        if not lo <= float(value) <= hi:
            raise InvalidArgumentError(f"{name} must be in [{lo}, {hi}], got {value}")
        floats[name] = float(value)
    if floats["top_p"] <= 0.0:
        raise InvalidArgumentError("top_p must be > 0")
    top_k = as_int(top_k, "top_k", 0)
    seed = int.from_bytes(os.urandom(8), "little") if seed is None else as_int(seed, "seed", 0, 2**64 - 1)
    if isinstance(stop_strings, str):
        stop_strings = (stop_strings,)
    strings = tuple(stop_strings)
    if not all(isinstance(s, str) for s in strings):
        raise ArgumentTypeError("stop_strings must be strings")
    tokens = tuple(as_int(t, "stop token") for t in np.asarray(stop_tokens, dtype=object).reshape(-1))
    if n_draft_max == "auto":
        n_draft, adaptive = 0, True
    elif n_draft_max is None:
        n_draft, adaptive = 0, False
    else:
        n_draft, adaptive = as_int(n_draft_max, "n_draft_max", 1, max(session_n_draft_max, 1)), False
    return Settings(max_new, floats["temperature"], top_k, floats["top_p"], floats["min_p"], seed, tokens, strings,
                    n_draft, adaptive)


def prompt_tokens(model, prompt: Any) -> np.ndarray:
    if isinstance(prompt, str):
        return model.tokenize(prompt)
    arr = np.asarray(prompt)
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidArgumentError("a prompt is a non-empty string or one-dimensional array of token ids")
    if arr.dtype.kind not in "iu":
        raise ArgumentTypeError(f"prompt tokens must be integers, got dtype {arr.dtype}")
    return arr


def _text(model, tokens: np.ndarray, stops: Sequence[str]) -> str:
    text = model.detokenize(tokens)
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return text[:cut] if cut >= 0 else text


def _stats(engine: _core.EngineHandle) -> GenerationStats:
    return GenerationStats(**engine.stats())


def _results(engine: _core.EngineHandle, model, stops: Sequence[str], n: int) -> list[Generation]:
    stats = _stats(engine)
    out = []
    for i in range(n):
        tokens = engine.outputs[i][:engine.n_tokens(i)]
        out.append(Generation(tokens, _text(model, tokens, stops), engine.finish_reason(i), stats))
    return out


class TokenStream:
    """Iterator over the tokens of a streamed generation; ``generation`` is set when it ends."""

    def __init__(self, tokens: Iterator[int]):
        self._tokens = tokens
        self.generation: Generation | None = None

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> int:
        try:
            return next(self._tokens)
        except StopIteration as stop:
            self.generation = stop.value
            raise


def run(engine: _core.EngineHandle, model, prompts: list[np.ndarray], seq_ids: Sequence[int],
        s: Settings) -> list[Generation]:
    """Start and finish a generation on an engine (the caller holds the locks)."""
    engine.start(list(seq_ids), prompts, s.max_new_tokens, s.temperature, s.top_k, s.top_p, s.min_p, s.seed,
                 list(s.stop_tokens), list(s.stop_strings), s.n_draft, s.adaptive)
    engine.run()
    return _results(engine, model, s.stop_strings, len(prompts))


def stream(engine: _core.EngineHandle, model, prompt: np.ndarray, s: Settings, lock, check) -> Iterator[int]:
    """Yield the tokens of one sequence as the engine accepts them; returns its Generation."""
    with lock:
        check()
        engine.start([0], [prompt], s.max_new_tokens, s.temperature, s.top_k, s.top_p, s.min_p, s.seed,
                     list(s.stop_tokens), list(s.stop_strings), s.n_draft, s.adaptive)
        serial = engine.target_ctx.serial
    sent = 0
    live = 1
    while True:
        n = engine.n_tokens(0)
        for token in engine.outputs[0][sent:n]:
            yield int(token)
        sent = n
        if not live or engine.finish_reason(0) is not None:
            break
        with lock:
            check()
            if engine.target_ctx.serial != serial:
                raise SessionStateError("the contexts were used by another call while streaming")
            live = engine.step()
            serial = engine.target_ctx.serial
    return _results(engine, model, s.stop_strings, 1)[0]
