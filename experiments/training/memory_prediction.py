"""Predicted against measured peak memory of training steps (sparserl.memory.predict_peak).

Each configuration runs in a child process of its own: the trainer built from ``sparserl config`` style
overrides, then ``--steps`` training steps (2 by default: AdamW's moments exist from the first optimizer
step on, so the second step is the run's steady state), every response sampled to
``rollout.max_new_tokens`` (EOS ignored: the prediction is the worst case of a step's lengths). The child
reports its VmHWM (the peak resident set of its own address space; ``ru_maxrss`` would also count the
parent's resident set, which a forked child holds until its exec), the peak after the trainer was built, the
longest prompt in tokens (of the data's first 2,000), and what the ``auto`` choices resolved to; the
prediction is computed with those (the ``auto`` values set to what the run chose, the prompt length
measured), and with preflight's bound.

    nice -n 5 python3 experiments/training/memory_prediction.py --baseline
    nice -n 5 python3 experiments/training/memory_prediction.py --saved
    nice -n 5 python3 experiments/training/memory_prediction.py --out /tmp/mem.json \\
        --run "tiny48: default model.name=tiny data.eval=null" \\
        --run "smol128: dense data.eval=null rollout.max_new_tokens=128 train.prompts_per_step=2 \\
               train.micro_batch_size=4"

``--baseline``: an idle process's RSS after importing torch, transformers and sparserl's trainer (what
:data:`sparserl.memory.predict.BASELINE_BYTES` holds). ``--saved``: the bytes autograd saves per token
and decoder layer, counted with a saved-tensor hook, against :func:`sparserl.memory.activations.saved_layer_bytes`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD_ENV = "SPARSERL_MEMORY_CHILD"
PROMPTS_COUNTED = 2000  # the longest prompt is measured over the data's first this many, after the peak


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(preset: str, overrides: list[str], steps: int) -> dict:
    """Build the trainer and run ``steps`` steps with every response at full length; the peaks and facts."""
    import dataclasses

    from sparserl.config import load_config, validate
    from sparserl.models.mixed_precision import learner_precision
    from sparserl.train import sampler_sync
    from sparserl.train import step as step_module
    from sparserl.train.build import build_trainer

    plain = sampler_sync.sampling_params

    def full_length(*a, **k):
        return dataclasses.replace(plain(*a, **k), ignore_eos=True)

    sampler_sync.sampling_params = full_length
    step_module.sampling_params = full_length
    cfg = validate(load_config(preset, overrides))
    t0 = time.perf_counter()
    trainer = build_trainer(cfg)
    built = _hwm()
    for k in range(steps):
        step_module.train_step(trainer, k)
    peak = _hwm()
    examples = trainer.data.examples[:PROMPTS_COUNTED]
    return {
        "peak_bytes": peak,
        "built_peak_bytes": built,
        "seconds": time.perf_counter() - t0,
        "prompt_tokens_max": max(len(trainer.engine.encode(ex.prompt)) for ex in examples),
        "mixed_precision": learner_precision(cfg.model, trainer.device),
        "rollout_dtype": str(trainer.engine.dtype).replace("torch.", ""),
        "gradient_checkpointing": bool(getattr(trainer.learner, "is_gradient_checkpointing", False)),
    }


def predicted(preset: str, overrides: list[str], facts: dict | None) -> dict:
    """The prediction with the run's resolved choices and measured prompt length, and preflight's."""
    from sparserl.config import load_config
    from sparserl.cost import ModelShape
    from sparserl.memory import predict_peak
    from sparserl.preflight import _architecture_fields, check_data, prompt_tokens_bound

    cfg = load_config(preset, overrides)
    shape = ModelShape.from_config(_architecture_fields(cfg.model.name, cfg.model.seed))
    out = {"preflight": predict_peak(cfg, shape, prompt_tokens_bound(check_data(cfg))).peak}
    if facts:
        resolved = [
            f"model.mixed_precision={facts['mixed_precision']}",
            f"rollout.dtype={facts['rollout_dtype']}",
            f"train.gradient_checkpointing={str(facts['gradient_checkpointing']).lower()}",
        ]
        p = predict_peak(load_config(preset, [*overrides, *resolved]), shape, facts["prompt_tokens_max"])
        out.update(resolved=p.peak, parts=p.parts(), station=p.largest_station, notes=p.notes)
    return out


def run(spec: str, steps: int) -> dict:
    name, _, rest = spec.partition(":")
    words = rest.split()
    preset, overrides = (words[0], words[1:]) if words and "=" not in words[0] else ("default", words)
    env = {**os.environ, CHILD_ENV: json.dumps([preset, overrides, steps])}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name}: the child failed:\n{proc.stderr[-3000:]}")
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    pred = predicted(preset, overrides, facts)
    row = {"name": name, "preset": preset, "overrides": overrides, **facts, **pred}
    row["error_resolved"] = pred["resolved"] / facts["peak_bytes"] - 1
    row["error_preflight"] = pred["preflight"] / facts["peak_bytes"] - 1
    return row


def baseline() -> int:
    code = (
        "import torch, transformers, sparserl.cli, sparserl.train.build, sparserl.train.step\n"
        "import transformers.models.llama.modeling_llama\n"
        "print(next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:')))"
    )
    runs = [int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout) for _ in range(3)]
    return max(runs)


def saved(shapes=((576, 1536, 9, 3, 64), (576, 3072, 9, 3, 64), (1152, 1536, 9, 3, 64), (576, 1536, 18, 6, 32))):
    """Per shape and precision: bytes saved per token and layer, counted and predicted."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from sparserl.cost import ModelShape
    from sparserl.memory.activations import autocast_weight_bytes, saved_layer_bytes

    def count(layers, H, I, hq, hkv, d, autocast, B=2, T=256):
        cfg = LlamaConfig(
            vocab_size=1000, hidden_size=H, intermediate_size=I, num_hidden_layers=layers,
            num_attention_heads=hq, num_key_value_heads=hkv, head_dim=d, tie_word_embeddings=True,
        )  # fmt: skip
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(cfg)
        params = {p.untyped_storage().data_ptr() for p in m.parameters()}
        seen: dict[int, int] = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                seen[ptr] = t.untyped_storage().nbytes()
            return t

        ids = torch.randint(0, 1000, (B, T))
        mask = torch.ones(B, T, dtype=torch.long)
        mask[0, :5] = 0
        ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
        with ctx, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m.model(input_ids=ids, attention_mask=mask)
        return sum(seen.values()), cfg, B * T

    rows = []
    for shp in shapes:
        for autocast in (False, True):
            one, cfg, tokens = count(1, *shp, autocast)
            two, _, _ = count(2, *shp, autocast)
            shape = ModelShape.from_config(cfg)
            pred = saved_layer_bytes(shape, 4, 2 if autocast else 4, 256, autocast)
            if autocast:  # the hook also sees autocast's bfloat16 weight copies, one layer's per layer
                pred += autocast_weight_bytes(shape) / shape.layers / tokens
            rows.append({"shape": shp, "autocast": autocast, "counted": (two - one) / tokens, "predicted": pred})
    return rows


def main() -> None:
    if os.environ.get(CHILD_ENV):
        preset, overrides, steps = json.loads(os.environ[CHILD_ENV])
        print(json.dumps(child(preset, overrides, steps)))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", default=[], help='"name: [preset] key=value ..."')
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--baseline", action="store_true")
    ap.add_argument("--saved", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out: dict = {}
    if args.baseline:
        out["baseline_bytes"] = baseline()
        print(f"baseline: {out['baseline_bytes'] / 1e6:.0f} MB")
    if args.saved:
        out["saved"] = saved()
        for r in out["saved"]:
            counted, pred = r["counted"], r["predicted"]
            print(f"saved {r['shape']} autocast={r['autocast']}: counted {counted:.0f} B, predicted {pred:.0f} B")
    out["runs"] = []
    for spec in args.run:
        row = run(spec, args.steps)
        out["runs"].append(row)
        print(
            f"{row['name']}: measured {row['peak_bytes'] / 1e9:.2f} GB (built {row['built_peak_bytes'] / 1e9:.2f}), "
            f"predicted {row['resolved'] / 1e9:.2f} GB ({row['error_resolved']:+.0%}) at the {row['station']}, "
            f"preflight {row['preflight'] / 1e9:.2f} GB ({row['error_preflight']:+.0%}); prompt "
            f"{row['prompt_tokens_max']} tokens, {row['mixed_precision']}, sampler {row['rollout_dtype']}, "
            f"checkpointing {row['gradient_checkpointing']}, {row['seconds']:.0f} s",
            flush=True,
        )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1, default=str)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
