"""Stage 2, attribution: the instances of a region (forwards or training steps) and the CPU ops,
runtime calls and device work that belong to each, by correlation, across threads (autograd) and
streams."""
