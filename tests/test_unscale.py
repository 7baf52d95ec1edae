"""unscale_ and non_finite_check_ against torch._amp_foreach_non_finite_check_and_unscale_."""
import pytest
import torch

import fused_amp
from fused_amp import ops
from helpers import assert_bitwise_equal, adam_step_, sgd_step_

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# Around every vector width (8/16/32 lanes), the CPU grain and the CUDA chunk (65536).
SIZES = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 1000,
         32767, 32768, 32769, 65535, 65536, 65537, 131075]
INV_SCALES = [1.0, 0.5, 2.0 ** -16, 1.0 / 3.0, 65536.0]


def special_values(n, dtype, gen):
    """Random values of every magnitude the dtype has: subnormals, tiny, normal, huge."""
    info = torch.finfo(dtype)
    x = torch.randn(n, generator=gen, dtype=torch.float64)
    kind = torch.randint(0, 5, (n,), generator=gen)
    x = torch.where(kind == 1, x * info.tiny / 4, x)      # subnormal
    x = torch.where(kind == 2, x * info.tiny * 8, x)      # tiny normal
    x = torch.where(kind == 3, x.sign() * info.max / 2 * x.abs().clamp(max=1.9), x)  # huge
    return x.to(dtype)


def random_list(gen, device="cpu", nonfinite=True):
    tensors = []
    for i, n in enumerate(SIZES):
        dtype = DTYPES[i % len(DTYPES)]
        t = special_values(n, dtype, gen).to(device)
        tensors.append(t)
    if nonfinite:
        for value in (float("inf"), float("-inf"), float("nan")):
            t = tensors[int(torch.randint(1, len(tensors), (1,), generator=gen))]
            if t.numel():
                t[int(torch.randint(0, t.numel(), (1,), generator=gen))] = value
    return tensors


def run_both(tensors, inv_scale, device="cpu"):
    ours = [t.clone() for t in tensors]
    theirs = [t.clone() for t in tensors]
    found_ours = torch.zeros(1, device=device)
    found_theirs = torch.zeros(1, device=device)
    inv = torch.full((1,), inv_scale, device=device)
    ops.unscale_(ours, found_ours, inv)
    torch._amp_foreach_non_finite_check_and_unscale_(theirs, found_theirs, inv)
    return ours, theirs, found_ours, found_theirs


@pytest.mark.parametrize("inv_scale", INV_SCALES)
@pytest.mark.parametrize("nonfinite", [False, True])
def test_bitwise_equal_to_torch(inv_scale, nonfinite):
    gen = torch.Generator().manual_seed(int(inv_scale * 1000) + nonfinite)
    tensors = random_list(gen, nonfinite=nonfinite)
    ours, theirs, found_ours, found_theirs = run_both(tensors, inv_scale)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert_bitwise_equal(a, b, f"tensor {i} ({a.dtype}, {a.numel()} elements)")
    assert found_ours.item() == (1.0 if nonfinite else 0.0)
    assert found_ours.item() == found_theirs.item()


# Powers of two (the scaler's 1/scale; the CPU loops multiply bf16 by them on the exponent field
# where the product is exact) from one whose products are all subnormal or zero but for the
# largest values to one that overflows most of them; and one that is not a power of two.
BF16_MULTIPLIERS = [2.0 ** -149, 2.0 ** -133, 2.0 ** -126, 2.0 ** -16, 0.5, 2.0, 2.0 ** 16, 2.0 ** 127, 0.75]


def every_bf16(finite_only=False, skip=0):
    """Every bf16 bit pattern, in order of its bits (runs of 128 share an exponent): vectors hold
    values of one exponent, or with `skip` values of two; then normal values with zeros of both
    signs among them (as grads have), and unless `finite_only` an infinity among them."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)[skip:]
    if finite_only:
        x = x[x.isfinite()]
    normal = torch.randn(4099, generator=torch.Generator().manual_seed(skip)).bfloat16()
    normal[::3] = 0.0
    normal[::7] = -0.0
    if not finite_only:
        normal[1001] = float("inf")
        normal[2002] = float("-inf")
    return torch.cat([x, normal])


@pytest.mark.parametrize("inv_scale", BF16_MULTIPLIERS)
@pytest.mark.parametrize("skip", [0, 5])
def test_every_bf16_value_unscales_as_torch(inv_scale, skip):
    for finite_only in (True, False):
        ours, theirs, found_ours, found_theirs = run_both([every_bf16(finite_only, skip)], inv_scale)
        assert_bitwise_equal(ours[0], theirs[0], f"inv_scale {inv_scale}, finite only {finite_only}")
        assert found_ours.item() == found_theirs.item() == (0.0 if finite_only else 1.0)


@pytest.mark.parametrize("inv_scale", BF16_MULTIPLIERS)
@pytest.mark.parametrize("step", ["adam_step_", "sgd_step_"])
def test_every_bf16_grad_is_left_unscaled_as_torch_unscales_it(inv_scale, step):
    """The grads a step leaves unscaled (GradScaler's contract) for every finite bf16 value, as
    torch's own unscale gives them."""
    grad = every_bf16(finite_only=True, skip=5)
    expected = grad.clone()
    torch._amp_foreach_non_finite_check_and_unscale_([expected], torch.zeros(1), torch.tensor([inv_scale]))
    param = torch.zeros_like(grad)
    master, steps = param.float(), torch.zeros(())
    kw = dict(inv_scale=torch.tensor([inv_scale]), found_inf=torch.zeros(1), lr=1e-3, weight_decay=0.0,
              maximize=False)
    if step == "adam_step_":
        adam_step_([param], [grad], [master], [torch.zeros_like(master)], [torch.zeros_like(master)], [],
                       [steps], beta1=0.9, beta2=0.999, eps=1e-8, amsgrad=False, decoupled_weight_decay=False,
                       **kw)
    else:
        sgd_step_([param], [grad], [master], [torch.zeros_like(master)], [steps], momentum=0.9,
                      dampening=0.0, nesterov=False, **kw)
    assert_bitwise_equal(grad, expected, f"{step}, inv_scale {inv_scale}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("position", [0, 5, 16, 31, 32767, 65535, 65536, 99999, 100006])
def test_single_nonfinite_anywhere_is_found(dtype, position):
    """By unscale_ and by non_finite_check_ (which reads the bits only): at every lane of the
    vectors (31: the last lane of 16 and of 32) and in the scalar tail (100006, the last element:
    100007 is no multiple of any vector's length)."""
    for value in (float("inf"), float("-inf"), float("nan")):
        x = torch.ones(100007, dtype=dtype)
        x[position] = value
        found = torch.zeros(1)
        ops.unscale_([torch.ones(3, dtype=dtype), x], found, torch.tensor([0.5]))
        assert found.item() == 1.0
        found = torch.zeros(1)
        ops.non_finite_check_([torch.ones(3, dtype=dtype), x], found)
        assert found.item() == 1.0


def test_found_inf_is_one_not_a_count_and_never_cleared():
    tensors = [torch.full((1000,), float("inf")) for _ in range(5)]
    found = torch.zeros(1)
    ops.unscale_(tensors, found, torch.tensor([0.5]))
    ops.unscale_(tensors, found, torch.tensor([0.5]))
    assert found.item() == 1.0
    found = torch.ones(1)
    ops.unscale_([torch.ones(10)], found, torch.tensor([0.5]))
    assert found.item() == 1.0


def test_unscale_with_threads(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    tensors = random_list(gen)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            ours, theirs, found_ours, found_theirs = run_both(tensors, 2.0 ** -10)
            for a, b in zip(ours, theirs):
                assert_bitwise_equal(a, b)
            assert found_ours.item() == found_theirs.item() == 1.0
    finally:
        torch.set_num_threads(before)


def test_non_finite_check_reads_only():
    gen = torch.Generator().manual_seed(4)
    tensors = random_list(gen, nonfinite=False)
    copies = [t.clone() for t in tensors]
    found = torch.zeros(1)
    ops.non_finite_check_(tensors, found)
    assert found.item() == 0.0
    tensors[3][1] = float("nan")
    ops.non_finite_check_(tensors, found)
    assert found.item() == 1.0
    for i, (a, b) in enumerate(zip(tensors, copies)):
        if i != 3:
            assert_bitwise_equal(a, b)


def test_transposed_tensor_is_unscaled_in_place():
    x = torch.randn(64, 33).t()  # dense, not contiguous in the default sense
    expected = x * 0.25
    ops.unscale_([x], torch.zeros(1), torch.tensor([0.25]))
    assert_bitwise_equal(x, expected)


def test_empty_list_is_a_no_op():
    found = torch.zeros(1)
    ops.unscale_([], found, torch.tensor([0.5]))
    assert found.item() == 0.0


def test_cuda_kernels_registered_when_built():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for op in ("unscale_", "non_finite_check_", "grad_norm_", "update_scale_", "step_"):
        assert has(f"fused_amp::{op}", "CPU")
        assert has(f"fused_amp::{op}", "CUDA") == fused_amp.build_info()["cuda"]


def test_build_info():
    info = fused_amp.build_info()
    assert set(info) >= {"torch_version", "cuda", "cuda_archs", "cpu_isa"}
    assert info["torch_version"].split("+")[0] == torch.__version__.split("+")[0]
    assert info["cpu_isa"] in ("DEFAULT", "AVX2", "AVX512")
    assert info["cpu_isa"] == torch.backends.cpu.get_cpu_capability() or info["cpu_isa"] == "DEFAULT"


@pytest.mark.cuda
@pytest.mark.parametrize("inv_scale", INV_SCALES)
def test_cuda_bitwise_equal_to_torch(inv_scale):
    gen = torch.Generator().manual_seed(7)
    # torch's CUDA kernel takes fp16 too; compare every dtype it accepts
    tensors = random_list(gen, device="cuda")
    ours, theirs, found_ours, found_theirs = run_both(tensors, inv_scale, device="cuda")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert_bitwise_equal(a.cpu(), b.cpu(), f"tensor {i}")
    assert found_ours.item() == 1.0 and found_theirs.item() >= 1.0


@pytest.mark.cuda
def test_cuda_many_tensors_and_unaligned_views():
    base = torch.randn(10_000 * 1000 + 3, device="cuda", dtype=torch.bfloat16)
    tensors = [base[1 + i * 1000: 1 + (i + 1) * 1000] for i in range(10_000)]  # misaligned by 1
    expected = [t.float().mul(0.5).bfloat16() for t in tensors]
    found = torch.zeros(1, device="cuda")
    ops.unscale_(tensors, found, torch.full((1,), 0.5, device="cuda"))
    torch.testing.assert_close(torch.cat(tensors), torch.cat(expected), rtol=0, atol=0)
    assert found.item() == 0.0
    tensors[9_999][999] = float("nan")
    ops.unscale_(tensors, found, torch.full((1,), 0.5, device="cuda"))
    assert found.item() == 1.0


def test_cpu_isa_follows_aten_cpu_capability():
    """make test runs the numerics tests under ATEN_CPU_CAPABILITY=default and avx2 too; each
    run must really use that build of the loops."""
    import os
    wanted = os.environ.get("ATEN_CPU_CAPABILITY")
    if wanted is None:
        pytest.skip("ATEN_CPU_CAPABILITY is not set in this run")
    assert fused_amp.build_info()["cpu_isa"] == torch.backends.cpu.get_cpu_capability()
    assert fused_amp.build_info()["cpu_isa"] == wanted.upper()
