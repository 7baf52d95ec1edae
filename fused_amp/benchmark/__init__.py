"""fused_amp's benchmark suite against stock PyTorch and the outside anchors that are installed.

    python -m fused_amp.benchmark --help
    python -m fused_amp.benchmark --quick --model mypackage.models:build

Each suite (suites/) lists its cases; the harness times the implementations of a case in turns
and writes one record per implementation (harness.RECORD_FIELDS); report.py turns the records
into the summary, results.md, results.json and the plots.
"""
