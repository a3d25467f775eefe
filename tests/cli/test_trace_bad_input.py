"""Issue 23, part 3: ``memlab trace --hf-config F`` answers every bad config file and every option it cannot honour
with ONE ``memlab: error:`` line and exit 2: no traceback, no hang (a FIFO), no endless read (/dev/full), no
transformers warning before the line, and no option silently ignored (a preset beside the config, ``--gpu``,
``--zero 3 --world-size 2``, a sequence past a learned position table)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memlab import cli

pytest.importorskip("transformers")

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}
GPT2_64 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 64}
FILES: dict[str, bytes] = {
    "ok": json.dumps(LLAMA).encode(),
    "gpt2_64": json.dumps(GPT2_64).encode(),
    "list": b"[1, 2]",
    "null": b"null",
    "empty": b"",
    "comments": b'{"model_type": "llama" // a comment\n}',
    "latin1": b'{"model_type": "llama", "name": "caf\xe9"}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "t5": json.dumps({"model_type": "t5", "d_model": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256}).encode(),
    "hidden0": json.dumps({**LLAMA, "hidden_size": 0}).encode(),
    "heads5": json.dumps({**LLAMA, "num_attention_heads": 5, "num_key_value_heads": 5}).encode(),
    "gpt2_heads5": json.dumps({**GPT2_64, "n_head": 5}).encode(),
    "string_size": json.dumps({**LLAMA, "hidden_size": "64"}).encode(),
    "no_type": json.dumps({"hidden_size": 64}).encode(),
    "bad_type": json.dumps({**LLAMA, "model_type": "no-such-family"}).encode(),
}


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    for name, data in FILES.items():
        (tmp_path / f"{name}.json").write_bytes(data)
    return tmp_path


SMALL = ["--seq", "32", "--batch", "1"]
CASES: list[tuple[list[str], str]] = [
    (["--hf-config", "{d}/list.json", *SMALL], "JSON list"),
    (["--hf-config", "{d}/null.json", *SMALL], "JSON null"),
    (["--hf-config", "{d}/empty.json", *SMALL], "not valid JSON"),
    (["--hf-config", "{d}/comments.json", *SMALL], "no comments"),
    (["--hf-config", "{d}/latin1.json", *SMALL], "not UTF-8"),
    (["--hf-config", "{d}/deep.json", *SMALL], "nests deeper"),
    (["--hf-config", "{d}/t5.json", *SMALL], "no causal LM"),
    (["--hf-config", "{d}/hidden0.json", *SMALL], "hidden_size must be >= 1"),
    (["--hf-config", "{d}/heads5.json", *SMALL], "not a multiple of the number of attention heads"),
    (["--hf-config", "{d}/gpt2_heads5.json", *SMALL], "must divide hidden_size"),
    (["--hf-config", "{d}/string_size.json", *SMALL], "expected int"),
    (["--hf-config", "{d}/no_type.json", *SMALL], "model_type"),
    (["--hf-config", "{d}/bad_type.json", *SMALL], "unknown Hugging Face model type"),
    (["--hf-config", "{d}/missing.json", *SMALL], "no config file"),
    (["--hf-config", "{d}", *SMALL], "no config file"),  # a folder without config.json
    (["--hf-config", "/dev/null", *SMALL], "not a regular file"),
    (["--hf-config", "{d}/ok.json", "--preset", "gpt2", *SMALL], "--preset would be ignored"),
    (["tiny-gpt", "--hf-config", "{d}/ok.json", *SMALL], "--preset would be ignored"),
    (["--hf-config", "{d}/ok.json", "--d-model", "64", "--n-heads", "4", *SMALL], "--d-model, --n-heads"),
    (["--hf-config", "{d}/ok.json", "--params", "7e9", *SMALL], "--params"),
    (["--hf-config", "{d}/ok.json", "--max-seq", "64", *SMALL], "--max-seq"),
    (["{d}/ok.json", "--hf-config", "{d}/ok.json", *SMALL], "once"),
    (["--hf-config", "{d}/ok.json", "--zero", "1", "--world-size", "2", *SMALL], "zero_stage=2 or 3"),
    (["--hf-config", "{d}/ok.json", "--mode", "inference", *SMALL], "training step"),
    (["--hf-config", "{d}/ok.json", "--recompute", "selective", *SMALL], "selective"),
    (["--hf-config", "{d}/gpt2_64.json"], "max_position_embeddings=64"),  # the default seq 1024
    (["--hf-config", "{d}/gpt2_64.json", "--seq", "65", "--batch", "1"], "at most 64"),
    (["x" * 5000, *SMALL], "unknown preset"),
    (["--hf-config", "x" * 5000 + ".json", *SMALL], "cannot read the config"),
    (["tiny-gpt", "--fragmentation", "0.1", *SMALL], "--fragmentation"),
    (["tiny-gpt", "--cuda-context-mib", "300", *SMALL], "--cuda-context-mib"),
]


@pytest.mark.parametrize(("argv", "hint"), CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_trace_input_is_one_line_and_exit_2(configs: Path, argv: list[str], hint: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["trace", *(a.format(d=configs) for a in argv)])
    out, err = capsys.readouterr()
    assert code == 2, f"exit {code}; stdout {out[:300]!r}; stderr {err[:300]!r}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memlab: error: "), err
    assert hint in lines[0], lines[0]
    assert "Traceback" not in err and not out


def test_gpu_gives_a_verdict_from_the_traced_peak(configs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["trace", "--hf-config", str(configs / "ok.json"), *SMALL, "--gpu", "h100-sxm"]) == 0
    assert "verdict: FITS on NVIDIA H100" in capsys.readouterr().out
    assert cli.main(["trace", "tiny-gpt", *SMALL, "--gpu", "h100-sxm", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["verdict"]["fits"] is True and d["verdict"]["peak_bytes"] == d["peak_bytes"]
    assert d["verdict"]["headroom_bytes"] == d["verdict"]["capacity_bytes"] - d["peak_bytes"]
    assert cli.main(["trace", "tiny-gpt", *SMALL, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] is None


def test_a_learned_position_table_as_long_as_seq_traces(configs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["trace", "--hf-config", str(configs / "gpt2_64.json"), "--seq", "64", "--batch", "1"]) == 0
    assert "<- peak" in capsys.readouterr().out


# -- through a real process: a FIFO must not block, /dev/full must not be read, warnings must not precede -------
def _memlab(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "memlab", "trace", *argv], env=env, timeout=120,
                          capture_output=True, text=True)


@pytest.mark.parametrize("what", ["fifo", "/dev/full", "gpt2_64"])
def test_in_a_process_one_line_and_no_hang(configs: Path, what: str) -> None:
    if what == "fifo":
        path = configs / "config.json"
        os.mkfifo(path)
    elif what.startswith("/dev/"):
        if not Path(what).exists():
            pytest.skip(f"no {what}")
        path = Path(what)
    else:
        path = configs / f"{what}.json"  # tiny vocab: transformers would warn about the token ids first
    proc = _memlab("--hf-config", str(path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith("memlab: error: ") and not proc.stdout
