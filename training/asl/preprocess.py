"""NaN-aware preprocessing, in torch so it runs in training and inside the exported ONNX graph.

Scaling: each axis by its own standard deviation over the sequence's detected points
(``per_axis``, the 1st-place ISLR solution's choice), or all axes by one.

Input: raw landmarks of the selected points, NaN where undetected, padded with NaN to a
batch ([B, T, P, 3] plus each sequence's length). Output: features [B, L, 3·P·C] (positions,
lag-1 and lag-2 motion of C coordinates) and a padding mask [B, L], L = min(T, max_len).

Every step has a static shape given T, so the same code exports to ONNX without
data-dependent operators: frames without any selected point are dropped by a stable
sort that moves them behind the kept ones, not by boolean indexing.

A point given as ±inf (``HIDDEN``) is masked: like an undetected one it counts towards
neither centre nor scale and its features are zero, but its frame keeps its place even when
nothing in it is seen. Training's ``time_mask`` marks frames so; real inputs have NaN only.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from training.asl.landmarks import REFERENCE_POINT

HIDDEN = float("inf")


def _nan_mean(values: torch.Tensor, ok: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``values`` where ``ok`` over ``dims`` (kept), and how many values counted."""
    okf = ok.to(values.dtype)
    count = okf.sum(dim=dims, keepdim=True)
    total = torch.where(ok, values, torch.zeros_like(values)).sum(dim=dims, keepdim=True)
    return total / count.clamp(min=1.0), count


class Featurizer(nn.Module):
    """Centre, scale (per axis or by one figure), drop empty frames, truncate, add motion; see the module docstring."""

    def __init__(self, points: list[int], max_len: int, coords: int = 2, per_axis: bool = True) -> None:
        super().__init__()
        if REFERENCE_POINT not in points:
            raise ValueError("the landmark subset must include the reference point")
        self.points = list(points)
        self.reference = self.points.index(REFERENCE_POINT)
        self.max_len = int(max_len)
        self.coords = int(coords)
        self.per_axis = bool(per_axis)
        self.features = 3 * len(self.points) * self.coords

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T, P, 3] raw landmarks and [B] lengths → ([B, L, F] features, [B, L] bool mask)."""
        x = x[..., : self.coords].float()
        batch, frames = x.shape[0], x.shape[1]
        steps = torch.arange(frames, device=x.device)
        in_range = steps[None, :] < lengths[:, None]  # [B, T]
        hidden = torch.isinf(x)
        ok = ~(torch.isnan(x) | hidden).any(-1) & in_range[:, :, None]  # [B, T, P]

        # Reference: the mean of the reference point over the sequence; the mean of every
        # point where the face is never seen; 0.5 (the image centre) where nothing is.
        ref_ok = ok[:, :, self.reference, None]
        ref, ref_count = _nan_mean(x[:, :, self.reference], ref_ok, (1,))  # [B, 1, C]
        all_mean, all_count = _nan_mean(x, ok[..., None], (1, 2))  # [B, 1, 1, C]
        all_mean = torch.where(all_count > 0, all_mean, torch.full_like(all_mean, 0.5))
        centre = torch.where(ref_count[:, :, None] > 0, ref[:, :, None], all_mean)  # [B, 1, 1, C]
        centred = x - centre
        # One standard deviation per axis (over frames and points), or one for all axes.
        var, _ = _nan_mean(centred * centred, ok[..., None].expand_as(centred), (1, 2) if self.per_axis else (1, 2, 3))
        std = torch.sqrt(var)
        std = torch.where(std > 1e-6, std, torch.ones_like(std))
        normed = torch.where(ok[..., None], centred / std, torch.full_like(centred, float("nan")))

        # Stable compaction: kept frames (with a point seen or masked) first in their
        # order, dropped ones after them.
        keep = ok.any(-1) | (hidden.any(-1).any(-1) & in_range)  # [B, T]
        key = torch.where(keep, steps[None, :], steps[None, :] + frames)
        order = torch.argsort(key, dim=1)
        index = order[:, :, None, None].expand_as(normed)
        normed = torch.gather(normed, 1, index)
        kept = keep.sum(1)
        # Slicing by the constant max_len (not min(frames, max_len)) keeps the frame count
        # symbolic in the exported graph.
        normed = normed[:, : self.max_len]
        steps = steps[: self.max_len]
        mask = steps[None, :] < kept[:, None]

        pos = normed.reshape(batch, normed.shape[1], -1)
        lag1 = pos - F.pad(pos, (0, 0, 1, 0))[:, :-1]
        lag2 = pos - F.pad(pos, (0, 0, 2, 0))[:, :-2]
        # Motion from before the first frame is undefined: zero, like the padding.
        first = steps[None, :, None]
        lag1 = torch.where(first >= 1, lag1, torch.zeros_like(lag1))
        lag2 = torch.where(first >= 2, lag2, torch.zeros_like(lag2))
        feats = torch.cat([pos, lag1, lag2], -1)
        feats = torch.where(torch.isnan(feats) | ~mask[:, :, None], torch.zeros_like(feats), feats)
        return feats, mask


def drop_empty_frames(landmarks: np.ndarray, max_len: int, coords: int = 2) -> np.ndarray:
    """Numpy twin of the featurizer's frame dropping and truncation, for the data loader.

    Dropping the same frames earlier keeps batches small; the featurizer then finds
    nothing left to drop, so training and the exported graph see the same frames. A frame
    with a masked (``HIDDEN``) point stays, as in the featurizer.
    """
    xy = landmarks[..., :coords]
    keep = np.isfinite(xy).all(-1).any(-1) | np.isinf(xy).any((-1, -2))
    return landmarks[keep][:max_len]
