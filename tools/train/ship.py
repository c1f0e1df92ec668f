"""Convert a trained pair to the GGUF files that ship inside eagle3.

    python tools/train/ship.py build/pair

Writes src/eagle3/models/pystdlib-target-q8_0.gguf and
pystdlib-eagle3-q8_0.gguf (q8_0: the pair fits the package's 25 MB budget),
copies the recipe's settings.json and losses.json next to them, and
refreshes the held-out prompts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from eagle3.convert import convert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompts import held_out_prompts  # noqa: E402

MODELS = Path(__file__).resolve().parents[2] / "src" / "eagle3" / "models"
BUDGET = 25 * 1024 * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trained", type=Path, help="the output folder of train_pair.py")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target, draft, report = convert(args.trained / "target", args.trained / "draft", tmp, outtype="q8_0",
                                        name="pystdlib")
        MODELS.mkdir(parents=True, exist_ok=True)
        shipped = [MODELS / "pystdlib-target-q8_0.gguf", MODELS / "pystdlib-eagle3-q8_0.gguf"]
        for src, dst in zip((target, draft), shipped):
            shutil.copyfile(src, dst)
    for name in ("settings.json", "losses.json"):
        shutil.copyfile(args.trained / name, MODELS / name)
    (MODELS / "held_out_prompts.json").write_text(json.dumps(held_out_prompts(24), indent=1) + "\n")
    size = sum(p.stat().st_size for p in shipped)
    print(report)
    print(f"shipped {size / 2**20:.1f} MB (budget {BUDGET / 2**20:.0f} MB)")
    if size > BUDGET or not report.ok:
        raise SystemExit("the shipped pair is over budget or incompatible")


if __name__ == "__main__":
    main()
