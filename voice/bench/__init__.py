"""Voice benchmarks (``specvoice bench ...``): each prints a table and writes JSON.

The argument types below turn a nonsense number on the command line ("--passes -1") into argparse's usage
error naming the flag, instead of a benchmark that runs for minutes and reports nothing."""

from __future__ import annotations

import argparse


def _number(kind: type, minimum: float, text: str) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text} is below {minimum}; fix: give {minimum} or more")
    return value


def count(text: str) -> int:
    """An integer >= 0 (0 skips that part)."""
    return int(_number(int, 0, text))


def positive(text: str) -> int:
    """An integer >= 1."""
    return int(_number(int, 1, text))


def seconds(text: str) -> float:
    """A duration or rate >= 0."""
    return float(_number(float, 0.0, text))
