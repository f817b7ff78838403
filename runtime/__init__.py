"""Executing a Plan on torch.distributed: ``apply_plan`` and ``parplan run``.

``apply`` interprets the user's traced model under the plan (``apply_plan``
→ ``DistributedModel``), one layer kind at a time (``layers``), moving
tensors between placements (``placement``, ``redistribute``), with the
building blocks each equal to the unsplit operation: ``halo_exchange`` and
``overlap`` (halos, with a tile's interior computed meanwhile), ``spatial``
(convolution and pooling on tiles), ``resample`` (upsampling and transposed
convolution on tiles), ``norm`` (batch-norm over a group), ``collectives``,
``slicing`` (channel-split weights), ``gradsync`` (gradient sums over replica
groups) and ``groups`` (process groups). The loss: ``losses`` (``--loss``:
built-ins or the user's function, the target it takes, what it costs) and
``split_loss`` (a user's loss run on each rank's box of the output, kept
split; ``training_io`` falls back to the gathered output where it cannot). A rank of ``parplan run`` takes one
frozen ``options.RunOptions``; ``batches`` makes its box of each batch,
``seeded_model`` its model, ``train`` is its training loop and ``--verify``,
``measurement`` what it reports; ``launch`` starts ranks with torchrun's
machinery or under MPI (``parplan run`` is ``parplan.cli.run``'s).

Pipelines (``pipeline/``): ``cut`` cuts the traced model into the plan's stages
(what crosses each cut), ``schedules`` lists each stage's events (GPipe, 1F1B,
DSP), ``stage`` runs one stage of a plan on this rank (``apply_pipeline``
→ ``PipelineStage``: sends, receives, stashes, recomputes) and ``worker`` is a
pipeline rank's training loop, measurement and ``--verify``.
"""

__all__: list[str] = []
