"""fused_amp inside torchtitan 0.3.0's own trainer (fused_amp.integrations.torchtitan): its llama3
debug model on 4 gloo ranks, FSDP2 x TP2 and PP2 x FSDP2 (interleaved 1F1B, 2 model chunks and so
2 optimizers per rank), against torchtitan's stock AdamW on the same config and seed.

torchtitan lives in a folder of its own (``make deps``: .venv/torchtitan, requirements-
torchtitan.txt), which these tests put on the path; without it they fail, they do not skip.
tests/torchtitan_cpu.py holds the CPU patches, the assets and one rank's runs."""
import dataclasses
import os
import warnings

import pytest
import torch

import torchtitan_cpu

RANKS = 4
_on_path = torchtitan_cpu.on_path


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return torchtitan_cpu.make_assets(str(tmp_path_factory.mktemp("torchtitan_assets")))


def train(tmp_path, assets, layout, runs):
    """Train ``runs`` ({name: (optimizer, options)}) one after another in one launch of 4
    processes; returns {name: [each rank's {"records", "shards"}]}."""
    _on_path()
    specs = [(tmp_path / name, optimizer, dict(options, dump=str(tmp_path / options.get("dump", name))))
             for name, (optimizer, options) in runs.items()]
    try:
        return dict(zip(runs, torchtitan_cpu.launch(layout, specs, assets, RANKS)))
    except RuntimeError as e:
        pytest.fail(str(e))


def assert_bitwise(a, b):
    for rank, (x, y) in enumerate(zip(a, b)):
        assert x["records"] == y["records"], f"rank {rank}"
        assert x["shards"].keys() == y["shards"].keys()
        for key in x["shards"]:
            assert torch.equal(x["shards"][key], y["shards"][key]), f"rank {rank}: {key}"


def distance(a, b):
    """(largest loss difference over the steps, largest param difference) of two runs."""
    loss = max(abs(u - v) for x, y in zip(a, b) for u, v in zip(x["records"]["loss"], y["records"]["loss"]))
    params = max((x["shards"][k].float() - y["shards"][k].float()).abs().max().item()
                 for x, y in zip(a, b) for k in x["shards"] if x["shards"][k].numel())
    return loss, params


ULP = torch.finfo(torch.float32).eps


def step_one_norm(run):
    return run[0]["records"]["grad_norm"][0]


def test_fsdp2_tp2(tmp_path, assets):
    """FSDP2 x TP2. fp32 params with torchtitan's own clip: every rank's losses, grad norms and
    param shards after 5 steps (through the warmup and into the decay) are torch's fused AdamW's,
    bit for bit. Without clipping (``training.max_norm=inf``), ``step_in_backward`` is too. Muon on the blocks' matrices and
    AdamW on the rest (torchtitan's param groups): the step-1 norm both clip by in the step is
    the exact (float64) norm of all the grads within 2 ulps (every run has the same grads at
    step 1; clip_by_exact_norm in tests/torchtitan_cpu.py)."""
    unclipped = {"max_norm": float("inf"), "steps": 3}
    runs = train(tmp_path, assets, "fsdp2xtp2", {
        "stock": ("torch", {"steps": 5}),
        "fused_amp": ("fused_amp", {"fused_clip": False, "steps": 5}),
        "exact": ("torch", dict(unclipped, exact_norm=True)),  # (a clip by inf: grads times 1)
        "in_backward": ("fused_amp", dict(unclipped, step_in_backward=True)),
        "muon": ("fused_amp", {"muon": True, "steps": 3}),
    })
    assert_bitwise(runs["stock"], runs["fused_amp"])
    for a, b in zip(runs["exact"], runs["in_backward"]):
        assert a["records"]["loss"] == b["records"]["loss"]
        assert all(torch.equal(a["shards"][k], b["shards"][k]) for k in a["shards"])
    exact = step_one_norm(runs["exact"])
    for rank in runs["muon"]:
        assert abs(rank["records"]["grad_norm"][0] - exact) <= 2 * ULP * exact
        assert all(torch.isfinite(torch.tensor(rank["records"]["loss"])))


def test_pp2_fsdp2_interleaved(tmp_path, assets):
    """PP2 x FSDP2, interleaved 1F1B: 2 model chunks, so 2 optimizers per rank.

    With torchtitan's own clip, fused_amp's fp32 AdamW is torch's fused AdamW bit for bit over 5
    steps. With the clip in the step (one norm over both chunks' optimizers, both stages and the
    FSDP mesh) the reference is torchtitan's clip by the exact (float64) norm: torch's fp32 CPU
    norm is itself 8e-5 off it here. At step 1 the norm is the exact one within 2 ulps, nearer than
    torch's. Over 10 steps the run stays within torch's own spread of that reference: foreach
    against fused AdamW, and fused AdamW clipped by the exact norm one ulp up (the nearest an
    fp32 norm can be; the runs are chaotic at the ulp level, and one ulp moves them this far)."""
    runs = train(tmp_path, assets, "pp2xfsdp2", {
        "stock": ("torch", {"steps": 5}),
        "fused_amp": ("fused_amp", {"fused_clip": False, "steps": 5}),
        "exact": ("torch", {"exact_norm": True}),
        "foreach": ("torch", {"exact_norm": True, "implementation": "foreach"}),
        "ulp_up": ("torch", {"exact_norm": True, "nudge": True}),
        "in_step": ("fused_amp", {}),
    })
    assert_bitwise(runs["stock"], runs["fused_amp"])
    exact, ours, stock = (step_one_norm(runs[name]) for name in ("exact", "in_step", "stock"))
    assert abs(ours - exact) <= 2 * ULP * exact, (ours, exact)
    assert abs(ours - exact) < abs(stock - exact), (ours, stock, exact)
    spread = [distance(runs["exact"], runs[name]) for name in ("foreach", "ulp_up")]
    loss, params = distance(runs["exact"], runs["in_step"])
    assert loss <= 1.5 * max(s[0] for s in spread), (loss, spread)
    assert params <= 1.5 * max(s[1] for s in spread), (params, spread)


def test_checkpoint_resumes_bitwise(tmp_path, assets):
    """torchtitan's own checkpointer (DCP) saves at step 3; a run that resumes from it continues
    bit for bit. bf16 params with the exact masters kept as remainders: the state that
    torchtitan's own load would drop (FusedAmpOptimizersContainer.load_state_dict)."""
    options = {"dtype": "bfloat16", "master_weights": "remainder", "steps": 6, "checkpoint_at": 3, "dump": "run"}
    runs = train(tmp_path, assets, "fsdp2xtp2", {"whole": ("fused_amp", options),
                                                  "resumed": ("fused_amp", dict(options, resume_at=3))})
    assert sorted(os.listdir(tmp_path / "run" / "checkpoint")) == ["step-3", "step-6"]  # saved again
    whole, resumed = runs["whole"], runs["resumed"]
    for rank, (a, b) in enumerate(zip(whole, resumed)):
        assert b["records"]["loss"] == a["records"]["loss"][3:], rank
        for key in a["shards"]:
            assert a["shards"][key].dtype == torch.bfloat16
            assert torch.equal(a["shards"][key], b["shards"][key]), (rank, key)


# ---- the integration's own checks, in this process (no trainer) ----

@pytest.fixture()
def integration():
    _on_path()
    import fused_amp.integrations.torchtitan as integration
    return integration


def _container(integration, model, **options):
    from torchtitan.components.optimizer import ParamGroupConfig
    groups = options.pop("param_groups", [ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                                                           optimizer_kwargs={"lr": 1e-3})])
    config = integration.FusedAmpOptimizersContainer.Config(param_groups=groups, **options)
    return config.build(model_parts=[model])


def test_an_unknown_torchtitan_release_is_refused(integration):
    integration._check_version("0.3.0+cpu")
    with pytest.raises(RuntimeError, match="torchtitan 0.4.0 is not a release it knows"):
        integration._check_version("0.4.0")


def test_the_container_holds_fused_amp_optimizers_with_the_configs_options(integration):
    import fused_amp
    from torchtitan.components.optimizer import ParamGroupConfig
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).to(torch.bfloat16)
    groups = [ParamGroupConfig(pattern=r"\.weight$", optimizer_name="Muon", optimizer_kwargs={"lr": 0.02}),
              ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                               optimizer_kwargs={"lr": 1e-3, "master_weights": "remainder8"})]
    container = _container(integration, model, param_groups=groups, master_weights="remainder",
                           state_dtype="uint8")
    muon, adamw = container.optimizers
    assert isinstance(muon, fused_amp.optim.Muon) and isinstance(adamw, fused_amp.optim.AdamW)
    assert muon.param_groups[0]["master_weights"] == "remainder"
    assert adamw.param_groups[0]["master_weights"] == "remainder8"  # the group's own wins
    assert adamw.param_groups[0]["state_dtype"] == torch.uint8
    assert adamw.param_groups[0]["param_names"] == ["0.bias", "1.bias"]


@pytest.mark.parametrize("case", ["name", "option", "bf16_hook", "clipping_alone"])
def test_misuse_is_refused_or_warned(integration, case):
    from torchtitan.components.optimizer import ParamGroupConfig
    from torchtitan.models.llama3.config_registry import llama3_debugmodel
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    if case == "name":
        groups = [ParamGroupConfig(pattern=".*", optimizer_name="Shampoo", optimizer_kwargs={"lr": 1.0})]
        with pytest.raises(NotImplementedError, match="Optimizer Shampoo not added: fused_amp.optim has AdEMAMix, Adadelta"):
            _container(integration, model, param_groups=groups)
    elif case == "option":
        with pytest.raises(TypeError, match="unknown option.*master_weight\\b"):
            integration.use_fused_amp(llama3_debugmodel(), master_weight="remainder")
    elif case == "bf16_hook":
        with pytest.raises(ValueError, match="set state_dtype='bfloat16' instead"):
            _container(integration, model, implementation="fused_opt_states_bf16")
    else:
        groups = [ParamGroupConfig(pattern=r"0\.", optimizer_name="AdamW",
                                   optimizer_kwargs={"lr": 1e-3, "max_grad_norm": 1.0}),
                  ParamGroupConfig(pattern=".*", optimizer_name="Lion", optimizer_kwargs={"lr": 1e-4})]
        with pytest.warns(UserWarning, match="AdamW clip by their own norm"):
            _container(integration, model, param_groups=groups)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _container(integration, model)  # one optimizer: its own norm is the model's


def test_use_fused_amp_keeps_the_config(integration):
    from torchtitan.models.llama3.config_registry import llama3_debugmodel
    stock = llama3_debugmodel()
    config = integration.use_fused_amp(stock, master_weights="remainder8", state_dtype="bfloat16")
    assert isinstance(config, integration.FusedAmpTrainer.Config)
    assert config._owner is integration.FusedAmpTrainer
    for field in dataclasses.fields(stock):
        if field.name != "optimizer":
            assert getattr(config, field.name) is getattr(stock, field.name), field.name
    assert config.optimizer.param_groups == stock.optimizer.param_groups
    assert (config.optimizer.master_weights, config.optimizer.state_dtype) == ("remainder8", "bfloat16")
    assert integration.use_fused_amp(config).optimizer.master_weights == "remainder8"  # kept
    with pytest.raises(ValueError, match=r"step_in_backward with training.max_norm=1.0"):
        integration._check_step_in_backward(1.0, False, 1)
    with pytest.raises(ValueError, match=r"training.max_norm=0 .*; pipeline stages .*; 2 gradient accumulation"):
        integration._check_step_in_backward(0, True, 2)
    integration._check_step_in_backward(float("inf"), False, 1)


def test_torchtitans_command_line_sets_the_options(integration, tmp_path, monkeypatch):
    """A user's config module, loaded as ``-m torchtitan.train --module ... --config ...`` loads
    it (ConfigManager), with tyro's overrides of the new options (docs/torchtitan.md)."""
    (tmp_path / "my_configs.py").write_text(
        "from torchtitan.models.llama3.config_registry import llama3_debugmodel\n"
        "from fused_amp.integrations.torchtitan import use_fused_amp\n\n\n"
        "def llama3_fused_amp():\n"
        "    return use_fused_amp(llama3_debugmodel(), master_weights='remainder')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from torchtitan.config import ConfigManager
    config = ConfigManager().parse_args(["--module", "my_configs", "--config", "llama3_fused_amp",
                                         "--optimizer.state_dtype", "uint8"])
    assert isinstance(config, integration.FusedAmpTrainer.Config)
    assert (config.optimizer.master_weights, config.optimizer.state_dtype) == ("remainder", "uint8")
