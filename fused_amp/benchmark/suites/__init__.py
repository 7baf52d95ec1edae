"""Each suite: ``cases(ctx)`` lists (name, runner) pairs; a runner takes a
Context and returns records (harness.py)."""
from fused_amp.benchmark.suites import (ceiling, distributed, memory, model, muon, offload, optimizer, scaling,
                                        train, unscale)

SUITES = {"ceiling": ceiling, "model": model, "unscale": unscale, "optimizer": optimizer, "memory": memory,
          "muon": muon, "train": train, "scaling": scaling, "distributed": distributed,
          "offload": offload}
# a run without --model: every suite but the model's (ceiling first: every ceiling_frac refers to it)
DEFAULT = [name for name in SUITES if name not in ("ceiling", "model")]
