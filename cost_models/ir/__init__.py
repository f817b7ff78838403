"""The intermediate representation: the traced layer graph (``trace()``), layer kinds, value orders, FLOPs,
micro-batch shapes and loading a MODEL argument. ``docs/architecture.md`` draws the rooms.
"""
