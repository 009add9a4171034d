"""Stage 3, measures per instance: the op tree, the attention calls and their ledger, overhead, phases,
stalls, communication, kernel statistics and the per-instance metrics."""
