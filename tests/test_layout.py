"""Tier 1: the Layout value type (no torch)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_models.errors import InputError
from cost_models.layout import Layout

counts = st.integers(min_value=1, max_value=4096)


def test_short_form_omits_unsplit_dimensions() -> None:
    assert str(Layout(4, 1, 2, 2)) == "n4·h2·w2"
    assert str(Layout()) == "n1"
    assert str(Layout(c=8)) == "c8"
    assert repr(Layout(4, 1, 2, 2)) == "Layout(n=4, c=1, h=2, w=2)"


@given(counts, counts, counts, counts)
def test_short_form_parses_back(n: int, c: int, h: int, w: int) -> None:
    layout = Layout(n, c, h, w)
    assert Layout.parse(str(layout)) == layout
    assert Layout.from_dict(layout.to_dict()) == layout
    assert layout.ranks == n * c * h * w


def test_parse_accepts_ascii_separators_and_any_order() -> None:
    assert Layout.parse("n4.h2*w2") == Layout(4, 1, 2, 2)
    assert Layout.parse("w2·n4") == Layout(n=4, w=2)


@pytest.mark.parametrize("text", ["", "n0", "x4", "n4·n2", "n-1", "4n", "n4,h2", "n4··h2"])
def test_parse_refuses_malformed_text(text: str) -> None:
    with pytest.raises(InputError, match="layout"):
        Layout.parse(text)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_constructor_refuses_non_positive_or_non_integer(bad: object) -> None:
    with pytest.raises(InputError, match="Layout.h must be a positive integer"):
        Layout(h=bad)  # type: ignore[arg-type]


def test_divides_fits_and_local_shape() -> None:
    layout = Layout(4, 1, 2, 2)
    assert layout.divides((8, 3, 224, 224))
    assert not layout.divides((6, 3, 224, 224))
    assert layout.fits((6, 3, 224, 224))
    assert not Layout(n=8).fits((4, 3, 32, 32))
    assert layout.local_shape((6, 3, 225, 224)) == (2, 3, 113, 112)
    with pytest.raises(InputError, match="4-D"):
        layout.divides((8, 3, 224))


def test_layouts_are_hashable_values() -> None:
    assert len({Layout(2, 1, 1, 1), Layout(n=2), Layout(h=2)}) == 2
    with pytest.raises(AttributeError):
        Layout().n = 3  # type: ignore[misc]
    assert Layout.from_dict({"n": 2}) == Layout(n=2)
    with pytest.raises(InputError, match="unknown dimensions"):
        Layout.from_dict({"d": 2})
