"""How the sampler differs from the dense policy, measured: the project's central quantity.

- :mod:`.acceptance`: Sparrow's per-token acceptance α = Σ_x min(p, q) and its tail by length bin;
- :mod:`.exact_alpha`: α over the whole vocabulary from the sampler's kept ``q`` or a replay;
- :mod:`.replay`: the sampler re-run on its own tokens, forced, handing over each step's ``q``;
- :mod:`.teacher_forced`: the sampler's weights on a dense full-precision cache (``q_w``);
- :mod:`.split`: the mismatch's k3 split into weights, cache and lag;
- :mod:`.measure`: a training step's α metrics (``mismatch.alpha``).

It reads the sampler (:mod:`sparserl.rollout`) and the dense policy (:mod:`sparserl.score`) and is read
by training, calibration and the experiments; it imports nothing above it.
"""
