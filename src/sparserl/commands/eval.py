"""``sparserl eval``: accuracy of a model or checkpoint under dense and sparse inference
(:func:`sparserl.eval.evaluate.evaluate_cli` checks the options and runs it)."""

from __future__ import annotations

from ..data.options import add_data_options
from .options import add_sampler_options


def add_parser(subparsers, parents=()):
    e = subparsers.add_parser(
        "eval", parents=list(parents), help="accuracy of a model or checkpoint under dense and sparse inference"
    )
    e.add_argument("--model", default="smollm2-135m", help="a name, HF folder or checkpoint folder")
    e.add_argument("--data", default="arith", help="a data set name (gsm8k, math500, ...), file or folder, or arith")
    e.add_argument("--limit", type=int, default=None)
    add_data_options(e)
    e.add_argument(
        "--reward",
        default="math",
        help="as reward.fn: a built-in reward (math) or 'module:function' taking (response, label[, prompt])",
    )
    e.add_argument(
        "--reward-timeout-s",
        type=float,
        default=5.0,
        help="as reward.timeout_s: seconds allowed to score one response before it scores 0",
    )
    e.add_argument("--n", type=int, default=1, help="samples per problem (avg@n, pass@n)")
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--max-new-tokens", type=int, default=256)
    e.add_argument("--dtype", default="auto")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--batch", type=int, default=32)
    e.add_argument("--out", default=None, help="JSON output path")
    add_sampler_options(e)
    e.set_defaults(fn=run)
    return e


def run(args) -> int:
    from ..eval.evaluate import evaluate_cli

    return evaluate_cli(args)
