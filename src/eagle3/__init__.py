"""eagle3: Python control of llama.cpp's speculative decoding: EAGLE-3, MTP, draft models and n-grams.

The public API, re-exported from the modules that define it.
"""

from eagle3 import _build_config, _logging, errors
from eagle3._core import Batch, multi_token_counts, read_gguf, system_info
from eagle3.compat import PairReport, Problem, check_draft_model, check_pair
from eagle3.context import Context
from eagle3.errors import *  # noqa: F403 (every exception class)
from eagle3.generation import BatchGeneration, Generation, GenerationStats, TokenStream
from eagle3.model import Device, Model
from eagle3.quantize import quantize
from eagle3.sampling import SamplingParams
from eagle3.session import DraftSession, Eagle3Session, Eagle3SessionConfig, MtpSession, NgramSession
from eagle3.train import TrainReport, train_head

__version__ = _build_config.VERSION

__all__ = [
    "Batch",
    "Context",
    "Device",
    "DraftSession",
    "Eagle3Session",
    "Eagle3SessionConfig",
    "Model",
    "MtpSession",
    "NgramSession",
    "SamplingParams",
    "Generation",
    "GenerationStats",
    "BatchGeneration",
    "TokenStream",
    "check_pair",
    "check_draft_model",
    "PairReport",
    "Problem",
    "quantize",
    "multi_token_counts",
    "read_gguf",
    "system_info",
    "train_head",
    "TrainReport",
    *errors.__all__,
]

_logging.install()
