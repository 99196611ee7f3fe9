"""``sparserl bench rollout``: rollout speed and KV memory of the compressed engine against transformers'
``generate`` (and other engines: ``--peers``), one JSON row per sampler."""

from __future__ import annotations

from ...checks import check_choice, check_int, check_output_file
from ...errors import OptionError
from ..options import DTYPES


def add_parser(subparsers, parents=()):
    br = subparsers.add_parser(
        "rollout", parents=list(parents), help="rollout speed and KV memory vs transformers' generate"
    )
    br.add_argument("--model", default="smollm2-135m")
    br.add_argument("--batch", type=int, default=16, help="sequences generated at once (up to 64 and more)")
    br.add_argument("--max-new-tokens", type=int, default=256)
    br.add_argument("--kv-budget", type=int, default=256)
    br.add_argument("--step-length", type=int, default=128)
    br.add_argument("--compressors", default="none,rkv,snapkv,streaming,h2o")
    br.add_argument(
        "--kv-schedule",
        default=None,
        metavar="FILE",
        help="a sparsity schedule (JSON: [[length, "
        "budget], ...], or `sparserl calibrate`'s output): adds a row per compressor of --compressors "
        "it fits, with the budget following the sequence length",
    )
    br.add_argument(
        "--compress-prompt",
        action="store_true",
        help="the prompt is compressible too: every "
        "compressing row's buffer is budget + step length (like OpenVINO's eviction, which "
        "evicts over the whole sequence)",
    )
    br.add_argument(
        "--tail-slack",
        type=int,
        default=0,
        help="spare KV slots past budget + step length: a "
        "compression due when the rest of the generation fits in them is skipped (rollout.tail_slack)",
    )
    br.add_argument("--dtype", default="auto")
    br.add_argument(
        "--device",
        default="auto",
        help="where the rows run: auto (cuda if available, else cpu), cpu, cuda, cuda:N (as model.device)",
    )
    br.add_argument("--seed", type=int, default=0)
    br.add_argument("--no-hf", action="store_true", help="skip the transformers generate baseline")
    br.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of every row, in rounds; tokens_per_s is their median (machines drift)",
    )
    br.add_argument(
        "--peers",
        default="",
        help="other engines as rows of the same JSON: openvino (OpenVINO GenAI, the optional extra sparserl[bench])",
    )
    br.add_argument(
        "--compile",
        action="store_true",
        help="also every sparserl row with its decode step "
        "through torch.compile (rows with compiled: true; eager and compiled in the same process)",
    )
    br.add_argument(
        "--quant",
        default="none",
        help="sampler weight quantizations, comma-separated: none, "
        "int8, int8_group, int8_weight_only, fp8 (each adds sparserl rows with its mismatch vs dense)",
    )
    br.add_argument(
        "--quant-smooth",
        type=float,
        default=0.0,
        help="SmoothQuant migration strength of the "
        "int8, int8_group and fp8 rows (0 = off, 0.5 = the paper's): rollout.quant_smooth",
    )
    br.add_argument(
        "--quant-outliers",
        type=int,
        default=0,
        help="input channels of every int8, int8_group "
        "and fp8 linear kept in float32, chosen on the calibration text (0 = off): "
        "rollout.quant_outliers",
    )
    br.add_argument(
        "--quant-head", action="store_true", help="the quantized rows' LM head quantized too (rollout.quant_head)"
    )
    br.add_argument(
        "--quant-group",
        type=int,
        default=None,
        help="inputs per weight and activation scale of the "
        "int8_group rows (a multiple of 4; default 64): rollout.quant_group",
    )
    br.add_argument("--kv-quant", default="none", help="KV cache quantizations, comma-separated: none, int8, fp8")
    br.add_argument(
        "--kernels",
        "--attention",
        dest="kernels",
        default="native",
        help="decode-step kernels, "
        "comma-separated: native (the C kernels for attention and the float32 weight products where "
        "they apply, else torch), torch (torch's matmuls, oneDNN-packed weights); each after the "
        "first adds the dense and compressor rows again (kernels in the rows). --attention: its "
        "old name",
    )
    br.add_argument("--json", default=None)
    br.set_defaults(fn=run)
    return br


def run(args) -> int:
    from ...bench.rollout import KERNELS, PEERS, bench_compressor, run_bench, write_json
    from ...models.loading import check_model, resolve_device
    from ...rollout.quant.smooth import check_strength

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
            raise OptionError(
                f"--quant-group: {args.quant_group} is not a multiple of 4 (the int8 kernel's 4-byte steps)"
            )
        if "int8_group" not in [q.strip() for q in args.quant.split(",")]:
            raise OptionError(
                f"--quant-group {args.quant_group} applies to int8_group rows only; --quant is {args.quant!r}"
            )
    peers = [p.strip() for p in (args.peers or "").split(",") if p.strip()]
    for peer in peers:
        check_choice(peer, "--peers", PEERS)
    if "openvino" in peers:  # not set up: stop now, naming the set-up command, before the model loads
        from ...bench.openvino_peer import check_peer
        from ...rollout.dtype_auto import resolve_dtype

        if resolve_device(args.device, key="--device").type != "cpu":
            raise OptionError(
                f"--peers openvino: OpenVINO GenAI is a CPU engine and --device {args.device} "
                "runs the rows elsewhere; add --device cpu"
            )
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
        from ...bench.rollout import scheduled_compressors
        from ...rollout.kv.schedule import ScheduleError

        try:
            scheduled_compressors(
                args.kv_schedule, comps, args.step_length, args.compress_prompt or None, args.tail_slack
            )
        except (ScheduleError, ValueError) as e:
            raise OptionError(f"--kv-schedule: {e}") from None
    if args.json:
        check_output_file(args.json, "--json")
    check_model(args.model)
    report = run_bench(
        model=args.model,
        batch=args.batch,
        max_new_tokens=args.max_new_tokens,
        kv_budget=args.kv_budget,
        compressors=comps,
        dtype=args.dtype,
        step_length=args.step_length,
        seed=args.seed,
        hf_baseline=not args.no_hf,
        repeat=args.repeat,
        peers=peers,
        compile=args.compile,
        quants=[q.strip() for q in args.quant.split(",") if q.strip()],
        kv_quants=[q.strip() for q in args.kv_quant.split(",") if q.strip()],
        compress_prompt=args.compress_prompt or None,
        quant_smooth=args.quant_smooth,
        quant_group=args.quant_group,
        quant_outliers=args.quant_outliers,
        quant_head=args.quant_head,
        tail_slack=args.tail_slack,
        kernels=kernels,
        device=args.device,
        kv_schedule=args.kv_schedule,
    )
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    return 0
