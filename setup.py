"""Build hook: the hot modules are compiled to C extensions with mypyc.

The reducer is the cost of every log entry (apply, replay, fire), and mypyc runs it about
1.5x faster from the same typed source; storage's fold and the shard runtime's loop gain
less, as most of their time is already spent in C (LMDB, msgspec). The compiled modules
behave as the Python ones do, and check their annotations at run time as well.
`NEREUS_PURE_PYTHON=1` at install time skips compilation, as does a machine without a C
compiler or Python's headers (with a one-line notice); `runtime.compiled` reports which
modules run compiled and refuses extensions older than their source.

The Rust crate in `native/` (PyO3) is built beside them as `nereus._rust` by setuptools-rust,
the PyO3 project's setuptools plugin: it keeps this one setuptools build (maturin would be a
second build backend, without mypyc). Without cargo, or when the crate fails to build, the
install goes on without it and says so in one line; `kernel.native` then runs the Python
references of its functions.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import sysconfig
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Pure functions and plain classes only: a msgspec.Struct subclass cannot be compiled (mypyc
# drops the class keywords such as frozen=True), nor can a subclass of RuntimeError, so
# modules that define those (model, records, state, timing, runtime.claim, runtime.errors)
# stay Python, as does storage.request (a frozen dataclass, read once per fold). Storage's
# hot path is the fold and what it runs per entry or per row: the log table, the indexes,
# the codec, the claims port and the read views. The runtime's is the tick and what it runs
# per entry or per row: discovery, the claims, the deferred records, the effects runner and
# the tally.
COMPILED = [
    "nereus/kernel/commands.py",
    "nereus/kernel/failure.py",
    "nereus/kernel/keys.py",
    "nereus/kernel/mutations.py",
    "nereus/kernel/overlay.py",
    "nereus/kernel/reducer.py",
    "nereus/kernel/rules.py",
    "nereus/kernel/step.py",
    "nereus/kernel/validation.py",
    "nereus/storage/base.py",
    "nereus/storage/claims.py",
    "nereus/storage/codec.py",
    "nereus/storage/fold.py",
    "nereus/storage/indexes.py",
    "nereus/storage/log_table.py",
    "nereus/storage/published.py",
    "nereus/storage/admitted.py",
    "nereus/storage/scheduled.py",
    "nereus/storage/compiled_rows.py",
    "nereus/storage/story.py",
    "nereus/storage/reads.py",
    "nereus/storage/store.py",
    "nereus/runtime/claims.py",
    "nereus/runtime/deferred.py",
    "nereus/runtime/discovery.py",
    "nereus/runtime/drr.py",
    "nereus/runtime/effects.py",
    "nereus/runtime/metrics.py",
    "nereus/runtime/prepare.py",
    "nereus/runtime/shard.py",
    "nereus/runtime/tally.py",
]


class BuildExt(build_ext):
    """Compiles the hot modules when a wheel or an editable install is built, and only then:
    mypyc's code generation type-checks the whole program (a minute), so running it each time
    setup.py is executed (pip does so three times) would triple the install. A machine that
    cannot compile gets the pure-Python build and a one-line notice instead of a failed
    install; mypyc's own remarks stay out of the installer's output."""

    def finalize_options(self) -> None:
        # Before the base class reads the extensions: it annotates each one it is given.
        if self.distribution.ext_modules:
            why = _cannot_compile()
            if why is None:
                try:
                    self.distribution.ext_modules = _mypyc_extensions()
                except Exception as exc:  # mypyc refused the source: no C build
                    why = f"mypyc failed ({type(exc).__name__}: {exc})"
            if why is not None:
                self.distribution.ext_modules = []
                _pure_python(why)
        super().finalize_options()

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # any failure of the C build means: no C build
            for ext in self.extensions:
                built = self.get_ext_fullpath(ext.name)
                if os.path.exists(built):
                    os.remove(built)
            self.extensions = []
            _pure_python(f"the C build failed ({type(exc).__name__}: {exc})")

    def copy_extensions_to_source(self) -> None:
        # Each extension an editable install copies beside its source is marked newer than
        # that source, even one reused unchanged from an earlier build (the copy keeps the old
        # mtime), so `runtime.compiled` sees a fresh install as fresh.
        super().copy_extensions_to_source()
        for ext in self.extensions:
            path = self.get_ext_filename(self.get_ext_fullname(ext.name))
            if os.path.exists(path):
                os.utime(path)


def _pure_python(why: str) -> None:
    print(f"nereus: {why}; installing the pure-Python build", file=sys.stderr)


def _cannot_compile() -> str | None:
    """Why this machine cannot build C extensions, or None when it can."""
    header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not os.path.exists(header):
        return f"no Python headers ({header})"
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    return None


def _mypyc_extensions() -> list[Any]:
    from mypyc.build import mypycify  # noqa: PLC0415  (not needed for a pure build)

    # mypyc prints remarks such as "treating generator comprehension as list": they are
    # about its own code generation, nothing the person installing can act on. Its errors
    # (it exits on one) are passed on.
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            extensions: list[Any] = mypycify(COMPILED, opt_level="3", group_name="nereus._native")
    except (Exception, SystemExit) as exc:
        raise RuntimeError(" | ".join(said.getvalue().splitlines()[-5:]) or repr(exc)) from exc
    return extensions


def ext_modules() -> list[Extension]:
    """A placeholder that marks the wheel as platform-specific; BuildExt replaces it with
    the real extensions when it runs."""
    if os.environ.get("NEREUS_PURE_PYTHON"):
        return []
    return [Extension("nereus._native__mypyc", sources=[])]


def _no_native(why: str) -> None:
    print(f"nereus: {why}; installing without the Rust module", file=sys.stderr)


def rust_extensions() -> list[Any]:
    if os.environ.get("NEREUS_PURE_PYTHON"):
        return []
    if shutil.which("cargo") is None:
        _no_native("no Rust toolchain (cargo)")
        return []
    try:
        from setuptools_rust import Binding, RustExtension  # noqa: PLC0415
    except ImportError:
        _no_native("setuptools-rust is not installed")
        return []
    return [
        RustExtension(
            "nereus._rust",
            path="native/Cargo.toml",
            binding=Binding.PyO3,
            # A failed crate build leaves the Python references, as a failed C build does.
            optional=True,
            py_limited_api=False,
            # An editable install would otherwise build it unoptimised.
            debug=False,
        )
    ]


setup(
    ext_modules=ext_modules(),
    rust_extensions=rust_extensions(),
    cmdclass={"build_ext": BuildExt},
)
