"""An example data factory for ``parplan run --data examples/pattern_data.py:batch``.

``parplan run`` calls ``batch(input_box, target_box, step)`` on every rank
with the slices of the global batch that rank needs — a real loader reads just
those rows and columns of each image from disk (e.g. a ``numpy.memmap`` or a
tiled format), so a large sample is never loaded whole. This one computes a
smooth pattern of the global pixel coordinates instead, and a label per sample
(``(N,)`` targets) or per pixel (``(N, H, W)`` targets, a segmentation).
With ``--verify`` the unsplit model's batch comes from the same function
called with whole boxes.

A model taking several tensors gets a tuple of boxes, one per input in the
forward's argument order, and returns a tuple of inputs:
``conditioned_batch`` feeds ``examples/conditioned_cnn.py``'s
``forward(x, cond)`` (``--data examples/pattern_data.py:conditioned_batch``).
"""

from __future__ import annotations

import torch

__all__ = ["batch", "conditioned_batch"]

CLASSES = 2


def batch(input_box: tuple[slice, ...], target_box: tuple[slice, ...], step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's input ``(n, c, h, w)`` and labels for one step."""
    n, c, h, w = (_positions(part) for part in input_box)
    image = (torch.sin(h.view(1, 1, -1, 1) / 7.0 + n.view(-1, 1, 1, 1) + step)
             + torch.cos(w.view(1, 1, 1, -1) / 5.0 + c.view(1, -1, 1, 1)))
    samples = _positions(target_box[0])
    if len(target_box) == 1:
        return image, (samples.long() + step) % CLASSES
    rows, cols = _positions(target_box[1]), _positions(target_box[2])
    labels = (rows.view(1, -1, 1) + cols.view(1, 1, -1) + samples.view(-1, 1, 1) + step) % CLASSES
    return image, labels.long()


def conditioned_batch(input_boxes: tuple[tuple[slice, ...], ...], target_box: tuple[slice, ...],
                      step: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """This rank's image ``(n, c, h, w)``, condition ``(n, d)`` and labels for one step (two inputs)."""
    image_box, cond_box = input_boxes
    image, labels = batch(image_box, target_box, step)
    samples, features = _positions(cond_box[0]), _positions(cond_box[1])
    cond = torch.cos(samples.view(-1, 1) * 0.7 + features.view(1, -1) * 1.3 + step)
    return (image, cond), labels


def _positions(part: slice) -> torch.Tensor:
    if part.stop is None:
        raise ValueError("pass boxes with explicit bounds")
    return torch.arange(part.start or 0, part.stop, dtype=torch.float32)
