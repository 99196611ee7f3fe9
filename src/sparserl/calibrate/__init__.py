"""``sparserl calibrate``: Sparrow's offline calibration of a sparsity schedule (Zhou et al., 2026,
arXiv 2606.08446; docs/algorithms.md §3).

For each compressor and KV budget, sample responses (by that sparse sampler, or once by the dense
policy), measure the exact acceptance α of every token against the dense policy (:mod:`.measure`),
bin it by sequence length, and pick per compressor the cheapest budget per length bin, non-decreasing
with length, whose 5th percentile of α stays at or above a threshold (:mod:`.search`). The schedule
loads as a sampler's ``schedule`` option (:func:`sparserl.rollout.kv.schedule.load_schedule`); its
predicted and measured cost against dense come with it (:mod:`.speed`).

- :mod:`.measure`: α rows per (compressor, budget, length bin);
- :mod:`.search`: the cheapest schedule from a table of rows (a pure function);
- :mod:`.speed`: the schedule's measured tokens/s against dense, and the cost model's prediction;
- :mod:`.output`: the JSON document and the console table;
- :mod:`.plot`: α per bin, a subplot per compressor;
- the command (its options, their checks and the run): :mod:`sparserl.commands.calibrate`.
"""
