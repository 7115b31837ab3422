"""The suite cannot hang CI: every test has a time limit (pytest-timeout),
so a hang fails that test and the run goes on."""
import subprocess
import sys
import textwrap


def test_timeout_plugin_is_active_with_a_default(request):
    """pytest-timeout is loaded and pyproject.toml gives every test a limit."""
    assert request.config.pluginmanager.hasplugin("timeout")
    assert float(request.config.getini("timeout")) > 0


def test_a_hanging_test_fails_and_the_run_goes_on(tmp_path):
    """A test that never ends fails at its limit; the next test still runs."""
    (tmp_path / "test_hang.py").write_text(textwrap.dedent("""
        import threading
        import pytest

        @pytest.mark.timeout(2)
        def test_hangs():
            threading.Event().wait()      # forever

        def test_after():
            pass
    """))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(tmp_path / "test_hang.py")], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Timeout" in run.stdout and "1 failed, 1 passed" in run.stdout, run.stdout
