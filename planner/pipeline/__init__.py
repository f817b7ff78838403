"""The pipeline stage search around the per-stage layout choice: stage sizes, cut points and exact cuts, lower
bounds, and the outer search over stages, micro-batches and staleness.
"""
