"""The three implementations of a mixed-precision optimizer step that every suite compares.

* fused_amp:    half params, fp32 masters, fused_amp.GradScaler + a fused_amp optimizer.
* torch_amp:    PyTorch's AMP recipe: fp32 params, torch.amp.GradScaler, torch's best
                optimizer setting (fused=True where supported, else foreach=True).
* torch_master: half params with fp32 masters kept by hand: unscale + inf check of the half
                grads (what GradScaler.unscale_ runs), the .item() check, copies into fp32
                master grads, torch's fused optimizer on the masters, copy back, scale update.

With ``max_grad_norm`` each clips by the global grad norm as its users would: fused_amp through
the optimizer's ``max_grad_norm`` (norm in the overflow-check pass, clip in the step),
torch_amp with ``scaler.unscale_`` + ``torch.nn.utils.clip_grad_norm_``, torch_master with
``clip_grad_norm_`` on the fp32 master grads.
"""
from typing import Dict, List, Optional

import torch

import fused_amp

IMPLS = ("fused_amp", "torch_amp", "torch_master")


def _groups_with_grads(optimizer):
    """(group, its params with grads, their grads) of each group, for the _foreach loops below."""
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        yield group, params, [p.grad for p in params]


class ForeachLion(torch.optim.Optimizer):
    """Lion as a user without a library writes it for speed: torch's _foreach ops (torch ships no
    Lion). torch's fused/foreach flags are accepted; it always runs this one way."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **torch_flags):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group, params, grads in _groups_with_grads(self):
            for p in params:
                if not self.state[p]:
                    self.state[p]["exp_avg"] = torch.zeros_like(p)
            ms = [self.state[p]["exp_avg"] for p in params]
            (beta1, beta2), lr = group["betas"], group["lr"]
            direction = torch._foreach_mul(ms, beta1)
            torch._foreach_add_(direction, grads, alpha=1 - beta1)
            torch._foreach_sign_(direction)
            if group["weight_decay"]:
                torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
            torch._foreach_add_(params, direction, alpha=-lr)
            torch._foreach_mul_(ms, beta2)
            torch._foreach_add_(ms, grads, alpha=1 - beta2)


class ForeachAdEMAMix(torch.optim.Optimizer):
    """AdEMAMix as a user without a library writes it for speed: torch's _foreach ops (torch
    ships none), no warm-ups. torch's fused/foreach flags are accepted; it always runs this way."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, eps=1e-8, weight_decay=1e-2,
                 **torch_flags):
        super().__init__(params, dict(lr=lr, betas=betas, alpha=alpha, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group, params, grads in _groups_with_grads(self):
            for p in params:
                if not self.state[p]:
                    self.state[p].update(step=0, m1=torch.zeros_like(p), m2=torch.zeros_like(p),
                                         nu=torch.zeros_like(p))
                self.state[p]["step"] += 1
            t = self.state[params[0]]["step"]
            m1, m2, nu = ([self.state[p][k] for p in params] for k in ("m1", "m2", "nu"))
            (beta1, beta2, beta3), lr = group["betas"], group["lr"]
            torch._foreach_lerp_(m1, grads, 1 - beta1)
            torch._foreach_lerp_(m2, grads, 1 - beta3)
            torch._foreach_mul_(nu, beta2)
            torch._foreach_addcmul_(nu, grads, grads, 1 - beta2)
            denom = torch._foreach_sqrt(nu)
            torch._foreach_div_(denom, (1 - beta2 ** t) ** 0.5)
            torch._foreach_add_(denom, group["eps"])
            update = torch._foreach_mul(m2, group["alpha"])
            torch._foreach_add_(update, torch._foreach_div(m1, 1 - beta1 ** t))
            torch._foreach_div_(update, denom)
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
            torch._foreach_add_(params, update, alpha=-lr)


OPTIMIZERS = {
    "adam": (fused_amp.optim.Adam, torch.optim.Adam, dict(lr=1e-3)),
    "adamw": (fused_amp.optim.AdamW, torch.optim.AdamW, dict(lr=1e-3, weight_decay=1e-2)),
    "sgd": (fused_amp.optim.SGD, torch.optim.SGD, dict(lr=1e-3, momentum=0.9)),
    "lion": (fused_amp.optim.Lion, ForeachLion, dict(lr=1e-4, weight_decay=1e-2)),
    "adagrad": (fused_amp.optim.Adagrad, torch.optim.Adagrad, dict(lr=1e-2)),
    "rmsprop": (fused_amp.optim.RMSprop, torch.optim.RMSprop, dict(lr=1e-3)),
    "adamax": (fused_amp.optim.Adamax, torch.optim.Adamax, dict(lr=2e-3)),
    "radam": (fused_amp.optim.RAdam, torch.optim.RAdam, dict(lr=1e-3)),
    "nadam": (fused_amp.optim.NAdam, torch.optim.NAdam, dict(lr=2e-3)),
    "ademamix": (fused_amp.optim.AdEMAMix, ForeachAdEMAMix, dict(lr=1e-3)),
    "adadelta": (fused_amp.optim.Adadelta, torch.optim.Adadelta, dict(lr=1.0)),
    "rprop": (fused_amp.optim.Rprop, torch.optim.Rprop, dict(lr=1e-2)),
}
INIT_SCALE = 1024.0  # small enough that scaled fp16 grads stay finite
# fused_amp's optimizer settings in every suite: the default, torch's behaviour (p.grad left
# unscaled after the step, which torch's fused optimizers write too: 2 bytes/param for half grads)
FUSED_AMP_SETTINGS = dict(unscale_grads=True)


def torch_best_optimizer(cls, params, kw):
    """torch's fastest setting of ``cls`` on these params: fused, else foreach."""
    try:
        return cls(params, fused=True, **kw)
    except (RuntimeError, ValueError, TypeError):
        return cls(params, foreach=True, **kw)


class ScalerStep:
    """A GradScaler and an optimizer that takes the scale into its step (fused_amp's, or
    torch's best); ``step`` is scaler.step + scaler.update, as a training loop runs them."""

    def __init__(self, params: List[torch.nn.Parameter], optimizer, scaler_cls, device: str,
                 clip_max_norm: Optional[float] = None):
        self.params = params
        self.optimizer = optimizer
        self.clip_max_norm = clip_max_norm  # torch's recipe: unscale_, then clip_grad_norm_
        self.scaler = scaler_cls(device, init_scale=INIT_SCALE)
        self.scaler.scale(torch.ones((), device=device))  # creates the scale, as backward of a scaled loss would

    def step(self):
        if self.clip_max_norm is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, self.clip_max_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def tensors(self):
        return (list(self.params) + [p.grad for p in self.params]
                + [t for s in self.optimizer.state.values() for t in s.values()])


def fused_amp_step(params, opt_name, device, max_grad_norm=None, **options):
    """fused_amp's step; ``options`` go to the optimizer (the memory modes)."""
    cls, _, kw = OPTIMIZERS[opt_name]
    optimizer = cls(params, **kw, **FUSED_AMP_SETTINGS, max_grad_norm=max_grad_norm, **options)
    return ScalerStep(params, optimizer, fused_amp.GradScaler, device)


def torch_amp_step(params, opt_name, device, max_grad_norm=None):
    _, cls, kw = OPTIMIZERS[opt_name]
    return ScalerStep(params, torch_best_optimizer(cls, params, kw), torch.amp.GradScaler, device,
                      clip_max_norm=max_grad_norm)


class TorchMasterStep:
    def __init__(self, params: List[torch.nn.Parameter], opt_name: str, device: str,
                 max_grad_norm=None):
        _, cls, kw = OPTIMIZERS[opt_name]
        self.params = params
        self.max_grad_norm = max_grad_norm
        self.masters = [torch.nn.Parameter(p.detach().float()) for p in params]
        for m in self.masters:
            m.grad = torch.zeros_like(m)
        self.optimizer = torch_best_optimizer(cls, self.masters, kw)
        self.scale = torch.full((), INIT_SCALE, device=device)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self.found_inf = torch.zeros((), device=device)

    def step(self):
        grads = [p.grad for p in self.params]
        self.found_inf.zero_()
        inv_scale = self.scale.double().reciprocal().float()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, inv_scale)
        if self.found_inf.item() == 0:  # the host sync
            torch._foreach_copy_([m.grad for m in self.masters], grads)
            if self.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.masters, self.max_grad_norm)
            self.optimizer.step()
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.masters)
        torch._amp_update_scale_(self.scale, self.growth_tracker, self.found_inf, 2.0, 0.5, 2000)

    def tensors(self):
        return (list(self.params) + [p.grad for p in self.params] + self.masters
                + [m.grad for m in self.masters]
                + [t for s in self.optimizer.state.values() for t in s.values()])


STEP_CLASSES = {"fused_amp": fused_amp_step, "torch_amp": torch_amp_step, "torch_master": TorchMasterStep}


def param_dtype(impl: str, half_dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if impl == "torch_amp" else half_dtype


def build_steps(shapes, opt_name: str, half_dtype: torch.dtype, device: str, impls=IMPLS,
                max_grad_norm: Optional[float] = None) -> Dict:
    """For each implementation: its step object, and the pristine scaled grads that its
    ``prepare`` copies into .grad before every timed step (the unscale happens in place in
    torch's implementations, so a timed step never sees an already-unscaled grad)."""
    data = params_and_grads(shapes, [param_dtype(impl, half_dtype) for impl in impls], device)
    return {impl: (STEP_CLASSES[impl](params, opt_name, device, max_grad_norm), pristine)
            for impl, (params, pristine) in zip(impls, data)}


def params_and_grads(shapes, dtypes: List[torch.dtype], device: str, seed: int = 0) -> List:
    """For each of ``dtypes`` (one entry per implementation, repeats allowed): params of
    ``shapes`` in that dtype with scaled grads, and the pristine grads that a step's prepare
    copies back. Every tensor is drawn once, for all of them alike, and no fp32 copy of the whole
    list is ever held."""
    gen = torch.Generator(device).manual_seed(seed)
    out = [([], []) for _ in dtypes]
    for s in shapes:
        value = torch.randn(s, generator=gen, device=device)
        grad = torch.randn(s, generator=gen, device=device).mul_(INIT_SCALE)
        for dtype, (params, pristine) in zip(dtypes, out):
            p = torch.nn.Parameter(value.to(dtype, copy=True))
            g = grad.to(dtype, copy=True)
            p.grad = g.clone()
            params.append(p)
            pristine.append(g)
    return out


def refresh_grads(step_obj, pristine):
    torch._foreach_copy_([p.grad for p in step_obj.params], pristine)
