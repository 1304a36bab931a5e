"""The training cache: only the model's points, the same values the model saw from all 543,
memory that does not grow with the dataset, and a clear refusal when the disk is too small."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from training.asl import dataset as dataset_module
from training.asl.augment import Augmenter
from training.asl.data import SequenceDataset
from training.asl.dataset import CacheSpaceError, frame_bytes, load_dataset
from training.asl.landmarks import N_LANDMARKS, selected_landmarks
from training.asl.model import CompetitionModel, ModelConfig, SignModel
from training.asl.run import evaluate_dataset
from training.asl.synthetic import generate

POINTS = selected_landmarks(use_pose=False)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("asl-cache")
    return generate(root / "set.zip", n_signs=4, n_participants=2, per_participant=3, max_frames=24, as_zip=True)


def test_the_cache_holds_the_models_points_with_the_values_all_543_gave(archive: Path, tmp_path: Path) -> None:
    full = load_dataset(archive, tmp_path / "full")
    small = load_dataset(archive, tmp_path / "small", points=POINTS)
    assert len(POINTS) == 118
    frames = int(small.lengths.sum())
    assert small.frames.shape == (frames, 118, 3)
    (folder,) = (tmp_path / "small").iterdir()
    assert (folder / "frames.f32").stat().st_size == frames * frame_bytes(118) == frames * 118 * 12
    (whole,) = (tmp_path / "full").iterdir()
    assert (whole / "frames.f32").stat().st_size == frames * N_LANDMARKS * 12  # 4.6 times as much
    for i in range(len(full)):
        np.testing.assert_array_equal(small.sequence(i), full.sequence(i)[:, POINTS])
        # The competition's layout back: the model's points in place, NaN elsewhere.
        back = small.landmarks(i)
        np.testing.assert_array_equal(back[:, POINTS], full.sequence(i)[:, POINTS])
        assert np.isnan(np.delete(back, POINTS, axis=1)).all()

    # What training sees, augmentations included, and what verification computes.
    augmenter = Augmenter(POINTS)
    from_full, from_small = (SequenceDataset(d, POINTS, 32, augmenter) for d in (full, small))
    for i in range(len(full)):
        a, b = from_full[(7, i)], from_small[(7, i)]
        np.testing.assert_array_equal(a["x"], b["x"])
        assert a["y"] == b["y"]
    torch.manual_seed(0)
    model = SignModel(ModelConfig(num_classes=len(full.signs), dim=32, blocks=1, max_len=32)).eval()
    logits_full, labels_full = evaluate_dataset(model, full.signs, full)
    logits_small, labels_small = evaluate_dataset(model, small.signs, small)
    torch.testing.assert_close(logits_small, logits_full, rtol=0, atol=0)
    assert labels_small.tolist() == labels_full.tolist()
    # The exported contract reads the competition's layout: the same logits from it.
    with torch.no_grad():
        contract = CompetitionModel(model)(torch.from_numpy(small.landmarks(0)))
        direct = CompetitionModel(model)(torch.from_numpy(np.array(full.sequence(0))))
    torch.testing.assert_close(contract, direct, rtol=0, atol=0)


def test_another_set_of_points_gets_its_own_cache_and_missing_points_are_named(archive: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_dataset(archive, cache, points=POINTS)
    with_pose = load_dataset(archive, cache, points=selected_landmarks(use_pose=True))
    assert len(list(cache.iterdir())) == 2
    assert with_pose.frames.shape[1] == 131
    small = load_dataset(archive, cache, points=POINTS)
    with pytest.raises(ValueError, match=r"landmarks \[489, 500, 502, 504, 506\] are not in this dataset's cache"):
        SequenceDataset(small, selected_landmarks(use_pose=True), 32)
    with pytest.raises(ValueError, match="indices into the 543 landmarks"):
        load_dataset(archive, cache, points=[0, 543])


def test_a_disk_too_small_for_the_cache_is_refused_before_writing(
    archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = dataset_module.shutil.disk_usage

    def small_disk(path: Any) -> Any:
        return real(path)._replace(free=100 * 1024**2)

    monkeypatch.setattr(dataset_module.shutil, "disk_usage", small_disk)
    with pytest.raises(
        CacheSpaceError, match=r"the dataset's cache needs about [\d,]+ more bytes and .* has 104,857,600 free"
    ):
        load_dataset(archive, tmp_path / "cache", points=POINTS)
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_disk_filling_up_while_the_cache_is_written_stops_it_and_leaves_nothing(
    archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The estimate before writing is only an estimate: the build re-checks as it goes."""
    real = dataset_module.shutil.disk_usage
    checks: list[Path] = []

    def shrinking(path: Any) -> Any:
        checks.append(Path(path))
        free = 10 * 1024**3 if len(checks) == 1 else dataset_module.DISK_RESERVE_BYTES
        return real(path)._replace(free=free)

    monkeypatch.setattr(dataset_module.shutil, "disk_usage", shrinking)
    monkeypatch.setattr(dataset_module, "DISK_CHECK_EVERY", 4)
    with pytest.raises(CacheSpaceError, match="the dataset's cache needs about"):
        load_dataset(archive, tmp_path / "cache", points=POINTS)
    assert len(checks) == 2
    assert list((tmp_path / "cache").iterdir()) == []


MEASURE = """
import json, resource, sys
from pathlib import Path
from training.asl.dataset import load_dataset
from training.asl.landmarks import selected_landmarks
Path("/proc/self/clear_refs").write_text("5")  # the peak so far (imports) is forgotten
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
data = load_dataset(Path(sys.argv[1]), Path(sys.argv[2]), points=selected_landmarks(False), workers=2)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth": (after - before) * 1024, "sequences": len(data)}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset")
def test_building_the_cache_takes_no_more_memory_for_twice_the_dataset(tmp_path: Path) -> None:
    growth, sizes = [], []
    for per in (2, 4):
        data = generate(
            tmp_path / f"set{per}.zip",
            n_signs=10,
            n_participants=8,
            per_participant=per,
            min_frames=15,
            max_frames=25,
            as_zip=True,
        )
        sizes.append(data.stat().st_size)
        out = subprocess.run(
            [sys.executable, "-c", MEASURE, str(data), str(tmp_path / f"cache{per}")],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        )
        figures = json.loads(out.stdout)
        assert figures["sequences"] == 80 * per
        growth.append(figures["growth"])
    assert sizes[1] > 90 * 1024**2  # about 46 and 93 MB of parquet
    # Peak memory while building grows by far less than the dataset: not by what it adds.
    assert growth[1] - growth[0] < 0.1 * (sizes[1] - sizes[0])
    assert growth[1] < 0.25 * sizes[1]
