"""A deterministic synthetic dataset in exactly the ISLR format, for demos, tests and benchmarks.

Each sign is a distinct pair of trajectories: the hands trace a sign-specific curve with a
sign-specific finger spread, and the lips open and close with a sign-specific rhythm. Each
participant has their own position, size, speed and jitter, so a participant-disjoint split
measures generalisation. Hands drop out for spans of frames (NaN), the left hand is absent
in one-handed signs, and a few frames lose every point.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np

from training.asl.landmarks import LIPS_CENTRE, LIPS_LEFT, LIPS_RIGHT, N_FACE, N_HAND, N_LANDMARKS, TYPE_OFFSET
from training.asl.parquet import write_sequence

WORDS = ["hello", "thanks", "yes", "no", "please", "sorry", "mother", "father", "water", "eat", "drink", "home"]
_LIPS = LIPS_CENTRE + LIPS_LEFT + LIPS_RIGHT


def _sign_names(n: int) -> list[str]:
    return [WORDS[i] if i < len(WORDS) else f"sign{i:03d}" for i in range(n)]


def _templates(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Face (468×3), hand (21×3, wrist at 0) and pose (33×3) shapes shared by everyone."""
    angle = rng.uniform(0, 2 * np.pi, N_FACE)
    radius = np.sqrt(rng.uniform(0, 1, N_FACE))
    face = np.stack([0.09 * radius * np.cos(angle), 0.12 * radius * np.sin(angle), rng.normal(0, 0.02, N_FACE)], 1)
    mouth = np.linspace(0, 2 * np.pi, len(_LIPS), endpoint=False)
    face[_LIPS] = np.stack([0.035 * np.cos(mouth), 0.06 + 0.012 * np.sin(mouth), np.zeros(len(_LIPS))], 1)
    finger = np.repeat(np.arange(5), 4)
    joint = np.tile(np.arange(1, 5), 5)
    hand = np.zeros((N_HAND, 3))
    hand[1:, 0] = (finger - 2) * 0.012
    hand[1:, 1] = -joint * 0.018
    pose = np.stack([rng.uniform(-0.2, 0.2, 33), rng.uniform(0.0, 0.6, 33), np.zeros(33)], 1)
    return face, hand, pose


def _sign_params(rng: np.random.Generator, n_signs: int) -> list[dict[str, np.ndarray | float | bool]]:
    params = []
    for k in range(n_signs):
        params.append(
            {
                "centre": np.array([rng.uniform(-0.15, 0.15), rng.uniform(0.15, 0.35)]),
                "amp": rng.uniform(0.05, 0.15, 2),
                "freq": rng.choice([1.0, 2.0, 3.0], 2) * np.pi,
                "phase": rng.uniform(0, 2 * np.pi, 2),
                "spread": rng.uniform(0.5, 2.0),
                "spread_freq": rng.choice([0.0, 2.0, 4.0]) * np.pi,
                "lip_amp": rng.uniform(0.0, 0.03),
                "lip_freq": rng.choice([1.0, 3.0, 5.0]) * np.pi,
                "two_hands": bool(k % 2),
            }
        )
    return params


def make_sequence(
    sign: dict[str, np.ndarray | float | bool],
    templates: tuple[np.ndarray, np.ndarray, np.ndarray],
    person: dict[str, float],
    rng: np.random.Generator,
    frames: int,
) -> np.ndarray:
    """One synthetic [frames, 543, 3] sequence of ``sign`` by ``person``, with NaN gaps."""
    face_t, hand_t, pose_t = templates
    t = np.linspace(0, 1, frames) * person["speed"] + rng.uniform(0, 0.1)
    origin = np.array([0.5 + person["dx"], 0.35 + person["dy"], 0.0])
    scale = person["scale"]
    out = np.full((frames, N_LANDMARKS, 3), np.nan)
    face = origin + scale * face_t
    lip_open = float(sign["lip_amp"]) * np.sin(float(sign["lip_freq"]) * t)
    out[:, :N_FACE] = face
    lip_y = face_t[_LIPS, 1] - 0.06
    out[:, _LIPS, 1] += scale * np.outer(lip_open, np.sign(lip_y))
    centre, amp = np.asarray(sign["centre"]), np.asarray(sign["amp"])
    freq, phase = np.asarray(sign["freq"]), np.asarray(sign["phase"])
    wrist = centre + amp * np.sin(np.outer(t, freq) + phase)  # [frames, 2]
    spread = float(sign["spread"]) * (1 + 0.5 * np.sin(float(sign["spread_freq"]) * t))
    for side, mirror in (("right_hand", 1.0), ("left_hand", -1.0)):
        if side == "left_hand" and not sign["two_hands"]:
            continue
        pos = np.zeros((frames, N_HAND, 3))
        pos[..., 0] = origin[0] + scale * (mirror * wrist[:, :1] + hand_t[:, 0] * spread[:, None])
        pos[..., 1] = origin[1] + scale * (wrist[:, 1:] + hand_t[:, 1])
        pos[..., 2] = rng.normal(0, 0.01, (frames, N_HAND))
        gap = rng.random() < 0.4
        if gap:
            start = rng.integers(0, frames)
            pos[start : start + rng.integers(1, max(2, frames // 5))] = np.nan
        out[:, TYPE_OFFSET[side] : TYPE_OFFSET[side] + N_HAND] = pos
    pose = origin + scale * pose_t
    out[:, TYPE_OFFSET["pose"] : TYPE_OFFSET["pose"] + 33] = pose
    out += rng.normal(0, person["jitter"], out.shape)
    lost = rng.random(frames) < 0.05
    out[lost] = np.nan
    return out.astype(np.float32)


def generate(
    target: Path,
    n_signs: int = 10,
    n_participants: int = 5,
    per_participant: int = 4,
    min_frames: int = 12,
    max_frames: int = 40,
    seed: int = 0,
    as_zip: bool = False,
    shards: int = 0,
) -> Path:
    """Write an ISLR-format dataset to ``target``: a folder, a .zip when ``as_zip``, or with
    ``shards`` a folder of train.csv, the sign map and that many ``shard-NNNNN.zip`` holding
    the sequences (consecutive runs of them, in train.csv's order).

    ``per_participant`` is how many sequences each participant signs of each sign. The same
    arguments always produce byte-identical files. Each file is written as it is made, so
    memory does not grow with the dataset.
    """
    rng = np.random.default_rng(seed)
    templates = _templates(rng)
    params = _sign_params(rng, n_signs)
    names = _sign_names(n_signs)
    people = [
        {
            "id": 16069 + 1931 * p,
            "dx": rng.uniform(-0.06, 0.06),
            "dy": rng.uniform(-0.05, 0.05),
            "scale": rng.uniform(0.85, 1.15),
            "speed": rng.uniform(0.85, 1.15),
            "jitter": rng.uniform(0.001, 0.004),
        }
        for p in range(n_participants)
    ]
    target = Path(target)
    total = n_participants * n_signs * per_participant
    with _Writer(target, as_zip, shards, total) as out:
        rows = ["path,participant_id,sequence_id,sign"]
        sequence_id = 1_000_000
        for person in people:
            for k in range(n_signs):
                for _ in range(per_participant):
                    sequence_id += int(rng.integers(1, 1000))
                    frames = int(rng.integers(min_frames, max_frames + 1))
                    landmarks = make_sequence(params[k], templates, person, rng, frames)
                    path = f"train_landmark_files/{person['id']}/{sequence_id}.parquet"
                    buffer = io.BytesIO()
                    write_sequence(landmarks, buffer, first_frame=int(rng.integers(0, 50)))
                    out.sequence(path, buffer.getvalue())
                    rows.append(f"{path},{person['id']},{sequence_id},{names[k]}")
        out.index("train.csv", ("\n".join(rows) + "\n").encode())
        out.index("sign_to_prediction_index_map.json", json.dumps({n: i for i, n in enumerate(names)}).encode())
    return target


class _Writer:
    """Where ``generate`` puts each file: a folder, one zip, or a folder of shards."""

    def __init__(self, target: Path, as_zip: bool, shards: int, total: int) -> None:
        self.target, self.shards, self.total, self.written = target, shards, total, 0
        self.archive: zipfile.ZipFile | None = None
        self.shard = -1
        if as_zip:
            target.parent.mkdir(parents=True, exist_ok=True)
            self.archive = zipfile.ZipFile(target, "w", zipfile.ZIP_STORED)
        else:
            target.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.archive is not None:
            self.archive.close()

    @staticmethod
    def _put(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
        archive.writestr(zipfile.ZipInfo(name, date_time=(2023, 1, 1, 0, 0, 0)), data)

    def sequence(self, name: str, data: bytes) -> None:
        """One sequence file: into the zip, the current shard, or the folder."""
        if self.shards:
            shard = self.written * self.shards // max(self.total, 1)
            if shard != self.shard:
                if self.archive is not None:
                    self.archive.close()
                self.archive = zipfile.ZipFile(self.target / f"shard-{shard:05d}.zip", "w", zipfile.ZIP_STORED)
                self.shard = shard
        self.written += 1
        if self.archive is not None:
            self._put(self.archive, name, data)
        else:
            self._file(name, data)

    def index(self, name: str, data: bytes) -> None:
        """train.csv or the sign map: into the zip, or the folder (a sharded one too)."""
        if self.archive is not None and not self.shards:
            self._put(self.archive, name, data)
        else:
            self._file(name, data)

    def _file(self, name: str, data: bytes) -> None:
        (self.target / name).parent.mkdir(parents=True, exist_ok=True)
        (self.target / name).write_bytes(data)
