"""Tier 1: the Layout value type (no torch)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_models.errors import InputError
from cost_models.layout import Layout

counts = st.integers(min_value=1, max_value=4096)


def test_short_form_omits_unsplit_dimensions() -> None:
    assert str(Layout(n=4, h=2, w=2)) == "n4·h2·w2"
    assert str(Layout()) == "n1"
    assert str(Layout(c=8)) == "c8"
    assert repr(Layout(n=4, h=2, w=2)) == "Layout(n=4, c=1, d=1, h=2, w=2)"
    assert str(Layout(n=2, d=2, h=2)) == "n2·d2·h2"


def test_fields_are_keywords_only() -> None:
    with pytest.raises(TypeError):
        Layout(4, 1, 2, 2)  # type: ignore[misc]


@given(counts, counts, counts, counts, counts)
def test_short_form_parses_back(n: int, c: int, d: int, h: int, w: int) -> None:
    layout = Layout(n=n, c=c, d=d, h=h, w=w)
    assert Layout.parse(str(layout)) == layout
    assert Layout.from_dict(layout.to_dict()) == layout
    assert layout.ranks == n * c * d * h * w
    assert layout.spatial == d * h * w


def test_parse_accepts_ascii_separators_and_any_order() -> None:
    assert Layout.parse("n4.h2*w2") == Layout(n=4, h=2, w=2)
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
    layout = Layout(n=4, h=2, w=2)
    assert layout.divides((8, 3, 224, 224))
    assert not layout.divides((6, 3, 224, 224))
    assert layout.fits((6, 3, 224, 224))
    assert not Layout(n=8).fits((4, 3, 32, 32))
    assert layout.local_shape((6, 3, 225, 224)) == (2, 3, 113, 112)
    with pytest.raises(InputError, match="4-D"):
        layout.divides((8, 224))
    volume = Layout(n=2, d=2, h=2)
    assert volume.divides((4, 1, 64, 64, 64)) and not volume.divides((4, 1, 63, 64, 64))
    assert volume.local_shape((4, 1, 63, 64, 64)) == (2, 1, 32, 32, 64)


def test_axes_of_each_rank_and_the_volume_frame() -> None:
    from cost_models.layout import as_volume, axes_of, from_volume

    assert [axes_of(rank) for rank in (2, 3, 4, 5)] == ["nc", "ncw", "nchw", "ncdhw"]
    assert as_volume((8, 3, 32, 32)) == (8, 3, 1, 32, 32)
    assert as_volume((8, 3, 100)) == (8, 3, 1, 1, 100)
    assert from_volume(("n", "c", "d", "h", "w"), 4) == ("n", "c", "h", "w")
    assert Layout(n=2, d=4, w=3).parts_of(3) == (2, 1, 3)
    with pytest.raises(InputError, match="1 to 5"):
        axes_of(6)


def test_layouts_are_hashable_values() -> None:
    assert len({Layout(n=2, c=1, h=1, w=1), Layout(n=2), Layout(h=2)}) == 2
    with pytest.raises(AttributeError):
        Layout().n = 3  # type: ignore[misc]
    assert Layout.from_dict({"n": 2}) == Layout(n=2)
    assert Layout.from_dict({"d": 2}) == Layout(d=2)
    with pytest.raises(InputError, match="unknown dimensions"):
        Layout.from_dict({"t": 2})
