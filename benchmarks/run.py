"""The benchmark suite from a source checkout: the same as ``python -m fused_amp.benchmark``
(fused_amp/benchmark/), which an installed package runs from any folder."""
import sys

from fused_amp.benchmark.cli import main

if __name__ == "__main__":
    sys.exit(main())
