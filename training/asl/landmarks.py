"""The MediaPipe Holistic landmark layout of the ISLR data and the subsets the model uses.

Every frame holds 543 points in a fixed order: face 468, left hand 21, pose 33, right hand 21.
The subsets below are closed under left/right mirroring, and each ``*_LEFT[i]`` mirrors
``*_RIGHT[i]``, so a horizontal flip is a permutation within the subset.
"""

from __future__ import annotations

import numpy as np

N_FACE = 468
N_HAND = 21
N_POSE = 33
N_LANDMARKS = N_FACE + N_HAND + N_POSE + N_HAND  # 543

# (type name, first row within a frame, number of points), in file order.
TYPES: tuple[tuple[str, int, int], ...] = (
    ("face", 0, N_FACE),
    ("left_hand", N_FACE, N_HAND),
    ("pose", N_FACE + N_HAND, N_POSE),
    ("right_hand", N_FACE + N_HAND + N_POSE, N_HAND),
)
TYPE_OFFSET = {name: start for name, start, _ in TYPES}
TYPE_SIZE = {name: size for name, _, size in TYPES}

LEFT_HAND = list(range(TYPE_OFFSET["left_hand"], TYPE_OFFSET["left_hand"] + N_HAND))
RIGHT_HAND = list(range(TYPE_OFFSET["right_hand"], TYPE_OFFSET["right_hand"] + N_HAND))

# Face-mesh points, mirrored pairwise; the centre-line points map to themselves.
LIPS_CENTRE = [0, 17, 13, 14]
LIPS_LEFT = [84, 181, 91, 146, 61, 185, 40, 39, 37, 87, 178, 88, 95, 78, 191, 80, 81, 82]
LIPS_RIGHT = [314, 405, 321, 375, 291, 409, 270, 269, 267, 317, 402, 318, 324, 308, 415, 310, 311, 312]
EYE_LEFT = [33, 7, 163, 144, 145, 153, 154, 155, 133, 246, 161, 160, 159, 158, 157, 173]
EYE_RIGHT = [263, 249, 390, 373, 374, 380, 381, 382, 362, 466, 388, 387, 386, 385, 384, 398]
NOSE_CENTRE = [1, 2]
NOSE_LEFT = [98]
NOSE_RIGHT = [327]

# Upper-body pose: nose, then mirrored pairs (shoulders, elbows, wrists, pinky, index, thumb).
_POSE = TYPE_OFFSET["pose"]
POSE_CENTRE = [_POSE + 0]
POSE_LEFT = [_POSE + i for i in (11, 13, 15, 17, 19, 21)]
POSE_RIGHT = [_POSE + i for i in (12, 14, 16, 18, 20, 22)]

# The lower-lip centre: a point present whenever the face is, near the signing space.
REFERENCE_POINT = 17


def selected_landmarks(use_pose: bool) -> list[int]:
    """Indices into the 543 rows of a frame, in the model's feature order."""
    points = (
        (LIPS_CENTRE + LIPS_LEFT + LIPS_RIGHT + LEFT_HAND + RIGHT_HAND + NOSE_CENTRE + NOSE_LEFT + NOSE_RIGHT)
        + EYE_LEFT
        + EYE_RIGHT
    )
    if use_pose:
        points = points + POSE_CENTRE + POSE_LEFT + POSE_RIGHT
    return points


def mirror_permutation(points: list[int]) -> np.ndarray:
    """For each position in ``points``, the position holding its mirror image."""
    mirror: dict[int, int] = {}
    for left, right in (
        (LIPS_LEFT, LIPS_RIGHT),
        (EYE_LEFT, EYE_RIGHT),
        (NOSE_LEFT, NOSE_RIGHT),
        (LEFT_HAND, RIGHT_HAND),
        (POSE_LEFT, POSE_RIGHT),
    ):
        for a, b in zip(left, right, strict=True):
            mirror[a] = b
            mirror[b] = a
    position = {p: i for i, p in enumerate(points)}
    return np.array([position[mirror.get(p, p)] for p in points], dtype=np.int64)


def groups(points: list[int]) -> dict[str, np.ndarray]:
    """Positions in ``points`` of each body part, for masking a whole part at once."""
    parts = {
        "lips": set(LIPS_CENTRE + LIPS_LEFT + LIPS_RIGHT),
        "left_hand": set(LEFT_HAND),
        "right_hand": set(RIGHT_HAND),
        "eyes": set(EYE_LEFT + EYE_RIGHT),
        "nose": set(NOSE_CENTRE + NOSE_LEFT + NOSE_RIGHT),
        "pose": set(POSE_CENTRE + POSE_LEFT + POSE_RIGHT),
    }
    out = {}
    for name, members in parts.items():
        pos = np.array([i for i, p in enumerate(points) if p in members], dtype=np.int64)
        if pos.size:
            out[name] = pos
    return out
