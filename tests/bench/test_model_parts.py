"""bench/model_parts.py: the parts device calls carry, against a brute-force search."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support import load_bench_script


@pytest.fixture(scope="module")
def parts():
    return load_bench_script("model_parts")


def fewest_parts(total: int, part_bytes: int, extra_bytes: int, first_extra: int) -> int:
    """The fewest parts (at least two) of at most ``part_bytes`` each, the first at most
    ``part_bytes - first_extra`` and the last at most ``part_bytes - extra_bytes``, that hold
    ``total`` bytes: tried count by count."""
    count = 2
    while ((part_bytes - first_extra) + (count - 2) * part_bytes + (part_bytes - extra_bytes)
           < total):
        count += 1
    return count


@given(total=st.integers(2, 5000), part_bytes=st.integers(2, 700), extra=st.integers(0, 699),
       first_extra=st.integers(0, 699))
def test_parts_fit_their_calls_and_are_as_few_as_possible(parts, total, part_bytes, extra,
                                                          first_extra):
    if extra >= part_bytes or first_extra >= part_bytes:
        with pytest.raises(ValueError):
            parts.part_sizes(total, part_bytes, extra, first_extra)
        return
    sizes = parts.part_sizes(total, part_bytes, extra, first_extra)
    assert sum(sizes) == total
    assert len(sizes) >= 2 and all(size >= 1 for size in sizes[:-1])
    assert all(size <= part_bytes for size in sizes)
    assert sizes[0] <= part_bytes - first_extra
    assert sizes[-1] <= part_bytes - extra
    assert len(sizes) == fewest_parts(total, part_bytes, extra, first_extra)


def test_written_parts_join_to_the_file(parts, tmp_path):
    source = tmp_path / "model.gz"
    data = bytes(range(256)) * 41  # 10496 bytes; the last part as large as its call allows
    source.write_bytes(data)
    count = parts.write_parts(source, 3000, 1000, tmp_path / "gpu")
    files = sorted((tmp_path / "gpu").glob("part*/model.part-*"), key=lambda p: p.name)
    assert count == len(files) == 4
    assert [f.stat().st_size for f in files] == [3000, 3000, 2496, 2000]
    assert [f.parent.name for f in files] == [f"part{k}" for k in range(1, 5)]
    assert b"".join(f.read_bytes() for f in files) == data
    # wheels in the first call: its part shrinks, the others fill up
    count = parts.write_parts(source, 3000, 1000, tmp_path / "gpu-wheels", 2500)
    files = sorted((tmp_path / "gpu-wheels").glob("part*/model.part-*"), key=lambda p: p.name)
    assert [f.stat().st_size for f in files] == [500, 3000, 3000, 1996, 2000]
    assert b"".join(f.read_bytes() for f in files) == data


def test_bad_arguments_are_one_line_and_exit_2(parts, capsys):
    assert parts.main(["missing.gz", "100", "10", "out"]) == 2
    assert parts.main(["x"]) == 2
    assert parts.main(["missing.gz", "100", "10", "out", "100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and err[0].startswith("error:") and err[2].startswith("error:")
