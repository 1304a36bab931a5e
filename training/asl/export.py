"""Model artifacts: model.safetensors + config.json + labels.json, and the ONNX export.

The ONNX graph follows the competition's contract: input ``inputs`` [frames, 543, 3]
float32 with NaNs, output ``outputs`` [num_signs] logits, with every preprocessing step
inside the graph.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.artifacts import ArtifactError, load_model_weights, read_json, save_model, write_json
from training.asl.model import LEGACY_CONFIG, CompetitionModel, ModelConfig, SignModel

LABELS_FILE = "labels.json"
ONNX_FILE = "model.onnx"
OPSET = 17


def save(out_dir: Path, model: SignModel, signs: list[str]) -> None:
    """Write the three artifacts a trained model consists of."""
    save_model(out_dir, model, model.config.to_dict())
    write_json(
        Path(out_dir) / LABELS_FILE, {"signs": signs, "sign_to_prediction_index": {s: i for i, s in enumerate(signs)}}
    )


def load(model_dir: Path, device: str | torch.device = "cpu") -> tuple[SignModel, list[str]]:
    """Rebuild a model (eval mode) and its label list; ArtifactError naming the file if unusable."""
    model_dir = Path(model_dir)
    raw: Any = read_json(model_dir / "config.json")
    try:
        config = ModelConfig(**({**LEGACY_CONFIG, **raw} if isinstance(raw, dict) else raw))
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{model_dir / 'config.json'}: not an ASL model config ({exc}).") from exc
    labels: Any = read_json(model_dir / LABELS_FILE)
    signs = labels.get("signs") if isinstance(labels, dict) else None
    if not isinstance(signs, list) or len(signs) != config.num_classes:
        raise ArtifactError(f"{model_dir / LABELS_FILE}: expected {config.num_classes} signs.")
    model = SignModel(config)
    load_model_weights(model, model_dir)
    return model.to(device).eval(), [str(s) for s in signs]


def export_onnx(model: SignModel, path: Path, example_frames: int = 23) -> Path:
    """Export the competition-contract graph to ``path`` (needs the ``onnx`` package)."""
    wrapper = CompetitionModel(model).cpu().eval()
    example = torch.rand(example_frames, 543, 3)
    example[:5, 468:489] = float("nan")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated in favour of the dynamo one, which would
        # need onnxscript; this graph has static shapes given the frame count, so it fits.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            (example,),
            str(path),
            dynamo=False,
            input_names=["inputs"],
            output_names=["outputs"],
            dynamic_axes={"inputs": {0: "frames"}},
            opset_version=OPSET,
        )
    return path


def onnx_parity(model: SignModel, path: Path, sequences: list[np.ndarray]) -> float:
    """Largest absolute logit difference between onnxruntime and PyTorch over ``sequences``."""
    import onnxruntime as ort  # optional dependency: only the export check needs it

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    wrapper = CompetitionModel(model).cpu().eval()
    worst = 0.0
    with torch.no_grad():
        for seq in sequences:
            ours = wrapper(torch.from_numpy(np.array(seq, dtype=np.float32))).numpy()
            theirs = session.run(["outputs"], {"inputs": np.ascontiguousarray(seq, dtype=np.float32)})[0]
            if theirs.shape != ours.shape:
                raise AssertionError(f"ONNX output shape {theirs.shape} != {ours.shape}")
            worst = max(worst, float(np.max(np.abs(theirs - ours))))
    return worst
