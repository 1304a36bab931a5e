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
import multiprocessing
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from training.asl.landmarks import LIPS_CENTRE, LIPS_LEFT, LIPS_RIGHT, N_FACE, N_HAND, N_LANDMARKS, TYPE_OFFSET
from training.asl.parquet import write_sequence

WORDS = ["hello", "thanks", "yes", "no", "please", "sorry", "mother", "father", "water", "eat", "drink", "home"]
_LIPS = LIPS_CENTRE + LIPS_LEFT + LIPS_RIGHT


@dataclass(frozen=True)
class LengthDistribution:
    """Sequence lengths in frames: a log-normal of this median and log-space sigma, rounded
    and clipped to [``low``, ``high``]."""

    median: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: np.random.Generator) -> int:
        return int(np.clip(round(rng.lognormal(np.log(self.median), self.sigma)), self.low, self.high))


# The shape of the Google ISLR competition's training set (94,477 sequences of 250 signs by
# 21 participants). Its lengths are heavily right-skewed; no published table of them was at
# hand, so this is an APPROXIMATION, not a fit: a log-normal with median 23 frames and
# sigma 0.89 (5th percentile about 5, 95th about 100, mean about 34), clipped to the 2..537
# frames the longest sequences are commonly quoted at.
ISLR_SEQUENCES = 94_477
ISLR_SIGNS = 250
ISLR_PARTICIPANTS = 21
ISLR_LENGTHS = LengthDistribution(median=23.0, sigma=0.89, low=2, high=537)


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
    lengths: Literal["uniform", "islr"] = "uniform",
    sequences: int | None = None,
    processes: int = 1,
) -> Path:
    """Write an ISLR-format dataset to ``target``: a folder, a .zip when ``as_zip``, or with
    ``shards`` a folder of train.csv, the sign map and that many ``shard-NNNNN.zip`` holding
    the sequences (consecutive runs of them, in train.csv's order).

    ``per_participant`` is how many sequences each participant signs of each sign. The same
    arguments always produce byte-identical files. Each file is written as it is made, so
    memory does not grow with the dataset.

    ``lengths``: frames drawn uniformly from [``min_frames``, ``max_frames``], or from
    ``ISLR_LENGTHS`` (the competition's skewed shape; ``min_frames`` and ``max_frames`` are
    then unused).

    ``sequences``: instead of ``per_participant``, this many sequences in all, spread as
    evenly as the count allows over every (participant, sign) pair, each pair drawn from its
    own random stream. That form can be made by ``processes`` processes at once; the output
    does not depend on how many (``processes`` needs ``sequences``).
    """
    if sequences is None and processes != 1:
        raise ValueError("processes: generating in parallel needs sequences")
    if processes < 1:
        raise ValueError("processes: at least 1")
    rng = np.random.default_rng(seed)
    templates = _templates(rng)
    params = _sign_params(rng, n_signs)
    names = _sign_names(n_signs)
    people = _people(rng, n_participants)
    target = Path(target)
    if sequences is not None:
        shape = (n_signs, n_participants, lengths, (min_frames, max_frames))
        return _generate_pairs(target, sequences, shape, seed, as_zip, shards, processes)
    total = n_participants * n_signs * per_participant
    with _Writer(target, as_zip, shards, total) as out:
        rows = ["path,participant_id,sequence_id,sign"]
        sequence_id = 1_000_000
        for person in people:
            for k in range(n_signs):
                for _ in range(per_participant):
                    sequence_id += int(rng.integers(1, 1000))
                    if lengths == "islr":
                        frames = ISLR_LENGTHS.draw(rng)
                    else:
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


def _people(rng: np.random.Generator, n_participants: int) -> list[dict[str, float]]:
    return [
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


def pair_counts(sequences: int, n_signs: int, n_participants: int) -> dict[tuple[int, int], int]:
    """How many sequences each (participant, sign) pair signs when ``sequences`` are spread
    over all of them: an equal share, and one more for the first pairs of the order that
    takes sign r mod n_signs with participant r mod n_participants (every pair once when the
    two counts are coprime, as 250 and 21 are), so the extras spread over every sign and
    every participant alike."""
    pairs = n_signs * n_participants
    if sequences < 0 or pairs <= 0:
        raise ValueError("sequences: a count of at least 0, with at least one sign and participant")
    base, extra = divmod(sequences, pairs)
    counts = {(p, k): base for p in range(n_participants) for k in range(n_signs)}
    order = [(r % n_participants, r % n_signs) for r in range(pairs)]
    if len(set(order)) != pairs:  # not coprime: walk participant-major instead
        order = [(r // n_signs, r % n_signs) for r in range(pairs)]
    for pair in order[:extra]:
        counts[pair] += 1
    return counts


# What each generating process keeps between pairs: the shared templates, sign parameters
# and participants (from the main seed), and the length option.
_SHARED: dict[str, Any] = {}


def _share(seed: int, n_signs: int, n_participants: int, lengths: str, frames: tuple[int, int]) -> None:
    rng = np.random.default_rng(seed)
    _SHARED.update(
        seed=seed,
        templates=_templates(rng),
        params=_sign_params(rng, n_signs),
        people=_people(rng, n_participants),
        names=_sign_names(n_signs),
        lengths=lengths,
        frames=frames,
    )


def _pair(job: tuple[int, int, int]) -> list[tuple[str, bytes, str]]:
    """The sequences of participant ``p`` signing sign ``k`` ``count`` times: (path, parquet
    bytes, train.csv row) each, from the pair's own random stream."""
    p, k, count = job
    rng = np.random.default_rng([_SHARED["seed"], 0x15C, p, k])
    person, name = _SHARED["people"][p], _SHARED["names"][k]
    n_signs = len(_SHARED["names"])
    made = []
    for i in range(count):
        # Unique by construction: the pair's number, then the repetition.
        sequence_id = 1_000_000_000 + (p * n_signs + k) * 10_000 + i
        if _SHARED["lengths"] == "islr":
            frames = ISLR_LENGTHS.draw(rng)
        else:
            frames = int(rng.integers(_SHARED["frames"][0], _SHARED["frames"][1] + 1))
        landmarks = make_sequence(_SHARED["params"][k], _SHARED["templates"], person, rng, frames)
        path = f"train_landmark_files/{person['id']}/{sequence_id}.parquet"
        buffer = io.BytesIO()
        write_sequence(landmarks, buffer, first_frame=int(rng.integers(0, 50)))
        made.append((path, buffer.getvalue(), f"{path},{person['id']},{sequence_id},{name}"))
    return made


def _generate_pairs(
    target: Path,
    sequences: int,
    shape: tuple[int, int, str, tuple[int, int]],
    seed: int,
    as_zip: bool,
    shards: int,
    processes: int,
) -> Path:
    n_signs, n_participants = shape[0], shape[1]
    counts = pair_counts(sequences, n_signs, n_participants)
    if max(counts.values(), default=0) >= 10_000:
        raise ValueError("sequences: at most 9,999 per (participant, sign) pair")
    jobs = [(p, k, counts[p, k]) for p in range(n_participants) for k in range(n_signs) if counts[p, k]]
    rows = ["path,participant_id,sequence_id,sign"]
    with _Writer(target, as_zip, shards, sequences) as out:
        for made in _made(jobs, (seed, *shape), processes):
            for path, data, row in made:
                out.sequence(path, data)
                rows.append(row)
        out.index("train.csv", ("\n".join(rows) + "\n").encode())
        names = _sign_names(n_signs)
        out.index("sign_to_prediction_index_map.json", json.dumps({n: i for i, n in enumerate(names)}).encode())
    return target


def _made(
    jobs: list[tuple[int, int, int]], shared: tuple[Any, ...], processes: int
) -> Iterator[list[tuple[str, bytes, str]]]:
    """Each job's sequences, in the jobs' order, made here or by ``processes`` processes (a
    few pairs ahead of the writer: memory holds a few pairs, not the dataset)."""
    if processes == 1:
        _share(*shared)
        yield from map(_pair, jobs)
        return
    context = multiprocessing.get_context("spawn")  # no fork of a parent holding torch or threads
    with context.Pool(processes, initializer=_share, initargs=shared) as pool:
        # imap runs ahead of the writer by as many pairs as it likes; bound it by windows.
        window = processes * 8
        for start in range(0, len(jobs), window):
            yield from pool.imap(_pair, jobs[start : start + window])


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
