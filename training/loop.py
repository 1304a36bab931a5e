"""The shared training loop: one ``fit`` for every trainer (cube, ASL).

A trainer supplies a model, two DataLoaders and two callables:

- ``step_fn(model, batch) -> (loss, metrics)``: the forward pass of one micro-batch. ``loss``
  is a scalar tensor; ``metrics`` maps names to floats or scalar tensors (averaged over the
  epoch and reported as ``train_<name>``). ``batch`` is whatever the loader yields, already
  moved to the device (tensors, and tensors inside tuples, lists and dicts).
- ``eval_fn(model, loader) -> metrics``: called once per epoch in eval mode under
  ``torch.no_grad()`` and full precision; must return ``config.monitor`` (``"val_loss"`` by default).
  It gets the validation loader as it is and moves each batch to the model's device itself
  (``to_device(batch, next(model.parameters()).device)``), since only it knows which parts
  of a batch the model reads.

``fit`` owns everything else: the optimizer (AdamW, or RAdam wrapped in Lookahead), the
schedule (cosine with linear warm-up, one-cycle, or constant), gradient clipping and
accumulation, adversarial weight perturbation from a given epoch (``awp_lambda``), mixed precision (bf16 autocast: ``training.device``),
optional ``torch.compile``, early stopping with restore of the best weights, deterministic
seeding, resumable checkpoints (safetensors + JSON, see ``training.artifacts``) and a
progress callback.

Progress events (the caller throttles; the loop sends every one):

- ``{"event": "step", "epoch", "step", "total_steps", "loss", "lr", "metrics"}`` after each
  optimizer step (``loss`` is the mean over the step's micro-batches).
- ``{"event": "epoch", "epoch", "epochs", "step", "total_steps", "train", "val", "best",
  "improved"}`` after each epoch's evaluation and checkpoint.

Stopping: ``training.stop.check()`` runs before each micro-batch and each validation batch,
so a job the node is told to stop raises ``training.stop.Stopped`` within one batch. Each
epoch's figures are also logged (``training.loop``), one line, for the node's task log.

Determinism and resume: at the start of every epoch the global RNGs are re-seeded from
``(seed, epoch)``, so a DataLoader with ``shuffle=True`` and no generator of its own draws
the same order whether the run was resumed or not. A checkpoint is written at the end of an
epoch; ``resume=True`` continues from the last one and reaches the same weights as an
uninterrupted run.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from training import stop
from training.artifacts import (
    ArtifactError,
    flatten_tensors,
    load_model_tensors,
    load_state,
    save_state,
    save_state_file,
    state_exists,
    weights_sha256,
)
from training.device import autocast, keep_freed_memory, seed_everything, select_device
from training.trace import TRACE_FILE, Leaf, Trace, checkpoint_name, file_sha256, read_trace

log = logging.getLogger("training.loop")

StepFn = Callable[[nn.Module, Any], tuple[torch.Tensor, Mapping[str, float | torch.Tensor]]]
EvalFn = Callable[[nn.Module, Iterable[Any]], Mapping[str, float]]
Progress = Callable[[dict[str, Any]], None]

CHECKPOINT_STEM = "checkpoint"
BEST_STEM = "best"


class NonFiniteLossError(ArithmeticError):
    """The training loss became NaN or infinite; the message names the epoch and step."""


@dataclass
class LoopConfig:
    """Everything ``fit`` needs besides the model and data. Defaults suit a small CPU run."""

    epochs: int = 10
    optimizer: Literal["adamw", "radam_lookahead"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Literal["cosine", "onecycle", "constant"] = "cosine"
    # Linear warm-up steps for "cosine"; for "onecycle" the rising phase (0: 30 % of the run).
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0  # max gradient norm; 0 disables clipping
    grad_accumulation: int = 1
    mixed_precision: bool = False
    compile: bool = False
    early_stopping_patience: int = 0  # epochs without improvement; 0 disables
    monitor: str = "val_loss"
    monitor_mode: Literal["min", "max"] = "min"
    restore_best: bool = True
    seed: int = 0
    checkpoint_every: int = 1  # epochs between checkpoints when checkpoint_dir is given
    lookahead_k: int = 5
    lookahead_alpha: float = 0.5
    device: str | None = None  # None: CUDA when available, else CPU
    max_steps_per_epoch: int | None = None  # cap on optimizer steps per epoch (smoke runs, benchmarks)
    # Optimizer steps between training-trace checkpoints when a trace_dir is given; 0: no trace.
    trace_every: int = 0
    # Adversarial weight perturbation (Wu et al. 2020, as the 1st-place ISLR solution uses
    # it): from epoch ``awp_from_epoch`` on, each micro-batch's gradient is taken at the
    # weights moved by ``awp_lambda`` along that micro-batch's own gradient, per tensor.
    # 0: off.
    awp_lambda: float = 0.0
    awp_from_epoch: int = 1

    def __post_init__(self) -> None:
        checks = {
            "epochs": self.epochs >= 1,
            "lr": self.lr > 0 and math.isfinite(self.lr),
            "weight_decay": self.weight_decay >= 0,
            "grad_clip": self.grad_clip >= 0,
            "grad_accumulation": self.grad_accumulation >= 1,
            "early_stopping_patience": self.early_stopping_patience >= 0,
            "warmup_steps": self.warmup_steps >= 0,
            "checkpoint_every": self.checkpoint_every >= 1,
            "trace_every": self.trace_every >= 0,
            "awp_lambda": self.awp_lambda >= 0 and math.isfinite(self.awp_lambda),
            "awp_from_epoch": self.awp_from_epoch >= 1,
            "optimizer": self.optimizer in ("adamw", "radam_lookahead"),
            "schedule": self.schedule in ("cosine", "onecycle", "constant"),
            "monitor_mode": self.monitor_mode in ("min", "max"),
            "min_lr_ratio": 0.0 <= self.min_lr_ratio <= 1.0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"Invalid LoopConfig field(s): {', '.join(bad)}.")


@dataclass
class FitResult:
    """What a finished ``fit`` reports. ``history`` has one entry per epoch run."""

    epochs_run: int
    global_step: int
    best_epoch: int
    best_metrics: dict[str, float]
    final_metrics: dict[str, float]
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: bool = False
    seconds: float = 0.0
    trace: Trace | None = None  # the training trace, when one was written

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (the trace as its commitment)."""
        out = asdict(self)
        out["trace"] = self.trace.commitment() if self.trace is not None else None
        return out


class Lookahead(torch.optim.Optimizer):
    """Lookahead (Zhang et al. 2019) around any optimizer: every ``k`` steps the slow
    weights move ``alpha`` of the way to the fast ones and the fast weights restart there."""

    def __init__(self, inner: torch.optim.Optimizer, k: int = 5, alpha: float = 0.5) -> None:
        if k < 1 or not 0.0 < alpha <= 1.0:
            raise ValueError("Lookahead needs k >= 1 and 0 < alpha <= 1.")
        super().__init__(inner.param_groups, inner.defaults)
        # Share the groups so a scheduler's lr changes reach the inner optimizer.
        self.param_groups = inner.param_groups
        self.inner = inner
        self.k = k
        self.alpha = alpha
        self.counter = 0
        self.slow = [p.detach().clone() for group in inner.param_groups for p in group["params"]]

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.inner.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One inner step; a slow-weight sync every ``k`` of them."""
        loss = self.inner.step(closure)
        self.counter += 1
        if self.counter % self.k == 0:
            for p, slow in zip(self._params(), self.slow, strict=True):
                slow.add_(p.detach() - slow, alpha=self.alpha)
                p.copy_(slow)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the inner optimizer's gradients."""
        self.inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """Inner state plus slow weights and the step counter."""
        return {"inner": self.inner.state_dict(), "slow": list(self.slow), "counter": self.counter}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.inner.load_state_dict(state_dict["inner"])
        # Loading replaces the inner group dicts; share the new ones again.
        self.param_groups = self.inner.param_groups
        for slow, saved in zip(self.slow, state_dict["slow"], strict=True):
            slow.copy_(saved)
        self.counter = int(state_dict["counter"])


def build_optimizer(model: nn.Module, config: LoopConfig) -> torch.optim.Optimizer:
    """AdamW, or RAdam (decoupled weight decay) inside Lookahead. Biases and norms skip decay."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for _name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas)
    inner = torch.optim.RAdam(groups, lr=config.lr, betas=config.betas, decoupled_weight_decay=True)
    return Lookahead(inner, k=config.lookahead_k, alpha=config.lookahead_alpha)


def lr_factor(step: int, total_steps: int, config: LoopConfig) -> float:
    """The multiplier on ``config.lr`` at optimizer step ``step`` (0-based) of ``total_steps``."""
    total = max(1, total_steps)
    floor = config.min_lr_ratio
    if config.schedule == "constant":
        return 1.0 if step >= config.warmup_steps else (step + 1) / (config.warmup_steps + 1)
    if config.schedule == "cosine":
        if step < config.warmup_steps:
            return (step + 1) / (config.warmup_steps + 1)
        progress = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    # One-cycle: cosine rise from lr/25 to lr, then cosine fall to lr/1e4 (torch's OneCycleLR shape).
    rise = config.warmup_steps or max(1, int(0.3 * total))
    start, end = 1.0 / 25.0, max(floor, 1e-4)
    if step < rise:
        t = step / rise
        return start + (1.0 - start) * 0.5 * (1.0 - math.cos(math.pi * t))
    t = min(1.0, (step - rise) / max(1, total - rise))
    return end + (1.0 - end) * 0.5 * (1.0 + math.cos(math.pi * t))


def to_device(batch: Any, device: torch.device) -> Any:
    """Move tensors (also inside tuples, lists and dicts) to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if type(batch) in (tuple, list):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def _as_float(value: float | torch.Tensor) -> float:
    return float(value.detach().float().item()) if isinstance(value, torch.Tensor) else float(value)


def _improved(value: float, best: float | None, mode: str) -> bool:
    if best is None:
        return True
    return value < best if mode == "min" else value > best


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919) % 2**32


def _step_seed(seed: int, step: int, micro: int) -> int:
    return int.from_bytes(hashlib.sha256(f"step:{seed}:{step}:{micro}".encode()).digest()[:4], "big")


def steps_per_epoch(loader: Iterable[Any], config: LoopConfig) -> int:
    """Optimizer steps in one epoch over ``loader``."""
    try:
        batches = len(loader)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ValueError("fit needs a train loader with a length (a DataLoader over a sized dataset).") from exc
    steps = math.ceil(batches / config.grad_accumulation)
    if config.max_steps_per_epoch is not None:
        steps = min(steps, config.max_steps_per_epoch)
    return max(1, steps)


class _Stoppable:
    """A loader whose iteration checks the stop signal before each batch (``training.stop``);
    its length and attributes are the wrapped loader's."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        for batch in self.loader:
            stop.check()
            yield batch

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def _summary(train: Mapping[str, float], val: Mapping[str, float]) -> str:
    """An epoch's figures as one short line: ``train_loss=0.512 val_loss=0.498``."""
    figures = {**train, **val}
    return " ".join(f"{name}={value:.4g}" for name, value in list(figures.items())[:12])


@dataclass
class _LoopState:
    """One ``fit`` run: what it trains with, and the counters and best figures that a
    checkpoint keeps (``next_epoch`` is where the run goes on)."""

    model: nn.Module
    runner: nn.Module  # what step_fn and eval_fn call: the model, or its torch.compile wrapper
    config: LoopConfig
    device: torch.device
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    steps_per_epoch: int
    total_steps: int
    progress: Progress | None
    checkpoint_dir: Path | None
    next_epoch: int = 1
    global_step: int = 0
    best_value: float | None = None
    best_epoch: int = 0
    bad_epochs: int = 0
    best_metrics: dict[str, float] = field(default_factory=dict)
    best_state: dict[str, torch.Tensor] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    on_epoch: Callable[[int], None] | None = None
    tracer: _Tracer | None = None
    # Training losses of the steps since the last trace checkpoint.
    segment_loss: float = 0.0
    segment_steps: int = 0

    @classmethod
    def start(
        cls,
        model: nn.Module,
        train_loader: Iterable[Any],
        config: LoopConfig,
        progress: Progress | None,
        checkpoint_dir: Path | None,
        on_epoch: Callable[[int], None] | None = None,
    ) -> _LoopState:
        """Seed, move ``model`` to its device, and build its optimizer and schedule."""
        device = select_device(config.device)
        if device.type == "cpu":
            keep_freed_memory()
        seed_everything(config.seed)
        model.to(device)
        optimizer = build_optimizer(model, config)
        per_epoch = steps_per_epoch(train_loader, config)
        total_steps = per_epoch * config.epochs
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps, config))
        runner: nn.Module = model
        if config.compile and hasattr(torch, "compile"):
            runner = torch.compile(model)  # type: ignore[assignment]
        return cls(
            model=model,
            runner=runner,
            config=config,
            device=device,
            optimizer=optimizer,
            scheduler=scheduler,
            steps_per_epoch=per_epoch,
            total_steps=total_steps,
            progress=progress,
            checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
            on_epoch=on_epoch,
        )

    def resume(self) -> None:
        """Go on from the checkpoint in ``checkpoint_dir``; without one, start fresh."""
        ckpt = self.checkpoint_dir
        if ckpt is None or not state_exists(ckpt / CHECKPOINT_STEM):
            return
        state = load_state(ckpt / CHECKPOINT_STEM, device=self.device)
        load_model_tensors(self.model, state["model"], source=str(ckpt / CHECKPOINT_STEM))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        loop = state["loop"]
        self.next_epoch, self.global_step = int(loop["epoch"]) + 1, int(loop["global_step"])
        self.best_value, self.best_epoch = loop["best_value"], int(loop["best_epoch"])
        self.bad_epochs = int(loop["bad_epochs"])
        self.best_metrics, self.history = dict(loop["best_metrics"]), list(loop["history"])
        if state_exists(ckpt / BEST_STEM):
            self.best_state = load_state(ckpt / BEST_STEM, device=self.device)["model"]

    def train_epoch(
        self, epoch: int, loader: Iterable[Any], step_fn: StepFn, *, skip: int = 0, steps: int | None = None
    ) -> dict[str, float]:
        """Up to ``steps_per_epoch`` optimizer steps; the epoch's mean figures (``train_<name>``).

        A replay passes ``skip`` (the epoch's steps already done, whose batches are drawn
        and dropped) and ``steps`` (how many to run after them)."""
        config = self.config
        seed_everything(_epoch_seed(config.seed, epoch))
        if self.on_epoch is not None:
            self.on_epoch(epoch)
        self.model.train()
        sums: dict[str, float] = {}
        count = 0
        micro = 0
        step_loss = 0.0
        step_metrics: dict[str, float] = {}
        last = self.steps_per_epoch if steps is None else min(self.steps_per_epoch, skip + steps)
        steps_this_epoch = skip
        self.optimizer.zero_grad(set_to_none=True)
        batches = _batches_after(loader, skip * config.grad_accumulation)
        while steps_this_epoch < last:
            stop.check()
            batch = next(batches, None)
            if batch is None:
                if micro == 0:
                    break
            else:
                loss_value, floats = self._backward(epoch, step_fn, batch, micro)
                micro += 1
                step_loss += loss_value
                for k, v in floats.items():
                    step_metrics[k] = step_metrics.get(k, 0.0) + v
                    sums[k] = sums.get(k, 0.0) + v
                sums["loss"] = sums.get("loss", 0.0) + loss_value
                count += 1
                if micro < config.grad_accumulation:
                    continue
            lr = self._optimizer_step(micro)
            steps_this_epoch += 1
            self.segment_loss += step_loss / micro
            self.segment_steps += 1
            if self.progress is not None:
                self.progress(
                    {
                        "event": "step",
                        "epoch": epoch,
                        "step": self.global_step,
                        "total_steps": self.total_steps,
                        "loss": step_loss / micro,
                        "lr": lr,
                        "metrics": {k: v / micro for k, v in step_metrics.items()},
                    }
                )
            if self.tracer is not None and self.global_step % self.tracer.every == 0:
                self.tracer.checkpoint(self, epoch)
            micro, step_loss, step_metrics = 0, 0.0, {}
            if batch is None:
                break
        if self.tracer is not None and steps is None and self.tracer.last_step != self.global_step:
            self.tracer.checkpoint(self, epoch)
        return {f"train_{k}": v / max(1, count) for k, v in sums.items()}

    def _backward(self, epoch: int, step_fn: StepFn, batch: Any, micro: int) -> tuple[float, dict[str, float]]:
        """Forward and backward micro-batch ``micro`` of the next step; its loss and metrics
        as floats. Its random draws (dropout, noise) come from RNGs re-seeded from (seed,
        step, micro-batch), so a replay of the step draws the same."""
        seed_everything(_step_seed(self.config.seed, self.global_step + 1, micro))
        batch = to_device(batch, self.device)
        awp = self.config.awp_lambda > 0 and epoch >= self.config.awp_from_epoch
        perturbed = self._perturb(step_fn, batch) if awp else None
        with autocast(self.device, self.config.mixed_precision):
            loss, metrics = step_fn(self.runner, batch)
        loss_value = _as_float(loss)
        if perturbed is not None and math.isfinite(loss_value):
            loss_value = perturbed[0]  # the step reports the loss at the weights as they are
        if not math.isfinite(loss_value):
            raise NonFiniteLossError(
                f"Training loss became {loss_value} at epoch {epoch}, step {self.global_step + 1}; "
                "lower the learning rate or turn off mixed precision."
            )
        scaled = loss / self.config.grad_accumulation
        scaled.backward()
        if perturbed is not None:
            self._restore(perturbed[2])
            metrics = perturbed[1]
        return loss_value, {k: _as_float(v) for k, v in metrics.items()}

    def _perturb(
        self, step_fn: StepFn, batch: Any
    ) -> tuple[float, Mapping[str, float | torch.Tensor], list[tuple[nn.Parameter, torch.Tensor, torch.Tensor | None]]]:
        """AWP's first pass: the micro-batch's loss and gradient at the current weights, then
        each weight tensor moved by ``awp_lambda`` along its own normalised gradient (a tensor
        with a zero or non-finite gradient stays). Returns the loss (as a float: what the
        step reports), the metrics, and per parameter (it, its weights, its gradient
        accumulated so far) for ``_restore``; the gradients are left empty for the second
        pass."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        kept = [(p, p.detach().clone(), p.grad) for p in params]
        for p in params:
            p.grad = None
        with autocast(self.device, self.config.mixed_precision):
            loss, metrics = step_fn(self.runner, batch)
        loss_value = _as_float(loss)
        if math.isfinite(loss_value):
            loss.backward()
        with torch.no_grad():
            for p in params:
                grad, p.grad = p.grad, None
                if grad is None:
                    continue
                norm = torch.linalg.vector_norm(grad.float())
                if bool(torch.isfinite(norm)) and float(norm) > 0:
                    p.add_((grad.float() * (self.config.awp_lambda / norm)).to(p.dtype))
        return loss_value, metrics, kept

    @staticmethod
    def _restore(kept: list[tuple[nn.Parameter, torch.Tensor, torch.Tensor | None]]) -> None:
        """AWP's end: the weights back as they were (exactly), and the perturbed pass's
        gradient added to what earlier micro-batches accumulated."""
        with torch.no_grad():
            for p, weights, grad in kept:
                p.copy_(weights)
                if grad is not None:
                    p.grad = grad if p.grad is None else p.grad.add_(grad)

    def _optimizer_step(self, micro: int) -> float:
        """One optimizer step over the ``micro`` micro-batches gathered (fewer at the epoch's
        end); returns the learning rate it stepped with."""
        config, optimizer = self.config, self.optimizer
        if micro < config.grad_accumulation:
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(config.grad_accumulation / micro)
        if config.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        optimizer.step()
        lr = float(optimizer.param_groups[0]["lr"])
        self.scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        return lr

    def validate(self, epoch: int, loader: Iterable[Any], eval_fn: EvalFn) -> tuple[dict[str, float], bool]:
        """Evaluate, and keep the weights when the monitored figure improved: (metrics, improved)."""
        config = self.config
        self.model.eval()
        # Evaluation stays in full precision so the reported figure can be recomputed exactly.
        with torch.no_grad():
            val_metrics = {k: float(v) for k, v in eval_fn(self.runner, _Stoppable(loader)).items()}
        if config.monitor not in val_metrics:
            raise KeyError(f"eval_fn returned {sorted(val_metrics)} but the monitored metric is {config.monitor!r}.")
        monitored = val_metrics[config.monitor]
        if not math.isfinite(monitored):
            raise NonFiniteLossError(f"Validation {config.monitor} became {monitored} at epoch {epoch}.")
        improved = _improved(monitored, self.best_value, config.monitor_mode)
        if improved:
            self.best_value, self.best_epoch, self.bad_epochs = monitored, epoch, 0
            self.best_metrics = dict(val_metrics)
            self.best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            if self.checkpoint_dir is not None:
                save_state(self.checkpoint_dir / BEST_STEM, {"model": self.best_state})
        else:
            self.bad_epochs += 1
        return val_metrics, improved

    def end_epoch(
        self, epoch: int, train_metrics: dict[str, float], val_metrics: dict[str, float], improved: bool
    ) -> None:
        """Record the epoch, checkpoint when one is due, log it and report it."""
        config = self.config
        self.history.append({"epoch": epoch, "step": self.global_step, "train": train_metrics, "val": val_metrics})
        if self.checkpoint_dir is not None and (epoch % config.checkpoint_every == 0 or epoch == config.epochs):
            self._save_checkpoint(self.checkpoint_dir, epoch)
        if self.tracer is not None:
            self.tracer.write()
        log.info(
            "epoch %d/%d, step %d/%d: %s",
            epoch,
            config.epochs,
            self.global_step,
            self.total_steps,
            _summary(train_metrics, val_metrics),
        )
        if self.progress is not None:
            self.progress(
                {
                    "event": "epoch",
                    "epoch": epoch,
                    "epochs": config.epochs,
                    "step": self.global_step,
                    "total_steps": self.total_steps,
                    "train": train_metrics,
                    "val": val_metrics,
                    "best": self.best_value,
                    "improved": improved,
                }
            )

    def training_state(self, epoch: int) -> dict[str, Any]:
        """What a replay needs to go on from here: weights, optimizer (AdamW moments, or the
        Lookahead slow weights), schedule and the step counter. ``scaler`` is part of the
        format and always empty: no precision here scales its loss (``training.device``)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": {},
            "loop": {"epoch": epoch, "global_step": self.global_step, "seed": self.config.seed},
        }

    def load_training_state(self, state: Mapping[str, Any], source: str) -> None:
        """Go on from a training state that anyone may have written (``training_state``,
        read with ``training.artifacts.read_state_file``): its tensors must have the shapes
        and types of this run's model and optimizer and be finite; the hyperparameters and
        the learning rate come from this run's config, never from the file. ArtifactError
        (naming ``source``) when it does not fit."""
        if set(state) != {"model", "optimizer", "scheduler", "scaler", "loop"}:
            raise ArtifactError(f"{source}: not a training state (it holds {sorted(state)[:8]}).")
        loop = state["loop"]
        step = loop.get("global_step") if isinstance(loop, dict) else None
        if type(step) is not int or not 0 <= step <= self.total_steps:
            raise ArtifactError(f"{source}: its step counter is not a step of this run.")
        weights = state["model"]
        if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
            raise ArtifactError(f"{source}: its weights are not a map of tensors.")
        template = _optimizer_template(self.model, self.config)
        given = flatten_tensors(state["optimizer"], "o")
        for name, tensor in {**{f"model {k}": v for k, v in weights.items()}, **given}.items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise ArtifactError(f"{source}: {name} holds NaN or infinite values.")
        wrong = [k for k, t in given.items() if k not in template or template[k] != (tuple(t.shape), t.dtype)]
        if wrong:
            raise ArtifactError(f"{source}: its optimizer state does not fit the model ({', '.join(wrong[:3])}).")
        load_model_tensors(self.model, weights, source=source)
        fresh = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        try:
            # A copy: the optimizer steps its state tensors in place, and the caller keeps its own.
            self.optimizer.load_state_dict(_copy_state(state["optimizer"]))
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
            raise ArtifactError(f"{source}: its optimizer state does not fit ({exc}).") from None
        factor = lr_factor(step, self.total_steps, self.config)
        for group, settings in zip(self.optimizer.param_groups, fresh, strict=True):
            group.update(settings)
            group["lr"] = settings["initial_lr"] * factor
        if isinstance(self.optimizer, Lookahead):
            self.optimizer.counter = step
        self.scheduler.last_epoch = step
        self.scheduler._step_count = step + 1
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]
        self.global_step = step

    def _save_checkpoint(self, ckpt: Path, epoch: int) -> None:
        """Everything ``resume`` needs to go on after ``epoch``."""
        save_state(
            ckpt / CHECKPOINT_STEM,
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": {},
                "loop": {
                    "epoch": epoch,
                    "global_step": self.global_step,
                    "best_value": self.best_value,
                    "best_epoch": self.best_epoch,
                    "bad_epochs": self.bad_epochs,
                    "best_metrics": self.best_metrics,
                    "history": self.history,
                    "config": copy.deepcopy(asdict(self.config)),
                },
            },
        )


def _batches_after(loader: Iterable[Any], skip: int) -> Iterator[Any]:
    """The loader's batches of this epoch after its first ``skip``. The data order follows
    from the epoch's seed alone, drawn before any step re-seeds the RNGs: a loader that can
    start past a batch without building it (``iter_from``, the ASL loader's) does; any other
    has its batches drawn and dropped, as the run drew them."""
    start = getattr(loader, "iter_from", None)
    if skip and callable(start):
        return iter(start(skip))
    batches = iter(loader)
    for _ in range(skip):
        if next(batches, None) is None:
            break
    return batches


class _StandIn(nn.Module):
    """Zero parameters of the shapes, types and order of ``model``'s, and nothing else: what
    ``build_optimizer`` groups the same way without copying the model's buffers and code."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.params = nn.ParameterList(
            nn.Parameter(torch.zeros_like(p, device="cpu"), requires_grad=p.requires_grad) for p in model.parameters()
        )


Template = dict[str, tuple[tuple[int, ...], torch.dtype]]
# Templates by optimizer and parameter signature: a verifier re-executing many segments of
# one run loads as many states into the same model.
_TEMPLATES: dict[tuple[Any, ...], Template] = {}


def _optimizer_template(model: nn.Module, config: LoopConfig) -> Template:
    """The (shape, dtype) of every tensor a trained optimizer's state holds, by the dotted
    key ``flatten_tensors`` gives it: one step of an optimizer over a stand-in of the
    model's parameters (the same groups, in the same order, so the same keys). It depends
    on the optimizer and on the parameters' shapes, types and order only."""
    key = (config.optimizer, tuple((tuple(p.shape), p.dtype, p.requires_grad) for p in model.parameters()))
    template = _TEMPLATES.get(key)
    if template is None:
        stand_in = _StandIn(model)
        optimizer = build_optimizer(stand_in, config)
        for p in stand_in.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        template = {k: (tuple(t.shape), t.dtype) for k, t in flatten_tensors(optimizer.state_dict(), "o").items()}
        if len(_TEMPLATES) >= 16:
            _TEMPLATES.clear()
        _TEMPLATES[key] = template
    return template


def _copy_state(value: Any) -> Any:
    """A copy of a training state's part, as ``read_state_file`` gives it (maps, lists and
    numbers around tensors), with every tensor cloned: what ``copy.deepcopy`` makes of it,
    without its memo's cost on thousands of small objects."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _copy_state(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copy_state(v) for v in value)
    return value


@dataclass
class _Tracer:
    """Writes the training trace: a checkpoint of the whole training state every ``every``
    optimizer steps and at each epoch's end, and the leaves that list them."""

    folder: Path
    every: int
    leaves: list[Leaf] = field(default_factory=list)

    @property
    def last_step(self) -> int:
        return self.leaves[-1].step if self.leaves else -1

    @property
    def trace(self) -> Trace:
        return Trace(every=self.every, leaves=tuple(self.leaves))

    def checkpoint(self, run: _LoopState, epoch: int) -> None:
        """Write checkpoint number ``len(leaves)`` and its leaf."""
        index = len(self.leaves)
        path = self.folder / checkpoint_name(index)
        save_state_file(path, run.training_state(epoch))
        loss = run.segment_loss / run.segment_steps if run.segment_steps else 0.0
        self.leaves.append(
            Leaf(
                index=index,
                step=run.global_step,
                epoch=epoch,
                # A leaf holds integers ≥ 0; every trainer's loss is.
                loss_micro=max(0, round(loss * 1_000_000)),
                state_sha256=file_sha256(path),
                weights_sha256=weights_sha256(run.model),
            )
        )
        run.segment_loss, run.segment_steps = 0.0, 0

    def write(self) -> None:
        """trace.json as far as the run has gone."""
        if len(self.leaves) >= 2:
            self.trace.write(self.folder / TRACE_FILE)

    def resume(self, step: int) -> None:
        """Keep the leaves up to ``step`` from the trace.json of an interrupted run."""
        path = self.folder / TRACE_FILE
        if step == 0:
            return
        if not path.is_file():
            raise ValueError(f"Cannot go on with the training trace: {path} is missing.")
        self.leaves = [leaf for leaf in read_trace(path).leaves if leaf.step <= step]
        if self.last_step != step:
            raise ValueError(f"Cannot go on with the training trace: it has no checkpoint at step {step}.")


def fit(
    model: nn.Module,
    train_loader: Iterable[Any],
    val_loader: Iterable[Any],
    step_fn: StepFn,
    eval_fn: EvalFn,
    config: LoopConfig,
    progress: Progress | None = None,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    *,
    trace_dir: Path | None = None,
    on_epoch: Callable[[int], None] | None = None,
) -> FitResult:
    """Train ``model`` in place and return what happened (see the module docstring).

    Raises NonFiniteLossError when a loss is NaN/inf, and KeyError when ``eval_fn`` does not
    return ``config.monitor``. With ``resume=True`` and a checkpoint in ``checkpoint_dir``
    the run continues after the checkpoint's epoch; without one it starts fresh.

    With ``config.trace_every`` > 0 and a ``trace_dir``, the run writes its training trace
    there (``training.trace``): ``ckpt-NNNNN.safetensors`` before the first step, every
    ``trace_every`` steps and at each epoch's end, and trace.json; ``FitResult.trace`` is
    it. ``on_epoch(epoch)`` runs before each epoch's first step (a trainer's per-epoch
    switches, such as late dropout), in a replay too.
    """
    started = time.perf_counter()
    run = _LoopState.start(model, train_loader, config, progress, checkpoint_dir, on_epoch)
    if resume:
        run.resume()
    if config.trace_every and trace_dir is not None:
        run.tracer = _Tracer(Path(trace_dir), config.trace_every)
        run.tracer.folder.mkdir(parents=True, exist_ok=True)
        if resume:
            run.tracer.resume(run.global_step)
        if run.global_step == 0:
            run.tracer.checkpoint(run, 0)
    stopped_early = False
    val_metrics: dict[str, float] = dict(run.history[-1]["val"]) if run.history else {}
    for epoch in range(run.next_epoch, config.epochs + 1):
        if config.early_stopping_patience and run.bad_epochs >= config.early_stopping_patience:
            stopped_early = True
            break
        train_metrics = run.train_epoch(epoch, train_loader, step_fn)
        val_metrics, improved = run.validate(epoch, val_loader, eval_fn)
        run.end_epoch(epoch, train_metrics, val_metrics, improved)

    if run.tracer is not None:
        run.tracer.write()
    if config.restore_best and run.best_state is not None:
        model.load_state_dict(run.best_state)
    return FitResult(
        epochs_run=len(run.history),
        global_step=run.global_step,
        best_epoch=run.best_epoch,
        best_metrics=run.best_metrics,
        final_metrics=val_metrics,
        history=run.history,
        stopped_early=stopped_early,
        seconds=time.perf_counter() - started,
        trace=run.tracer.trace if run.tracer is not None and len(run.tracer.leaves) >= 2 else None,
    )


def replay(
    model: nn.Module,
    train_loader: Iterable[Any],
    step_fn: StepFn,
    config: LoopConfig,
    state: Mapping[str, Any],
    steps: int,
    *,
    source: str = "checkpoint",
    device: str = "cpu",
    on_epoch: Callable[[int], None] | None = None,
    progress: Progress | None = None,
    mixed_precision: bool = False,
) -> dict[str, Any]:
    """Re-execute ``steps`` optimizer steps of the run ``config`` describes, from the training
    state ``state`` (``training.artifacts.read_state_file`` of a trace checkpoint), in fp32
    (or with the run's mixed precision when ``mixed_precision``) on ``device``: the same batches, in the same order, with the same random draws, as the
    run took after that checkpoint. ``model`` ends holding the weights reached. Returns the
    training state reached (``training_state``). ArtifactError when the state does not fit this run (named
    ``source``); ValueError when the steps run past the epoch's end (a segment never does).
    ``progress`` gets each step's event, as ``fit`` sends it.
    """
    exact = replace(
        config, mixed_precision=mixed_precision and config.mixed_precision, compile=False, device=device, trace_every=0
    )
    run = _LoopState.start(model, train_loader, exact, progress, None, on_epoch)
    run.load_training_state(state, source)
    epoch, done = divmod(run.global_step, run.steps_per_epoch)
    if steps < 1 or done + steps > run.steps_per_epoch:
        raise ValueError(
            f"{steps} steps from step {run.global_step} leave epoch {epoch + 1} "
            f"({run.steps_per_epoch} steps per epoch)."
        )
    run.train_epoch(epoch + 1, train_loader, step_fn, skip=done, steps=steps)
    return run.training_state(epoch + 1)
