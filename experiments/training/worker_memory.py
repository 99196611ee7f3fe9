"""A rollout worker's resident memory through partial rollouts at the long job's size, beside what the memory
prediction counts for it.

    python3 experiments/training/worker_memory.py --pushes 3 --json worker_memory.json

The worker runs in this process (``RolloutWorker`` is plain Python; Ray wraps it), fed the calls a driver sends
under ``rollout.async=true rollout.max_staleness=2 rollout.partial=true`` with one worker: after each push, the
rollout sent a step before goes on to its end (its last segment, the dense cache read as the driver asks), then
the next rollout starts (its first segment, ⌈max_new_tokens / 2⌉ decode steps). The pushes are the learner's own
weights under new numbers (the memory is the same whatever they hold). After every call: the process's resident
bytes (VmRSS) and high-water mark (VmHWM), and with ``--trim`` the resident bytes again after returning freed
heap pages (``malloc_trim``, what ``train.trim_heap`` does in the training process).

``--reading-only``: no sampling; the worker reads a rollout of ``train.prompts_per_step`` x ``rollout.n`` responses
of ``rollout.max_new_tokens`` random tokens each (the longest it may return) on a dense cache, as it does each
finished rollout under ``rollout.async``; ``--unbounded`` reads it without ``train.max_tokens_per_micro_batch``
(``train.micro_batch_size`` rows a forward, as before the bound). One process per case: VmHWM is the process's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="long")
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--trim", action="store_true", help="malloc_trim after each call, and measure again")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--reading-only", action="store_true", help="only the dense-cache reading of one rollout")
    parser.add_argument("--unbounded", action="store_true", help="the reading without the token bound")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from sparserl.cluster.worker import RolloutWorker
    from sparserl.config.loading import load_config
    from sparserl.data import PromptSampler, load_dataset
    from sparserl.memory.allocator import trim_freed_memory
    from sparserl.models.loading import load_model
    from sparserl.preflight import preflight
    from sparserl.train.sampler_sync import sampling_params

    ahead = ["rollout.async=true", "rollout.max_staleness=2", "rollout.partial=true", "cluster.rollout_workers=1"]
    cfg = load_config(args.preset, ahead + list(args.overrides))
    d = cfg.data
    data = load_dataset(d.train, template=d.template, system_prompt=d.system_prompt)
    prompts = PromptSampler(data, cfg.train.prompts_per_step, seed=cfg.train.seed)
    rows = []

    def record(what: str) -> None:
        row = {"after": what, **_status()}
        if args.trim:
            trim_freed_memory()
            row["VmRSS_trimmed"] = _status()["VmRSS"]
        rows.append(row)
        print(row, flush=True)

    record("start")
    worker = RolloutWorker(cfg, 0)
    record("worker built (model loaded, sampler built)")
    lm = load_model(cfg.model.name, dtype=cfg.model.dtype, seed=cfg.model.seed)
    state = lm.model.state_dict()
    if args.reading_only:
        reading_only(cfg, worker, state, prompts, record, args.unbounded)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows, "unbounded": args.unbounded}, indent=1) + "\n")
        return
    segment = -(-cfg.rollout.max_new_tokens // 2)
    in_flight = None
    for push in range(1, args.pushes + 1):
        worker.load_weights(state, push)
        record(f"push {push} loaded")
        if in_flight is not None:
            out = worker.advance(in_flight, push, None, read_dense_cache=0)
            record(f"rollout {in_flight} ended ({out.tokens_generated} tokens)")
            del out
        params = sampling_params(cfg, push, keep_hidden=True)
        worker.start(push, [e.prompt for e in prompts.next_batch()], params, 0, push, steps=segment)
        record(f"rollout {push} started ({segment} decode steps)")
        in_flight = push
    predicted = preflight(cfg).resident  # the run's own prediction (its prompt bound from the data)
    worker_predicted = next(v for k, v in predicted.items() if k.startswith("rollout workers"))
    summary = {"rows": rows, "predicted_worker_bytes": worker_predicted, "predicted_resident": predicted}
    print(
        f"predicted worker: {worker_predicted / 1e9:.2f} GB; measured high-water mark {rows[-1]['VmHWM'] / 1e9:.2f} GB"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


def reading_only(cfg, worker, state, prompts, record, unbounded: bool) -> None:
    """The dense-cache reading of one rollout of responses at the longest (random tokens), after a push."""
    import torch

    from sparserl.rollout.output import KVStats, RolloutOutput
    from sparserl.train.sampler_sync import sampling_params

    worker.load_weights(state, 1)
    if unbounded:
        worker.max_tokens = None
    record("push 1 loaded")
    g = torch.Generator().manual_seed(0)
    examples, n, T = prompts.next_batch(), cfg.rollout.n, cfg.rollout.max_new_tokens
    prompt_ids = [worker.engine.encode(e.prompt) for e in examples for _ in range(n)]
    responses = [torch.randint(100, 40000, (T,), generator=g).tolist() for _ in prompt_ids]
    out = RolloutOutput(
        prompt_index=[i for i in range(len(examples)) for _ in range(n)],
        prompt_ids=prompt_ids,
        response_ids=responses,
        sampler_logprobs=[[-1.0] * T for _ in responses],
        finish_reason=["length"] * len(responses),
        kv_tokens_kept=[0] * len(responses),
        kv=KVStats(),
    )
    worker._finish(out, sampling_params(cfg, 1), 1, 0)
    how = "without the token bound" if unbounded else f"{worker.max_tokens} tokens a micro-batch"
    record(f"{len(responses)} responses of {T} tokens read on a dense cache ({how})")


if __name__ == "__main__":
    main()
