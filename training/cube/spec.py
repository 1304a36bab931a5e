"""The cube kinds' specs: the single schema the platform, the trainer and the verifier read."""

from __future__ import annotations

from dataclasses import dataclass

from training.specs import param

W = "Weight of the "


@dataclass(frozen=True)
class CubeTrainingSpec:
    """A 3D cellular neural network trained on teacher embeddings."""

    mode: str = param(
        "autoencoder",
        "Reconstruct the input or map question → answer.",
        choices=("autoencoder", "dialogue"),
        common=True,
    )
    teacher_dim: int = param(768, "Teacher embedding width (dimensions).", lo=16, hi=4096)
    lattice_edge: int = param(8, "Lattice edge S: the lattice is S×S×S cells.", lo=2, hi=64, common=True)
    state_size: int = param(32, "Cell state width (dimensions).", lo=4, hi=256)
    steps: int = param(
        0,
        "Synchronous lattice update steps; 0: T_min(S), the fewest after which every output-face cell"
        " sees every input-face cell (4 at 8³, 7 at 37³). A positive value must be at least T_min(S).",
        lo=0,
        hi=32,
    )
    gate: str = param("soft", "How the expert gate mixes.", choices=("soft", "topk"))
    top_k: int = param(2, "Experts kept per cell when gate is topk.", lo=1, hi=3)
    early_exit_tolerance: float = param(
        0.0, "Stop stepping when the mean state change falls below this (0: never).", lo=0.0, hi=1.0
    )
    epochs: int = param(10, "Training epochs.", lo=1, hi=1000, common=True)
    batch_size: int = param(8, "Samples per optimiser step (before accumulation).", lo=1, hi=1024)
    grad_accumulation: int = param(1, "Micro-batches per optimiser step.", lo=1, hi=64)
    learning_rate: float = param(1e-3, "AdamW peak learning rate.", lo=1e-7, hi=1.0, common=True)
    weight_decay: float = param(0.01, "AdamW weight decay.", lo=0.0, hi=1.0)
    warmup_steps: int = param(100, "Linear warm-up steps before the cosine schedule.", lo=0, hi=100_000)
    grad_clip: float = param(1.0, "Gradient norm clip (0: off).", lo=0.0, hi=100.0)
    early_stopping_patience: int = param(
        5, "Epochs without validation improvement before stopping (0: off).", lo=0, hi=1000
    )
    loss_reconstruction: float = param(1.0, W + "reconstruction (MSE) loss.", lo=0.0, hi=100.0)
    loss_similarity: float = param(0.5, W + "batch cosine-similarity structure loss.", lo=0.0, hi=100.0)
    loss_diversity: float = param(0.1, W + "diversity loss.", lo=0.0, hi=100.0)
    loss_balance: float = param(
        0.1, W + "expert load-balancing loss (top-k gate only: zero with the soft gate).", lo=0.0, hi=100.0
    )
    synthetic_samples: int = param(
        2048, "Generated samples when no dataset is given (0: dataset required).", lo=0, hi=1_000_000
    )
    mixed_precision: bool = param(True, "bf16 autocast (fp32 on a GPU without native bf16).")
    compile: bool = param(False, "Use torch.compile where available.")
    seed: int = param(0, "Random seed for a deterministic run.", lo=0, hi=2**31 - 1)
    # The platform's acceptance bar, not a training setting: the trainer ignores it, and the
    # platform leaves it out of the job it sends (workers.assignments.jobs), so agents that predate it
    # still take the task.
    min_loss_reduction: int = param(
        0,
        "Percent below the untrained model's held-out loss that the trained model's must reach to be"
        " paid; the platform's own minimum (20 unless configured) applies when this is lower.",
        lo=0,
        hi=99,
        common=True,
    )


# Loss weights of terms the cube model no longer has (docs/kinds.md says why): a task stored
# with them still trains and verifies, the weights ignored.
RETIRED_TRAINING_FIELDS = frozenset({"loss_emergence", "loss_dynamics", "loss_spatial"})


@dataclass(frozen=True)
class CubeInferenceSpec:
    """Run a trained cube model on uploaded embeddings."""

    source_task: str = param(help="A completed cube_training task whose model to use.", uuid=True)
    batch_size: int = param(64, "Rows per forward pass.", lo=1, hi=4096, common=True)
    verify_samples: int = param(16, "Rows the platform recomputes to verify the result.", lo=1, hi=1024, common=True)
