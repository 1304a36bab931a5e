"""Artifacts on disk: safetensors for every tensor, JSON for everything else.

Nothing here pickles. A nested state (an optimizer's or a scheduler's ``state_dict``) is
split into its tensors, written to ``<stem>.safetensors`` under dotted keys, and the rest
of its structure, written to ``<stem>.json`` with ``{"__tensor__": key}`` placeholders.
Loading reverses that, so a checkpoint written by an untrusted worker can be read back
without executing anything from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

_TENSOR = "__tensor__"
_TUPLE = "__tuple__"
_INTKEYS = "__intkeys__"


class ArtifactError(ValueError):
    """A file the trainer wrote or reads is missing, malformed, or does not fit the model."""


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    # Write-then-rename so a crash mid-write never leaves a half checkpoint behind.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as indented JSON, atomically."""
    _atomic_write_bytes(path, (json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())


def read_json(path: Path) -> Any:
    """Read a JSON file, raising ArtifactError naming the file when it is missing or invalid."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ArtifactError(f"{path}: file not found.") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc}).") from exc


def save_tensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Save a flat name → tensor map as safetensors (copied to contiguous CPU memory first)."""
    flat = {name: t.detach().to("cpu").contiguous().clone() for name, t in tensors.items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        save_file(flat, tmp, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_tensors(path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Load a safetensors file, raising ArtifactError naming the file when it cannot be read."""
    try:
        return load_file(str(path), device=str(device))
    except FileNotFoundError as exc:
        raise ArtifactError(f"{path}: file not found.") from exc
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: not a readable safetensors file ({exc}).") from exc


def _split(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj
        return {_TENSOR: prefix}
    if isinstance(obj, Mapping):
        keys = list(obj.keys())
        if keys and all(isinstance(k, int) for k in keys):
            # Optimizer state is keyed by parameter index; JSON keys are strings.
            return {_INTKEYS: {str(k): _split(obj[k], f"{prefix}.{k}", tensors) for k in keys}}
        return {str(k): _split(v, f"{prefix}.{k}", tensors) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return {_TUPLE: [_split(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_split(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise ArtifactError(f"Cannot store a value of type {type(obj).__name__} at {prefix!r} without pickling.")


def _join(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_TENSOR}:
            key = obj[_TENSOR]
            if key not in tensors:
                raise ArtifactError(f"Checkpoint is missing tensor {key!r}.")
            return tensors[key]
        if set(obj) == {_INTKEYS}:
            return {int(k): _join(v, tensors) for k, v in obj[_INTKEYS].items()}
        if set(obj) == {_TUPLE}:
            return tuple(_join(v, tensors) for v in obj[_TUPLE])
        return {k: _join(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join(v, tensors) for v in obj]
    return obj


def save_state(stem: Path, state: Mapping[str, Any]) -> None:
    """Save a nested state (dicts, lists, tuples, tensors, JSON scalars) as ``stem``.safetensors + .json."""
    stem = Path(stem)
    tensors: dict[str, torch.Tensor] = {}
    structure = _split(dict(state), "s", tensors)
    # Tensors first: the JSON is the commit marker a loader looks for.
    save_tensors(stem.with_suffix(".safetensors"), tensors)
    write_json(stem.with_suffix(".json"), structure)


def load_state(stem: Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Load what ``save_state`` wrote."""
    stem = Path(stem)
    structure = read_json(stem.with_suffix(".json"))
    tensors = load_tensors(stem.with_suffix(".safetensors"), device=device)
    state = _join(structure, tensors)
    if not isinstance(state, dict):
        raise ArtifactError(f"{stem}.json: expected a JSON object at the top level.")
    return state


def state_exists(stem: Path) -> bool:
    """Whether a complete ``save_state`` pair exists at ``stem``."""
    stem = Path(stem)
    return stem.with_suffix(".json").is_file() and stem.with_suffix(".safetensors").is_file()


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters and persistent buffers, as a flat name → tensor map."""
    return dict(model.state_dict())


def load_model_tensors(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor], source: str = "weights") -> None:
    """Load ``tensors`` into ``model`` strictly, raising ArtifactError listing what does not fit."""
    own = model.state_dict()
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    wrong = sorted(k for k in set(own) & set(tensors) if tuple(own[k].shape) != tuple(tensors[k].shape))
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing[:5]}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:5]}")
        if wrong:
            parts.append(
                "wrong shape " + ", ".join(f"{k} {tuple(tensors[k].shape)} != {tuple(own[k].shape)}" for k in wrong[:5])
            )
        raise ArtifactError(f"{source} do not fit the model: " + "; ".join(parts) + ".")
    model.load_state_dict(dict(tensors), strict=True)


def save_model(out_dir: Path, model: torch.nn.Module, config: Mapping[str, Any]) -> None:
    """Write ``model.safetensors`` and ``config.json`` (the model's constructor arguments) into ``out_dir``."""
    out_dir = Path(out_dir)
    save_tensors(out_dir / "model.safetensors", model_tensors(model), metadata={"format": "pt"})
    write_json(out_dir / "config.json", dict(config))


def load_model_weights(model: torch.nn.Module, model_dir: Path) -> None:
    """Load ``model_dir``/model.safetensors into ``model`` strictly."""
    path = Path(model_dir) / "model.safetensors"
    load_model_tensors(model, load_tensors(path), source=str(path))


def export_hf(
    out_dir: Path,
    model: torch.nn.Module,
    config: Mapping[str, Any],
    *,
    title: str,
    description: str,
    metrics: Mapping[str, Any] | None = None,
    tags: list[str] | None = None,
) -> None:
    """Export in Hugging Face layout: model.safetensors, config.json and a README.md model card."""
    out_dir = Path(out_dir)
    save_model(out_dir, model, config)
    params = sum(p.numel() for p in model.parameters())
    lines = ["---", "library_name: pytorch", "tags:"]
    lines += [f"- {t}" for t in (tags or ["proofwork"])]
    lines += ["---", "", f"# {title}", "", description.strip(), "", f"Parameters: {params:,}", ""]
    if metrics:
        lines += ["## Metrics", "", "| metric | value |", "|---|---|"]
        for key in sorted(metrics):
            value = metrics[key]
            if isinstance(value, float):
                value = f"{value:.6g}"
            if isinstance(value, int | float | str):
                lines.append(f"| {key} | {value} |")
        lines.append("")
    lines += ["## Configuration", "", "```json", json.dumps(dict(config), indent=2, sort_keys=True), "```", ""]
    lines += [
        "## Files",
        "",
        "- `model.safetensors`: weights (safetensors, no pickle).",
        "- `config.json`: the constructor arguments needed to rebuild the model.",
        "",
    ]
    _atomic_write_bytes(out_dir / "README.md", "\n".join(lines).encode())


# A training-state file: one safetensors file whose metadata holds the state's structure.
STATE_FORMAT = "proofwork-training-state"
_STATE_VERSION = "1"


def save_state_file(path: Path, state: Mapping[str, Any]) -> None:
    """Save a nested state as ONE safetensors file: the tensors under dotted keys, the rest
    of the structure as JSON in the file's metadata (``structure``). Nothing is pickled."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _split(dict(state), "s", tensors)
    metadata = {
        "format": STATE_FORMAT,
        "version": _STATE_VERSION,
        "structure": json.dumps(structure, sort_keys=True, allow_nan=False),
    }
    save_tensors(path, tensors, metadata=metadata)


def read_state_file(path: Path, max_bytes: int) -> dict[str, Any]:
    """Load what ``save_state_file`` wrote, from a file that may come from anyone: refused
    (ArtifactError, saying why) when larger than ``max_bytes``, not a safetensors file (a
    pickle, say), without the structure, or holding a tensor the structure does not name."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError as exc:
        raise ArtifactError(f"{path.name}: file not found.") from exc
    if size > max_bytes:
        raise ArtifactError(f"{path.name}: {size:,} bytes, more than the {max_bytes:,} a training state may take.")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            names = set(handle.keys())
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"{path.name}: not a safetensors file ({exc}).") from None
    if metadata.get("format") != STATE_FORMAT or metadata.get("version") != _STATE_VERSION:
        raise ArtifactError(f"{path.name}: not a version-{_STATE_VERSION} training state (metadata 'format').")
    try:
        structure = json.loads(metadata.get("structure", ""))
    except (json.JSONDecodeError, RecursionError):
        raise ArtifactError(f"{path.name}: its structure metadata is not valid JSON.") from None
    named: set[str] = set()
    _tensor_names(structure, named)
    if names != named:
        extra, missing = sorted(names - named), sorted(named - names)
        parts = ([f"tensors it does not describe {extra[:5]}"] if extra else []) + (
            [f"no tensors {missing[:5]}"] if missing else []
        )
        raise ArtifactError(f"{path.name}: holds " + " and ".join(parts) + ".")
    try:
        state = _join(structure, load_tensors(path))
    except (AttributeError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path.name}: its structure metadata is malformed ({exc}).") from None
    if not isinstance(state, dict):
        raise ArtifactError(f"{path.name}: expected a JSON object at the top of its structure.")
    return state


def _tensor_names(obj: Any, out: set[str], depth: int = 0) -> None:
    if depth > 64:
        raise ArtifactError("training state: its structure is nested too deeply.")
    if isinstance(obj, dict):
        if set(obj) == {_TENSOR}:
            if not isinstance(obj[_TENSOR], str):
                raise ArtifactError("training state: a tensor placeholder does not name a tensor.")
            out.add(obj[_TENSOR])
            return
        for value in obj.values():
            _tensor_names(value, out, depth + 1)
    elif isinstance(obj, list):
        for value in obj:
            _tensor_names(value, out, depth + 1)


def flatten_tensors(state: Any, prefix: str = "s") -> dict[str, torch.Tensor]:
    """The tensors of a nested state under the dotted keys ``save_state_file`` gives them."""
    tensors: dict[str, torch.Tensor] = {}
    _split(state, prefix, tensors)
    return tensors


def weights_sha256(model: torch.nn.Module) -> str:
    """Hex sha256 of the ``model.safetensors`` that ``save_model`` writes for these weights."""
    from safetensors.torch import save

    flat = {name: t.detach().to("cpu").contiguous() for name, t in model_tensors(model).items()}
    return hashlib.sha256(save(flat, metadata={"format": "pt"})).hexdigest()
