"""The ways to train with Adam in mixed precision that the memory and model suites time against
each other on one parameter list: torch's recipes, fused_amp in each memory mode, and the outside
anchors with 8-bit state where installed. Every recipe steps with a GradScaler (scaler step +
update), on the same values and scaled grads.

Recipes that do not all fit in memory at once are timed in batches, each with torch's recipe in
it, so that every ratio to torch's recipe is still measured in turns."""
import contextlib
import importlib
import os
from typing import Callable, Dict, List, NamedTuple, Optional

import torch

import fused_amp
from fused_amp.benchmark import harness, impls, workloads
from fused_amp.benchmark.roofline import bytes_per_param

TORCH = "torch_amp"  # torch's AMP recipe: fp32 weights, its fused Adam, torch.amp.GradScaler


class Recipe(NamedTuple):
    fp32_params: bool  # fp32 weights, else bf16
    build: Callable  # (params, opt_name, device) -> a step (impls.ScalerStep)
    op: str  # roofline operation: the bytes the step must move (roofline.py)
    holds: float  # bytes held per param (weights, grads, optimizer state), for the fit check
    masters: str  # what the update is applied to: one of MASTERS
    state: str = "fp32"  # the optimizer state's storage: fp32, bf16, 8-bit or 4-bit
    module: Optional[str] = None  # an outside anchor's package: skipped when not installed


def _fused(**options):
    return lambda params, opt, device: impls.fused_amp_step(params, opt, device, **options)


def _torch(params, opt, device):
    return impls.torch_amp_step(params, opt, device)


def _anchor(make):
    def build(params, opt, device):
        with torch_env_kept():  # (an anchor's first use may set it too)
            optimizer = make(params)
        return impls.ScalerStep(params, optimizer, torch.amp.GradScaler, device)
    return build


def _bnb_adam8bit(params):
    from bitsandbytes.optim import Adam8bit
    return Adam8bit(params, lr=1e-3)


def _deepspeed_adam(params):
    """DeepSpeed's Adam for the params' device: its CPU Adam (the optimizer of ZeRO-Offload), or
    its fused CUDA Adam; both compile their kernels on first use."""
    if params[0].device.type == "cpu":
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam(params, lr=1e-3, adamw_mode=False)
    from deepspeed.ops.adam import FusedAdam
    return FusedAdam(params, lr=1e-3, adam_w_mode=False)


def _torchao_adam8bit(params):
    from torchao.optim import AdamW8bit
    return AdamW8bit(params, lr=1e-3, weight_decay=0.0)


def _torchao_adam4bit(params):
    from torchao.optim import AdamW4bit
    return AdamW4bit(params, lr=1e-3, weight_decay=0.0)


# what each recipe applies the update to, and whether that keeps every update (exact)
MASTERS = {"fp32 weights": True, "fp32": True, "bf16 + remainder": True, "bf16 + 8 bits": False, "none": False}
REMAINDER8 = dict(master_weights="remainder8", rounding_seed=0)
RECIPES: Dict[str, Recipe] = {
    TORCH: Recipe(True, _torch, "adam", 16, "fp32 weights"),
    "torch_bf16": Recipe(False, _torch, "adam_half", 8, "none", "bf16"),
    "fused_amp": Recipe(False, _fused(), "adam", 16, "fp32"),
    "fused_amp[fp32 params]": Recipe(True, _fused(), "adam", 16, "fp32 weights"),
    "fused_amp[remainder]": Recipe(False, _fused(master_weights="remainder"), "adam_remainder", 14, "bf16 + remainder"),
    "fused_amp[no masters]": Recipe(False, _fused(master_weights=False), "adam_no_masters", 12, "none"),
    "fused_amp[bf16 state]": Recipe(False, _fused(state_dtype=torch.bfloat16), "adam_bf16_state", 12, "fp32", "bf16"),
    "fused_amp[bf16 state, stochastic]": Recipe(
        False, _fused(state_dtype=torch.bfloat16, stochastic_rounding=True, rounding_seed=0),
        "adam_bf16_state", 12, "fp32", "bf16"),
    "fused_amp[remainder + bf16 state]": Recipe(
        False, _fused(master_weights="remainder", state_dtype=torch.bfloat16), "adam_remainder_bf16_state",
        10, "bf16 + remainder", "bf16"),
    "fused_amp[8-bit state]": Recipe(False, _fused(state_dtype=torch.uint8), "adam_8bit_state", 10, "fp32", "8-bit"),
    "fused_amp[8-bit state, stochastic]": Recipe(
        False, _fused(state_dtype=torch.uint8, stochastic_rounding=True, rounding_seed=0), "adam_8bit_state",
        10, "fp32", "8-bit"),
    "fused_amp[remainder + 8-bit state]": Recipe(
        False, _fused(master_weights="remainder", state_dtype=torch.uint8), "adam_remainder_8bit_state", 8,
        "bf16 + remainder", "8-bit"),
    "fused_amp[24-bit masters]": Recipe(False, _fused(**REMAINDER8), "adam_24bit", 13, "bf16 + 8 bits"),
    "fused_amp[24-bit masters + 8-bit state]": Recipe(
        False, _fused(**REMAINDER8, state_dtype=torch.uint8), "adam_24bit_8bit_state", 7, "bf16 + 8 bits", "8-bit"),
    "fused_amp[remainder + 4-bit state]": Recipe(
        False, _fused(master_weights="remainder", state_dtype=torch.uint4), "adam_remainder_4bit_state", 7.06,
        "bf16 + remainder", "4-bit"),
    "fused_amp[24-bit masters + 4-bit state]": Recipe(
        False, _fused(**REMAINDER8, state_dtype=torch.uint4), "adam_24bit_4bit_state", 6.06, "bf16 + 8 bits", "4-bit"),
    # the outside anchors: their Adam on fp32 weights (no masters) under torch's GradScaler, as
    # their users run it
    "bitsandbytes[Adam8bit]": Recipe(True, _anchor(_bnb_adam8bit), "adam_8bit_state", 10, "fp32 weights",
                                     "8-bit", "bitsandbytes"),
    "torchao[AdamW8bit]": Recipe(True, _anchor(_torchao_adam8bit), "adam_8bit_state", 10, "fp32 weights",
                                 "8-bit", "torchao"),
    "torchao[AdamW4bit]": Recipe(True, _anchor(_torchao_adam4bit), "adam_4bit_state", 9.06, "fp32 weights",
                                 "4-bit", "torchao"),
    "deepspeed[Adam]": Recipe(True, _anchor(_deepspeed_adam), "adam", 16, "fp32 weights", "fp32", "deepspeed"),
}
ANCHORS = tuple(name for name, r in RECIPES.items() if r.module)


PIP_NAMES = {"optimi": "torch-optimi"}


# what an outside package may set in the environment that changes torch's own speed, and the
# process keeps: deepspeed's import sets PYTORCH_NVML_BASED_CUDA_CHECK=1, after which every
# torch.cuda.is_available() asks NVML (35 us instead of 1 on a machine without a GPU), and
# torch's optimizers call it several times per step (its fused CPU AdamW on 4k elements:
# 38 us a step before the import, 177 after)
TORCH_ENV = ("PYTORCH_NVML_BASED_CUDA_CHECK",)


@contextlib.contextmanager
def torch_env_kept():
    """Undoes, on exit, what the block set of TORCH_ENV in the environment."""
    before = {key: os.environ.get(key) for key in TORCH_ENV}
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def installed(module: str) -> bool:
    """Whether an outside package imports (installed, and loads on this machine)."""
    if module == "deepspeed" and not torch.cuda.is_available():
        # its accelerator named, not probed: finding no GPU, the probe logs a warning to stdout,
        # a line in the middle of the report (the CPU is what it would pick)
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        with torch_env_kept():
            importlib.import_module(module)
        return True
    except ImportError:
        return False


def not_installed(module: str) -> str:
    """Why an outside anchor's rows are skipped, and how to get them."""
    return f"{module} is not installed (optional: pip install {PIP_NAMES.get(module, module)})"


def free_bytes(device: str) -> int:
    """Memory a new allocation can take now: the GPU's free memory, or the OS's MemAvailable."""
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


_batches = {}  # (suite, case, recipes) -> the batches that fit, as the first repeat found them


def _fit(ctx, suite, case, n, chosen):
    """The recipes in batches that fit in 70% of the free memory, torch's recipe in each."""
    budget = 0.7 * free_bytes(ctx.device)
    # bytes each needs while timed: what it holds, and the pristine grads its prepare copies from
    need = {name: n * (RECIPES[name].holds + (4 if RECIPES[name].fp32_params else 2)) for name in chosen}
    batches, current = [], [TORCH]
    for name in chosen:
        if name == TORCH:
            continue
        if need[TORCH] + need[name] > budget:
            ctx.skip(suite, f"{case} {name}", f"does not fit beside torch's recipe: needs "
                     f"{(need[TORCH] + need[name]) / 2 ** 30:.1f} GiB, {budget / 2 ** 30:.1f} GiB usable")
        elif sum(need[m] for m in current) + need[name] > budget:
            batches.append(current)
            current = [TORCH, name]
        else:
            current.append(name)
    return batches + [current]


# torch's recipe timed without its GradScaler: its fused Adam alone (run's ``bare``)
TORCH_BARE = "torch_fused"


def run(ctx, suite: str, case: str, shapes, names: List[str], opt_name: str = "adam",
        skip_anchors: bool = False, bare: bool = False) -> List[Dict]:
    """Times the recipes ``names`` (torch's among them) on ``shapes`` (bf16 weights, or fp32) in
    turns, in as few batches as fit in memory; records carry the bytes each holds
    (``held_bytes``: weights, grads, optimizer state) and its own roofline bytes per param.
    With ``bare``, each recipe's optimizer step alone, as an offload engine calls it: no
    GradScaler, and torch's recipe recorded as its fused Adam, ``TORCH_BARE``."""
    n = workloads.n_params(shapes)
    chosen = []
    for name in names:
        recipe = RECIPES[name]
        if recipe.module and skip_anchors:  # torchao compiles its step first: tens of seconds
            ctx.skip(suite, name, "full runs only")
        elif recipe.module and not installed(recipe.module):
            ctx.skip(suite, name, not_installed(recipe.module))
        else:
            chosen.append(name)
    key = (suite, case, tuple(chosen))
    if key not in _batches:  # decided once: every repeat of the plan times the same batches
        _batches[key] = _fit(ctx, suite, case, n, chosen)
    batches = _batches[key]
    records = []
    for i, batch in enumerate(batches):
        dtypes = [torch.float32 if RECIPES[name].fp32_params else torch.bfloat16 for name in batch]
        steps = {name: (RECIPES[name].build(params, opt_name, ctx.device), pristine)
                 for name, (params, pristine) in zip(batch, impls.params_and_grads(shapes, dtypes, ctx.device))}
        timed = [harness.Impl(name, step.optimizer.step if bare else step.step,
                              (lambda s=step, p=pristine: impls.refresh_grads(s, p)))
                 for name, (step, pristine) in steps.items()]
        times = harness.time_alternating(timed, ctx.device, ctx.reps)
        extra = {name: {"held_bytes": harness.tensor_bytes(step.tensors())} for name, (step, _) in steps.items()}
        del steps, timed
        batch_records = harness.make_records(suite, case, ctx.device, "bfloat16", n, len(shapes),
                                             times, ctx.ceiling_gbps, None, extra)
        records += [r for r in batch_records if i == 0 or r["impl"] != TORCH]  # torch's: the first batch's
    for rec in records:  # each recipe at its own bytes: the step's, and the scaler's check of the grads
        recipe = RECIPES[rec["impl"]]
        dtype, grad = ("float32", 4) if recipe.fp32_params else ("bfloat16", 2)
        rec["bytes_per_param"] = bytes_per_param(recipe.op, dtype) + (0 if bare else 2 * grad)
        rec["gbytes_per_s"] = rec["bytes_per_param"] * n / (rec["time_ms"] / 1e3) / 1e9
        rec["ceiling_frac"] = rec["gbytes_per_s"] / ctx.ceiling_gbps if ctx.ceiling_gbps else None
        rec["masters"], rec["state"] = recipe.masters, recipe.state
    if bare:
        for rec in records:
            rec["impl"] = TORCH_BARE if rec["impl"] == TORCH else rec["impl"]
            for key in ("speedup_vs", "speedup_range"):
                rec[key] = {TORCH_BARE if k == TORCH else k: v for k, v in rec[key].items()}
    if len(batches) > 1:
        ctx.note(suite, f"{case}: timed in {len(batches)} batches that fit in memory, torch's recipe in each")
    return records
