"""The documents parplan reads and writes: plans, JSON I/O, versioned JSON Schemas (``schemas/``) and the
predicted timeline as Chrome trace events.
"""
