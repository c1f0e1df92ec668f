"""How a generation samples: :class:`SamplingParams`, the one definition of the options.

Its fields are those of the engine's ``e3_sampling`` (``shim/eagle3_engine.h``), in the
same order (a C array and its length are one field here; ``tests/test_one_definition.py``
checks the two agree). ``generate``, ``stream`` and ``generate_batch`` take one as
``sampling=`` and any field as a keyword that overrides it; the command line builds its
sampling options from the fields and their ``help``.

Types are checked here; the ranges are the engine's (``e3_engine_start``), so a refused
value is refused the same way whichever way it came.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import numpy as np

from eagle3._validate import as_int
from eagle3.errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["SamplingParams", "VERIFICATIONS"]

VERIFICATIONS = ("match", "rejection")


def _option(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """llama.cpp's sampler chain, in the order it applies: logit bias, penalties, grammar,
    top-k, typical-p, top-p, min-p, temperature; then how drafts are verified and the seed.

    ``SamplingParams()`` is greedy decoding. Values are checked for type when made
    (``ArgumentTypeError``) and for range when a generation starts (``InvalidArgumentError``).
    :meth:`replace` gives a copy with some fields changed.
    """

    temperature: float = _option(0.0, "0 is greedy (default)")
    top_k: int = _option(0, "keep the k likeliest tokens (default 0: all)")
    top_p: float = _option(1.0, "nucleus sampling mass (default 1.0: off)")
    min_p: float = _option(0.0, "drop tokens below this share of the top one (default 0: off)")
    typical_p: float = _option(1.0, "locally typical sampling mass (default 1.0: off)")
    penalty_last_n: int = _option(64, "tokens the penalties look back over, the prompt's included (default 64; "
                                      "0: off, -1: the whole context)")
    repeat_penalty: float = _option(1.0, "divide the logits of the recent tokens' ids by this (default 1.0: off)")
    frequency_penalty: float = _option(0.0, "subtract this times each recent token's count (default 0: off)")
    presence_penalty: float = _option(0.0, "subtract this from each recent token's logit (default 0: off)")
    logit_bias: tuple[tuple[int, float], ...] = _option(
        (), "add BIAS to TOKEN's logit ({token: bias} or (token, bias) pairs; -inf bans the token)")
    grammar: str | None = _option(None, "constrain the output to this GBNF grammar (rule root)")
    verify: str = _option(
        "rejection", "at temperature > 0: speculative sampling, which keeps more drafts (rejection, default), or "
                     "keep drafts that match the target's own samples, so that a seed gives plain sampling's tokens "
                     "(match); both follow the target's distribution")
    seed: int | None = _option(None, "sampling seed (default: a new one for each generation); with verify "
                                     "match, the same seed gives the same tokens with or without speculation")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _CHECKS[f.name](getattr(self, f.name), f.name))

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with ``changes`` (field names) applied."""
        return dataclasses.replace(self, **checked_names(changes))

    def resolved_seed(self) -> int:
        """The seed a generation uses: this one, or a fresh random one when it is None."""
        return int.from_bytes(os.urandom(8), "little") if self.seed is None else self.seed


FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))


def checked_names(changes: Mapping[str, Any]) -> Mapping[str, Any]:
    unknown = sorted(set(changes) - set(FIELDS))
    if unknown:
        raise ArgumentTypeError(f"unknown sampling option{'s' if len(unknown) > 1 else ''} "
                                f"{', '.join(unknown)} (SamplingParams has {', '.join(FIELDS)})")
    return changes


def _float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"{name} must be a number, got {type(value).__name__}")
    return float(value)


def _logit_bias(bias: Any, name: str) -> tuple[tuple[int, float], ...]:
    if bias is None:
        return ()
    if isinstance(bias, Mapping):
        bias = bias.items()
    elif not isinstance(bias, (list, tuple)):
        raise ArgumentTypeError(f"{name} must be a dict {{token id: bias}}, got {type(bias).__name__}")
    pairs = []
    for pair in bias:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ArgumentTypeError(f"{name} holds (token id, bias) pairs, got {pair!r}")
        pairs.append((as_int(pair[0], f"{name} token"), _float(pair[1], f"a {name} value")))
    return tuple(pairs)


def _grammar(grammar: Any, name: str) -> str | None:
    if grammar is not None and not isinstance(grammar, str):
        raise ArgumentTypeError(f"{name} must be GBNF text (a str), got {type(grammar).__name__}")
    return grammar or None


def _verify(verify: Any, name: str) -> str:
    if verify not in VERIFICATIONS:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(map(repr, VERIFICATIONS))}, got {verify!r}")
    return verify


def _seed(seed: Any, name: str) -> int | None:
    return None if seed is None else as_int(seed, name, 0, 2**64 - 1)


_CHECKS = {name: _float for name in ("temperature", "top_p", "min_p", "typical_p", "repeat_penalty",
                                     "frequency_penalty", "presence_penalty")}
_CHECKS.update(top_k=lambda v, name: as_int(v, name), penalty_last_n=lambda v, name: as_int(v, name),
               logit_bias=_logit_bias, grammar=_grammar, verify=_verify, seed=_seed)


def sampling_params(sampling: SamplingParams | None, json_schema: Any = None, **overrides: Any) -> SamplingParams:
    """``sampling`` (or the defaults) with keyword overrides; ``json_schema`` (a dict) becomes
    the grammar, through llama.cpp's common/json-schema-to-grammar."""
    if sampling is None:
        sampling = SamplingParams()
    elif not isinstance(sampling, SamplingParams):
        raise ArgumentTypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    if json_schema is not None:
        if overrides.get("grammar") is not None:
            raise InvalidArgumentError("give grammar= or json_schema=, not both")
        if not isinstance(json_schema, (dict, bool)):
            raise ArgumentTypeError(f"json_schema must be a dict (a JSON schema), got {type(json_schema).__name__}")
        from eagle3 import _core

        overrides["grammar"] = _core.json_schema_to_grammar(json.dumps(json_schema))
    return sampling.replace(**overrides) if overrides else sampling
