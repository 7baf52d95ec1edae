import sys

from fused_amp.benchmark.cli import main

sys.exit(main())
