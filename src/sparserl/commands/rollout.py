"""``sparserl rollout``: sample responses to a file of prompts with the compressed engine, written as JSON
lines (token ids, sampler log-probs, finish reasons, KV tokens kept, text)."""

from __future__ import annotations

import json

from ..checks import check_output_file, check_sampler_options
from ..errors import OptionError
from .options import add_sampler_options, check_generation_args


def add_parser(subparsers, parents=()):
    r = subparsers.add_parser("rollout", parents=list(parents), help="sample responses with the compressed engine")
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
    add_sampler_options(r)
    r.set_defaults(fn=run)
    return r


def read_prompts(path: str, key: str = "prompt") -> list:
    """The prompts of ``--prompts``: the ``key`` of each JSON line, a string or chat messages."""
    from ..data.loaders import DataError, read_text_lines

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
            raise DataError(
                f"{path} line {lineno}: missing key {key!r} (each line is a JSON object with a "
                f"{key!r}: a string or a list of chat messages{columns})"
            )
        prompt = row[key]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt))):
            raise DataError(f"{path} line {lineno}: {key!r} must be a string or a list of chat messages")
        if not (prompt.strip() if isinstance(prompt, str) else prompt):
            raise DataError(f"{path} line {lineno}: {key!r} is empty")
        prompts.append(prompt)
    if not prompts:
        raise DataError(f"--prompts file {path} is empty (expected JSON lines with a {key!r})")
    return prompts


def run(args) -> int:
    from ..data.loaders import DataError
    from ..models.loading import check_model, load_model
    from ..rollout.dtype_auto import resolve_dtype
    from ..rollout.engine import RolloutEngine
    from ..rollout.sampling import SamplingParams

    check_generation_args(args, top=True)
    comp = check_sampler_options(args)
    out_path = check_output_file(args.out, "--out")
    if not args.prompt_key:
        raise OptionError("--prompt-key '': name the key of each line that holds the prompt")
    prompts = read_prompts(args.prompts, args.prompt_key)
    check_model(args.model)
    dtype = resolve_dtype(args.dtype)
    lm = load_model(args.model, dtype=dtype)
    engine = RolloutEngine(lm, comp, dtype=dtype)
    params = SamplingParams(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
        stop=args.stop or [],
        seed=args.seed,
    )
    try:
        out = engine.generate(prompts, params)
    except ValueError as e:  # a prompt the model cannot take (empty, longer than its context)
        raise DataError(f"--prompts {args.prompts}: {e}") from None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w") as f:
        for i in range(len(out.response_ids)):
            f.write(
                json.dumps(
                    {
                        "prompt_index": out.prompt_index[i],
                        "prompt_ids": out.prompt_ids[i],
                        "response_ids": out.response_ids[i],
                        "sampler_logprobs": out.sampler_logprobs[i],
                        "finish_reason": out.finish_reason[i],
                        "kv_tokens_kept": out.kv_tokens_kept[i],
                        "text": out.texts[i],
                    }
                )
                + "\n"
            )
    print(
        f"{len(out.response_ids)} responses -> {args.out}: {out.tokens_generated} tokens in "
        f"{out.seconds:.1f}s ({out.tokens_per_s:.1f} tok/s); KV allocated {out.kv.bytes_peak / 2**20:.1f} MiB "
        f"(the dense engine allocates {out.kv.bytes_dense_alloc / 2**20:.1f} MiB for this batch), "
        f"{out.kv.compressions} compressions"
    )
    return 0
