"""The platform's re-execution of asl_training segments decodes only the sequences of the
batches it builds (``training.asl.run.decoding_on_demand``), not a cache of the whole share:
every segment, honest or forged, measures exactly as it does over the full cache, and a
sequence that cannot be decoded stops the re-execution rather than become a verdict."""

from __future__ import annotations

import dataclasses
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.factories import TINY_ASL
from training.artifacts import read_state_file, save_state_file, weights_sha256
from training.asl import dataset as asl_dataset
from training.asl.data import EpochLoader, SequenceDataset, make_loader
from training.asl.dataset import LandmarkDataset, SequenceUnreadable, load_dataset, read_index, reading_on_demand
from training.asl.landmarks import selected_landmarks
from training.asl.run import augmenter, measure_segments, replay_segments, run, trainer
from training.asl.source import Source
from training.asl.spec import TrainSpec
from training.asl.synthetic import generate
from training.plugin import DataUnreadable
from training.replay import TOLERANCE
from training.replay import measure_segments as measure_with
from training.trace import Segment, Trace, checkpoint_name, file_sha256, read_trace

SPEC: dict[str, Any] = {**TINY_ASL, "epochs": 2, "batch_size": 4, "grad_accumulation": 2, "mixed_precision": False}


@dataclasses.dataclass
class Traced:
    data: Path
    folder: Path

    @property
    def trace(self) -> Trace:
        return read_trace(self.folder / "trace.json")

    def segment(self, i: int, j: int | None = None) -> Segment:
        a, b = self.trace.leaves[i], self.trace.leaves[i + 1 if j is None else j]
        return Segment(self.folder / checkpoint_name(a.index), a, self.folder / checkpoint_name(b.index), b)


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    root = tmp_path_factory.mktemp("on-demand")
    data = generate(root / "signs.zip", n_signs=4, n_participants=4, per_participant=6, max_frames=16, as_zip=True)
    run(SPEC, data, root / "model", cache_dir=root / "cache", resume=False, trace_dir=root / "trace")
    return Traced(data, root / "trace")


def full_cache(traced: Traced, segments: list[Segment], cache: Path) -> list[float | str]:
    """The segments measured over a cache of every sequence (what the replay built before)."""
    return measure_with(lambda s, d, dev: trainer(s, d, dev, cache_dir=cache), SPEC, traced.data, segments)


def forged(traced: Traced, i: int, tmp: Path) -> Segment:
    """Segment ``i`` whose end's weights moved a little, its leaf made to match."""
    seg = traced.segment(i)
    state = read_state_file(seg.end, 1 << 30)
    generator = torch.Generator().manual_seed(1)
    state["model"] = {
        k: v + 1e-2 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
        for k, v in state["model"].items()
    }
    path = tmp / "forged.safetensors"
    save_state_file(path, state)
    model = trainer(SPEC, traced.data, "cpu", cache_dir=tmp / "c").model
    model.load_state_dict(state["model"])
    leaf = dataclasses.replace(seg.end_leaf, state_sha256=file_sha256(path), weights_sha256=weights_sha256(model))
    return Segment(seg.start, seg.start_leaf, path, leaf)


def test_each_segment_measures_as_over_the_full_cache(traced: Traced, tmp_path: Path) -> None:
    trace = traced.trace
    last = trace.segments - 1
    per_epoch = next(leaf.step for leaf in trace.leaves if leaf.epoch == 1 and leaf.step)
    mid_second_epoch = next(i for i, leaf in enumerate(trace.leaves) if leaf.step == per_epoch + 2)
    segments = [
        traced.segment(0),  # opens the run
        traced.segment(mid_second_epoch),  # past the second epoch's start, late dropout on
        traced.segment(last),  # closes it
        forged(traced, 3, tmp_path),
        traced.segment(2, 4),  # two segments given as one
    ]
    lean = measure_segments(SPEC, traced.data, segments)
    assert lean == full_cache(traced, segments, tmp_path / "cache")
    assert lean[:3] == [0.0, 0.0, 0.0]  # fp32 here: bit for bit
    assert isinstance(lean[3], float)
    assert lean[3] > TOLERANCE
    assert isinstance(lean[4], str)
    assert "not one segment" in lean[4]
    verdicts = replay_segments(SPEC, traced.data, segments)
    assert verdicts[:3] == ["", "", ""]
    assert all(verdicts[3:])


class Recorder:
    """What a replay builds and decodes: each segment's batches (as their keys, from the
    start of its epoch's iteration) and every sequence file decoded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.segments: list[list[list[Any]]] = []
        self.decoded: list[str] = []
        self.rows: list[list[int]] = []
        batch, iter_from, decode = SequenceDataset.batch, EpochLoader.iter_from, asl_dataset.read_sequence
        recorder = self

        def recorded_batch(self: SequenceDataset, keys: Any) -> Any:
            if self.data.decode is not None:  # read on demand: starts are train.csv rows
                recorder.rows.append([int(self.data.starts[i]) for _, i in keys])
            recorder.segments[-1].append(list(keys))
            return batch(self, keys)

        def recorded_iter_from(self: EpochLoader, skip: int) -> Iterator[Any]:
            recorder.segments.append([])
            return iter_from(self, skip)

        def recorded_decode(raw: bytes, name: str, points: Any = None) -> Any:
            recorder.decoded.append(name)
            return decode(raw, name, points)

        monkeypatch.setattr(SequenceDataset, "batch", recorded_batch)
        monkeypatch.setattr(EpochLoader, "iter_from", recorded_iter_from)
        monkeypatch.setattr(asl_dataset, "read_sequence", recorded_decode)


def test_a_replay_decodes_only_the_batches_it_builds(
    traced: Traced, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    trace = traced.trace
    picks = [1, trace.segments // 2, trace.segments - 1]
    segments = [traced.segment(i) for i in picks]
    full_cache(traced, segments, tmp_path / "cache")  # built before recording: its cache decodes all
    whole = Recorder(monkeypatch)
    assert full_cache(traced, segments, tmp_path / "cache") == [0.0] * 3
    monkeypatch.undo()
    lean = Recorder(monkeypatch)
    assert measure_segments(SPEC, traced.data, segments) == [0.0] * 3
    assert not whole.decoded  # the cache was there

    with Source(traced.data) as source:
        paths = [e.path for e in read_index(source)[0]]
    # Each sample of each batch built decoded once, and nothing else.
    assert Counter(lean.decoded) == Counter(paths[row] for rows in lean.rows for row in rows)
    assert len(lean.segments) == len(segments)
    for seg, built, reference in zip(segments, lean.segments, whole.segments, strict=True):
        needed = (seg.end_leaf.step - seg.start_leaf.step) * SPEC["grad_accumulation"]
        # The steps' batches, those the full-cache replay trains on, and at most the
        # prefetching thread's look-ahead beyond them (3 queued, 1 in the making).
        assert built[:needed] == reference[:needed]
        assert needed <= len(built) <= needed + 4
    assert len(lean.decoded) < len(paths)


def test_a_sequence_that_cannot_be_decoded_stops_the_replay(traced: Traced, tmp_path: Path) -> None:
    """A share whose files are listed but unreadable is the platform's problem: the replay
    raises, it does not report a worker's segment as failing."""
    broken = tmp_path / "broken.zip"
    with zipfile.ZipFile(traced.data) as source, zipfile.ZipFile(broken, "w") as out:
        for info in source.infolist():
            body = source.read(info)
            out.writestr(info.filename, b"not parquet" if info.filename.endswith(".parquet") else body)
    with pytest.raises(SequenceUnreadable, match="cannot be read"):
        replay_segments(SPEC, broken, [traced.segment(1)])
    with pytest.raises(SequenceUnreadable):
        measure_segments(SPEC, broken, [traced.segment(1)])


def test_worker_processes_decode_on_demand_as_the_cache_reads(traced: Traced, tmp_path: Path) -> None:
    """A GPU replay's loader prepares batches in worker processes: each opens the share
    itself, and the epoch's batches are the cache's, bit for bit."""
    points = selected_landmarks(False)
    cached = load_dataset(traced.data, tmp_path / "cache", points=points)

    def epoch(data: LandmarkDataset) -> list[dict[str, torch.Tensor]]:
        dataset = SequenceDataset(data, points, 16, augmenter(TrainSpec.from_dict(SPEC), points))
        loader = make_loader(dataset, 4, shuffle=True, device=torch.device("cpu"), num_workers=2)
        assert loader.loader.num_workers == 2
        torch.manual_seed(5)
        return list(loader)

    with reading_on_demand(traced.data, points=points) as on_demand:
        batches = epoch(on_demand)
        assert on_demand.decode is not None
    expected = epoch(cached)
    assert len(batches) == len(expected) == -(-len(cached) // 4)
    for got, want in zip(batches, expected, strict=True):
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key].nan_to_num(-9.0), want[key].nan_to_num(-9.0)), key


def test_a_replay_that_reads_more_than_the_share_builds_its_cache_once(
    traced: Traced, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every segment of the run: its steps read the share several times over, so one cache
    of it beats decoding each batch; the verdicts are the same."""
    from training.asl import run as asl_run

    segments = [traced.segment(i) for i in range(traced.trace.segments)]
    expected = full_cache(traced, segments, tmp_path / "cache")
    built: list[str] = []
    real_load, real_on_demand = asl_run.load_dataset, asl_run.reading_on_demand

    def load(*args: Any, **kwargs: Any) -> Any:
        built.append("cache")
        return real_load(*args, **kwargs)

    def on_demand(*args: Any, **kwargs: Any) -> Any:
        built.append("on demand")
        return real_on_demand(*args, **kwargs)

    monkeypatch.setattr(asl_run, "load_dataset", load)
    monkeypatch.setattr(asl_run, "reading_on_demand", on_demand)
    assert measure_segments(SPEC, traced.data, segments) == expected
    assert built == ["cache"]
    built.clear()
    assert measure_segments(SPEC, traced.data, segments[:2]) == expected[:2]
    assert built == ["on demand"]


def test_a_share_the_cache_cannot_read_is_the_platform_s_fault(traced: Traced, tmp_path: Path) -> None:
    broken = tmp_path / "broken.zip"
    with zipfile.ZipFile(traced.data) as source, zipfile.ZipFile(broken, "w") as out:
        for info in source.infolist():
            body = source.read(info)
            out.writestr(info.filename, b"not parquet" if info.filename.endswith(".parquet") else body)
    segments = [traced.segment(i) for i in range(traced.trace.segments)]  # the cache's way
    with pytest.raises(DataUnreadable):
        replay_segments(SPEC, broken, segments)
