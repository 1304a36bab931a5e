"""The cube step replayed as CUDA graphs trains exactly as the eager step does.

The CUDA tests need a GPU and are skipped without one (they ran on an H200 through the
project's device runs); the CPU test checks that every call there runs the model eagerly.
This file imports nothing of Django, so it also runs where only torch is installed
(``python -m pytest --noconftest tests/training/test_cube_graphed.py``).
"""

from __future__ import annotations

import copy

import pytest
import torch

from training.cube.config import CubeConfig
from training.cube.graphed import CapturedCube
from training.cube.losses import DEFAULT_WEIGHTS, total_loss
from training.cube.model import CubeModel

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _model(device: str, **config: object) -> CubeModel:
    torch.manual_seed(0)
    return CubeModel(CubeConfig(lattice_edge=4, teacher_dim=32, **config)).to(device)  # type: ignore[arg-type]


def _train(model: CubeModel, captured: CapturedCube | None, batches: list[torch.Tensor], mixed: bool) -> list[float]:
    """A few AdamW steps; the losses."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x in batches:
        with torch.autocast(x.device.type, dtype=torch.float16, enabled=mixed):
            output = captured(model, x) if captured is not None else model(x)
            loss, _ = total_loss(output, x, DEFAULT_WEIGHTS)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return losses


def test_off_cuda_every_call_is_eager() -> None:
    model = _model("cpu")
    captured = CapturedCube(model)
    x = torch.randn(4, 32)
    out = captured(model, x)
    assert captured.replays == 0
    torch.testing.assert_close(out.prediction, model(x).prediction)


@cuda
@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("options", [{}, {"gate": "topk"}, {"activation_checkpointing": True}])
def test_graphs_train_as_the_eager_step_does(mixed: bool, options: dict[str, object]) -> None:
    eager = _model("cuda", **options)
    graphed = copy.deepcopy(eager)
    generator = torch.Generator(device="cuda").manual_seed(1)
    batches = [torch.randn(4, 32, device="cuda", generator=generator) for _ in range(5)]
    captured = CapturedCube(graphed)
    eager_losses = _train(eager, None, batches, mixed)
    graphed_losses = _train(graphed, captured, batches, mixed)
    assert captured.replays == len(batches)  # every step replayed, none fell back
    # The replays read the parameters the optimizer updated in place: the losses follow the
    # eager run step by step, and so do the weights.
    assert graphed_losses == pytest.approx(eager_losses, rel=1e-3, abs=1e-5)
    for (name, a), b in zip(eager.named_parameters(), graphed.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=name)


@cuda
def test_evaluation_and_other_shapes_run_eagerly() -> None:
    model = _model("cuda")
    captured = CapturedCube(model)
    captured(model, torch.randn(4, 32, device="cuda"))
    model.eval()
    with torch.no_grad():
        captured(model, torch.randn(4, 32, device="cuda"))
    model.train()
    for size in (3, 2, 1):  # the graph cap (two shapes) is reached; the third runs eagerly
        captured(model, torch.randn(size, 32, device="cuda"))
    assert captured.replays == 3
