"""The tables regenerated from stored results: README's KV-vs-reward table and the headline bench ratios.

    python3 tools/results_table.py            # print both tables
    python3 tools/results_table.py --write    # rewrite each block between its markers
    python3 tools/results_table.py --check    # exit 1, with a diff, when a block differs

Two blocks, each between its own markers:

- README.md's **KV-vs-reward table** (``render_kv_table``), read from
  ``docs/results/compare_shipped/comparison.json`` (``sparserl compare``'s output): per arm the final
  training reward (mean ± sample std over the seeds of the mean reward of the last 3 steps), its difference
  from the dense arm paired by seed with the 95% Student-t interval, held-out pass@1 under dense and under
  sparse inference, and the KV bytes the sampler allocated against the dense arm's.
- docs/results/README.md's **headline bench ratios** (``render_table``), read from the bench JSON.

The rule every speed ratio in README.md and docs/results/ follows: a ratio of two rows of one
``sparserl bench rollout`` JSON is the **median of per-round ratios**. In round i both rows ran in the
same process (``measure.run_rounds``: every row once per round), so round i's ratio is row A's
tokens/s in round i over row B's in round i (``tokens_per_s_runs[i]``), and the figure is the median
of those. It is not a median of A's rounds divided by a median of B's: with a machine that drifts
between rounds the two can differ by a third (``bench_2026-11-24c/L256_B16_openvino_r3.json``: per
round 2.05, 1.14, 0.90, median 1.14x; median over median 1.57x).

Each row names its machine as the JSON's ``machine`` records it: ``cpu`` and ``cores``, and
``native_arch`` where the native kernels were built for other instruction sets than the CPU's own
(``$SPARSERL_NATIVE_ARCH``). Older JSON does not record the CPU's instruction sets, so ``ISA`` below
holds them per CPU model, as read from /proc/cpuinfo on each machine (docs/results/bench_quant.md).

JSON written before ``--repeat`` existed (``bench_rollout_L*.json``) has no ``tokens_per_s_runs``:
that bench timed every row once after a warm-up, in one process, so its ``tokens_per_s`` is one round.

The headlines are the one list ``HEADLINES``: which JSON, which row over which row, and what it is;
the KV-vs-reward arms are the one list ``KV_ARMS``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sparserl.bench.measure import median_round_ratio

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
README = ROOT / "README.md"
RESULTS_README = RESULTS / "README.md"
BEGIN = "<!-- speed-table:begin (python3 tools/results_table.py --write; do not edit by hand) -->"
END = "<!-- speed-table:end -->"
KV_BEGIN = "<!-- kv-reward-table:begin (python3 tools/results_table.py --write; do not edit by hand) -->"
KV_END = "<!-- kv-reward-table:end -->"

# The instruction sets of each CPU model that wrote a JSON here (not recorded in the JSON itself).
ISA = {
    "AMD EPYC": "AVX2",  # Zen 3, family 25 model 1: AVX2 + FMA + F16C, no AVX512, no VNNI, no AMX
    # family 6 model 207: AVX512 (F/BW/VL/BF16/FP16), AVX512-VNNI and AVX-VNNI, no AMX
    "Intel(R) Xeon(R) Processor": "AVX512 + VNNI",
}
CPU_NAME = {"AMD EPYC": "AMD EPYC", "Intel(R) Xeon(R) Processor": "Intel Xeon"}
ARCH_FLAG = {"-mavx2": "AVX2", "-mavx512f": "AVX512", "-mavxvnni": "AVX-VNNI", "-mavx512vnni": "AVX512-VNNI"}

# Row fields absent from older JSON, read as these values.
ROW_DEFAULTS = {"quant": "none", "kv_quant": "none", "compiled": False}

DENSE = {"engine": "sparserl", "compressor": "none", "quant": "none", "kv_quant": "none"}
RKV = {"engine": "sparserl", "compressor": "rkv", "quant": "none"}
OV_DENSE = {"engine": "openvino", "compressor": "none", "quant": "none"}
OV_EVICT = {"engine": "openvino", "compressor": "eviction", "quant": "none"}
OV_INT8 = {"engine": "openvino", "compressor": "none", "quant": "int8"}
GENERATE = {"engine": "hf_generate"}


@dataclass(frozen=True)
class Headline:
    what: str  # what the ratio compares: row a over row b
    json: str  # the JSON, relative to docs/results/
    a: dict = field(default_factory=dict)  # fields that pick row a (exactly one row must match)
    b: dict = field(default_factory=dict)  # fields that pick row b


HEADLINES = [
    # 2-core AMD EPYC (AVX2)
    Headline("sparserl float32 dense / transformers `generate`", "bench_rollout_L256.json", DENSE, GENERATE),
    Headline("sparserl float32 dense / transformers `generate`", "bench_rollout_L1024.json", DENSE, GENERATE),
    Headline(
        "`int8` / float32 dense", "bench_2026-11-24c/L256_B16_int8_rkv_r3.json", {**DENSE, "quant": "int8"}, DENSE
    ),
    Headline(
        "`int8` / float32 dense", "bench_2026-11-24c/L1024_B16_int8_rkv_r3b.json", {**DENSE, "quant": "int8"}, DENSE
    ),
    Headline(
        "`int8` + R-KV / float32 dense",
        "bench_2026-11-24c/L1024_B16_int8_rkv_r3b.json",
        {**RKV, "quant": "int8"},
        DENSE,
    ),
    Headline("R-KV (budget 256, step 128) / float32 dense", "bench_2026-11-24c/L2048_B16_rkv_r2.json", RKV, DENSE),
    Headline("float32 dense / OpenVINO GenAI dense", "bench_2026-11-24c/L256_B16_openvino_r3.json", DENSE, OV_DENSE),
    Headline("R-KV / OpenVINO eviction, equal KV bytes", "bench_2026-11-24c/L256_B16_openvino_r3.json", RKV, OV_EVICT),
    Headline(
        "`int8` / OpenVINO int8", "bench_2026-11-24c/L256_B16_openvino_r3.json", {**DENSE, "quant": "int8"}, OV_INT8
    ),
    # 2-core Intel Xeon (AVX512 + VNNI)
    Headline("float32 dense / OpenVINO GenAI dense", "bench_2026-11-24d/L256_B16_openvino_r3.json", DENSE, OV_DENSE),
    Headline("R-KV / OpenVINO eviction, equal KV bytes", "bench_2026-11-24d/L256_B16_openvino_r3.json", RKV, OV_EVICT),
    Headline(
        "`int8` / OpenVINO int8", "bench_2026-11-24d/L256_B16_openvino_r3.json", {**DENSE, "quant": "int8"}, OV_INT8
    ),
    Headline(
        "`int8` / float32 dense", "bench_2026-11-24d/L256_B16_openvino_r3.json", {**DENSE, "quant": "int8"}, DENSE
    ),
    Headline(
        "float32 dense / OpenVINO GenAI dense",
        "bench_2026-11-24h/L1024_B16_openvino_int8_group_r2.json",
        DENSE,
        OV_DENSE,
    ),
    Headline(
        "R-KV / OpenVINO eviction, equal KV bytes",
        "bench_2026-11-24h/L1024_B16_openvino_int8_group_r2.json",
        RKV,
        OV_EVICT,
    ),
    Headline(
        "`int8_group` + SmoothQuant 0.5 + int8 head / OpenVINO int8",
        "bench_2026-11-24h/L1024_B16_openvino_int8_group_r2.json",
        {**DENSE, "quant": "int8_group"},
        OV_INT8,
    ),
    Headline(
        "`int8_group` + SmoothQuant 0.5 + int8 head / float32 dense",
        "bench_2026-11-24g/L1024_B16_int8_group_smooth_head_u8_r2.json",
        {**DENSE, "quant": "int8_group"},
        DENSE,
    ),
    Headline(
        "`int8_group` + SmoothQuant 0.5 + int8 head / float32 dense",
        "bench_2026-11-24g/L256_B16_int8_int8_group_smooth_head_r2.json",
        {**DENSE, "quant": "int8_group"},
        DENSE,
    ),
    Headline(
        "`qurl_group`'s sampler (`int8_group`, groups of 32) / float32 dense",
        "bench_2026-11-24h/L1024_B16_int8_group32_smooth_head_r2.json",
        {**DENSE, "quant": "int8_group"},
        DENSE,
    ),
    Headline(
        "`qurl_group`'s sampler (`int8_group`, groups of 32) / float32 dense",
        "bench_2026-11-24h/L256_B16_int8_group32_smooth_head_r3.json",
        {**DENSE, "quant": "int8_group"},
        DENSE,
    ),
    Headline(
        "`int8_group` + SmoothQuant 0.5 + int8 head / float32 dense",
        "bench_2026-11-24h/L1024_B16_avxvnni_int8_int8_group_smooth_head_r2.json",
        {**DENSE, "quant": "int8_group"},
        DENSE,
    ),
    Headline(
        "`int8_group` + SmoothQuant 0.5 + int8 head / float32 dense",
        "bench_2026-11-24h/L1024_B16_avx2_int8_int8_group_smooth_head_r2.json",
        {**DENSE, "quant": "int8_group"},
        DENSE,
    ),
    Headline(
        "R-KV (budget 256, step 32, `tail_slack` 32) / float32 dense",
        "bench_2026-11-24g/L256_B16_rkv_slack32_r4.json",
        RKV,
        DENSE,
    ),
    Headline("R-KV (budget 256, step 128) / float32 dense", "bench_2026-11-24h/L2048_B16_rkv_r3.json", RKV, DENSE),
    # 2-core AMD EPYC (AVX512 + VNNI + BF16, no AMX)
    Headline(
        "block top-k (budget 256) / float32 dense",
        "blocktopk_L2048.json",
        {"engine": "sparserl", "compressor": "blocktopk"},
        DENSE,
    ),
    Headline("R-KV (budget 256) / float32 dense", "blocktopk_L2048.json", RKV, DENSE),
    # the same machine, with the AVX512-BF16 tile's prefetching (bf16_linear/)
    Headline(
        "bf16 fused dense / OpenVINO GenAI bf16 dense", "bf16_decode/openvino_bf16_L256_s20.json", DENSE, OV_DENSE
    ),
    Headline(
        "bf16 fused dense / OpenVINO GenAI bf16 dense", "bf16_decode/openvino_bf16_L1024_s20.json", DENSE, OV_DENSE
    ),
    Headline(
        "bf16 R-KV (budget 256, step 32) / OpenVINO bf16 eviction, equal KV bytes",
        "bf16_decode/openvino_bf16_L1024_s20.json",
        RKV,
        OV_EVICT,
    ),
    # 2 pinned cores of a GPU machine's 16-core AMX Xeon host (amx_xeon/)
    Headline(
        "bf16 fused dense (AMX tiles) / OpenVINO GenAI bf16 dense", "amx_xeon/call2/ov_bf16_L256.json", DENSE, OV_DENSE
    ),
    Headline(
        "bf16 fused dense (AMX tiles) / OpenVINO GenAI bf16 dense", "amx_xeon/call1/ov_bf16_L1024.json", DENSE, OV_DENSE
    ),
    Headline(
        "bf16 R-KV (budget 256, step 32; AMX tiles) / OpenVINO bf16 eviction, equal KV bytes",
        "amx_xeon/call1/ov_bf16_L1024.json",
        RKV,
        OV_EVICT,
    ),
]


def round_ratios(a_runs: list[float], b_runs: list[float]) -> list[float]:
    """Round i's ratio: row a's tokens/s in round i over row b's in round i (the same process)."""
    if len(a_runs) != len(b_runs) or not a_runs:
        raise ValueError(f"rows of {len(a_runs)} and {len(b_runs)} rounds: no round-by-round ratio")
    return [a / b for a, b in zip(a_runs, b_runs)]


def median_of_round_ratios(a_runs: list[float], b_runs: list[float]) -> float:
    """The median of the per-round ratios (not median(a) / median(b)): the bench's own rule."""
    if len(a_runs) != len(b_runs) or not a_runs:
        raise ValueError(f"rows of {len(a_runs)} and {len(b_runs)} rounds: no round-by-round ratio")
    return median_round_ratio(a_runs, b_runs)


def runs(row: dict) -> list[float]:
    """A row's tokens/s per round; one round where the JSON predates ``tokens_per_s_runs``."""
    return list(row.get("tokens_per_s_runs") or [row["tokens_per_s"]])


def pick(results: list[dict], want: dict, where: str) -> dict:
    """The one row whose fields equal ``want``."""
    rows = [r for r in results if all(r.get(k, ROW_DEFAULTS.get(k)) == v for k, v in want.items())]
    if len(rows) != 1:
        raise ValueError(f"{where}: {len(rows)} rows match {want}, expected one")
    return rows[0]


#: how the instruction sets a bench JSON records (``machine.isa``, from the AVX512 EPYC on) are named here
ISA_NAMES = (
    ("amx_bf16", "AMX"),
    ("avx512f", "AVX512"),
    ("avx512_vnni", "VNNI"),
    ("avx512_bf16", "BF16"),
    ("avx2", "AVX2"),
)


def isa_label(flags: list[str]) -> str:
    """``machine.isa`` as a label: the widest vector set, then VNNI / AMX ("AVX512 + VNNI")."""
    names = [name for flag, name in ISA_NAMES if flag in flags]
    if "AVX512" in names and "AVX2" in names:
        names.remove("AVX2")
    order = {"AVX2": 0, "AVX512": 0, "VNNI": 1, "BF16": 2, "AMX": 3}
    return " + ".join(sorted(names, key=order.get)) or "no AVX2"


def machine_label(machine: dict) -> str:
    cpu = machine["cpu"]
    if "isa" in machine:  # recorded by the bench itself
        isa = isa_label(machine["isa"])
    elif cpu in ISA:  # older JSON: the CPU the project's machines had under that name
        isa = ISA[cpu]
    else:
        raise ValueError(f"CPU {cpu!r} records no instruction sets and has none in results_table.ISA")
    threads, cores = machine.get("torch_threads", machine["cores"]), machine["cores"]
    where = f"{cores}-core" if threads >= cores else f"{threads} threads of a {cores}-core"
    label = f"{where} {CPU_NAME.get(cpu, cpu)}, {isa}"
    arch = machine.get("native_arch")
    if arch and arch != "native":
        built = [ARCH_FLAG[f] for f in arch.split() if f in ARCH_FLAG]
        label += f"; kernels built for {' + '.join(built) or arch} only"
    return label


def fmt(x: float) -> str:
    return f"{x:.2f}"


def headline_row(h: Headline) -> dict:
    report = json.loads((RESULTS / h.json).read_text())
    results = report["results"]
    a, b = pick(results, h.a, f"{h.json} a"), pick(results, h.b, f"{h.json} b")
    ratios = round_ratios(runs(a), runs(b))
    return {
        "what": h.what,
        "shape": f"{a['max_new_tokens']:,} tokens, batch {a['batch']}",
        "ratio": median_of_round_ratios(runs(a), runs(b)),
        "ratios": ratios,
        "machine": machine_label(report["machine"]),
        "json": h.json,
    }


def render_table(headlines: list[Headline] = HEADLINES) -> str:
    lines = ["| what | shape | ratio | per round (one process) | machine | JSON |", "|---|---|---|---|---|---|"]
    for h in headlines:
        r = headline_row(h)
        rounds = "one round" if len(r["ratios"]) == 1 else ", ".join(fmt(x) for x in r["ratios"])
        lines.append(
            f"| {r['what']} | {r['shape']} | **{fmt(r['ratio'])}x** | {rounds} | {r['machine']} | "
            f"[{r['json']}]({r['json']}) |"
        )
    return "\n".join(lines) + "\n"


def readme_block(text: str, begin: str = BEGIN, end: str = END) -> str:
    """What ``text`` holds between the markers ``begin`` and ``end``."""
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"the page must hold one {begin!r} ... {end!r} block")
    return text[text.index(begin) + len(begin) : text.index(end)].strip("\n") + "\n"


def with_block(text: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    readme_block(text, begin, end)
    return text[: text.index(begin) + len(begin)] + "\n" + table + text[text.index(end) :]


# ---- README's KV-vs-reward table, from sparserl compare's comparison.json ----

COMPARISON = "compare_shipped/comparison.json"
#: the machine compare_shipped ran on (docs/results/compare_shipped/README.md; comparison.json records none)
COMPARISON_MACHINE = "2-core AMD EPYC, AVX512 + VNNI + BF16 (no AMX), no GPU"


@dataclass(frozen=True)
class KvArm:
    arm: str  # the arm's name in comparison.json
    what: str  # what the arm runs
    command: str  # the command that runs it now


KV_ARMS = [
    KvArm("dense", "dense: full KV cache, no correction", "`sparserl train dense`"),
    KvArm(
        "sparrow_cap64",
        "**new default**: R-KV, α-tail controller (budgets 40 → [16, 64]), Sparse-RL",
        "`sparserl train`",
    ),
    KvArm("sparse_rl", "previous default: R-KV fixed at 40 tokens, Sparse-RL", "`sparserl train sparse_rl_fixed40`"),
    KvArm(
        "sparse_naive",
        "R-KV fixed at 40 tokens, no correction",
        "`sparserl train sparse_naive`",
    ),
]


#: sparserl compare's verdict on a paired difference, as the table words it
VERDICT = {"worse": "below dense, beyond noise", "better": "above dense, beyond noise", "within noise": "within noise"}


def signed(x: float) -> str:
    return f"{x:+.2f}".replace("-", "\u2212")


def kv_row(arm: KvArm, comparison: dict) -> list[str]:
    a = comparison["arms"][arm.arm]
    fr = a["final_reward"]
    if arm.arm == comparison["dense_arm"]:
        diff = "\u2013"
    else:
        p = a["vs_dense_paired"]["final_reward"]
        lo, hi = p["ci95"]
        diff = f"{signed(p['mean'])} [{signed(lo)}, {signed(hi)}] ({VERDICT.get(p['verdict'], p['verdict'])})"
    ev = a["eval"]
    kv = a["kv"]["vs_dense_arm"]
    kv_text = "1x" if abs(kv - 1.0) < 5e-3 else f"{kv:.2f}x less"
    return [
        arm.what,
        arm.command,
        f"{fr['mean']:.2f} \u00b1 {fr['std']:.2f}",
        diff,
        f"{ev['dense']['pass@1_mean']:.2f}",
        f"{ev['sparse']['pass@1_mean']:.2f}",
        kv_text,
    ]


def render_kv_table(arms: list[KvArm] = KV_ARMS, path: str = COMPARISON) -> str:
    c = json.loads((RESULTS / path).read_text())
    seeds, steps = len(c["seeds"]), c["steps"]
    ev = next(iter(c["arms"].values()))["eval"]
    sparse = ev["sparse"]
    lines = [
        "| run | command | final reward | \u2212 dense, paired [95%] | held-out pass@1, dense inference | "
        "held-out pass@1, sparse inference | KV allocated vs dense |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(kv_row(arm, c)) + " |" for arm in arms]
    lines += [
        "",
        f"{seeds} seeds per run, paired by seed; {steps} steps of the main job; final reward: the mean reward of "
        f"the last {c['final_k']} steps, mean \u00b1 std over seeds; held-out: {ev['problems']} problems of "
        f"`{c['eval_data']}`, greedy, sparse inference on {sparse['compressor'].upper().replace('RKV', 'R-KV')} "
        f"at {sparse['kv_budget']} tokens. Machine: {COMPARISON_MACHINE}. "
        f"Data: [{path}](docs/results/{path}).",
    ]
    return "\n".join(lines) + "\n"


# ---- the blocks and where they live ----


@dataclass(frozen=True)
class Block:
    name: str
    page: Path
    begin: str
    end: str
    render: object  # () -> str


def blocks() -> list[Block]:
    return [
        Block("KV-vs-reward table", README, KV_BEGIN, KV_END, render_kv_table),
        Block("headline bench ratios", RESULTS_README, BEGIN, END, render_table),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite each page's block between its markers")
    g.add_argument("--check", action="store_true", help="exit 1 with a diff when a page's block differs")
    args = p.parse_args(argv)
    status = 0
    for b in blocks():
        table = b.render()
        if args.write:
            text = b.page.read_text()  # read just before writing: other sections may be edited meanwhile
            new = with_block(text, table, b.begin, b.end)
            if new != text:
                b.page.write_text(new)
        elif args.check:
            block = readme_block(b.page.read_text(), b.begin, b.end)
            if block != table:
                name = f"{b.page.relative_to(ROOT)} ({b.name})"
                sys.stdout.writelines(
                    difflib.unified_diff(block.splitlines(True), table.splitlines(True), name, "regenerated from JSON")
                )
                status = 1
        else:
            sys.stdout.write(f"{b.name} ({b.page.relative_to(ROOT)}):\n\n{table}\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
