"""Each suite: ``cases(device, quick, scale)`` lists (name, runner) pairs; a runner takes a
Context and returns records (benchmarks/harness.py)."""
from benchmarks.suites import ceiling, distributed, memory, muon, optimizer, scaling, train, unscale

SUITES = {"ceiling": ceiling, "unscale": unscale, "optimizer": optimizer, "memory": memory, "muon": muon,
          "train": train, "scaling": scaling, "distributed": distributed}
