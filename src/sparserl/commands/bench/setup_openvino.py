"""``sparserl bench setup-openvino``: set up the OpenVINO peer of ``bench rollout --peers openvino``: its
runtime here, its model exporter in an environment of its own."""

from __future__ import annotations

from ...checks import check_output_dir


def add_parser(subparsers, parents=()):
    bo = subparsers.add_parser(
        "setup-openvino",
        parents=list(parents),
        help="set up the OpenVINO peer of bench "
        "rollout --peers openvino: its runtime here, its model exporter in an environment of "
        "its own",
    )
    bo.add_argument(
        "--venv",
        default=None,
        help="the exporter's environment (default $SPARSERL_CACHE/openvino/exporter, where --peers openvino looks)",
    )
    bo.add_argument("--force", action="store_true", help="recreate the exporter's environment")
    bo.set_defaults(fn=run)
    return bo


def run(args) -> int:
    from ...bench.openvino_setup import setup

    if args.venv is not None:
        check_output_dir(args.venv, "--venv")
    setup(venv=args.venv, force=args.force)
    return 0
