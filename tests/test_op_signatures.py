"""The ops' signatures are written once, in their schemas (csrc/register.cpp): torch checks each
C++ kernel's types against its schema when the extension loads, and this checks each Python
wrapper of fused_amp.ops against it: the same names, in the same order, positional or keyword
alike, and the schema's defaults."""
import inspect
import os
import subprocess

import pytest
import torch

from fused_amp import ops

OPS = ["unscale_", "non_finite_check_", "grad_norm_", "update_scale_", "step_", "delayed_scale_update_"]


@pytest.mark.parametrize("name", OPS)
def test_the_python_wrapper_has_the_schemas_arguments(name):
    schema = getattr(torch.ops.fused_amp, name).default._schema
    wrapper = {k: p for k, p in inspect.signature(getattr(ops, name)).parameters.items()
               if p.kind != p.VAR_KEYWORD}  # (step_'s deprecated keywords, for one release)
    assert list(wrapper) == [a.name for a in schema.arguments]
    for arg in schema.arguments:
        param = wrapper[arg.name]
        assert (param.kind == param.KEYWORD_ONLY) == arg.kwarg_only, arg.name
        if arg.has_default_value():
            assert param.default == arg.default_value, arg.name


def test_every_op_of_the_library_has_a_wrapper():
    tables_and_checks = ("optimizers", "kept_states", "storage_kinds", "check_step_")
    assert sorted(n for n in ops.__all__ if n not in tables_and_checks) == sorted(OPS)


def test_the_step_takes_at_most_15_parts_and_its_check_the_same():
    """As torch's _fused_adamw_ (15): one role per part (CHANGELOG.md); the check op, which
    validates without writing, has the same schema, and check_step_ step_'s parts."""
    schema = torch.ops.fused_amp.step_.default._schema
    assert len(schema.arguments) <= len(torch.ops.aten._fused_adamw_.default._schema.arguments) == 15
    assert str(torch.ops.fused_amp_check.step_.default._schema).split("(", 1)[1] == str(schema).split("(", 1)[1]
    step = {k: p for k, p in inspect.signature(ops.step_).parameters.items() if p.kind != p.VAR_KEYWORD}
    assert list(inspect.signature(ops.check_step_).parameters) == list(step)
    written_lists = [a for a in schema.arguments if a.alias_info and a.alias_info.is_write
                     and str(a.type).startswith("List")]
    assert written_lists and all("Optional" not in str(a.type) for a in written_lists)  # (no None)


DESCRIPTOR = """
#include "optimizers.h"
struct Descriptor : fused_amp::ops::Elementwise {{
  struct Hyper {{ double beta, eps; bool maximize; }};
  static constexpr fused_amp::ops::HyperField<Hyper> kHyperFields[] = {{{fields}}};
}};
static_assert(fused_amp::hyper_fields_complete<Descriptor>(), "incomplete");
"""


@pytest.mark.parametrize("fields,compiles", [
    ("FA_HYPER(beta), FA_HYPER(eps), FA_HYPER(maximize)", True),
    ("FA_HYPER(beta), FA_HYPER(maximize)", False),  # eps would stay 0 in every step
    ("FA_HYPER(beta), FA_HYPER(eps), FA_HYPER(eps)", False),  # maximize missing, eps twice
])
def test_a_hyperparameter_missing_from_its_table_fails_to_compile(tmp_path, fields, compiles):
    """optimizers.h asserts ops::hyper_fields_complete of every optimizer it lists; this checks
    that the assertion tells a complete table from one that misses a member of its Hyper."""
    source = tmp_path / "descriptor.cpp"
    source.write_text(DESCRIPTOR.format(fields=fields))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{os.path.join(root, 'csrc')}", str(source)],
                          capture_output=True, text=True)
    assert (proc.returncode == 0) == compiles, proc.stderr[-2000:]
    assert compiles or "incomplete" in proc.stderr


@pytest.mark.parametrize("namespace", ["fused_amp", "fused_amp_check"])
@pytest.mark.parametrize("name", OPS)
def test_autograd_falls_through_to_the_kernel(namespace, name):
    """The ops and their checks are not differentiable: their Autograd key falls through to the
    kernel. Torch's not-implemented fallback there boxes every argument of every call (the
    checks of a 2-group step of 1,000 params took 480 us through it, 180 us without)."""
    table = torch._C._dispatch_dump_table(f"{namespace}::{name}")
    rows = [row for row in table.splitlines() if row.startswith(("AutogradCPU:", "AutogradCUDA:"))]
    assert len(rows) == 2 and all("fallthrough" in row for row in rows), table
