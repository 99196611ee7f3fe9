"""``sparserl demo``: a short rollout on the embedded model, dense and with R-KV: what it generated, its
speed and KV memory."""

from __future__ import annotations


def add_parser(subparsers, parents=()):
    d = subparsers.add_parser("demo", parents=list(parents), help="a short rollout demo on the embedded model")
    d.add_argument("--model", default="smollm2-135m")
    d.set_defaults(fn=run)
    return d


def run(args) -> int:
    from ..models.loading import check_model, load_model
    from ..rollout.dtype_auto import resolve_dtype
    from ..rollout.engine import RolloutEngine
    from ..rollout.kv import build_compressor
    from ..rollout.sampling import SamplingParams

    check_model(args.model)
    dtype = resolve_dtype("auto")
    lm = load_model(args.model, dtype=dtype)
    prompt = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}]
    for name in ("none", "rkv"):
        comp = build_compressor(name, kv_budget=32, step_length=16)
        out = RolloutEngine(lm, comp, dtype=dtype).generate(
            [prompt], SamplingParams(n=4, max_new_tokens=96, temperature=0.7)
        )
        print(
            f"--- {name}: {out.tokens_per_s:.0f} tok/s, KV allocated {out.kv.bytes_peak / 2**20:.2f} MiB "
            f"(dense engine {out.kv.bytes_dense_alloc / 2**20:.2f} MiB)"
        )
        print(out.texts[0][:300])
    return 0
