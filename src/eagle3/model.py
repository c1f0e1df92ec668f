"""Models: a GGUF file loaded by llama.cpp."""

from __future__ import annotations

import functools
import math
import os
from typing import Any, NamedTuple

import numpy as np

from eagle3 import _core, compat, remote
from eagle3._lifetime import Resource
from eagle3._validate import as_int, int32_array
from eagle3.errors import ArgumentTypeError, InvalidArgumentError, ModelLoadError


class Device(NamedTuple):
    """Where a part of a model is (:attr:`Model.devices`)."""

    name: str                 # ggml's device name: "CPU", "RPC0", ...
    endpoint: str | None      # the RPC server ("host:port") it is on; None: this machine
    layers: tuple[int, ...]   # the repeating layers it holds
    output: bool              # it holds the output layer (and computes the logits)
    weight_bytes: int         # bytes of weights it holds


class Model(Resource):
    """A llama.cpp model loaded from a GGUF file.

    ``Model(path, n_gpu_layers=None, load_mtp=None)``. ``load_mtp`` loads the
    NextN (MTP) heads a model may carry; ``None`` loads them when the file has
    any. Close it (or use ``with``) to free it; closing a model first closes
    every context created over it.

    ``rpc_servers=["host:port", ...]`` puts layers on remote machines that run
    ``eagle3 rpc-server`` (llama.cpp's RPC backend): the last ``n_gpu_layers``
    layers, the output layer counted as the last (default: all), are split
    across the servers' devices in the shares ``tensor_split`` gives (one per
    device, in order; default: by their free memory), the rest stay on this
    CPU.
    :attr:`devices` says where each part went. An unreachable server is a
    :class:`ModelLoadError`; one that fails later is a
    :class:`~eagle3.RemoteError` from the call that met it, after which the
    model can only be closed.

    ``use_mmap`` (default: llama.cpp's choice, which maps the file on a CPU)
    maps the file instead of reading it: loading is quick and the pages are
    shared with other processes, but the file must not change while the model
    is open: truncating or rewriting it kills the process (SIGBUS), which no
    library can turn into an exception. ``use_mmap=False`` reads it into memory.
    ``use_mlock`` keeps the weights in RAM (no swapping; needs the memory lock
    limit, ``ulimit -l``).

    ``repack=False`` keeps the weights as the file lays them out. By default
    the CPU takes some types in layouts of its own, made at load (llama.cpp's
    repacking: q4_0, iq4_nl and q4_K in groups of 8 rows; with AVX512-VNNI
    q5_K, q6_K, iq4_xs, q8_0 and q4_1, and with AVX512-VBMI too q5_0 and
    q5_1, in groups of 16), which
    every pass reads faster; the groups of 16 give the logits the file's
    layout gives, bit for bit. Repacked weights live in memory of their own
    rather than in the mapped file.
    """

    _kind = "model"

    def __init__(self, path: str | os.PathLike, n_gpu_layers: int | None = None, *, load_mtp: bool | None = None,
                 vocab_only: bool = False, check_tensors: bool = False, use_mmap: bool | None = None,
                 use_mlock: bool = False, rpc_servers=(), tensor_split=None, repack: bool = True) -> None:
        super().__init__()
        try:
            self.path = os.fspath(path)
        except TypeError:
            raise ArgumentTypeError(f"path must be a str or os.PathLike, got {type(path).__name__}") from None
        self.rpc_servers: tuple[str, ...] = remote.endpoints(rpc_servers)
        if n_gpu_layers is None:
            n_gpu_layers = -1 if self.rpc_servers else 0  # (llama.cpp: negative is every layer)
        n_gpu_layers = as_int(n_gpu_layers, "n_gpu_layers")
        tensor_split = _shares(tensor_split)
        if not os.path.exists(self.path):
            raise ModelLoadError(f"{self.path}: no such file")
        if os.path.isdir(self.path):
            raise ModelLoadError(f"{self.path}: is a directory, not a GGUF file")
        self._metadata, self._metadata_types, self._tensors = _core.read_gguf(self.path)
        self.architecture: str = str(self._metadata.get("general.architecture", ""))
        problems = compat.load_problems(self.path, self._metadata, self._metadata_types, self._tensors)
        if problems:
            raise ModelLoadError(f"{self.path}: {problems[0]}")
        if load_mtp is None:
            nextn = self._metadata.get(f"{self.architecture}.nextn_predict_layers")
            load_mtp = isinstance(nextn, (int, np.integer)) and not isinstance(nextn, bool) and nextn > 0
        self.load_mtp = bool(load_mtp)
        for name, value in (("use_mmap", use_mmap), ("use_mlock", use_mlock), ("repack", repack)):
            if value is not None and not isinstance(value, bool):
                raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__}")
        self._handle = h = _core.ModelHandle(self.path, n_gpu_layers, self.load_mtp, vocab_only, check_tensors,
                                             use_mmap, use_mlock, self.rpc_servers, tensor_split, repack)
        self.n_vocab: int = h.n_vocab
        self.n_layer: int = h.n_layer
        self.n_layer_nextn: int = h.n_layer_nextn
        self.n_embd: int = h.n_embd
        self.n_head: int = h.n_head
        self.n_head_kv: int = h.n_head_kv
        self.n_ctx_train: int = h.n_ctx_train
        self.bos: int = h.bos
        self.eos: int = h.eos
        self.add_bos: bool = h.add_bos
        self.n_params: int = h.n_params
        self.size: int = h.size
        self.description: str = h.description()

    @property
    def devices(self) -> tuple[Device, ...]:
        """Where llama.cpp put the model: one :class:`Device` per device that holds a
        part of it, this machine's CPU first (the token embeddings are always there)."""
        h = self._live()
        endpoints: dict[str, str | None] = {"CPU": None}
        layers: dict[str, list[int]] = {"CPU": []}
        output = None
        for il, name, description in h.layer_devices():
            endpoints.setdefault(name, description if name.startswith("RPC") else None)
            if il < 0:
                output = name
            else:
                layers.setdefault(name, []).append(il)
        sizes = h.device_bytes()
        names = list(dict.fromkeys(["CPU", *layers, *sizes]))
        return tuple(Device(name, endpoints.get(name), tuple(layers.get(name, ())), name == output,
                            int(sizes.get(name, 0))) for name in names)

    # -- metadata ----------------------------------------------------------

    @functools.cached_property
    def _generation_warnings(self) -> list[str]:
        """Why this model's contexts would generate nothing of use (weights that read as
        zeros, not a causal LM), read from the file once, for every context's warning."""
        header = compat._header(self)
        reasons = [compat.unset_weights(header)]
        if self.architecture != "eagle3":
            reasons.append(compat.not_causal_lm(header))
        return [reason for reason in reasons if reason]

    @property
    def metadata(self) -> dict[str, Any]:
        """The GGUF metadata: numbers, strings, tuples of strings and read-only NumPy arrays."""
        return dict(self._metadata)

    @property
    def metadata_types(self) -> dict[str, str]:
        """The GGUF type of each metadata key (``"uint32"``, ``"array[int32]"``, ...)."""
        return dict(self._metadata_types)

    @property
    def tensors(self) -> dict[str, _core.TensorInfo]:
        """Tensor name -> ``TensorInfo(shape, type, offset, nbytes)`` from the GGUF header
        (shape in ggml order, ggml type name, where the data lies in the file)."""
        return dict(self._tensors)

    # -- vocabulary --------------------------------------------------------

    def _vocab(self):
        h = self._live()
        if not h.has_vocab:
            raise InvalidArgumentError(f"{self.path} has no vocabulary; it cannot tokenize")
        return h

    def tokenize(self, text: str, add_bos: bool = True, *, special: bool = False) -> np.ndarray:
        """Token ids of ``text`` as an int32 array. ``add_bos`` adds the model's
        BOS (and other automatic special tokens) where the vocabulary uses
        them; ``special`` parses special-token text such as ``<s>``."""
        if not isinstance(text, str):
            raise ArgumentTypeError(f"text must be str, got {type(text).__name__}")
        return self._vocab().tokenize(text, add_bos, special)

    def detokenize(self, tokens, *, remove_special: bool = False, unparse_special: bool = False) -> str:
        """Text of a sequence of token ids."""
        return self._vocab().detokenize(int32_array(tokens, "tokens"), remove_special, unparse_special)

    # -- chat ----------------------------------------------------------------

    @property
    def chat_template(self) -> str | None:
        """The model's chat template (``tokenizer.chat_template``, Jinja), or None."""
        return self._live().chat_template()

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, *,
                            template: str | None = None) -> str:
        """The prompt text of a chat, through the model's chat template (or ``template``)
        by llama.cpp's common/chat (Jinja). ``messages`` is a list of ``{"role": ...,
        "content": ...}`` dicts; ``add_generation_prompt`` appends the opening of the
        assistant's turn. Tokenize the result with ``tokenize(text, special=True)``."""
        if isinstance(messages, (str, dict)) or not hasattr(messages, "__iter__"):
            raise ArgumentTypeError("messages is a list of {'role': ..., 'content': ...} dicts")
        pairs = []
        for m in messages:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise ArgumentTypeError("each message is a dict with str 'role' and 'content'")
            pairs.append((m["role"], m["content"]))
        if not isinstance(add_generation_prompt, bool):
            raise ArgumentTypeError("add_generation_prompt must be a bool")
        if template is not None and not isinstance(template, str):
            raise ArgumentTypeError(f"template must be a str, got {type(template).__name__}")
        if template is None and self.chat_template is None:
            raise InvalidArgumentError(f"{self.path} has no chat template (tokenizer.chat_template); pass template=")
        return self._vocab().apply_chat_template(pairs, add_generation_prompt, template)

    def chat_tokens(self, messages, add_generation_prompt: bool = True, *, template: str | None = None) -> np.ndarray:
        """The token ids of :meth:`apply_chat_template`'s text, its special tokens parsed
        (and the BOS once, whether or not the template writes it)."""
        return self.template_tokens(self.apply_chat_template(messages, add_generation_prompt, template=template))

    def template_tokens(self, text: str) -> np.ndarray:
        """The token ids of a chat template's ``text``: its special tokens parsed, and
        the BOS once, whether or not the template writes it."""
        tokens = self.tokenize(text, special=True)
        bos = self._metadata.get("tokenizer.ggml.bos_token_id")
        if len(tokens) > 1 and tokens[0] == tokens[1] == bos:
            tokens = tokens[1:]
        return tokens

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        token = as_int(token, "token", -2**63, 2**63 - 1)
        if not 0 <= token < self.n_vocab:
            return False
        return bool(self._live().is_eog(token))

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"n_layer={self.n_layer}, n_embd={self.n_embd}, n_vocab={self.n_vocab}"
        return f"Model({self.path!r}, architecture={self.architecture!r}, {state})"


def _shares(tensor_split) -> list[float] | None:
    """``tensor_split`` checked: finite shares >= 0, not all 0."""
    if tensor_split is None:
        return None
    try:
        shares = [float(x) for x in tensor_split]
    except (TypeError, ValueError):
        raise ArgumentTypeError("tensor_split must be a sequence of numbers, one per remote device") from None
    if not all(math.isfinite(x) and x >= 0 for x in shares) or not any(shares):
        raise InvalidArgumentError(f"tensor_split must be finite shares >= 0, not all 0, got {shares}")
    return shares
