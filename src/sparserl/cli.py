"""The ``sparserl`` command: train, rollout, eval, report, bench."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _read_prompts(path: str) -> list:
    p = Path(path)
    if not p.exists():
        raise SystemExit(f"error: prompts file {path} not found")
    prompts = []
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"error: {path} line {lineno}: invalid JSON: {e}")
        if not isinstance(row, dict) or "prompt" not in row:
            raise SystemExit(f"error: {path} line {lineno}: missing key 'prompt'")
        prompt = row["prompt"]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt))):
            raise SystemExit(f"error: {path} line {lineno}: 'prompt' must be a string or a list of chat messages")
        prompts.append(prompt)
    if not prompts:
        raise SystemExit(f"error: prompts file {path} is empty")
    return prompts


def cmd_rollout(args) -> int:
    from .errors import SparserlError
    from .models.loading import ModelLoadError, load_model
    from .rollout.engine import RolloutEngine
    from .rollout.kv import compressor_from_fields
    from .rollout.sampling import SamplingParams

    prompts = _read_prompts(args.prompts)
    try:
        comp = compressor_from_fields(args)  # --compressor, --kv-budget, ..., --compressor-options
    except SparserlError as e:
        raise SystemExit(f"error: {e}")
    try:
        lm = load_model(args.model, dtype=args.dtype)
    except ModelLoadError as e:
        raise SystemExit(f"error: {e}")
    engine = RolloutEngine(lm, comp, dtype=args.dtype)
    params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_new_tokens=args.max_new_tokens, stop=args.stop or [], seed=args.seed)
    try:
        out = engine.generate(prompts, params)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for i in range(len(out.response_ids)):
            f.write(json.dumps({
                "prompt_index": out.prompt_index[i],
                "prompt_ids": out.prompt_ids[i],
                "response_ids": out.response_ids[i],
                "sampler_logprobs": out.sampler_logprobs[i],
                "finish_reason": out.finish_reason[i],
                "kv_tokens_kept": out.kv_tokens_kept[i],
                "text": out.texts[i],
            }) + "\n")
    print(f"{len(out.response_ids)} responses -> {args.out}: {out.tokens_generated} tokens in "
          f"{out.seconds:.1f}s ({out.tokens_per_s:.1f} tok/s); KV peak {out.kv.bytes_peak / 2**20:.1f} MiB "
          f"(dense would need {out.kv.bytes_dense / 2**20:.1f} MiB), {out.kv.compressions} compressions")
    return 0


def cmd_demo(args) -> int:
    """A short rollout on the embedded model: prints what it generated, its speed and KV memory."""
    from .models.loading import load_model
    from .rollout.engine import RolloutEngine
    from .rollout.kv import build_compressor
    from .rollout.sampling import SamplingParams

    lm = load_model(args.model, dtype="auto")
    prompt = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}]
    for name in ("none", "rkv"):
        comp = build_compressor(name, kv_budget=32, step_length=16)
        out = RolloutEngine(lm, comp, dtype="auto").generate([prompt], SamplingParams(n=4, max_new_tokens=96, temperature=0.7))
        print(f"--- {name}: {out.tokens_per_s:.0f} tok/s, KV peak {out.kv.bytes_peak / 2**20:.2f} MiB "
              f"(dense {out.kv.bytes_dense / 2**20:.2f} MiB)")
        print(out.texts[0][:300])
    return 0


def cmd_bench_rollout(args) -> int:
    from .bench.rollout import run_bench, write_json

    comps = [c for c in args.compressors.split(",") if c and c != "none"]
    report = run_bench(model=args.model, batch=args.batch, max_new_tokens=args.max_new_tokens,
                       kv_budget=args.kv_budget, compressors=comps, dtype=args.dtype,
                       step_length=args.step_length, seed=args.seed, hf_baseline=not args.no_hf)
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    return 0


def cmd_train(args) -> int:
    from .config import ConfigError, load_config, validate
    from .train.trainer import train

    try:
        cfg = validate(load_config(args.config, args.overrides))
    except ConfigError as e:
        raise SystemExit(f"error: {e}")
    run_dir = train(cfg, resume=args.resume, run_dir=args.run_dir)
    return 0 if run_dir else 1


def cmd_eval(args) -> int:
    from .eval.evaluate import evaluate_cli

    return evaluate_cli(args)


def cmd_report(args) -> int:
    from .eval.report import make_report

    path = make_report(args.run_dir)
    print(f"report: {path}")
    return 0


def cmd_compare(args) -> int:
    from .compare import compare_cli

    return compare_cli(args)


def _add_sampler_args(p, budget_default=256, step_default=128):
    p.add_argument("--compressor", default="none", help="none, rkv, snapkv, streaming, h2o")
    p.add_argument("--kv-budget", type=int, default=budget_default)
    p.add_argument("--step-length", type=int, default=step_default)
    p.add_argument("--trigger", default="step_length", choices=["step_length", "newline"])
    p.add_argument("--window", type=int, default=None)
    p.add_argument("--compressor-options", default=None, help='JSON, e.g. \'{"lam": 0.1}\'')


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sparserl", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="GRPO on compressed rollouts")
    t.add_argument("config", nargs="?", default="default", help="a YAML file or a preset name")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.kv_budget=64")
    t.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its last checkpoint")
    t.add_argument("--run-dir", default=None)
    t.set_defaults(fn=cmd_train)

    r = sub.add_parser("rollout", help="sample responses with the compressed engine")
    r.add_argument("--model", default="smollm2-135m")
    r.add_argument("--prompts", required=True, help="JSON lines with 'prompt' (string or chat messages)")
    r.add_argument("--n", type=int, default=1)
    r.add_argument("--max-new-tokens", type=int, default=256)
    r.add_argument("--temperature", type=float, default=1.0)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--top-k", type=int, default=0)
    r.add_argument("--stop", action="append")
    r.add_argument("--dtype", default="auto")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", required=True)
    _add_sampler_args(r)
    r.set_defaults(fn=cmd_rollout)

    d = sub.add_parser("demo", help="a short rollout demo on the embedded model")
    d.add_argument("--model", default="smollm2-135m")
    d.set_defaults(fn=cmd_demo)

    e = sub.add_parser("eval", help="accuracy of a model or checkpoint under dense and sparse inference")
    e.add_argument("--model", default="smollm2-135m", help="a name, HF folder or checkpoint folder")
    e.add_argument("--data", default="arith")
    e.add_argument("--limit", type=int, default=None)
    e.add_argument("--n", type=int, default=1, help="samples per problem (avg@n, pass@n)")
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--max-new-tokens", type=int, default=256)
    e.add_argument("--dtype", default="auto")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--batch", type=int, default=32)
    e.add_argument("--out", default=None, help="JSON output path")
    _add_sampler_args(e)
    e.set_defaults(fn=cmd_eval)

    rp = sub.add_parser("report", help="plots and a markdown summary of a run")
    rp.add_argument("run_dir")
    rp.set_defaults(fn=cmd_report)

    c = sub.add_parser("compare", help="arms x seeds as training runs, then one comparison (plots, table)")
    c.add_argument("config", nargs="?", default="default", help="a YAML file or a preset name (every arm's base)")
    c.add_argument("overrides", nargs="*", help="dotted overrides shared by every arm")
    c.add_argument("--arms", action="append", help="comma-separated: dense, sparse_naive, sparse_rl, base, "
                   "preset:<name>, or NAME=key=value;key=value (default dense,sparse_naive,sparse_rl)")
    c.add_argument("--seeds", type=int, default=3, help="runs per arm, train.seed = 0 .. N-1")
    c.add_argument("--seed-list", default=None, help="explicit seeds instead, e.g. 0,1,2")
    c.add_argument("--steps", type=int, default=None, help="train.steps of every run")
    c.add_argument("--eval", default=None, help="held-out set: evaluate each final model, dense and sparse")
    c.add_argument("--eval-limit", type=int, default=None)
    c.add_argument("--eval-n", type=int, default=1)
    c.add_argument("--eval-temperature", type=float, default=0.0)
    c.add_argument("--collapse-k3", type=float, default=1.0, help="k3 KL above which a seed counts as collapsed")
    c.add_argument("--out", required=True, help="folder of the runs (runs/) and the comparison")
    c.set_defaults(fn=cmd_compare)

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    br = bsub.add_parser("rollout", help="rollout speed and KV memory vs transformers' generate")
    br.add_argument("--model", default="smollm2-135m")
    br.add_argument("--batch", type=int, default=16)
    br.add_argument("--max-new-tokens", type=int, default=256)
    br.add_argument("--kv-budget", type=int, default=256)
    br.add_argument("--step-length", type=int, default=128)
    br.add_argument("--compressors", default="none,rkv,snapkv,streaming,h2o")
    br.add_argument("--dtype", default="auto")
    br.add_argument("--seed", type=int, default=0)
    br.add_argument("--no-hf", action="store_true", help="skip the transformers generate baseline")
    br.add_argument("--json", default=None)
    br.set_defaults(fn=cmd_bench_rollout)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
