"""Every optimizer fused_amp ships, with its torch counterpart and the option sets that the
generic tests run it with. A new optimizer is covered by every generic test by adding one entry."""
import inspect
import os
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

from fused_amp.optim import SGD, Adadelta, Adagrad, Adam, Adamax, AdamW, AdEMAMix, Lion, NAdam, RAdam, RMSprop, Rprop
from reference_optim import ReferenceAdEMAMix, ReferenceLion


@dataclass(frozen=True)
class OptimEntry:
    ours: type
    theirs: type
    options: Tuple[Dict, ...]  # each covers some switches; the first is the plain case


OPTIMIZERS: List[OptimEntry] = [
    OptimEntry(Adam, torch.optim.Adam, (
        dict(lr=1e-3),
        dict(lr=1e-3, weight_decay=0.1, amsgrad=True),
        # beta1 below 0.5: the first moment's lerp from its other end (torch's lerp_ has two forms)
        dict(lr=1e-3, betas=(0.4, 0.99), eps=1e-6, maximize=True),
        dict(lr=1e-3, weight_decay=0.1, decoupled_weight_decay=True),
    )),
    OptimEntry(AdamW, torch.optim.AdamW, (
        dict(lr=1e-2),
        dict(lr=1e-2, weight_decay=0.3, amsgrad=True, maximize=True),
    )),
    OptimEntry(SGD, torch.optim.SGD, (
        dict(lr=1e-2),
        dict(lr=1e-2, momentum=0.9, nesterov=True),
        dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=1e-2),
        dict(lr=1e-2, momentum=0.5, maximize=True),
    )),
    # torch has no Lion: the reference is written from the paper in tests/reference_optim.py
    OptimEntry(Lion, ReferenceLion, (
        dict(lr=1e-3),
        dict(lr=1e-3, betas=(0.95, 0.98), weight_decay=0.1, maximize=True),
    )),
    OptimEntry(Adagrad, torch.optim.Adagrad, (
        dict(lr=1e-2),
        # an eps that moves the denominator by more than its rounding (1e-10 hides a sign flip)
        dict(lr=1e-2, lr_decay=1e-2, weight_decay=0.1, initial_accumulator_value=0.1, eps=1e-2, maximize=True),
    )),
    OptimEntry(RMSprop, torch.optim.RMSprop, (
        dict(lr=1e-3),
        dict(lr=1e-3, momentum=0.9, centered=True, weight_decay=1e-2),
        dict(lr=1e-3, alpha=0.9, momentum=0.5, eps=1e-6, maximize=True),
        dict(lr=1e-3, centered=True),
    )),
    OptimEntry(Adamax, torch.optim.Adamax, (
        dict(lr=2e-3),
        dict(lr=2e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, maximize=True),
    )),
    OptimEntry(RAdam, torch.optim.RAdam, (
        dict(lr=1e-3),
        dict(lr=1e-3, betas=(0.8, 0.9), weight_decay=0.1, decoupled_weight_decay=True, maximize=True),
        dict(lr=1e-3, eps=1e-2, weight_decay=0.1),  # an eps whose sign shows (see Adagrad's)
    )),
    OptimEntry(NAdam, torch.optim.NAdam, (
        dict(lr=2e-3),
        dict(lr=2e-3, betas=(0.8, 0.99), weight_decay=0.1, momentum_decay=1e-2, decoupled_weight_decay=True,
             maximize=True),
        dict(lr=2e-3, eps=1e-6, weight_decay=0.1),
    )),
    # torch has no AdEMAMix: the reference is written from the paper in tests/reference_optim.py
    OptimEntry(AdEMAMix, ReferenceAdEMAMix, (
        dict(lr=1e-3),
        dict(lr=1e-3, betas=(0.8, 0.99, 0.999), alpha=2.0, t_alpha=50, t_beta3=50, weight_decay=0.1,
             maximize=True),
    )),
    OptimEntry(Adadelta, torch.optim.Adadelta, (
        dict(lr=1.0),
        dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1, maximize=True),
    )),
    OptimEntry(Rprop, torch.optim.Rprop, (
        dict(lr=1e-2),
        dict(lr=1e-3, etas=(0.4, 1.5), step_sizes=(1e-4, 2e-2), maximize=True),
    )),
]

def torch_impls(theirs):
    """The flags of the two implementations of ``theirs`` the parity tests compare with: torch's
    fused one (the reference) and its foreach one where it has a fused one, else its for-loop
    (the reference) and its foreach one."""
    if "fused" in inspect.signature(theirs).parameters:
        return dict(fused=True), dict(foreach=True)
    return dict(foreach=False), dict(foreach=True)


# FUSED_AMP_TEST_OPTION_SETS=N runs each optimizer's first N option sets only (2: the plain and
# the stateful one): the numerics reruns on the other instruction sets and under the sanitizers
# take 2, the whole suite runs every set.
_SETS = int(os.environ["FUSED_AMP_TEST_OPTION_SETS"]) if "FUSED_AMP_TEST_OPTION_SETS" in os.environ else None
# (ours, theirs, options) for every option set of every optimizer, and readable test ids
CASES = [(e.ours, e.theirs, kw) for e in OPTIMIZERS for kw in e.options[:_SETS]]
IDS = [f"{c.__name__}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for c, _, kw in CASES]
# the plain option set of each optimizer
PLAIN = [(e.ours, e.theirs, e.options[0]) for e in OPTIMIZERS]
PLAIN_IDS = [e.ours.__name__ for e in OPTIMIZERS]
# one option set with stateful switches on, per optimizer
STATEFUL = [(e.ours, e.theirs, e.options[1]) for e in OPTIMIZERS]
STATEFUL_IDS = [e.ours.__name__ for e in OPTIMIZERS]
PARAM_DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# The storage kinds, as (params' dtype, options): every place the fp32 value of a param can live,
# every state dtype
STORAGE = {
    "fp32": (torch.float32, {}),
    "fp16 + fp32 master": (torch.float16, {}),
    "bf16 in place": (torch.bfloat16, dict(master_weights=False)),
    "bf16 + fp32 master": (torch.bfloat16, {}),
    "bf16 + remainder, bf16 state": (torch.bfloat16, dict(master_weights="remainder", state_dtype=torch.bfloat16)),
    "bf16 + 24-bit, stochastic": (torch.bfloat16, dict(master_weights="remainder8", stochastic_rounding=True)),
    "bf16 + fp32 master, 8-bit state": (torch.bfloat16, dict(state_dtype=torch.uint8, min_8bit_size=0)),
    "bf16 + 24-bit, 4-bit state": (torch.bfloat16, dict(master_weights="remainder8", state_dtype=torch.uint4,
                                                       min_8bit_size=0)),
}
