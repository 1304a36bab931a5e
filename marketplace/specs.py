"""Spec serializers, one per task kind. Every field is typed, bounded and defaulted,
with its unit in the help text; unknown keys are refused so a typo never silently
falls back to a default."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from rest_framework import serializers

from training.poc import spec as poc_spec


class FiniteFloatField(serializers.FloatField):
    """A float that refuses NaN and ±Infinity (JSON forbids them, strings can carry them)."""

    default_error_messages = {"not_finite": "Must be a finite number (not NaN or Infinity)."}

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            self.fail("not_finite")
        return value


class StrictIntegerField(serializers.IntegerField):
    """An integer that refuses booleans and non-integral floats such as 3.5."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or (isinstance(data, float) and not data.is_integer()):
            self.fail("invalid")
        return super().to_internal_value(data)


class SpecSerializer(serializers.Serializer):
    """Base for kind specs: rejects unknown keys and non-object input."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["The spec must be a JSON object."]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({key: ["Unknown field for this kind."] for key in unknown})
        return super().to_internal_value(data)


def Int(default: int, lo: int, hi: int, help_text: str) -> StrictIntegerField:  # noqa: N802
    return StrictIntegerField(default=default, min_value=lo, max_value=hi, help_text=help_text)


def Float(default: float, lo: float, hi: float, help_text: str) -> FiniteFloatField:  # noqa: N802
    return FiniteFloatField(default=default, min_value=lo, max_value=hi, help_text=help_text)


def Bool(default: bool, help_text: str) -> serializers.BooleanField:  # noqa: N802
    return serializers.BooleanField(default=default, help_text=help_text)


# Room for the safetensors header of the product file (a few hundred bytes for 64 tensors).
_ARTIFACT_HEADER_BYTES = 16 * 1024


class SyntheticSpec(SpecSerializer):
    """Exact matmul of seeded integer matrices: the proof-of-compute kind."""

    n = Int(1024, 64, 16384, "Matrix edge n: A and B are n×n.")
    count = Int(1, 1, 64, "Number of (A, B) pairs to multiply.")
    entry_bound = Int(8, 1, 8, "Entries are integers in [-entry_bound, entry_bound].")
    generator = serializers.ChoiceField(
        choices=list(poc_spec.GENERATORS),
        default=poc_spec.DEFAULT_GENERATOR,
        help_text=(
            "How A and B are drawn from the seed: aes256ctr (AES-256 in counter mode, the fast default) "
            "or shake128 (the first generator, several times slower to check; kept for tasks posted with it)."
        ),
        style={"form": False},
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # Exactness in float32 needs every partial sum below 2**24.
        if attrs["n"] * attrs["entry_bound"] ** 2 >= 2**24:
            raise serializers.ValidationError(
                {"entry_bound": ["n × entry_bound² must stay below 2^24 so float32 products are exact."]}
            )
        # The products go up as one int32 artifact, which the platform caps: a task whose
        # file could never be uploaded would cost every worker that tried it.
        per_product = 4 * attrs["n"] ** 2
        most = (settings.ARTIFACT_MAX_BYTES - _ARTIFACT_HEADER_BYTES) // per_product
        if most < 1:
            raise serializers.ValidationError(
                {"n": [f"An {attrs['n']}×{attrs['n']} product is larger than the platform's result limit."]}
            )
        if attrs["count"] > most:
            raise serializers.ValidationError(
                {
                    "count": [
                        f"{attrs['count']} products of {attrs['n']}×{attrs['n']} make a "
                        f"{attrs['count'] * per_product / 2**30:.1f} GiB result; the platform takes results up to "
                        f"{settings.ARTIFACT_MAX_BYTES / 2**30:.1f} GiB, so at most {most} at this n."
                    ]
                }
            )
        return attrs


class CubeTrainingSpec(SpecSerializer):
    """A 3D cellular neural network trained on teacher embeddings."""

    mode = serializers.ChoiceField(
        choices=["autoencoder", "dialogue"],
        default="autoencoder",
        help_text="Reconstruct the input or map question → answer.",
    )
    teacher_dim = Int(768, 16, 4096, "Teacher embedding width (dimensions).")
    lattice_edge = Int(8, 2, 64, "Lattice edge S: the lattice is S×S×S cells.")
    state_size = Int(32, 4, 256, "Cell state width (dimensions).")
    steps = Int(5, 1, 32, "Synchronous lattice update steps.")
    gate = serializers.ChoiceField(choices=["soft", "topk"], default="soft", help_text="How the expert gate mixes.")
    top_k = Int(2, 1, 3, "Experts kept per cell when gate is topk.")
    early_exit_tolerance = Float(0.0, 0.0, 1.0, "Stop stepping when the mean state change falls below this (0: never).")
    epochs = Int(10, 1, 1000, "Training epochs.")
    batch_size = Int(8, 1, 1024, "Samples per optimiser step (before accumulation).")
    grad_accumulation = Int(1, 1, 64, "Micro-batches per optimiser step.")
    learning_rate = Float(1e-3, 1e-7, 1.0, "AdamW peak learning rate.")
    weight_decay = Float(0.01, 0.0, 1.0, "AdamW weight decay.")
    warmup_steps = Int(100, 0, 100_000, "Linear warm-up steps before the cosine schedule.")
    grad_clip = Float(1.0, 0.0, 100.0, "Gradient norm clip (0: off).")
    early_stopping_patience = Int(5, 0, 1000, "Epochs without validation improvement before stopping (0: off).")
    loss_reconstruction = Float(1.0, 0.0, 100.0, "Weight of the reconstruction (MSE) loss.")
    loss_similarity = Float(0.5, 0.0, 100.0, "Weight of the batch cosine-similarity structure loss.")
    loss_diversity = Float(0.1, 0.0, 100.0, "Weight of the diversity loss.")
    loss_emergence = Float(0.05, 0.0, 100.0, "Weight of the emergence loss.")
    loss_dynamics = Float(0.05, 0.0, 100.0, "Weight of the bounded per-step change loss.")
    loss_spatial = Float(0.05, 0.0, 100.0, "Weight of the spatial consistency loss.")
    synthetic_samples = Int(2048, 0, 1_000_000, "Generated samples when no dataset is given (0: dataset required).")
    mixed_precision = Bool(True, "bf16 on CPU, fp16 with loss scaling on CUDA.")
    compile = Bool(False, "Use torch.compile where available.")
    seed = Int(0, 0, 2**31 - 1, "Random seed for a deterministic run.")
    min_loss_reduction = Int(
        0,
        0,
        99,
        "Percent below the untrained model's held-out loss that the trained model's must reach to be"
        " paid; the platform's own minimum (20 unless configured) applies when this is lower.",
    )


class CubeInferenceSpec(SpecSerializer):
    """Run a trained cube model on uploaded embeddings."""

    source_task = serializers.UUIDField(help_text="A completed cube_training task whose model to use.")
    batch_size = Int(64, 1, 4096, "Rows per forward pass.")
    verify_samples = Int(16, 1, 1024, "Rows the platform recomputes to verify the result.")


class AslTrainingSpec(SpecSerializer):
    """Isolated sign recognition on landmark sequences (ISLR format)."""

    dim = serializers.ChoiceField(choices=[192, 384], default=192, help_text="Model width (channels).")
    blocks = Int(2, 1, 8, "Stacks of [3 × Conv1D block + Transformer block].")
    max_len = Int(384, 16, 1024, "Frames kept per sequence.")
    use_pose = Bool(False, "Include the pose landmarks in the features.")
    epochs = Int(30, 1, 1000, "Training epochs.")
    batch_size = Int(12, 1, 1024, "Samples per micro-batch (0 presets by GPU memory).")
    grad_accumulation = Int(4, 1, 64, "Micro-batches per optimiser step.")
    optimizer = serializers.ChoiceField(choices=["adamw", "radam_lookahead"], default="adamw", help_text="Optimiser.")
    schedule = serializers.ChoiceField(
        choices=["onecycle", "cosine"], default="onecycle", help_text="Learning-rate schedule."
    )
    learning_rate = Float(1e-3, 1e-7, 1.0, "Peak learning rate.")
    weight_decay = Float(0.05, 0.0, 1.0, "Weight decay.")
    label_smoothing = Float(0.1, 0.0, 0.5, "Label smoothing.")
    dropout = Float(0.2, 0.0, 0.9, "Late dropout before the classifier.")
    drop_path = Float(0.2, 0.0, 0.9, "Stochastic depth rate.")
    use_augmentations = Bool(True, "Master switch for every augmentation.")
    p_temporal = Float(0.5, 0.0, 1.0, "Probability of temporal resampling and masking.")
    p_spatial = Float(0.7, 0.0, 1.0, "Probability of rotation, scale, shear, translation and flip.")
    p_noise = Float(0.3, 0.0, 1.0, "Probability of gaussian noise.")
    p_masking = Float(0.2, 0.0, 1.0, "Probability of feature masking and landmark dropout.")
    validation_fraction = Float(0.2, 0.05, 0.5, "Share of participants held out for validation.")
    early_stopping_patience = Int(10, 0, 1000, "Epochs without improvement before stopping (0: off).")
    min_accuracy = Float(0.0, 0.0, 1.0, "Held-out top-1 accuracy required for payment.")
    mixed_precision = Bool(True, "bf16 on CPU, fp16 with loss scaling on CUDA.")
    compile = Bool(False, "Use torch.compile where available.")
    seed = Int(0, 0, 2**31 - 1, "Random seed for a deterministic run.")


class AslInferenceSpec(SpecSerializer):
    """Predict signs for uploaded sequences with a trained ASL model."""

    source_task = serializers.UUIDField(help_text="A completed asl_training task whose model to use.")
    top_k = Int(5, 1, 20, "Signs reported per sequence.")
    verify_samples = Int(16, 1, 1024, "Sequences the platform recomputes to verify the result.")


def _field_schema(f: serializers.Field) -> dict[str, Any]:
    schema: dict[str, Any]
    if isinstance(f, serializers.ChoiceField):
        choices = list(f.choices)
        schema = {"enum": choices}
        if all(isinstance(c, int) for c in choices):
            schema["type"] = "integer"
        elif all(isinstance(c, str) for c in choices):
            schema["type"] = "string"
    elif isinstance(f, serializers.BooleanField):
        schema = {"type": "boolean"}
    elif isinstance(f, serializers.IntegerField):
        schema = {"type": "integer"}
    elif isinstance(f, serializers.FloatField):
        schema = {"type": "number"}
    elif isinstance(f, serializers.UUIDField):
        schema = {"type": "string", "format": "uuid"}
    else:
        schema = {"type": "string"}
    for attr, key in (("min_value", "minimum"), ("max_value", "maximum")):
        value = getattr(f, attr, None)
        if value is not None:
            schema[key] = value
    if f.default is not serializers.empty:
        schema["default"] = f.default
    if f.help_text:
        schema["description"] = str(f.help_text)
    return schema


def json_schema(serializer_class: type[SpecSerializer]) -> dict[str, Any]:
    """A JSON schema for a spec serializer: types, bounds, defaults and help texts."""
    fields = serializer_class().fields
    return {
        "type": "object",
        "title": serializer_class.__name__,
        "description": (serializer_class.__doc__ or "").strip(),
        "properties": {name: _field_schema(f) for name, f in fields.items()},
        "required": [name for name, f in fields.items() if f.required],
        "additionalProperties": False,
    }
