"""Analyses computed from traces and cached rollouts: lossless checks and the lossless verdict
(lossless), offline replay of a drafter along a cached rollout (replay), expected decoding rounds
as a Markov reward process (edr) and the offline comparison of drafters (offline_eval), the
rejected-suffix alignment and its bound (alignment, suffix_bound). The headline metrics are
defined in :mod:`specviz.metrics`."""
