"""The PEP 517 build backend of streamhandlers-gpu-preflight.

Preparing the metadata (and building the wheel, for a frontend that skips
that step) first runs the check in ``handlers/toolkit.py``, loaded by path
from the checkout two directories up: no package of the project, and not
numpy, is installed yet when pip gets here.  When a piece is missing the
hook exits with the check's message, which pip prints under "Preparing
metadata ... did not run successfully" and then stops, before any build of
pycuda.  Otherwise the wheel holds its metadata alone: installed, it adds
nothing but its name to the environment.

Standard library only; the ``requires = []`` of pyproject.toml means pip
installs nothing to run this.
"""
import base64
import hashlib
import importlib.util
import io
import os
import sys
import zipfile
from pathlib import Path

NAME = "streamhandlers-gpu-preflight"
VERSION = "0.1.0"
TOOLKIT = Path(__file__).resolve().parents[2] / "handlers" / "toolkit.py"
# The distribution's name in file names (the wheel spec's escaping).
_STEM = f"{NAME.replace('-', '_')}-{VERSION}"
_DIST_INFO = f"{_STEM}.dist-info"
_TAG = "py3-none-any"
# Fixed timestamps, so that the same wheel comes out every time.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def load_toolkit():
    """``handlers/toolkit.py`` as a module of its own, loaded by path (the
    ``handlers`` package would import numpy)."""
    if not TOOLKIT.is_file():
        raise SystemExit(f"{NAME}: {TOOLKIT} is missing; this backend runs from a "
                         "streamhandlers checkout (tools/gpu_preflight)")
    spec = importlib.util.spec_from_file_location("_streamhandlers_toolkit", TOOLKIT)
    module = importlib.util.module_from_spec(spec)
    # dataclasses looks its module up in sys.modules while building the classes.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def check():
    """Run the preflight; exit with its message where a piece is missing.

    SystemExit rather than an exception: the frontend then shows the message
    alone, not under a traceback of this file."""
    message = load_toolkit().preflight()
    if message:
        raise SystemExit(message)


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: Checks for the CUDA pieces that streamhandlers[gpu] needs before pip "
            "builds pycuda.\nRequires-Python: >=3.10\n").encode()


def _wheel_info():
    return (f"Wheel-Version: 1.0\nGenerator: {NAME} backend\nRoot-Is-Purelib: true\n"
            f"Tag: {_TAG}\n").encode()


def get_requires_for_build_wheel(config_settings=None):
    """PEP 517: nothing is needed to build the wheel."""
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """PEP 517: check the machine, then write the ``.dist-info`` directory."""
    check()
    target = Path(metadata_directory, _DIST_INFO)
    target.mkdir(parents=True, exist_ok=True)
    (target / "METADATA").write_bytes(_metadata())
    (target / "WHEEL").write_bytes(_wheel_info())
    return _DIST_INFO


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """PEP 517: check the machine, then write a wheel that holds only its
    metadata (METADATA, WHEEL and RECORD)."""
    check()
    files = {f"{_DIST_INFO}/METADATA": _metadata(), f"{_DIST_INFO}/WHEEL": _wheel_info()}
    record = io.StringIO()
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{name},sha256={digest},{len(data)}\n")
    record.write(f"{_DIST_INFO}/RECORD,,\n")
    files[f"{_DIST_INFO}/RECORD"] = record.getvalue().encode()
    wheel = f"{_STEM}-{_TAG}.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(Path(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, _ZIP_DATE)
            info.external_attr = 0o644 << 16
            zf.writestr(info, data, zipfile.ZIP_DEFLATED)
    return wheel
