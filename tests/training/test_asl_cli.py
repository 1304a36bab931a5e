"""The command line: a synthetic dataset, a short training run, verification, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.asl.__main__ import main


def test_cli_trains_verifies_and_names_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "demo.zip"
    assert main(["synthetic", str(data), "--signs", "3", "--participants", "3", "--per-participant", "2"]) == 0
    spec = {"dim": 32, "blocks": 1, "epochs": 1, "max_len": 16, "batch_size": 6, "grad_accumulation": 1}
    assert main(["train", str(data), str(tmp_path / "out"), "--spec", json.dumps(spec)]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(trained) == {"val_top1", "val_top5", "val_loss", "epochs_run"}
    assert trained["epochs_run"] == 1
    assert main(["verify", str(tmp_path / "out"), str(data)]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 18

    assert main(["train", str(data), str(tmp_path / "x"), "--spec", '{"epochz": 1}']) == 2
    assert capsys.readouterr().err == "error: unknown spec field(s): epochz\n"
    assert main(["verify", str(tmp_path / "out"), str(tmp_path / "missing.zip")]) == 2
    assert "missing.zip: no such dataset folder or zip file" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "nothing"), str(data)]) == 2
    assert "config.json: file not found" in capsys.readouterr().err
