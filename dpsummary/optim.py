"""Optimisers and learning-rate schedules passed into the constructors.

Why not ``torch.optim.Adam``: constructing any ``torch.optim.Optimizer`` (and every call of its
``zero_grad``) goes through ``torch._disable_dynamo``, whose first use imports ``torch._dynamo``:
0.75-2.2 s of a release's wall time on this machine, for an algorithm that costs microseconds
per step here (issue 15's profile of ``dpsummary release``). :class:`Adam` keeps torch's
optimiser interface (``param_groups``, ``zero_grad``, ``step``, ``state``) so the constructors and
callers that pass ``torch.optim`` optimisers keep working, and computes each step with torch's
documented functional kernel :func:`torch.optim.adam.adam` (the same arithmetic as
``torch.optim.Adam``, single-tensor path), which does not import ``torch._dynamo``.

:class:`ExponentialDecay` is the schedule counterpart of ``torch.optim.lr_scheduler.ExponentialLR``
(which refuses non-``torch.optim`` optimisers): ``lr_t = lr_0 * gamma^t`` for every group.

Both are post-processing of whatever gradient they are given: they carry no privacy meaning.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch.optim.adam import adam as _adam_kernel


class StepOptimizer(Protocol):
    """What the constructors need of an optimiser (``torch.optim.Optimizer`` satisfies it)."""

    param_groups: list[dict[str, Any]]

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> Any: ...


class Schedule(Protocol):
    """What the constructors need of a learning-rate schedule (torch's LRScheduler satisfies it)."""

    def step(self) -> None: ...


class Adam:
    """Adam (Kingma and Ba 2015) with torch's defaults, per-group learning rates.

    ``param_groups`` is an iterable of parameter tensors or of dicts ``{"params": [...], "lr":
    ...}`` as for ``torch.optim.Adam``. Each parameter's moments live in ``state[param]``
    (explicit, inspectable). Gradients are read from ``param.grad``; a parameter without a
    gradient is skipped, as torch does.
    """

    def __init__(self, param_groups: Iterable[Any], *, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        groups = list(param_groups)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.param_groups: list[dict[str, Any]] = []
        for group in groups:
            params = list(group["params"])
            if not all(isinstance(p, torch.Tensor) and p.requires_grad for p in params):
                raise ValueError("Adam optimises leaf tensors that require grad")
            lr_value = float(group.get("lr", lr))
            if not lr_value >= 0:
                raise ValueError("learning rate must be non-negative")
            self.param_groups.append({**group, "params": params, "lr": lr_value, "initial_lr": lr_value})
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state.get(p)
                if st is None:
                    st = {"step": torch.tensor(0.0, dtype=torch.float32),
                          "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                          "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
                    self.state[p] = st
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(st["exp_avg"])
                exp_avg_sqs.append(st["exp_avg_sq"])
                steps.append(st["step"])
            if not params:
                continue
            _adam_kernel(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=False, capturable=False,
                         differentiable=False, fused=None, grad_scale=None, found_inf=None, has_complex=False,
                         amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=0.0, eps=self.eps,
                         maximize=False)


class ExponentialDecay:
    """Multiply every group's learning rate by ``gamma`` at each :meth:`step` (from its initial lr)."""

    def __init__(self, optimizer: StepOptimizer, gamma: float) -> None:
        if not gamma > 0:
            raise ValueError("gamma must be positive")
        self.optimizer = optimizer
        self.gamma = float(gamma)
        self.count = 0
        self._initial = [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]

    def step(self) -> None:
        self.count += 1
        for group, lr0 in zip(self.optimizer.param_groups, self._initial, strict=True):
            group["lr"] = lr0 * self.gamma**self.count
