"""The benchmark suite's own logic, and a tiny end-to-end run."""
import json
import os
import subprocess
import sys

import pytest
from test_benchmark_cli import assert_tables_fit

from fused_amp.benchmark import harness, recipes, report, workloads
from fused_amp.benchmark.roofline import bytes_per_param

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bytes_accounting_follows_the_design_table():
    # DESIGN.md: unscale 4 (half) / 8 (fp32); Adam 28; SGD+momentum with masters 20
    assert bytes_per_param("unscale", "bfloat16") == 2 + 2
    assert bytes_per_param("unscale", "float32") == 4 + 4
    assert bytes_per_param("adam", "bfloat16") == (2 + 4 + 4 + 4) + (4 + 4 + 4 + 2)
    assert bytes_per_param("adamw", "float16") == 28
    assert bytes_per_param("sgd", "bfloat16") == (2 + 4 + 4) + (4 + 4 + 2)
    with pytest.raises(KeyError):
        bytes_per_param("unscale", "int8")


def test_make_records_ratios_and_fractions():
    times = {"a": [0.010, 0.012, 0.011], "b": [0.030, 0.033, 0.031]}
    recs = harness.make_records("optimizer", "x", "cpu", "bfloat16", 1_000_000, 10, times,
                                ceiling_gbps=10.0, bytes_per_param=28)
    by = {r["impl"]: r for r in recs}
    assert by["a"]["time_ms"] == pytest.approx(11.0)
    assert by["a"]["speedup_vs"]["b"] == pytest.approx(31 / 11)
    assert by["b"]["speedup_vs"]["a"] == pytest.approx(11 / 31)
    assert by["a"]["gbytes_per_s"] == pytest.approx(28e6 / 0.011 / 1e9)
    assert by["a"]["ceiling_frac"] == pytest.approx(by["a"]["gbytes_per_s"] / 10.0)
    for r in recs:
        harness.validate_record(r)


def test_validate_record_rejects_missing_and_mistyped_fields():
    rec = harness.make_records("unscale", "x", "cpu", "float32", 10, 1, {"a": [1.0]}, 1.0, 8)[0]
    bad = dict(rec)
    del bad["time_ms"]
    with pytest.raises(ValueError, match="time_ms"):
        harness.validate_record(bad)
    with pytest.raises(ValueError, match="n_params"):
        harness.validate_record({**rec, "n_params": 1.5})


def test_ceiling_is_the_best_of_every_streaming_kernel():
    c = harness.measure_ceiling("cpu", n_bytes=1 << 22, reps=2)
    kernels = {f"{k}_gbps" for k in harness.STREAM_BYTES}
    assert set(c) == kernels | {"ceiling_gbps"}
    assert c["ceiling_gbps"] == max(c[k] for k in kernels) > 0


def runs_of(ratios):
    """Records of repeated runs where fused_amp takes 1 ms and torch 1 ms * ratio."""
    out = []
    for r, ratio in enumerate(ratios):
        for rec in harness.make_records("optimizer", "adam/bfloat16/1M", "cpu", "bfloat16", 1_000_000, 1,
                                        {"fused_amp": [1e-3], "torch_amp": [ratio * 1e-3]}, 100.0, 28):
            rec["repeat"] = r
            out.append(rec)
    return out


@pytest.mark.parametrize("ratios,word", [([1.2, 1.1, 1.05], "faster"), ([1.2, 1.1, 0.9], "within noise"),
                                         ([0.8, 0.95, 0.9], "SLOWER")])
def test_repeats_give_median_range_and_a_verdict_only_when_all_agree(ratios, word):
    recs = report.aggregate(runs_of(ratios), ceiling_gbps=100.0)
    ours = next(r for r in recs if r["impl"] == "fused_amp")
    assert ours["repeats"] == 3
    assert ours["speedup_vs"]["torch_amp"] == pytest.approx(sorted(ratios)[1])
    assert ours["speedup_range"]["torch_amp"] == pytest.approx([min(ratios), max(ratios)])
    for r in recs:
        harness.validate_record(r)
    line = next(ln for ln in report.verdict_lines(recs) if "adam/bfloat16" in ln)
    assert f"vs torch_amp: {word}" in line


def test_a_result_above_the_ceiling_says_the_ceiling_is_wrong(tmp_path):
    recs = report.aggregate(runs_of([1.0]), ceiling_gbps=1.0)  # 28 GB/s against a ceiling of 1
    assert report.over_ceiling(recs)
    assert "the ceiling is wrong" in report.verdict_lines(recs)[0] and "%" not in report.verdict_lines(recs)[0]
    machine = dict(cpu="x", threads=2, torch="t", date="d", fused_amp_build={"cpu_isa": "AVX2"})
    report.write_markdown(str(tmp_path / "r.md"), machine, {"ceiling_gbps": 1.0}, recs, 1, [])
    assert "The ceiling is wrong" in (tmp_path / "r.md").read_text()


def test_train_cases_of_an_emulated_dtype_are_skipped_and_reported():
    from fused_amp.benchmark.suites import train

    class Ctx:
        device, native, skipped = "cpu", {"bfloat16": (12.0, False)}, []

        def skip(self, suite, case, reason):
            self.skipped.append(dict(suite=suite, case=case, reason=reason))

    ctx = Ctx()
    assert train.cases(ctx) == []
    assert {s["case"] for s in ctx.skipped} == {"transformer/bfloat16", "mlp/bfloat16"}
    assert "emulated" in ctx.skipped[0]["reason"] and "12.0x" in ctx.skipped[0]["reason"]


def test_alternating_timing_runs_each_impl_in_turn():
    order = []
    impls = [harness.Impl(n, (lambda n=n: order.append(n)), (lambda n=n: order.append("prep-" + n)))
             for n in ("A", "B")]
    times = harness.time_alternating(impls, "cpu", reps=3, warmup=1)
    assert order == ["prep-A", "A", "prep-B", "B"] * 4
    assert {k: len(v) for k, v in times.items()} == {"A": 3, "B": 3}


def test_markdown_writer_and_summary_mark_losses():
    times = {"fused_amp": [2.0], "torch_amp": [1.0]}
    recs = [r for case in ("slow-case", "other") for r in
            harness.make_records("unscale", case, "cpu", "float32", 100, 1, times, 1.0, 8)]
    table = report.markdown(report.suite_table(recs, "unscale"))
    assert table.splitlines()[0].startswith("| case | impl | time ms (range) | × torch (range) |")
    assert "slow-case" in table and "0.50×" in table
    assert any("vs torch_amp: SLOWER" in line for line in report.verdict_lines(recs))


def test_times_under_a_millisecond_keep_three_significant_digits():
    """A one-param step of some microseconds reads as such, not as 0.01 ms."""
    times = {"fused_amp": [1.462e-5, 1.458e-5, 1.471e-5], "torch_fused": [2.251e-5, 2.25e-5, 2.26e-5]}  # (s)
    recs = harness.make_records("offload", "one-param", "cpu", "float32", 4096, 1, times, 1.0, None)
    table = report.markdown(report.suite_table(recs, "offload"))
    assert "0.0146 (0.0146–0.0147)" in table and "0.0225 (0.0225–0.0226)" in table
    assert any(" 0.0146 ms " in line for line in report.verdict_lines(recs))


def test_suite_tables_compare_with_torchs_recipe_and_the_best_anchor_only():
    """However many implementations a case has, a table has the two ratio columns and at most
    MAX_COLUMNS columns; the best anchor is the fastest outside one of each case; a suite of one
    case has no case column."""
    impls = ["fused_amp", "fused_amp[remainder]", "torch_amp", "torch_bf16", "bitsandbytes[Adam8bit]",
             "torchao[AdamW8bit]", "deepspeed[Adam]"] + [f"fused_amp[mode {i}]" for i in range(20)]
    times = {name: [1e-3 * (1 + i)] for i, name in enumerate(impls)}
    recs = harness.make_records("memory", "m", "cpu", "bfloat16", 1000, 1, times, 10.0, 28,
                                {k: {"loss": 1.0, "tokens_per_s": 5.0, "host_syncs_per_step": 0,
                                     "held_bytes": 16000, "outside_ns_frac": 0.1} for k in impls})
    table = report.suite_table(recs, "memory")
    assert len(table[0]) == report.MAX_COLUMNS
    assert table[0][:6] == ["impl", "time ms (range)", "× torch (range)", "× best anchor", "of ceiling",
                            "holds B/param"]
    rows = {row[0]: row for row in table[1:]}
    assert rows["fused_amp"][2].startswith("3.00×") and rows["fused_amp"][3].startswith("5.00×")  # bnb: 5 ms
    assert rows["torch_amp"][2] == "–" and rows["fused_amp"][5] == "16.0"


def test_workload_shapes_match_the_architectures():
    assert abs(workloads.n_params(workloads.gpt2_small_shapes()) - 124_439_808) < 1_000_000
    assert abs(workloads.n_params(workloads.resnet50_shapes()) - 25_557_032) < 200_000
    assert workloads.n_params(workloads.many_small_shapes()) == 10_000_000


def test_scaling_fit_recovers_overhead_and_slope():
    recs = []
    for n in (1e6, 4e6, 16e6):
        recs += harness.make_records("scaling", f"params/{int(n)}", "cpu", "bfloat16", int(n), 10,
                                     {"fused_amp": [(0.5 + 2e-6 * n) / 1e3]}, 1.0, 28)
    fit = report.scaling_fit(recs)["fused_amp"]
    assert fit["overhead_ms"] == pytest.approx(0.5)
    assert fit["ns_per_param"] == pytest.approx(2e-6 * 1e6)


def test_quick_run_end_to_end(tmp_path):
    """The whole quick plan, real sizes, with the run's own budget check (exit 3 when over);
    benchmarks/run.py is the package's command. The budget here is 5 minutes: the quick run's
    half minute on an idle machine is measured (docs/benchmarks.md), not asserted by a test,
    which another job on the machine (CI runs two streams) would fail."""
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--device", "cpu",
                           "--quick", "--time-budget", "300", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["machine"]["fused_amp_build"]["cpu_isa"]
    assert data["ceiling"]["ceiling_gbps"] > 0
    suites = {r["suite"] for r in data["records"]} | {s["suite"] for s in data["skipped"]}
    assert suites == {"unscale", "optimizer", "memory", "muon", "train", "scaling", "distributed", "offload"}
    for rec in data["records"]:
        harness.validate_record(rec)
    impls = {r["impl"] for r in data["records"] if r["suite"] == "optimizer"}
    assert impls == {"fused_amp", "torch_amp", "torch_master"}
    # the summary first: the memory suite's recipes, torch's recipe the first row
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("adam/bfloat16/16M/modes: 16.0M params in ")
    assert lines[1].startswith("One Adam step with a GradScaler (scaler step + update) on ")
    assert lines[3].split() == ["recipe", "masters", "state", "step", "ms", "(range)", "×", "torch", "(range)",
                                "holds", "B/param", "holds", "GiB", "of", "ceiling"]
    assert lines[4].split()[0] == "torch_amp" and lines[5].split()[0] == "fused_amp"
    md = (out / "results.md").read_text()
    assert md.startswith("# fused_amp benchmark: ")
    assert_tables_fit(md)
    assert (out / "speedup.png").stat().st_size > 1000
    assert data["fused_amp_settings"] == {"unscale_grads": True}
    assert "unscale_grads=True" in md


def test_user_summary_first_and_predicted_for_the_users_size():
    recs = []
    for impl_times in ({"fused_amp": [0.010], "torch_amp": [0.012], "torch_master": [0.015]},):
        recs += harness.make_records("optimizer", "adam/bfloat16/1M", "cpu", "bfloat16", 1_000_000, 3,
                                     impl_times, 10.0, 28, {k: {"held_bytes": 16_000_000} for k in impl_times})
    for n in (1_000_000, 4_000_000):  # 1 ms + 2 ns/param for every impl
        recs += harness.make_records("scaling", f"params/{n // 1_000_000}M", "cpu", "bfloat16", n, 3,
                                     {k: [(1.0 + 2e-6 * n) / 1e3] for k in ("fused_amp", "torch_amp", "torch_master")},
                                     10.0, 28)
    machine = dict(cpu="x", threads=2, torch="t", fused_amp_build={"cpu_isa": "AVX2"})
    lines = report.summary(recs, machine, 1, model_params=10_000_000)
    assert lines[0] == "adam/bfloat16/1M: 1.0M params in 3 tensors."
    assert lines[3].split()[:2] == ["recipe", "masters"]
    assert lines[4].split()[:5] == ["torch_amp", "–", "–", "12.0", "(12.0–12.0)"]
    assert lines[5].split()[:7] == ["fused_amp", "–", "–", "10.0", "(10.0–10.0)", "1.20×", "(1.20–1.20)"]
    assert lines[5].split()[7:10] == ["16.0", "0.01", "28%"]  # 28 B/param over 10 ms at a 10 GB/s ceiling
    assert "predicted for 10M params" in lines[7] and "fused_amp 21.0 ms, holds 0.15 GiB" in lines[7]


@pytest.mark.soak  # minutes of benchmark runs on 2 ranks: the soak tier (docs/development.md)
def test_distributed_suite_reports_time_per_rank_and_bytes_held(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--device", "cpu",
                           "--repeat", "1", "--size-scale", "0.05", "--suite", "distributed",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    impls = {case: {r["impl"] for r in data["records"] if r["case"] == case}
             for case in {r["case"] for r in data["records"]}}
    recipes = ["clip", "remainder", "remainder + 8-bit state", "24-bit + 8-bit state", "Lion", "Muon, no Newton-Schulz"]
    assert impls.pop("fsdp2-host/800-params") == {
        "fused_amp", "fused_amp[plain tensors]", "torch_fused", "all_reduce of the flag",
        "Muon's exchange of whole matrices",
        *(f"fused_amp[{r}]" for r in recipes), *(f"fused_amp[{r}, plain tensors]" for r in recipes)}
    assert list(impls.values()) == [{"fused_amp", "torch_fused"}]
    host = {r["impl"]: r for r in data["records"] if r["case"] == "fsdp2-host/800-params"}
    assert all(r["host_us_per_param"] > 0 for r in host.values())
    # per rank: the 800 params' shards; Muon's rows and its exchange the 200 Linear weights' only
    assert {host[k]["n_tensors"] for k in ("fused_amp", "fused_amp[plain tensors]", "torch_fused")} == {800}
    assert {host[k]["n_tensors"] for k in ("fused_amp[Muon, no Newton-Schulz]", "Muon's exchange of whole matrices")} == {200}
    assert host["fused_amp"]["n_params"] == 200 * (64 * 64 + 64 * 3) // 2
    assert host["fused_amp[Muon, no Newton-Schulz]"]["n_params"] == 200 * 64 * 64 // 2
    assert all(r["host_cpu_us_per_param"] > 0 for r in host.values())
    assert "800-params per param per rank (us), median of 1 run(s), wall time: " in data["notes"]["distributed host time"]
    assert "FSDP2 - plain tensors per param (range over the runs), wall: fp32 masters " in data["notes"]["distributed host time"]
    assert "; CPU time: fp32 masters " in data["notes"]["distributed host time"]
    note = data["notes"]["distributed"]
    for label in ("FSDP2 fp32 shards", "FSDP2 bf16 shards + fp32 masters", "ZeRO-1", "DDP", "6 + 12/d"):
        assert label in note
    assert "DDP bf16 + masters 16.0" in note  # replicated: 2 + 2 + 4 + 4 + 4 bytes per param


def test_the_host_time_note_gives_medians_and_ranges_over_every_run():
    from fused_amp.benchmark.suites import distributed

    def run(fused, plain, torch_fused):  # us per param; the other rows 1.0
        wall = dict.fromkeys(distributed.host_rows(), 1.0)
        wall.update({"fused_amp": fused, "fused_amp[plain tensors]": plain, "torch_fused": torch_fused})
        return wall, dict(wall)
    runs = [run(4.0, 2.0, 40.0), run(3.0, 2.5, 30.0), run(6.0, 2.0, 36.0)]
    note = distributed._host_note(runs)
    assert "median of 3 run(s), wall time: torch_fused 36.0, fused_amp 4.0, fused_amp[plain tensors] 2.0," in note
    # gaps 2.0, 0.5, 4.0 and ratios 10, 10, 6 in each run: the medians of the runs, not of the rows
    assert "wall: fp32 masters +2.0 (+0.5..+4.0), clip +0.0 (+0.0..+0.0)," in note
    assert "CPU time: fp32 masters +2.0 (+0.5..+4.0)," in note
    assert note.endswith("torch_fused / fused_amp: 10.0x (6.0..10.0x) wall, 10.0x (6.0..10.0x) CPU")
    # Muon: its FSDP2 row less its plain row less the exchange's row
    assert "Muon's gaps less the exchange -1.0 (-1.0..-1.0) wall" in note


@pytest.mark.soak  # minutes of a study tool's runs: the soak tier (docs/development.md)
def test_fsdp_host_breakdown_splits_each_adamw_row_over_the_parts_of_its_step():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "fsdp_host_breakdown.py"), "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = {line[:52].strip(): [float(x) for x in line[52:].split()]
            for line in proc.stdout.splitlines() if line.startswith("fused_amp")}
    assert len(rows) == 10  # fp32 masters, clip and the three memory modes, each FSDP2 and plain
    # grads, check, all-reduce, lists, op, step: the parts of an FSDP2 step, within the step
    *parts, step = rows["fused_amp"]
    assert all(p > 0 for p in parts) and sum(parts) < step
    assert rows["fused_amp[plain tensors]"][2] == 0  # no all-reduce for plain tensors


def test_fsdp_prediction_scales_the_host_time_per_tensor_to_a_llama_layout():
    assert workloads.llama_like_tensor_count(6.74e9) == 291  # Llama-2 7B: 32 layers x 9 + 3
    assert workloads.llama_like_tensor_count(13e9) == 363    # 13B: 40 layers
    recs = harness.make_records("distributed", "fsdp2-host/800-params", "cpu", "bfloat16", 10, 800,
                                {"fused_amp": [0.008], "torch_fused": [0.032]}, None, None)
    for r, us in zip(recs, (10.0, 40.0)):
        r["host_us_per_param"] = us
    line, = report.fsdp_prediction(recs, int(6.74e9), ranks=8, ceiling_gbps=1000.0)
    assert "291 tensors" in line and "fused_amp 2.9 ms" in line and "AdamW 11.6 ms" in line
    assert "23.6 ms" in line  # 28 B x 6.74e9 / 8 at 1 TB/s
    assert report.fsdp_prediction(recs[:1], int(6.74e9)) == []
    for r, us in zip(recs, (5.0, 40.0)):  # the stepping thread's CPU time, where recorded, decides
        r["host_cpu_us_per_param"] = us
    line, = report.fsdp_prediction(recs, int(6.74e9), ranks=8, ceiling_gbps=1000.0)
    assert "fused_amp 1.5 ms" in line and "AdamW 11.6 ms" in line and "of CPU time" in line
    # a run of the distributed suite alone (no optimizer suite) predicts it too
    assert report.summary(recs, {}, 1, int(6.74e9)) == report.fsdp_prediction(recs, int(6.74e9)) != []


class _Ctx:
    device, reps, ceiling_gbps = "cpu", 1, 10.0

    def __init__(self):
        self.skipped, self.notes = [], {}

    def skip(self, suite, case, reason):
        self.skipped.append(dict(suite=suite, case=case, reason=reason))

    def note(self, suite, text):
        self.notes[suite] = text


def test_recipes_that_do_not_fit_together_are_timed_in_batches_with_torchs(monkeypatch):
    """Where the recipes do not all fit in memory, each batch has torch's recipe in it, so every
    ratio to torch's is timed in turns; torch's row is reported once; a recipe that does not fit
    even beside torch's alone is skipped and named."""
    from fused_amp.benchmark import recipes
    shapes = [(4096,)] * 4  # 8-bit state from min_8bit_size (4096) up
    n = 4 * 4096
    names = [recipes.TORCH, "fused_amp", "fused_amp[remainder]", "fused_amp[24-bit masters + 8-bit state]"]
    monkeypatch.setattr(recipes, "_batches", {})
    # needs per param while timed: torch's 20, fused_amp 18, remainder 16, 24-bit + 8-bit 9
    monkeypatch.setattr(recipes, "free_bytes", lambda device: n * 50 / 0.7)
    ctx = _Ctx()
    recs = recipes.run(ctx, "memory", "c", shapes, names)
    assert [r["impl"] for r in recs] == names
    assert all(recipes.TORCH in r["speedup_vs"] for r in recs[1:])
    assert "fused_amp" not in recs[2]["speedup_vs"]  # another batch
    assert "timed in 2 batches" in ctx.notes["memory"]
    by = {r["impl"]: r for r in recs}
    for name in ("fused_amp", recipes.TORCH):  # weights, grads, state; and a step count per tensor
        assert n * 16 <= by[name]["held_bytes"] <= n * 16 + 4 * 8
    assert n * 7 < by["fused_amp[24-bit masters + 8-bit state]"]["held_bytes"] < n * 7.1
    monkeypatch.setattr(recipes, "_batches", {})
    monkeypatch.setattr(recipes, "free_bytes", lambda device: n * 30 / 0.7)
    ctx = _Ctx()
    recs = recipes.run(ctx, "memory", "c", shapes, names)
    assert [r["impl"] for r in recs] == [recipes.TORCH, "fused_amp[24-bit masters + 8-bit state]"]
    assert [s["case"] for s in ctx.skipped] == ["c fused_amp", "c fused_amp[remainder]"]
    assert "does not fit beside torch's recipe" in ctx.skipped[0]["reason"]


def test_a_bare_run_times_the_optimizers_alone_at_their_own_bytes(monkeypatch):
    """The offload suite's bare step: each recipe's optimizer without its GradScaler (a scaler
    step here fails the run), torch's recipe named as its fused Adam, and each credited with its
    step's roofline bytes without the scaler's pass over the grads."""
    from fused_amp.benchmark import impls, recipes
    from fused_amp.benchmark.roofline import bytes_per_param

    def no_scaler(self):
        raise AssertionError("a bare run stepped the GradScaler")

    monkeypatch.setattr(impls.ScalerStep, "step", no_scaler)
    monkeypatch.setattr(recipes, "_batches", {})
    shapes = [(4096,)] * 2
    names = [recipes.TORCH, "fused_amp[fp32 params]", "fused_amp[remainder]"]
    recs = recipes.run(_Ctx(), "offload", "c", shapes, names, bare=True)
    by = {r["impl"]: r for r in recs}
    assert list(by) == [recipes.TORCH_BARE, "fused_amp[fp32 params]", "fused_amp[remainder]"]
    assert recipes.TORCH_BARE in by["fused_amp[remainder]"]["speedup_vs"]
    assert recipes.TORCH not in by["fused_amp[remainder]"]["speedup_range"]
    assert by[recipes.TORCH_BARE]["bytes_per_param"] == bytes_per_param("adam", "float32") == 28
    assert by["fused_amp[remainder]"]["bytes_per_param"] == bytes_per_param("adam_remainder", "bfloat16") == 26


@pytest.mark.parametrize("free_gib, large, alone", [(24, "370M", True), (100, "1000M", False), (2, "30M", False)])
def test_the_offload_suites_large_case_is_as_large_as_memory_allows(monkeypatch, free_gib, large, alone):
    """Three implementations side by side at 16 bytes per param each in 70% of the free memory,
    up to 1B (in tens of millions); where 1B does not fit three, fused_amp alone at 1B, where it
    fits one."""
    from fused_amp.benchmark import recipes
    from fused_amp.benchmark.suites import offload
    monkeypatch.setattr(recipes, "free_bytes", lambda device: free_gib * 2 ** 30)
    ctx = _Ctx()
    ctx.quick = False
    names = [name for name, _ in offload.cases(ctx)]
    assert names[:2] == ["bare/float32/84M", f"bare/float32/{large}"]
    assert ("bare/float32/1000M/alone" in names) == alone


def test_an_anchors_import_leaves_torchs_environment_as_it_was(tmp_path, monkeypatch):
    """deepspeed's import sets PYTORCH_NVML_BASED_CUDA_CHECK=1, which made each of torch's
    optimizer steps ~0.1 ms slower on a machine without a GPU for the rest of the run: the
    benchmark undoes what an anchor's import sets there."""
    (tmp_path / "anchor_setting_env.py").write_text("import os\nos.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    assert recipes.installed("anchor_setting_env")
    assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ
