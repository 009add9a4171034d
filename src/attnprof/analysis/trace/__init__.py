"""Stage 1, reading: a Chrome trace file decoded once (msgspec, streamed; two processes for a large
file) into typed columnar tables (`tables.ParsedTrace`, `load.load_trace`)."""
