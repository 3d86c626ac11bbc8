"""The names and rules every stage shares: errors (one hierarchy, one line each), units, dtypes,
sptrace's trace markers, ModelShape (what a run declares; S/P and its rule), wire bytes. Imports
nothing from the other stages."""
