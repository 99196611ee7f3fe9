"""``none``: the dense cache (no compression). Kept as a name so configs can say ``compressor: none``;
the engine runs dense when :func:`sparserl.rollout.kv.get_compressor` returns None."""
