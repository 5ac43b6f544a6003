"""Build script of the example's C-extension dependency (see bsexample_fnv.c)."""

from setuptools import Extension, setup

setup(
    name="bsexample-fnv",
    version="0.1.0",
    description="bootseer example: a dependency built from source (64-bit FNV-1a in C)",
    ext_modules=[Extension("bsexample_fnv", ["bsexample_fnv.c"])],
)
