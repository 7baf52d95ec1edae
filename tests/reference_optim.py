"""Optimizers torch does not ship, written from their papers with torch's tensor ops in the
style of torch.optim's for-loop implementations: the references our fused kernels are tested
against (optim_registry's ``theirs``). They take torch's common flags (``foreach``, ``fused``,
``capturable``, ``differentiable``, ``maximize``) and run the same loop whatever they say."""
import math

import torch


class _ScaledReference(torch.optim.Optimizer):
    """The loop the references share, as torch.optim's for-loop implementations run it: a
    GradScaler's ``grad_scale``/``found_inf`` taken as torch's fused optimizers take them (the
    grads unscaled in place, nothing at all done on an overflow), ``maximize``, the state made
    at a param's first step and its step count; ``_update`` is the optimizer's own."""

    _step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        if found_inf is not None and found_inf.item() != 0:
            return loss
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if grad_scale is not None:
                    p.grad.div_(grad_scale.to(p.grad.device))
                state = self.state[p]
                if len(state) == 0:
                    state.update(step=torch.tensor(0.0), **self._first_state(p))
                state["step"] += 1
                self._update(p, -p.grad if group["maximize"] else p.grad, state, group)
        return loss


class ReferenceLion(_ScaledReference):
    """Lion (Chen et al. 2023, Algorithm 2; decoupled weight decay), one op per rounding:
    c = beta1 m + (1 - beta1) g;  p = p (1 - lr wd) - lr sign(c);  m = beta2 m + (1 - beta2) g.
    A GradScaler's ``grad_scale``/``found_inf`` are taken as torch's fused optimizers take them:
    the grads unscaled in place, nothing at all done on an overflow."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *, maximize=False,
                 foreach=None, capturable=False, differentiable=False, fused=None):
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if fused and foreach:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
        super().__init__(params, dict(lr=lr, betas=tuple(betas[:2]), weight_decay=weight_decay,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      differentiable=differentiable, fused=fused))

    def _first_state(self, p):
        return {"exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format)}

    def _update(self, p, grad, state, group):
        beta1, beta2 = (float(b) for b in group["betas"])
        lr, m = float(group["lr"]), state["exp_avg"]
        direction = (m * beta1 + grad * (1 - beta1)).sign()
        if group["weight_decay"] != 0:
            p.mul_(1 - lr * group["weight_decay"])
        p.add_(direction, alpha=-lr)
        m.copy_(m * beta2 + grad * (1 - beta2))


class ReferenceAdEMAMix(_ScaledReference):
    """AdEMAMix (Pagliardini et al. 2024, Algorithm 1), with alpha and beta3 warm-ups as
    bitsandbytes defines them, one tensor op per rounding:
    m1 = beta1 m1 + (1 - beta1) g;  m2 = beta3_t m2 + (1 - beta3_t) g;  nu = beta2 nu + (1 - beta2) g^2
    p -= lr ((m1 / (1 - beta1^t) + alpha_t m2) / (sqrt(nu) / sqrt(1 - beta2^t) + eps) + wd p).
    A GradScaler's ``grad_scale``/``found_inf`` are taken as ReferenceLion takes them."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None,
                 eps=1e-8, weight_decay=1e-2, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if fused and foreach:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3,
                                      eps=eps, weight_decay=weight_decay, maximize=maximize, foreach=foreach,
                                      capturable=capturable, differentiable=differentiable, fused=fused))

    @staticmethod
    def schedules(group, t):
        """(alpha_t, beta3_t) of step t, in Python floats."""
        beta1, _, beta3 = group["betas"]
        alpha, t_alpha, t_beta3 = group["alpha"], group["t_alpha"], group["t_beta3"]
        alpha_t = min(t * alpha / t_alpha, alpha) if t_alpha else alpha
        if t_beta3:
            ln1, ln3, s = math.log(beta1), math.log(beta3), t / t_beta3
            beta3 = min(math.exp(ln1 * ln3 / ((1 - s) * ln3 + s * ln1)), beta3)
        return alpha_t, beta3

    def _first_state(self, p):
        return {key: torch.zeros_like(p, memory_format=torch.preserve_format) for key in ("m1", "m2", "nu")}

    def _update(self, p, grad, state, group):
        beta1, beta2, _ = (float(b) for b in group["betas"])
        lr, wd, eps = float(group["lr"]), group["weight_decay"], group["eps"]
        t = state["step"].item()
        alpha_t, beta3_t = self.schedules(group, t)
        m1, m2, nu = state["m1"], state["m2"], state["nu"]
        m1.mul_(beta1).add_(grad, alpha=1 - beta1)
        m2.mul_(beta3_t).add_(grad, alpha=1 - beta3_t)
        nu.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        # the correctly rounded sqrt of IEEE (of torch's fused Adam, at::vec and CUDA):
        # torch's CPU sqrt of a float tensor (MKL's vsSqrt) is 1 ulp off for some values
        denom = nu.double().sqrt().float() / math.sqrt(1 - beta2 ** t) + eps
        update = (m1 / (1 - beta1 ** t) + alpha_t * m2) / denom
        p.sub_(lr * update.add_(p, alpha=wd))
