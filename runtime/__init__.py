"""Executing a Plan on torch.distributed.

Built so far, each module one building block equal to the unsplit operation:
``halo_exchange`` (rows a tile's windows read from its neighbours),
``spatial`` (convolution and pooling on height/width tiles), ``norm``
(batch-norm statistics over a group), ``redistribute`` (moving a tensor
between layouts) and ``channel`` (filter-split convolution and linear).
``apply_plan`` and the launcher come next (runtime issue).
"""

__all__: list[str] = []
