"""Nereus benchmarks. `NEREUS_PURE_PYTHON=1` runs any of them on the kernel's Python source
instead of its compiled modules (setup.py), for side-by-side figures of the two builds."""

from nereus.runtime import compiled

compiled.from_environment()
