"""``sparserl bench step-cost``: a whole RL step's predicted time per station (:mod:`sparserl.cost.step`) for
several samplers, on this machine's measured rates or an assumed GPU's, beside ``sparserl bench step``'s
measured split (the same station names)."""

from __future__ import annotations

import json

from ...checks import check_choice, check_int, check_output_file
from ...errors import OptionError

#: what a setting fills in where an option is not given
SETTINGS = {
    "long-job": {
        "model": "smollm2-135m",
        "machine": "here",
        "responses": 32,
        "group_size": 8,
        "prompt_tokens": 100,
        "lengths": "1024",
        "dtype": "auto",
        "learner_dtype": "float32",
        "old_logprobs": "score",
        "alpha_q": "hidden",
        "micro_batch_tokens": 16384,
        "arms": "dense,rkv256,controller,blocktopk,int8",
    },
    "sparrow": {
        "model": "qwen3-1.7b",
        "machine": "h200",
        "responses": 32,
        "group_size": 8,
        "prompt_tokens": 256,
        "lengths": "8000-32000",
        "dtype": "bfloat16",
        "learner_dtype": "bfloat16",
        "old_logprobs": "score",
        "alpha_q": "topk",
        "micro_batch_tokens": 32768,
        "arms": "dense,sparrow",
    },
}
#: rows of the "many rows" GEMM rate measured here (the sampler's prefill; enough rows to leave the decode regime)
PREFILL_ROWS = 512
_FLAGS = {"sparrow": {"ref_model": True, "gradient_checkpointing": True}}


def add_parser(subparsers, parents=()):
    from ...cost.arms import ARM_HELP

    p = subparsers.add_parser(
        "step-cost",
        parents=list(parents),
        help="a whole RL step's predicted time per station for several samplers (the cost model), "
        "on this machine's measured rates or an assumed GPU's",
    )
    p.add_argument(
        "--setting",
        default="long-job",
        help="defaults of every option below: long-job (SmolLM2-135M, 32 x 1,024 tokens, this CPU) or "
        "sparrow (Qwen3 on an H200 at Sparrow's settings)",
    )
    p.add_argument("--model", default=None, help="qwen3-1.7b, qwen3-4b, smollm2-135m or a folder with a config.json")
    p.add_argument(
        "--machine",
        default=None,
        help="here (rates measured now through the embedded model's sampler, a minute or two), h200 (assumed: "
        "sparserl.cost.machines), BW:F[:FP] (bytes/s, decode GEMM FLOP/s, learner GEMM FLOP/s), or an earlier "
        "--json output (its measured rates)",
    )
    p.add_argument("--responses", type=int, default=None, help="responses per step (prompts x rollout.n)")
    p.add_argument("--group-size", type=int, default=None, help="responses per prompt (rollout.n)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="tokens per prompt")
    p.add_argument(
        "--lengths",
        default=None,
        help="response lengths: N (all N tokens), LOW-HIGH (spread evenly), or a comma list (cycled)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        help="the sampler's weights and KV as held: float32, bfloat16 or auto (rollout.dtype's choice on this "
        "machine; bfloat16 on a GPU)",
    )
    p.add_argument(
        "--learner-dtype",
        default=None,
        help="the learner's weights as held: float32 (its products in model.mixed_precision's choice when "
        "measured here) or bfloat16",
    )
    p.add_argument("--arms", default=None, help=f"comma-separated samplers: {ARM_HELP}")
    p.add_argument(
        "--controller-budgets",
        default="64,96,128,160,192,224,256,256",
        help="the controller arm's R-KV budgets, one per 128-token response bin",
    )
    p.add_argument("--blocktopk-pages", type=int, default=16, help="pages of 16 tokens the blocktopk arm reads")
    p.add_argument("--old-logprobs", default=None, help="score (a forward of their own), update or sampler (none)")
    p.add_argument("--ref-model", action="store_true", default=None, help="a reference model is scored too")
    p.add_argument("--alpha-q", default=None, help="exact α's q: hidden, kept, replay; or topk / off (no α station)")
    p.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        default=None,
        help="the update recomputes each layer's forward",
    )
    p.add_argument("--micro-batch-tokens", type=int, default=None, help="the learner's tokens per micro-batch")
    p.add_argument(
        "--measured",
        default=None,
        metavar="FILE",
        help="a `sparserl bench step --json` output: each station's fraction of the step, predicted beside "
        "measured, for the arms both have (its rkv_fixed is matched with the first rkv<B> arm)",
    )
    p.add_argument("--json", default=None)
    p.set_defaults(fn=run)
    return p


def _resolve(args) -> dict:
    check_choice(args.setting, "--setting", SETTINGS)
    opts = {**SETTINGS[args.setting], "ref_model": False, "gradient_checkpointing": False}
    opts.update(_FLAGS.get(args.setting, {}))
    for key in (*SETTINGS["long-job"], "ref_model", "gradient_checkpointing"):
        value = getattr(args, key, None)
        if value is not None:
            opts[key] = value
    return opts


def _lengths(spec: str, n: int) -> list[int]:
    from ...cost import spread_lengths

    try:
        if "-" in spec:
            low, high = (int(x) for x in spec.split("-", 1))
            return spread_lengths(n, low, high)
        values = [int(x) for x in spec.split(",") if x.strip()]
        if not values or min(values) < 1:
            raise ValueError
    except ValueError:
        raise OptionError(f"--lengths {spec!r}: give N, LOW-HIGH or a comma list of positive integers") from None
    return [values[i % len(values)] for i in range(n)]


def _rates(machine: str, model: str, responses: int, dtype: str, int8: bool):
    """(the sampler's rates, the learner's, the int8 sampler's when measured, a description)."""
    from ...cost import MachineRates
    from ...cost.machines import MACHINES

    if machine in MACHINES:
        m = MACHINES[machine]
        return m.rates, m.rates, None, m.to_dict()
    if machine == "here":
        return _measure_here(model, responses, dtype, int8)
    if machine.endswith(".json"):
        return _rates_from_json(machine)
    try:
        values = [float(x) for x in machine.split(":")]
        if len(values) not in (2, 3):
            raise ValueError
        rates = MachineRates(*values)
    except ValueError:
        raise OptionError(
            f"--machine {machine!r}: give here, {', '.join(MACHINES)}, BW:F[:FP] (positive numbers) or an "
            "earlier --json output"
        ) from None
    return rates, rates, None, {"name": "given", **_rates_dict(rates)}


def _rates_from_json(path: str):
    """The rates an earlier ``--json`` output measured (its ``machine``), to predict more settings on them."""
    from ...cost import MachineRates

    try:
        with open(path) as f:
            m = json.load(f)["machine"]
        bw = float(m["memory_bandwidth_bytes_per_s"])
        sampler = MachineRates(bw, float(m["gemm_flops_per_s"]), float(m["prefill_flops_per_s"]))
        learner_f = float(m.get("learner_flops_per_s", m["prefill_flops_per_s"]))
        learner = MachineRates(bw, learner_f, learner_f)
        int8 = None
        if "int8_gemm_flops_per_s" in m:
            int8 = MachineRates(bw, float(m["int8_gemm_flops_per_s"]), float(m["int8_prefill_flops_per_s"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OptionError(f"--machine {path}: not an earlier --json output with the machine's rates ({e})") from None
    return sampler, learner, int8, {**m, "rates_from": path}


def _measured(path: str) -> dict[str, dict]:
    """The per-arm figures of a ``sparserl bench step --json`` output (its ``summary``)."""
    try:
        with open(path) as f:
            summary = json.load(f)["summary"]
        if not isinstance(summary, dict):
            raise TypeError("summary is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OptionError(f"--measured {path}: not a `sparserl bench step --json` output ({e})") from None
    return summary


def _rates_dict(rates) -> dict:
    return {
        "memory_bandwidth_bytes_per_s": rates.bandwidth,
        "gemm_flops_per_s": rates.gemm_flops,
        "prefill_flops_per_s": rates.prefill_rate,
    }


def _learner_flops_per_s(device) -> tuple[float, str]:
    """The learner's GEMM rate: the mixed-precision probe's forward and backward
    (:func:`sparserl.models.mixed_precision.probe_timer`: SmolLM2-135M's products over 512 rows, its LM
    head over 128) in the precision ``model.mixed_precision=auto`` chose here, 3 x 2 FLOPs per weight
    and row (forward, the input's and the weight's gradients); the best of 3."""
    from ...models import mixed_precision as mp

    precision = mp.resolve("auto", device)
    timer = mp.probe_timer(device)
    layers = sum(i * o for i, o in mp.LAYER_SHAPES) * mp.PROBE_ROWS
    head = mp.HEAD_SHAPE[0] * mp.HEAD_SHAPE[1] * mp.HEAD_ROWS
    return 6.0 * (layers + head) / min(timer(precision) for _ in range(3)), precision


def _measure_here(model: str, responses: int, dtype: str, int8: bool):
    """This machine's rates: the sampler's own products (:func:`sparserl.bench.machine.measure_rates`) at
    ``responses`` rows (a decode step) and :data:`PREFILL_ROWS` rows (the prefill), an int8 sampler's when an
    arm runs one, and the learner's (:func:`_learner_flops_per_s`). A model of :mod:`sparserl.cost.shapes` that is
    not loadable here is measured through the embedded one."""
    import torch

    from ...bench.machine import machine_info, measure_rates
    from ...cost import MachineRates
    from ...cost.shapes import CONFIGS
    from ...models.loading import DEFAULT_MODEL, load_model
    from ...rollout.model import SamplerModel

    name = DEFAULT_MODEL if model.lower() in CONFIGS else model
    torch_dtype = getattr(torch, dtype)
    loaded = load_model(name, dtype=torch.float32, device="cpu")
    sampler = measure_rates(SamplerModel(loaded.model, torch_dtype), rows=responses, prefill_rows=PREFILL_ROWS)
    learner_flops, precision = _learner_flops_per_s(torch.device("cpu"))
    learner = MachineRates(sampler.bandwidth, learner_flops, learner_flops)
    int8_rates = None
    if int8:
        int8_sampler = SamplerModel(loaded.model, torch_dtype, quant="int8")
        q = measure_rates(int8_sampler, rows=responses, prefill_rows=PREFILL_ROWS)
        int8_rates = MachineRates(sampler.bandwidth, q.gemm_flops, q.prefill_rate)
    info = machine_info(sampler.bandwidth, sampler.gemm_flops, responses)
    info.update(
        {
            "prefill_flops_per_s": sampler.prefill_rate,
            "prefill_rows": PREFILL_ROWS,
            "sampler_dtype": dtype,
            "learner_flops_per_s": learner_flops,
            "learner_precision": precision,
            "measured_through": name,
        }
    )
    if int8_rates is not None:
        info["int8_gemm_flops_per_s"] = int8_rates.gemm_flops
        info["int8_prefill_flops_per_s"] = int8_rates.prefill_rate
    try:
        with open("/proc/loadavg") as f:
            info["load_average_1min"] = float(f.read().split()[0])
    except OSError:
        pass
    return sampler, learner, int8_rates, info


def run(args) -> int:
    from ...bench.rollout import sparserl_commit, write_json
    from ...cost.arms import arm_sparsity, beside, predict_arms, table
    from ...cost.shapes import model_shape
    from ...cost.sparrow import PUBLISHED

    opts = _resolve(args)
    check_int(opts["responses"], "--responses", 1)
    check_int(opts["group_size"], "--group-size", 1)
    check_int(opts["prompt_tokens"], "--prompt-tokens", 1)
    check_int(opts["micro_batch_tokens"], "--micro-batch-tokens", 1)
    check_int(args.blocktopk_pages, "--blocktopk-pages", 1)
    check_choice(opts["dtype"], "--dtype", ("auto", "float32", "bfloat16"))
    check_choice(opts["learner_dtype"], "--learner-dtype", ("float32", "bfloat16"))
    if opts["dtype"] == "auto":
        opts["dtype"] = _auto_dtype(opts["machine"])
    check_choice(opts["old_logprobs"], "--old-logprobs", ("score", "update", "sampler"))
    check_choice(opts["alpha_q"], "--alpha-q", ("hidden", "kept", "replay", "topk", "off"))
    try:
        budgets = [int(x) for x in args.controller_budgets.split(",") if x.strip()]
        if not budgets or min(budgets) < 1:
            raise ValueError
    except ValueError:
        raise OptionError(f"--controller-budgets {args.controller_budgets!r}: give positive integers") from None
    lengths = _lengths(str(opts["lengths"]), opts["responses"])
    model = opts["model"]
    arms = [a.strip() for a in opts["arms"].split(",") if a.strip()]
    arm_options = {"controller_budgets": budgets, "blocktopk_pages": args.blocktopk_pages}
    try:
        shape = model_shape(model, opts["dtype"])
        learner = model_shape(model, opts["learner_dtype"])
        for arm in arms:
            arm_sparsity(arm, model.lower(), opts["prompt_tokens"], **arm_options)
    except ValueError as e:
        raise OptionError(str(e)) from None
    if args.json:
        check_output_file(args.json, "--json")
    measured = _measured(args.measured) if args.measured else None
    rates, learner_rates, int8_rates, machine = _rates(
        opts["machine"], model, opts["responses"], opts["dtype"], any(a in ("int8", "fp8") for a in arms)
    )
    steps = predict_arms(
        arms,
        model.lower(),
        shape,
        rates,
        opts["prompt_tokens"],
        lengths,
        learner=learner,
        learner_rates=learner_rates,
        arm_rates={a: int8_rates for a in ("int8", "fp8")} if int8_rates is not None else None,
        arm_options=arm_options,
        group_size=opts["group_size"],
        old_logprobs=opts["old_logprobs"],
        ref_model=opts["ref_model"],
        alpha_q=opts["alpha_q"],
        gradient_checkpointing=opts["gradient_checkpointing"],
        micro_batch_tokens=opts["micro_batch_tokens"],
    )
    print(
        f"model {model} (sampler {opts['dtype']}, learner {opts['learner_dtype']}), machine "
        f"{machine.get('name') or machine.get('cpu')}: {rates.bandwidth / 1e9:.1f} GB/s, decode GEMMs "
        f"{rates.gemm_flops / 1e9:.0f} GFLOP/s, prefill {rates.prefill_rate / 1e9:.0f} GFLOP/s, learner GEMMs "
        f"{learner_rates.prefill_rate / 1e9:.0f} GFLOP/s"
        + (f", int8 decode GEMMs {int8_rates.gemm_flops / 1e9:.0f} GFLOP/s" if int8_rates is not None else "")
    )
    print(
        f"{opts['responses']} responses ({opts['group_size']} per prompt) of {min(lengths)}-{max(lengths)} tokens "
        f"after {opts['prompt_tokens']}; old log-probs {opts['old_logprobs']}, ref model {opts['ref_model']}, "
        f"alpha {opts['alpha_q']}, gradient checkpointing {opts['gradient_checkpointing']}; seconds:"
    )
    print(table(steps))
    published = PUBLISHED.get(model.lower())
    if published and "sparrow" in steps:
        print(f"Sparrow published (4 x H200): rollout {published[2]:.2f}x, one RL step {published[3]:.2f}x")
    if measured is not None:
        rkv = next((a for a in arms if a.startswith("rkv")), None)
        side = beside(steps, measured, {"rkv_fixed": rkv} if rkv else None)
        print(f"beside {args.measured} (fraction of the step):" if side else f"{args.measured}: no arm in common")
        if side:
            print(side)
    report = {
        "command": "sparserl bench step-cost " + " ".join(_argv(args)),
        "commit": sparserl_commit(),
        "options": {**opts, "lengths": lengths, **arm_options},
        "machine": machine,
        "arms": {arm: s.to_dict() for arm, s in steps.items()},
        "published": {"rollout_x": published[2], "step_x": published[3]} if published else None,
    }
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    return 0


def _auto_dtype(machine: str) -> str:
    """``--dtype auto``: the sampler's dtype ``rollout.dtype=auto`` chooses on this CPU (``here``), else bfloat16."""
    if machine != "here":
        return "bfloat16"
    from ...rollout.dtype_auto import resolve_dtype

    return str(resolve_dtype("auto", "cpu")).replace("torch.", "")


def _argv(args) -> list[str]:
    out = ["--setting", args.setting]
    keys = ("model", "machine", "responses", "group_size", "prompt_tokens", "lengths", "dtype", "learner_dtype", "arms")
    for key in keys:
        value = getattr(args, key)
        if value is not None:
            out += [f"--{key.replace('_', '-')}", str(value)]
    for key in ("old_logprobs", "alpha_q", "micro_batch_tokens"):
        value = getattr(args, key)
        if value is not None:
            out += [f"--{key.replace('_', '-')}", str(value)]
    for flag in ("ref_model", "gradient_checkpointing"):
        if getattr(args, flag):
            out.append(f"--{flag.replace('_', '-')}")
    return out
