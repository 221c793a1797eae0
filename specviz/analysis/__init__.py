"""Analyses computed from traces: lossless checks and statistics (later: alignment, EDR)."""
