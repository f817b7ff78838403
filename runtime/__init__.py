"""Executing a Plan on torch.distributed (built in later issues: apply_plan, halo exchange, pipelines).

Nothing is exported yet: this package holds no code until the runtime issue,
so importing it gives an empty namespace rather than placeholders.
"""

__all__: list[str] = []
