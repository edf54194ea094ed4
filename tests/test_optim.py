"""dpsummary.optim: the same arithmetic as torch.optim, without importing torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dpsummary.optim import Adam, ExponentialDecay


def _quadratic_run(make_opt, make_sched, steps: int = 25) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(4, 3, generator=gen, dtype=torch.float64).requires_grad_(True)
    b = torch.randn(5, generator=gen, dtype=torch.float64).requires_grad_(True)
    target = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    opt = make_opt([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.03}])
    sched = make_sched(opt)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = ((a - target) ** 2).sum() + (b**4).sum() + (a.sum() * b.sum()) ** 2
        loss.backward()
        opt.step()
        sched.step()
    return [a.detach(), b.detach()]


def test_adam_and_decay_match_torch_optim() -> None:
    ours = _quadratic_run(Adam, lambda o: ExponentialDecay(o, 0.97))
    ref = _quadratic_run(torch.optim.Adam, lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.97))
    for x, y in zip(ours, ref, strict=True):
        # Same kernel; the schedules differ only in how gamma^t is rounded (1 ulp per step).
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def test_adam_skips_parameters_without_gradient_and_validates() -> None:
    p = torch.zeros(2, requires_grad=True)
    q = torch.ones(2, requires_grad=True)
    opt = Adam([p, q], lr=0.5)
    p.grad = torch.ones(2)
    opt.step()
    assert torch.all(p < 0) and torch.equal(q.detach(), torch.ones(2))
    with pytest.raises(ValueError):
        Adam([torch.zeros(2)])
    with pytest.raises(ValueError):
        ExponentialDecay(opt, 0.0)


def test_psvi_path_does_not_import_dynamo() -> None:
    code = ("import sys, torch\n"
            "from dpsummary.constructors.psvi import adam, exponential_decay\n"
            "p = torch.zeros(3, requires_grad=True)\n"
            "o = adam([{'params': [p], 'lr': 0.1}]); s = exponential_decay(o, 10)\n"
            "p.grad = torch.ones(3); o.step(); s.step(); o.zero_grad()\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
