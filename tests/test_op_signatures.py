"""The ops' signatures are written once, in their schemas (csrc/register.cpp): torch checks each
C++ kernel's types against its schema when the extension loads, and this checks each Python
wrapper of fused_amp.ops against it: the same names, in the same order, positional or keyword
alike, and the schema's defaults."""
import inspect

import pytest
import torch

from fused_amp import ops

OPS = ["unscale_", "non_finite_check_", "grad_norm_", "update_scale_", "step_", "delayed_scale_update_"]


@pytest.mark.parametrize("name", OPS)
def test_the_python_wrapper_has_the_schemas_arguments(name):
    schema = getattr(torch.ops.fused_amp, name).default._schema
    wrapper = inspect.signature(getattr(ops, name)).parameters
    assert list(wrapper) == [a.name for a in schema.arguments]
    for arg in schema.arguments:
        param = wrapper[arg.name]
        assert (param.kind == param.KEYWORD_ONLY) == arg.kwarg_only, arg.name
        if arg.has_default_value():
            assert param.default == arg.default_value, arg.name


def test_every_op_of_the_library_has_a_wrapper():
    assert sorted(n for n in ops.__all__ if n not in ("optimizers", "kept_states", "storage_kinds")) == sorted(OPS)
