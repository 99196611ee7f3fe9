"""``sparserl bench step``: whole RL steps of a config's job under several samplers (dense, a fixed R-KV budget,
the config's own, block top-k, int8 weights, or arms of your own), split by station, in one process."""

from __future__ import annotations

from ...checks import check_int, check_output_file
from ..options import add_config_arguments, split_config_arg

#: the arms run when none is given: name → overrides of the config (block top-k's budget: the config's
#: rounded up to whole pages of 16 tokens, :func:`default_arms`)
DEFAULT_ARMS = {
    "dense": ["rollout.compressor=none", "rollout.kv_controller=null"],
    "config": [],
    "rkv_fixed": ["rollout.compressor=rkv", "rollout.kv_controller=null"],
    "blocktopk": ["rollout.compressor=blocktopk", "rollout.kv_controller=null"],
    "int8": ["rollout.compressor=none", "rollout.kv_controller=null", "rollout.quant=int8"],
}


def default_arms(cfg) -> dict[str, list[str]]:
    """:data:`DEFAULT_ARMS` for ``cfg``: block top-k reads ``rollout.kv_budget`` rounded up to a multiple of 16."""
    pages = -(-cfg.rollout.kv_budget // 16) * 16
    return {n: o + [f"rollout.kv_budget={pages}"] * (n == "blocktopk") for n, o in DEFAULT_ARMS.items()}


def add_parser(subparsers, parents=()):
    bs = subparsers.add_parser(
        "step",
        parents=list(parents),
        help="whole RL steps of a config's job under several samplers, split by station "
        "(rollout, reward, scoring, α, update), with peak memory and KV bytes",
    )
    add_config_arguments(bs, overrides_help="dotted overrides of every arm, e.g. rollout.max_new_tokens=1024")
    bs.add_argument(
        "--arm",
        nargs="+",
        action="append",
        metavar=("NAME", "KEY=VALUE"),
        default=None,
        help="an arm: its name and its overrides (repeat --arm for each); default: "
        + ", ".join(f"{k} ({' '.join(v) or 'the config as it is'})" for k, v in DEFAULT_ARMS.items()),
    )
    bs.add_argument("--baseline", default=None, help="the arm the ratios divide by (default: the first)")
    bs.add_argument("--repeat", type=int, default=2, help="rounds; each runs one step of every arm")
    bs.add_argument("--json", default=None)
    bs.set_defaults(fn=run)
    return bs


def run(args) -> int:
    from ... import runlog as names
    from ...bench.rollout import sparserl_commit, write_json
    from ...bench.step import STATIONS, run_rounds, summarize
    from ...config import ConfigError, load_config, validate
    from ...models.machine import cpu_name

    split_config_arg(args)
    check_int(args.repeat, "--repeat", 1, what="rounds of every arm; per-round ratios' medians are reported")
    if args.json:
        check_output_file(args.json, "--json")
    base = args.config or "default"
    if args.arm:
        arm_overrides = {a[0]: a[1:] for a in args.arm}
    else:
        arm_overrides = default_arms(validate(load_config(base, args.overrides)))
    baseline = args.baseline or next(iter(arm_overrides))
    if baseline not in arm_overrides:
        raise ConfigError(f"--baseline {baseline!r}: not an arm ({', '.join(arm_overrides)})")
    arms = {  # every arm's config is validated before the first one runs
        name: validate(load_config(base, [*args.overrides, *extra])) for name, extra in arm_overrides.items()
    }

    def progress(r, name, out):
        stations = ", ".join(f"{s} {out[s]:.1f}" for s in STATIONS if s in out)
        print(
            f"round {r + 1} {name}: step {out[names.TIME_STEP]:.1f} s ({stations}), "
            f"peak {out['rss_peak_bytes'] / 2**30:.2f} GiB{_predicted(out)}",
            flush=True,
        )

    results = run_rounds(arms, args.repeat, progress)
    report = {
        "command": " ".join(
            ["sparserl bench step", base, *args.overrides]
            + [f"--arm {n} {' '.join(o)}" for n, o in arm_overrides.items()] * bool(args.arm)
            + ["--repeat", str(args.repeat)]
        ),
        "commit": sparserl_commit(),
        "machine": cpu_name(),
        "baseline": baseline,
        "arms": {n: o for n, o in arm_overrides.items()},
        "summary": summarize(results, baseline),
        "rounds": results,
    }
    for name, row in report["summary"].items():
        print(
            f"{name:>12}: step {row[names.TIME_STEP]:.1f} s = {row['step_vs_baseline']:.2f}x {baseline}, "
            f"rollout {row.get('rollout_frac', 0):.0%} of it, peak {row['rss_peak_bytes'] / 2**30:.2f} GiB"
            f"{_predicted(row)}, "
            f"KV {row.get(names.KV_SAMPLER_ALLOC, 0) / 2**20:.0f} MiB"
        )
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    return 0


def _predicted(out: dict) -> str:
    """`` (predicted 8.27 GiB)``: preflight's prediction of the arm's peak, where the step logged one."""
    from ...runlog import MEMORY_PREDICTED_PEAK

    predicted = out.get(MEMORY_PREDICTED_PEAK)
    return "" if predicted is None else f" (predicted {predicted / 2**30:.2f} GiB)"
