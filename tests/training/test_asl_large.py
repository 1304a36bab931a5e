"""A dataset over 512 MiB, generated as the platform hands it to a node (a folder of zip
shards), trains one short epoch and verifies on held-out participants: the trainer has no
size cap of its own."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from training.asl.run import run, verify
from training.asl.source import Source
from training.asl.synthetic import generate

MIB = 1024**2
SPEC = {
    "dim": 32,
    "blocks": 1,
    "max_len": 32,
    "epochs": 1,
    "batch_size": 32,
    "grad_accumulation": 1,
    "validation_fraction": 0.2,
    "seed": 0,
}


def share(folder: Path, target: Path, rows: list[str]) -> Path:
    """A dataset listing ``rows`` of ``folder``'s train.csv, on the same shards (hard links)."""
    target.mkdir()
    for path in folder.iterdir():
        if path.suffix == ".zip" or path.suffix == ".json":
            os.link(path, target / path.name)
    header = (folder / "train.csv").read_text().splitlines()[0]
    (target / "train.csv").write_text("\n".join([header, *rows]) + "\n")
    return target


@pytest.mark.slow
def test_a_dataset_over_512_mib_trains_and_verifies(tmp_path: Path) -> None:
    if shutil.disk_usage(tmp_path).free < 3 * 1024**3:
        pytest.skip("needs 3 GB of free disk")
    torch.set_num_threads(1)
    # Few, long sequences: the size comes cheap and an epoch stays short.
    full = generate(
        tmp_path / "full", n_signs=10, n_participants=7, per_participant=12, min_frames=40, max_frames=60, shards=6
    )
    rows = (full / "train.csv").read_text().splitlines()[1:]
    held = sorted({row.split(",")[1] for row in rows})[-1]
    training = share(full, tmp_path / "train", [r for r in rows if r.split(",")[1] != held])
    heldout = share(full, tmp_path / "heldout", [r for r in rows if r.split(",")[1] == held])

    with Source(training) as source:
        listed = [r.split(",")[0] for r in (training / "train.csv").read_text().splitlines()[1:]]
        assert sum(source.size(p) for p in listed) > 512 * MIB
        assert len(source.shards) == 6

    out = tmp_path / "out"
    metrics = run(SPEC, training, out, cache_dir=tmp_path / "cache", max_steps_per_epoch=8, export_onnx=True)
    assert metrics["train_sequences"] + metrics["val_sequences"] == len(listed) == 720
    assert metrics["epochs_run"] == 1
    assert metrics["onnx_max_abs_diff"] < 1e-4  # the export reads the competition's 543 points

    outcome = verify(out, heldout, cache_dir=tmp_path / "verify-cache")
    assert outcome["count"] == 120
    assert 0.0 <= outcome["top1"] <= outcome["top5"] <= 1.0
