"""memlab oom: a pasted message, a log file's last message or stdin decoded; anything else one error line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from memlab import cli
from memlab.measure.oom_examples import RECORDED_OOM_MESSAGES

FRAGMENTED = RECORDED_OOM_MESSAGES[0].message  # 0.02 GiB asked, 0.01 free, 0.19 reserved but unallocated


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_pasted_message_gets_its_kind_what_to_try_and_its_fields(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "oom", FRAGMENTED)
    assert code == 0 and not err
    assert out.startswith("kind: fragmentation candidate") and "expandable_segments:True" in out
    assert "tried_to_allocate_bytes" in out and "reserved_unallocated_bytes" in out


def test_a_log_file_gives_its_last_message(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    too_big = next(r.message for r in RECORDED_OOM_MESSAGES if "22.78 GiB" in r.message)
    log = tmp_path / "train.log"
    log.write_text(f"step 1\n{FRAGMENTED}\n\nstep 2\nTraceback (most recent call last):\n{too_big}\n\nexit\n")
    code, out, _ = run(capsys, "oom", "--file", str(log), "--json")
    result = json.loads(out)
    assert code == 0 and result["fields"][0]["GiB"] == pytest.approx(22.78, abs=0.005)
    assert result["kind"] != "fragmentation candidate"


def test_stdin_is_read_with_a_dash(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(FRAGMENTED))
    assert run(capsys, "oom", "-")[1].startswith("kind: fragmentation candidate")


@pytest.mark.parametrize("argv", [["oom", "RuntimeError: shape mismatch"], ["oom", "--file", "/no/such/log"],
                                  ["oom", "x", "--file", "y"]])
def test_input_that_is_not_an_oom_message_is_one_error_line(capsys: pytest.CaptureFixture[str],
                                                           argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and not out and err.count("\n") == 1 and err.startswith("memlab: error: ")


def test_with_a_model_and_a_card_it_prints_the_levers_estimate_gives(capsys: pytest.CaptureFixture[str]) -> None:
    setup = ["--preset", "gpt2", "--batch", "16", "--seq", "1024", "--gpu", "t4"]
    code, out, _ = run(capsys, "oom", FRAGMENTED, *setup, "--json")
    got = json.loads(out)
    code2, est, _ = run(capsys, "estimate", *setup, "--levers", "--json")
    assert code == code2 == 0 and got["kind"] == "fragmentation candidate"
    assert got["levers"]["levers"] == json.loads(est)["levers"] and got["levers"]["to_fit"]["levers"]
    code, out, _ = run(capsys, "oom", FRAGMENTED, *setup)
    assert code == 0 and "levers, ranked by the device-used peak" in out and "to fit, switch on:" in out


def test_a_model_without_a_card_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "oom", FRAGMENTED, "--preset", "gpt2")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--gpu" in err
