"""The synthetic ISLR generator at the competition's shape: lengths from ``ISLR_LENGTHS``,
a total spread over every (participant, sign) pair, and the same bytes from any number of
processes; the earlier form unchanged for its callers."""

from __future__ import annotations

import hashlib
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from training.asl.dataset import load_dataset
from training.asl.synthetic import ISLR_LENGTHS, generate, pair_counts


def test_the_earlier_form_draws_what_it_drew_before(tmp_path: Path) -> None:
    # The index and every length as the generator made them before lengths and sequences
    # existed (the parquet bytes also carry pyarrow's version, so they are not pinned).
    archive = generate(tmp_path / "a.zip", n_signs=3, n_participants=2, per_participant=2, as_zip=True, seed=5)
    index = zipfile.ZipFile(archive).read("train.csv")
    assert hashlib.sha256(index).hexdigest() == "db472e11990eecab933db55bab17cf9465ae43cd0c816e395cd7b52b2c15bc49"
    assert load_dataset(archive, tmp_path / "cache").lengths.tolist() == [
        15,
        36,
        27,
        36,
        21,
        25,
        35,
        25,
        26,
        33,
        26,
        27,
    ]


def test_islr_lengths_are_right_skewed_within_the_competitions_bounds() -> None:
    rng = np.random.default_rng(0)
    lengths = np.array([ISLR_LENGTHS.draw(rng) for _ in range(20_000)])
    assert 20 <= np.median(lengths) <= 26
    assert 3 <= np.percentile(lengths, 5) <= 8
    assert 80 <= np.percentile(lengths, 95) <= 120
    assert lengths.mean() > np.median(lengths) * 1.3  # the long tail
    assert lengths.min() >= 2
    assert lengths.max() <= 537


def test_a_total_spreads_over_every_sign_and_participant_alike() -> None:
    counts = pair_counts(945, 250, 21)  # the competition's set at 1 %
    assert sum(counts.values()) == 945
    per_sign, per_person = Counter[int](), Counter[int]()
    for (person, sign), count in counts.items():
        per_sign[sign] += count
        per_person[person] += count
    assert len(per_sign) == 250
    assert set(per_sign.values()) <= {3, 4}
    assert len(per_person) == 21
    assert set(per_person.values()) <= {45, 46}
    assert set(pair_counts(94_477, 250, 21).values()) == {17, 18}


def test_the_same_set_from_one_process_or_two(tmp_path: Path) -> None:
    args = {"n_signs": 7, "n_participants": 3, "sequences": 30, "lengths": "islr", "as_zip": True, "seed": 3}
    one = generate(tmp_path / "one.zip", processes=1, **args)  # type: ignore[arg-type]
    two = generate(tmp_path / "two.zip", processes=2, **args)  # type: ignore[arg-type]
    assert one.read_bytes() == two.read_bytes()
    data = load_dataset(two, tmp_path / "cache")
    assert len(data) == 30
    assert sorted(set(data.participants.tolist())) == [16069, 18000, 19931]
    assert len(set(data.labels.tolist())) == 7


def test_processes_need_a_total(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^processes: "):
        generate(tmp_path / "x.zip", processes=2, as_zip=True)
