"""torch.optim-style optimizers with fp32 master weights and one fused pass per step."""
from fused_amp.optim.adadelta import Adadelta
from fused_amp.optim.adagrad import Adagrad
from fused_amp.optim.adam import Adam, AdamW
from fused_amp.optim.adamax import Adamax
from fused_amp.optim.ademamix import AdEMAMix
from fused_amp.optim.export import export_fp32, import_fp32
from fused_amp.optim.from_torch import from_optimizer
from fused_amp.optim.in_backward import step_in_backward
from fused_amp.optim.lion import Lion
from fused_amp.optim.muon import Muon
from fused_amp.optim.nadam import NAdam
from fused_amp.optim.radam import RAdam
from fused_amp.optim.rmsprop import RMSprop
from fused_amp.optim.rprop import Rprop
from fused_amp.optim.sgd import SGD
from fused_amp.optim._clipping import clip_grad_norm_
from fused_amp.optim._stages import span_stages

__all__ = ["Adam", "AdamW", "SGD", "Lion", "Muon", "Adagrad", "RMSprop", "Adamax", "RAdam", "NAdam", "AdEMAMix",
           "Adadelta", "Rprop",
           "export_fp32", "import_fp32", "from_optimizer", "span_stages", "step_in_backward", "clip_grad_norm_"]
