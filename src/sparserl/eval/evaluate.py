"""``sparserl eval``: accuracy of a model or checkpoint on a data set, under dense and under sparse
inference (any compressor and budget), written as JSON.

With ``n`` samples per problem: ``avg@n`` = mean reward over all samples, ``pass@1`` = the fraction of
samples that pass (reward >= 1: the unbiased estimate of pass@1; = avg@n for a 0/1 reward), ``pass@n`` =
the fraction of problems with at least one sample that passes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..data.options import load_from_options
from ..models.loading import load_model
from ..reward import RewardSpecError, load_reward, score_responses
from ..rollout.dtype_auto import resolve_dtype
from ..rollout.engine import RolloutEngine
from ..rollout.kv import build_compressor
from ..rollout.sampling import SamplingParams
from ..runlog import EVAL_FILE


def evaluate(engine: RolloutEngine, examples, params: SamplingParams, reward_fn, batch: int = 32) -> dict:
    """Generate ``params.n`` samples per example and score them."""
    n = params.n
    rewards_all, errors, tokens, kv_peak, kv_dense = [], 0, 0, 0, 0
    t0 = time.perf_counter()
    for s in range(0, len(examples), max(1, batch // n)):
        chunk = examples[s : s + max(1, batch // n)]
        out = engine.generate([e.prompt for e in chunk], params)
        asked = [chunk[i] for i in out.prompt_index]
        r, e = score_responses(reward_fn, out.texts, [x.label for x in asked], [x.prompt_text for x in asked])
        rewards_all += r
        errors += e
        tokens += out.tokens_generated
        kv_peak = max(kv_peak, out.kv.bytes_peak)
        kv_dense = max(kv_dense, out.kv.bytes_dense)
    per_problem = [rewards_all[i * n : (i + 1) * n] for i in range(len(examples))]
    return {
        "problems": len(examples),
        "n": n,
        f"avg@{n}": sum(rewards_all) / max(1, len(rewards_all)),
        "pass@1": sum(x >= 1.0 for x in rewards_all) / max(1, len(rewards_all)),
        f"pass@{n}": sum(any(x >= 1.0 for x in p) for p in per_problem) / max(1, len(per_problem)),
        "reward_errors": errors,
        "tokens": tokens,
        "seconds": time.perf_counter() - t0,
        "kv_bytes_peak": kv_peak,
        "kv_bytes_dense": kv_dense,
    }


def evaluate_cli(args) -> int:
    """``sparserl eval``: every option, the output path, the compressor, the data and the model's path
    are checked before the model loads (errors are :class:`~sparserl.errors.SparserlError` s)."""
    from ..checks import check_choice, check_int, check_number, check_output_file, check_sampler_options
    from ..errors import OptionError
    from ..models.loading import check_model

    check_int(args.n, "--n", 1, what="samples per problem")
    check_int(args.batch, "--batch", 1, what="sequences generated at once")
    check_int(args.limit, "--limit", 1, allow_none=True, what="problems to evaluate; leave it out for all")
    check_int(args.max_new_tokens, "--max-new-tokens", 1)
    check_number(args.temperature, "--temperature", ge=0, what="0 = greedy")
    check_number(args.reward_timeout_s, "--reward-timeout-s", gt=0, le=86400, what="seconds to score one response")
    check_choice(args.dtype, "--dtype", ("auto", "float32", "bfloat16", "float16"))
    for option, value, what in (
        ("--prompt-key", args.prompt_key, "prompt"),
        ("--label-key", args.label_key, "reference answer"),
    ):
        if value is not None and not value.strip():
            raise OptionError(f"{option} {value!r}: name the column that holds the {what} (or leave it out)")
    if args.template is not None and "{problem}" not in args.template and "{prompt}" not in args.template:
        raise OptionError(f"--template {args.template!r}: must contain '{{problem}}' (where the problem goes)")
    sparse = check_sampler_options(args)  # --compressor, --kv-budget, ..., --compressor-options
    if args.out:
        check_output_file(args.out, "--out")
    # dense first, then the asked compressor (built from the command's sampler options)
    comps = [build_compressor("none")] + ([sparse] if sparse.compresses else [])
    data = load_from_options(args)
    try:
        reward_fn = load_reward(args.reward, timeout_s=args.reward_timeout_s)
    except RewardSpecError as e:
        raise type(e)(f"--reward {args.reward}: {e}") from None
    check_model(args.model)
    dtype = resolve_dtype(args.dtype)
    lm = load_model(args.model, dtype=dtype)
    params = SamplingParams(n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    results = {"model": args.model, "data": args.data, "reward": args.reward, "runs": []}
    for comp in comps:
        name = comp.name
        res = evaluate(RolloutEngine(lm, comp, dtype=dtype), list(data), params, reward_fn, args.batch)
        res.update({"compressor": name, "kv_budget": args.kv_budget if comp.compresses else None})
        results["runs"].append(res)
        stats = f"pass@1 {res['pass@1']:.3f}  avg@{args.n} {res[f'avg@{args.n}']:.3f}" + (
            f"  pass@{args.n} {res[f'pass@{args.n}']:.3f}" if args.n > 1 else ""
        )
        print(
            f"{name:>9}: {stats}  ({res['problems']} problems, {res['seconds']:.0f}s, "
            f"KV peak {res['kv_bytes_peak'] / 2**20:.1f} MiB)"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
        print(f"wrote {args.out}")
    return 0


def write_eval_record(run_dir: str | Path, step: int, data: str, results: dict[str, dict]) -> Path:
    """Write one held-out evaluation of a run (``{"step", "data", "dense": {...}, "sparse": {...}}``,
    each mode holding :func:`evaluate`'s figures) to ``<run>/eval-step<N>.json``, the file the
    report reads."""
    path = Path(run_dir) / EVAL_FILE.format(step=step)
    path.write_text(json.dumps({"step": step, "data": data, **results}, indent=2))
    return path
