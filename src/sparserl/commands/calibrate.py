"""``sparserl calibrate``: the command's options, their checks (all before any work) and the run; the
measurement, the search and the outputs are :mod:`sparserl.calibrate`'s.

    sparserl calibrate --model M --data gsm8k --limit 64 --n 8 --compressors rkv,snapkv \\
        --budgets 32,64,128,256 --max-new-tokens 1024 --min-new-tokens 1024 --bin 128 \\
        --threshold 0.86 --json calib/smollm2.json          # also writes calib/smollm2.png

The module imports nothing heavy: the CLI builds its parser from :func:`add_parser` at every start.
"""

from __future__ import annotations

import argparse
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from ..data.options import add_data_options
from .options import DTYPES

DEFAULT_COMPRESSORS = "rkv,snapkv,streaming,h2o"
DEFAULT_BUDGETS = "32,64,128,256"
#: the largest q a sampler keeps (MiB): twice training's mismatch.alpha_record_mib, since calibrate holds no
#: learner, gradients or optimizer state beside it (the default job's 128 calibration responses: 1152 MiB)
ALPHA_RECORD_MIB = 2048


def add_parser(subparsers, parents=()) -> argparse.ArgumentParser:
    """Register ``calibrate`` on ``subparsers`` (``parents``: the CLI's common options); it runs :func:`run`."""
    p = subparsers.add_parser(
        "calibrate",
        parents=list(parents),
        help="Sparrow's offline calibration: exact α per compressor, budget "
        "and length bin, and the cheapest schedule whose α tail meets a threshold",
        description="Sample responses, measure the exact acceptance α against the dense policy per (compressor, "
        "KV budget, sequence-length bin), and pick per compressor the cheapest budget per bin, non-decreasing with "
        "length, whose 5th percentile of α stays >= --threshold. Writes --json (load a schedule with "
        "rollout.kv_schedule=OUT) and a PNG next to it.",
    )
    p.add_argument("--model", default="smollm2-135m", help="a name, HF folder or .gguf file")
    p.add_argument("--data", required=True, help="a data set name (gsm8k, math500, ...), file or folder")
    p.add_argument("--limit", type=int, default=None, help="prompts taken from --data (the first ones)")
    add_data_options(
        p,
        system_prompt_help="give the run's own, e.g. the default job's, so that the sampler "
        "compresses what it will in training",
    )
    p.add_argument("--n", type=int, default=8, help="responses per prompt")
    p.add_argument("--compressors", default=DEFAULT_COMPRESSORS, help="comma-separated compressors to calibrate")
    p.add_argument("--budgets", default=DEFAULT_BUDGETS, help="comma-separated KV budgets measured (tokens)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument(
        "--min-new-tokens",
        type=int,
        default=0,
        help="EOS does not end a response shorter than this (fills the long bins)",
    )
    p.add_argument("--bin", type=int, default=128, help="width in tokens of the sequence-length bins")
    p.add_argument("--threshold", type=float, default=0.86, help="the p5 of α every bin must reach (Sparrow: 0.86)")
    p.add_argument(
        "--tokens",
        default="sampler",
        help="sampler: each sparse sampler samples its own responses "
        "(Sparrow); dense: the dense policy samples once and every sampler is replayed on its tokens",
    )
    p.add_argument(
        "--alpha-record-mib",
        type=int,
        default=ALPHA_RECORD_MIB,
        help="with --tokens sampler: each sampler keeps q, "
        "the distribution each token was drawn from, while it samples when responses x --max-new-tokens x "
        "the vocabulary x 4 bytes fit in this many MiB (as training's mismatch.alpha_record_mib), else it "
        "is replayed on its tokens (about one more generation each); 0: always replay",
    )
    p.add_argument("--step-length", type=int, default=128, help="decode steps between compressions")
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="recent tokens always kept (default: the compressor's, or a quarter of the smallest budget where it "
        "does not fit under it)",
    )
    p.add_argument("--compress-prompt", action="store_true", help="the prompt is compressible too")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (α at that temperature)")
    p.add_argument(
        "--dtype",
        default="float32",
        help="the sampler's dtype (auto, float32, bfloat16, float16); the "
        "dense policy is float32, so float32 measures the compression alone",
    )
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", required=True, help="output JSON (the PNG goes next to it)")
    p.set_defaults(fn=run)
    return p


@dataclass
class Plan:
    """The checked options: what to measure and where the outputs go."""

    compressors: list[str]
    budgets: list[int]
    json_path: Path
    png_path: Path


def _split(text: str, option: str) -> list[str]:
    from ..errors import OptionError

    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise OptionError(f"{option} {text!r}: empty; give a comma-separated list")
    return items


def parse_budgets(text: str) -> list[int]:
    """Sorted distinct budgets from ``"32,64,..."``; an empty list or a budget that is not a positive
    whole number raises :class:`~sparserl.errors.OptionError`."""
    from ..errors import OptionError

    out = []
    for item in _split(text, "--budgets"):
        try:
            value = int(item)
        except ValueError:
            raise OptionError(f"--budgets {text!r}: {item!r} is not a whole number") from None
        if value < 1:
            raise OptionError(f"--budgets {text!r}: {value} must be >= 1 (KV tokens kept per sequence)")
        out.append(value)
    return sorted(set(out))


def window_for(name: str, args) -> int | None:
    """``--window``, else the compressor's own window where it fits under the smallest budget measured (None),
    else a quarter of that budget (as ``bench rollout`` does: SnapKV's 32-query window at budget 32). One
    window per compressor, whatever the budget, so that its rows differ by the budget alone."""
    from ..rollout.kv import CompressorOptionError, build_compressor

    if args.window is not None:
        return args.window
    smallest = min(parse_budgets(args.budgets))
    try:
        build_compressor(name, kv_budget=smallest, step_length=args.step_length)
    except CompressorOptionError:
        return max(1, smallest // 4)
    return None


def sampler(name: str, budget: int | None, args, schedule: list[list[int]] | None = None):
    """The compressor ``name`` at ``budget`` (or with ``schedule``) and the command's common options."""
    from ..rollout.kv import build_compressor

    return build_compressor(
        name,
        kv_budget=budget,
        step_length=args.step_length,
        window=window_for(name, args),
        compress_prompt=args.compress_prompt or None,
        kv_schedule=schedule,
    )


def check(args) -> Plan:
    """Every option, before any work: one :class:`~sparserl.errors.SparserlError` naming the first bad one."""
    from ..calibrate.measure import TOKENS
    from ..checks import check_choice, check_int, check_number, check_output_file
    from ..errors import OptionError
    from ..registry import UnknownNameError

    check_int(args.n, "--n", 1, what="responses per prompt")
    check_int(args.limit, "--limit", 1, allow_none=True, what="prompts; leave it out for all")
    check_int(args.max_new_tokens, "--max-new-tokens", 1)
    check_int(args.min_new_tokens, "--min-new-tokens", 0)
    if args.min_new_tokens > args.max_new_tokens:
        raise OptionError(f"--min-new-tokens {args.min_new_tokens}: must be <= --max-new-tokens {args.max_new_tokens}")
    check_int(args.bin, "--bin", 1, what="width in tokens of the sequence-length bins")
    check_number(args.threshold, "--threshold", gt=0, le=1, what="the p5 of α every bin must reach")
    check_number(args.temperature, "--temperature", ge=0, what="0 = greedy")
    check_int(args.step_length, "--step-length", 1, what="decode steps between compressions")
    check_int(args.window, "--window", 0, allow_none=True)
    check_choice(args.tokens, "--tokens", TOKENS)
    check_int(
        getattr(args, "alpha_record_mib", ALPHA_RECORD_MIB), "--alpha-record-mib", 0, what="MiB; 0 = always replay"
    )
    if (
        getattr(args, "template", None) is not None
        and "{problem}" not in args.template
        and "{prompt}" not in args.template
    ):
        raise OptionError(f"--template {args.template!r}: must contain '{{problem}}' (where the problem goes)")
    check_choice(args.dtype, "--dtype", DTYPES)
    budgets = parse_budgets(args.budgets)
    names = list(dict.fromkeys(_split(args.compressors, "--compressors")))
    if "none" in names:
        raise OptionError(
            "--compressors: 'none' is the dense policy, the reference every sampler is measured "
            "against; list compressors only"
        )
    for name in names:  # every sampler builds: an unknown name or a budget under the window fails now
        for budget in budgets:
            try:
                sampler(name, budget, args)
            except UnknownNameError as e:
                raise OptionError(f"--compressors: {e}") from None
    json_path = check_output_file(args.json, "--json")
    png_path = json_path.with_suffix(".png")
    if png_path == json_path:
        raise OptionError(f"--json {args.json}: the PNG goes next to the JSON as <name>.png; give a .json path")
    check_output_file(png_path, "--json (its PNG)")
    return Plan(names, budgets, json_path, png_path)


def command_line(args) -> str:
    """The command as it would be typed again (every option, defaults included)."""
    parts = ["sparserl", "calibrate"]
    for key in (
        "model",
        "data",
        "limit",
        "prompt_key",
        "label_key",
        "template",
        "system_prompt",
        "n",
        "compressors",
        "budgets",
        "max_new_tokens",
        "min_new_tokens",
        "bin",
        "threshold",
        "tokens",
        "alpha_record_mib",
        "step_length",
        "window",
        "temperature",
        "dtype",
        "device",
        "seed",
        "json",
    ):
        value = getattr(args, key, None)
        if value is not None:
            parts += [f"--{key.replace('_', '-')}", str(value)]
    if getattr(args, "compress_prompt", False):
        parts.append("--compress-prompt")
    return shlex.join(parts)


def _load_prompts(args):
    from ..data.options import load_from_options

    return load_from_options(args)


def run(args) -> int:
    """``sparserl calibrate``: check, load, measure, search, time the schedules, write JSON + PNG, print."""
    plan = check(args)
    data = _load_prompts(args)
    from ..models.loading import check_model, resolve_device

    device = resolve_device(args.device, key="--device")
    check_model(args.model)

    import torch

    from ..calibrate import output, plot, search, speed
    from ..calibrate.measure import measure
    from ..data import DataError
    from ..models.loading import load_model
    from ..models.machine import cpu_name
    from ..rollout.dtype_auto import resolve_dtype
    from ..rollout.engine import RolloutEngine
    from ..rollout.kv import build_compressor
    from ..rollout.sampling import SamplingParams

    t_start = time.perf_counter()
    dtype = resolve_dtype(args.dtype, device)
    lm = load_model(args.model, dtype="float32", device=device)  # the dense policy p
    dense_engine = RolloutEngine(lm, build_compressor("none"), dtype=dtype)
    prompt_ids = [dense_engine.encode(e.prompt) for e in data]
    for i, ids in enumerate(prompt_ids):
        if not ids or len(ids) >= dense_engine.model.max_positions:
            raise DataError(
                f"--data {args.data}: prompt {i} has {len(ids)} tokens; the model takes 1 to "
                f"{dense_engine.model.max_positions - 1}"
            )
    params = SamplingParams(
        n=args.n,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens,
        seed=args.seed,
    )
    print(
        f"calibrate: {len(prompt_ids)} prompts x {args.n} responses, {len(plan.compressors)} compressors x "
        f"{len(plan.budgets)} budgets, tokens from the {args.tokens}, bins of {args.bin}"
    )
    samplers = [(name, b, sampler(name, b, args)) for name in plan.compressors for b in plan.budgets]
    result = measure(
        dense_engine,
        lm.model,
        samplers,
        prompt_ids,
        params,
        args.bin,
        tokens=args.tokens,
        record_mib=getattr(args, "alpha_record_mib", ALPHA_RECORD_MIB),
    )

    schedules, cost_cache = [], {}
    for name in plan.compressors:
        entry = search.cheapest_schedule(result.rows, name, args.threshold)
        if entry["unmet_bins"]:
            print(
                f"{name}: no measured budget keeps the p5 of α >= {args.threshold:g} in the bins starting at "
                f"{', '.join(map(str, entry['unmet_bins']))}: the schedule keeps the largest budget "
                f"({plan.budgets[-1]}) there (unmet_bins)"
            )
        if entry["nonmonotone_bins"]:
            print(
                f"{name}: in the bins starting at {', '.join(map(str, entry['nonmonotone_bins']))} the chosen budget "
                f"measured under {args.threshold:g} although a smaller one met it (sampling noise: more --n or "
                "--limit would settle it; nonmonotone_bins)"
            )
        timed = speed.measured_speedup(
            dense_engine, sampler(name, None, args, entry["budget_by_bin"]), prompt_ids, params
        )
        entry["predicted_cost_vs_dense"] = speed.predicted_cost(
            dense_engine,
            lm.model.config,
            name,
            entry["budget_by_bin"],
            n=timed["dense_responses"],
            prompt_len=sum(map(len, prompt_ids)) / len(prompt_ids),
            response_len=timed["dense_tokens"] / max(1, timed["dense_responses"]),
            step_length=args.step_length,
            window=window_for(name, args),
            compress_prompt=bool(args.compress_prompt),
            cache=cost_cache,
        )
        entry["measured_tokens_per_s_vs_dense"] = timed["measured_tokens_per_s_vs_dense"]
        entry["measured_tokens_per_s"] = timed["tokens_per_s"]
        entry["measured_dense_tokens_per_s"] = timed["dense_tokens_per_s"]
        entry["measured_rounds"] = speed.ROUNDS
        schedules.append(entry)

    meta = {
        "command": command_line(args),
        "model": args.model,
        "data": args.data,
        "limit": args.limit,
        **{key: getattr(args, key, None) for key in ("prompt_key", "label_key", "template", "system_prompt")},
        "prompts": len(prompt_ids),
        "responses": len(prompt_ids) * args.n,
        "cpu": cpu_name(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "sampler_dtype": str(dtype).replace("torch.", ""),
        "dense_dtype": "float32",
        "sampling": {
            "n": args.n,
            "temperature": args.temperature,
            "max_new_tokens": args.max_new_tokens,
            "min_new_tokens": args.min_new_tokens,
            "top_p": params.top_p,
            "top_k": params.top_k,
        },
        "compressor_options": {
            "step_length": args.step_length,
            "window": {name: window_for(name, args) for name in plan.compressors},
            "compress_prompt": bool(args.compress_prompt),
        },
        "tokens": args.tokens,
        "bin": args.bin,
        "threshold": args.threshold,
        "budgets": plan.budgets,
        "compressors": plan.compressors,
        "seed": args.seed,
        "seq_len": "prompt + tokens generated before the token (the axis of KVSchedule's lengths)",
        "replay_err_max": result.replay_err_max,
        "q": result.samplers[0]["q"] if result.samplers else None,
        "measured_rounds": speed.ROUNDS,
        "measured": "tokens/s of one generation with each schedule over one dense generation just before it",
        "seconds": time.perf_counter() - t_start,
    }
    doc = output.document(result.rows, schedules, result.samplers, meta)
    output.write_json(doc, plan.json_path)
    plot.plot_alpha(
        result.rows,
        args.threshold,
        plan.png_path,
        title=f"{args.model} on {args.data}: exact α per length bin ({args.tokens} tokens)",
    )
    output.print_tables(result.rows, schedules, args.threshold)
    err = result.replay_err_max
    if err is not None:
        print(f"replay check: largest |replayed - recorded| sampler log-prob {err:.2e}")
    elif args.tokens == "dense":
        print("replay check: none (--tokens dense: the samplers were replayed on the dense policy's tokens)")
    else:
        print("replay check: none needed (each sampler kept q while it sampled; --alpha-record-mib 0 replays)")
    print(f"wrote {plan.json_path} and {plan.png_path}")
    return 0
