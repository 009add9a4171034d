"""Stage 4, judgement: findings over the per-instance metrics, never over the raw trace tables."""
