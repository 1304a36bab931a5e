"""ASL split benchmark: the platform's held-out split of ISLR archives of growing size, its
peak memory (RSS, in a fresh process per size) and its output's size against the upload's.

Run: .venv/bin/python bench/asl_split.py [--sequences 300 3000]
Each archive repeats a small synthetic dataset's parquet files (about 100 KB each) under
new paths and 21 participants, so the sizes grow without generating landmarks. Targets: the largest archive's peak at most
1.25 times the smallest's plus 64 MiB (memory does not grow with the dataset), and the
shares together at most 1.02 times the upload (no rewrite larger than the data).
The last line is one JSON object with the figures and targets.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.asl.synthetic import generate

MEMORY_RATIO_TARGET = 1.25
MEMORY_SLACK_MIB = 64
SIZE_RATIO_TARGET = 1.02
SPEC = {"dim": 192, "blocks": 1, "max_len": 32}


def build(target: Path, sequences: int, seed_folder: Path) -> Path:
    """An ISLR zip of ``sequences`` sequence files (stored, as parquet barely compresses)."""
    with (seed_folder / "train.csv").open() as index:
        rows = list(csv.DictReader(index))
    bodies = [(seed_folder / row["path"]).read_bytes() for row in rows]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["path", "participant_id", "sequence_id", "sign"])
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as archive:
        archive.write(seed_folder / "sign_to_prediction_index_map.json", "sign_to_prediction_index_map.json")
        for i in range(sequences):
            row = rows[i % len(rows)]
            path = f"train_landmark_files/{i % 21}/{i}.parquet"
            archive.writestr(path, bodies[i % len(bodies)])
            writer.writerow([path, 1000 + i % 21, i, row["sign"]])
        archive.writestr("train.csv", out.getvalue())
    return target


def split_in_child(archive: Path, out: Path) -> dict[str, float]:
    """Run the split in a fresh interpreter: its peak RSS, seconds and output bytes."""
    code = (
        "import json, resource, sys, time\n"
        "from pathlib import Path\n"
        "from training.asl import split\n"
        "t = time.perf_counter()\n"
        f"w, h = split.prepare({SPEC!r}, Path(sys.argv[1]), Path(sys.argv[2]), bytes(32))\n"
        "size = sum(p.stat().st_size for d in (w, h) for p in d.iterdir())\n"
        "print(json.dumps({'seconds': time.perf_counter() - t, 'bytes': size,\n"
        "    'peak_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,\n"
        "    'shards': len(list(w.glob('shard-*'))) + len(list(h.glob('shard-*')))}))\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code, str(archive), str(out)],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, nargs="+", default=[300, 3000])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-split-") as tmp:
        seed = generate(Path(tmp) / "seed", n_signs=5, n_participants=3, per_participant=2, max_frames=24)
        for count in args.sequences:
            t0 = time.perf_counter()
            archive = build(Path(tmp) / f"islr-{count}.zip", count, seed)
            built = time.perf_counter() - t0
            got = split_in_child(archive, Path(tmp) / f"out-{count}")
            upload = archive.stat().st_size
            rows.append({"sequences": count, "upload_bytes": upload, "size_ratio": got["bytes"] / upload, **got})
            print(
                f"{count:>7} sequences  upload {upload / 2**20:8.1f} MiB  shares {got['bytes'] / 2**20:8.1f} MiB"
                f"  peak {got['peak_mib']:7.1f} MiB  split {got['seconds']:6.1f} s (build {built:.1f} s)"
                f"  {int(got['shards'])} shards"
            )
            archive.unlink()
    smallest, largest = rows[0], rows[-1]
    memory_ok = largest["peak_mib"] <= MEMORY_RATIO_TARGET * smallest["peak_mib"] + MEMORY_SLACK_MIB
    size_ok = all(r["size_ratio"] <= SIZE_RATIO_TARGET for r in rows)
    print(
        json.dumps(
            {
                "bench": "asl_split",
                "rows": rows,
                "peak_mib_smallest": round(smallest["peak_mib"], 1),
                "peak_mib_largest": round(largest["peak_mib"], 1),
                "memory_target": f"<= {MEMORY_RATIO_TARGET} x smallest + {MEMORY_SLACK_MIB} MiB",
                "memory_ok": memory_ok,
                "size_ratio_max": round(max(r["size_ratio"] for r in rows), 4),
                "size_target": SIZE_RATIO_TARGET,
                "size_ok": size_ok,
                "rusage_self_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
