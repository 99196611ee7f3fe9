"""Every metric a run logs is registered with what it holds (sparserl.runlog.METRICS), docs/metrics.md is the page
tools/metrics_doc.py renders from it, and a name outside it is said (UnregisteredMetricWarning: pyproject's pytest
settings make it an error, so every test that trains checks the names its run logs)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from sparserl import runlog

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("metrics_doc", ROOT / "tools" / "metrics_doc.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["metrics_doc"] = mod
    spec.loader.exec_module(mod)
    return mod


md = _script()


def test_the_page_is_current():
    assert (ROOT / "docs" / "metrics.md").read_text() == md.render(), (
        "docs/metrics.md is stale: python3 tools/metrics_doc.py --write"
    )
    assert md.main(["--check"]) == 0


def test_every_name_constant_is_registered_and_described():
    constants = {v for k, v in vars(runlog).items() if k.isupper() and isinstance(v, str) and "/" in v}
    constants -= {runlog.METRICS_FILE, runlog.CONFIG_FILE, runlog.EVAL_FILE}
    assert constants <= set(runlog.METRICS), sorted(constants - set(runlog.METRICS))
    assert all(doc.strip() for doc in runlog.METRICS.values())
    assert "| `mismatch/log_ratio_abs_mean` | mean of \\|log ρ_t\\| |" in md.render()  # a | escaped in its cell


def test_families_and_registration():
    assert runlog.is_registered("mismatch/alpha_p5_bin/1024") and runlog.is_registered("kv/budget_bin/0")
    assert runlog.is_registered(runlog.reward_part_metric("math_verify")) and runlog.is_registered(
        runlog.eval_metric("sparse", "pass@8")
    )
    assert runlog.is_registered("step") and runlog.is_registered(runlog.MISMATCH_K3)
    assert not runlog.is_registered("mismatch/alpha_p5_binx") and not runlog.is_registered("reward/meen")
    with pytest.raises(ValueError, match="registered twice"):
        runlog.metric(runlog.REWARD_MEAN, "again")


def test_an_unregistered_name_is_said_and_still_written(tmp_path):
    from sparserl.train.metrics import MetricsLogger

    with MetricsLogger(tmp_path, tensorboard=False, progress="none") as log:
        with pytest.warns(runlog.UnregisteredMetricWarning, match="'reward/meen'"):
            log.log(1, {runlog.REWARD_MEAN: 0.5, "reward/meen": 0.25})
    assert runlog.read_metrics(tmp_path)[0]["reward/meen"] == 0.25


def test_the_guides_name_only_registered_metrics():
    """A metric named in README.md, docs/*.md or docs/guides/*.md (in backticks) exists; ``is/*``-style names stand
    for registered ones."""
    import re

    stations = {name.split("/")[0] for name in runlog.METRICS if "/" in name}
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "guides").glob("*.md")]
    unknown = []
    for page in pages:
        for found in re.finditer(r"`([a-z_]+/[a-z_0-9@/]+\*?)`", page.read_text(encoding="utf-8")):
            name = found.group(1)
            if name.split("/")[0] not in stations or name.endswith(".py"):
                continue
            ok = (
                any(m.startswith(name[:-1]) for m in runlog.METRICS)
                if name.endswith("*")
                else runlog.is_registered(name)
            )
            if not ok:
                unknown.append(f"{page.relative_to(ROOT)}: {name}")
    assert not unknown, unknown
