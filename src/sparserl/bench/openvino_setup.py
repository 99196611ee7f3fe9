"""``sparserl bench setup-openvino``: everything the OpenVINO peer (``bench rollout --peers openvino``)
needs, in one command from a fresh install.

Two pieces, because they cannot share one environment:

- **the runtime** (OpenVINO, OpenVINO GenAI, OpenVINO Tokenizers at the pins of the ``bench`` extra in
  ``pyproject.toml``), installed into sparserl's own environment: it needs neither torch nor
  transformers and changes no installed package;
- **the exporter** (optimum-intel, which converts a Hugging Face model to OpenVINO IR once per model
  and precision), installed into a virtual environment of its own under
  ``$SPARSERL_CACHE/openvino/exporter`` with the exporter's own pins (:data:`EXPORTER_PINS`).
  optimum-intel 2.2's exporter fails against the transformers sparserl runs (5.23 renamed the cache's
  ``past_key_values`` input to ``cache``: "Config dummy inputs are not a subset of the model inputs"),
  and its dependencies pull a ``torchvision`` whose compiled operators do not load against torch's CPU
  build ("operator torchvision::nms does not exist"); the export of a text model never uses it, so it
  is removed after the install. torch is pinned to the version sparserl runs (the CPU build these
  machines keep on disk).

Why a separate environment rather than a conversion of our own: the IR that OpenVINO GenAI's
continuous-batching pipeline runs (stateful KV, its paged-attention rewrite) is what optimum-intel's
exporter produces; a home-made conversion would be a different graph, and the comparison would no
longer be against the engine users run. Measured on a 2-core AMD EPYC: the set-up takes ~2.5 min and
~1.6 GB; the default model's export ~1 min, once.

A set-up counts as done when its marker file (:data:`MARKER`) exists: it is written last, after the
exporter imported in the new environment, so an interrupted set-up is redone, not trusted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

from ..errors import SparserlError
from ..models.loading import cache_dir

SETUP_COMMAND = "sparserl bench setup-openvino"
EXPORT_PYTHON_ENV = "SPARSERL_OPENVINO_EXPORT_PYTHON"
MARKER = "sparserl-exporter.json"

#: the exporter's environment, as resolved by pip for ``optimum-intel[openvino]`` 2.2.0 with torch 2.13.0
#: (November 2026); what matters is that transformers stays at a version its exporter supports.
EXPORTER_PINS = (
    "optimum-intel==2.2.0",
    "optimum==2.3.0",
    "nncf==3.4.0",
    "transformers==5.5.4",
    "tokenizers==0.22.2",
    "huggingface_hub==1.21.0",
    "openvino==2026.4.1",
    "openvino-tokenizers==2026.4.1.0",
    "numpy==2.4.6",
    "scipy==1.17.1",
    "scikit-learn==1.9.1",
    "safetensors==0.8.0",
)
#: installed by optimum-intel's requirements, then removed (see the module docstring)
EXPORTER_REMOVE = ("torchvision",)
_EXPORTER_IMPORT = "from optimum.exporters.openvino import main_export; import nncf, openvino_tokenizers"


class OpenVINOSetupError(SparserlError):
    """The OpenVINO peer is not set up (or its set-up failed); the message names what to run."""


def runtime_requirements() -> list[str]:
    """The ``bench`` extra's requirements, read from sparserl's installed metadata (pyproject.toml is
    their one home)."""
    try:
        requires = metadata.requires("sparserl") or []
    except metadata.PackageNotFoundError:
        requires = []
    found = [r.split(";")[0].strip() for r in requires if "extra" in r and "bench" in r.split(";", 1)[-1]]
    if not found:
        raise OpenVINOSetupError(
            "sparserl's installed metadata has no `bench` extra; reinstall sparserl "
            "(`./install.sh` or `pip install -e .`)"
        )
    return found


def runtime_missing() -> str | None:
    """Why OpenVINO GenAI's runtime cannot be imported here (None when it can)."""
    try:
        import openvino_genai  # noqa: F401  (the import is the check)
    except ImportError as e:
        return f"openvino-genai is not importable in {sys.executable} ({e})"
    return None


def exporter_dir() -> Path:
    return cache_dir() / "openvino" / "exporter"


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def exporter_python() -> Path:
    """The Python that runs optimum-intel's export: ``$SPARSERL_OPENVINO_EXPORT_PYTHON`` when set, else
    the set-up's environment. Raises :class:`OpenVINOSetupError` naming the command when neither is there."""
    given = os.environ.get(EXPORT_PYTHON_ENV, "").strip()
    if given:
        path = Path(given).expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise OpenVINOSetupError(
                f"{EXPORT_PYTHON_ENV}={given!r} is not an executable file; point it at a "
                f"Python with optimum-intel, or unset it and run `{SETUP_COMMAND}`"
            )
        try:
            ok = (
                subprocess.run([str(path), "-c", "import optimum.intel"], capture_output=True, timeout=300).returncode
                == 0
            )
        except (OSError, subprocess.SubprocessError):
            ok = False
        if not ok:
            raise OpenVINOSetupError(
                f"{EXPORT_PYTHON_ENV}={given!r} is not a Python that imports optimum.intel; "
                f"point it at one, or unset it and run `{SETUP_COMMAND}`"
            )
        return path
    venv = exporter_dir()
    python = _venv_python(venv)
    if not (venv / MARKER).is_file() or not python.is_file():
        state = "is incomplete (an interrupted set-up)" if venv.exists() else "does not exist"
        raise OpenVINOSetupError(
            f"the OpenVINO peer's model exporter ({venv}) {state}: run `{SETUP_COMMAND}` "
            f"once (~3 min, ~1.6 GB), or set {EXPORT_PYTHON_ENV} to a Python with "
            "optimum-intel"
        )
    return python


def check_ready(need_exporter: bool = True) -> None:
    """Raise :class:`OpenVINOSetupError` naming :data:`SETUP_COMMAND` unless the runtime imports and
    (``need_exporter``) an exporter is there."""
    missing = runtime_missing()
    if missing:
        raise OpenVINOSetupError(
            f"the OpenVINO peer needs its runtime: {missing}; run `{SETUP_COMMAND}` "
            f"(or `pip install 'sparserl[bench]'`)"
        )
    if need_exporter:
        exporter_python()


def _run(cmd: list[str], what: str, log) -> None:
    log(f"openvino setup: {what}")
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise OpenVINOSetupError(f"{SETUP_COMMAND}: {what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    log(f"openvino setup: done in {time.perf_counter() - t:.0f}s")


def torch_pin() -> str:
    """The torch the exporter gets: the version sparserl runs (``2.13.0``, the CPU build on disk here)."""
    return f"torch=={torch.__version__.split('+')[0]}"


def setup(venv: Path | None = None, force: bool = False, python: str = sys.executable, log=print) -> Path:
    """Install the runtime into this environment (when missing) and the exporter's environment at
    ``venv`` (default :func:`exporter_dir`; recreated with ``force``). Returns the exporter's Python."""
    if runtime_missing():
        _run(
            [python, "-m", "pip", "install", "--quiet", *runtime_requirements()],
            f"installing the runtime ({', '.join(runtime_requirements())}) into {python}",
            log,
        )
        if runtime_missing():
            raise OpenVINOSetupError(f"{SETUP_COMMAND}: the runtime installed but {runtime_missing()}")
    venv = Path(venv) if venv is not None else exporter_dir()
    if venv.exists() and (force or not (venv / MARKER).is_file()):
        shutil.rmtree(venv)
    exe = _venv_python(venv)
    if (venv / MARKER).is_file():
        log(f"openvino setup: the exporter is already set up in {venv} (--force redoes it)")
        return exe
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([python, "-m", "venv", str(venv)], f"creating the exporter's environment {venv}", log)
    pins = [torch_pin(), *EXPORTER_PINS]
    _run([str(exe), "-m", "pip", "install", "--quiet", *pins], f"installing the exporter ({' '.join(pins)})", log)
    _run(
        [str(exe), "-m", "pip", "uninstall", "--yes", "--quiet", *EXPORTER_REMOVE],
        f"removing {', '.join(EXPORTER_REMOVE)} (unused by the export; its operators do not load on torch's CPU build)",
        log,
    )
    _run([str(exe), "-c", _EXPORTER_IMPORT], "checking that the exporter imports", log)
    (venv / MARKER).write_text(
        json.dumps(
            {"pins": pins, "removed": list(EXPORTER_REMOVE), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2
        )
    )
    if venv.resolve() == exporter_dir().resolve():
        log(f"openvino setup: ready; `sparserl bench rollout --peers openvino` exports with {exe}")
    else:
        log(f"openvino setup: ready; set {EXPORT_PYTHON_ENV}={exe} for `sparserl bench rollout --peers openvino`")
    return exe
