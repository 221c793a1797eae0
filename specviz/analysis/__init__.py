"""Analyses computed from traces: the metric definitions (metrics), lossless checks (lossless);
later: alignment, EDR."""
