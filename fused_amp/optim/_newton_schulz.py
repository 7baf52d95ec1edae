"""Muon's Newton-Schulz orthogonalization, batched over matrices of one shape.

torch.optim.Muon runs it per matrix in bf16: X = G / ||G||_F (the wide orientation: a tall G is
transposed first), then ``ns_steps`` times A = X X^T, B = b A + c A A, X = a X + B X. Here the
matrices of one shape are one (k, m, n) stack and each product is one batched product over it.
A tall stack is not transposed: with A = X^T X, X = a X + X B is the same iteration (B is
symmetric) without the copies.

Every value between the products is bf16, as in torch's. On a GPU the products are bf16
``baddbmm`` (Tensor Cores); on the CPU, whose bf16 GEMMs run an order of magnitude slower than
its fp32 ones where it has no bf16 instructions, each product is an fp32 ``baddbmm`` of the bf16
values (exact in fp32), rounded to bf16: what a bf16 GEMM computes (fp32 accumulation, one
rounding of the result), up to the order of the sums. It is an op of its own
(``torch.ops.fused_amp.newton_schulz``), which torch.compile calls as it is: inductor would
otherwise keep the fp32 products where they are rounded to bf16, another iteration than torch's.
"""
from typing import Tuple

import torch


def check_ns_options(ns_coefficients, ns_steps):
    """torch.optim.Muon's checks of its Newton-Schulz options, with its messages (torch makes
    them inside the step, after it changed the first param's momentum; we before any change)."""
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")


def _fp32_products(x: torch.Tensor) -> bool:
    return x.device.type == "cpu"


def orthogonalize(stack: torch.Tensor, ns_coefficients: Tuple[float, float, float], ns_steps: int,
                  eps: float) -> torch.Tensor:
    """The Newton-Schulz orthogonalization of every matrix of ``stack`` ((k, m, n), bf16), as
    torch.optim.Muon computes it for each; returns a new bf16 stack."""
    a, b, c = (float(x) for x in ns_coefficients)
    return torch.ops.fused_amp.newton_schulz(stack, a, b, c, int(ns_steps), float(eps))


@torch.library.custom_op("fused_amp::newton_schulz", mutates_args=())
def _newton_schulz(stack: torch.Tensor, a: float, b: float, c: float, ns_steps: int, eps: float) -> torch.Tensor:
    tall = stack.size(1) > stack.size(2)
    norms = torch.linalg.vector_norm(stack, dim=(1, 2), keepdim=True).clamp_(min=eps)
    x = stack / norms
    compute = torch.float32 if _fp32_products(x) else torch.bfloat16

    def rounded(t):
        return t.to(torch.bfloat16).to(compute)

    x = x.to(compute)
    for _ in range(ns_steps):
        gram = rounded(torch.bmm(x.mT, x) if tall else torch.bmm(x, x.mT))
        poly = rounded(torch.baddbmm(gram, gram, gram, beta=b, alpha=c))
        x = rounded(torch.baddbmm(x, x, poly, beta=a) if tall else torch.baddbmm(x, poly, x, beta=a))
    return x.to(torch.bfloat16)


@_newton_schulz.register_fake
def _(stack, a, b, c, ns_steps, eps):
    return torch.empty_like(stack)
