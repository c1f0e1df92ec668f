"""Train the shipped target / EAGLE-3 pair from scratch, on 2 CPU cores.

    pip install ".[train]"
    python tools/train/train_pair.py --out build/pair          # about 2 hours
    python tools/train/train_pair.py --out build/quick --quick # minutes, for a check
    python tools/train/train_pair.py --out build/pair --reuse-target  # the draft only

1. A SentencePiece BPE tokenizer (4096 pieces, byte fallback, whitespace
   kept) on the Python standard library's source files, minus a held-out 5%
   chosen by a hash of each file's path.
2. A Llama-architecture target (Hugging Face LlamaForCausalLM, ~19M
   parameters) trained on those files.
3. An EAGLE-3 draft head for it (eagle3.train.head): features of
   three target layers fused by ``fc``, one decoder layer, trained by
   distillation from the target's next-token distribution with a
   training-time test over several draft steps.

Seeds are fixed. ``settings.json`` and ``losses.json`` are written next to
the two Hugging Face checkpoints (``target/`` and ``draft/``), which
``eagle3 convert`` turns into GGUF files.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
from eagle3.train.head import DraftConfig, Eagle3Draft, save  # noqa: E402


@dataclass
class Settings:
    seed: int = 1234
    threads: int = 2
    vocab_size: int = 4096
    # target
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_layers: int = 10
    num_heads: int = 6
    num_kv_heads: int = 2
    seq_len: int = 256
    batch_size: int = 16
    target_steps: int = 1000
    target_lr: float = 1.5e-3
    # draft
    draft_vocab_size: int = 1536
    draft_heads: int = 6
    draft_kv_heads: int = 2
    draft_intermediate_size: int = 1024
    ttt_steps: int = 5
    step_weight_decay: float = 0.8
    draft_batch_size: int = 16
    draft_steps: int = 700
    draft_lr: float = 1.5e-3
    eval_sequences: int = 48

    @property
    def aux_layers(self) -> tuple[int, int, int]:
        return (2, self.num_layers // 2, self.num_layers - 3)


QUICK = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=2, num_kv_heads=1,
             seq_len=64, batch_size=4, target_steps=30, draft_vocab_size=256, draft_heads=2, draft_kv_heads=1,
             draft_intermediate_size=128, draft_batch_size=4, draft_steps=20, ttt_steps=3, eval_sequences=4)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- data ---------------------------------------------------------------------

def train_tokenizer(files: list[Path], out: Path, s: Settings) -> "sentencepiece.SentencePieceProcessor":
    import sentencepiece as spm

    text = out / "tokenizer-training.txt"
    with text.open("w", encoding="utf-8") as f:
        for path in files:
            for line in corpus.read(path).splitlines():
                if line.strip():
                    f.write(line + "\n")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(out / "tokenizer"), vocab_size=s.vocab_size, model_type="bpe",
        character_coverage=1.0, byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, split_digits=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, input_sentence_size=2_000_000, shuffle_input_sentence=False,
        max_sentence_length=4096, num_threads=s.threads, minloglevel=2)
    text.unlink()
    return spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))


def encode(sp, files: list[Path]) -> np.ndarray:
    """Every file as <s> tokens </s>, one stream."""
    ids: list[int] = []
    for path in files:
        ids += [sp.bos_id(), *sp.encode(corpus.read(path)), sp.eos_id()]
    return np.array(ids, dtype=np.int64)


def batches(stream: np.ndarray, batch: int, length: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(stream) - length - 1, batch)
        yield torch.from_numpy(np.stack([stream[s:s + length] for s in starts]))


def eval_windows(stream: np.ndarray, count: int, length: int) -> torch.Tensor:
    starts = np.linspace(0, len(stream) - length - 1, count).astype(int)
    return torch.from_numpy(np.stack([stream[s:s + length] for s in starts]))


def lr_at(step: int, total: int, peak: float, warmup: int = 50) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return 0.1 * peak + 0.9 * peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


# -- target -------------------------------------------------------------------

def train_target(train: np.ndarray, held: torch.Tensor, s: Settings, out: Path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=s.vocab_size, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
                         num_hidden_layers=s.num_layers, num_attention_heads=s.num_heads,
                         num_key_value_heads=s.num_kv_heads, max_position_embeddings=2048, rms_norm_eps=1e-5,
                         rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=s.target_lr, betas=(0.9, 0.95), weight_decay=0.1)
    data = batches(train, s.batch_size, s.seq_len, np.random.default_rng(s.seed))
    curve = []
    t0 = time.time()
    for step in range(s.target_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s.target_steps, s.target_lr)
        x = next(data)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        curve.append(loss.item())
        if step % 50 == 0 or step == s.target_steps - 1:
            log(f"target step {step}/{s.target_steps}: loss {np.mean(curve[-50:]):.3f} ({time.time() - t0:.0f} s)")
    held_loss = held_out_loss(model, held)
    model.save_pretrained(out / "target", safe_serialization=True)
    return model, {"train_loss_last_50": float(np.mean(curve[-50:])), "held_out_loss": held_loss,
                   "curve": [float(np.mean(curve[i:i + 50])) for i in range(0, len(curve), 50)],
                   "seconds": time.time() - t0}


def held_out_loss(model, held: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        loss = float(np.mean([model(input_ids=held[i:i + 8], labels=held[i:i + 8]).loss.item()
                              for i in range(0, len(held), 8)]))
    log(f"target held-out loss {loss:.3f}")
    return loss


def load_target(held: torch.Tensor, out: Path):
    """The target of an earlier run; its training report is kept if that run wrote one."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(out / "target", torch_dtype=torch.float32)
    saved = out / "target_report.json"
    report = json.loads(saved.read_text()) if saved.exists() else {"reused": str(out / "target")}
    report["held_out_loss"] = held_out_loss(model, held)
    return model, report


def write_tokenizer_files(target_dir: Path, tokenizer_model: Path) -> None:
    (target_dir / "tokenizer.model").write_bytes(tokenizer_model.read_bytes())
    (target_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "legacy": True,
    }, indent=2) + "\n")


# -- draft --------------------------------------------------------------------

@torch.no_grad()
def target_pass(target, x: torch.Tensor, aux: tuple[int, int, int]):
    """Fused features of the aux layers and the target's next-token probabilities."""
    out = target(input_ids=x, output_hidden_states=True)
    features = torch.cat([out.hidden_states[i] for i in aux], -1)
    return features, out.logits.float()


def draft_losses(draft: Eagle3Draft, target, x: torch.Tensor, s: Settings):
    """Per-step distillation losses and greedy agreement of the training-time test."""
    features, target_logits = target_pass(target, x, s.aux_layers)
    n = x.shape[1] - s.ttt_steps - 1
    emb = target.get_input_embeddings()
    # step j at position p reads token x[p + 1 + j] and predicts the target's choice after it
    tokens = torch.stack([x[:, 1 + j: 1 + j + n] for j in range(s.ttt_steps)], 1)
    logits = draft.forward_ttt(emb(tokens), features[:, :n], s.ttt_steps)
    losses, agree = [], []
    for j, step_logits in enumerate(logits):
        teacher = target_logits[:, 1 + j: 1 + j + n]
        probs = torch.softmax(teacher[..., draft.d2t], -1)  # the target's distribution on the draft vocabulary
        losses.append(-(probs * torch.log_softmax(step_logits, -1)).sum(-1).mean())
        agree.append((draft.d2t[step_logits.argmax(-1)] == teacher.argmax(-1)).float().mean().item())
    return losses, agree


def train_draft(target, train: np.ndarray, held: torch.Tensor, s: Settings, out: Path):
    counts = np.bincount(train, minlength=s.vocab_size)
    d2t = torch.from_numpy(np.sort(np.argsort(-counts, kind="stable")[:s.draft_vocab_size]))
    cfg = DraftConfig(hidden_size=s.hidden_size, target_hidden_size=s.hidden_size, num_attention_heads=s.draft_heads,
                      num_key_value_heads=s.draft_kv_heads, intermediate_size=s.draft_intermediate_size,
                      vocab_size=s.vocab_size, draft_vocab_size=s.draft_vocab_size, aux_layers=s.aux_layers)
    draft = Eagle3Draft(cfg, d2t)
    for p in draft.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    with torch.no_grad():  # start from the target's own head and final norm
        draft.lm_head.weight.copy_(target.lm_head.weight[d2t])
        draft.norm.weight.copy_(target.model.norm.weight)
    for p in target.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(draft.parameters(), lr=s.draft_lr, betas=(0.9, 0.95), weight_decay=0.0)
    data = batches(train, s.draft_batch_size, s.seq_len, np.random.default_rng(s.seed + 1))
    weights = [s.step_weight_decay ** j for j in range(s.ttt_steps)]
    curve = []
    t0 = time.time()
    for step in range(s.draft_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s.draft_steps, s.draft_lr)
        losses, agree = draft_losses(draft, target, next(data), s)
        loss = sum(w * l for w, l in zip(weights, losses)) / sum(weights)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        curve.append([l.item() for l in losses] + agree)
        if step % 50 == 0 or step == s.draft_steps - 1:
            recent = np.mean(curve[-50:], 0)
            log(f"draft step {step}/{s.draft_steps}: losses {np.round(recent[:s.ttt_steps], 3).tolist()} "
                f"agreement {np.round(recent[s.ttt_steps:], 3).tolist()} ({time.time() - t0:.0f} s)")
    draft.eval()
    with torch.no_grad():
        results = [draft_losses(draft, target, held[i:i + 8], s) for i in range(0, len(held), 8)]
    held_losses = np.mean([[l.item() for l in r[0]] for r in results], 0)
    held_agree = np.mean([r[1] for r in results], 0)
    log(f"draft held-out losses {np.round(held_losses, 3).tolist()}, agreement {np.round(held_agree, 3).tolist()}")
    save(draft, out / "draft")
    return {"held_out_step_losses": held_losses.tolist(), "held_out_step_agreement": held_agree.tolist(),
            "curve_step_losses": [np.mean([c[:s.ttt_steps] for c in curve[i:i + 50]], 0).tolist()
                                  for i in range(0, len(curve), 50)],
            "seconds": time.time() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--quick", action="store_true", help="a tiny model and a few steps, to check the recipe")
    parser.add_argument("--reuse-target", action="store_true",
                        help="load OUT/target (trained by an earlier run with the same settings) "
                             "and train only the draft")
    args = parser.parse_args()
    s = Settings(**QUICK) if args.quick else Settings()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    random.seed(s.seed)
    np.random.seed(s.seed)
    torch.manual_seed(s.seed)
    torch.set_num_threads(s.threads)
    started = time.time()

    train_files, held_files = corpus.split()
    log(f"corpus: {len(train_files)} training files, {len(held_files)} held out")
    if args.reuse_target:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    else:
        sp = train_tokenizer(train_files, out, s)
    train, held = encode(sp, train_files), encode(sp, held_files)
    log(f"tokens: {len(train):,} training, {len(held):,} held out")
    held_windows = eval_windows(held, s.eval_sequences, s.seq_len)

    if args.reuse_target:
        target, target_report = load_target(held_windows, out)
    else:
        target, target_report = train_target(train, held_windows, s, out)
        (out / "target_report.json").write_text(json.dumps(target_report, indent=2) + "\n")
    write_tokenizer_files(out / "target", out / "tokenizer.model")
    draft_report = train_draft(target, train, held_windows, s, out)

    (out / "settings.json").write_text(json.dumps({
        **asdict(s), "aux_layers": list(s.aux_layers), "torch": torch.__version__,
        "training_files": len(train_files), "held_out_files": [str(p.name) for p in held_files],
        "training_tokens": int(len(train)), "held_out_tokens": int(len(held)),
    }, indent=2) + "\n")
    (out / "losses.json").write_text(json.dumps({"target": target_report, "draft": draft_report,
                                                 "total_seconds": time.time() - started}, indent=2) + "\n")
    log(f"done in {time.time() - started:.0f} s: {out}/target and {out}/draft")


if __name__ == "__main__":
    main()
