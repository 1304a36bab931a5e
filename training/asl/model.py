"""The 1D-CNN + Transformer family that won Google's ISLR competition, in PyTorch.

A linear stem, then ``blocks`` stacks of [3 × Conv1D block + Transformer block], a top
projection, masked mean pooling, late dropout and a classifier. Padding never leaks: it is
zeroed after every block, excluded from BatchNorm statistics, from attention keys and from
pooling, and the convolution is causal so padded frames (always at the end) cannot reach
real ones.

Every dropout mask (drop path, attention dropout, late dropout) is made by ``dropout``
below from keys of the CPU generator and an integer hash, the same bits whatever device the
model trains on, so a step's masks depend on its seed alone and the platform's CPU replay
of a GPU-trained step makes the same ones.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from training.asl.landmarks import selected_landmarks
from training.asl.preprocess import Featurizer

NORMALISATIONS = ("per_axis", "scalar")
# What a config.json written before a field existed meant by its absence.
LEGACY_CONFIG = {"mlp_expand": 4, "normalisation": "scalar"}


@dataclass
class ModelConfig:
    """Everything needed to rebuild the model (written to config.json)."""

    num_classes: int
    dim: int = 192
    blocks: int = 2
    max_len: int = 384
    use_pose: bool = False
    coords: int = 2
    kernel_size: int = 17
    expand: int = 2
    mlp_expand: int = 2
    heads: int = 4
    attn_dropout: float = 0.2
    drop_path: float = 0.2
    dropout: float = 0.2
    normalisation: str = "per_axis"
    points: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(f"normalisation must be one of {', '.join(NORMALISATIONS)}, not {self.normalisation!r}")
        if not self.points:
            self.points = selected_landmarks(self.use_pose)
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} must be a multiple of heads {self.heads}")

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready copy."""
        return asdict(self)


# A mask keeps an element where its random byte is at least the rate's cut: the rate rounded
# to a multiple of 1/256.
BYTE = 256
# The bytes come from a counter-based hash (Thomas Mueller's 32-bit integer hash: two
# multiply-xorshift rounds; a statistical mixer for dropout, not a cryptographic one) of a
# row's key plus GOLDEN times the word's position in the row; each 32-bit word gives four
# bytes, low byte first. Every product stays below 2⁶³, so int64 arithmetic on any device
# computes exactly what uint32 arithmetic does.
GOLDEN = 0x9E3779B9
MIX = 0x45D9F3B
WORD = 0xFFFFFFFF


def _bytes_numpy(keys: np.ndarray, n: int) -> np.ndarray:
    """The mask bytes of rows keyed by ``keys`` (uint32 [rows]): uint8 [rows, n]. The CPU's
    way: uint32 arithmetic wraps modulo 2³² in numpy by definition."""
    x = np.arange((n + 3) // 4, dtype=np.uint32) * np.uint32(GOLDEN) + keys[:, None]
    for _ in range(2):
        x ^= x >> np.uint32(16)
        x *= np.uint32(MIX)
    x ^= x >> np.uint32(16)
    # Little-endian words, read as bytes: low byte first on every machine.
    return x.astype("<u4", copy=False).view(np.uint8)[:, :n]


def _bytes_torch(keys: torch.Tensor, n: int) -> torch.Tensor:
    """``_bytes_numpy`` on ``keys``' device (int64 [rows], values below 2³²), in int64
    arithmetic kept to 32 bits: the same bytes, computed where the mask is used."""
    x = torch.arange((n + 3) // 4, dtype=torch.int64, device=keys.device).mul_(GOLDEN)
    x = x.add(keys[:, None]).bitwise_and_(WORD)
    for _ in range(2):
        x.bitwise_xor_(x >> 16).mul_(MIX).bitwise_and_(WORD)
    x.bitwise_xor_(x >> 16)
    parts = [((x >> shift) & 0xFF).to(torch.uint8) for shift in (0, 8, 16, 24)]
    return torch.stack(parts, -1).reshape(x.shape[0], -1)[:, :n]


@torch.compiler.disable
def _keep_mask(shape: tuple[int, ...], cut: int, device: torch.device) -> torch.Tensor:
    # Eager even inside torch.compile: Inductor would otherwise generate its own random numbers.
    n = shape[-1]
    rows = math.prod(shape[:-1])
    keys = torch.randint(0, 2**32, (rows,), dtype=torch.int64)  # the CPU generator: the step's seed
    if device.type == "cpu":
        keep = torch.from_numpy(_bytes_numpy(keys.numpy().astype(np.uint32), n) >= cut)
    else:
        keep = _bytes_torch(keys.to(device, non_blocking=True), n) >= cut
    return keep.reshape(shape)


def dropout(x: torch.Tensor, rate: float, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """``x`` with elements zeroed at ``rate`` (rounded to a multiple of 1/256) and the rest
    scaled to keep the mean, as ``F.dropout`` does, through a mask of ``shape`` (``x``'s own
    when None) broadcast over ``x``.

    Proof of training re-executes a worker's steps on the platform's CPU, seeding the
    global generators before each micro-batch (``training.loop``). A mask drawn on a CUDA
    device comes from its Philox generator, which the CPU cannot reproduce, and
    ``scaled_dot_product_attention``'s fused kernels map their draws their own way: every
    honest GPU-trained segment would be rejected. Here the mask is a function of the step's
    seed alone, the same bits on every device: one key per row of the mask (every axis but
    the last) from the CPU's default generator, whose integers are the same on any CPU for
    the same seed, then a counter-based hash of key and position, computed with numpy on
    the CPU and with exact integer arithmetic on any other device (``_bytes_torch``, which
    a test checks against ``_bytes_numpy``). The keys are the only draw, so a GPU makes its
    largest mask (attention's, B·H·L² elements) itself from B·H·L keys, and the CPU makes it
    four elements per hash, faster than drawing a byte per element.
    """
    cut = round(rate * BYTE)
    if cut <= 0:
        return x
    if cut >= BYTE:
        return x * 0.0
    keep = _keep_mask(tuple(x.shape) if shape is None else shape, cut, x.device)
    return x * keep * (BYTE / (BYTE - cut))


class MaskedBatchNorm(nn.Module):
    """BatchNorm over [B, L, C] whose batch statistics count only unmasked frames."""

    running_mean: torch.Tensor
    running_var: torch.Tensor

    def __init__(self, channels: int, momentum: float = 0.05, eps: float = 1e-3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))
        self.momentum = momentum
        self.eps = eps

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` [B, L, C]; ``mask`` [B, L] is True on real frames."""
        dtype = x.dtype
        x = x.float()
        if self.training:
            m = mask[..., None].float()
            n = m.sum().clamp(min=1.0)
            mean = (x * m).sum((0, 1)) / n
            var = (((x - mean) ** 2) * m).sum((0, 1)) / n
            with torch.no_grad():
                unbiased = var * n / (n - 1).clamp(min=1.0)
                self.running_mean.lerp_(mean.detach(), self.momentum)
                self.running_var.lerp_(unbiased.detach(), self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        out = (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias
        return out.to(dtype)


class ECA(nn.Module):
    """Efficient channel attention: a gate from a small conv over the channels' masked means."""

    def __init__(self, kernel_size: int = 5) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 1, kernel_size, padding=kernel_size // 2, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Gate ``x`` [B, L, C] channel-wise."""
        m = mask[..., None].to(x.dtype)
        mean = (x * m).sum(1) / m.sum(1).clamp(min=1.0)  # [B, C]
        gate = torch.sigmoid(self.conv(mean[:, None, :]))[:, 0]
        return x * gate[:, None, :]


class DropPath(nn.Module):
    """Stochastic depth: drop a residual branch for whole samples during training."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Zero or rescale each sample's branch."""
        if not self.training:
            return x
        return dropout(x, self.rate, (x.shape[0], 1, 1))


class Conv1DBlock(nn.Module):
    """Expand, causal depthwise conv, BatchNorm, ECA, project, drop path, residual."""

    def __init__(self, dim: int, kernel_size: int, expand: int, drop_path: float) -> None:
        super().__init__()
        hidden = dim * expand
        self.expand = nn.Linear(dim, hidden)
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(hidden, hidden, kernel_size, groups=hidden, bias=False)
        self.norm = MaskedBatchNorm(hidden)
        self.eca = ECA()
        self.project = nn.Linear(hidden, dim)
        self.drop = DropPath(drop_path)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, L, C] → [B, L, C]."""
        m = mask[..., None].to(x.dtype)
        h = F.silu(self.expand(x)) * m
        h = F.pad(h.transpose(1, 2), (self.kernel_size - 1, 0))
        h = self.conv(h).transpose(1, 2)
        h = self.eca(self.norm(h, mask), mask)
        return (x + self.drop(self.project(h))) * m


class TransformerBlock(nn.Module):
    """Pre-norm (masked BatchNorm) self-attention and MLP, each with drop path and residual."""

    def __init__(self, dim: int, heads: int, attn_dropout: float, drop_path: float, expand: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = MaskedBatchNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.attn_dropout = attn_dropout
        self.norm2 = MaskedBatchNorm(dim)
        self.mlp_in = nn.Linear(dim, dim * expand, bias=False)
        self.mlp_out = nn.Linear(dim * expand, dim, bias=False)
        self.drop = DropPath(drop_path)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, L, C] → [B, L, C]."""
        b, length, c = x.shape
        m = mask[..., None].to(x.dtype)
        q, k, v = self.qkv(self.norm1(x, mask)).reshape(b, length, 3, self.heads, c // self.heads).unbind(2)
        # Padded keys are hidden; key 0 always stays visible so an empty sequence gives no NaN.
        keys = mask.clone()
        keys[:, 0] = True
        attn = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), keys[:, None, None, :])
        x = (x + self.drop(self.out(attn.transpose(1, 2).reshape(b, length, c)))) * m
        h = self.mlp_out(F.silu(self.mlp_in(self.norm2(x, mask))))
        return (x + self.drop(h)) * m

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Attention of ``q``, ``k``, ``v`` [B, H, L, D] over the keys where ``keys`` [B, 1, 1, L] is True.

        With attention dropout (training), the attention is written out, as the math path of
        ``scaled_dot_product_attention`` computes it (in float32 whatever autocast would
        pick, the result in the inputs' dtype), because the fused kernels cannot take a
        dropout mask made elsewhere and this one must be ``dropout``'s, the same on every
        device.
        """
        if not self.training or self.attn_dropout <= 0.0:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keys)
        dtype = q.dtype
        device = q.device.type
        full = torch.autocast(device, enabled=False) if torch.amp.is_autocast_available(device) else nullcontext()
        with full:
            # q and k each scaled by the root of 1/√D, then an additive mask, as the math path.
            root_scale = q.shape[-1] ** -0.25
            scores = (q.float() * root_scale) @ (k.float() * root_scale).transpose(-2, -1)
            probs = scores.masked_fill(~keys, float("-inf")).softmax(-1)
            probs = dropout(probs, self.attn_dropout)
            return (probs @ v.float()).to(dtype)


class LateDropout(nn.Module):
    """Dropout that stays off until the trainer switches it on, part-way through training."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate
        self.active = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Dropout when training and active."""
        if not (self.training and self.active):
            return x
        return dropout(x, self.rate)


class SignModel(nn.Module):
    """Raw landmark subset [B, T, P, 3] + lengths → one logit per sign [B, num_classes]."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.featurizer = Featurizer(
            config.points, config.max_len, config.coords, per_axis=config.normalisation == "per_axis"
        )
        self.stem = nn.Linear(self.featurizer.features, config.dim, bias=False)
        self.stem_norm = MaskedBatchNorm(config.dim)
        layers: list[nn.Module] = []
        for _ in range(config.blocks):
            layers += [Conv1DBlock(config.dim, config.kernel_size, config.expand, config.drop_path) for _ in range(3)]
            layers.append(
                TransformerBlock(config.dim, config.heads, config.attn_dropout, config.drop_path, config.mlp_expand)
            )
        self.layers = nn.ModuleList(layers)
        self.top = nn.Linear(config.dim, 2 * config.dim)
        self.late_dropout = LateDropout(config.dropout)
        self.classifier = nn.Linear(2 * config.dim, config.num_classes)

    def forward(self, landmarks: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Logits for a padded batch of raw landmark subsets."""
        feats, mask = self.featurizer(landmarks, lengths)
        x = self.stem_norm(self.stem(feats), mask)
        for layer in self.layers:
            x = layer(x, mask)
        x = self.top(x)
        m = mask[..., None].to(x.dtype)
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1.0)
        return self.classifier(self.late_dropout(pooled))


class CompetitionModel(nn.Module):
    """The competition contract: one [frames, 543, 3] float32 sequence with NaNs → [num_classes]."""

    points: torch.Tensor

    def __init__(self, model: SignModel) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("points", torch.tensor(model.config.points, dtype=torch.long), persistent=False)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits for one sequence."""
        x = inputs.index_select(1, self.points)[None]
        lengths = torch.ones(1, dtype=torch.long, device=inputs.device) * inputs.shape[0]
        return self.model(x, lengths)[0]
