"""What the step op's C++ table says of an optimizer class (its kernel's name, states, scalar
state and hyperparameters), read into the class when it is defined, not restated in Python;
and fused_amp's options and torch's flags put into its signature and its docstring."""
import re

from fused_amp import ops
from fused_amp.optim._options import options_doc, takes_our_options, torch_flags_doc, with_our_options

_OPTIONS_PLACEHOLDER = re.compile(r"^( *)\{fused_amp_options\}$", re.M)
_FLAGS_PLACEHOLDER = re.compile(r"^( *)\{torch_flags\}$", re.M)


def declare(cls) -> None:
    """Called for each subclass of MasterWeightOptimizer (``__init_subclass__``): sets its
    ``_kernel`` (by default the class's name in lower case where the table has it, else its
    base's: AdamW is "adam"), ``_scalar_state`` and ``_hyper_names`` from the table, and puts
    fused_amp's options (``_options``) into its ``__init__``'s signature and its docstring, and
    the docs of torch's flags it takes into its docstring."""
    init = cls.__dict__.get("__init__")
    if init is not None and cls.__doc__:  # torch's flags, documented once (_options)
        cls.__doc__ = _FLAGS_PLACEHOLDER.sub(lambda m: torch_flags_doc(init, len(m.group(1))), cls.__doc__)
    if init is not None and takes_our_options(init):
        init.__signature__ = with_our_options(init)
    if "_kernel" not in cls.__dict__ and cls.__name__.lower() in ops.optimizers():
        cls._kernel = cls.__name__.lower()
    entry = ops.optimizers().get(cls._kernel)
    if entry is None:
        return
    cls._scalar_state = (entry["scalar"], entry["scalar_initial"]) if entry["scalar"] else None
    cls._hyper_names = tuple(entry["hyper"])
    if cls.__doc__:  # fused_amp's options, documented once (_options)
        states = [(key, signed) for key, _, signed in entry["states"]]
        cls.__doc__ = _OPTIONS_PLACEHOLDER.sub(
            lambda m: options_doc(states, cls._running_sums, cls._option_notes, len(m.group(1))), cls.__doc__)
