"""fused_amp.optim.from_optimizer: the one-line swap where library code builds the optimizer
(nanoGPT's configure_optimizers, HF's create_optimizer): every group option carried across,
what cannot be honoured refused, the torch optimizer left as it was."""
import copy

import pytest
import torch

import fused_amp
from fused_amp.optim import SGD, Adadelta, Adagrad, Adam, Adamax, AdamW, NAdam, RAdam, RMSprop, Rprop, from_optimizer
from optim_registry import torch_impls
from helpers import assert_bitwise_equal


def tiny_gpt():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 16), torch.nn.Linear(16, 50)).bfloat16()


def configure_optimizers(model, weight_decay, learning_rate, betas):
    """As nanoGPT's: 2-D params decay, the rest do not; torch's fused AdamW."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=True)


def train(model, opt, steps=4):
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randint(0, 50, (4, 8), generator=gen)
        opt.zero_grad()
        model(x).float().logsumexp(-1).mean().backward()
        opt.step()


def test_the_swap_in_configure_optimizers_carries_every_group_option():
    model = tiny_gpt()
    theirs = configure_optimizers(model, 0.1, 6e-4, (0.9, 0.95))
    torch_groups = copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in theirs.param_groups])
    ours = from_optimizer(theirs, master_weights="remainder", max_grad_norm=1.0)
    assert type(ours) is AdamW
    for g, t in zip(ours.param_groups, theirs.param_groups):
        assert all(a is b for a, b in zip(g["params"], t["params"]))
        for key, value in t.items():
            if key != "params":
                assert g[key] == value, key  # lr, betas, eps, weight_decay, fused, the name, ...
        assert g["master_weights"] == "remainder" and g["max_grad_norm"] == 1.0
    # the torch optimizer is left as it was: its groups are not ours
    assert [{k: v for k, v in g.items() if k != "params"} for g in theirs.param_groups] == torch_groups
    # and ours trains exactly as ours built directly over the same groups does
    direct_model = tiny_gpt()
    decay = [p for p in direct_model.parameters() if p.dim() >= 2]
    no_decay = [p for p in direct_model.parameters() if p.dim() < 2]
    direct = AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                   lr=6e-4, betas=(0.9, 0.95), master_weights="remainder", max_grad_norm=1.0)
    train(model, ours)
    train(direct_model, direct)
    for a, b in zip(model.parameters(), direct_model.parameters()):
        assert_bitwise_equal(a.detach(), b.detach())


@pytest.mark.parametrize("torch_cls,kw,ours_cls", [
    (torch.optim.Adam, dict(lr=1e-3, amsgrad=True, weight_decay=0.1, maximize=True), Adam),
    (torch.optim.Adam, dict(lr=1e-3, decoupled_weight_decay=True, weight_decay=0.1), Adam),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4), SGD),
    (torch.optim.AdamW, dict(lr=1e-3, betas=(0.8, 0.9), eps=1e-6), AdamW),
    (torch.optim.Adagrad, dict(lr=1e-2, lr_decay=1e-3, initial_accumulator_value=0.1), Adagrad),
    (torch.optim.RMSprop, dict(lr=1e-3, momentum=0.9, centered=True, weight_decay=1e-2), RMSprop),
    (torch.optim.Adamax, dict(lr=2e-3, weight_decay=0.1), Adamax),
    (torch.optim.RAdam, dict(lr=1e-3, decoupled_weight_decay=True, weight_decay=0.1), RAdam),
    (torch.optim.NAdam, dict(lr=2e-3, momentum_decay=1e-2, weight_decay=0.1), NAdam),
    (torch.optim.Adadelta, dict(lr=0.5, rho=0.8, weight_decay=0.1), Adadelta),
    (torch.optim.Rprop, dict(lr=1e-3, etas=(0.4, 1.5), step_sizes=(1e-4, 2e-2)), Rprop),
])
def test_each_counterpart_and_a_stepped_optimizers_state_carry_across(torch_cls, kw, ours_cls):
    """A torch optimizer that has stepped: ours continues from its state (moments, steps) and,
    over fp32 params, steps on as torch's own would within torch's fused/foreach spread."""
    gen = torch.Generator().manual_seed(2)
    params = [torch.nn.Parameter(torch.randn(7, 5, generator=gen)), torch.nn.Parameter(torch.randn(3, generator=gen))]
    theirs = torch_cls(params, **kw)
    grads = [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(5)]
    for g in grads[:2]:
        for p, x in zip(params, g):
            p.grad = x.clone()
        theirs.step()
    saved = copy.deepcopy(theirs.state_dict())
    ours = from_optimizer(theirs)
    assert type(ours) is ours_cls
    for p in params:
        for key, value in theirs.state[p].items():
            assert_bitwise_equal(ours.state[p][key].float(), value.float())
    reference = {f: torch_cls([torch.nn.Parameter(p.detach().clone()) for p in params], **kw, **flags)
                 for f, flags in zip((True, False), torch_impls(torch_cls))}  # (fused, or for-loop), foreach
    for ref in reference.values():  # each its own copy: load_state_dict keeps the tensors it is given
        ref.load_state_dict(copy.deepcopy(saved))
    for g in grads[2:]:
        for p, x in zip(params, g):
            p.grad = x.clone()
        ours.step()
        for ref in reference.values():
            for p, x in zip(ref.param_groups[0]["params"], g):
                p.grad = x.clone()
            ref.step()
    flat = lambda ps: torch.cat([p.detach().flatten() for p in ps])  # noqa: E731
    fused, foreach = (flat(reference[f].param_groups[0]["params"]) for f in (True, False))
    spread = max((fused - foreach).abs().max().item(), torch.finfo(torch.float32).eps * fused.abs().max().item())
    assert (flat(params) - fused).abs().max().item() <= spread


def test_what_cannot_be_carried_is_refused_before_anything_is_built():
    p = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(TypeError, match="no fused_amp counterpart for torch.optim.asgd.ASGD"):
        from_optimizer(torch.optim.ASGD([p]))
    differentiable = torch.optim.Adam([p], differentiable=True)
    with pytest.raises(RuntimeError, match="differentiable=True is not supported"):
        from_optimizer(differentiable)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        theirs = torch.optim.SGD([p], lr=0.1)
        theirs.param_groups[0]["lr"] = -1.0  # torch takes it; the constructor's check refuses it
        from_optimizer(theirs)


def test_the_scalers_default_device_is_cudas_as_torchs():
    """GradScaler() means CUDA, as torch's: without a GPU it disables itself with torch's warning;
    a CPU run names its device (fused_amp.GradScaler("cpu"))."""
    import warnings

    records = []
    for cls in (torch.amp.GradScaler, fused_amp.GradScaler):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scaler = cls()
        records.append((scaler.is_enabled(), [str(w.message) for w in caught]))
    assert records[0] == records[1]
    assert records[1][0] == torch.cuda.is_available()
    assert fused_amp.GradScaler("cpu").is_enabled() and torch.amp.GradScaler("cpu").is_enabled()
