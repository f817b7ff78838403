"""Running a plan's pipeline stages: cutting the traced model into stages, the values crossing each cut, the
schedules' event lists, one stage on this rank (``apply_pipeline``) and a pipeline rank's training loop.
"""
