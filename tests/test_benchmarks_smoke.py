"""Run the benchmark code on tiny sizes so it cannot rot.  No timing is checked."""
from benchmarks import __main__ as cli
from benchmarks import mxb


def test_mxb_prints_table(capsys):
    assert mxb.main(["--n", "64", "--iters", "3"]) == 0
    out = capsys.readouterr().out
    assert "plain NumPy" in out
    assert "NumpyHandler" in out
    assert "target <= 1.10x" in out
    rows = [line for line in out.splitlines() if line.split()[-1:] in (["yes"], ["NO"])]
    assert [r.split()[0] for r in rows][:2] == ["plain", "NumpyHandler"], out
    assert all(r.endswith("yes") for r in rows), out   # each handler computed m @ x + b


def test_cli_dispatch(capsys):
    assert cli.main(["no-such-suite"]) == 2
    assert "unknown suite" in capsys.readouterr().err
    assert cli.main(["mxb", "--n", "8", "--iters", "1", "--repeats", "1"]) == 0
    assert "NumpyHandler" in capsys.readouterr().out
