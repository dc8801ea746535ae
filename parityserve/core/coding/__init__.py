"""Coded computation for straggler and fault tolerance.

* ``parity``: ParM's parity codes (sum, image concatenation, general linear parities) and
  their decoders; exact for bias-free linear models, otherwise paired with a learned
  parity model.
* ``berrut``: ApproxIFER's model-agnostic approximate codes built on Berrut rational
  interpolation, plain (tolerating stragglers and Byzantine workers) and systematic.
* ``locator``: the Berlekamp-Welch-style error locator that ApproxIFER decodes with.

Everything here is pure numpy: no I/O, no clocks, no random state.
"""

from __future__ import annotations

from parityserve.core.coding.berrut import (
    BerrutCode,
    BerrutDecoding,
    SystematicBerrut,
    berrut_interpolate,
    berrut_weights,
    chebyshev_first_kind,
    chebyshev_second_kind,
    minimum_workers,
)
from parityserve.core.coding.locator import locate_rational_errors
from parityserve.core.coding.parity import (
    AdditionEncoder,
    ConcatEncoder,
    LinearCode,
    SubtractionDecoder,
)

__all__ = [
    "AdditionEncoder",
    "BerrutCode",
    "BerrutDecoding",
    "ConcatEncoder",
    "LinearCode",
    "SubtractionDecoder",
    "SystematicBerrut",
    "berrut_interpolate",
    "berrut_weights",
    "chebyshev_first_kind",
    "chebyshev_second_kind",
    "minimum_workers",
    "locate_rational_errors",
]
