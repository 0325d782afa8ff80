"""Build hook: the hot modules are compiled to C extensions with mypyc.

The reducer is the cost of every log entry (apply, replay, fire), and mypyc runs it about
1.5x faster from the same typed source; storage's fold and the shard runtime's loop gain
less, as most of their time is already spent in C (LMDB, msgspec). The compiled modules
behave as the Python ones do, and check their annotations at run time as well.
`NEREUS_PURE_PYTHON=1` at install time skips compilation (a machine without a C compiler);
`runtime.compiled` reports which modules run compiled and refuses extensions older than
their source.
"""

from __future__ import annotations

import os
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Pure functions and plain classes only: a msgspec.Struct subclass cannot be compiled (mypyc
# drops the class keywords such as frozen=True), nor can a subclass of RuntimeError, so
# modules that define those (model, records, state, timing, claims, runtime.errors) stay
# Python.
COMPILED = [
    "kernel/commands.py",
    "kernel/keys.py",
    "kernel/mutations.py",
    "kernel/overlay.py",
    "kernel/reducer.py",
    "kernel/rules.py",
    "kernel/step.py",
    "kernel/validation.py",
    "storage/base.py",
    "storage/codec.py",
    "storage/store.py",
    "runtime/drr.py",
    "runtime/metrics.py",
    "runtime/prepare.py",
    "runtime/shard.py",
]


class BuildExt(build_ext):
    """Marks every extension an editable install copies beside its source as newer than that
    source, even one reused unchanged from an earlier build (the copy keeps the old mtime),
    so `runtime.compiled` sees a fresh install as fresh."""

    def copy_extensions_to_source(self) -> None:
        super().copy_extensions_to_source()
        for ext in self.extensions:
            path = self.get_ext_filename(self.get_ext_fullname(ext.name))
            if os.path.exists(path):
                os.utime(path)


def ext_modules() -> list[Any]:
    if os.environ.get("NEREUS_PURE_PYTHON"):
        return []
    from mypyc.build import mypycify  # noqa: PLC0415  (not needed for a pure build)

    return mypycify(COMPILED, opt_level="3", group_name="nereus_kernel")


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
