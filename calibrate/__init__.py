"""Measuring a machine — compute kernels and collectives — into a Profile (built in the calibration issue).

Nothing is exported yet: this package holds no code until the calibration
issue, so importing it gives an empty namespace rather than placeholders.
"""

__all__: list[str] = []
