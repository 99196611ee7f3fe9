"""README's KV-vs-reward table and docs/results/README.md's headline bench ratios are the ones
tools/results_table.py regenerates from the stored JSON, and a speed ratio is the median of per-round
ratios (not a median over a median)."""

import importlib.util
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("results_table", ROOT / "tools" / "results_table.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["results_table"] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


rt = _script()


def test_readme_kv_table_is_the_regenerated_one():
    text = (ROOT / "README.md").read_text()
    block = rt.readme_block(text, rt.KV_BEGIN, rt.KV_END)
    assert block == rt.render_kv_table(), "README's KV-vs-reward table differs: python3 tools/results_table.py --write"


def test_results_readme_speed_table_is_the_regenerated_one():
    block = rt.readme_block((rt.RESULTS / "README.md").read_text())
    assert block == rt.render_table(), "docs/results/README.md's table differs: python3 tools/results_table.py --write"
    assert rt.main(["--check"]) == 0
    edited = rt.with_block("x\n" + rt.BEGIN + "\nold\n" + rt.END + "\ny\n", block)
    assert rt.readme_block(edited) == block and edited.startswith("x\n") and edited.endswith(rt.END + "\ny\n")


def test_check_fails_on_a_stale_block(tmp_path, monkeypatch, capsys):
    stale, speed = tmp_path / "README.md", tmp_path / "results.md"
    stale.write_text("x\n" + rt.KV_BEGIN + "\n| an old row |\n" + rt.KV_END + "\n")
    speed.write_text(rt.BEGIN + "\n" + rt.render_table() + rt.END + "\n")
    monkeypatch.setattr(rt, "README", stale)
    monkeypatch.setattr(rt, "RESULTS_README", speed)
    monkeypatch.setattr(rt, "ROOT", tmp_path)
    assert rt.main(["--check"]) == 1
    assert "an old row" in capsys.readouterr().out
    assert rt.main(["--write"]) == 0 and rt.main(["--check"]) == 0
    assert rt.readme_block(stale.read_text(), rt.KV_BEGIN, rt.KV_END) == rt.render_kv_table()


def test_kv_table_reads_the_paired_figures_of_comparison_json():
    c = json.loads((rt.RESULTS / rt.COMPARISON).read_text())
    rows = {a.arm: rt.kv_row(a, c) for a in rt.KV_ARMS}
    assert set(rows) == {"dense", "sparse_rl", "sparrow_cap64", "sparse_naive"}
    assert rows["sparrow_cap64"][3].startswith("\u22120.07 [\u22120.37, +0.23]")  # the new default vs dense
    assert rows["sparse_rl"][3].startswith("\u22120.41 [\u22120.60, \u22120.22]")  # the previous default
    assert rows["sparrow_cap64"][-1] == "2.17x less" and rows["sparse_rl"][-1] == "3.20x less"
    assert rows["dense"][3] == "\u2013" and rows["dense"][-1] == "1x"
    assert "AMD EPYC" in rt.render_kv_table()  # the machine is named beside the figures


def test_median_of_round_ratios_is_not_a_median_over_a_median():
    # rows a and b, three rounds in one process; per round 2.0, 8/7, 0.9
    a, b = [200.0, 160.0, 90.0], [100.0, 140.0, 100.0]
    assert rt.round_ratios(a, b) == pytest.approx([2.0, 160 / 140, 0.9])
    assert rt.median_of_round_ratios(a, b) == pytest.approx(160 / 140)  # 1.14
    median_over_median = sorted(a)[1] / sorted(b)[1]  # 160 / 100 = 1.60
    assert median_over_median == pytest.approx(1.6)
    assert rt.median_of_round_ratios(a, b) != pytest.approx(median_over_median)
    # two rounds: the mean of the two ratios; one round: that round's ratio
    assert rt.median_of_round_ratios([3.0, 4.0], [2.0, 2.0]) == pytest.approx(1.75)
    assert rt.median_of_round_ratios([3.0], [2.0]) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        rt.median_of_round_ratios([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        rt.median_of_round_ratios([], [])


def test_the_users_example_reads_as_the_rounds_say():
    # bench_2026-11-24c/L256_B16_openvino_r3.json: float32 dense over OpenVINO dense, per round 2.05, 1.14, 0.90
    # (a median over a median reads 1.57)
    row = rt.headline_row(rt.Headline("x", "bench_2026-11-24c/L256_B16_openvino_r3.json", rt.DENSE, rt.OV_DENSE))
    assert [round(x, 2) for x in row["ratios"]] == [2.05, 1.14, 0.90]
    assert round(row["ratio"], 2) == 1.14
    report = json.loads((rt.RESULTS / "bench_2026-11-24c/L256_B16_openvino_r3.json").read_text())
    a, b = rt.pick(report["results"], rt.DENSE, "a"), rt.pick(report["results"], rt.OV_DENSE, "b")
    assert round(statistics.median(a["tokens_per_s_runs"]) / statistics.median(b["tokens_per_s_runs"]), 2) == 1.57
    assert row["machine"] == "2-core AMD EPYC, AVX2"


def test_each_headline_picks_one_row_and_names_a_known_machine():
    for h in rt.HEADLINES:
        r = rt.headline_row(h)  # raises when a selector matches no row or several
        assert r["machine"].startswith(("2-core ", "2 threads of a ")), r["machine"]  # 2 cores: the project's machines


def test_a_machine_whose_threads_are_fewer_than_its_cores_is_named_so():
    machine = {
        "cpu": "Intel(R) Xeon(R) Processor",
        "isa": ["avx512f", "avx512_bf16", "amx_bf16"],
        "cores": 16,
        "torch_threads": 2,
    }
    assert rt.machine_label(machine) == "2 threads of a 16-core Intel Xeon, AVX512 + BF16 + AMX"
    assert rt.machine_label({**machine, "torch_threads": 16}).startswith("16-core Intel Xeon")


def _links(text: str) -> list[str]:
    return [u for u in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in u and not u.startswith("#")]


def test_results_links_point_at_files_in_the_repository():
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    missing = []
    for page in pages:
        missing += [
            f"{page.relative_to(ROOT)}: {u}"
            for u in _links(page.read_text())
            if not (page.parent / u.split("#")[0]).exists()
        ]
    assert not missing
