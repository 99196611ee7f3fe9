"""``sparserl train``: GRPO on compressed rollouts, from a preset, a YAML file and ``key=value`` overrides,
or a run resumed from its last complete checkpoint."""

from __future__ import annotations

from ..checks import check_output_dir
from ..errors import OptionError
from .options import split_config_arg


def add_parser(subparsers, parents=()):
    from ..config.loading import list_presets
    from ..runlog import RESUME_FREE_KEYS

    t = subparsers.add_parser("train", parents=list(parents), help="GRPO on compressed rollouts")
    t.add_argument(
        "config",
        nargs="?",
        default=None,
        help="a YAML file or a preset name (" + ", ".join(list_presets()) + "; default: 'default'; with "
        "--resume: the run's own config)",
    )
    t.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. rollout.kv_budget=64 (every key: sparserl config --keys)"
    )
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue a run from its last complete checkpoint: the one in --run-dir, else the newest "
        "under log.out_dir. The config must match the run's, except " + ", ".join(RESUME_FREE_KEYS),
    )
    t.add_argument(
        "--allow-config-change",
        action="store_true",
        help="with --resume: go on although other keys differ from the run's config; the new config "
        "is kept as config-resume-<step>.yaml and the run's config.yaml stays",
    )
    t.add_argument("--run-dir", default=None, help="the run folder (default: log.out_dir/<time>-<config name>)")
    t.set_defaults(fn=run)
    return t


def run(args) -> int:
    from ..config import load_config, validate
    from ..train.run_folder import find_resume_folder, load_recorded_config, recorded_configs
    from ..train.trainer import train

    split_config_arg(args)
    if args.allow_config_change and not args.resume:
        raise OptionError("--allow-config-change applies only with --resume (a new run has no earlier config)")
    run_dir = args.run_dir
    if run_dir is not None:
        check_output_dir(run_dir, "--run-dir")
    if args.resume and args.config is None:
        # resume with the run's own config (the newest it ran with); overrides apply on top
        locator = load_config("default", args.overrides)  # log.out_dir / log.run_name to find the run
        folder = find_resume_folder(locator, run_dir, config_from_run=True)  # no config.yaml: refused here
        recorded = recorded_configs(folder)  # none only when the run has no checkpoint either
        cfg = validate(
            load_recorded_config(recorded[-1], args.overrides) if recorded else load_config("default", args.overrides)
        )
        run_dir = folder
    else:
        cfg = validate(load_config(args.config or "default", args.overrides))
    result = train(cfg, resume=args.resume, run_dir=run_dir, allow_config_change=args.allow_config_change)
    return 0 if result else 1
