"""The ``sparserl`` command: train, config, rollout, eval, report, compare, calibrate, bench, demo.

Every command checks its options (numbers, output paths, files) before it loads a model or generates
anything. A problem with the user's input is a :class:`~sparserl.errors.SparserlError`: ``main`` prints
``error: <message>`` and returns 1, without a traceback (``--debug`` or ``SPARSERL_DEBUG=1`` shows it).
Any other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import traceback
from pathlib import Path

from .checks import (check_choice, check_int, check_number, check_output_dir, check_output_file,
                     check_sampler_options)
from .data.options import add_data_options
from .errors import OptionError, SparserlError

DTYPES = ("auto", "float32", "bfloat16", "float16")


def _read_prompts(path: str, key: str = "prompt") -> list:
    """The prompts of ``sparserl rollout --prompts``: the ``key`` of each JSON line, a string or chat messages."""
    from .data.loaders import DataError, read_text_lines

    prompts = []
    for lineno, line in read_text_lines(path, what="--prompts file"):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(row, dict) or key not in row:
            columns = f"; its keys are {sorted(row)}, --prompt-key names another" if isinstance(row, dict) else ""
            raise DataError(f"{path} line {lineno}: missing key {key!r} (each line is a JSON object with a "
                            f"{key!r}: a string or a list of chat messages{columns})")
        prompt = row[key]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt))):
            raise DataError(f"{path} line {lineno}: {key!r} must be a string or a list of chat messages")
        if not (prompt.strip() if isinstance(prompt, str) else prompt):
            raise DataError(f"{path} line {lineno}: {key!r} is empty")
        prompts.append(prompt)
    if not prompts:
        raise DataError(f"--prompts file {path} is empty (expected JSON lines with a {key!r})")
    return prompts


def _check_generation_args(args, *, top: bool = False) -> None:
    check_int(args.n, "--n", 1, what="samples per prompt")
    check_int(args.max_new_tokens, "--max-new-tokens", 1)
    check_number(args.temperature, "--temperature", ge=0, what="0 = greedy")
    if top:
        check_number(args.top_p, "--top-p", gt=0, le=1)
        check_int(args.top_k, "--top-k", 0, what="0 = off")
        for s in args.stop or []:
            if not s:
                raise OptionError("--stop '': a stop string must not be empty")
    check_choice(args.dtype, "--dtype", DTYPES)


def cmd_rollout(args) -> int:
    from .data.loaders import DataError
    from .models.loading import check_model, load_model
    from .rollout.dtype_auto import resolve_dtype
    from .rollout.engine import RolloutEngine
    from .rollout.sampling import SamplingParams

    _check_generation_args(args, top=True)
    comp = check_sampler_options(args)
    out_path = check_output_file(args.out, "--out")
    if not args.prompt_key:
        raise OptionError("--prompt-key '': name the key of each line that holds the prompt")
    prompts = _read_prompts(args.prompts, args.prompt_key)
    check_model(args.model)
    dtype = resolve_dtype(args.dtype)
    lm = load_model(args.model, dtype=dtype)
    engine = RolloutEngine(lm, comp, dtype=dtype)
    params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_new_tokens=args.max_new_tokens, stop=args.stop or [], seed=args.seed)
    try:
        out = engine.generate(prompts, params)
    except ValueError as e:  # a prompt the model cannot take (empty, longer than its context)
        raise DataError(f"--prompts {args.prompts}: {e}") from None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w") as f:
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
          f"{out.seconds:.1f}s ({out.tokens_per_s:.1f} tok/s); KV allocated {out.kv.bytes_peak / 2**20:.1f} MiB "
          f"(the dense engine allocates {out.kv.bytes_dense_alloc / 2**20:.1f} MiB for this batch), "
          f"{out.kv.compressions} compressions")
    return 0


def cmd_demo(args) -> int:
    """A short rollout on the embedded model: prints what it generated, its speed and KV memory."""
    from .models.loading import check_model, load_model
    from .rollout.dtype_auto import resolve_dtype
    from .rollout.engine import RolloutEngine
    from .rollout.kv import build_compressor
    from .rollout.sampling import SamplingParams

    check_model(args.model)
    dtype = resolve_dtype("auto")
    lm = load_model(args.model, dtype=dtype)
    prompt = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}]
    for name in ("none", "rkv"):
        comp = build_compressor(name, kv_budget=32, step_length=16)
        out = RolloutEngine(lm, comp, dtype=dtype).generate([prompt], SamplingParams(n=4, max_new_tokens=96, temperature=0.7))
        print(f"--- {name}: {out.tokens_per_s:.0f} tok/s, KV allocated {out.kv.bytes_peak / 2**20:.2f} MiB "
              f"(dense engine {out.kv.bytes_dense_alloc / 2**20:.2f} MiB)")
        print(out.texts[0][:300])
    return 0


def cmd_bench_rollout(args) -> int:
    from .bench.rollout import KERNELS, PEERS, bench_compressor, run_bench, write_json
    from .rollout.quant.smooth import check_strength
    from .models.loading import check_model, resolve_device

    resolve_device(args.device, key="--device")  # a device this machine lacks fails before anything loads
    check_int(args.batch, "--batch", 1, what="sequences generated at once")
    check_int(args.max_new_tokens, "--max-new-tokens", 1)
    check_int(args.kv_budget, "--kv-budget", 1)
    check_int(args.step_length, "--step-length", 1)
    check_int(args.tail_slack, "--tail-slack", 0, what="spare KV slots for skipping the last compressions")
    check_int(args.repeat, "--repeat", 1, what="runs of every row; the median is reported")
    try:
        check_strength(args.quant_smooth)
    except ValueError as e:
        raise OptionError(f"--quant-smooth: {e}") from None
    check_int(args.quant_outliers, "--quant-outliers", 0, what="input channels kept in float32")
    check_choice(args.dtype, "--dtype", DTYPES)
    if args.quant_group is not None:
        check_int(args.quant_group, "--quant-group", 4, what="inputs per weight and activation scale of int8_group")
        if args.quant_group % 4:
            raise OptionError(f"--quant-group: {args.quant_group} is not a multiple of 4 (the int8 kernel's 4-byte steps)")
        if "int8_group" not in [q.strip() for q in args.quant.split(",")]:
            raise OptionError(f"--quant-group {args.quant_group} applies to int8_group rows only; --quant is {args.quant!r}")
    peers = [p.strip() for p in (args.peers or "").split(",") if p.strip()]
    for peer in peers:
        check_choice(peer, "--peers", PEERS)
    if "openvino" in peers:  # not set up: stop now, naming the set-up command, before the model loads
        from .bench.openvino_peer import check_peer
        from .rollout.dtype_auto import resolve_dtype
        if resolve_device(args.device, key="--device").type != "cpu":
            raise OptionError(f"--peers openvino: OpenVINO GenAI is a CPU engine and --device {args.device} "
                              "runs the rows elsewhere; add --device cpu")
        check_peer(args.model, str(resolve_dtype(args.dtype, "cpu")).replace("torch.", ""))
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if not kernels:
        raise OptionError(f"--kernels: give at least one of {', '.join(KERNELS)}")
    for kernel in kernels:
        check_choice(kernel, "--kernels", KERNELS)
    comps = [c.strip() for c in args.compressors.split(",") if c.strip() and c.strip() != "none"]
    for name in comps:  # every row's compressor builds (an unknown name fails now, not after the others ran)
        bench_compressor(name, args.kv_budget, args.step_length, args.compress_prompt or None, args.tail_slack)
    if args.kv_schedule:
        from .bench.rollout import scheduled_compressors
        from .rollout.kv.schedule import ScheduleError
        try:
            scheduled_compressors(args.kv_schedule, comps, args.step_length, args.compress_prompt or None,
                                  args.tail_slack)
        except (ScheduleError, ValueError) as e:
            raise OptionError(f"--kv-schedule: {e}") from None
    if args.json:
        check_output_file(args.json, "--json")
    check_model(args.model)
    report = run_bench(model=args.model, batch=args.batch, max_new_tokens=args.max_new_tokens,
                       kv_budget=args.kv_budget, compressors=comps, dtype=args.dtype,
                       step_length=args.step_length, seed=args.seed, hf_baseline=not args.no_hf,
                       repeat=args.repeat, peers=peers, compile=args.compile,
                       quants=[q.strip() for q in args.quant.split(",") if q.strip()],
                       kv_quants=[q.strip() for q in args.kv_quant.split(",") if q.strip()],
                       compress_prompt=args.compress_prompt or None, quant_smooth=args.quant_smooth,
                       quant_group=args.quant_group, quant_outliers=args.quant_outliers,
                       quant_head=args.quant_head, tail_slack=args.tail_slack,
                       kernels=kernels, device=args.device, kv_schedule=args.kv_schedule)
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    return 0


def cmd_bench_learner(args) -> int:
    from .bench.learner import run_bench
    from .bench.rollout import sparserl_commit, write_json
    from .config import load_config, validate

    _split_config_arg(args)
    check_int(args.repeat, "--repeat", 1, what="rounds of both precisions; the per-round ratios' median is reported")
    if args.json:
        check_output_file(args.json, "--json")
    report = run_bench(validate(load_config(args.config or "default", args.overrides)), repeat=args.repeat)
    report["command"] = " ".join(["sparserl bench learner", *([args.config] if args.config else []), *args.overrides,
                                  "--repeat", str(args.repeat)])
    report["commit"] = sparserl_commit()
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    return 0


def cmd_bench_setup_openvino(args) -> int:
    from .bench.openvino_setup import setup

    if args.venv is not None:
        check_output_dir(args.venv, "--venv")
    setup(venv=args.venv, force=args.force)
    return 0


def _split_config_arg(args) -> None:
    """``sparserl train key=value ...``: a first positional that is an override (not a file) joins the
    overrides, so the config is left out (``default``, or the run's own with ``--resume``)."""
    if args.config is not None and "=" in args.config and not Path(args.config).exists():
        args.overrides = [args.config, *args.overrides]
        args.config = None


def cmd_train(args) -> int:
    from .config import load_config, validate
    from .train.run_folder import find_resume_folder, load_recorded_config, recorded_configs
    from .train.trainer import train

    _split_config_arg(args)
    if args.allow_config_change and not args.resume:
        raise OptionError("--allow-config-change applies only with --resume (a new run has no earlier config)")
    run_dir = args.run_dir
    if run_dir is not None:
        check_output_dir(run_dir, "--run-dir")
    if args.resume and args.config is None:
        # resume with the run's own config (the newest it ran with); overrides apply on top
        locator = load_config("default", args.overrides)  # log.out_dir / log.run_name to find the run
        run = find_resume_folder(locator, run_dir)
        recorded = recorded_configs(run)
        cfg = validate(load_recorded_config(recorded[-1], args.overrides) if recorded
                       else load_config("default", args.overrides))
        run_dir = run
    else:
        cfg = validate(load_config(args.config or "default", args.overrides))
    run = train(cfg, resume=args.resume, run_dir=run_dir, allow_config_change=args.allow_config_change)
    return 0 if run else 1


def cmd_config(args) -> int:
    """``sparserl config``: the resolved, validated config a ``sparserl train`` with the same arguments would
    run (YAML that ``sparserl train FILE`` reads back), or with ``--keys`` every key's type, default and help."""
    from .config import config_help, config_yaml, load_config, validate

    if args.keys is not None:
        if args.config is not None or args.overrides:
            raise OptionError("--keys lists every key's default and help: give it no config or override "
                              "(leave --keys out to see a config resolved)")
        text = config_help(args.keys or None)
        if not text:
            raise OptionError(f"--keys {args.keys!r}: no key or help text holds it")
        print(text)
        return 0
    _split_config_arg(args)
    cfg = validate(load_config(args.config or "default", args.overrides))
    command = shlex.join(["sparserl", "config", *([args.config] if args.config else []), *args.overrides])
    print(config_yaml(cfg, [command, "'auto' values (rollout.dtype, model.mixed_precision, algorithm.old_logprobs) "
                            "resolve when a run starts; its config.yaml says to what"], title="sparserl config"),
          end="")
    return 0


def cmd_eval(args) -> int:
    from .eval.evaluate import evaluate_cli

    return evaluate_cli(args)


def cmd_report(args) -> int:
    from .eval.report import make_report
    from .train.run_folder import is_run_folder

    run = Path(args.run_dir)
    if not run.exists():
        raise OptionError(f"report: run folder {run} does not exist")
    if not is_run_folder(run):
        raise OptionError(f"report: {run} is not a run folder (no config.yaml, metrics.jsonl or checkpoints/)")
    check_output_dir(run, "report: run folder")
    path = make_report(run)
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
    p.add_argument("--tail-slack", type=int, default=None, help="spare KV slots past budget + step length: a "
                   "compression due when the rest of the generation fits in them is skipped")
    p.add_argument("--compressor-options", default=None, help='JSON, e.g. \'{"lam": 0.1}\'')


DEBUG_ENV = "SPARSERL_DEBUG"
_DEBUG_HELP = f"show the traceback of an error (or set {DEBUG_ENV}=1)"


DESCRIPTION = """\
Reinforcement learning of language models with verifiable rewards on a compressed sampler (sparse KV
cache, quantized weights), with the sampler/policy mismatch corrected.

  sparserl train                      the main job on the embedded model (a preset, a YAML file, key=value)
  sparserl config --keys [TEXT]       every config key, its default and help

Every command checks its options before it loads a model. A problem with the input ends in one
'error:' line; --debug (or SPARSERL_DEBUG=1) shows the traceback."""


def build_parser() -> argparse.ArgumentParser:
    from .config.loading import list_presets
    from .runlog import RESUME_FREE_KEYS

    ap = argparse.ArgumentParser(prog="sparserl", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    common = argparse.ArgumentParser(add_help=False)  # --debug after the command too
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def command(name: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    t = command("train", help="GRPO on compressed rollouts")
    t.add_argument("config", nargs="?", default=None,
                   help="a YAML file or a preset name (" + ", ".join(list_presets()) + "; default: 'default'; with "
                   "--resume: the run's own config)")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.kv_budget=64 (every key: sparserl "
                   "config --keys)")
    t.add_argument("--resume", action="store_true",
                   help="continue a run from its last complete checkpoint: the one in --run-dir, else the newest "
                   "under log.out_dir. The config must match the run's, except " + ", ".join(RESUME_FREE_KEYS))
    t.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: go on although other keys differ from the run's config; the new config "
                   "is kept as config-resume-<step>.yaml and the run's config.yaml stays")
    t.add_argument("--run-dir", default=None, help="the run folder (default: log.out_dir/<time>-<config name>)")
    t.set_defaults(fn=cmd_train)

    cf = command("config", help="the resolved config a train command would run, or every key's help (--keys)")
    cf.add_argument("config", nargs="?", default=None, help="a YAML file or a preset name (default: 'default')")
    cf.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.kv_budget=64")
    cf.add_argument("--keys", nargs="?", const="", default=None, metavar="TEXT",
                    help="list every key (type, default, help) instead; with TEXT, only the lines that hold it")
    cf.set_defaults(fn=cmd_config)

    r = command("rollout", help="sample responses with the compressed engine")
    r.add_argument("--model", default="smollm2-135m")
    r.add_argument("--prompts", required=True, help="JSON lines with a 'prompt' (string or chat messages)")
    r.add_argument("--prompt-key", default="prompt", help="the key of each line that holds the prompt")
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

    d = command("demo", help="a short rollout demo on the embedded model")
    d.add_argument("--model", default="smollm2-135m")
    d.set_defaults(fn=cmd_demo)

    e = command("eval", help="accuracy of a model or checkpoint under dense and sparse inference")
    e.add_argument("--model", default="smollm2-135m", help="a name, HF folder or checkpoint folder")
    e.add_argument("--data", default="arith", help="a data set name (gsm8k, math500, ...), file or folder, or arith")
    e.add_argument("--limit", type=int, default=None)
    add_data_options(e)
    e.add_argument("--reward", default="math", help="as reward.fn: a built-in reward (math) or 'module:function' "
                   "taking (response, label[, prompt])")
    e.add_argument("--reward-timeout-s", type=float, default=5.0, help="as reward.timeout_s: seconds allowed to "
                   "score one response before it scores 0")
    e.add_argument("--n", type=int, default=1, help="samples per problem (avg@n, pass@n)")
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--max-new-tokens", type=int, default=256)
    e.add_argument("--dtype", default="auto")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--batch", type=int, default=32)
    e.add_argument("--out", default=None, help="JSON output path")
    _add_sampler_args(e)
    e.set_defaults(fn=cmd_eval)

    rp = command("report", help="plots and a markdown summary of a run")
    rp.add_argument("run_dir")
    rp.set_defaults(fn=cmd_report)

    c = command("compare", help="arms x seeds as training runs, then one comparison (plots, table)")
    c.add_argument("config", nargs="?", default="default", help="a YAML file or a preset name (every arm's base)")
    c.add_argument("overrides", nargs="*", help="dotted overrides shared by every arm")
    c.add_argument("--arms", action="append", help="comma-separated: dense, sparse_naive, sparse_rl, base, "
                   "preset:<name>, NAME=key=value;key=value, or NAME=preset:<name>;key=value (a variant of a preset) "
                   "(default dense,sparse_naive,sparse_rl)")
    c.add_argument("--seeds", type=int, default=3, help="runs per arm, train.seed = 0 .. N-1")
    c.add_argument("--seed-list", default=None, help="explicit seeds instead, e.g. 0,1,2")
    c.add_argument("--steps", type=int, default=None, help="train.steps of every run")
    c.add_argument("--eval", default=None, help="held-out set: evaluate each final model, dense and sparse")
    c.add_argument("--eval-limit", type=int, default=None)
    c.add_argument("--eval-n", type=int, default=1)
    c.add_argument("--eval-temperature", type=float, default=0.0)
    c.add_argument("--collapse-k3", type=float, default=1.0, help="k3 KL above which a seed counts as collapsed")
    c.add_argument("--paired-against", default=None, metavar="ARM[,ARM]",
                   help="arms every other arm is also compared with seed by seed (as with the dense arm), e.g. "
                   "sparse_rl; finished runs and evaluations are reused, so adding it later only rewrites the report")
    c.add_argument("--out", required=True, help="folder of the runs (runs/) and the comparison")
    c.set_defaults(fn=cmd_compare)

    from .calibrate.command import add_parser as add_calibrate_parser
    add_calibrate_parser(sub, parents=[common])  # sparserl calibrate: its options and run live in sparserl.calibrate

    b = command("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    br = bsub.add_parser("rollout", parents=[common], help="rollout speed and KV memory vs transformers' generate")
    br.add_argument("--model", default="smollm2-135m")
    br.add_argument("--batch", type=int, default=16, help="sequences generated at once (up to 64 and more)")
    br.add_argument("--max-new-tokens", type=int, default=256)
    br.add_argument("--kv-budget", type=int, default=256)
    br.add_argument("--step-length", type=int, default=128)
    br.add_argument("--compressors", default="none,rkv,snapkv,streaming,h2o")
    br.add_argument("--kv-schedule", default=None, metavar="FILE", help="a sparsity schedule (JSON: [[length, "
                    "budget], ...], or `sparserl calibrate`'s output): adds a row per compressor of --compressors "
                    "it fits, with the budget following the sequence length")
    br.add_argument("--compress-prompt", action="store_true", help="the prompt is compressible too: every "
                    "compressing row's buffer is budget + step length (like OpenVINO's eviction, which "
                    "evicts over the whole sequence)")
    br.add_argument("--tail-slack", type=int, default=0, help="spare KV slots past budget + step length: a "
                    "compression due when the rest of the generation fits in them is skipped (rollout.tail_slack)")
    br.add_argument("--dtype", default="auto")
    br.add_argument("--device", default="auto", help="where the rows run: auto (cuda if available, else cpu), "
                    "cpu, cuda, cuda:N (as model.device)")
    br.add_argument("--seed", type=int, default=0)
    br.add_argument("--no-hf", action="store_true", help="skip the transformers generate baseline")
    br.add_argument("--repeat", type=int, default=1,
                    help="runs of every row, in rounds; tokens_per_s is their median (machines drift)")
    br.add_argument("--peers", default="", help="other engines as rows of the same JSON: openvino "
                    "(OpenVINO GenAI, the optional extra sparserl[bench])")
    br.add_argument("--compile", action="store_true", help="also every sparserl row with its decode step "
                    "through torch.compile (rows with compiled: true; eager and compiled in the same process)")
    br.add_argument("--quant", default="none", help="sampler weight quantizations, comma-separated: none, "
                    "int8, int8_group, int8_weight_only, fp8 (each adds sparserl rows with its mismatch vs dense)")
    br.add_argument("--quant-smooth", type=float, default=0.0, help="SmoothQuant migration strength of the "
                    "int8, int8_group and fp8 rows (0 = off, 0.5 = the paper's): rollout.quant_smooth")
    br.add_argument("--quant-outliers", type=int, default=0, help="input channels of every int8, int8_group "
                    "and fp8 linear kept in float32, chosen on the calibration text (0 = off): "
                    "rollout.quant_outliers")
    br.add_argument("--quant-head", action="store_true", help="the quantized rows' LM head quantized too "
                    "(rollout.quant_head)")
    br.add_argument("--quant-group", type=int, default=None, help="inputs per weight and activation scale of the "
                    "int8_group rows (a multiple of 4; default 64): rollout.quant_group")
    br.add_argument("--kv-quant", default="none", help="KV cache quantizations, comma-separated: none, int8, fp8")
    br.add_argument("--kernels", "--attention", dest="kernels", default="native", help="decode-step kernels, "
                    "comma-separated: native (the C kernels for attention and the float32 weight products where "
                    "they apply, else torch), torch (torch's matmuls, oneDNN-packed weights); each after the "
                    "first adds the dense and compressor rows again (kernels in the rows). --attention: its "
                    "old name")
    br.add_argument("--json", default=None)
    br.set_defaults(fn=cmd_bench_rollout)
    bl = bsub.add_parser("learner", parents=[common], help="the learner's step (scoring, update) in float32 "
                         "against bfloat16 mixed precision (model.mixed_precision), on a rollout of a config's job")
    bl.add_argument("config", nargs="?", default=None, help="a YAML file or a preset name (default: 'default')")
    bl.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.micro_batch_size=8")
    bl.add_argument("--repeat", type=int, default=3, help="rounds; each times both precisions (order alternating)")
    bl.add_argument("--json", default=None)
    bl.set_defaults(fn=cmd_bench_learner)
    bo = bsub.add_parser("setup-openvino", parents=[common], help="set up the OpenVINO peer of bench rollout "
                         "--peers openvino: its runtime here, its model exporter in an environment of its own")
    bo.add_argument("--venv", default=None, help="the exporter's environment (default "
                    "$SPARSERL_CACHE/openvino/exporter, where --peers openvino looks)")
    bo.add_argument("--force", action="store_true", help="recreate the exporter's environment")
    bo.set_defaults(fn=cmd_bench_setup_openvino)
    return ap


def _debug(args) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "").strip().lower() not in (
        "", "0", "false", "no")


def quiet_progress_bars_off_terminal() -> None:
    """Where stderr is not a terminal (a log file, CI), turn off the Hugging Face libraries' progress bars
    ("Loading weights", "Writing model shards"): there they are carriage-return noise in the log, as the
    run's own live display would be (``log.progress: auto`` prints a line per step instead). A value the
    user set for ``HF_HUB_DISABLE_PROGRESS_BARS`` wins; transformers reads it when first imported."""
    isatty = getattr(sys.stderr, "isatty", None)
    if not (isatty and isatty()):
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code. A :class:`SparserlError` (bad input) prints ``error:
    <message>`` on stderr and returns 1 (with ``--debug`` / ``SPARSERL_DEBUG=1`` after its traceback);
    any other exception propagates with its traceback: it is a bug."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # overrides after an option (train default --run-dir R train.steps=5) join the others
        if isinstance(getattr(args, "overrides", None), list) and all("=" in x and not x.startswith("-") for x in extra):
            args.overrides = [*args.overrides, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    quiet_progress_bars_off_terminal()
    try:
        if os.environ.get("SPARSERL_NATIVE_ARCH"):  # a build the user asked for fails before any work
            from .rollout import native
            native.library()
        return args.fn(args)
    except SparserlError as e:
        if _debug(args):
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
