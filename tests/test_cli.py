"""The eagle3 command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import eagle3
from eagle3 import shipped
from eagle3.cli import main
from helpers import greedy


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3", *args], capture_output=True, text=True, timeout=600)


def test_generate_json(chain_pair, capsys):
    target, draft = chain_pair
    assert main(["generate", "speculative", "-n", "24", "--target", str(target), "--draft", str(draft),
                 "--compare", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    with eagle3.Model(target) as model:
        assert result["tokens"] == greedy(model, model.tokenize("speculative"), 24)
    assert result["finish_reason"] == "length"
    assert result["plain"]["identical"] is True and result["speedup"] > 0
    assert {"acceptance_rate", "mean_accepted_length", "tokens_per_s"} <= set(result["stats"])


def test_generate_text_output(chain_pair):
    target, draft = chain_pair
    result = run_cli("generate", "abc", "-n", "8", "--target", str(target), "--draft", str(draft))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("abc") and "acceptance" in result.stderr and "tau" in result.stderr


def test_generate_says_when_auto_decoded_plainly(tiny_pair, capsys):
    target, draft = tiny_pair  # drafts are almost never accepted
    assert main(["generate", "abc", "-n", "40", "--target", str(target), "--draft", str(draft)]) == 0
    err = capsys.readouterr().err
    assert "n_draft_max=auto decoded" in err and "rounds plainly" in err
    assert main(["generate", "abc", "-n", "40", "--target", str(target), "--draft", str(draft),
                 "--n-draft-max", "4"]) == 0
    assert "plainly" not in capsys.readouterr().err


def test_bench_table_and_plot(chain_pair, tmp_path):
    pytest.importorskip("matplotlib")
    target, draft = chain_pair
    plot = tmp_path / "acceptance.png"
    result = run_cli("bench", "--prompt", "abc", "-n", "16", "--n-draft", "2", "4", "--target", str(target),
                     "--draft", str(draft), "--plot", str(plot))
    assert result.returncode == 0, result.stderr
    assert "n_draft_max" in result.stdout and "speedup" in result.stdout
    assert plot.stat().st_size > 1000


def test_bench_json(chain_pair, capsys):
    target, draft = chain_pair
    assert main(["bench", "--prompt", "abc", "-n", "8", "--n-draft", "3", "--target", str(target), "--draft",
                 str(draft), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["n_draft_max"] == 3 and len(row["acceptance_per_position"]) == 3
    assert row["tau"] > 1.2 and row["acceptance_per_position"][0] > 0  # the chain pair's drafts are accepted


def test_check_and_info(tiny_pair, capsys):
    target, draft = tiny_pair
    assert main(["check", str(target), str(draft)]) == 0
    assert "compatible: yes" in capsys.readouterr().out
    assert main(["check", str(draft), str(target)]) == 1  # swapped
    assert "compatible: no" in capsys.readouterr().out
    assert main(["info", str(draft), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "eagle3.target_layers" in out and "tensor fc.weight" in out


def test_errors_are_one_line(tiny_pair):
    result = run_cli("generate", "x", "--target", str(tiny_pair[0]))
    assert result.returncode == 1 and "needs --draft" in result.stderr
    result = run_cli("check", "/no/such.gguf", str(tiny_pair[1]))
    assert result.returncode == 2 and "Traceback" not in result.stderr  # a file error: 2, as usage errors


def test_generate_with_the_shipped_pair():
    """The shipped draft is trained: it must be accepted far more often than chance."""
    assert shipped.TOY_TARGET.is_file() and shipped.TOY_DRAFT.is_file()
    result = run_cli("generate", "def fibonacci(n):", "-n", "64", "--n-draft-max", "4", "--compare", "--json",
                     "--pair", "toy")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert len(out["tokens"]) == 64 and out["plain"]["identical"]
    assert out["stats"]["mean_accepted_length"] > 2.0


def test_generate_with_the_default_pair():
    """The README's first command: SmolLM2-135M-Instruct (fetched once into the cache) and its head,
    a chat prompt the head never saw; greedy speculation gives plain decoding's answer."""
    result = run_cli("generate", "How do submarines dive and come back up?", "-n", "48", "--n-draft-max", "4",
                     "--compare", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["prompt"].startswith("<|im_start|>") and out["plain"]["identical"]
    assert len(out["text"]) > 40 and out["stats"]["mean_accepted_length"] > 1.15


def test_bench_on_held_out_prompts():
    result = run_cli("bench", "--prompts", "2", "-n", "32", "--n-draft", "2", "4", "--json", "--pair", "toy")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["n_draft_max"] for r in rows] == [2, 4]
    for r in rows:
        assert r["tau"] > 1.5 and len(r["acceptance_per_position"]) == r["n_draft_max"]
        assert r["tokens_per_s"] > 0 and r["plain_tokens_per_s"] > 0


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.startswith(f"eagle3 {eagle3.__version__}")


@pytest.mark.parametrize("args", [["generate", "x", "-n", "abc"], ["generate", "x", "--n-draft-max", "zz"],
                                  ["generate", "x", "-n", "0"], ["generate", "x", "--threads", "-2"],
                                  ["bench", "--n-draft", "0"], ["generate", "x", "--temperature", "hot"]])
def test_bad_option_values_are_one_line_usage_errors(args):
    result = run_cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "error: argument" in result.stderr.splitlines()[-1]


def test_check_exit_codes(pair_paths, tmp_path):
    target, draft = pair_paths["random"]
    assert run_cli("check", str(target), str(draft)).returncode == 0
    assert run_cli("check", str(target), str(target)).returncode == 1  # a llama model is not a draft
    missing = run_cli("check", str(target), str(tmp_path / "nope.gguf"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert run_cli("check", str(target)).returncode == 2  # usage


def test_generate_reads_the_prompt_from_stdin_and_prints_prompt_and_text_joined(chain_pair):
    target, draft = chain_pair
    result = subprocess.run([sys.executable, "-m", "eagle3", "generate", "-", "-n", "8", "--target", str(target),
                             "--draft", str(draft), "--json"], input="abc", capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["prompt"] == "abc"
    text = run_cli("generate", "abc", "-n", "8", "--target", str(target), "--draft", str(draft))
    assert text.stdout == "abc" + report["text"] + "\n"


def test_generate_with_a_chat_template_a_schema_and_rejection(chain_pair, tmp_path, capsys):
    from gguf_edit import T, rewrite
    from gguf_edit import CHATML

    target, draft = chain_pair
    chat = rewrite(target, tmp_path / "chat.gguf", set_kv={"tokenizer.chat_template": (CHATML, T.STRING)})
    assert main(["generate", "hi", "-n", "8", "--chat", "--target", str(chat), "--draft", str(draft), "--json",
                 "--temperature", "0.8", "--verify", "rejection", "--seed", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["prompt"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert main(["generate", "hi", "--chat", "--target", str(target), "--draft", str(draft)]) == 1
    assert "no chat template" in capsys.readouterr().err
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "nothing-known"}')
    assert main(["generate", "x", "--json-schema", str(schema), "--target", str(target), "--draft", str(draft)]) == 1
    assert "JSON schema" in capsys.readouterr().err


@pytest.mark.parametrize("drafter, extra", [("ngram", ["--ngram", "size_n=2", "--ngram", "size_m=4"]),
                                            ("ngram-cache", []), ("ngram-mod", ["--ngram", "n_match=2"])])
def test_generate_with_an_ngram_drafter(chain_pair, capsys, drafter, extra):
    target, _ = chain_pair
    assert main(["generate", "speculative speculative", "-n", "16", "--target", str(target), "--drafter", drafter,
                 *extra, "--compare", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    with eagle3.Model(target) as model:
        assert result["tokens"] == greedy(model, model.tokenize("speculative speculative"), 16)
    assert result["plain"]["identical"] is True


def test_generate_with_a_draft_model(chain_pair, capsys):
    target, _ = chain_pair
    # the target itself as its own draft model: the same vocabulary, every draft accepted
    assert main(["generate", "abc", "-n", "12", "--target", str(target), "--drafter", "draft", "--draft",
                 str(target), "--n-draft-max", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["stats"]["acceptance_rate"] == 1.0


@pytest.mark.parametrize("args, message", [
    (["--drafter", "draft"], "needs --draft"),
    (["--drafter", "ngram", "--draft", "x.gguf"], "takes no --draft"),
    (["--drafter", "eagle3", "--ngram", "size_n=3"], "--ngram"),
    (["--drafter", "ngram", "--ngram", "n_match=3"], "n_match"),
])
def test_drafter_option_errors(chain_pair, capsys, args, message):
    target, _ = chain_pair
    assert main(["generate", "abc", "-n", "4", "--target", str(target), *args]) == 1
    assert message in capsys.readouterr().err


def test_a_drafter_other_than_eagle3_needs_a_target(capsys):
    assert main(["generate", "abc", "--drafter", "ngram"]) == 1
    assert "--target" in capsys.readouterr().err
