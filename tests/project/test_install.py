"""The package as a user installs it: a wheel with one top-level name, importable beside an
application's own `kernel`, `storage` and `adapters` packages, working without the Kafka and
crypto extras, and a pure-Python build where no C compiler is found.

The wheel is built from a copy of the source tree without build isolation (the build tools
come from the test environment), and installed into a fresh virtual environment whose other
dependencies come from the package index (pip's cache makes reruns quick).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import nereus

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("kernel", "storage", "runtime", "service", "replay", "adapters", "sim")
PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v")
DIST_INFO = f"nereus-{nereus.__version__}.dist-info"

pytestmark = pytest.mark.slow

# An application that happens to use the same folder names as the repository's layers.
APPLICATION = {
    "kernel/__init__.py": "raise ImportError('the application kernel, not nereus')\n",
    "storage/__init__.py": "NAME = 'the application storage'\n",
    "adapters/__init__.py": "NAME = 'the application adapters'\n",
}

EMBEDDED = textwrap.dedent(
    """
    import sys
    from datetime import timedelta

    import storage, adapters
    from nereus import Nereus, __version__
    from nereus.runtime import compiled

    assert storage.NAME == "the application storage"
    with Nereus.open(sys.argv[1], assume_clock_error_ms=5) as n:
        r = n.schedule("reminders", "k1", b"hello", delay_ms=60_000)
        assert r.ok, r
        assert n.peek("reminders", "k1").found
    names = [m for m in sys.modules if m.split(".")[0] in ("kernel", "runtime", "replay")]
    assert names == [], names
    assert "confluent_kafka" not in sys.modules and "cryptography" not in sys.modules
    print(__version__, len(compiled.compiled_modules()))
    """
)


def _copy_source(into: Path) -> Path:
    tree = into / "src"
    tree.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.so")
    shutil.copytree(ROOT / "nereus", tree / "nereus", symlinks=True, ignore=ignore)
    for layer in LAYERS:
        shutil.copytree(ROOT / layer, tree / layer, ignore=ignore)
    shutil.copytree(ROOT / "native", tree / "native", ignore=shutil.ignore_patterns("target"))
    return tree


def _build_wheel(tree: Path, out: Path, env: dict[str, str] | None = None) -> tuple[Path, str]:
    done = subprocess.run(
        [*PIP_WHEEL, str(tree), "-w", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("nereus-*.whl")
    return wheel, done.stdout + done.stderr


def _members(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def _install(wheel: Path, into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(into)], check=True, timeout=120)
    python = into / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        check=True,
        timeout=900,
    )
    return python


def _application(into: Path) -> Path:
    for name, text in APPLICATION.items():
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_text(text)
    return into


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, python of a fresh venv holding it, no extras), compiled build."""
    base = tmp_path_factory.mktemp("install")
    wheel, log = _build_wheel(_copy_source(base), base / "dist")
    # mypyc's remarks about its own code generation are not the installer's business.
    assert "Treating generator comprehension" not in log
    return wheel, _install(wheel, base / "venv")


def test_the_wheel_installs_one_top_level_name(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    members = _members(wheel)
    assert {name.split("/")[0] for name in members} == {"nereus", DIST_INFO}
    assert "nereus/py.typed" in members
    assert any(name.startswith("nereus/_native__mypyc") for name in members)
    assert any(name.startswith("nereus/kernel/reducer.cpython") for name in members)
    assert any(name.startswith("nereus/_rust.cpython") for name in members)  # the Rust twins


def test_nereus_imports_beside_an_application_with_the_same_folder_names(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, python = installed
    app = _application(tmp_path / "app")
    done = subprocess.run(
        [str(python), "-c", EMBEDDED, str(tmp_path / "data")],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    version, compiled_count = done.stdout.split()
    assert version == nereus.__version__
    assert int(compiled_count) > 0  # the wheel's compiled kernel, not a silent fallback


def test_the_command_reports_its_version_and_build(installed: tuple[Path, Path]) -> None:
    _, python = installed
    for argv in (
        [str(python.parent / "nereus"), "--version"],
        [str(python), "-m", "nereus", "--version"],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        assert done.stdout.startswith(f"nereus {nereus.__version__} (kernel: ")
        assert "compiled" in done.stdout
        assert "rust (nereus-native" in done.stdout


def test_kafka_mode_without_the_extra_says_what_to_install(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, python = installed
    done = subprocess.run(
        [str(python.parent / "nereus"), "serve", "--kafka", "127.0.0.1:1", "--data", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "pip install 'nereus[kafka]'" in done.stderr
    lazy = subprocess.run(
        [str(python), "-c", "from nereus import KafkaNereus"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert lazy.returncode != 0
    assert "pip install 'nereus[kafka]'" in lazy.stderr


def test_without_a_c_compiler_or_cargo_the_build_is_pure_python_with_a_notice(
    tmp_path: Path,
) -> None:
    without_cargo = os.pathsep.join(
        folder
        for folder in os.environ.get("PATH", "").split(os.pathsep)
        if not (Path(folder) / "cargo").exists()
    )
    wheel, log = _build_wheel(
        _copy_source(tmp_path),
        tmp_path / "dist",
        env={"CC": str(tmp_path / "no-such-cc"), "PATH": without_cargo},
    )
    assert "installing the pure-Python build" in log
    assert "no C compiler" in log
    assert "no Rust toolchain (cargo); installing without the Rust module" in log
    assert not [name for name in _members(wheel) if name.endswith(".so")]
