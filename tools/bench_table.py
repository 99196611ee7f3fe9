"""Markdown table of the rollout benchmark JSONs: python tools/bench_table.py docs/results/bench_rollout_L*.json"""

import json
import sys

print(
    "| L | engine | compressor | budget | tok/s | vs generate | vs sparserl dense | KV peak MiB | "
    "KV theory MiB | RSS peak MiB | roofline |"
)
print("|---|---|---|---|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    rep = json.load(open(path))
    for r in rep["results"]:
        vs = "-" if r["ratio_vs_hf_generate"] is None else f"{r['ratio_vs_hf_generate']:.2f}x"
        print(
            f"| {r['max_new_tokens']} | {r['engine']} | {r['compressor']} | {r['kv_budget'] or '-'} | "
            f"{r['tokens_per_s']:.1f} | {vs} | "
            f"{r['ratio_vs_sparserl_dense']:.2f}x | {r['kv_bytes_peak'] / 2**20:.1f} | "
            f"{r['kv_bytes_theory'] / 2**20:.1f} | "
            f"{r['rss_peak_bytes'] / 2**20:.0f} | {r['roofline_fraction']:.2f} |"
        )
m = json.load(open(sys.argv[1]))["machine"]
print(
    f"\nMachine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
    f"dtype {m['dtype']}, "
    f"measured read bandwidth {m['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
    f"prompt {m['prompt_tokens']} tokens, batch 16."
)
