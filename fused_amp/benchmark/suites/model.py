"""The user's own model (``--model``): one AdamW step (scaler step + update) over its trainable
parameter list, same shapes and count, in every recipe that applies: torch's AMP recipe and
plain bf16, fused_amp in each memory mode of README's choice table, and the outside anchors that
are installed (recipes.py)."""
from fused_amp.benchmark import recipes, workloads

# (the anchors with 4-bit state compile for tens of seconds first; the memory suite runs them)
NAMES = [recipes.TORCH, "torch_bf16", "fused_amp", "fused_amp[fp32 params]", "fused_amp[remainder]",
         "fused_amp[remainder + bf16 state]", "fused_amp[remainder + 8-bit state]",
         "fused_amp[24-bit masters + 8-bit state]", "fused_amp[no masters]",
         *(name for name in recipes.ANCHORS if recipes.RECIPES[name].state != "4-bit")]


def case_name(model) -> str:
    n = workloads.n_params(model.shapes)
    return f"{model.name}/{n / 1e6:.1f}M"


def cases(ctx):
    if ctx.model is None:
        return []
    return [(case_name(ctx.model), run)]


def run(ctx):
    return recipes.run(ctx, "model", case_name(ctx.model), ctx.model.shapes, NAMES, opt_name="adamw")

