"""Evaluation: loss, top-1 / top-5 accuracy and a confusion summary, in full precision."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from training.loop import to_device


@torch.no_grad()
def predict_logits(model: nn.Module, loader: Iterable[dict[str, torch.Tensor]]) -> tuple[np.ndarray, np.ndarray]:
    """(logits [N, classes], labels [N]) over a loader, in eval mode."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    logits, labels = [], []
    for batch in loader:
        batch = to_device(batch, device)
        logits.append(model(batch["x"], batch["lengths"]).float().cpu())
        labels.append(batch["y"].cpu())
    model.train(was_training)
    if not logits:
        return np.zeros((0, 0), np.float32), np.zeros(0, np.int64)
    return torch.cat(logits).numpy(), torch.cat(labels).numpy()


def accuracy_metrics(logits: np.ndarray, labels: np.ndarray, prefix: str = "val_") -> dict[str, float]:
    """Loss (plain cross-entropy), top-1 and top-5 accuracy."""
    if labels.size == 0:
        return {f"{prefix}loss": 0.0, f"{prefix}top1": 0.0, f"{prefix}top5": 0.0}
    t_logits, t_labels = torch.from_numpy(logits), torch.from_numpy(labels)
    loss = float(F.cross_entropy(t_logits, t_labels))
    k = min(5, logits.shape[1])
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return {
        f"{prefix}loss": loss,
        f"{prefix}top1": float(np.mean(top[:, 0] == labels)),
        f"{prefix}top5": float(np.mean((top == labels[:, None]).any(1))),
    }


def confusion_summary(logits: np.ndarray, labels: np.ndarray, signs: list[str], worst: int = 10) -> dict[str, Any]:
    """The most confused (true → predicted) pairs and the least accurate signs."""
    if labels.size == 0:
        return {"pairs": [], "worst_signs": []}
    predicted = logits.argmax(1)
    n = len(signs)
    matrix = np.zeros((n, n), dtype=np.int64)
    np.add.at(matrix, (labels, predicted), 1)
    off = matrix.copy()
    np.fill_diagonal(off, 0)
    flat = np.argsort(-off, axis=None, kind="stable")[:worst]
    pairs = [
        {"true": signs[i], "predicted": signs[j], "count": int(off[i, j])}
        for i, j in zip(*np.unravel_index(flat, off.shape), strict=True)
        if off[i, j] > 0
    ]
    support = matrix.sum(1)
    seen = np.flatnonzero(support)
    acc = matrix.diagonal()[seen] / support[seen]
    order = seen[np.argsort(acc, kind="stable")][:worst]
    worst_signs = [
        {"sign": signs[i], "accuracy": float(matrix[i, i] / support[i]), "support": int(support[i])} for i in order
    ]
    return {"pairs": pairs, "worst_signs": worst_signs}
