"""``python -m benchmarks report``: choosing runs, combining them, verdicts,
staleness, tables and plots.

Runs on the committed ``benchmarks/results/runs/*.json`` and on small made-up
runs whose verdicts are known.  No benchmark is run and no GPU is needed.
"""
import copy
import json
import os

import pytest

from benchmarks import __main__ as cli
from benchmarks import provenance, report
from benchmarks import runs as saved
from benchmarks.common import RESULTS_DIR, spread

FINGERPRINT = "f" * 16
OPS = {
    "gpu": "Test GPU",
    "overhead": [{"op": "axpby", "skcuda_us": 7.0, "nvmath_us": None, "torch_us": 10.0,
                  "cupy_us": 9.0, "ratio_to_torch": 0.7, "torch_form": "mul_ + add_ (2 kernels)"},
                 {"op": "relu", "skcuda_us": 9.0, "nvmath_us": None, "torch_us": 10.0,
                  "cupy_us": 9.0, "ratio_to_torch": 0.9}],
    "copy_Bps": 2e12,
    "bandwidth": [{"op": "axpby", "n": 8, "ours_Bps": 1.9e12, "fraction_of_copy": 0.95,
                   "torch_Bps": 1.5e12, "cupy_Bps": None}],
    "sum_t": [  # meets its fraction but is slower than torch: does not hold
        {"shape": [8, 4], "axis": 0, "set": "tuned", "ours_Bps": 1.8e12,
         "fraction_of_copy": 0.9, "target": 0.85, "torch_Bps": 1.9e12, "cupy_Bps": 1e12},
        {"shape": [4, 8], "axis": 1, "set": "tuned", "ours_Bps": 1.8e12,
         "fraction_of_copy": 0.9, "target": 0.85, "torch_Bps": 1.7e12, "cupy_Bps": None},
        {"shape": [3, 5, 7], "axis": 2, "set": "held-out", "ours_Bps": 1.2e12,
         "fraction_of_copy": 0.6, "target": 0.7, "torch_Bps": 1.0e12, "cupy_Bps": None}],
    "gemm": [{"size": 8, "blas": "scikit-cuda", "ours_ms": 1.0, "bare_ms": 0.97,
              "torch_ms": 1.0, "fraction_of_bare": 0.97}],
    "mxb": {"n": 8, "iters": 10, "ours_s": 1.1, "bare_s": 1.0, "ratio": 1.1, "numpy_s": 5.0},
    "checks": [{"what": "axpby", "errors": {"ours": 1e-7, "torch": 1e-7}, "tol": 1e-5,
                "ok": True},
               {"what": "sum_t", "errors": {"ours": 1e-7, "torch": 1e-2}, "tol": 1e-4,
                "ok": False}],
}
STREAMS = {"rows": [
    {"batch": 16, "hidden": 256, "one_group_us": 10.0, "four_groups_us": 10.6,
     "speedup": 10 / 10.6, "torch_one_stream_us": 10.0, "torch_four_streams_us": 20.0,
     # captured: within 2%, but the GPU is partly idle (a wide gemm gains 2x) and 4 groups
     # do not reach 1.3x
     "one_group_captured_us": 8.0, "four_groups_captured_us": 8.1, "wide_captured_us": 4.0,
     "speedup_captured": 8 / 8.1, "idle_gain": 2.0, "partly_idle": True,
     "torch_graphed_one_us": 9.0, "torch_graphed_four_us": 9.5},
    {"batch": 16, "hidden": 4096, "one_group_us": 100.0, "four_groups_us": 70.0,
     "speedup": 100 / 70, "torch_one_stream_us": None, "torch_four_streams_us": None,
     # captured: not partly idle (gain 1.05 is not above 1.05), so no 1.3x target here
     "one_group_captured_us": 100.0, "four_groups_captured_us": 99.0, "wide_captured_us": 95.2,
     "speedup_captured": 100 / 99, "idle_gain": 100 / 95.2, "partly_idle": False,
     "torch_graphed_one_us": None, "torch_graphed_four_us": None}],
    "checks": [{"what": "dW", "errors": {"ours": 0.0}, "tol": 1e-4, "ok": True}]}
UPLOAD = {"seconds": {"a": 1.0, "b": 0.105, "c": 0.3, "d": 0.1, "e": 1.0, "f": 0.2},
          "up_s": 0.01, "gemm_s": 0.005, "down_s": 0.01, "host_copy_s": 0.02}
TRAIN = {"device": "Test GPU", "models": {"mlp": {
    "config": {"batch": 4}, "samples": 4,
    "ours": {"ms": spread([1.0, 0.9, 1.1]), "samples_per_s": 4000.0,
             "host_issue_ms": 0.9, "device_ms": 0.8},
    "torch": {"PyTorch eager": {"ms": 2.0, "samples_per_s": 2000.0, "host_issue_ms": 0.5,
                                "device_ms": 1.9},
              "PyTorch eager, graphed": {"ms": 0.7, "samples_per_s": 5700.0,
                                         "host_issue_ms": 0.004, "device_ms": 0.7}},
    "breakdown_ms": {"gemm": 0.5, "update": 0.1}, "breakdown_serial_ms": 0.6,
    # captured 0.5 ms <= 0.80 x 0.7 ms; replay host 5 us <= 10 us: both hold
    "ops_per_step": 29,
    "ours_captured": {"ms": 0.5, "samples_per_s": 8000.0, "host_issue_ms": 0.005,
                      "device_ms": 0.5},
    # issue 42: captured 0.5 ms against the fastest of 0.7 (graphed), 0.6 and 0.4 (JAX): misses
    "peers": {"torch.compile, graphed": {"ms": 0.6, "samples_per_s": 6700.0, "compile_s": 9.0},
              "JAX jit": {"ms": 0.4, "samples_per_s": 10000.0, "compile_s": 2.0}},
    "peer_notes": {}}, "lstm": {
    "config": {"T": 2}, "samples": 4, "ops_per_step": 921,
    "ours": {"ms": 5.0, "samples_per_s": 800.0},
    # judged against the faster graphed cell (2.0 ms), not cuDNN's LSTM: 1.5x misses
    # 0.90x; replay host 40 us misses 10 us
    "ours_captured": {"ms": 3.0, "samples_per_s": 1333.0, "host_issue_ms": 0.04,
                      "device_ms": 3.0},
    "ours_unfused": {"ms": 9.0, "samples_per_s": 444.0},   # 5.0 / 9.0 = 0.56x misses 0.5x
    "torch": {"PyTorch eager, graphed": {"ms": 3.5, "samples_per_s": 1143.0},
              "nn.LSTMCell loop, graphed": {"ms": 2.0, "samples_per_s": 2000.0},
              "torch.nn.LSTM (cuDNN)": {"ms": 3.2, "samples_per_s": 1250.0},
              "torch.nn.LSTM (cuDNN), graphed": {"ms": 1.0, "samples_per_s": 4000.0}}}}}
MXB = {"n": 8, "iters": 10, "dtype": "float32", "target_numpy_ratio": 1.1,
       "rows": [{"handler": "plain NumPy", "seconds": spread([1.0, 1.0]), "ratio_to_numpy": 1.0},
                {"handler": "NumpyHandler", "seconds": spread([1.2, 1.2]),
                 "ratio_to_numpy": 1.2}],
       "checks": [{"what": "y", "errors": {"NumpyHandler": 0.0}, "tol": 1e-3, "ok": True}]}
CONV = {"reductions": [{"op": "sum_t (0, 2, 3) [bias gradient]", "fraction_of_copy": 0.9,
                        "ours_Bps": 3.6e12, "torch_Bps": 4.0e12, "target": 0.85},
                       {"op": "max_t axis 0", "fraction_of_copy": 0.2, "ours_Bps": 0.8e12,
                        "torch_Bps": 1.0e12, "target": None}],
        "conv": [{"net": "LeNet-style", "torch_over_ours": 1.2},
                 {"net": "ResNet", "torch_over_ours": 0.9}],
        "step": {"ratios": {"ours": 1.1, "ours, captured": 0.9}},
        "adam": {"fraction_of_copy": 0.86}}
FUSION = {"fraction_of_copy": {"ours fused": 0.8, "ours chain": 0.1, "torch": 0.5}}
HALF = {"elementwise": [{"op": "add_tt", "fraction_of_copy": 0.9, "target": 0.85},
                        {"op": "sigmoid", "fraction_of_copy": 0.8, "target": 0.85}],
        "dot_mm": [{"n": 1024, "torch_over_ours": 1.1, "target": 0.95},
                   {"n": 4096, "torch_over_ours": 0.9, "target": 0.95}],
        "sum_t": [{"shape": [8, 4], "axis": 0, "fraction_of_copy": 0.75, "target": 0.7}],
        "mlp_step": {"over_f32": 1.5, "over_torch_autocast": 1.2,
                     "targets": {"over_f32": 2.0, "over_torch": 1.0}}}
DP = {"models": {"mlp": {"scaling": 1.9, "scaling_bound": 1.98, "vs_ddp": 1.02},
                 "lstm": {"scaling": 1.7, "vs_ddp": 0.9}},
      "checks": [{"what": "mlp one step, 2 GPUs", "ok": True},
                 {"what": "lstm one step, 2 GPUs", "ok": False}]}
def _reduction(op, shape, axis, speed, frac=0.5, mb=1, which="random", target=None):
    return {"set": which, "op": op, "shape": shape, "axis": axis, "input_bytes": mb << 20,
            "ours_ms": spread([1.0]), "torch_ms": spread([speed]), "cupy_ms": None,
            "ours_Bps": spread([1e12]), "fraction_of_copy": frac, "speed_vs_torch": speed,
            "speed_vs_cupy": None, "target": target}


REDUCTIONS = {
    "seed": 7, "copy_Bps": 3e12,
    "random": {"seed": 7, "cases": [   # one case at 0.9x torch; median 1.2x; above 64 MB 77.5%
        _reduction("sum_t", [4, 5], [0, 1], 1.2, 0.85, 100),
        _reduction("max_t", [9], None, 0.9, 0.7, 80),
        _reduction("argmax_t", [3, 7], 1, 1.3, 0.5, 1)]},
    "fixed": [_reduction("max_t", [8, 4], 0, 1.05, which="conv", target=1.0),
              _reduction("min_t", [8, 4], 1, 0.97, which="conv", target=1.0),   # < 1.0x
              _reduction("sum_t", [5, 9], 1, 0.96, which="regression", target=0.95),
              {"set": "regression", "op": "mean_t", "shape": [3, 3], "axis": 1,
               "input_bytes": 36, "target": 0.95, "error": "RuntimeError: boom"}],
    "fused": [{"op": "softmax_m", "shape": [8, 4], "bytes": 256, "ms": {"ours": spread([1.0])},
               "fraction_of_copy": {"ours": 0.5}, "compile_s": None, "notes": {},
               "speed_vs_torch": None, "speed_vs_compiled": None}],
    "checks": [{"what": "sum_t", "errors": {"ours": 0.0}, "tol": 1e-5, "ok": True}]}

# the f32 step at 1.1x torch.compile graphed (a miss), bf16 at 0.9x JAX (holds);
# attention at 0.8x the fastest SDPA backend (a miss)
GPT = {"steps": {"f32": {"ms": {"ours": spread([3.0]), "ours, captured": spread([2.2]),
                                "torch.compile, graphed": spread([2.0]),
                                "JAX jit": spread([2.5])}},
                 "bf16": {"ms": {"ours, captured": spread([0.9]), "JAX jit": spread([1.0])}}},
       "attention": {"ms": {"ours": spread([1.0]), "torch SDPA math": spread([2.0]),
                            "torch SDPA efficient_attention": spread([0.8])}},
       "checks": [{"what": "gpt f32 first two losses", "ok": True}]}

SUITE_RESULTS = {"ops": OPS, "reductions": REDUCTIONS, "streams": STREAMS, "upload": UPLOAD,
                 "train": TRAIN, "mxb": MXB, "conv": CONV, "fusion": FUSION, "half": HALF,
                 "gpt": GPT, "dp": DP}


def write_run(runs_dir, suite, results, date="2026-01-02T03:04:05+00:00",
              fingerprint=FINGERPRINT, commit="c0ffee" * 6, device="Test GPU", stamp="1"):
    """One run file as ``Run.save`` writes it."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    prov = {"commit": commit, "dirty": False, "code_fingerprint": fingerprint, "date": date,
            "platform": "test", "python": "3", "cpu": "cpu", "cpu_count": 2,
            "versions": {"numpy": "2", "torch": "2.11"},
            "gpu": {"name": device, "driver_version": "580"},
            "clocks_before": {"clocks.sm": "1980"}, "clocks_after": {"clocks.sm": "1755"}}
    path = runs_dir / f"{suite}-{device.replace(' ', '-')}-{stamp}.json"
    path.write_text(json.dumps({"suite": suite, "device": device, "options": {},
                                "provenance": prov, "results": results}), encoding="utf-8")
    return path


@pytest.fixture
def results(tmp_path):
    for suite, res in SUITE_RESULTS.items():
        write_run(tmp_path / "runs", suite, res)
    (tmp_path / "runs" / "notes.json").write_text("{}", encoding="utf-8")   # not a run
    return tmp_path


def chosen_of(folder):
    return saved.choose(saved.load(folder / "runs"), fingerprint=FINGERPRINT)


def test_verdicts_of_known_results(results):
    chosen = chosen_of(results)
    assert set(chosen) == set(report.SUITES)
    got = report.verdicts({s: chosen[s][1] for s in chosen})
    by = {(v["suite"], " ".join(v["target"].split()[:2])): (v["met"], v["total"]) for v in got}
    assert by["ops", "ours and"] == (1, 2)              # the sum_t check failed
    assert by["streams", "ours and"] == (1, 1)
    assert by["ops", "host overhead"] == (1, 2)
    assert by["ops", "elementwise bandwidth"] == (1, 1)
    assert by["ops", "sum_t (tuned"] == (1, 2)          # the slower-than-torch case fails
    assert by["ops", "sum_t (held-out"] == (0, 1)       # 60% < 70%
    assert by["ops", "dot_add_mm >="] == (1, 1)
    assert by["ops", "resident m·x+b"] == (0, 1)        # 1.1x > 1.05x
    assert by["streams", "four groups"] == (1, 2)       # 10.6 us against 10.0: > 5% slower
    assert by["streams", ">= 1.3x"] == (1, 2)
    assert by["streams", "captured: four"] == (2, 2)   # 8.1 against 8.0: within 2%
    assert by["streams", "captured: >="] == (0, 1)     # the one partly idle cell: 0.99x
    assert by["train", "MLP captured"] == (1, 1)
    assert by["train", "MLP host"] == (1, 1)
    assert by["train", "MLP against"] == (0, 1)
    strongest = next(v for v in got if "fastest of" in v["target"])
    assert "1.250x JAX jit (0.400 ms)" in strongest["result"]
    # the LSTM has no peers here; the other two are the gpt suite's steps
    assert sum("fastest of" in v["target"] and v["suite"] == "train" for v in got) == 1
    assert by["train", "LSTM captured"] == (0, 1)
    assert "nn.LSTMCell loop, graphed" in next(
        v["result"] for v in got if v["target"].startswith("LSTM captured"))
    assert by["train", "LSTM host"] == (0, 1)
    assert by["train", "LSTM eager"] == (0, 1)
    cudnn = {v["target"]: v["met"] for v in got if "cuDNN's" in v["target"]}
    assert cudnn == {"LSTM captured <= 1.0x cuDNN's torch.nn.LSTM eager": 1,     # 3.0 <= 3.2
                     "LSTM captured <= 1.0x cuDNN's torch.nn.LSTM graphed (stretch)": 0}
    assert by["upload", "(b) prefetch"] == (1, 1)       # 0.105 <= 1.10 x B = 0.11
    assert by["upload", "(c) prefetch"] == (0, 1)       # 0.3 > 1.25 x max(0.1, 10 x 0.02)
    assert by["upload", "(b) and"] == (1, 2)           # (b) 0.105 < (f) 0.2 < (c) 0.3
    assert by["mxb", "ours and"] == (1, 1)
    assert by["mxb", "NumpyHandler <="] == (0, 1)       # 1.2x > 1.10x
    assert by["conv", "conv bias"] == (0, 1)            # 90% of copy but slower than torch
    assert by["conv", "conv2d forward"] == (1, 2)       # 0.9x < 0.95x
    assert by["conv", "Adam's update"] == (1, 1)
    assert by["conv", "conv-net training"] == (1, 2)
    assert by["fusion", "a fused"] == (0, 1)            # 80% < 85%
    assert by["reductions", "ours and"] == (1, 1)
    assert by["reductions", "every random"] == (2, 3)      # max_t at 0.9x < 0.95x
    assert by["reductions", "median random"] == (1, 1)     # 1.2x >= 1.1x
    assert by["reductions", "large random"] == (0, 1)      # median of 85% and 70% < 80%
    assert by["reductions", "conv-suite reductions"] == (1, 2)   # 0.97x < 1.0x
    assert by["reductions", "issue 41's"] == (1, 2)        # the mean_t row raised
    assert by["half", "bfloat16 elementwise"] == (1, 2)  # sigmoid 80% < 85%
    assert by["half", "bfloat16 dot_mm"] == (1, 2)       # 0.9x < 0.95x
    assert by["half", "bfloat16 sum_t"] == (1, 1)
    assert by["half", "MLP step"] == (1, 2)              # 1.5x < 2x our float32 step
    gpt = [v for v in got if v["suite"] == "gpt"]
    assert [(v["met"], v["total"]) for v in gpt] == [(1, 1), (0, 1), (1, 1), (0, 1)]
    assert "1.100x torch.compile, graphed" in gpt[1]["result"]
    assert "0.800x torch SDPA efficient_attention" in gpt[3]["result"]
    assert "not judged" in gpt[3]["result"]       # timed as issued, not replayed
    assert by["dp", "ours and"] == (1, 2)                # the LSTM check failed
    assert by["dp", "2 GPUs"] == (1, 2)                  # the LSTM's 1.7x < 1.85x
    assert by["dp", "ours on"] == (1, 2)                 # the LSTM's 0.9x DDP < 1.0x
    assert "mlp 1.900x (compute allows 1.980x)" in next(
        v["result"] for v in got if v["target"].startswith("2 GPUs"))


def test_launch_bound_needs_host_issue_above_device_time():
    models = TRAIN["models"]["mlp"]
    assert report.launch_bound(saved.medians(models["ours"])) == "launch-bound"   # 0.9 > 0.8
    assert report.launch_bound(models["torch"]["PyTorch eager"]) == "device-bound"
    assert report.launch_bound({"ms": 1.0}) is None


def test_upload_bound_recovers_the_iterations():
    u = report.upload_numbers(UPLOAD)
    assert u["iters"] == 10 and u["bound"] == 0.1 and u["host_bound"] == pytest.approx(0.2)


def test_upload_against_pinned_staging_is_a_headline_row():
    # (c) against PyTorch's loop through pinned staging (g), where (g) ran
    def verdict(g):
        got = report.verdicts({"upload": {"results": dict(
            UPLOAD, seconds=dict(UPLOAD["seconds"], g=g))}})
        return next(v for v in got if "(g)" in v["target"])
    slower, faster = verdict(0.25), verdict(0.4)   # (c) takes 0.3
    assert (slower["met"], slower["total"]) == (0, 1)
    assert slower["ratio"] == pytest.approx(1.2) and slower["sense"] == "time"
    assert (faster["met"], faster["total"]) == (1, 1)
    assert faster["result"] == "0.75x the time of (g)"
    got = report.verdicts({"upload": {"results": UPLOAD}})   # no (g): no such verdict
    assert not any("(g)" in v["target"] for v in got)


def test_attention_timed_as_issued_is_shown_but_not_judged():
    # ours 1.5x the fastest backend's speed, but neither side replayed from a
    # graph: PyTorch's host may be what was timed, so no verdict holds
    att = {"ms": {"ours": spread([0.4]), "torch SDPA flash_attention": spread([0.6])}}
    got = report.verdicts({"gpt": {"results": {"attention": att}}})
    v = next(v for v in got if v["target"].startswith("attention"))
    assert (v["met"], v["total"]) == (0, 1) and v["unjudged"] == "host-timed"
    assert v["ratio"] == pytest.approx(1.5)
    chosen = {"gpt": (None, {"results": {"attention": att}})}
    table = report.headline_table(chosen)
    assert "1.50x the speed, host-timed" in table and ">= 0.95x: not judged" in table


def test_bias_rows_show_their_bound_where_measured():
    row = {"shape": [64, 128, 32, 32], "axis": [0, 2, 3], "fraction_of_copy": 0.64,
           "target": 0.7, "ours_Bps": spread([2.5e12]),
           "read_only_Bps": spread([2.5e12, 2.6e12, 2.7e12]),
           "copy_same_bytes_Bps": spread([1.9e12, 2.0e12, 2.1e12])}

    def result(r):
        return report.half_verdicts(dict({"copy_Bps": 4e12, "sum_t": [row]}, **r))[0]
    verdict = result({})
    assert "a read-only kernel over the same input: 65.0%" in verdict["result"]
    assert "copies" not in verdict["result"]
    assert verdict["met"] == 0 and verdict["total"] == 1
    # older runs measured copies moving the same bytes instead
    del row["read_only_Bps"]
    assert "copies moving the same bytes: 50.0%" in result({})["result"]
    # runs from before either was measured, or without a copy figure, show none
    assert "same" not in result({"copy_Bps": None})["result"]
    del row["copy_same_bytes_Bps"]
    assert "same" not in result({})["result"]


def test_combine_takes_the_median_across_runs_with_its_range():
    runs = [{"a": spread([1, 2, 3]), "r": 0.5, "ok": True, "n": 8, "name": "x",
             "rows": [{"v": 1.0}, {"v": 4.0}]},
            {"a": spread([5, 6, 7]), "r": 0.7, "ok": False, "n": 8, "name": "y",
             "rows": [{"v": 3.0}, {"v": 2.0}]},
            {"a": spread([2, 3, 4]), "r": 0.9, "ok": True, "n": 8, "name": "z",
             "rows": [{"v": 2.0}, {"v": 6.0}]}]
    c = saved.combine(runs)
    assert (c["a"]["median"], c["a"]["run_min"], c["a"]["run_max"]) == (3, 2, 6)
    assert (c["a"]["min"], c["a"]["max"], c["a"]["n"], c["a"]["runs"]) == (1, 7, 9, 3)
    assert (c["r"]["median"], saved.run_range(c["r"])) == (0.7, (0.5, 0.9, 3))
    assert c["ok"] is False and c["n"] == 8 and c["name"] == "z"   # newest run's text
    assert [r["v"]["median"] for r in c["rows"]] == [2.0, 4.0]
    m = saved.medians(c)
    assert m["a"] == 3 and m["rows"][1]["v"] == 4.0
    assert report._ranged(c["r"], ".0%") == "70% (50-90%)"
    assert report._ranged(0.25, ".2f") == "0.25"


def test_choose_prefers_runs_of_the_current_code(tmp_path):
    runs_dir = tmp_path / "runs"
    old = copy.deepcopy(OPS)
    old["mxb"]["ratio"] = 9.0
    write_run(runs_dir, "ops", old, fingerprint="0" * 16, stamp="a",
              date="2026-03-01T00:00:00+00:00")       # newest, but other code
    for i, ratio in enumerate((1.0, 1.2, 1.1)):
        res = copy.deepcopy(OPS)
        res["mxb"]["ratio"] = ratio
        write_run(runs_dir, "ops", res, stamp=f"b{i}", date=f"2026-01-0{i + 1}T00:00:00+00:00")
    key, p = saved.choose(saved.load(runs_dir), fingerprint=FINGERPRINT)["ops"]
    assert key == "Test-GPU" and p["status"]["current"] and p["status"]["runs"] == 3
    assert p["results"]["mxb"]["ratio"] == 1.1
    assert saved.run_range(p["combined"]["mxb"]["ratio"]) == (1.0, 1.2, 3)


def test_stale_runs_are_reported_as_stale(tmp_path):
    write_run(tmp_path / "runs", "ops", OPS, fingerprint="0" * 16)
    chosen = chosen_of(tmp_path)
    st = chosen["ops"][1]["status"]
    assert not st["current"] and st["runs"] == 1
    assert saved.stale_text(st).startswith("STALE")
    text = report.rst_report(chosen)
    assert ".. warning:: The results of ops are stale" in text and "STALE" in text


def test_commits_since_counts_code_commits():
    head = provenance.git_state()[0]
    if head is None or os.environ.get("STREAMHANDLERS_GIT_COMMIT"):
        pytest.skip("no git checkout of the measured commit here")
    assert provenance.commits_since(head) == 0
    assert provenance.commits_since("not-a-commit") is None


def test_fingerprint_changes_with_the_code(tmp_path):
    (tmp_path / "handlers").mkdir()
    (tmp_path / "handlers" / "a.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "r.py").write_text("ignored\n")
    first = provenance.code_fingerprint(tmp_path)
    (tmp_path / "benchmarks" / "results" / "r.py").write_text("still ignored\n")
    assert provenance.code_fingerprint(tmp_path) == first
    (tmp_path / "handlers" / "a.py").write_text("x = 2\n")
    assert provenance.code_fingerprint(tmp_path) != first


def _git(root, *args):
    import subprocess
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"git unavailable here: {done.stderr.strip()[:200]}")
    return done.stdout.strip()


@pytest.fixture
def code_repo(tmp_path):
    """A git repository holding measured code (handlers/a.py, handlers/k.cu)
    at one commit; returns (root, commit)."""
    (tmp_path / "handlers").mkdir()
    (tmp_path / "handlers" / "a.py").write_text(
        '"""A module."""\n\n\ndef f(x):\n    """Twice x."""\n    return 2 * x  # double\n')
    (tmp_path / "handlers" / "k.cu").write_text("// a kernel\nint k;\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "code")
    return tmp_path, _git(tmp_path, "rev-parse", "HEAD")


def test_docs_only_since_sees_through_docstrings_and_comments(code_repo):
    root, commit = code_repo
    a = root / "handlers" / "a.py"
    assert saved.docs_only_since(commit, root) is True          # nothing changed
    a.write_text('"""Another text."""\n\n\ndef f(x):\n    return 2 * x  # twice\n')
    assert saved.docs_only_since(commit, root) is True
    a.write_text('"""A module."""\n\n\ndef f(x):\n    return 3 * x\n')
    assert saved.docs_only_since(commit, root) is False         # the code itself
    a.write_text('"""A module."""\n\n\ndef f(x):\n    return 2 * x\n')
    (root / "handlers" / "k.cu").write_text("// the kernel\nint k;\n")
    assert saved.docs_only_since(commit, root) is False         # C and CUDA: any byte
    (root / "handlers" / "k.cu").write_text("// a kernel\nint k;\n")
    (root / "handlers" / "b.py").write_text("y = 1\n")
    assert saved.docs_only_since(commit, root) is False         # a new file
    assert saved.docs_only_since("not-a-commit", root) is None
    assert saved.docs_only_since(None, root) is None


def test_runs_stay_current_across_a_docstring_change(code_repo):
    root, commit = code_repo
    measured = provenance.code_fingerprint(root)
    write_run(root / "runs", "ops", OPS, fingerprint=measured, commit=commit)
    a = root / "handlers" / "a.py"
    a.write_text(a.read_text().replace("Twice x.", "x, doubled."))
    st = saved.choose(saved.load(root / "runs"), root=root)["ops"][1]["status"]
    assert st["current"] and st["docs_only"]
    assert saved.stale_text(st) == "current (docstrings and comments changed since)"
    a.write_text(a.read_text().replace("2 * x", "x + x"))
    st = saved.choose(saved.load(root / "runs"), root=root)["ops"][1]["status"]
    assert not st["current"] and saved.stale_text(st).startswith("STALE")


def test_rst_report_states_every_verdict(results):
    text = report.rst_report(chosen_of(results))
    assert "Test GPU" in text and "2026-01-02" in text and "c0ffeec0ff" in text
    assert "NO (1 of 2)" in text and "yes (1 of 1)" in text
    assert "These do not:" in text and "current" in text and "warning" not in text
    assert ".. note:: The plot ``ops-Test-GPU-bandwidth.png`` has not been generated" in text


def test_table_cells_are_taken_literally():
    """Labels from the runs (``mul_ + add_``, ``x*y``, ``(b) ...``) render as
    their own text, not as link targets, emphasis or list markers."""
    core = pytest.importorskip("docutils.core", reason="docutils comes with the docs extra")
    labels = ["mul_ + add_ (2 kernels)", "x*y and `z`", "(b) prefetch", "a|b\\c"]
    rst = report._table(["label", "n"], [[label, 1] for label in labels])
    # halt_level 2: any docutils warning (an unknown link target) raises.
    body = core.publish_parts(rst, writer_name="html",
                              settings_overrides={"halt_level": 2, "report_level": 5})["body"]
    for label in labels:
        escaped = label.replace("&", "&amp;").replace("<", "&lt;")
        assert escaped in body, (label, body)


def test_write_docs_copies_existing_plots(results, tmp_path_factory, monkeypatch):
    monkeypatch.setattr(provenance, "code_fingerprint", lambda root=None: FINGERPRINT)
    (results / "streams-Test-GPU.png").write_bytes(b"\x89PNG fake")
    out = tmp_path_factory.mktemp("generated")
    text = report.write_docs(out, results).read_text(encoding="utf-8")
    assert (out / "streams-Test-GPU.png").exists()
    assert f".. figure:: /{out.name}/streams-Test-GPU.png" in text


def test_committed_results_report():
    runs = saved.load(RESULTS_DIR / "runs")
    if not runs:
        pytest.skip("no committed runs")
    chosen = saved.choose(runs)
    vs = report.verdicts({s: chosen[s][1] for s in chosen})
    assert vs and all(0 <= v["met"] <= v["total"] for v in vs)
    assert report.headline(chosen)
    assert ".. list-table::" in report.rst_report(chosen)
    for _, p in chosen.values():    # every committed run says where it came from
        for run in p["runs"]:
            prov = run["provenance"]
            assert prov["commit"] and prov["code_fingerprint"] and prov["gpu"]["name"]
            assert "clocks_before" in prov and "clocks_after" in prov


def test_report_writes_plots(results, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(provenance, "code_fingerprint", lambda root=None: FINGERPRINT)
    assert cli.main(["report", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    for name in ("ops-Test-GPU-bandwidth.png", "mxb-Test-GPU.png", "streams-Test-GPU.png",
                 "upload-Test-GPU.png", "train-Test-GPU.png"):
        assert (results / name).read_bytes()[:4] == b"\x89PNG", name
        assert name in out
    assert "MISSED" in out and "headline" in out and "current" in out


def test_report_without_results(tmp_path, capsys):
    assert report.main(["--results", str(tmp_path)]) == 0
    assert "no runs" in capsys.readouterr().out


def test_commit_from_environment_and_dirty_from_fingerprint(monkeypatch):
    fp = provenance.code_fingerprint()
    monkeypatch.setenv("STREAMHANDLERS_GIT_COMMIT", "abc123")
    monkeypatch.setenv("STREAMHANDLERS_CODE_AT_COMMIT", fp)
    assert provenance.git_state() == ("abc123", False)
    monkeypatch.setenv("STREAMHANDLERS_CODE_AT_COMMIT", "f" * 16)
    assert provenance.git_state() == ("abc123", True)
    monkeypatch.delenv("STREAMHANDLERS_CODE_AT_COMMIT")
    assert provenance.git_state() == ("abc123", None)


def test_strongest_peer_verdicts_of_conv_and_half():
    """Issue 42's target judged the same way in every suite: the captured
    step against the fastest "graphed" row or compiled peer, never ours."""
    from benchmarks import peers
    step = {"ms": {"ours": 1.0, "ours, captured": 0.30, "PyTorch eager": 2.0,
                   "PyTorch graphed": 0.40},
            "ratios": {"ours": 2.0, "ours, captured": 1.33},
            "peers": {"torch.compile": {"ms": 0.9}, "torch.compile, graphed": {"ms": 0.25},
                      "JAX jit": {"ms": 0.5}}}
    conv = next(v for v in report.conv_verdicts({"step": step}) if "fastest of" in v["target"])
    assert (conv["met"], conv["total"]) == (0, 1)
    assert "1.200x torch.compile, graphed (0.250 ms)" in conv["result"]
    mlp = {"ms": {"ours mixed bf16": 2.5, "ours mixed bf16, captured": 1.7,
                  "ours f32": 20.0, "torch autocast bf16": 3.0,
                  "torch autocast bf16, graphed": 2.2},
           "over_f32": 8.0, "over_torch_autocast": 1.2, "mode": "mixed",
           "targets": {"over_f32": 2.0, "over_torch": 1.0},
           "peers": {"torch.compile, graphed": {"ms": 1.8}, "JAX jit": {"ms": 2.0}}}
    half = next(v for v in report.half_verdicts({"mlp_step": mlp}) if "fastest of" in v["target"])
    assert (half["met"], half["total"]) == (1, 1)
    assert "0.944x torch.compile, graphed" in half["result"]
    # the same judgment the suites print
    got = peers.judge_strongest("x", 1.7, {k: v if isinstance(v, float) else v["ms"]
                                           for k, v in {**mlp["ms"], **mlp["peers"]}.items()})
    assert got["peer"] == "torch.compile, graphed" and got["met"]
    assert peers.strongest({"ours, captured": 0.1, "torch.compile": 0.1}) == {}


def test_fused_rows_judged_on_copy_and_both_peers():
    """Issue 41's fused target: a row holds only at >= 85% of copy and
    faster than both PyTorch eager and torch.compile; softmax_m alone and
    rows without both peers are not judged."""
    def row(op, frac, eager, compiled):
        return {"op": op, "shape": [8192, 4096], "fraction_of_copy": {"ours": frac},
                "speed_vs_torch": eager, "speed_vs_compiled": compiled}
    fused = [row("softmax_m", 0.5, 0.5, 0.5),
             row("LayerNorm forward", 0.86, 1.2, 1.01),       # holds
             row("LayerNorm backward", 0.86, 1.2, 0.99),      # slower than compiled
             row("softmax + cross-entropy, forward + gradient", 0.84, 2.0, 1.3),   # copy
             {**row("LayerNorm forward", 0.9, 1.1, 1.1), "speed_vs_compiled": None}]
    got = [v for v in report.reductions_verdicts({"fused": fused}) if "fused" in v["target"]]
    assert len(got) == 1 and (got[0]["met"], got[0]["total"]) == (1, 3)
    assert "LayerNorm backward (8192, 4096) 86.0% (1.20x eager, 0.99x compiled)" \
        in got[0]["result"]
    assert "softmax_m" not in got[0]["result"]
    assert report.reductions_verdicts({"fused": fused[:1]}) == []


def test_mlp_gemm_ratio_judged_on_graph_replays_alone(tmp_path):
    """Issue 42's MLP-against-its-gemms target is judged only from a run
    whose breakdown replayed the gemms from a graph (earlier runs re-issued
    them eagerly, host gaps included): captured 0.5 ms over gemms 0.5 ms
    holds 1.10x, over 0.4 ms (1.25x) misses."""
    import copy

    def gemm_verdicts(folder, replay, gemm):
        train = copy.deepcopy(TRAIN)
        mlp = train["models"]["mlp"]
        mlp["breakdown_ms"]["gemm"] = gemm
        if replay:
            mlp["breakdown_replay"] = replay
        write_run(tmp_path / folder / "runs", "train", train)
        got = report.verdicts({"train": chosen_of(tmp_path / folder)["train"][1]})
        return [v for v in got if "its gemms" in v["target"]]

    assert gemm_verdicts("old", "", 0.5) == [] and gemm_verdicts("eager", "eager", 0.5) == []
    held, = gemm_verdicts("held", "graph", 0.5)
    assert (held["met"], held["total"]) == (1, 1) and "1.000x (0.500 ms)" in held["result"]
    assert held["target"] == f"MLP captured <= {report.GEMM_RATIO:.2f}x its gemms replayed alone"
    missed, = gemm_verdicts("missed", "graph", 0.4)
    assert missed["met"] == 0 and "1.250x (0.400 ms)" in missed["result"]
