"""Executing a Plan on torch.distributed: ``apply_plan`` and ``parplan run``.

``apply`` interprets the user's traced model under the plan (``apply_plan``
→ ``DistributedModel``), one layer kind at a time (``layers``), moving
tensors between placements (``placement``, ``redistribute``), with the
building blocks each equal to the unsplit operation: ``halo_exchange`` and
``overlap`` (halos, with a tile's interior computed meanwhile), ``spatial``
(convolution and pooling on tiles), ``resample`` (upsampling and transposed
convolution on tiles), ``norm`` (batch-norm over a group), ``collectives``,
``slicing`` (channel-split weights), ``gradsync`` (gradient sums over replica
groups) and ``groups`` (process groups). ``data`` makes synthetic batches per
box, ``train`` is one rank's training loop and ``--verify``, ``launch`` starts
ranks with torchrun's machinery or under MPI, ``command`` is ``parplan run``.
"""

__all__: list[str] = []
