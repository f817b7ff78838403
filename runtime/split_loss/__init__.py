"""A loss taken of a split output without gathering it: sums over the ranks with their adjoint
(``global_sum``), what each tensor of the loss is (``values``), one rule per operation (``rules``) and the mode
that runs a user's loss function by them (``mode``). ``runtime.training_io.DataHelpers.loss`` uses it and
falls back to the gathered output where a loss cannot be kept split."""

from runtime.split_loss.mode import split_loss_share
from runtime.split_loss.values import LossGrid, Parts, Unsplittable

__all__ = ["LossGrid", "Parts", "Unsplittable", "split_loss_share"]
