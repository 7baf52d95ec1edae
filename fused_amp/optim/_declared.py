"""What each optimizer class declares (its torch checks, its hyperparameters for the step op)
and what the step op's C++ table says of it (its states, its scalar state): read, not restated."""
import re

from fused_amp import ops
from fused_amp.optim._options import options_doc, takes_our_options, with_our_options

_OPTIONS_PLACEHOLDER = re.compile(r"^( *)\{fused_amp_options\}$", re.M)


class Declared:
    """MasterWeightOptimizer's per-optimizer facts: a subclass defines ``_check_hyperparameters``
    and ``_hyper``; the rest comes from the C++ descriptor of its ``_kernel``."""

    # the optimizer's name in the step op's table (fused_amp.ops.optimizers()): by default the
    # class's name in lower case, or its base's (AdamW: "adam"), set by __init_subclass__
    _kernel = ""
    # its per-param scalar state, as (key, initial value) (NAdam's mu_product), or None: the table's
    _scalar_state = None
    # the names of its hyperparameters, in the order the step op takes them: the table's
    _hyper_names: tuple = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and takes_our_options(init):  # fused_amp's options, declared in _options
            init.__signature__ = with_our_options(init)
        if "_kernel" not in cls.__dict__ and cls.__name__.lower() in ops.optimizers():
            cls._kernel = cls.__name__.lower()
        entry = ops.optimizers().get(cls._kernel)
        if entry is not None:
            cls._scalar_state = (entry["scalar"], entry["scalar_initial"]) if entry["scalar"] else None
            cls._hyper_names = tuple(entry["hyper"])
        if entry is not None and cls.__doc__:  # fused_amp's options, documented once (_options)
            states = [(key, signed) for key, _, signed in entry["states"]]
            cls.__doc__ = _OPTIONS_PLACEHOLDER.sub(
                lambda m: options_doc(states, cls._running_sums, cls._option_notes, len(m.group(1))), cls.__doc__)

    # what the docs of fused_amp's options (_options.options_doc) add for this optimizer: option
    # -> a sentence
    _option_notes: dict = {}

    # whether its state is a running sum, which rounds stochastically by default when stored in
    # bf16 or 8 bits (rounded to nearest, increments below half a step would be lost)
    _running_sums = False

    def _hyper(self, group) -> dict:
        """The step op's hyperparameters of a group, by the names of its table entry."""
        raise NotImplementedError

    def _counts_steps(self, group, scalars) -> bool:
        """Whether the step counts go to the op (they always advance in the state)."""
        return True

    @classmethod
    def _check_hyperparameters(cls, options):
        """torch's checks of the optimizer's arguments, with its messages and in its order, on a
        dict of them: the constructor's, or a loaded group's."""
        raise NotImplementedError

    @staticmethod
    def _kept_options(options) -> dict:
        """The constructor's checked options as torch keeps them in ``defaults`` (Adam: the first
        two betas, a 1-element tensor as a 0-dim one)."""
        return options

    def _state_keys_for(self, group) -> tuple:
        """The state tensors shaped like the param, zero-filled when a param first steps: those
        its step op keeps with the group's hyperparameters (the C++ descriptor says which)."""
        return self._kept_keys(self._hyper(group))

    def _kept_keys(self, hyper) -> tuple:
        """The state keys the step op keeps with these hyperparameters (``_hyper``'s dict)."""
        return tuple(key for key, _ in ops.kept_states(self._kernel, hyper))

    def _initial_state(self, group) -> dict:
        """The value each state starts from, by key, where it is not zero."""
        return {}

    # whether torch's checkpoints of this optimizer hold a step count beside the moments
    _step_count_saved = True
