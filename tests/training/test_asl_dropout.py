"""The ASL model's dropout masks come from the CPU generator, whatever the model trains on.

Proof of training replays a worker's steps on the platform's CPU from the step's seed: a
mask drawn on the worker's device (CUDA's Philox, the fused attention kernels' own draws)
would differ from the replay's, and every honest GPU-trained segment would be rejected.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils._python_dispatch import TorchDispatchMode

from training.asl import model as asl_model
from training.asl.landmarks import selected_landmarks
from training.asl.model import ModelConfig, SignModel, TransformerBlock

POINTS = len(selected_landmarks(use_pose=False))
LENGTHS = [16, 9, 3]


def tiny_model(**overrides: Any) -> SignModel:
    torch.manual_seed(0)
    settings: dict[str, Any] = {"num_classes": 7, "dim": 32, "blocks": 1, "max_len": 16} | overrides
    model = SignModel(ModelConfig(**settings)).train()
    model.late_dropout.active = True
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.rand(len(LENGTHS), 16, POINTS, 3, generator=gen), torch.tensor(LENGTHS)


def forward(model: SignModel, seed: int, draw_first: bool = False) -> torch.Tensor:
    x, lengths = batch()
    torch.manual_seed(seed)
    if draw_first:
        torch.rand(1)
    return model(x, lengths)


def test_a_training_forward_is_a_function_of_the_seed_and_the_masks_act() -> None:
    model = tiny_model()
    first, again = forward(model, 5), forward(model, 5)
    assert torch.equal(first, again)
    assert not torch.allclose(forward(model, 6), first, atol=1e-3)
    # Each kind of mask acts on its own: with only one of them on, the seed still matters.
    for only in ({"attn_dropout": 0.2}, {"drop_path": 0.5}, {"dropout": 0.5}):
        model = tiny_model(**({"attn_dropout": 0.0, "drop_path": 0.0, "dropout": 0.0} | only))
        assert torch.equal(forward(model, 5), forward(model, 5)), only
        assert not torch.allclose(forward(model, 6), forward(model, 5), atol=1e-3), only


def test_the_masks_are_drawn_from_the_cpu_generator() -> None:
    model = tiny_model()
    assert not torch.allclose(forward(model, 5, draw_first=True), forward(model, 5), atol=1e-3)


def test_eval_draws_nothing_and_ignores_the_seed() -> None:
    model = tiny_model().eval()
    torch.manual_seed(3)
    state = torch.get_rng_state()
    out = forward(model, 3)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(forward(model, 4), out)


class _DeviceDraws(TorchDispatchMode):
    """Records every seeded random op that produces a tensor off the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if torch.Tag.nondeterministic_seeded in func.tags:
            outs = out if isinstance(out, tuple | list) else (out,)
            if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in outs):
                self.seen.append(str(func))
        return out


def test_a_forward_on_another_device_draws_the_cpu_generator_as_a_cpu_forward_does() -> None:
    """On a device other than the CPU (``meta`` here, the only one a CPU machine has) the
    forward makes no random draw on the device and advances the CPU generator exactly as
    the same forward on the CPU does: the masks are the same draws."""
    model = tiny_model()
    x, lengths = batch()
    torch.manual_seed(9)
    model(x, lengths)
    after_cpu = torch.get_rng_state()
    meta = model.to("meta")
    torch.manual_seed(9)
    start = torch.get_rng_state()
    with _DeviceDraws() as draws:
        out = meta(x.to("meta"), lengths.to("meta"))
    assert out.device.type == "meta"
    assert draws.seen == []
    assert not torch.equal(torch.get_rng_state(), start)
    assert torch.equal(torch.get_rng_state(), after_cpu)


def _qkv(heads: int = 4, length: int = 12, width: int = 8) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, heads, length, width, generator=gen, requires_grad=True) for _ in range(3))
    keys = torch.ones(3, 1, 1, length, dtype=torch.bool)
    keys[1, ..., 7:] = False  # padded keys
    keys[2, ..., 1:] = False  # an empty sequence: key 0 only
    return q, k, v, keys


@pytest.mark.parametrize("autocast", [False, True])
def test_the_written_out_attention_is_sdpa_s_without_dropout(monkeypatch: pytest.MonkeyPatch, autocast: bool) -> None:
    """With the mask forced to keep everything, the training path (written out) gives what
    ``scaled_dot_product_attention`` gives, values and gradients, in fp32 and in bf16 autocast."""
    block = TransformerBlock(32, 4, attn_dropout=0.2, drop_path=0.0).train()
    q, k, v, keys = _qkv()
    monkeypatch.setattr(asl_model, "dropout", lambda x, rate, shape=None: x)
    dtype = torch.bfloat16 if autocast else torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        # As in the model, q, k and v come out of a Linear: bf16 under autocast.
        qd, kd, vd = q.to(dtype), k.to(dtype), v.to(dtype)
        ours = block.attend(qd, kd, vd, keys)
        reference = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=keys)
    assert ours.dtype == reference.dtype == dtype
    atol, grad_atol = (2e-2, 5e-2) if autocast else (1e-5, 1e-5)
    torch.testing.assert_close(ours, reference, atol=atol, rtol=atol)
    grads = torch.autograd.grad(ours.float().square().sum(), (q, k, v))
    expected = torch.autograd.grad(reference.float().square().sum(), (q, k, v))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, atol=grad_atol, rtol=grad_atol)


@pytest.mark.skipif(
    not hasattr(torch.ops.aten, "_scaled_dot_product_attention_math"), reason="no SDPA math op to compare with"
)
def test_attention_dropout_is_sdpa_s_math_path_with_the_cpu_drawn_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropout acts on the softmax probabilities and rescales by 1 / (1 - p), as SDPA's own
    math path does given the same mask."""
    # 0.25: a multiple of 1/256, so the rescaling is SDPA's 1 / (1 - p) exactly.
    block = TransformerBlock(32, 4, attn_dropout=0.25, drop_path=0.0).train()
    q, k, v, keys = _qkv()
    masks: list[torch.Tensor] = []
    draw = asl_model._keep_mask

    def spy(shape: tuple[int, ...], cut: int, device: torch.device) -> torch.Tensor:
        masks.append(draw(shape, cut, device))
        return masks[-1]

    monkeypatch.setattr(asl_model, "_keep_mask", spy)
    ours = block.attend(q, k, v, keys)
    [keep] = masks
    assert keep.shape == (3, 4, 12, 12)
    # The op itself takes an additive mask (the public function converts a boolean one).
    hidden = torch.zeros(keys.shape).masked_fill(~keys, float("-inf"))
    reference, _ = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, hidden, 0.25, dropout_mask=keep)
    torch.testing.assert_close(ours, reference)


def test_attention_dropout_drops_probabilities_at_its_rate() -> None:
    """Uniform attention over every key onto one-hot values: each output element is one
    attention probability after dropout, zero or 1 / (L (1 - p))."""
    rate, length = 0.25, 64
    block = TransformerBlock(32, 4, attn_dropout=rate, drop_path=0.0).train()
    q = k = torch.zeros(8, 4, length, length)
    v = torch.eye(length).expand(8, 4, length, length)
    torch.manual_seed(0)
    out = block.attend(q, k, v, torch.ones(8, 1, 1, length, dtype=torch.bool))
    dropped = (out == 0).float().mean().item()
    assert abs(dropped - rate) < 0.01  # 131,072 draws: the standard error is 0.0013
    torch.testing.assert_close(out[out != 0], torch.full_like(out[out != 0], 1 / (length * (1 - rate))))


@pytest.mark.parametrize(("rate", "cut"), [(0.1, 26), (0.2, 51), (0.5, 128)])
def test_dropout_keeps_one_minus_rate_and_rescales(rate: float, cut: int) -> None:
    # The rate is rounded to a multiple of 1/256 (one random byte per element); the kept
    # elements are rescaled by that rounded rate, so the mean is kept exactly.
    torch.manual_seed(0)
    out = asl_model.dropout(torch.ones(256, 1024), rate)
    assert abs((out == 0).float().mean().item() - cut / 256) < 0.005
    assert torch.equal(out.unique(), torch.tensor([0.0, 256 / (256 - cut)]))
    # A mask of another shape broadcasts: whole rows kept or dropped.
    out = asl_model.dropout(torch.ones(4096, 3, 5), rate, (4096, 1, 1))
    assert torch.equal(out.amin((1, 2)), out.amax((1, 2)))
    assert abs((out[:, 0, 0] == 0).float().mean().item() - rate) < 0.03


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_cuda_step_draws_the_masks_a_cpu_replay_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """One training step of the same weights from the same seed on CUDA and on the CPU
    (fp32): the same masks, so the same loss and gradients up to arithmetic."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    results = []
    for device in (torch.device("cpu"), torch.device("cuda")):
        model = tiny_model().to(device)
        x, lengths = batch()
        torch.manual_seed(11)  # what the loop's seed_everything does: every device's generator
        logits = model(x.to(device), lengths.to(device))
        loss = F.cross_entropy(logits, torch.arange(len(LENGTHS), device=device))
        loss.backward()
        results.append(
            (logits.detach().cpu(), [p.grad.detach().cpu() for p in model.parameters() if p.grad is not None])
        )
    (cpu_logits, cpu_grads), (cuda_logits, cuda_grads) = results
    torch.testing.assert_close(cuda_logits, cpu_logits, atol=1e-4, rtol=1e-4)
    for got, want in zip(cuda_grads, cpu_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)


@pytest.mark.slow
def test_a_compiled_model_draws_the_masks_an_eager_replay_draws() -> None:
    """``LoopConfig.compile`` trains through ``torch.compile``, whose Inductor would generate
    its own random numbers; the replay never compiles. The same seed gives the same output."""
    model = tiny_model()
    eager = forward(model, 5)
    compiled = torch.compile(model)
    x, lengths = batch()
    torch.manual_seed(5)
    torch.testing.assert_close(compiled(x, lengths), eager)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 192, 384])
def test_the_device_s_mask_bytes_are_the_cpu_s(n: int) -> None:
    # What a GPU computes (int64 arithmetic kept to 32 bits, here run on the CPU: integer
    # operations are exact on every device) is what the CPU computes with numpy's uint32.
    keys = torch.cat([torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1]), torch.randint(0, 2**32, (200,))])
    on_device = asl_model._bytes_torch(keys, n)
    on_cpu = asl_model._bytes_numpy(keys.numpy().astype(np.uint32), n)
    assert on_device.shape == (keys.shape[0], n)
    assert np.array_equal(on_device.numpy(), on_cpu)


def test_the_mask_bytes_are_uniform_and_unrelated() -> None:
    keys = torch.randint(0, 2**32, (4096,))
    data = asl_model._bytes_numpy(keys.numpy().astype(np.uint32), 64).astype(np.float64)
    # Every byte value about equally often, in every position of a word and across rows.
    counts = np.bincount(data.astype(np.int64).ravel(), minlength=256)
    expected = data.size / 256
    assert ((counts - expected) ** 2 / expected).sum() < 256 + 5 * (2 * 256) ** 0.5  # chi-square, 255 dof
    for position in range(4):
        assert abs(data[:, position::4].mean() - 127.5) < 1.5
    # Neighbours in a row, and the same position in neighbouring rows, are uncorrelated.
    centred = data - data.mean()
    for a, b in ((centred[:, :-1], centred[:, 1:]), (centred[:-1], centred[1:])):
        assert abs((a * b).mean() / centred.var()) < 0.01
