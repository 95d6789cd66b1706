"""Errors raised by :mod:`exactformer.precision`.

Every error is a :class:`PrecisionError` (a ``ValueError``); errors about the *kind* of a value
(a float array where raw integers are expected, raw values tagged with another format) are also
``TypeError``\\ s. Messages name the parameter and the allowed range.
"""

from __future__ import annotations


class PrecisionError(ValueError):
    """Bad format parameters or bad values (out of range, NaN/inf, division by zero, ...)."""


class RawTypeError(PrecisionError, TypeError):
    """A raw-value argument has the wrong type or dtype for the format."""


class FormatMismatchError(PrecisionError, TypeError):
    """Raw values tagged with one format were passed to another format's operation."""
