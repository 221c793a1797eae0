"""Analyses computed from traces: the metric definitions (metrics), lossless checks (lossless),
offline replay of a drafter along a cached rollout (replay)."""
