"""``sparserl bench learner``: the learner's step (scoring, update) in float32 against bfloat16 mixed
precision (``model.mixed_precision``), on a rollout of a config's job."""

from __future__ import annotations

from ...checks import check_int, check_output_file
from ..options import add_config_arguments, split_config_arg


def add_parser(subparsers, parents=()):
    bl = subparsers.add_parser(
        "learner",
        parents=list(parents),
        help="the learner's step (scoring, update) in "
        "float32 against bfloat16 mixed precision (model.mixed_precision), on a rollout of a "
        "config's job",
    )
    add_config_arguments(bl, overrides_help="dotted overrides, e.g. train.micro_batch_size=8")
    bl.add_argument("--repeat", type=int, default=3, help="rounds; each times both precisions (order alternating)")
    bl.add_argument("--json", default=None)
    bl.set_defaults(fn=run)
    return bl


def run(args) -> int:
    from ...bench.learner import run_bench
    from ...bench.rollout import sparserl_commit, write_json
    from ...config import load_config, validate

    split_config_arg(args)
    check_int(args.repeat, "--repeat", 1, what="rounds of both precisions; the per-round ratios' median is reported")
    if args.json:
        check_output_file(args.json, "--json")
    report = run_bench(validate(load_config(args.config or "default", args.overrides)), repeat=args.repeat)
    report["command"] = " ".join(
        [
            "sparserl bench learner",
            *([args.config] if args.config else []),
            *args.overrides,
            "--repeat",
            str(args.repeat),
        ]
    )
    report["commit"] = sparserl_commit()
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    return 0
