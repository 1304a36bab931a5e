"""Honest runs on another machine pass the proof of training (issue 24).

The platform checks a run's checkpoint 0 against the seeded initialisation bit for bit, and
re-executes its segments on its own CPU. The node that trained the run may have another
CPU. Here a second process stands in for that node: it uses PyTorch's baseline CPU kernels
(``ATEN_CPU_CAPABILITY=default``: no AVX2, no fused multiply-add), MKL limited to SSE4.2,
oneDNN limited to SSE4.1, and one thread. Its arithmetic differs from this process's, and
the test checks that it does. A GPU is the other device a node may have;
``bench/cross_device.py --train-device cuda`` checks one where a GPU is lent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.factories import TINY_ASL, TINY_CUBE
from training.asl.run import measure_segments as asl_measure
from training.asl.run import replay_segments as asl_replay
from training.asl.run import untrained_weights as asl_untrained
from training.asl.synthetic import generate
from training.cube.run import measure_segments as cube_measure
from training.cube.run import replay_segments as cube_replay
from training.cube.run import untrained_weights as cube_untrained
from training.portable import portable_init
from training.replay import TOLERANCE
from training.trace import Segment, checkpoint_name, read_trace

ROOT = Path(__file__).resolve().parents[2]
OTHER_KERNELS = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "OMP_NUM_THREADS": "1",
}
CUBE = {**TINY_CUBE, "synthetic_samples": 96, "epochs": 2}
ASL = {**TINY_ASL, "epochs": 2}

# Run in the stand-in node: PyTorch's own initialisation of a layer, the untrained weights'
# sha256 of both kinds, and traced runs of both kinds, fp32 and bf16 autocast.
NODE = """
import json, sys
from pathlib import Path
import torch
from training.artifacts import weights_sha256
from training.asl.run import run as asl_run, untrained_weights as asl_untrained
from training.cube.run import run as cube_run, untrained_weights as cube_untrained
job = json.loads(sys.argv[1]); out = Path(job["out"]); data = Path(job["data"])
torch.manual_seed(0)
report = {
    "capability": torch.backends.cpu.get_cpu_capability(),
    "torch_linear": weights_sha256(torch.nn.Linear(300, 200)),
    "cube_untrained": cube_untrained(job["cube"], None),
    "asl_untrained": asl_untrained(job["asl"], data),
}
for mixed in (False, True):
    name = f"cube-{'bf16' if mixed else 'fp32'}"
    cube_run({**job["cube"], "mixed_precision": mixed}, out / "none", out / name, trace_dir=out / name / "trace")
    name = f"asl-{'bf16' if mixed else 'fp32'}"
    asl_run({**job["asl"], "mixed_precision": mixed}, data, out / name, cache_dir=out / "cache", resume=False,
            trace_dir=out / name / "trace")
print(json.dumps(report))
"""


def _node(tmp: Path, data: Path) -> dict[str, Any]:
    """Run ``NODE`` under the other kernels; what it reports."""
    job = {"out": str(tmp), "data": str(data), "cube": CUBE, "asl": ASL}
    env = {**os.environ, **OTHER_KERNELS, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-c", NODE, json.dumps(job)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU has no AVX2: its kernels are the stand-in node's, so nothing differs")
    tmp = tmp_path_factory.mktemp("node")
    data = generate(tmp / "signs.zip", n_signs=4, n_participants=4, per_participant=3, max_frames=16, as_zip=True)
    return tmp, data, _node(tmp, data)


def _segments(folder: Path) -> list[Segment]:
    trace = read_trace(folder / "trace.json")
    return [
        Segment(folder / checkpoint_name(a.index), a, folder / checkpoint_name(b.index), b)
        for a, b in zip(trace.leaves, trace.leaves[1:], strict=False)
    ]


def test_the_node_computes_differently(node: tuple[Path, Path, dict[str, Any]]) -> None:
    # The premise: PyTorch's own seeded initialisation of a layer is not the same bits there
    # (a layer whose bound is not a power of two, so that a fused multiply-add rounds otherwise).
    _, _, report = node
    assert report["capability"] == "DEFAULT"
    torch.manual_seed(0)
    from training.artifacts import weights_sha256

    assert report["torch_linear"] != weights_sha256(nn.Linear(300, 200))


def test_the_untrained_weights_are_the_same_bits_on_both(node: tuple[Path, Path, dict[str, Any]]) -> None:
    _, data, report = node
    assert report["cube_untrained"] == cube_untrained(CUBE, None)
    assert report["asl_untrained"] == asl_untrained(ASL, data)


@pytest.mark.parametrize("kind", ["cube", "asl"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_segment_of_an_honest_run_there_re_executes_here(
    node: tuple[Path, Path, dict[str, Any]], kind: str, precision: str
) -> None:
    tmp, data, _ = node
    folder = tmp / f"{kind}-{precision}" / "trace"
    segments = _segments(folder)
    assert read_trace(folder / "trace.json").leaves[0].weights_sha256 == (
        cube_untrained(CUBE, None) if kind == "cube" else asl_untrained(ASL, data)
    )
    spec = {**(CUBE if kind == "cube" else ASL), "mixed_precision": precision == "bf16"}
    if kind == "cube":
        assert cube_replay(spec, None, segments) == [""] * len(segments)
        [gap] = cube_measure(spec, None, segments[:1])
    else:
        assert asl_replay(spec, data, segments) == [""] * len(segments)
        [gap] = asl_measure(spec, data, segments[:1])
    # The node's first segment is not this machine's bit for bit: the replay passed within
    # the tolerance, not by computing exactly what the node computed.
    assert isinstance(gap, float)
    assert 0.0 < gap <= TOLERANCE


def test_portable_init_draws_pytorch_default_bounds() -> None:
    layer = portable_init(nn.Linear(400, 300), seed=3)
    bound = 1 / 400**0.5
    w = layer.weight.detach()
    assert float(w.abs().max()) < bound
    assert abs(float(w.std()) - bound / 3**0.5) < 0.01 * bound
    assert abs(float(w.mean())) < 0.01 * bound
    assert float(layer.bias.detach().abs().max()) < bound
    assert w.unique().numel() > 0.99 * w.numel()  # a fine grid: 2²⁴ points


def test_portable_init_is_a_function_of_the_seed() -> None:
    a = portable_init(nn.Linear(8, 4), seed=1).weight.detach().clone()
    torch.manual_seed(123)  # the global generator plays no part
    b = portable_init(nn.Linear(8, 4), seed=1).weight.detach()
    c = portable_init(nn.Linear(8, 4), seed=2).weight.detach()
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_a_tensor_without_a_portable_rule_is_refused() -> None:
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.randn(5))
            self.gate = nn.Parameter(torch.zeros(3))  # constant: kept as it is

    with pytest.raises(ValueError, match="scale has no portable initialisation rule"):
        portable_init(Odd(), seed=0)

    class OneDrawn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(1)  # ones and zeros: constants
            self.temperature = nn.Parameter(torch.randn(1))  # one drawn element: not a constant

    with pytest.raises(ValueError, match="temperature has no portable initialisation rule"):
        portable_init(OneDrawn(), seed=0)

    class Stated(Odd):
        PORTABLE_BOUNDS = {"scale": 0.5}

    model = portable_init(Stated(), seed=0)
    assert float(model.scale.detach().abs().max()) < 0.5
    assert torch.equal(model.gate, torch.zeros(3))
