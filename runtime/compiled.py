"""Which modules run compiled, and a guard against stale compiled modules.

Theory of operation: `setup.py` compiles the hot modules of the kernel, storage and the
runtime with mypyc and, in an editable install, leaves each extension beside its source
(`kernel/step.py` and `kernel/step.cpython-311-x86_64-linux-gnu.so`). Python imports the
extension first, so a source edited after the install would silently not run. `stale()`
finds every extension older than its source; the test suite, the benchmarks and the CLI
refuse to start on one (`check()`), naming the file and the fix. `prefer_source()` makes all
of them import from source in this process, for differential runs of the two builds against
each other. They go together: a compiled module calls the others of its build directly, and
its objects are not the source build's.

This module imports none of them: `prefer_source()` has to run first.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kernel", "storage", "runtime")
NATIVE = "nereus._rust"


class StaleBuild(RuntimeError):
    pass


def _dirs() -> list[Path]:
    return [ROOT / package for package in PACKAGES]


def extensions(directories: list[Path] | None = None) -> dict[Path, Path]:
    """Source file -> compiled extension file, for the extensions in `directories`."""
    found: dict[Path, Path] = {}
    for directory in directories or _dirs():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            for path in directory.glob(f"*{suffix}"):
                source = directory / f"{path.name[: -len(suffix)]}.py"
                if source.exists():  # "*.so" also matches "step.cpython-311-...so"
                    found.setdefault(source, path)
    return found


def stale(directories: list[Path] | None = None) -> list[str]:
    """Sources changed after their extension was built, as readable lines. By default, only
    in a source checkout (setup.py beside the packages): an installed wheel writes its files
    in no particular order, and nobody edits them."""
    native: list[str] = []
    if directories is None:
        if not (ROOT / "setup.py").exists():
            return []
        directories = _dirs()
        native = _stale_native()
    lines = []
    for source, ext in sorted(extensions(directories).items()):
        if source.stat().st_mtime > ext.stat().st_mtime:
            lines.append(f"{source} is newer than its compiled module {ext.name}")
    return lines + native


def _native_extension() -> Path | None:
    """The built Rust module's file (`nereus._rust`), if there is one."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = ROOT / "nereus" / f"_rust{suffix}"
        if path.exists():
            return path
    return None


def _stale_native() -> list[str]:
    """The Rust module built before a change to its crate, in a checkout."""
    crate = ROOT / "native"
    built = _native_extension()
    if built is None or not crate.is_dir():
        return []
    sources = [crate / "Cargo.toml", *sorted((crate / "src").glob("*.rs"))]
    newest = max(sources, key=lambda path: path.stat().st_mtime)
    if newest.stat().st_mtime > built.stat().st_mtime:
        return [f"{newest} is newer than its compiled module {built.name}"]
    return []


def check(directories: list[Path] | None = None) -> None:
    """Raise StaleBuild when a compiled module would shadow a newer source (never while
    this process imports the source build: `prefer_source`)."""
    if _source_first():
        return
    lines = stale(directories)
    if lines:
        raise StaleBuild(
            "a compiled module is older than its source, so the source would not run:\n  "
            + "\n  ".join(lines)
            + "\nrebuild with `.venv/bin/pip install -e '.[dev]'` (scripts/test does), or"
            " delete those .so files to run the kernel as plain Python"
        )


def compiled_modules() -> list[str]:
    """The modules loaded in this process from compiled extensions."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if _package_of(name) in PACKAGES
        and (getattr(module, "__file__", None) or "").endswith(suffixes)
    )


def describe() -> str:
    """Which build of the kernel this process runs, in a few words (report headers). Imports
    the reducer if nothing has yet, so call it after `prefer_source()` had its chance."""
    import nereus.kernel.reducer  # noqa: F401, PLC0415  (lazily: prefer_source() runs first)
    from nereus.kernel import native  # noqa: PLC0415  (as above)

    count = len(compiled_modules())
    parts = [f"{count} modules compiled (mypyc)"] if count else []
    if native.BUILD is not None:
        parts.append(native.BUILD)
    return ", ".join(parts) or "Python source"


def _package_of(module_name: str) -> str:
    """`nereus.kernel.step` -> `kernel`; "" for a module outside the namespace."""
    parts = module_name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "nereus" else ""


class _SourceFirst(MetaPathFinder):
    def __init__(self, *, keep_rust: bool = False) -> None:
        self.keep_rust = keep_rust

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == NATIVE:
            if self.keep_rust:
                return None  # found where it was built, as in the compiled build
            # The source build runs the Python references of the Rust twins (kernel.native).
            raise ImportError(f"{NATIVE} is not imported by the source build", name=fullname)
        package = _package_of(fullname)
        name = fullname.rpartition(".")[2]
        if package not in PACKAGES or fullname.count(".") != 2:
            return None
        source = ROOT / package / f"{name}.py"
        if not source.exists():
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def _imported_compiled() -> list[str]:
    """Modules that have a compiled build and are imported already (from either build)."""
    names = {f"nereus.{source.parent.name}.{source.stem}" for source in extensions()}
    if _native_extension() is not None:
        # kernel.native chooses between the Rust module and its references when imported.
        names.add("nereus.kernel.native")
    return sorted(names & sys.modules.keys())


def prefer_source(*, keep_rust: bool = False) -> None:
    """Import the compiled packages' modules from their .py files in this process. Must run
    before any of them is first imported. With `keep_rust`, the Rust module is still used
    where it was built: the mutation tool runs a mutated crate (or Python that runs only
    beside it) this way without compiling the rest of the program."""
    early = _imported_compiled()
    if early:
        raise RuntimeError(f"prefer_source() must run before these are imported: {early}")
    if not _source_first():
        sys.meta_path.insert(0, _SourceFirst(keep_rust=keep_rust))


def _source_first() -> bool:
    return any(isinstance(finder, _SourceFirst) for finder in sys.meta_path)


def from_environment() -> None:
    """`NEREUS_PURE_PYTHON=1` in the environment: run the compiled packages from source
    (`NEREUS_PURE_PYTHON=rust`: from source, but with the Rust module where it was built).
    Idempotent: every entry point may call it (the tests, the benches, the simulator)."""
    wanted = os.environ.get("NEREUS_PURE_PYTHON")
    if wanted and not _source_first():
        prefer_source(keep_rust=wanted == "rust")
