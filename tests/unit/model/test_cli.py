"""The CLI as a person runs it: real output, one-line errors with exit status 2.

A real process (`python -m athanor`) for the chat answer and for one error, which is what the process adds: the
entry point, its exit status, no traceback. The other commands run through `athanor.cli.main` in this process,
as the entry point calls it, sparing each a Python and torch start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from athanor.cli import main


def athanor(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m athanor ARGS` in a process of its own."""
    return subprocess.run([sys.executable, "-m", "athanor", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """`cli(*args)`: `athanor ARGS` through `main`, as (exit status, stdout, stderr); a usage error is status 2."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's own errors exit, as they do in a process
            code = int(e.code or 0)
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(["athanor", *args], code, captured.out, captured.err)

    return run


def assert_one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_chat_answer_contains_paris(smollm2) -> None:
    done = athanor("generate", "--model", "smollm2-135m", "--chat", "--prompt", "What is the capital of France?",
                   "--max-new-tokens", "24")
    assert done.returncode == 0, done.stderr
    text, stats = done.stdout.strip().rsplit("\n", 1)
    assert "Paris" in text
    assert "prefill:" in stats and "decode:" in stats and "tok/s" in stats


def test_sampling_is_seeded(smollm2, cli) -> None:
    args = ("generate", "--prompt", "Once upon a time", "--max-new-tokens", "12", "--temperature", "0.9",
            "--top-p", "0.95")
    a, b, c = cli(*args, "--seed", "1"), cli(*args, "--seed", "1"), cli(*args, "--seed", "2")
    first = [d.stdout.splitlines()[0] for d in (a, b, c)]
    assert first[0] == first[1] and first[0] != first[2]


def test_models_lists_presets(cli) -> None:
    done = cli("models")
    assert done.returncode == 0
    for name in ("smollm2-135m", "llama-3.2-1b", "llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b", "tiny-moe"):
        assert name in done.stdout


def test_save_random_writes_a_loadable_hf_directory(tmp_path: Path, cli) -> None:
    done = cli("save-random", "tiny-qwen", str(tmp_path / "m"), "--seed", "7")
    assert done.returncode == 0, done.stderr
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["torch_dtype"] == "bfloat16"
    from athanor.model.registry import load_model

    model = load_model(str(tmp_path / "m"))
    assert model.spec.num_layers == 3 and model.spec.qk_norm
    # a preset no HF class computes (test_hf_parity) is refused in one line, not written for HF to misread
    assert_one_line_error(cli("save-random", "tiny-moe", str(tmp_path / "moe")), "no HF class computes")


# -- bad input ---------------------------------------------------------------------------------------
def test_unknown_preset(cli) -> None:
    assert_one_line_error(athanor("generate", "--model", "llama-42b"), "unknown model 'llama-42b'")  # a process
    assert_one_line_error(cli("save-random", "nope", "/tmp/x"), "unknown model preset 'nope'")


def test_missing_weight_file(tmp_path: Path, cli) -> None:
    assert_one_line_error(cli("generate", "--model", str(tmp_path / "absent.gguf")), "absent.gguf",
                          "no such file")


def test_corrupt_weight_file(tmp_path: Path, cli) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 100)
    assert_one_line_error(cli("generate", "--model", str(bad)), "broken.gguf")


def test_config_and_weights_that_do_not_match(tmp_path: Path, cli) -> None:
    assert cli("save-random", "tiny-dense", str(tmp_path)).returncode == 0
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(cli("generate", "--model", str(tmp_path)), str(tmp_path), "do not match")


def test_prompt_longer_than_the_context(smollm2, cli) -> None:
    assert_one_line_error(cli("generate", "--prompt", "word " * 9000), "--prompt", "8192-token context")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu(cli, tmp_path: Path) -> None:
    assert_one_line_error(cli("generate", "--device", "cuda"), "--device cuda", "no CUDA device")
    assert cli("candidate", "new", "-o", str(tmp_path / "c.py")).returncode == 0
    for args in (("evaluate", str(tmp_path / "c.py"), "--model", "tiny-dense"), ("serve",),
                 ("bench", "decode", "--model", "tiny-dense"), ("bench", "prefill", "--model", "tiny-dense")):
        assert_one_line_error(cli(*args, "--device", "cuda"), "--device cuda", "no CUDA device")


def test_verbose_may_follow_the_command(cli) -> None:
    assert cli("traffic", "profile", "preset:chat", "-v").returncode == 0


def test_bad_flags(cli) -> None:
    assert_one_line_error(cli("generate", "--dtype", "int3"), "--dtype int3")
    assert_one_line_error(cli("generate", "--max-new-tokens", "0"), "--max-new-tokens 0")
    assert_one_line_error(cli("generate", "--max-new-tokens", "x"), "--max-new-tokens")


def test_generate_reads_its_prompt_from_standard_input(smollm2) -> None:
    done = subprocess.run([sys.executable, "-m", "athanor", "generate", "--max-new-tokens", "4"],
                          input="The capital of Italy is", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Rome" in done.stdout, done.stderr
    empty = subprocess.run([sys.executable, "-m", "athanor", "generate"], input="", capture_output=True, text=True,
                           timeout=300)
    assert_one_line_error(empty, "--prompt", "standard input was empty")


def test_help_shows_each_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "sequences served at once (KV slots per candidate) (default: 8)" in text
    assert "the port to listen on (default: 8000)" in text
    assert "(default: False)" not in text and "(default: )" not in text  # flags off and empty strings say nothing
    assert "(default: --model) (default" not in text  # a help that names its default is left as it is
