"""A child interpreter that loads and uses the model files it is sent, one per line.

It answers ``ok`` or ``error <class>``; if llama.cpp ever aborted, the
parent would see the pipe close and know which file did it.
"""

from __future__ import annotations

import sys

import eagle3


def exercise(path: str, target: eagle3.Model) -> None:
    with eagle3.Model(path) as model:
        if model.architecture == "eagle3":
            with eagle3.Context(target) as tctx, eagle3.Context(model, other=tctx) as dctx, \
                    eagle3.Eagle3Session(tctx, dctx, n_draft_max=3) as session:
                batch = eagle3.Batch.from_tokens([1, 2, 3])
                tctx.decode(batch)
                session.process(batch)
                session.draft(0, 3, 1)
        else:
            if model.n_vocab:
                model.tokenize("hello world")
            with eagle3.Context(model) as ctx:
                ctx.decode(eagle3.Batch.from_tokens([0, 1, 2]))
                ctx.logits(-1)


def main() -> None:
    target = eagle3.Model(sys.argv[1])
    for line in sys.stdin:
        path = line.strip()
        try:
            exercise(path, target)
            reply = "ok"
        except eagle3.Eagle3Error as e:
            reply = f"error {type(e).__name__}"
        except Exception as e:  # not an eagle3 error: report it, the test fails
            reply = f"foreign {type(e).__name__}: {e}"
        print(reply, flush=True)


if __name__ == "__main__":
    main()
