"""Where a training run's resident memory goes, station by station: ``sparserl train`` run in this process
with a thread sampling ``/proc/self/status`` (VmRSS, RssAnon, RssFile) every 50 ms and the run's stations
wrapped, so each station reports its peak RSS while it ran and the RSS when it ended.

    nice -n 5 python3 experiments/training/rss_stations.py --out /tmp/rss.json -- train.steps=2 \
        checkpoint.every=0 data.eval=null log.out_dir=/tmp/rss_runs

Everything after ``--`` goes to ``sparserl train`` (a preset name first, else the default preset). Stations:
imports, build (model load + optimizer: ``build_learner``; the sampler: ``engine_from_fields``, which runs
``rollout.dtype: auto``'s and the bf16 kernel's one-time measurements on a fresh cache), and per step:
rollout, old-policy log-probs (the update's own forward under ``old_logprobs=update``), α, update
(its backward and the optimizer step inside it, reported apart), the push into the sampler, held-out eval,
checkpoint save. A station inside another reports inside it (``update/backward``).

The wrappers replace module attributes (``sparserl.train.step.rollout`` etc.), so they see the run's own
calls without changing its code. Output: a table on stdout, the samples and stations in ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import functools
import json
import threading
import time

FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def read_status() -> dict:
    """The fields of :data:`FIELDS` from ``/proc/self/status``, in MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in FIELDS:
                out[key] = int(value.split()[0]) / 1024
    return out


class Sampler:
    """A thread reading :func:`read_status` every ``period`` seconds; the open stations (a stack) get the peak."""

    def __init__(self, period: float = 0.05):
        self.period, self.t0 = period, time.perf_counter()
        self.samples: list = []
        self.stack: list[dict] = []
        self.stations: list[dict] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sample(self) -> dict:
        s = read_status()
        with self.lock:
            self.samples.append((round(time.perf_counter() - self.t0, 3), s["VmRSS"], s["RssAnon"], s["RssFile"]))
            for st in self.stack:
                st["peak_mib"] = max(st["peak_mib"], s["VmRSS"])
                st["peak_anon_mib"] = max(st["peak_anon_mib"], s["RssAnon"])
        return s

    def run(self):
        while not self.stop.wait(self.period):
            self.sample()

    def enter(self, name: str) -> dict:
        s = self.sample()
        path = "/".join([x["name"] for x in self.stack] + [name])
        st = {
            "name": name,
            "path": path,
            "start_s": round(time.perf_counter() - self.t0, 3),
            "before_mib": s["VmRSS"],
            "peak_mib": s["VmRSS"],
            "peak_anon_mib": s["RssAnon"],
        }
        with self.lock:
            self.stack.append(st)
        return st

    def leave(self, st: dict):
        with self.lock:
            self.stack.remove(st)
        s = self.sample()
        st.update(
            after_mib=s["VmRSS"],
            after_anon_mib=s["RssAnon"],
            after_file_mib=s["RssFile"],
            seconds=round(time.perf_counter() - self.t0 - st["start_s"], 3),
        )
        st["peak_mib"] = max(st["peak_mib"], s["VmRSS"])
        self.stations.append(st)

    def mark(self, name: str):
        st = self.enter(name)
        self.leave(st)


def wrap(sampler: Sampler, owner, attr: str, name: str):
    """``owner.attr`` (a function) replaced by one that reports station ``name``."""
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        st = sampler.enter(name)
        try:
            return fn(*args, **kwargs)
        finally:
            sampler.leave(st)

    setattr(owner, attr, wrapped)


def install(sampler: Sampler):
    """Wrap the run's stations (imported here, after the ``imports`` mark)."""
    import torch

    from sparserl.train import build, loop, old_logprobs, step

    wrap(sampler, loop, "build_trainer", "build")
    wrap(sampler, build, "build_learner", "model load + optimizer")
    wrap(sampler, build, "engine_from_fields", "sampler build")
    wrap(sampler, loop, "train_step", "step")
    wrap(sampler, step, "rollout", "rollout")
    wrap(sampler, old_logprobs.OldPolicy, "logprobs", "old log-probs")
    wrap(sampler, step, "measure_alpha", "alpha")
    wrap(sampler, step, "update", "update")
    wrap(sampler, step, "push_weights", "push")
    wrap(sampler, loop, "held_out_eval", "held-out eval")
    wrap(sampler, loop, "save_checkpoint", "checkpoint save")
    wrap(sampler, loop, "make_report", "report")
    wrap(sampler, torch.autograd, "backward", "backward")
    wrap(sampler, torch.optim.AdamW, "step", "optimizer step")


def table(stations: list[dict]) -> str:
    """One row per station path: how often, peak RSS (max), RSS after (first and last), seconds (sum)."""
    rows: dict = {}
    for st in stations:
        r = rows.setdefault(st["path"], {"n": 0, "peak": 0.0, "first_after": st["after_mib"], "s": 0.0})
        r["n"] += 1
        r["peak"] = max(r["peak"], st["peak_mib"])
        r["last_after"] = st["after_mib"]
        r["anon"] = st["after_anon_mib"]
        r["file"] = st["after_file_mib"]
        r["s"] += st["seconds"]
    lines = [
        "| station | calls | peak RSS MiB | RSS after (first) | RSS after (last) | anon / file after (last) | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for path, r in rows.items():
        lines.append(
            f"| {path} | {r['n']} | {r['peak']:.0f} | {r['first_after']:.0f} | {r['last_after']:.0f} | "
            f"{r['anon']:.0f} / {r['file']:.0f} | {r['s']:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="JSON file for the samples and the stations")
    p.add_argument("--period", type=float, default=0.05)
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then sparserl train's arguments")
    args = p.parse_args(argv)
    train_args = [a for a in args.train_args if a != "--"]
    sampler = Sampler(args.period)
    sampler.thread.start()
    t0 = time.perf_counter()
    sampler.mark("start")
    st = sampler.enter("imports")
    from sparserl.cli import main as cli_main

    sampler.leave(st)
    install(sampler)
    rc = 1
    try:
        rc = cli_main(["train", *train_args])
    finally:  # an interrupted run still reports the stations it went through
        sampler.mark("end")
        sampler.stop.set()
        report(sampler, t0, args.out)
    return rc


def report(sampler: Sampler, t0: float, out: str | None):
    wall = time.perf_counter() - t0
    hwm = read_status()["VmHWM"]
    print(table(sampler.stations))
    print(
        f"wall {wall:.1f} s, peak RSS (VmHWM) {hwm:.0f} MiB, sampled peak {max(s[1] for s in sampler.samples):.0f} MiB"
    )
    if out:
        with open(out, "w") as f:
            json.dump({"wall_s": wall, "vmhwm_mib": hwm, "stations": sampler.stations, "samples": sampler.samples}, f)


if __name__ == "__main__":
    raise SystemExit(main())
