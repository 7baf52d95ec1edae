"""The step op's parts (csrc/register.cpp, CHANGELOG.md): fused_amp.ops.step_ by its parts steps
bitwise as by the keywords it took before them, which still work with a DeprecationWarning; an
empty tensor stands for a missing master or absmax; the parts' own mistakes are refused by name
before anything is written; check_step_ refuses what step_ refuses and writes nothing."""
import warnings

import pytest
import torch

from fused_amp import ops
from helpers import assert_bitwise_equal

ADAM = dict(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, amsgrad=False, maximize=False,
            decoupled_weight_decay=True)


def adam_lists(seed=0, n=3, quantized=False):
    """bf16 params (the second one fp32, updated in place), grads, masters, 2 state lists, steps,
    absmaxes (8-bit state for the first param with ``quantized``), and fp8 copies of param 0."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(300,), (7, 5), (64,)][:n]
    params = [torch.randn(s, generator=gen).to(torch.float32 if i == 1 else torch.bfloat16)
              for i, s in enumerate(shapes)]
    grads = [torch.randn(s, generator=gen).to(p.dtype) * 1024 for s, p in zip(shapes, params)]
    masters = [None if p.dtype == torch.float32 else p.float() for p in params]
    states = [[torch.zeros(s) for s in shapes] for _ in range(2)]
    absmaxes = [None] * n
    if quantized:
        for k in range(2):
            states[k][0] = torch.zeros(shapes[0], dtype=torch.uint8)
        absmaxes[0] = torch.zeros(2, 2)  # 2 states, 2 blocks of 256
    steps = [torch.zeros(()) for _ in shapes]
    copies = dict(float8_weights=[torch.zeros(shapes[0], dtype=torch.float8_e4m3fn)],
                  float8_scales=[torch.tensor([2.0])], float8_scale_invs=[torch.zeros(1)], float8_indices=[0])
    return dict(params=params, grads=grads, masters=masters, states=states, absmaxes=absmaxes, steps=steps,
                amax=torch.zeros(n), copies=copies)


def every_tensor(a):
    given = [t for t in a["masters"] + a["absmaxes"] if t is not None and t.numel() > 0]
    out = list(a["params"]) + list(a["grads"]) + given + [t for s in a["states"] for t in s] + list(a["steps"])
    return out + [a["amax"]] + [t for k, v in a["copies"].items() if k != "float8_indices" for t in v]


def step_by_parts(a, **over):
    kw = dict(state_absmaxes=a["absmaxes"],
              epilogues=dict(weight_amax=a["amax"], **a["copies"]),
              hyper=dict(ADAM, lr=1e-2, max_grad_norm=1.0),
              scalars=dict(inv_scale=torch.tensor([1 / 1024]), found_inf=torch.zeros(1),
                           grad_norm=torch.tensor([2.5]), lr_tensor=torch.tensor(3e-3)),
              rounding=dict(seed=7, stochastic_codes=True))
    kw.update(over)
    ops.step_("adam", a["params"], a["grads"], a["masters"], a["states"], a["steps"], **kw)


def step_by_old_keywords(a):
    ops.step_("adam", a["params"], a["grads"], a["masters"], a["states"], a["steps"],
              state_absmaxes=a["absmaxes"], hyper=ADAM, lr=1e-2, lr_tensor=torch.tensor(3e-3),
              inv_scale=torch.tensor([1 / 1024]), found_inf=torch.zeros(1), grad_norm=torch.tensor([2.5]),
              max_grad_norm=1.0, rounding_seed=7, stochastic_codes=True, weight_amax=a["amax"], **a["copies"])


@pytest.mark.parametrize("quantized", [False, True], ids=["fp32 state", "8-bit state"])
def test_the_old_keywords_step_as_the_parts_and_warn(quantized):
    new, old = adam_lists(quantized=quantized), adam_lists(quantized=quantized)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the parts: no warning
        step_by_parts(new)
    with pytest.warns(DeprecationWarning, match=r"deprecated.*'epilogues', 'hyper', 'rounding', 'scalars'"):
        step_by_old_keywords(old)
    assert float(new["amax"].max()) > 0 and new["copies"]["float8_weights"][0].float().abs().max() > 0
    for x, y in zip(every_tensor(new), every_tensor(old)):
        assert_bitwise_equal(x, y)


def test_an_empty_tensor_stands_for_a_missing_master_or_absmax():
    with_none, with_empty = adam_lists(quantized=True), adam_lists(quantized=True)
    with_empty["masters"] = [torch.empty(0) if m is None else m for m in with_empty["masters"]]
    with_empty["absmaxes"] = [torch.empty(0) if t is None else t for t in with_empty["absmaxes"]]
    step_by_parts(with_none)
    step_by_parts(with_empty)
    for x, y in zip(every_tensor(with_none), every_tensor(with_empty)):
        assert_bitwise_equal(x, y)


@pytest.mark.parametrize("over,message", [
    (dict(scalars=[None, None], hyper=dict(ADAM, lr=1.0)), r"scalars has 2 entries, expected 4 \(lr_tensor, inv_scale, found_inf, grad_norm"),
    (dict(scalars=dict(loss_scale=torch.ones(1))), r"scalars has \['loss_scale'\], which it does not take"),
    (dict(rounding=[7]), r"rounding is \[7\], expected \[\] \(to nearest\) or \[seed, 0 or 1\]"),
    (dict(rounding=dict(stochastic_codes=True)), "stochastic_codes=True rounds 8-bit codes with rounding_seed"),
    (dict(epilogues=[torch.zeros(3)], epilogue_layout=[]), "epilogues has 1 tensors but epilogue_layout is empty"),
    (dict(epilogues=[torch.zeros(3)], epilogue_layout=[2, 0]), r"epilogue_layout is \[2, 0\], expected"),
    (dict(epilogues=[torch.zeros(3)], epilogue_layout=[1, 0, 0]),
     r"epilogues has 1 tensors, expected 3 as epilogue_layout \[1, 0, 0\] says"),
    (dict(hyper=dict(ADAM, max_grad_norm=1.0)), "hyper has no 'lr'"),
    (dict(hyper=dict(ADAM, lr=1.0), scalars=dict(grad_norm=torch.ones(1))),
     "grad_norm and max_grad_norm go together"),
])
def test_a_bad_part_is_refused_by_name_before_anything_is_written(over, message):
    a = adam_lists()
    before = [t.clone() for t in every_tensor(a)]
    with pytest.raises(ValueError, match=message):
        step_by_parts(a, **over)
    for x, y in zip(every_tensor(a), before):
        assert_bitwise_equal(x, y)


def test_the_op_checks_its_hyper_list_with_lr_and_max_grad_norm_last():
    a = adam_lists(n=1)
    with pytest.raises(ValueError, match=r"hyper has 7 values, expected 9 \(beta1, .*, lr, max_grad_norm\)"):
        torch.ops.fused_amp.step_("adam", a["params"], a["grads"], [a["masters"][0]], [s[0] for s in a["states"]],
                                  a["steps"], state_absmaxes=[], scalar_states=[], outputs=[], epilogues=[],
                                  epilogue_layout=[], hyper=[0.9, 0.999, 1e-8, 0.0, 0.0, 0.0, 0.0], scalars=[],
                                  rounding=[])


def test_a_states_list_of_another_length_names_the_states_the_op_keeps():
    a = adam_lists(n=1)
    with pytest.raises(ValueError, match=r"states has 1 tensors, expected 2 lists of 1 \(one tensor per param: "
                                         r"exp_avgs, exp_avg_sqs\)"):
        torch.ops.fused_amp.step_("adam", a["params"], a["grads"], [a["masters"][0]], [a["states"][0][0]],
                                  a["steps"], state_absmaxes=[], scalar_states=[], outputs=[], epilogues=[],
                                  epilogue_layout=[], hyper=[0.9, 0.999, 1e-8, 0.0, 0.0, 0.0, 0.0, 1e-3, 0.0],
                                  scalars=[], rounding=[])


def test_check_step_refuses_what_step_refuses_and_writes_nothing():
    a = adam_lists()
    before = [t.clone() for t in every_tensor(a)]
    ops.check_step_("adam", a["params"], a["grads"], a["masters"], a["states"], a["steps"],
                    state_absmaxes=a["absmaxes"], epilogues=dict(weight_amax=a["amax"], **a["copies"]),
                    hyper=dict(ADAM, lr=1e-2), scalars=dict(inv_scale=torch.tensor([0.5]), found_inf=torch.zeros(1)))
    versions = [t._version for t in every_tensor(a)]
    for x, y in zip(every_tensor(a), before):
        assert_bitwise_equal(x, y)
    a["grads"][2] = a["grads"][2][:10]
    for check in (ops.check_step_, ops.step_):
        with pytest.raises(ValueError, match=r"step_\(adam\): grads\[2\] has shape \[10\]"):
            check("adam", a["params"], a["grads"], a["masters"], a["states"], a["steps"],
                  hyper=dict(ADAM, lr=1e-2))
    assert [t._version for t in every_tensor(a)] == versions


def test_a_bad_scalar_is_named_with_its_index_and_key():
    """The per-param scalars' names (steps[i], NAdam's scalar_states[i] (mu_product)) are written
    only when a check fails (core/validate.h's TensorName): each is named all the same."""
    params = [torch.zeros(4) for _ in range(3)]
    hyper = dict(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, momentum_decay=4e-3,
                 decoupled_weight_decay=False, maximize=False, lr=1e-3)
    for bad, message in (("steps", r"steps\[2\] must have exactly one element, got shape \[2\]"),
                         ("scalar_states", r"scalar_states\[2\] \(mu_product\) must have exactly one element")):
        lists = {key: [torch.zeros(()), torch.zeros(()), torch.zeros(2)] if key == bad else [torch.ones(())] * 3
                 for key in ("steps", "scalar_states")}
        lists["scalar_states"] = [t.clone() for t in lists["scalar_states"]]
        with pytest.raises(ValueError, match=message):
            ops.step_("nadam", params, [torch.ones(4)] * 3, [], [[torch.zeros(4) for _ in params] for _ in range(2)],
                      lists["steps"], scalar_states=lists["scalar_states"], hyper=hyper)
