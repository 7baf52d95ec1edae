"""Optimizers torch does not ship, written from their papers with torch's tensor ops in the
style of torch.optim's for-loop implementations: the references our fused kernels are tested
against (optim_registry's ``theirs``). They take torch's common flags (``foreach``, ``fused``,
``capturable``, ``differentiable``, ``maximize``) and run the same loop whatever they say."""
import torch


class ReferenceLion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, Algorithm 2; decoupled weight decay), one op per rounding:
    c = beta1 m + (1 - beta1) g;  p = p (1 - lr wd) - lr sign(c);  m = beta2 m + (1 - beta2) g.
    A GradScaler's ``grad_scale``/``found_inf`` are taken as torch's fused optimizers take them:
    the grads unscaled in place, nothing at all done on an overflow."""

    _step_supports_amp_scaling = True

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
            beta1, beta2 = (float(b) for b in group["betas"])
            lr = float(group["lr"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                if grad_scale is not None:
                    p.grad.div_(grad_scale.to(p.grad.device))
                grad = -p.grad if group["maximize"] else p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                m = state["exp_avg"]
                direction = (m * beta1 + grad * (1 - beta1)).sign()
                if group["weight_decay"] != 0:
                    p.mul_(1 - lr * group["weight_decay"])
                p.add_(direction, alpha=-lr)
                m.copy_(m * beta2 + grad * (1 - beta2))
        return loss
