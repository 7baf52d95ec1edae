"""What other parts of fused_amp attach to a fused_amp.optim optimizer: one object, created
with the optimizer (and again when it is unpickled: torch pickles only its defaults, state and
groups), whose fields say who sets and who reads each. The step reads them as fields, not as
attributes that may or may not be there."""
import dataclasses
from typing import Any, List, Optional


@dataclasses.dataclass
class Attached:
    # the StepInBackward in force (in_backward.py): step() and zero_grad() leave the params alone
    in_backward: Any = None
    # the params of the bucket that steps now, in backward (MasterWeightOptimizer._step_params);
    # None in a whole step
    only: Optional[set] = None
    # the device lists the buckets of this backward stepped with torchao float8 weights: their
    # scales are handed over at once when backward ends (_hand_over_after_backward)
    float8_stepped: List[dict] = dataclasses.field(default_factory=list)
    # the fp8 copies registered on the optimizer (fused_amp.float8), which the step writes
    float8_copies: List[Any] = dataclasses.field(default_factory=list)
    # the grads the GradScaler's overflow check read just before this step, handed over for
    # the step to take instead of reading every .grad again (GradScaler.step)
    scaler_grads: Any = None
