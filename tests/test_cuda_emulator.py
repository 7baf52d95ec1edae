"""The emulator that runs the CUDA kernels on the CPU (tests/cuda_sim/emulator/), checked with the
small kernels of tests/cuda_sim/emulator_checks.cpp: each warp exchange hands each lane what
CUDA's programming guide defines (computed here from the guide's rules, not by the emulator),
the schedules run the threads in the orders they name, and every mistake that compute-sanitizer
(racecheck, synccheck, initcheck, memcheck) would report is reported, under every schedule, with
the threads and source lines involved."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest
import torch

from cuda_sim.build import SCHEDULES, EmulatorError, build_emulation

KINDS = {"shfl": 0, "shfl_up": 1, "shfl_down": 2, "shfl_xor": 3, "ballot": 4, "any": 5, "all": 6}
FULL = 0xFFFFFFFF
BLOCK = 512


@pytest.fixture(scope="module")
def emu():
    return build_emulation("checks")


@pytest.fixture(params=list(SCHEDULES))
def schedule(request, emu):
    emu.set_schedule(request.param, seed=7)
    yield request.param
    emu.set_schedule("in order")


def expected_exchange(kind, mask, arg, width, threads):
    """The programming guide's result for each thread (lanes outside the mask: no value)."""
    out = {}
    for t in range(threads):
        lane, warp0 = t % 32, t - t % 32
        if not mask >> lane & 1:
            continue
        value = lambda src: 100 + warp0 + src  # noqa: E731
        group = lane - lane % width
        if kind == "shfl":
            out[t] = value(group + arg % width)
        elif kind == "shfl_up":
            out[t] = value(lane - arg if lane - group >= arg else lane)
        elif kind == "shfl_down":
            out[t] = value(lane + arg if lane - group + arg < width else lane)
        elif kind == "shfl_xor":
            src = lane ^ arg
            out[t] = value(src if src - src % width <= group else lane)
        else:
            votes = [l for l in range(32) if mask >> l & 1 and (100 + warp0 + l) % arg == 0]
            out[t] = {"ballot": sum(1 << l for l in votes), "any": int(bool(votes)),
                      "all": int(len(votes) == bin(mask).count("1"))}[kind]
    return out


@pytest.mark.parametrize("kind,mask,arg,width", [
    ("shfl", FULL, 5, 32), ("shfl", FULL, 37, 32), ("shfl", FULL, 3, 8), ("shfl", 0x0000FFFF, 2, 16),
    ("shfl_up", FULL, 1, 32), ("shfl_up", FULL, 4, 8), ("shfl_up", 0xFFFF0000, 3, 16),
    ("shfl_down", FULL, 16, 32), ("shfl_down", FULL, 3, 4), ("shfl_down", 0x0000FFFF, 2, 16),
    ("shfl_xor", FULL, 16, 32), ("shfl_xor", FULL, 1, 32), ("shfl_xor", FULL, 6, 8), ("shfl_xor", 0x00FF00FF, 4, 8),
    ("ballot", FULL, 3, 32), ("ballot", 0x0F0F0F0F, 2, 32), ("any", FULL, 1000, 32), ("any", FULL, 7, 32),
    ("all", FULL, 1, 32), ("all", FULL, 2, 32), ("all", 0x55555555, 2, 32)])
def test_warp_exchanges_give_what_cuda_defines(emu, schedule, kind, mask, arg, width):
    threads = 96
    out = torch.full((threads,), -1, dtype=torch.int64)
    emu.fa_check_exchange(KINDS[kind], ctypes.c_uint(mask), arg, width, threads, ctypes.c_void_p(out.data_ptr()))
    expected = expected_exchange(kind, mask, arg, width, threads)
    got = {t: out[t].item() for t in expected}
    if kind == "ballot":
        got = {t: v & 0xFFFFFFFF for t, v in got.items()}
    assert got == expected
    assert all(out[t].item() == -1 for t in range(threads) if t not in expected)  # lanes outside the mask


def run_order(emu, blocks):
    counter = torch.zeros(1, dtype=torch.int32)
    order, neighbour = (torch.full((blocks * BLOCK,), -1, dtype=torch.int32) for _ in range(2))
    emu.fa_check_order(blocks, *(ctypes.c_void_p(t.data_ptr()) for t in (counter, order, neighbour)))
    return order.view(blocks, BLOCK), neighbour.view(blocks, BLOCK)


def test_the_schedules_run_the_threads_and_blocks_in_their_orders(emu):
    """In order, reversed, and a seeded random permutation (the same for the same seed, another
    for another seed), of the threads of a block and of the blocks of a launch; after the barrier
    every thread sees its neighbour's write whatever the order."""
    arange = torch.arange(3 * BLOCK, dtype=torch.int32)
    orders = {}
    for name, seed in (("in order", 0), ("reversed", 0), ("random", 1), ("random", 1), ("random", 2)):
        emu.set_schedule(name, seed)
        order, neighbour = run_order(emu, 3)
        assert torch.equal(neighbour, (torch.arange(BLOCK, dtype=torch.int32) + 1).remainder(BLOCK).expand(3, -1))
        assert torch.equal(order.flatten().sort().values, arange)  # each thread ran once
        orders.setdefault((name, seed), []).append(order)
    emu.set_schedule("in order")
    assert torch.equal(orders["in order", 0][0], arange.view(3, BLOCK))
    assert torch.equal(orders["reversed", 0][0], arange.flip(0).view(3, BLOCK))
    assert torch.equal(orders["random", 1][0], orders["random", 1][1])
    random = orders["random", 1][0]
    assert not torch.equal(random, orders["random", 2][0])
    assert not torch.equal(random, arange.view(3, BLOCK)) and not torch.equal(random, arange.flip(0).view(3, BLOCK))
    # blocks in a random order too: block b's threads did not all run before block b + 1's
    assert not all(random[b].max() < random[b + 1].min() for b in range(2))


SOURCE = r"emulator_checks\.cpp:\d+"
MISTAKES = {  # the mistake -> what the report must say (its first word names the check)
    "barrier skipped": [r"^barrier: __syncthreads at .*" + SOURCE, "reached by threads 0-255 of block",
                        "never by threads 256-511 [(]they exited[)]"],
    "divergent barrier": ["^barrier: the threads of block 0 wait at different __syncthreads [(]divergent[)]",
                          SOURCE + ": threads 0, 2, 4, ", SOURCE + ": threads 1, 3, 5, "],
    "race": [r"^race: (read-after-write|write-after-read) hazard on shared s\[\d+\]",
             r"by thread \d+ at .*" + SOURCE + r", (read|written) by thread \d+ at .*" + SOURCE,
             "with no __syncthreads between them"],
    "write race": [r"^race: write-after-write hazard on shared s\[0\]", SOURCE],
    "uninitialised": [r"^init: shared s\[5\] .* read before any thread of the block wrote it, at .*" + SOURCE],
    "out of bounds": ["^bounds: shared s indexed with 512 past its extent 512", "thread 511 of block 0"],
    "misaligned": ["^misaligned: a vector access of 16 bytes at an address 4 bytes past a multiple of 16"],
    "lane left out": [r"^warp: lane (1[6-9]|2\d|3[01]) calls __shfl_xor_sync at .*" + SOURCE,
                      "with mask 0x0000ffff, which leaves it out"],
    "lane exited": ["^warp: __shfl_xor_sync at .*" + SOURCE, "waits for lanes that never arrive",
                    r"lane 7 \(thread 7\) exited"],
    "read outside mask": ["^warp: lane 0 reads lane 16 in __shfl_xor_sync", "which the mask 0x0000ffff leaves out"],
    "mask past block": ["^warp: __shfl_xor_sync", "names lane 8, which a block of 40 threads does not have"],
    "divergent exchange": ["^warp: __shfl_xor_sync at .*" + SOURCE, "waits for lanes that never arrive",
                           r"lane \d+ \(thread \d+\) waits at __shfl_xor_sync .*" + SOURCE],
    "bad width": ["^warp: __shfl_xor_sync at .*" + SOURCE + ": width 12 is not a power of 2 up to 32"],
    "exchange and barrier": ["^warp: __shfl_xor_sync", r"lane 0 \(thread 0\) waits at __syncthreads .*" + SOURCE],
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_every_check_reports_its_mistake(emu, schedule, mistake):
    data = torch.zeros(BLOCK * 2, dtype=torch.float32)
    with pytest.raises(EmulatorError) as err:
        emu.fa_check_mistake(mistake.encode(), ctypes.c_void_p(data.data_ptr()))
    text = str(err.value)
    for pattern in MISTAKES[mistake]:
        assert re.search(pattern, text, re.M), (pattern, text)
    if mistake == "race" and schedule != "random":  # in order, thread 1 overwrites what thread 0 read
        assert ("write-after-read" if schedule == "in order" else "read-after-write") in text, text


def test_after_a_finding_the_next_launch_runs_clean(emu):
    data = torch.zeros(BLOCK * 2, dtype=torch.float32)
    with pytest.raises(EmulatorError):
        emu.fa_check_mistake(b"race", ctypes.c_void_p(data.data_ptr()))
    order, neighbour = run_order(emu, 2)  # the threads abandoned mid-kernel leave nothing behind
    assert torch.equal(order.flatten(), torch.arange(2 * BLOCK, dtype=torch.int32))


def test_the_kept_libraries_follow_the_files_the_compiler_reads(tmp_path, monkeypatch):
    """The libraries are kept under a key of their sources and flags (build._kept_dir): the
    project's files that the compiler itself reads (its -MM list) are those keyed, so that a CPU
    loop's change builds no library, and a change to any header the kernels include, or to a
    config's defines, builds them anew."""
    from cuda_sim import build
    if build.NO_CUDA_HEADERS:  # (the compiler's list needs them, as the libraries do)
        pytest.skip(build.NO_CUDA_HEADERS)
    for folder in ("csrc", "tests/cuda_sim"):
        shutil.copytree(f"{build.ROOT}/{folder}", tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(build, "ROOT", str(tmp_path))
    read = set()
    for source, defines in build.CONFIGS.values():
        deps = subprocess.run(["g++", "-std=c++17", f"-I{tmp_path}/csrc", f"-I{tmp_path}/tests/cuda_sim",
                               f"-I{build.CUDA_HOME}/include", "-DFUSED_AMP_HOST_SIM", *defines, "-MM",
                               str(tmp_path / "tests/cuda_sim" / source)],
                              capture_output=True, text=True, check=True).stdout
        read |= {os.path.normpath(p) for p in deps.replace("\\\n", " ").split()[1:]
                 if p.startswith(str(tmp_path))}  # (CUDA's headers: the environment's, as the compiler)
    assert set(build._sources()) >= read  # (an include under a condition not taken: kept too)
    key = build._kept_dir()
    (tmp_path / "csrc/cpu/vec_math.h").write_text((tmp_path / "csrc/cpu/vec_math.h").read_text() + "\n// x\n")
    assert build._kept_dir() == key
    for header in ("csrc/ops/common.h", "tests/cuda_sim/emulator/block.h"):
        (tmp_path / header).write_text((tmp_path / header).read_text() + "\n// x\n")
        assert build._kept_dir() != key
        key = build._kept_dir()
    monkeypatch.setitem(build.CONFIGS, "real", ("harness.cpp", ["-DFUSED_AMP_SIM_MAX_BLOCKS=7"]))
    assert build._kept_dir() != key  # (a config's defines)
