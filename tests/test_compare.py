"""sparserl compare: arm × seed expansion, the runs (skipped when done, resumed when killed), the
aggregation, the report, --eval, and bad input caught before any run starts."""

import json
import shutil

import pytest

from sparserl.compare import CompareError, compare, expand, parse_arms
from sparserl.compare import aggregate as agg
from sparserl.compare.arms import resolve_seeds, split_top_level
from sparserl.config import load_config
from sparserl.eval.report import make_report
from sparserl.runlog import KV_DENSE_ALLOC, KV_KEPT_FRAC, KV_SAMPLER_ALLOC, MISMATCH_K3, REWARD_MEAN, read_metrics
from sparserl.train import trainer as trainer_mod
from sparserl.train.checkpoint import latest_checkpoint

TINY = [
    "model.name=tiny",
    "train.prompts_per_step=2",
    "rollout.n=4",
    "rollout.max_new_tokens=16",
    "rollout.kv_budget=8",
    "rollout.step_length=4",
    "rollout.window=2",
    "rollout.compress_prompt=false",
    "train.micro_batch_size=4",
    "log.tensorboard=false",
    "log.progress=plain",
    "checkpoint.every=1",
    "train.lr=1e-3",
    "reward.fn=test_train:toy_reward",
    "data.eval=null",
    "data.system_prompt=null",
]
PNG = b"\x89PNG\r\n\x1a\n"


class Spy:
    """Wraps trainer.train: records (run folder name, resume) of each call."""

    def __init__(self, mp):
        self.calls, real = [], trainer_mod.train

        def spy(cfg, resume=False, run_dir=None, **kw):
            self.calls.append((run_dir.name, resume))
            return real(cfg, resume=resume, run_dir=run_dir, **kw)

        mp.setattr(trainer_mod, "train", spy)


def quiet(*_):
    pass


# ------------------------------------------------------------------------------ arms and seeds
def test_parse_arms_builtin_user_and_preset():
    arms = parse_arms(
        "dense,sparse_naive,sparse_rl,tight=rollout.kv_budget=16;algorithm.correction=[tis,mis],preset:default"
    )
    assert [a.name for a in arms] == ["dense", "sparse_naive", "sparse_rl", "tight", "default"]
    assert arms[0].overrides == ("rollout.compressor=none", "rollout.kv_controller=null", "algorithm.correction=none")
    assert arms[1].overrides == ("algorithm.correction=none",)
    assert arms[3].overrides == ("rollout.kv_budget=16", "algorithm.correction=[tis,mis]")
    assert arms[4].config == "default" and arms[4].overrides == ()
    assert parse_arms(["dense", "base"])[1].overrides == ()  # --arms given twice
    assert parse_arms("sparse_rl_math")[0].config == "sparse_rl_math"  # a bare preset name
    assert split_top_level('a,b=[1,2],c="x,y"', ",") == ["a", "b=[1,2]", 'c="x,y"']
    # a variant of a preset: the preset is its CONFIG, its overrides on top; its spec reads back the same
    loose = parse_arms("loose=preset:default;rollout.kv_controller.threshold=0.7")[0]
    assert (loose.name, loose.config, loose.overrides) == ("loose", "default", ("rollout.kv_controller.threshold=0.7",))
    assert parse_arms(loose.spec())[0] == loose
    assert parse_arms("plain=preset:default")[0].config == "default"
    assert parse_arms("preset:default")[0].spec() == "preset:default"
    assert resolve_seeds(3) == [0, 1, 2] and resolve_seeds(1, "4,7") == [4, 7]


def test_a_preset_variant_arm_builds_the_preset_with_its_overrides(tmp_path):
    specs = expand(
        "sparse_rl_fixed40",
        TINY,
        "preset:default,loose=preset:default;rollout.kv_controller.threshold=0.7",
        1,
        steps=2,
        runs_dir=tmp_path,
    )
    base, loose = specs[0].cfg, specs[1].cfg
    assert base.rollout.kv_controller.threshold == 0.86 and loose.rollout.kv_controller.threshold == 0.7
    assert loose.rollout.kv_controller.max_budget == base.rollout.kv_controller.max_budget  # the rest: the preset's
    assert specs[1].command().startswith("sparserl train default model.name=tiny")


def test_expand_names_runs_and_sets_seed_and_steps(tmp_path):
    specs = expand(
        "sparse_rl_fixed40", TINY, "dense,sparse_rl,tight=rollout.kv_budget=16", 2, steps=3, runs_dir=tmp_path
    )
    assert [s.name for s in specs] == [
        "dense-seed0",
        "dense-seed1",
        "sparse_rl-seed0",
        "sparse_rl-seed1",
        "tight-seed0",
        "tight-seed1",
    ]
    assert [s.run_dir for s in specs] == [tmp_path / s.name for s in specs]
    assert [s.cfg.train.seed for s in specs] == [0, 1] * 3
    assert all(s.cfg.train.steps == 3 and s.cfg.model.name == "tiny" for s in specs)
    dense, rl, tight = specs[0].cfg, specs[2].cfg, specs[4].cfg
    assert (dense.rollout.compressor, dense.algorithm.correction) == ("none", "none")
    assert (rl.rollout.compressor, rl.algorithm.correction) == ("rkv", "sparse_rl")
    assert tight.rollout.kv_budget == 16 and rl.rollout.kv_budget == 8
    # the arm's overrides come after the shared ones; seed last
    assert specs[4].overrides[-3:] == ("rollout.kv_budget=16", "train.steps=3", "train.seed=0")
    assert specs[1].command().startswith("sparserl train sparse_rl_fixed40 model.name=tiny")
    specs = expand("sparse_rl_fixed40", TINY, "sparse_naive", [5, 9], runs_dir=tmp_path)
    assert [s.name for s in specs] == ["sparse_naive-seed5", "sparse_naive-seed9"]
    assert specs[0].cfg.train.steps == load_config("sparse_rl_fixed40").train.steps  # the config's own without --steps


# ------------------------------------------------------------------------------ aggregation
def test_band_final_and_best_on_constructed_curves():
    a = {1: 0.0, 2: 0.2, 3: 0.4, 4: 0.6}
    b = {1: 0.2, 2: 0.4, 3: 0.2, 4: 1.0}
    c = {1: 0.1, 2: 0.3}  # a seed with fewer steps: the later steps average the others
    band = agg.band([a, b, c])
    assert band.steps == [1, 2, 3, 4]
    assert band.mean == pytest.approx([0.1, 0.3, 0.3, 0.8])
    assert band.lo == pytest.approx([0.0, 0.2, 0.2, 0.6]) and band.hi == pytest.approx([0.2, 0.4, 0.4, 1.0])
    assert band.count == [3, 3, 2, 2]
    assert agg.best_step(band) == (4, pytest.approx(0.8))
    assert agg.tail_k(4) == 1 and agg.tail_k(8) == 2 and agg.tail_k(2) == 1
    assert agg.final_value(a, 2) == pytest.approx(0.5)
    m, s = agg.mean_std([agg.final_value(x, 2) for x in (a, b)])
    assert m == pytest.approx(0.55) and s == pytest.approx(0.0707107, rel=1e-5)  # sample std
    assert agg.mean_std([0.3]) == (0.3, 0.0) and agg.mean_std([]) == (None, None)


def test_collapse_rule_on_constructed_curves():
    rising = {s: 0.1 * s for s in range(1, 10)}
    falling = {s: 0.9 - 0.1 * s for s in range(1, 10)}
    flat_noise = {1: 0.5, 2: 0.48, 3: 0.52, 4: 0.47, 5: 0.5, 6: 0.49}  # within 0.05: no collapse
    assert not agg.collapse(rising).collapsed
    assert not agg.collapse(flat_noise).collapsed
    c = agg.collapse(falling)
    assert c.collapsed and "reward fell" in c.reasons[0]
    spike = agg.collapse(rising, {1: 0.01, 5: 3.0, 6: 0.02}, k3_threshold=1.0)
    assert spike.collapsed and "k3 3 > 1 at step 5" in spike.reasons[0]
    assert not agg.collapse(rising, {1: 0.5, 2: 0.9}, k3_threshold=1.0).collapsed
    assert agg.collapse(rising, {1: 0.5, 2: 0.9}, k3_threshold=0.8).collapsed
    assert not agg.collapse({1: 0.9}).collapsed  # one step cannot fall
    assert "last third" in agg.collapse_rule(1.0) and MISMATCH_K3 in agg.collapse_rule(1.0)


def test_summarize_arm_and_versus_dense():
    def seed(r, k3, alloc):
        return {
            REWARD_MEAN: r,
            MISMATCH_K3: k3,
            KV_SAMPLER_ALLOC: {1: alloc, 2: alloc},
            KV_DENSE_ALLOC: {1: 400.0, 2: 400.0},
            KV_KEPT_FRAC: {1: 0.25, 2: 0.25},
        }

    sparse = agg.summarize_arm(
        {
            "s-seed0": seed({1: 0.2, 2: 0.6}, {1: 0.1, 2: 0.2}, 100.0),
            "s-seed1": seed({1: 0.6, 2: 0.2}, {1: 0.1, 2: 5.0}, 100.0),
        }
    )
    dense = agg.summarize_arm({"d-seed0": seed({1: 0.3, 2: 0.5}, {1: 0.0, 2: 0.0}, 400.0)})
    assert sparse["final_k"] == 1
    assert sparse["final_reward"]["mean"] == pytest.approx(0.4)
    assert sparse["final_reward"]["per_seed"] == {"s-seed0": pytest.approx(0.6), "s-seed1": pytest.approx(0.2)}
    assert sparse["n_collapsed"] == 1 and sparse["collapsed"]["s-seed1"]["collapsed"]
    assert sparse["k3"]["max"] == 5.0
    assert sparse["kv"]["alloc_reduction"] == pytest.approx(4.0) and sparse["kv"]["tokens_saved_frac"] == 0.75
    assert sparse["alpha"]["mean"] == {
        "mean": None,
        "std": None,
        "per_seed": {"s-seed0": None, "s-seed1": None},
        "seeds": 0,
    }  # no α logged
    sums = {"s": sparse, "d": dense}
    agg.versus_dense(sums, "d")
    assert sparse["kv"]["vs_dense_arm"] == pytest.approx(4.0) and dense["kv"]["vs_dense_arm"] == 1.0


def _table(md: str, header_cell: str) -> dict[str, dict[str, str]]:
    """The markdown table whose header has ``header_cell``: {first cell: {header: cell}}."""
    lines = md.splitlines()
    i = next(j for j, line in enumerate(lines) if line.startswith("|") and f"| {header_cell} |" in line)
    head = [c.strip() for c in lines[i].strip("|").split("|")]
    rows = {}
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(head, cells))
    return rows


def test_compare_table_has_alpha_columns(tmp_path):
    """α mean and α p5 per arm: each seed's mean of its last k = steps // 4 steps, mean ± std over the
    seeds that logged α; – for an arm that did not (mismatch.alpha=off)."""
    from sparserl.compare.report import write_comparison
    from sparserl.runlog import MISMATCH_ALPHA_MEAN, MISMATCH_ALPHA_P5, MISMATCH_ALPHA_P5_BIN

    steps = 8  # k = 2 last steps
    specs = expand(
        "sparse_rl_fixed40",
        [],
        "dense,sparse_rl,tight=rollout.kv_budget=16",
        2,
        steps=steps,
        runs_dir=tmp_path / "runs",
    )
    # the last two steps' α (mean, p5) per run; None: the run measured no α
    tails = {
        "dense-seed0": None,
        "dense-seed1": None,
        "sparse_rl-seed0": ((0.96, 0.94), (0.86, 0.84)),
        "sparse_rl-seed1": ((0.92, 0.90), (0.80, 0.78)),
        "tight-seed0": ((0.90, 0.88), (0.70, 0.66)),
        "tight-seed1": None,
    }
    for spec in specs:
        rows = []
        for step in range(1, steps + 1):
            row = {"step": step, REWARD_MEAN: 0.1 * step}
            if tails[spec.name] is not None:
                (m7, m8), (p7, p8) = tails[spec.name]
                row[MISMATCH_ALPHA_MEAN] = {7: m7, 8: m8}.get(step, 0.5)  # earlier steps are outside the tail
                row[MISMATCH_ALPHA_P5] = {7: p7, 8: p8}.get(step, 0.1)
                row[f"{MISMATCH_ALPHA_P5_BIN}0"] = 0.9  # read by the run report, not the comparison
            rows.append(row)
        spec.run_dir.mkdir(parents=True)
        (spec.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    md = write_comparison(out, specs, {}, config="default", overrides=[], seeds=[0, 1], collapse_k3=1.0).read_text()
    table = _table(md, "α mean")
    assert table["sparse_rl"]["α mean"] == "0.930 ± 0.028"  # seeds 0.95 and 0.91
    assert table["sparse_rl"]["α p5"] == "0.820 ± 0.042"  # seeds 0.85 and 0.79
    assert table["tight"]["α mean"] == "0.890 ± 0.000" and table["tight"]["α p5"] == "0.680 ± 0.000"  # one seed
    assert table["dense"]["α mean"] == "–" and table["dense"]["α p5"] == "–"
    assert table["sparse_rl"]["seeds"] == "2" and table["sparse_rl"]["final reward"] == "0.750 ± 0.000"
    alpha = json.loads((out / "comparison.json").read_text())["arms"]["sparse_rl"]["alpha"]
    assert alpha["mean"]["mean"] == pytest.approx(0.93) and alpha["mean"]["std"] == pytest.approx(0.0282843, rel=1e-5)
    assert alpha["p5"]["per_seed"] == {"sparse_rl-seed0": pytest.approx(0.85), "sparse_rl-seed1": pytest.approx(0.79)}
    assert alpha["p5"]["seeds"] == 2
    tight = json.loads((out / "comparison.json").read_text())["arms"]["tight"]["alpha"]["p5"]
    assert tight["seeds"] == 1 and tight["per_seed"]["tight-seed1"] is None


def test_paired_difference_seed_by_seed_with_a_t_interval():
    from sparserl.compare.aggregate import paired_difference, t_975

    ref = {0: 0.30, 1: 0.40, 2: 0.36, 3: 0.90}  # seed 3 has no pair: left out
    better = paired_difference({0: 0.40, 1: 0.51, 2: 0.45}, ref)
    assert better["n"] == 3 and better["seeds"] == [0, 1, 2]
    assert better["mean"] == pytest.approx(0.10) and better["std"] == pytest.approx(0.01)
    half = 4.303 * 0.01 / 3**0.5
    assert better["ci95"] == pytest.approx([0.10 - half, 0.10 + half]) and better["verdict"] == "better"
    worse = paired_difference({0: 0.20, 1: 0.29, 2: 0.27}, ref)
    assert worse["mean"] == pytest.approx(-0.10) and worse["verdict"] == "worse"
    noisy = paired_difference({0: 0.50, 1: 0.70, 2: 0.41}, ref)  # +0.20, +0.30, +0.05: the interval holds 0
    assert noisy["ci95"][0] < 0 < noisy["ci95"][1] and noisy["verdict"] == "within noise"
    one = paired_difference({0: 0.5, 1: None}, ref)
    assert one["n"] == 1 and one["ci95"] is None and one["verdict"] is None
    assert paired_difference({}, ref)["mean"] is None
    assert t_975(1) == 12.706 and t_975(5) == 2.571 and t_975(22) == 2.086 and t_975(100) == 2.042


def test_compare_reports_each_arm_against_dense_seed_by_seed(tmp_path):
    """The final reward (last k = 2 steps) of each arm minus the dense arm's of the same seed: a shift that
    holds in every seed is *worse*, one that changes sign is *within noise*; the dense arm gets no row."""
    from sparserl.compare.report import write_comparison

    steps = 8
    specs = expand(
        "sparse_rl_fixed40",
        [],
        "dense,sparse_rl,tight=rollout.kv_budget=16",
        3,
        steps=steps,
        runs_dir=tmp_path / "runs",
    )
    shift = {"dense": (0.0, 0.0, 0.0), "sparse_rl": (0.05, -0.04, 0.02), "tight": (-0.20, -0.22, -0.18)}
    for spec in specs:
        base = (0.3, 0.5, 0.4)[spec.seed] + shift[spec.arm.name][spec.seed]
        rows = [{"step": step, REWARD_MEAN: base} for step in range(1, steps + 1)]
        spec.run_dir.mkdir(parents=True)
        (spec.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    md = write_comparison(out, specs, {}, config="default", overrides=[], seeds=[0, 1, 2], collapse_k3=1.0).read_text()
    assert "## Against the dense arm (`dense`), seed by seed" in md
    table = _table(md, "pairs")
    assert set(table) == {"sparse_rl", "tight"} and table["tight"]["pairs"] == "3"
    assert table["tight"]["final reward"].startswith("−0.200 [") and table["tight"]["final reward"].endswith("worse")
    assert table["sparse_rl"]["final reward"].endswith("within noise")
    assert table["tight"]["held-out pass@1, dense inference"] == "–"  # no --eval
    paired = json.loads((out / "comparison.json").read_text())["arms"]["tight"]["vs_dense_paired"]["final_reward"]
    assert paired["mean"] == pytest.approx(-0.20) and paired["seeds"] == [0, 1, 2] and paired["verdict"] == "worse"

    # --paired-against sparse_rl: one more section, every other arm (dense included) minus sparse_rl's run
    md = write_comparison(
        out, specs, {}, config="default", overrides=[], seeds=[0, 1, 2], collapse_k3=1.0, paired_against=["sparse_rl"]
    ).read_text()
    assert "## Against `sparse_rl`, seed by seed" in md
    against = _table(md[md.index("## Against `sparse_rl`") :], "pairs")
    assert set(against) == {"dense", "tight"}
    assert against["tight"]["final reward"].startswith("−0.210 [")  # −0.25, −0.18, −0.20
    assert against["dense"]["final reward"].startswith("−0.010 [") and against["dense"]["final reward"].endswith(
        "within noise"
    )
    record = json.loads((out / "comparison.json").read_text())
    assert record["paired_against"] == ["sparse_rl"]
    assert record["arms"]["tight"]["paired"]["sparse_rl"]["final_reward"]["mean"] == pytest.approx(-0.21)
    assert "paired" not in record["arms"]["sparse_rl"]


def test_paired_against_must_name_an_arm(tmp_path):
    from sparserl.compare.comparison import plan

    p = plan("sparse_rl_fixed40", TINY, "dense,sparse_rl", 1, out=tmp_path / "o", paired_against="sparse_rl")
    assert p.paired_against == ["sparse_rl"]
    with pytest.raises(
        CompareError, match="--paired-against sparse_r: not one of this comparison's arms.*did you mean"
    ):
        plan("sparse_rl_fixed40", TINY, "dense,sparse_rl", 1, out=tmp_path / "o", paired_against="sparse_r")
    with pytest.raises(CompareError, match="--paired-against: no arm given"):
        plan("sparse_rl_fixed40", TINY, "dense,sparse_rl", 1, out=tmp_path / "o", paired_against=" , ")


# ------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """A 2-arm x 2-seed x 1-step comparison through the CLI; yields (out dir, train calls)."""
    from sparserl.cli import main

    out = tmp_path_factory.mktemp("cmp") / "out"
    with pytest.MonkeyPatch.context() as mp:
        spy = Spy(mp)
        rc = main(
            [
                "compare",
                "sparse_rl_fixed40",
                *TINY,
                "--arms",
                "dense,sparse_rl",
                "--seeds",
                "2",
                "--steps",
                "1",
                "--out",
                str(out),
            ]
        )
    assert rc == 0
    return out, spy.calls


def test_compare_makes_runs_table_and_plots(done):
    out, calls = done
    names = ["dense-seed0", "dense-seed1", "sparse_rl-seed0", "sparse_rl-seed1"]
    assert calls == [(n, False) for n in names]
    for n in names:
        run = out / "runs" / n
        assert [r["step"] for r in read_metrics(run)] == [1]
        assert latest_checkpoint(run).name == "step-000001"
    report = make_report(out / "runs" / "sparse_rl-seed0")  # an ordinary, report-able run folder
    assert "Run report: sparse_rl-seed0" in report.read_text()
    md = (out / "comparison.md").read_text()
    assert "| dense | 2 |" in md and "| sparse_rl | 2 |" in md
    assert "collapsed when the mean reward of its last third" in md and "sparserl compare sparse_rl_fixed40" in md
    assert "runs/dense-seed0" in md and "compare_reward.png" in md
    for png in ("compare_reward.png", "compare_mismatch.png", "compare_kv.png"):
        assert (out / png).read_bytes()[:8] == PNG
    data = json.loads((out / "comparison.json").read_text())
    assert set(data["arms"]) == {"dense", "sparse_rl"} and data["dense_arm"] == "dense"
    rl = data["arms"]["sparse_rl"]
    assert rl["seeds"] == 2 and rl["final_reward"]["mean"] is not None and rl["final_k"] == 1
    assert rl["kv"]["alloc_reduction"] > 1 and rl["kv"]["vs_dense_arm"] > 1
    assert data["arms"]["dense"]["kv"]["kept_frac"] == pytest.approx(1.0)
    assert {r["status"] for r in data["runs"].values()} == {"trained"}


def test_second_call_skips_finished_runs(done, monkeypatch):
    out, _ = done
    spy = Spy(monkeypatch)
    compare("sparse_rl_fixed40", TINY, "dense,sparse_rl", 2, steps=1, out=out, log=quiet)
    assert spy.calls == []
    data = json.loads((out / "comparison.json").read_text())
    assert {r["status"] for r in data["runs"].values()} == {"done"}


def test_killed_runs_resume(done, tmp_path, monkeypatch):
    src, _ = done
    out = tmp_path / "out"
    for n in ("sparse_rl-seed0", "sparse_rl-seed1"):
        shutil.copytree(src / "runs" / n, out / "runs" / n)
    # seed 1 was killed before its first checkpoint was written: metrics, no checkpoint
    shutil.rmtree(out / "runs" / "sparse_rl-seed1" / "checkpoints")
    spy = Spy(monkeypatch)
    compare("sparse_rl_fixed40", TINY, "sparse_rl", 2, steps=2, out=out, log=quiet)  # seed 0 goes on to step 2
    assert spy.calls == [("sparse_rl-seed0", True), ("sparse_rl-seed1", True)]
    for n in ("sparse_rl-seed0", "sparse_rl-seed1"):
        assert [r["step"] for r in read_metrics(out / "runs" / n)] == [1, 2]
        assert latest_checkpoint(out / "runs" / n).name == "step-000002"
    with pytest.raises(CompareError, match="already holds 2 steps, more than train.steps=1"):
        compare("sparse_rl_fixed40", TINY, "sparse_rl", 2, steps=1, out=out, log=quiet)
    assert len(spy.calls) == 2


def test_eval_dense_and_sparse_per_run(done, tmp_path, monkeypatch):
    src, _ = done
    out = tmp_path / "out"
    for n in ("dense-seed0", "sparse_rl-seed0"):
        shutil.copytree(src / "runs" / n, out / "runs" / n)
    spy = Spy(monkeypatch)
    compare(
        "sparse_rl_fixed40", TINY, "dense,sparse_rl", 1, steps=1, out=out, eval_data="arith", eval_limit=2, log=quiet
    )
    assert spy.calls == []
    for n in ("dense-seed0", "sparse_rl-seed0"):
        rec = json.loads((out / "eval" / f"{n}.json").read_text())
        assert rec["step"] == 1 and rec["dense"]["problems"] == 2
        assert 0 <= rec["dense"]["pass@1"] <= 1 and 0 <= rec["sparse"]["pass@1"] <= 1
        assert rec["dense"]["compressor"] == "none" and rec["sparse"]["compressor"] == "rkv"  # dense arm too
    start = json.loads((out / "eval" / "start-rkv-b{}.json".format(rec["sparse"]["kv_budget"])).read_text())
    assert start["step"] == 0 and start["dense"]["problems"] == 2 and start["sparse"]["compressor"] == "rkv"
    md = (out / "comparison.md").read_text()
    assert "Held-out evaluation" in md and "sparse − dense" in md and "*before training*" in md
    row = _table(md, "pairs")["sparse_rl"]  # one seed: the difference alone, no interval
    assert row["pairs"] == "1" and row["held-out pass@1, dense inference"].endswith("(one seed)")
    assert (
        json.loads((out / "comparison.json").read_text())["arms"]["dense"]["eval"]["dense"]["pass@1_mean"] is not None
    )
    lines = []
    compare(
        "sparse_rl_fixed40",
        TINY,
        "dense,sparse_rl",
        1,
        steps=1,
        out=out,
        eval_data="arith",
        eval_limit=2,
        log=lines.append,
    )
    assert sum("cached" in x for x in lines) == 3  # two runs and the starting model


def test_eval_prompts_are_the_runs_own(done, tmp_path, monkeypatch):
    """The held-out problems get the run's system prompt and template, as in training."""
    import sparserl.train.eval_set as data_module
    from sparserl.compare.evals import evaluate_model
    from sparserl.train.checkpoint import latest_checkpoint

    src, _ = done
    seen = []
    real = data_module.load_dataset
    monkeypatch.setattr(data_module, "load_dataset", lambda *a, **k: seen.append(k) or real(*a, **k))
    cfg = load_config("sparse_rl_fixed40", [*TINY, "data.system_prompt=Be brief."])
    model = latest_checkpoint(src / "runs" / "sparse_rl-seed0") / "model"
    rec = evaluate_model(
        str(model),
        cfg,
        "arith",
        limit=1,
        n=1,
        temperature=0.0,
        sparse=None,
        path=tmp_path / "e.json",
        record={"run": "r"},
        log=quiet,
    )
    assert seen[-1]["system_prompt"] == "Be brief." and rec["settings"]["system_prompt"] == "Be brief."


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(arms="dense,sparse_r"), "unknown arm 'sparse_r' (did you mean 'sparse_rl'?)"),
        (dict(arms="dense,dense"), "arm 'dense' is given twice"),
        (dict(arms="dense,rollout.kv_budget=16"), "looks like an override"),
        (
            dict(arms="dense,bad=rollout.kv_budget=0"),
            "arm 'bad' (bad=rollout.kv_budget=0): override: rollout.kv_budget=0",
        ),
        (dict(arms="bad=rollout.kv_budget=2"), "rollout.kv_budget=2 must be larger than rollout.window=2"),
        (dict(seeds=0), "--seeds 0: must be >= 1"),
        (dict(steps=0), "--steps 0"),
        (dict(eval_data="no_such_set"), "--eval no_such_set"),
    ],
)
def test_bad_input_fails_before_any_run(tmp_path, monkeypatch, kw, message):
    spy = Spy(monkeypatch)
    args = {"arms": "dense,sparse_rl", "seeds": 2, "steps": 1, **kw}
    with pytest.raises(CompareError) as e:
        compare("sparse_rl_fixed40", TINY, out=tmp_path / "out", log=quiet, **args)
    assert message in str(e.value)
    assert spy.calls == [] and not (tmp_path / "out" / "runs").exists()


def test_run_folder_of_another_config_is_refused(done, monkeypatch):
    out, _ = done
    spy = Spy(monkeypatch)
    with pytest.raises(CompareError, match="was trained with another config.*train.lr"):
        compare("sparse_rl_fixed40", [*TINY, "train.lr=0.01"], "dense", 1, steps=1, out=out, log=quiet)
    assert spy.calls == []


def test_unwritable_out(tmp_path, monkeypatch):
    spy = Spy(monkeypatch)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CompareError, match="exists and is not a folder"):
        compare("sparse_rl_fixed40", TINY, "dense", 1, steps=1, out=tmp_path / "file", log=quiet)
    assert spy.calls == []
