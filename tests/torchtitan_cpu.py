"""torchtitan 0.3.0's trainer on the CPU over gloo, for tests/test_torchtitan.py: the few patches
it needs there, its assets (the wheel ships neither the debug config's tokenizer nor its c4_test
data), and one rank's run, whose losses, grad norms and param shards go to a file.

The patches (each a CUDA-only assumption of torchtitan's, not of fused_amp's):
- ``tools.utils`` fixes the device type to "cuda" at import when there is no accelerator, and
  ``get_local_device`` then picks a CUDA device: both are made the CPU's;
- the metrics' device memory monitor reads CUDA's allocator: it reads nothing here;
- FSDP2 reduce-scatters with PREMUL_SUM once torchtitan sets its divide factor (1.0), and gloo
  refuses that op: the tests make FSDP2 use SUM (``set_force_sum_reduction_for_comms``), which
  with a factor of 1.0 gives the same sums;
- the llama3 configs use FlexAttention, which has no backward on the CPU, and 0.3.0 refuses
  SDPA for language models (it cannot mask packed documents): the tests swap SDPA's config in
  and build no masks, so attention is causal across the packed documents, in every run alike.
Upstream this would be a ``device_type`` that falls back to "cpu" and a memory monitor per device.

Run by torchrun (``launch``): ``python -m torch.distributed.run --nproc_per_node N
tests/torchtitan_cpu.py '[LAYOUT, [[OUT, OPTIMIZER, OPTIONS], ...]]'``, the runs one after another.
"""
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

from fused_amp.optim._grad_norm import local_shard

# where make deps installs torchtitan and what it imports (requirements-torchtitan.txt)
SITE = Path(os.environ.get("FUSED_AMP_TORCHTITAN", Path(sys.prefix) / "torchtitan"))


def on_path():
    """Put torchtitan's folder on this process's path, after the venv's own packages (it
    shadows none of them); fail, not skip, where it is missing."""
    if not (SITE / "torchtitan").is_dir():
        raise RuntimeError(f"torchtitan is not installed in {SITE} (make deps installs it there: "
                           "requirements-torchtitan.txt)")
    if str(SITE) not in sys.path:
        sys.path.append(str(SITE))


WORDS = ("the a of to and in is it that for on was with as by at be this from or are an not but "
         "all one had has were which when there can more we their if will up out about so them "
         "time into some other than then its two like may only first new any these our over "
         "also after most could well made way even back good many where much through long down "
         "each own great old same little world still last year day man work life right hand "
         "part place case point group number fact house water system program question").split()


def launch(layout, runs, assets, ranks=4, timeout=900):
    """``runs`` ([(out, optimizer, options)], ``run``'s arguments, with ``assets`` (make_assets)
    and by default ``out`` as the dump folder) one after another in one launch of ``ranks``
    processes under torchrun (most of a launch is the processes' imports), from any process: the
    tests and tools/torchtitan_*.py. Returns each run's [each rank's saved {"records", "shards",
    ...}]; raises RuntimeError with the error lines when one fails."""
    here = Path(__file__).resolve().parent
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = [str(here.parent), str(here), os.environ.get("PYTHONPATH", ""), str(SITE)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in path if p))
    spec = [layout, [[str(out), optimizer, {"dump": str(out), **options, "assets": assets}]
                     for out, optimizer, options in runs]]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", f"--master_port={port}",
           str(here / "torchtitan_cpu.py"), json.dumps(spec)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        lines = (done.stdout + done.stderr).splitlines()
        errors = [line for line in lines if "Error" in line or "Traceback" in line]
        raise RuntimeError(f"torchtitan runs failed ({done.returncode}):\n" + "\n".join(errors[-30:]))
    return [[torch.load(f"{out}.{rank}") for rank in range(ranks)] for out, _, _ in runs]


def make_assets(folder: str, docs: int = 400, seed: int = 0) -> str:
    """A word-level tokenizer (tokenizer.json, tokenizer_config.json) and a c4_test-style
    dataset (c4_test/data.json) in ``folder``; returns ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    os.makedirs(os.path.join(folder, "c4_test"), exist_ok=True)
    specials = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]
    vocab = {w: i for i, w in enumerate(specials + list(WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": specials[1], "eos_token": specials[2], "add_bos_token": True,
                   "add_eos_token": True}, f)
    rng = random.Random(seed)
    with open(os.path.join(folder, "c4_test", "data.json"), "w") as f:
        for _ in range(docs):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 120)))
            f.write(json.dumps({"text": text}) + "\n")
    return folder


class _NoDeviceMemory:
    """The metrics' device memory monitor, on a device with no allocator statistics."""
    device_name = "cpu"

    def __init__(self, *args, **kwargs):
        pass

    def get_peak_stats(self):
        from torchtitan.components.metrics import DeviceMemStats
        return DeviceMemStats(*([0] * len(DeviceMemStats._fields)))

    def reset_peak_stats(self):
        pass


def patch_for_cpu():
    """Point torchtitan at the CPU (see the module's docstring); call before importing the rest
    of torchtitan."""
    import torchtitan.tools.utils as utils
    utils.device_type = "cpu"
    utils.device_module = types.SimpleNamespace(
        set_device=lambda device: None, current_device=lambda: 0, device_count=lambda: 1,
        synchronize=lambda *a: None, empty_cache=lambda: None, is_available=lambda: True)
    utils.get_local_device = lambda: torch.device("cpu")
    import torchtitan.components.metrics as metrics
    metrics.DeviceMemoryMonitor = _NoDeviceMemory
    metrics.build_device_memory_monitor = lambda *a, **k: _NoDeviceMemory()
    import torchtitan.distributed.fsdp as fsdp
    divide_by_one = fsdp.disable_fsdp_gradient_division

    def disable_fsdp_gradient_division(model):
        divide_by_one(model)
        for module in model.modules():
            if isinstance(module, fsdp.FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    fsdp.disable_fsdp_gradient_division = disable_fsdp_gradient_division
    from torchtitan.models.common import attention, decoder
    flex_masks = decoder.Decoder.get_attention_masks

    def get_attention_masks(self, positions):
        first = self.config.first_attention
        if first is not None and isinstance(first.inner_attention, attention.ScaledDotProductAttention.Config):
            return None
        return flex_masks(self, positions)

    decoder.Decoder.get_attention_masks = get_attention_masks


def clip_by_exact_norm(nudge=False):
    """torchtitan's trainer clips by the norm computed in float64: the reference for fused_amp's
    in-step clip. torch's fp32 norm on the CPU sums in float32 lanes, 1.6e-5 off the exact norm
    on 512k random normal elements and 2e-4 on this model's lm_head grad; fused_amp's is within
    ulps, so torch's own clip is not the reference for it."""
    import torch.distributed as dist
    import torchtitan.distributed.utils as dist_utils
    from torch.distributed.tensor import DTensor

    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None,
                        pp_mesh=None, ep_enabled=False):
        assert not ep_enabled
        parameters = list(parameters)
        grads = [p.grad.double() for p in parameters if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
        if isinstance(total, DTensor):
            total = total.full_tensor()
        if pp_mesh is not None:
            total = total ** norm_type
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pp_mesh.get_group())
            total = total ** (1.0 / norm_type)
        total = total.float()
        if nudge:  # one ulp up: the effect of a norm as close to the exact one as fp32 can be
            total = torch.nextafter(total, torch.tensor(float("inf")))
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total, foreach)
        return total

    dist_utils.clip_grad_norm_ = clip_grad_norm_


def muon_and_adamw(adamw):
    """torchtitan's param groups for Muon on the transformer blocks' matrices, AdamW (``adamw``,
    torchtitan's default group) on the rest: embeddings, norms and the output layer."""
    from torchtitan.components.optimizer import ParamGroupConfig
    matrices = r"layers\.\d+\..*(wqkv|wo|w1|w2|w3)\.weight$"
    return [ParamGroupConfig(pattern=matrices, optimizer_name="Muon",
                             optimizer_kwargs={"lr": 0.02, "momentum": 0.95, "weight_decay": 0.1}),
            adamw]


def debug_config(assets, dump, layout, seed=0, steps=10, seq_len=64, batch=2, dtype="float32",
                 checkpoint_at=None, max_norm=1.0):
    """torchtitan's llama3 debug model config, small enough for 4 ranks on 2 cores. ``layout``:
    "1", "fsdp2xtp2" or "pp2xfsdp2" (interleaved 1F1B, 2 chunks per rank)."""
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    from torchtitan.models.llama3.config_registry import llama3_debugmodel
    config = llama3_debugmodel()
    for _, _, parent, attr in list(config.model_spec.model.traverse(FlexAttention.Config)):
        setattr(parent, attr, ScaledDotProductAttention.Config())
    config.hf_assets_path = assets
    config.dump_folder = dump
    config.dataloader.dataset_path = os.path.join(assets, "c4_test")
    config.training.seq_len = seq_len
    config.training.local_batch_size = batch
    config.training.steps = steps
    config.training.dtype = dtype
    config.training.max_norm = max_norm
    config.training.disable_cuda_graphs = True  # (CUDA only; torchtitan refuses them with pipeline stages)
    config.debug.seed = seed
    config.debug.deterministic = True
    config.metrics.enable_tensorboard = False
    config.validator.enable = False
    p = config.parallelism
    if layout == "fsdp2xtp2":
        p.data_parallel_shard_degree, p.tensor_parallel_degree = 2, 2
    elif layout == "pp2xfsdp2":
        p.data_parallel_shard_degree, p.pipeline_parallel_degree = 2, 2
        p.pipeline_parallel_microbatch_size = 1
    elif layout != "1":
        raise ValueError(f"layout {layout!r}")
    config.checkpoint.enable = checkpoint_at is not None  # (a second run resumes from the last)
    if checkpoint_at is not None:
        config.checkpoint.interval = checkpoint_at
    config.checkpoint.folder = "checkpoint"
    return config


def run(out, layout, optimizer, options):
    """One training run of this rank: ``optimizer`` "torch" (torchtitan's own, ``implementation``
    in ``options``) or "fused_amp" (``use_fused_amp`` with the rest of ``options``); its losses,
    grad norms and final param shards saved to ``out.<rank>``."""
    import torchtitan.distributed.utils as dist_utils
    options = dict(options)
    config = debug_config(options.pop("assets"), options.pop("dump"), layout,
                          **{k: options.pop(k) for k in list(options) if k in (
                              "seed", "steps", "seq_len", "batch", "dtype", "checkpoint_at",
                              "max_norm")})
    torchtitans_clip = dist_utils.clip_grad_norm_
    resume_at = options.pop("resume_at", None)
    if resume_at is not None:  # a later run of a launch: resume from step resume_at's checkpoint
        folder = Path(config.dump_folder) / config.checkpoint.folder
        if torch.distributed.get_rank() == 0:
            for step in folder.glob("step-*"):
                if int(step.name[len("step-"):]) > resume_at:
                    shutil.rmtree(step)
        torch.distributed.barrier()
    if options.pop("exact_norm", False):
        clip_by_exact_norm(options.pop("nudge", False))
    if optimizer == "torch":
        config.optimizer.implementation = options.pop("implementation", "fused")
    else:
        from fused_amp.integrations.torchtitan import use_fused_amp
        if options.pop("muon", False):
            config.optimizer.param_groups = muon_and_adamw(config.optimizer.param_groups[0])
        config = use_fused_amp(config, **options)
    trainer = config.build()
    records = {"loss": [], "grad_norm": []}
    logged_at = []  # (when each step was logged: tools/torchtitan_step_time.py)
    log = trainer.metrics_processor.log

    def logged(step, loss, max_loss, grad_norm, **kwargs):
        logged_at.append(time.perf_counter())
        records["loss"].append(float(loss))
        records["grad_norm"].append(float(grad_norm))
        return log(step, loss, max_loss, grad_norm, **kwargs)

    trainer.metrics_processor.log = logged
    try:
        trainer.train()
        shards = {}
        for i, part in enumerate(trainer.model_parts):
            for name, p in part.named_parameters():
                shards[f"{i}.{name}"] = local_shard(p).detach().clone()
        torch.save({"records": records, "shards": shards, "logged_at": logged_at,
                    "bytes_per_param": bytes_per_param(trainer)},
                   f"{out}.{torch.distributed.get_rank()}")
    finally:
        trainer.close()
        dist_utils.clip_grad_norm_ = torchtitans_clip


def bytes_per_param(trainer):
    """This rank's params and optimizer state, in bytes per param (local shards)."""
    local = [local_shard(p) for part in trainer.model_parts for p in part.parameters()]
    state = [local_shard(v) for optimizer in trainer.optimizers.optimizers
             for entry in optimizer.state.values() for v in entry.values()
             if isinstance(v, torch.Tensor) and v.dim() > 0]
    numel = sum(p.numel() for p in local)
    return sum(t.numel() * t.element_size() for t in local + state) / numel


def main(layout, runs):
    patch_for_cpu()
    from torch.distributed.tensor import DTensor
    from torchtitan.tools.logging import init_logger
    init_logger()
    try:
        for out, optimizer, options in runs:
            # DTensor's sharding caches (Python and C++) compare meshes by value: a run would get
            # output specs holding the previous run's mesh objects, which FSDP2 refuses
            DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
            torch._C._clear_DTensor_sharding_propagator_cache()
            run(out, layout, optimizer, options)  # (the first one's trainer inits the process group)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*json.loads(sys.argv[1]))
