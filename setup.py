"""The optional native decoder (sptrace/load/_kineto.c); everything else is in pyproject.toml.

``optional=True``: where no C compiler is at hand the install goes on without it, and sptrace
decodes traces with msgspec alone (the same tables, about 3x slower to build: benchmarks/bench_load.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("sptrace.load._kineto", ["sptrace/load/_kineto.c"], optional=True),
    ]
)
