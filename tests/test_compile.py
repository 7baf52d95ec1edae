"""torch.compile: the ops trace with fullgraph=True and give the eager results, their fake
kernels refuse what the real ones refuse, optimizer.step() compiles as one graph, and a whole
training step with our scaler compiles."""
import pytest
import torch

import fused_amp
from fused_amp import ops
from helpers import assert_bitwise_equal, adam_step_, sgd_step_
from optim_registry import PLAIN, PLAIN_IDS, STATEFUL, STATEFUL_IDS

TORCH_VERSION = tuple(int(x) for x in torch.__version__.split(".")[:2])


def amp_step(grads, found_inf, inv_scale, scale, tracker):
    ops.unscale_(grads, found_inf, inv_scale)
    ops.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2)


def make():
    grads = [torch.randn(300), torch.randn(77).bfloat16()]
    return grads, torch.zeros(1), torch.tensor([0.125]), torch.tensor([8.0]), torch.zeros(1, dtype=torch.int32)


def test_compile_fullgraph_matches_eager():
    eager = make()
    compiled = [x.clone() if isinstance(x, torch.Tensor) else [t.clone() for t in x] for x in eager]
    step = torch.compile(amp_step, fullgraph=True, backend="inductor")
    for i in range(3):
        if i == 2:
            eager[0][1][5] = float("inf")
            compiled[0][1][5] = float("inf")
        amp_step(*eager)
        step(*compiled)
        for a, b in zip(eager[0], compiled[0]):
            assert torch.equal(a, b)
        for a, b in zip(eager[1:], compiled[1:]):
            assert torch.equal(a, b)
    assert eager[3].item() == 8.0  # 8 grew to 16 at step 2 (interval 2), backed off at step 3


# ---- the fake kernels refuse what the real kernels refuse ------------------------------------

def adam(params, grads, exp_avgs=None, masters=(), steps=None, **kw):
    exp_avgs = exp_avgs if exp_avgs is not None else [torch.zeros_like(p, dtype=torch.float32) for p in params]
    steps = steps if steps is not None else [torch.zeros(()) for _ in params]
    args = dict(lr=1e-3, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0, amsgrad=False,
                maximize=False, decoupled_weight_decay=False)
    args.update(kw)
    adam_step_(params, grads, list(masters), exp_avgs,
                   [torch.zeros_like(p, dtype=torch.float32) for p in params], [], steps, **args)


BAD_CALLS = {
    "grad of another shape": lambda: adam([torch.zeros(3)], [torch.zeros(4)]),
    "grad of another dtype": lambda: adam([torch.zeros(3)], [torch.zeros(3).bfloat16()]),
    "state in bf16": lambda: adam([torch.zeros(3)], [torch.zeros(3)], exp_avgs=[torch.zeros(3).bfloat16()]),
    "master for an fp32 param": lambda: adam([torch.zeros(3)], [torch.zeros(3)], masters=[torch.zeros(3)]),
    "fewer grads": lambda: adam([torch.zeros(3), torch.zeros(2)], [torch.zeros(3)]),
    "steps of two elements": lambda: adam([torch.zeros(3)], [torch.zeros(3)], steps=[torch.zeros(2)]),
    "grad_norm without max_grad_norm": lambda: adam([torch.zeros(3)], [torch.zeros(3)], grad_norm=torch.ones(())),
    "sgd momentum without buffers": lambda: sgd_step_(
        [torch.zeros(3)], [torch.zeros(3)], [], [], [torch.zeros(())], lr=0.1, momentum=0.9,
        dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False),
    "unscale of int tensors": lambda: ops.unscale_([torch.zeros(3, dtype=torch.int32)], torch.zeros(()),
                                                   torch.ones(())),
    "norm_type 3": lambda: ops.grad_norm_([torch.zeros(3)], torch.zeros(()), torch.zeros(()), None, 3.0),
    "hysteresis 0": lambda: ops.update_scale_(torch.ones(()), torch.zeros((), dtype=torch.int32),
                                              torch.zeros(()), 2.0, 0.5, 10, hysteresis=0),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_fake_kernels_refuse_what_the_real_kernels_refuse(case):
    call = BAD_CALLS[case]
    with pytest.raises((ValueError, TypeError)) as eager:
        call()
    torch._dynamo.reset()
    with pytest.raises(Exception) as compiled:
        torch.compile(call, fullgraph=True, backend="eager")()
    assert str(eager.value) in str(compiled.value)


# ---- optimizer steps and training steps under torch.compile -----------------------------------

@pytest.mark.parametrize("max_grad_norm", [None, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN + STATEFUL, ids=[f"{i}-plain" for i in PLAIN_IDS]
                         + [f"{i}-stateful" for i in STATEFUL_IDS])
def test_optimizer_step_compiles_fullgraph_and_equals_eager(cls, torch_cls, kw, dtype, max_grad_norm):
    """optimizer.step() as one graph (torch's own optimizers break the graph in their step
    wrapper), state created inside it, with a GradScaler's grad_scale and found_inf (one
    overflow step) and clipping: the same bits as eager. One graph needs torch >= 2.14 (2.11's
    Dynamo cannot trace the step's identity checks of its cached lists); with older torch the
    step compiles with graph breaks, and must still give eager's bits."""
    compiled_step_equals_eager(cls, dict(kw, max_grad_norm=max_grad_norm), dtype)


@pytest.mark.parametrize("state_dtype", [torch.uint8, torch.uint4], ids=str)
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_codes_step_compiles_fullgraph_and_equals_eager(cls, torch_cls, kw, state_dtype):
    """The same with 8- and 4-bit state: its codes, absmax and the state_absmaxes argument trace."""
    compiled_step_equals_eager(cls, dict(kw, state_dtype=state_dtype, min_8bit_size=0), torch.bfloat16)


def compiled_step_equals_eager(cls, kw, dtype):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in ((40, 3), (7,), (100,))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = cls(ours, **kw)
    ref = cls(twins, **kw)
    compiled = torch.compile(opt.step, fullgraph=TORCH_VERSION >= (2, 14))
    for i in range(4):
        for p, t in zip(ours, twins):
            g = (torch.randn(p.shape, generator=gen) * 64).to(dtype)
            if i == 2:
                g[0] = float("inf")
            p.grad, t.grad = g.clone(), g.clone()
        for o in (opt, ref):
            o.grad_scale, o.found_inf = torch.tensor(64.0), torch.tensor(float(i == 2))
        compiled()
        ref.step()
        for o in (opt, ref):
            del o.grad_scale, o.found_inf
        for p, t in zip(ours, twins):
            assert_bitwise_equal(p.detach(), t.detach())
            assert_bitwise_equal(p.grad, t.grad)
            for key, value in ref.state[t].items():
                assert_bitwise_equal(opt.state[p][key], value, key)


def test_training_step_with_our_scaler_compiles_and_equals_eager():
    """forward, backward, scaler.step and scaler.update compiled together (graph breaks where
    torch's own GradScaler code breaks the graph too), through an overflow: the step's results
    are eager's bit for bit, the model's forward and backward within inductor's rounding."""
    def setup():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2, max_grad_norm=1.0)
        return model, opt, fused_amp.GradScaler("cpu", init_scale=2.0 ** 8)

    def step(model, opt, scaler, x):
        opt.zero_grad()
        scaler.scale(model(x).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()

    torch._dynamo.reset()
    eager, compiled = setup(), setup()
    compiled_step = torch.compile(step)
    gen = torch.Generator().manual_seed(1)
    for i in range(5):
        x = torch.randn(8, 16, generator=gen)
        if i == 2:
            x[0, 0] = float("inf")
        step(*eager, x)
        compiled_step(*compiled, x)
        assert eager[2].get_scale() == compiled[2].get_scale()
    assert eager[2].get_scale() == 2.0 ** 7  # the overflow was skipped and backed off
    for a, b in zip(eager[0].parameters(), compiled[0].parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_a_step_writing_fp8_copies_compiles_fullgraph_and_equals_eager():
    """fused_amp.float8.Float8Weights and MXWeights: the step's copies (MX: and the block scales it
    writes), the amax into the history and the delayed scaling update trace in the step's graph,
    with an overflow step among the steps."""
    from fused_amp.float8 import Float8Weights, MXWeights
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(s, generator=gen).to(torch.bfloat16)) for s in ((40, 3), (7, 64), (100,))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt, ref = fused_amp.optim.AdamW(ours, lr=0.1), fused_amp.optim.AdamW(twins, lr=0.1)
    copies, ref_copies = Float8Weights(opt, ours[::2], amax_history_len=3), Float8Weights(ref, twins[::2],
                                                                                        amax_history_len=3)
    mx, ref_mx = MXWeights(opt, ours[1:2]), MXWeights(ref, twins[1:2])
    initial = mx.data[0].view(torch.uint8).clone()
    compiled = torch.compile(opt.step, fullgraph=TORCH_VERSION >= (2, 14))
    for i in range(4):
        for p, t in zip(ours, twins):
            g = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
            p.grad, t.grad = g.clone(), g.clone()
        for o in (opt, ref):
            o.grad_scale, o.found_inf = torch.tensor(1.0), torch.tensor(float(i == 2))
        compiled()
        ref.step()
        for mine, theirs in zip(copies.data, ref_copies.data):
            assert_bitwise_equal(mine.view(torch.uint8), theirs.view(torch.uint8))
        for key in ("amax_history", "scale", "scale_inv"):
            assert_bitwise_equal(getattr(copies, key), getattr(ref_copies, key), key)
        for mine, theirs in zip(mx.data + mx.scales, ref_mx.data + ref_mx.scales):
            assert_bitwise_equal(mine.view(torch.uint8), theirs.view(torch.uint8), "MX copy")
    assert copies.amax_history[-1].ne(0).all()  # (the steps recorded amaxes)
    assert not torch.equal(mx.data[0].view(torch.uint8), initial)  # (and wrote the MX copy)
