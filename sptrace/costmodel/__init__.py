"""Analytic cost model of a sequence-parallel step: which collectives each scheme issues, their
tensor shapes and the bytes each rank sends, and the activation memory per layer.

Pure functions of a StepConfig (SPEC.md §1-3; the first article's formulas). Conventions:
  N = B * S * H * b, one full-sequence hidden activation; r = (P - 1) / P.
  wire bytes = bytes one rank SENDS under ring algorithms (the articles' convention):
  all-gather out * r, reduce-scatter in * r, all-to-all in * r, all-reduce 2 * in * r.
"""

from sptrace.costmodel.activations import (
    KORTHIKANTI_SETTINGS,
    activation_bytes_per_layer,
    korthikanti_bytes_per_layer,
)
from sptrace.costmodel.comm import (
    PHASES,
    CollectiveSpec,
    CommEstimate,
    estimate_comm,
)
from sptrace.costmodel.presets import PRESETS
from sptrace.vocab.collective_kinds import wire_bytes  # the formula the model and detection share

__all__ = [
    "KORTHIKANTI_SETTINGS",
    "PHASES",
    "PRESETS",
    "CollectiveSpec",
    "CommEstimate",
    "activation_bytes_per_layer",
    "estimate_comm",
    "korthikanti_bytes_per_layer",
    "wire_bytes",
]
