"""A damaged ISLR zip is a DatasetError naming the member and the damage, wherever it is
read: when an inference task is posted (train.csv only), when the platform splits a training
archive, and in the worker's runners (every sequence). Never zipfile's, zlib's or csv's own
exception, which the platform would answer with a 500 and a worker report as a crash."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.training.damaged_zips import DAMAGES, INDEX_HEADER, archive, damaged, words
from training.asl import export
from training.asl.dataset import POOL_THRESHOLD, iter_sequences, load_dataset
from training.asl.infer import count_inputs
from training.asl.model import ModelConfig, SignModel
from training.asl.parquet import DatasetError
from training.asl.source import Source
from training.asl.split import prepare
from training.asl.synthetic import generate
from workers.agent import runners

SEQUENCES = 6


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The members of a small sound ISLR archive: six sequences of three participants (the
    held-out split needs three), train.csv and the sign map."""
    root = generate(tmp_path_factory.mktemp("islr") / "data", n_signs=2, n_participants=3, per_participant=1)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def sequence(files: dict[str, bytes]) -> str:
    """The member damaged below: one sequence file."""
    return sorted(p for p in files if p.endswith(".parquet"))[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained model's artifacts: enough for the inference runner to reach the data."""
    folder = tmp_path_factory.mktemp("model")
    export.save(folder, SignModel(ModelConfig(num_classes=2, dim=32, blocks=1, max_len=24)), ["thanks", "hello"])
    return folder


def infer_in_runner(model: Path, content: bytes, workdir: Path) -> Any:
    """The agent's asl_inference runner on ``content`` as the downloaded dataset."""
    workdir.mkdir()
    (workdir / "dataset.zip").write_bytes(content)

    def fetch(url: str, target: Path) -> None:
        shutil.copy(model / url.rstrip("/").rsplit("/", 1)[1], target)

    job = {"id": "0", "kind": "asl_inference", "spec": {"top_k": 1}, "dataset": {"format": "zip"}, "fetch": fetch}
    return runners.run(job, workdir, lambda *args: None)


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_train_csv_is_refused_at_posting_naming_it(
    files: dict[str, bytes], tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "in.zip"
    path.write_bytes(damaged(files, "train.csv", damage))
    with pytest.raises(DatasetError) as refused:
        count_inputs(path)
    assert str(refused.value).startswith(f"train.csv: {words(damage)}")


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_sequence_fails_the_split_training_and_inference_naming_it(
    files: dict[str, bytes], sequence: str, model: Path, tmp_path: Path, damage: str
) -> None:
    content = damaged(files, sequence, damage)
    path = tmp_path / "in.zip"
    path.write_bytes(content)
    expected = f"{sequence}: {words(damage)}"
    # Posting reads no sequence: the damage is found by whoever reads it first.
    assert count_inputs(path) == SEQUENCES
    with pytest.raises(DatasetError) as refused:  # the platform's held-out split
        prepare({"seed": 0}, path, tmp_path / "split", bytes(32))
    assert expected in str(refused.value)
    with pytest.raises(DatasetError) as refused:  # asl_training's loader, in the worker
        load_dataset(path, tmp_path / "cache")
    assert str(refused.value).startswith(expected)
    with pytest.raises(DatasetError) as refused:  # the asl_inference runner
        infer_in_runner(model, content, tmp_path / "work")
    assert str(refused.value).startswith(expected)
    # The sound archive passes all three.
    sound = tmp_path / "sound.zip"
    sound.write_bytes(archive(files))
    assert len(load_dataset(sound, tmp_path / "cache")) == SEQUENCES
    assert infer_in_runner(model, sound.read_bytes(), tmp_path / "sound-work").proof["sequences"] == SEQUENCES


def test_threaded_reading_reports_a_damaged_sequence_as_a_dataset_error(
    files: dict[str, bytes], sequence: str, tmp_path: Path
) -> None:
    path = tmp_path / "in.zip"
    path.write_bytes(damaged(files, sequence, "bad CRC"))
    paths = [p for p in files if p.endswith(".parquet")] * POOL_THRESHOLD
    with Source(path) as source, pytest.raises(DatasetError) as refused:
        list(iter_sequences(source, paths, workers=2))
    assert str(refused.value).startswith(f"{sequence}: is damaged in the archive (Bad CRC-32")


@pytest.mark.parametrize("line", [1, 2])
def test_a_csv_field_over_the_csv_limit_is_refused_naming_the_line(tmp_path: Path, line: int) -> None:
    long = b"a" * 131_073
    index = long + b"\n" if line == 1 else INDEX_HEADER + long + b",1,2,hello\n"
    path = tmp_path / "in.zip"
    path.write_bytes(archive({"train.csv": index, "a.parquet": b"not read"}))
    refusal = rf"^train\.csv line {line}: is not valid CSV \(field larger than field limit \(131072\)\)$"
    with pytest.raises(DatasetError, match=refusal):
        count_inputs(path)
    with pytest.raises(DatasetError, match=refusal):
        load_dataset(path, tmp_path / "cache")


def test_an_index_over_its_bound_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """train.csv is read whole in the web process at posting: its declared size is checked
    first, so an archive cannot make the platform decompress gigabytes into memory."""
    from training.asl import dataset

    monkeypatch.setattr(dataset, "INDEX_MAX_BYTES", 1000)
    path = tmp_path / "in.zip"
    path.write_bytes(archive({"train.csv": INDEX_HEADER + b"a.parquet,1,2,hello\n" * 100, "a.parquet": b"not read"}))
    with pytest.raises(DatasetError, match=r"^train\.csv: is 2,\d{3} bytes; at most 1,000 are read$"):
        count_inputs(path)


def test_a_sign_map_nested_too_deeply_is_refused(files: dict[str, bytes], tmp_path: Path) -> None:
    path = tmp_path / "in.zip"
    path.write_bytes(archive({**files, "sign_to_prediction_index_map.json": b"[" * 100_000 + b"]" * 100_000}))
    with pytest.raises(DatasetError, match=r"^sign_to_prediction_index_map\.json: is nested too deeply$"):
        count_inputs(path)


def test_any_damage_is_a_dataset_error_or_harmless(files: dict[str, bytes], sequence: str, tmp_path: Path) -> None:
    # Random bytes changed anywhere in the directory or in a member's header or data: opening
    # the archive and reading every member either works or is a DatasetError.
    sound = archive({"train.csv": files["train.csv"], sequence: files[sequence][:300]})
    rng = random.Random(7)
    path = tmp_path / "in.zip"
    refused = 0
    for _ in range(400):
        content = bytearray(sound)
        for _ in range(rng.randint(1, 3)):
            content[rng.randrange(len(content))] = rng.randrange(256)
        path.write_bytes(bytes(content))
        try:
            with Source(path, require_index=False) as source:
                for member in source.files(""):
                    source.read(member)
        except DatasetError:
            refused += 1
    assert refused > 100
