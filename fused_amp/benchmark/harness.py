"""Timing, the bandwidth ceiling, host-sync counting and the record schema."""
import datetime
import os
import platform
import socket
import tempfile
import statistics
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import fused_amp

RECORD_FIELDS = {
    "suite": str, "case": str, "impl": str, "device": str, "dtype": str, "n_params": int,
    "n_tensors": int, "time_ms": float, "time_ms_min": float, "time_ms_max": float,
    "gparams_per_s": float, "gbytes_per_s": (float, type(None)), "ceiling_frac": (float, type(None)),
    "bytes_per_param": (int, type(None)), "peak_mem_bytes": (int, type(None)),
    "held_bytes": (int, type(None)), "host_syncs_per_step": (int, type(None)),
    "speedup_vs": dict, "speedup_range": dict, "repeats": int, "loss": (float, type(None)),
}


def synchronize(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


def time_once(fn: Callable[[], None], device: str) -> float:
    """Seconds one call of fn takes (CUDA: events after a sync, so queued work is excluded)."""
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Impl:
    """One implementation of a case: ``prepare`` runs untimed before each timed ``run``."""

    def __init__(self, name: str, run: Callable[[], None], prepare: Optional[Callable[[], None]] = None):
        self.name, self.run, self.prepare = name, run, prepare or (lambda: None)


def time_alternating(impls: Sequence[Impl], device: str, reps: int, warmup: int = 2) -> Dict[str, List[float]]:
    """Times each implementation ``reps`` times in turns (A B C A B C ...) so that drift
    (clocks, other load) falls on all of them alike. Returns seconds per rep for each."""
    times: Dict[str, List[float]] = {impl.name: [] for impl in impls}
    for rep in range(warmup + reps):
        for impl in impls:
            impl.prepare()
            synchronize(device)
            t = time_once(impl.run, device)
            if rep >= warmup:
                times[impl.name].append(t)
    return times


# The streaming kernels of the ceiling, with the bytes each moves per fp32 element: a read-only
# reduction, a copy, an in-place scale (what unscale_ does), an in-place add, a triad, and
# torch's fused Adam (4 reads, 3 writes, as an optimizer step streams them). The ceiling is the best of them: on some machines the add alone
# is well below what torch's own Adam reaches.
STREAM_BYTES = {"read": 4, "copy": 8, "scale": 8, "add": 12, "triad": 12, "adam": 28}


def measure_ceiling(device: str, n_bytes: int = 1 << 30, reps: int = 5) -> Dict[str, float]:
    """The device's memory bandwidth in GB/s, measured now over arrays of ``n_bytes`` each (far
    larger than the caches): every kernel of STREAM_BYTES, each the median of ``reps`` runs (as
    the kernels' times are, so that a fraction compares like with like), and their best as
    ``ceiling_gbps``."""
    n = n_bytes // 4
    a, b, c = (torch.full((n,), v, device=device) for v in (1.0, 2.0, 3.0))  # fills: fast to make
    p = torch.nn.Parameter(torch.full((n,), 0.5, device=device))
    p.grad = torch.full((n,), 1e-3, device=device)
    adam = torch.optim.Adam([p], lr=1e-6, fused=True)
    adam.step()  # creates the moments: later steps stream p, grad, m, v
    kernels = {"read": lambda: a.sum(), "copy": lambda: a.copy_(b),
               "scale": lambda: c.mul_(-1.0),  # exact: no drift into subnormals over the reps
               "add": lambda: a.add_(b),
               "triad": lambda: torch.add(b, c, alpha=3.0, out=a), "adam": adam.step}

    def gbps(fn, bytes_per_element):
        fn()  # warm-up
        return bytes_per_element * n / statistics.median(time_once(fn, device) for _ in range(reps)) / 1e9

    out = {f"{name}_gbps": gbps(fn, STREAM_BYTES[name]) for name, fn in kernels.items()}
    out["ceiling_gbps"] = max(out.values())
    return out


def count_host_syncs(fn: Callable[[], None], device: str) -> Optional[int]:
    """Host syncs one call of fn makes, counted by CUDA's sync debug mode; None on CPU, where
    there is no device to wait for."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sum("synchroniz" in str(w.message) for w in caught)


def tensor_bytes(tensors) -> int:
    """The bytes of the tensors' memory, each counted once; a tensor subclass that wraps others
    (torchao's 8-bit state: codes and scales) by the tensors it holds."""
    seen, total = set(), 0

    def add(t):
        nonlocal total
        if is_traceable_wrapper_subclass(t):
            for name in t.__tensor_flatten__()[0]:
                add(getattr(t, name))
        elif t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()

    for t in tensors:
        if isinstance(t, torch.Tensor):
            add(t)
    return total


def make_records(suite: str, case: str, device: str, dtype: str, n_params: int, n_tensors: int,
                 times: Dict[str, List[float]], ceiling_gbps: float, bytes_per_param: Optional[int],
                 extra: Optional[Dict[str, Dict]] = None) -> List[Dict]:
    """One record per implementation, with the speedups against every other one: the ratio of
    the medians, and the range of the ratios of the repetitions timed in the same turn."""
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    records = []
    for name, ts in times.items():
        t = medians[name]
        gbps = bytes_per_param * n_params / t / 1e9 if bytes_per_param else None
        rec = dict(suite=suite, case=case, impl=name, device=device, dtype=dtype,
                   n_params=int(n_params), n_tensors=int(n_tensors), time_ms=t * 1e3,
                   time_ms_min=min(ts) * 1e3, time_ms_max=max(ts) * 1e3,
                   gparams_per_s=n_params / t / 1e9, gbytes_per_s=gbps,
                   ceiling_frac=gbps / ceiling_gbps if gbps else None,
                   bytes_per_param=bytes_per_param, peak_mem_bytes=None, held_bytes=None,
                   host_syncs_per_step=None, loss=None,
                   speedup_vs={other: medians[other] / t for other in medians if other != name},
                   repeats=1)
        paired = {other: [a / b for a, b in zip(times[other], ts)] for other in rec["speedup_vs"]}
        rec["speedup_range"] = {k: [min(v), max(v)] for k, v in paired.items()}
        rec.update((extra or {}).get(name, {}))
        records.append(rec)
    return records


def validate_record(rec: Dict) -> None:
    """Raise ValueError if ``rec`` does not follow RECORD_FIELDS."""
    missing = set(RECORD_FIELDS) - set(rec)
    if missing:
        raise ValueError(f"record lacks {sorted(missing)}")
    for key, kind in RECORD_FIELDS.items():
        if not isinstance(rec[key], kind) or isinstance(rec[key], bool):
            raise ValueError(f"record field {key}={rec[key]!r} is not {kind}")
    for other, ratio in rec["speedup_vs"].items():
        if not isinstance(ratio, float) or other == rec["impl"]:
            raise ValueError(f"bad speedup_vs entry {other}: {ratio!r}")


def machine_info(device: str) -> Dict:
    info = {"cpu": _cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "fused_amp_build": fused_amp.build_info(), "device": device,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    else:
        info["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# What the ranks' parent process imports once: each rank is forked from it ("forkserver"), so
# that a run of 4 ranks starts in about 0.4 s instead of the 8-13 s of "spawn", which imports
# torch in every rank. The server imports modules only (no thread, no device), so a fork of it
# starts as a fresh interpreter would, with these modules loaded.
_RANK_PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.fsdp",
                 "fused_amp", "fused_amp.optim"]


def run_ranks(fn: Callable, world: int, *args, deadline_s: float = 300.0) -> List:
    """Runs ``fn(rank, world, *args)`` in ``world`` processes joined in a gloo process group on
    a free local port, and returns each rank's result (saved with torch.save). A rank that fails,
    or a run past the deadline, raises RuntimeError instead of hanging."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload(_RANK_PRELOAD)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(_rank_entry, args=(fn, world, port, out, args), nprocs=world,
                                 join=False, start_method="forkserver")
        start = time.monotonic()
        try:
            while not ctx.join(timeout=5):
                if time.monotonic() - start > deadline_s:
                    raise RuntimeError(f"the {world} ranks ran past {deadline_s:.0f} s")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            raise RuntimeError(f"a rank failed: {e}") from e
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join()
            for r in range(world):  # what each rank printed, on the caller's stderr
                log = os.path.join(out, f"rank{r}.log")
                text = open(log, errors="replace").read() if os.path.exists(log) else ""
                if text:
                    sys.stderr.write(f"--- rank {r} of {world}:\n{text}")
        return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(world)]


def _rank_entry(rank, fn, world, port, out, args):
    import faulthandler

    import torch.distributed as dist

    # A rank forked from the server has the server's stdout and stderr, not the caller's: both go
    # to a log of the rank, which run_ranks copies to the caller's stderr.
    log = os.open(os.path.join(out, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    # A rank killed by a signal prints where it was, in C++ (as torch's own distributed tests
    # do) and in Python, instead of leaving only "terminated with signal SIGABRT".
    faulthandler.enable(all_threads=True)
    torch._C._set_print_stack_traces_on_fatal_signal(True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.save(fn(rank, world, *args), os.path.join(out, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears gloo down while another still talks to it
    finally:
        dist.destroy_process_group()
    # The rank's work is saved and its process group is gone: leave as multiprocessing's fork
    # workers do (os._exit), without the interpreter's teardown, where torch's C++ objects and
    # threads are destroyed in no set order. About once in 500 runs of the FSDP2 tests a rank
    # died of SIGABRT, "terminate called without an active exception" (std::terminate, as from a
    # thread destroyed unjoined), with torch's own Adam and GradScaler too: torch's FSDP tests
    # have shown the same abort (pytorch/pytorch#90549).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
