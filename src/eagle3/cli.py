"""The ``eagle3`` command line (also ``python -m eagle3``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

import numpy as np

from eagle3 import _core
from eagle3.compat import check_pair
from eagle3.errors import Eagle3Error


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    return value


def _summary(value: Any, limit: int = 16) -> Any:
    """Short rendering of long arrays (a vocabulary has thousands of entries)."""
    if isinstance(value, (tuple, np.ndarray)) and len(value) > limit:
        head = [_jsonable(v) for v in value[:4]]
        return f"[{', '.join(map(repr, head))}, ... {len(value)} items]"
    return _jsonable(value)


def cmd_check(args: argparse.Namespace) -> int:
    report = check_pair(args.target, args.draft)
    if args.json:
        print(json.dumps({"target": report.target, "draft": report.draft, "compatible": report.ok,
                          "facts": {k: _jsonable(v) for k, v in report.facts.items()},
                          "problems": [{"code": p.code, "message": p.message} for p in report.problems]},
                         indent=2))
    else:
        print(report)
    return 0 if report.ok else 1


def cmd_info(args: argparse.Namespace) -> int:
    metadata, types, tensors = _core.read_gguf(args.model)
    if args.json:
        print(json.dumps({"path": args.model, "metadata": {k: _jsonable(v) for k, v in metadata.items()},
                          "types": types,
                          "tensors": {n: {"shape": list(t.shape), "type": t.type} for n, t in tensors.items()}},
                         indent=2))
        return 0
    arch = metadata.get("general.architecture", "?")
    n_params = sum(int(np.prod(t.shape)) for t in tensors.values())
    print(f"{args.model}: architecture {arch}, {len(tensors)} tensors, {n_params:,} parameters")
    for key in sorted(metadata):
        print(f"  {key} ({types[key]}) = {_summary(metadata[key])}")
    if args.tensors:
        for name, t in tensors.items():
            print(f"  tensor {name}: {t.type} {list(t.shape)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3", description="Speculative decoding with llama.cpp: "
                                     "EAGLE-3 and MTP sessions.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("check", help="check that an EAGLE-3 draft fits its target (exit 0 if so, 1 if not)",
                       description="Read both GGUF headers (no weights) and list every incompatibility.")
    p.add_argument("target", help="target model GGUF")
    p.add_argument("draft", help="EAGLE-3 draft GGUF")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=cmd_check)

    p = sub.add_parser("info", help="show a GGUF model's metadata",
                       description="Print a GGUF file's metadata (and tensors) without loading it.")
    p.add_argument("model", help="model GGUF")
    p.add_argument("--tensors", action="store_true", help="also list the tensors")
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.set_defaults(run=cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except Eagle3Error as e:
        print(f"eagle3 {args.command}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the output went to a pager or `head` that stopped reading
        sys.stdout = None
        return 0


if __name__ == "__main__":
    sys.exit(main())
