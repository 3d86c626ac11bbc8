"""GIVEN byte counts, times and rank sets WHEN a report writes them THEN people read them exactly."""

from __future__ import annotations

from sptrace.vocab.units import human_bytes, human_ms, rank_ranges, rank_text, significant


def test_bytes_use_binary_units():
    assert [human_bytes(n) for n in (512, 1536, 3 * 2**20, 2**31)] == ["512 B", "1.50 KiB", "3.00 MiB", "2.00 GiB"]


def test_times_below_a_millisecond_keep_two_significant_digits():
    assert [human_ms(x) for x in (12.345, 1.0, 0.0456, 0.004, 0.0)] == [
        "12.3 ms", "1.0 ms", "0.046 ms", "0.004 ms", "0.0 ms"]  # fmt: skip


def test_numbers_never_use_an_exponent():
    assert [significant(x) for x in (1234.7, 12.345, 4.0, 0.012345)] == ["1235", "12.3", "4", "0.0123"]


def test_rank_sets_collapse_into_ranges():
    assert rank_ranges([8, 7, 0, 1, 2, 5]) == "0-2, 5, 7-8"


def test_a_rank_set_has_one_name_everywhere():
    assert [rank_text(r) for r in ([3], [0, 1, 2, 3, 5], [])] == ["rank 3", "ranks 0-3, 5", "no rank"]
    assert rank_text([], none="no other rank") == "no other rank"
