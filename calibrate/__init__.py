"""Measuring a machine — compute kernels and collectives — into a ``cost_models.profile.Profile``.

* ``problems``: which local problems a model's layers pose under candidate layouts;
* ``kernels``: timing their forward, backward-data and backward-weight kernels;
* ``compute_fit`` / ``comm_fit`` / ``fitting``: relative-error fits with held-out errors;
* ``comm_bench`` / ``comm_ranks``: timing collectives on spawned ranks or under torchrun/mpirun;
* ``presets``: datasheet-derived profiles (``v100``, ``a100``, ``h100``);
* ``session``: one budgeted calibration run end to end.

Only ``presets`` and the fitting modules are importable without torch; import
the submodules directly (this package imports none of them eagerly).
"""

__all__ = ["comm_bench", "comm_fit", "comm_ranks", "compute_fit", "fitting", "kernels", "presets", "problems",
           "session"]
