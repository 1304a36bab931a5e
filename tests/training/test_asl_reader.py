"""The ISLR reader on small hand-written parquet files: values, order, NaNs, cache, and errors."""

from __future__ import annotations

import functools
import json
import operator
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.asl.dataset import load_dataset
from training.asl.parquet import DatasetError, read_sequence
from training.asl.source import Source
from training.asl.synthetic import generate

TYPES = [("face", 468), ("left_hand", 21), ("pose", 33), ("right_hand", 21)]


def frame_rows(frame: int, value: float, hands: bool = True) -> dict[str, list]:
    """One frame's 543 rows, written the way the competition files are: x = value + row/1000."""
    rows: dict[str, list] = {k: [] for k in ("frame", "row_id", "type", "landmark_index", "x", "y", "z")}
    row = 0
    for kind, size in TYPES:
        for i in range(size):
            missing = kind.endswith("hand") and not hands
            rows["frame"].append(frame)
            rows["row_id"].append(f"{frame}-{kind}-{i}")
            rows["type"].append(kind)
            rows["landmark_index"].append(i)
            rows["x"].append(float("nan") if missing else value + row / 1000)
            rows["y"].append(float("nan") if missing else -value)
            rows["z"].append(float("nan") if missing else 0.0)
            row += 1
    return rows


def write_frames(path: Path, frames: list[dict[str, list]], drop: str | None = None, extra: bool = False) -> None:
    columns: dict[str, list] = {k: functools.reduce(operator.iadd, (f[k] for f in frames), []) for k in frames[0]}
    if drop:
        del columns[drop]
    if extra:
        columns["visibility"] = [1.0] * len(columns["frame"])
    # The competition's dtypes: int16 frame and landmark_index, float64 coordinates.
    types = {"frame": pa.int16(), "landmark_index": pa.int16(), "row_id": pa.string(), "type": pa.string()}
    table = pa.table({k: pa.array(v, types.get(k, pa.float64())) for k, v in columns.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def make_dataset(root: Path, signs: dict[str, str] | None = None, with_map: bool = True) -> Path:
    """Three sequences, two participants; sequence 2 has no hands in frame 1."""
    write_frames(root / "landmarks/1/10.parquet", [frame_rows(20, 0.1), frame_rows(21, 0.2)])
    write_frames(
        root / "landmarks/1/11.parquet", [frame_rows(5, 0.3), frame_rows(6, 0.4, hands=False), frame_rows(7, 0.5)]
    )
    write_frames(root / "landmarks/2/12.parquet", [frame_rows(0, 0.6)])
    signs = signs or {"10": "hello", "11": "thanks", "12": "hello"}
    lines = ["path,participant_id,sequence_id,sign"]
    for seq, pid in (("10", 1), ("11", 1), ("12", 2)):
        lines.append(f"landmarks/{pid}/{seq}.parquet,{pid},{seq},{signs[seq]}")
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    if with_map:
        (root / "sign_to_prediction_index_map.json").write_text(json.dumps({"thanks": 0, "hello": 1}))
    return root


def zip_folder(folder: Path, target: Path, extra: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(target, "w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and ".islr_cache" not in path.parts:
                archive.write(path, path.relative_to(folder).as_posix())
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return target


def test_reads_values_nans_labels_and_participants(tmp_path: Path) -> None:
    data = load_dataset(make_dataset(tmp_path / "ds"), tmp_path / "cache")
    assert len(data) == 3
    assert data.signs == ["thanks", "hello"]  # the map's order, not alphabetical
    assert data.labels.tolist() == [1, 0, 1]
    assert data.participants.tolist() == [1, 1, 2]
    assert data.sequence_ids.tolist() == [10, 11, 12]
    seq = data.sequence(1)
    assert seq.shape == (3, 543, 3)
    assert seq.dtype == np.float32
    assert seq[0, 0, 0] == pytest.approx(0.3)
    assert seq[2, 542, 0] == pytest.approx(0.5 + 0.542)
    assert seq[0, 500, 1] == pytest.approx(-0.3)
    # Frame 1 has no hands: exactly the 42 hand points are NaN, face and pose are not.
    nan_rows = np.flatnonzero(np.isnan(seq[1, :, 0]))
    assert nan_rows.tolist() == list(range(468, 489)) + list(range(522, 543))
    assert not np.isnan(seq[[0, 2]]).any()


def test_zip_and_folder_give_the_same_arrays_and_a_top_level_folder_is_found(tmp_path: Path) -> None:
    folder = make_dataset(tmp_path / "asl-signs")
    from_folder = load_dataset(folder, tmp_path / "c1")
    archive = tmp_path / "upload.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and ".islr_cache" not in path.parts:
                zf.write(path, "asl-signs/" + path.relative_to(folder).as_posix())
    from_zip = load_dataset(archive, tmp_path / "c2")
    for i in range(3):
        np.testing.assert_array_equal(from_folder.sequence(i), from_zip.sequence(i))


def test_rows_in_any_order_are_put_in_place(tmp_path: Path) -> None:
    rows = frame_rows(3, 0.1)
    other = frame_rows(4, 0.2)
    merged = {k: rows[k] + other[k] for k in rows}
    order = np.random.default_rng(0).permutation(len(merged["frame"]))
    shuffled = {k: [v[i] for i in order] for k, v in merged.items()}
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table(shuffled), path)
    seq = read_sequence(path.read_bytes(), "s.parquet")
    assert seq.shape == (2, 543, 3)
    assert seq[1, 10, 0] == pytest.approx(0.2 + 0.010)
    assert seq[0, 489, 1] == pytest.approx(-0.1)


def test_cache_is_built_once_and_rebuilt_when_the_data_changes(tmp_path: Path) -> None:
    folder = make_dataset(tmp_path / "ds")
    cache = tmp_path / "cache"
    load_dataset(folder, cache)
    first = sorted(p.name for p in cache.iterdir())
    assert len(first) == 1
    stamp = (cache / first[0] / "frames.f32").stat().st_mtime_ns
    load_dataset(folder, cache)
    assert sorted(p.name for p in cache.iterdir()) == first
    assert (cache / first[0] / "frames.f32").stat().st_mtime_ns == stamp
    write_frames(folder / "landmarks/2/12.parquet", [frame_rows(0, 0.9), frame_rows(1, 0.9)])
    changed = load_dataset(folder, cache)
    assert len(list(cache.iterdir())) == 2
    assert changed.sequence(2).shape == (2, 543, 3)


@pytest.mark.parametrize(
    ("damage", "named", "problem"),
    [
        ("drop_column", "landmarks/1/10.parquet", "missing columns x"),
        ("extra_column", "landmarks/1/10.parquet", "unexpected columns visibility"),
        ("short_rows", "landmarks/1/10.parquet", "not a positive multiple of 543"),
        ("unknown_sign", "train.csv line 4", "unknown sign 'goodbye'"),
        ("escaping_path", "train.csv line 2", "escapes the dataset"),
        ("missing_file", "train.csv line 2", "missing from the dataset"),
        ("csv_columns", "train.csv", "missing columns sign"),
        ("not_parquet", "landmarks/1/10.parquet", "not a readable parquet file"),
        ("bad_type", "landmarks/1/10.parquet", "unknown landmark type 'foot'"),
    ],
)
def test_validation_errors_name_the_file(tmp_path: Path, damage: str, named: str, problem: str) -> None:
    folder = make_dataset(
        tmp_path / "ds", signs={"10": "hello", "11": "thanks", "12": "goodbye"} if damage == "unknown_sign" else None
    )
    target = folder / "landmarks/1/10.parquet"
    csv_path = folder / "train.csv"
    if damage == "drop_column":
        write_frames(target, [frame_rows(0, 0.1)], drop="x")
    elif damage == "extra_column":
        write_frames(target, [frame_rows(0, 0.1)], extra=True)
    elif damage == "short_rows":
        rows = frame_rows(0, 0.1)
        pq.write_table(pa.table({k: v[:-1] for k, v in rows.items()}), target)
    elif damage == "escaping_path":
        csv_path.write_text(csv_path.read_text().replace("landmarks/1/10.parquet", "../../etc/passwd"))
    elif damage == "missing_file":
        target.unlink()
    elif damage == "csv_columns":
        csv_path.write_text("path,participant_id,sequence_id\nlandmarks/1/10.parquet,1,10\n")
    elif damage == "not_parquet":
        target.write_bytes(b"PK\x03\x04 this is not parquet")
    elif damage == "bad_type":
        rows = frame_rows(0, 0.1)
        rows["type"] = ["foot" if t == "pose" else t for t in rows["type"]]
        pq.write_table(pa.table(rows), target)
    with pytest.raises(DatasetError) as excinfo:
        load_dataset(folder, tmp_path / "cache")
    assert str(excinfo.value).startswith(named + ":")
    assert problem in str(excinfo.value)


def write_long_sequence(path: Path, frames: int, per_group: int = 1024) -> None:
    """A valid sequence file of ``frames`` identical frames in row groups of ``per_group``:
    run-length and dictionary encoding bring it to a few hundred KB however many frames."""
    one = frame_rows(0, 0.1)
    schema = pa.schema(
        [("frame", pa.int16()), ("row_id", pa.string()), ("type", pa.string()), ("landmark_index", pa.int16())]
        + [(c, pa.float64()) for c in ("x", "y", "z")]
    )
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for start in range(0, frames, per_group):
            count = min(per_group, frames - start)
            columns = {k: np.tile(np.asarray(v), count) for k, v in one.items() if k != "frame"}
            columns["row_id"] = np.full(count * len(one["frame"]), "r")
            columns["frame"] = np.repeat(np.arange(start, start + count, dtype=np.int16), len(one["frame"]))
            writer.write_table(pa.table({f.name: pa.array(columns[f.name], f.type) for f in schema}, schema=schema))


def test_a_sequence_file_declaring_more_frames_than_are_read_is_refused_before_decoding(tmp_path: Path) -> None:
    folder = make_dataset(tmp_path / "ds")
    target = folder / "landmarks/1/10.parquet"
    write_long_sequence(target, 8192 + 1)
    # 2 MB holding 4.4 million rows (0.2 KB a frame; the competition's files take about
    # 15 KB): refused from its row groups' counts, before a row is decoded.
    assert target.stat().st_size < 4 * 1024**2
    with pytest.raises(DatasetError, match=r"^landmarks/1/10\.parquet: holds 4,448,799 rows, over the 8,192 frames"):
        load_dataset(folder, tmp_path / "cache")
    # At the bound it is read, every frame.
    write_long_sequence(target, 600)
    assert int(load_dataset(folder, tmp_path / "cache").lengths.max()) == 600


def test_zip_member_escaping_the_archive_is_refused(tmp_path: Path) -> None:
    folder = make_dataset(tmp_path / "ds")
    archive = zip_folder(folder, tmp_path / "evil.zip", extra={"../../outside.txt": b"x"})
    with pytest.raises(DatasetError, match=r"evil\.zip: member '\.\./\.\./outside\.txt'.*escapes"):
        load_dataset(archive, tmp_path / "cache")


def test_an_archive_of_any_size_is_read_but_a_member_too_large_or_too_compressed_is_not(tmp_path: Path) -> None:
    archive = zip_folder(make_dataset(tmp_path / "ds"), tmp_path / "big.zip")
    assert len(load_dataset(archive, tmp_path / "cache")) == 3  # the trainer caps no archive
    # A caller holding an upload limit (the platform) may still pass one.
    with pytest.raises(DatasetError, match=r"big\.zip: archive is \d+ bytes, over the 1000-byte limit"):
        Source(archive, max_bytes=1000)
    # Each member is read whole into memory: its declared size is capped...
    with pytest.raises(DatasetError, match=r"big\.zip: member 'landmarks/1/1\d\.parquet': expands to \d+ bytes, over"):
        load_dataset(archive, tmp_path / "cache2", max_member_bytes=5000)
    # ...and so is how much it expands: 64 MiB of zeros deflate to 64 KiB.
    bomb = zip_folder(make_dataset(tmp_path / "ds2"), tmp_path / "bomb.zip")
    with zipfile.ZipFile(bomb, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("padding.bin", bytes(64 * 1024**2))
    with pytest.raises(DatasetError, match=r"bomb\.zip: member 'padding\.bin': expands \d+-fold, over the 100-fold"):
        load_dataset(bomb, tmp_path / "cache3")


def test_a_zip_without_train_csv_is_named(tmp_path: Path) -> None:
    archive = tmp_path / "empty.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("readme.txt", "nothing here")
    with pytest.raises(DatasetError, match=r"empty\.zip: train\.csv: missing"):
        load_dataset(archive, tmp_path / "cache")


def test_threaded_reading_matches_sequential_reading(tmp_path: Path) -> None:
    archive = generate(
        tmp_path / "many.zip", n_signs=7, n_participants=2, per_participant=5, max_frames=20, as_zip=True
    )
    one = load_dataset(archive, tmp_path / "c1", workers=1)
    two = load_dataset(archive, tmp_path / "c2", workers=2)
    assert len(one) == len(two) == 70
    assert one.lengths.tolist() == two.lengths.tolist()
    np.testing.assert_array_equal(one.frames, two.frames)
    np.testing.assert_array_equal(one.labels, two.labels)


def test_synthetic_generator_is_deterministic_and_has_gaps(tmp_path: Path) -> None:
    a = generate(tmp_path / "a.zip", n_signs=3, n_participants=2, per_participant=2, as_zip=True, seed=5)
    b = generate(tmp_path / "b.zip", n_signs=3, n_participants=2, per_participant=2, as_zip=True, seed=5)
    assert a.read_bytes() == b.read_bytes()
    data = load_dataset(a, tmp_path / "cache")
    assert sorted(set(data.participants.tolist())) == [16069, 18000]
    assert data.signs == ["hello", "thanks", "yes"]
    frames = np.asarray(data.frames)
    right = frames[:, 522:543, 0]
    assert np.isnan(right).any()  # hands drop out
    assert not np.isnan(right).all()
    assert np.isnan(frames).all(axis=(1, 2)).any()  # and some frames lose every point


def test_a_symlink_out_of_a_folder_dataset_is_refused(tmp_path: Path) -> None:
    folder = make_dataset(tmp_path / "ds")
    secret = tmp_path / "secret.parquet"
    (folder / "landmarks/1/10.parquet").rename(secret)
    (folder / "landmarks/1/10.parquet").symlink_to(secret)
    with pytest.raises(DatasetError, match=r"^landmarks/1/10\.parquet: path escapes the dataset folder"):
        load_dataset(folder, tmp_path / "cache")
