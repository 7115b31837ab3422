"""``python -m benchmarks report``: verdicts, tables and plots from saved results.

Runs on the committed ``benchmarks/results/*.json`` and on small made-up
results whose verdicts are known.  No benchmark is run and no GPU is needed.
"""
import copy
import json

import pytest

from benchmarks import __main__ as cli
from benchmarks import report
from benchmarks.common import RESULTS_DIR

MACHINE = {"platform": "test", "python": "3", "cpu": "cpu", "cpu_count": 2, "numpy": "2",
           "gpu": "Test GPU", "date": "2026-01-02T03:04:05+00:00"}
OPS = {
    "gpu": "Test GPU",
    "overhead": [{"op": "axpby", "skcuda_us": 7.0, "nvmath_us": None, "torch_us": 10.0,
                  "cupy_us": 9.0, "ratio_to_torch": 0.7},
                 {"op": "relu", "skcuda_us": 9.0, "nvmath_us": None, "torch_us": 10.0,
                  "cupy_us": 9.0, "ratio_to_torch": 0.9}],
    "copy_Bps": 2e12,
    "bandwidth": [{"op": "axpby", "n": 8, "ours_Bps": 1.9e12, "fraction_of_copy": 0.95,
                   "torch_Bps": 1.5e12, "cupy_Bps": None}],
    "sum_t": [  # meets its fraction but is slower than torch: does not hold
        {"shape": [8, 4], "axis": 0, "ours_Bps": 1.8e12, "fraction_of_copy": 0.9,
         "target": 0.85, "torch_Bps": 1.9e12, "cupy_Bps": 1e12},
        {"shape": [4, 8], "axis": 1, "ours_Bps": 1.8e12, "fraction_of_copy": 0.9,
         "target": 0.85, "torch_Bps": 1.7e12, "cupy_Bps": None}],
    "gemm": [{"size": 8, "blas": "scikit-cuda", "ours_ms": 1.0, "bare_ms": 0.97,
              "torch_ms": 1.0, "fraction_of_bare": 0.97}],
    "mxb": {"n": 8, "iters": 10, "ours_s": 1.1, "bare_s": 1.0, "ratio": 1.1, "numpy_s": 5.0},
}
STREAMS = [{"batch": 16, "hidden": 256, "one_group_us": 10.0, "four_groups_us": 10.6,
            "speedup": 10 / 10.6, "torch_one_stream_us": 10.0, "torch_four_streams_us": 20.0},
           {"batch": 16, "hidden": 4096, "one_group_us": 100.0, "four_groups_us": 70.0,
            "speedup": 100 / 70, "torch_one_stream_us": None, "torch_four_streams_us": None}]
UPLOAD = {"seconds": {"a": 1.0, "b": 0.105, "c": 0.3, "d": 0.1, "e": 1.0, "f": 0.2},
          "up_s": 0.01, "gemm_s": 0.005, "down_s": 0.01, "host_copy_s": 0.02, "max_error": 0.0}
TRAIN = {"device": "Test GPU", "models": {"mlp": {
    "config": {"batch": 4}, "samples": 4,
    "ours": {"ms": 1.0, "samples_per_s": 4000.0, "host_ms": 0.5},
    "torch": {"PyTorch eager": {"ms": 2.0, "samples_per_s": 2000.0}},
    "breakdown_ms": {"gemm": 0.5, "update": 0.1}, "breakdown_serial_ms": 0.6}}}


@pytest.fixture
def results(tmp_path):
    for suite, res in (("ops", OPS), ("streams", STREAMS), ("upload", UPLOAD),
                       ("train", TRAIN)):
        (tmp_path / f"{suite}-Test-GPU.json").write_text(
            json.dumps({"machine": MACHINE, "results": res}), encoding="utf-8")
    (tmp_path / "mxb-somewhere.json").write_text("{}", encoding="utf-8")   # not reported
    return tmp_path


def test_verdicts_of_known_results(results):
    found = report.load(results)
    assert list(found) == ["Test-GPU"] and set(found["Test-GPU"]) == set(report.SUITES)
    got = {v["target"]: (v["met"], v["total"]) for v in report.verdicts(found["Test-GPU"])}
    by_start = {k.split(" ")[0] + " " + k.split(" ")[1]: v for k, v in got.items()}
    assert by_start["host overhead"] == (1, 2)
    assert by_start["elementwise bandwidth"] == (1, 1)
    assert by_start["sum_t >="] == (1, 2)            # the slower-than-torch case fails
    assert by_start["dot_add_mm >="] == (1, 1)
    assert by_start["resident m·x+b"] == (0, 1)      # 1.1x > 1.05x
    assert by_start["four groups"] == (1, 2)         # 10.6 us against 10.0 is more than 5% slower
    assert by_start[">= 1.3x"] == (1, 2)
    assert by_start["(b) prefetch"] == (1, 1)        # 0.105 <= 1.10 x B = 0.11
    assert by_start["(c) prefetch"] == (0, 1)        # 0.3 > 1.25 x max(0.1, 10 x 0.02)
    assert by_start["(b) and"] == (1, 2)            # (b) 0.105 < (f) 0.2 < (c) 0.3


def test_upload_bound_recovers_the_iterations():
    u = report.upload_numbers(UPLOAD)
    assert u["iters"] == 10 and u["bound"] == 0.1 and u["host_bound"] == pytest.approx(0.2)


def test_latest_picks_the_newest_file_of_each_suite(results):
    newer = dict(MACHINE, gpu="Newer GPU", date="2026-02-01T00:00:00+00:00")
    ops = copy.deepcopy(OPS)
    ops["mxb"]["ratio"] = 1.0
    (results / "ops-Newer-GPU.json").write_text(json.dumps({"machine": newer, "results": ops}),
                                                encoding="utf-8")
    chosen = report.latest(report.load(results))
    assert chosen["ops"][0] == "Newer-GPU"
    assert chosen["streams"][0] == "Test-GPU"


def test_rst_report_states_every_verdict(results):
    text = report.rst_report(report.load(results))
    assert "Test GPU" in text and "2026-01-02" in text
    assert "NO (1 of 2)" in text and "yes (1 of 1)" in text
    assert "These do not:" in text
    assert ".. note:: The plot ``ops-Test-GPU-bandwidth.png`` has not been generated" in text


def test_write_docs_copies_existing_plots(results, tmp_path_factory):
    (results / "streams-Test-GPU.png").write_bytes(b"\x89PNG fake")
    out = tmp_path_factory.mktemp("generated")
    text = report.write_docs(out, results).read_text(encoding="utf-8")
    assert (out / "streams-Test-GPU.png").exists()
    assert f".. figure:: /{out.name}/streams-Test-GPU.png" in text


def test_committed_results_report():
    found = report.load(RESULTS_DIR)
    if not found:
        pytest.skip("no committed results")
    chosen = report.latest(found)
    vs = report.verdicts({s: chosen[s][1] for s in chosen})
    assert vs and all(0 <= v["met"] <= v["total"] for v in vs)
    assert report.headline(chosen)
    assert ".. list-table::" in report.rst_report(found)


def test_report_writes_plots(results, capsys):
    pytest.importorskip("matplotlib")
    assert cli.main(["report", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    for name in ("ops-Test-GPU-bandwidth.png", "mxb-Test-GPU.png", "streams-Test-GPU.png",
                 "upload-Test-GPU.png", "train-Test-GPU.png"):
        assert (results / name).read_bytes()[:4] == b"\x89PNG", name
        assert name in out
    assert "MISSED" in out and "headline" in out


def test_report_without_results(tmp_path, capsys):
    assert report.main(["--results", str(tmp_path)]) == 0
    assert "no results" in capsys.readouterr().out
