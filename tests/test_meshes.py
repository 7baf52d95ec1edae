"""Training past one machine, on 4 gloo ranks: 1-D FSDP2, HSDP 2x2, TP alone, TP + FSDP2 2x2
and pipeline stages x data parallel, as torchtitan builds them with torch.distributed's own APIs.

Each layout steps a small MLP (Linear(16, 32), Tanh, Linear(32, 16); TP: column- then
row-parallel) and, beside it on every rank, a twin of each optimizer over plain whole copies of
the params, given the whole grads of the layout (``full_tensor()`` of the DTensor grads). An
elementwise step does not see where a shard ends, so the twins are the reference bit for bit;
what spans the whole model (the clip norm, Muon's whole matrices, the overflow flag) is what a
wrong placement would break."""
import re
import tempfile
from pathlib import Path

import pytest
import torch

import fused_amp
from test_distributed import run_ranks

WORLD = 4
LAYOUTS = ("fsdp", "hsdp", "tp", "tp_fsdp")


def _mesh_and_model(layout):
    """The model parallelized as ``layout`` on 4 ranks, and which data-parallel batch this rank
    trains on (TP ranks of one row share theirs)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16)).bfloat16()
    tp_plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    rank = torch.distributed.get_rank()
    if layout == "fsdp":
        fully_shard(model, mesh=init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",)))
        return model, rank
    if layout == "hsdp":  # (Replicate, Shard(0)): every rank its own batch
        fully_shard(model, mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")))
        return model, rank
    if layout == "tp":
        parallelize_module(model, init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",)), tp_plan)
        return model, 0
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], tp_plan)
    fully_shard(model, mesh=mesh["dp"])  # _StridedShard(0) on dp over the column-parallel dim 0
    return model, mesh.get_coordinate()[0]


def _batch(data_index, step, overflow_at=None):
    gen = torch.Generator().manual_seed(1000 * step + data_index)
    x = torch.randn(8, 16, generator=gen).bfloat16()
    if step == overflow_at and torch.distributed.get_rank() == 1:  # an inf on one rank only
        x[0, 0] = float("inf")
    return x


def _split(params, muon):
    """(Muon's params, AdamW's) as torchtitan splits them: the hidden matrices to Muon."""
    return ([p for p in params if p.ndim == 2], [p for p in params if p.ndim != 2]) if muon else (params, [])


def _optimizers(config, params):
    """The optimizers of ``config`` over ``params`` (Muon with AdamW for the rest)."""
    cls, kw = config["cls"], dict(config.get("kw", {}))
    hidden, rest = _split(params, cls is fused_amp.optim.Muon)
    opts = [cls(hidden, **kw)]
    if rest:
        opts.append(fused_amp.optim.AdamW(rest, lr=1e-2, **{k: v for k, v in kw.items() if k == "max_grad_norm"}))
    return opts


CONFIGS = {
    "adamw": dict(cls=fused_amp.optim.AdamW, kw=dict(lr=1e-2, weight_decay=0.1)),
    "adamw_clip": dict(cls=fused_amp.optim.AdamW, kw=dict(lr=1e-2, max_grad_norm=0.05)),
    "adamw_clip_inf": dict(cls=fused_amp.optim.AdamW, kw=dict(lr=1e-2, max_grad_norm=0.01,
                                                              grad_norm_type=float("inf"))),
    "adamw_remainder_8bit": dict(cls=fused_amp.optim.AdamW, kw=dict(lr=1e-2, master_weights="remainder",
                                                                    state_dtype=torch.uint8, min_8bit_size=64)),
    "muon": dict(cls=fused_amp.optim.Muon, kw=dict(lr=2e-2)),
    "muon_clip": dict(cls=fused_amp.optim.Muon, kw=dict(lr=2e-2, max_grad_norm=0.05)),
    "lion": dict(cls=fused_amp.optim.Lion, kw=dict(lr=1e-3, weight_decay=0.1)),
    "adagrad_clip": dict(cls=fused_amp.optim.Adagrad, kw=dict(lr=1e-2, max_grad_norm=0.05)),
    "adamw_fp16_scaler": dict(cls=fused_amp.optim.AdamW, kw=dict(lr=1e-2, max_grad_norm=0.05), scaler=True),
}
STEPS, OVERFLOW_AT = 3, 1


def layout_run(rank, world, layout, names):
    """Each config of ``names`` on ``layout``: the params (whole), their twins', the norms each
    step clipped by against torch's DTensor norm of the same grads, and the step counts."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name in names:
        config = CONFIGS[name]
        model, data_index = _mesh_and_model(layout)
        params = list(model.parameters())
        whole = [torch.nn.Parameter(p.full_tensor().detach().clone()) for p in params]
        opts, twins = _optimizers(config, params), _optimizers(config, whole)
        scaler = fused_amp.GradScaler("cpu", init_scale=256.0) if config.get("scaler") else None
        norms, torch_norms = [], []
        for step in range(STEPS):
            for opt in opts + twins:
                opt.zero_grad()
            loss = model(_batch(data_index, step, OVERFLOW_AT if scaler else None)).float().pow(2).mean()
            if scaler is None:
                loss.backward()
            else:
                scale = scaler.get_scale()
                scaler.scale(loss).backward()
            grads = [p.grad.full_tensor().clone() for p in params]  # (a Replicate grad's is its local tensor)
            if config["kw"].get("max_grad_norm"):  # torch's DTensor norm is the reference for ours
                norm_type = config["kw"].get("grad_norm_type", 2.0)
                clipped = opts[0].param_groups[0]["params"]  # (each optimizer clips by its own params' norm)
                torch_norm = torch.nn.utils.get_total_norm([p.grad.float() for p in clipped], norm_type)
                torch_norms.append(float(torch_norm.full_tensor() if isinstance(torch_norm, DTensor) else torch_norm))
            for opt in opts:
                scaler.step(opt) if scaler else opt.step()
            if scaler:
                scaler.update()
            if scaler is None or step != OVERFLOW_AT:  # the twins skip the overflow step outright
                for w, g in zip(whole, grads):
                    w.grad = g if scaler is None else g / scale  # (a power of two: exact)
                for twin in twins:
                    twin.step()
            norms.append([float(opt.last_grad_norm) for opt in opts if opt.max_grad_norm])
        out[name] = dict(full=[p.full_tensor() for p in params], twin=[w.detach().clone() for w in whole],
                         norms=norms, torch_norms=torch_norms, placements=[str(p.placements) for p in params],
                         steps=[float(opt.state[p]["step"]) for opt in opts for p in opt.param_groups[0]["params"]],
                         scale=scaler.get_scale() if scaler else None)
    return out


def assert_within_a_bf16_ulp(a, b, what):
    """bf16 params whose fp32 masters are a few fp32 ulps apart (two clip coefficients from norms
    summed in other orders) round to the same bf16 value or to neighbours: at most one bf16 ulp
    of the larger, elementwise."""
    a, b = a.float(), b.float()
    _, exponent = torch.frexp(torch.maximum(a.abs(), b.abs()))
    assert ((a - b).abs() <= torch.ldexp(torch.ones_like(a), exponent - 8)).all(), what


def _ulps(x):
    return torch.finfo(torch.float32).eps * abs(x)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_steps_as_one_process_given_the_same_grads(layout):
    """Elementwise optimizers bit for bit; Muon on whole matrices bit for bit; clipping by the
    global norm, within two fp32 ulps of torch's DTensor norm of the same grads (the ranks' shares
    add up in another order), the same on every rank; the overflow on one rank skipped by all."""
    results = run_ranks(layout_run, WORLD, layout, list(CONFIGS))
    for name, config in CONFIGS.items():
        first = results[0][name]
        for r in results:
            mine = r[name]
            assert all(torch.equal(a, b) for a, b in zip(mine["full"], first["full"])), (layout, name, "ranks differ")
            assert repr(mine["norms"]) == repr(first["norms"]), (layout, name)  # (nan at the overflow)
            if config["kw"].get("max_grad_norm") and not config.get("scaler"):
                assert len(mine["norms"]) == len(mine["torch_norms"]) == STEPS
                for step, b in zip(mine["norms"], mine["torch_norms"]):
                    assert abs(step[0] - b) <= 2 * _ulps(b), (layout, name, step[0], b)
                    assert b > config["kw"]["max_grad_norm"]  # every step clips
            for a, b in zip(mine["full"], mine["twin"]):
                if name == "adamw_remainder_8bit":  # quant blocks are the shard's: close, not equal
                    assert (a.float() - b.float()).abs().max() <= 4e-2 * b.float().abs().max(), (layout, name)
                elif config["kw"].get("max_grad_norm"):  # the norm's rounding moves the coefficient
                    assert_within_a_bf16_ulp(a, b, (layout, name))
                else:
                    assert torch.equal(a, b), (layout, name)
            if config.get("scaler"):
                assert mine["steps"] == [STEPS - 1.0] * len(mine["steps"]) and mine["scale"] == 128.0


# ---- pipeline stages x data parallel (torch.distributed.pipelining) -------------------------

def pipeline_run(rank, world, config_name):
    """2 stages (Linear(16, 32) + Tanh | Linear(32, 16)) x 2 data-parallel ranks (FSDP2 on each
    stage's dp row), GPipe over 2 microbatches, the scaler scaling the loss on the last stage. On
    rank 1 (stage 0) one step's grads get an inf that only that stage sees: every rank must skip
    it. Each optimizer clips by the norm of its params over both stages: the reference is torch's
    DTensor norm of each stage's grads, combined over the stages here in double. Each stage's twin
    over its whole tensors spans the stages as well, given the whole grads."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    config = CONFIGS[config_name]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    stage_index, dp_index = mesh.get_coordinate()
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh()), torch.nn.Sequential(torch.nn.Linear(32, 16))]
    module = layers[stage_index].bfloat16()
    fully_shard(module, mesh=mesh["dp"])
    params = list(module.parameters())
    whole = [torch.nn.Parameter(p.full_tensor().detach().clone()) for p in params]
    opts = [fused_amp.optim.span_stages(opt, mesh["pp"]) for opt in _optimizers(config, params)]
    # the twins: whole tensors of this stage, their norm spanning the stages as well
    twins = [fused_amp.optim.span_stages(twin, mesh["pp"]) for twin in _optimizers(config, whole)]
    scaler = fused_amp.GradScaler("cpu", init_scale=256.0)
    last = stage_index == 1
    # the loss is scaled where it is computed: on the last stage, each microbatch's (every stage's
    # schedule needs the loss_fn, or it runs no backward)
    loss_fn = lambda out, target: scaler.scale(out.float().pow(2).mean())  # noqa: E731
    stage = PipelineStage(module, stage_index, 2, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=loss_fn)
    norms, expected = [], []
    for step in range(STEPS):
        for opt in opts + twins:
            opt.zero_grad()
        scale = 256.0 / 2 ** (step > OVERFLOW_AT)
        if last:
            schedule.step(target=torch.zeros(8, 16, dtype=torch.bfloat16))
        else:
            schedule.step(_batch(dp_index, step))
        if step == OVERFLOW_AT and rank == 1:  # stage 0 only: stage 1 learns of it from span_stages
            for p in params:  # (every optimizer's: each skips on its own grads' flag, as torch's)
                p.grad._local_tensor.view(-1)[0] = float("inf")
        grads = {id(p): p.grad.full_tensor().clone() for p in params}
        for opt in opts:  # the reference norm of each optimizer's params, over both stages
            mine = opt.param_groups[0]["params"]
            stage_norm = float(torch.nn.utils.get_total_norm([p.grad.float() for p in mine]).full_tensor()) / scale
            both = [None, None]
            torch.distributed.all_gather_object(both, stage_norm, group=mesh["pp"].get_group())
            expected.append(sum(n * n for n in both) ** 0.5)
        for opt in opts:
            scaler.step(opt)
        scaler.update()
        norms.append([float(opt.last_grad_norm) for opt in opts])
        if step != OVERFLOW_AT:
            for twin, opt in zip(twins, opts):
                for w, p in zip(twin.param_groups[0]["params"], opt.param_groups[0]["params"]):
                    w.grad = grads[id(p)] / scale  # (a power of two: exact)
                twin.step()
    return dict(full=[p.full_tensor() for p in params], twin=[w.detach().clone() for w in whole], norms=norms,
                expected=expected, scale=scaler.get_scale(),
                steps=[float(opt.state[p]["step"]) for opt in opts for p in opt.param_groups[0]["params"]])


@pytest.mark.parametrize("config_name", ["adamw_clip", "muon_clip"])
def test_pipeline_stages_clip_by_one_norm_and_skip_together(config_name):
    results = run_ranks(pipeline_run, WORLD, config_name)
    for r in results:
        assert r["steps"] == [STEPS - 1.0] * len(r["steps"]) and r["scale"] == 128.0, "every stage skips"
        assert repr(r["norms"]) == repr(results[0]["norms"]), "every stage clips by the same norm"
        ours = [n for step, norms in enumerate(r["norms"]) if step != OVERFLOW_AT for n in norms]
        expected = [n for i, n in enumerate(r["expected"]) if i // len(r["norms"][0]) != OVERFLOW_AT]
        for a, b in zip(ours, expected):
            assert abs(a - b) <= 2 * _ulps(b), (a, b)
            assert b > CONFIGS[config_name]["kw"]["max_grad_norm"]  # every step clips
        # the twins' grads were clipped in double and rounded to bf16: a rounding apart, which a
        # bf16 param may show as one ulp
        for a, b in zip(r["full"], r["twin"]):
            assert_within_a_bf16_ulp(a, b, config_name)


# ---- checkpoints, step_in_backward, from_optimizer and refusals on the 2-D mesh ---------------

def dcp_layout_run(rank, world, path, layout, phase):
    """AdamW with remainder masters on ``layout``: "save" steps twice and saves a DCP checkpoint;
    "load" loads it into the same model on another layout. Both give the full masters, moments
    and step counts as state_dict() holds them, then step once more (the run goes on)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, data_index = _mesh_and_model(layout)
    opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2, master_weights="remainder")
    if phase == "save":
        for step in range(2):
            opt.zero_grad()
            model(_batch(data_index, step)).float().pow(2).mean().backward()
            opt.step()
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    if phase == "save":
        dcp.save(state, checkpoint_id=path)
    else:
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    held = opt.state_dict()["state"]
    out = {key: [held[i][key].full_tensor() for i in range(len(held))] for key in ("master_param", "exp_avg", "exp_avg_sq")}
    out["params"] = [p.full_tensor() for p in model.parameters()]
    out["steps"] = [float(held[i]["step"]) for i in range(len(held))]
    opt.zero_grad()
    model(_batch(data_index, 2)).float().pow(2).mean().backward()
    opt.step()
    return out


@pytest.mark.parametrize("saved_on,loaded_on", [("tp_fsdp", "fsdp"), ("fsdp", "tp_fsdp")])
def test_a_dcp_checkpoint_moves_between_layouts(saved_on, loaded_on):
    with tempfile.TemporaryDirectory() as path:
        saved = run_ranks(dcp_layout_run, WORLD, path, saved_on, "save")
        loaded = run_ranks(dcp_layout_run, WORLD, path, loaded_on, "load")
    for r in loaded:
        for key in ("params", "master_param", "exp_avg", "exp_avg_sq", "steps"):
            for a, b in zip(r[key], saved[0][key]) if key != "steps" else [(r[key], saved[0][key])]:
                assert a == b if key == "steps" else torch.equal(a, b), key


def in_backward_and_refusals_run(rank, world):
    """On TP + FSDP2 2x2: AdamW stepping in backward leaves what the normal loop leaves, bit for
    bit; from_optimizer carries a stepped torch AdamW's state across; a Partial grad is refused
    by name before anything steps."""
    from torch.distributed.tensor import DTensor, Partial

    out = {}
    runs = []
    for in_backward in (False, True):
        model, data_index = _mesh_and_model("tp_fsdp")
        opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2)
        handle = fused_amp.optim.step_in_backward(opt) if in_backward else None
        for step in range(3):
            opt.zero_grad()
            model(_batch(data_index, step)).float().pow(2).mean().backward()
            opt.step()
        if handle is not None:
            handle.remove()
        runs.append([p.full_tensor() for p in model.parameters()])
    out["in_backward_equal"] = all(torch.equal(a, b) for a, b in zip(*runs))

    # from_optimizer: torch's AdamW on fp32 DTensor params, stepped twice, then ours takes over
    model, data_index = _mesh_and_model("tp_fsdp")
    model.float()
    theirs = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(2):
        theirs.zero_grad()
        model(_batch(data_index, step).float()).pow(2).mean().backward()
        theirs.step()
    expected = {id(p): theirs.state[p]["exp_avg"].full_tensor() for p in model.parameters()}
    ours = fused_amp.optim.from_optimizer(theirs)
    out["from_optimizer_state"] = all(torch.equal(ours.state[p]["exp_avg"].full_tensor(), expected[id(p)])
                                      for p in model.parameters())
    out["from_optimizer_placements"] = all(ours.state[p]["exp_avg"].placements == p.placements
                                           for p in model.parameters())

    # a grad still to be reduced (Partial) cannot enter a norm: refused, naming the placement
    model, _ = _mesh_and_model("tp_fsdp")
    opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2, max_grad_norm=1.0)
    for p in model.parameters():
        p.grad = DTensor.from_local(torch.ones_like(p.to_local()), p.device_mesh,
                                    [Partial()] * p.device_mesh.ndim, run_check=False, shape=p.shape, stride=p.stride())
    before = [p.full_tensor() for p in model.parameters()]
    try:
        opt.step()
        out["partial"] = "stepped"
    except NotImplementedError as e:
        out["partial"] = str(e)
    out["partial_untouched"] = all(torch.equal(p.full_tensor(), b) for p, b in zip(model.parameters(), before))
    return out


def test_step_in_backward_from_optimizer_and_partial_grads_on_tp_fsdp():
    for r in run_ranks(in_backward_and_refusals_run, WORLD):
        assert r["in_backward_equal"]
        assert r["from_optimizer_state"] and r["from_optimizer_placements"]
        assert "Partial(sum)" in r["partial"] and "mesh dim 0" in r["partial"], r["partial"]
        assert r["partial_untouched"]


def test_placements_are_read_by_what_they_do():
    """_StridedShard (is_shard() False in torch 2.14) shards; an unknown placement is refused."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    from fused_amp.optim import _placements

    assert _placements.sharded_dims([_StridedShard(0, split_factor=2), Shard(1), Replicate()]) == (0, 1)
    assert _placements.shifted(_StridedShard(0, split_factor=2)) == _StridedShard(1, split_factor=2)
    with pytest.raises(NotImplementedError, match=r"Partial\(sum\) on mesh dim 1"):
        _placements.sharded_dims([Shard(0), Partial()], "grad 3")


def docs_recipe_run(rank, world, code):
    namespace = dict(torch=torch, fused_amp=fused_amp)
    exec(compile(code.replace('"cuda"', '"cpu"'), "<docs/distributed.md>", "exec"), namespace)
    model = namespace["model"]
    return dict(mesh=tuple(namespace["mesh"].shape), full=[p.full_tensor() for p in model.parameters()],
                stepped=float(namespace["muon"].state[namespace["hidden"][0]]["step"]),
                norms=[float(namespace[o].last_grad_norm) for o in ("muon", "adamw")])


def test_the_torchtitan_recipe_of_the_docs_trains_on_a_2x2_mesh():
    """docs/distributed.md's TP + FSDP2 + Muon block, as written, on 4 ranks: a 2x2 mesh, every
    step taken, finite norms. torch's TP leaves a copy of each param it does not parallelize
    (the norms' weights, FSDP2-sharded over dp only) on each tp rank, and those copies drift
    apart by rounding (with torch's own AdamW too), so only the ranks of one tp column hold the
    same values bit for bit, and the norms of the two columns agree to rounding."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "distributed.md").read_text()
    code = next(block for block in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M) if "class Block" in block)
    results = run_ranks(docs_recipe_run, WORLD, code)
    for rank, r in enumerate(results):
        assert r["mesh"] == (2, 2) and r["stepped"] == 3.0
        column = results[rank % 2]  # ranks 0, 2: tp coordinate 0; ranks 1, 3: 1
        assert r["norms"] == column["norms"] and all(0 < n < float("inf") for n in r["norms"])
        assert all(torch.equal(a, b) for a, b in zip(r["full"], column["full"]))
        for a, b in zip(r["norms"], results[0]["norms"]):
            assert abs(a - b) <= 1e-2 * b
