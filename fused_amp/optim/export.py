"""Moving a fused_amp checkpoint to stock torch.optim."""
import copy

import torch

from fused_amp.optim._memory import master_of


def export_fp32(model: torch.nn.Module, optimizer) -> torch.nn.Module:
    """An fp32 copy of ``model`` whose parameters hold the optimizer's fp32 masters.

    Parameters without a master (fp32 ones, or not yet stepped) are copied and converted.
    The copy's ``parameters()`` come in the same order as the model's, so a ``torch.optim``
    optimizer built over them in the same groups loads ``optimizer.state_dict()`` directly::

        model32 = fused_amp.optim.export_fp32(model, opt)
        torch_opt = torch.optim.Adam(model32.parameters(), lr=1e-3)
        torch_opt.load_state_dict(opt.state_dict())
    """
    model32 = copy.deepcopy(model).float()
    with torch.no_grad():
        for p, p32 in zip(model.parameters(), model32.parameters()):
            master = master_of(p, optimizer.state.get(p, {}))
            if master is not None:
                p32.copy_(master)
    return model32
