"""`python -m bench.mutation`: the mutation score of the safety tests.

Theory of operation: a test suite that guards the never-rules should fail when one of them
is broken. This tool breaks them on purpose, one at a time, from a fixed catalogue
(`bench/mutants.py`): it copies the source tree to a scratch directory (Python source only:
no compiled modules, so nothing can shadow a mutated `.py`), applies a mutant's edits there,
runs the tests listed for it against the scratch copy (pure Python, a fixed hypothesis seed)
and records which tests failed. A mutant no test catches *survived*. The unmutated copy is
run first (the baseline): tests that fail without any mutant would make every verdict
meaningless, so the run stops there.

    python -m bench.mutation                  # every mutant, until two files catch it
    python -m bench.mutation --quick          # the CI subset, each stopped at its first failure
    python -m bench.mutation --only T2,S1     # chosen mutants
    python -m bench.mutation --list           # the catalogue

The full run takes each listed test file on its own, cheap files first, stopped at its
first failure, until two files have caught the mutant (`--enough`, 0 for every file): it
names the files that catch each mutant and the first test there that did (the target: every
mutant caught, by tests in at least two files, so that no rule rests on one test);
`--all-tests` runs every test of every file instead. It writes `bench/results/mutation.json`
(after every mutant, so a stopped run keeps what it found) and a Markdown table for
RELIABILITY.md. Exit codes: 0 every
mutant caught (in a full run, each by two files or more); 1 a mutant survived (or, full run,
was caught by one file only); 2 the catalogue does not match the source (a snippet not found
exactly once) or the baseline fails.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.mutants import CATALOGUE, Mutant

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "mutation.json"
IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    "__pycache__",
    "*.so",
    "*.pyc",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "build",
    "*.egg-info",
    "results",
    "data",
)
MUTANT_TIMEOUT_S = 1_800
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)")


class CatalogueError(Exception):
    pass


@dataclass
class Verdict:
    mutant: Mutant
    caught_by: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def caught(self) -> bool:
        return bool(self.caught_by)

    @property
    def files(self) -> list[str]:
        return sorted({test.split("::")[0].split(" ")[0] for test in self.caught_by})


def check_catalogue(root: Path, mutants: tuple[Mutant, ...] = CATALOGUE) -> list[str]:
    """Why each mutant could not be applied to the tree at `root` (empty: all can)."""
    problems: list[str] = []
    ids = [m.id for m in mutants]
    problems += [f"mutant id {i} used twice" for i in sorted(set(ids)) if ids.count(i) > 1]
    for mutant in mutants:
        texts: dict[str, str] = {}
        for edit in mutant.edits:
            path = root / edit.file
            if not path.is_file():
                problems.append(f"{mutant.id}: {edit.file} does not exist")
                continue
            text = texts.setdefault(edit.file, path.read_text())
            count = text.count(edit.snippet)
            if count != 1:
                problems.append(
                    f"{mutant.id}: its snippet occurs {count} times in {edit.file}, not once "
                    f"(retarget it): {edit.snippet.strip()[:70]!r}"
                )
            elif edit.snippet == edit.replacement:
                problems.append(f"{mutant.id}: an edit changes nothing")
            else:
                texts[edit.file] = text.replace(edit.snippet, edit.replacement)
        for test in (*mutant.tests, *mutant.quick_tests):
            if not (root / test.split("::")[0]).is_file():
                problems.append(f"{mutant.id}: test file {test} does not exist")
    return problems


def scratch_copy(into: Path) -> Path:
    """The source tree, without compiled modules, caches or the virtualenv; checked to be
    what a test run there imports (never the checkout's installed or compiled modules)."""
    tree = into / "tree"
    shutil.copytree(ROOT, tree, symlinks=True, ignore=IGNORED)
    probe = (
        "import nereus.kernel.timing as t, nereus.storage.store as s\n"
        "from nereus.runtime import compiled\n"
        "print(t.__file__); print(s.__file__); print(','.join(compiled.compiled_modules()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tree,
        env=_env(tree),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    timing, store, built = [*done.stdout.splitlines(), "", "", ""][:3]
    for imported in (timing, store):
        if not Path(imported).resolve().is_relative_to(tree.resolve()):
            raise CatalogueError(f"the scratch copy imports {imported}, not its own source")
    if built:
        raise CatalogueError(f"compiled modules would shadow the mutated source: {built}")
    return tree


def _env(tree: Path, *, rust: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    # The source, never an extension; with `rust`, the Rust module built from the tree.
    env["NEREUS_PURE_PYTHON"] = "rust" if rust else "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # The broker addresses stay: a mutant of the Kafka edge (the send lease, the evidence
    # search) is caught by tests on the real broker, and without them those tests fail
    # (kafka_env), which stops the run at its baseline rather than judging nothing.
    return env


def build_rust(tree: Path) -> None:
    """Build the tree's crate (as it is now: mutated or not) into `nereus/` of the tree. The
    cargo target directory is kept between runs, so each build compiles the crate alone."""
    target = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nereus"
    target = target / "mutation-target"
    subprocess.run(
        ["cargo", "build", "--release", "--quiet"],
        cwd=tree / "native",
        env={**os.environ, "CARGO_TARGET_DIR": str(target)},
        check=True,
        timeout=MUTANT_TIMEOUT_S,
    )
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    shutil.copyfile(target / "release" / "lib_rust.so", tree / "nereus" / f"_rust{suffix}")


def run_tests(
    tree: Path, tests: tuple[str, ...], *, first_failure: bool, rust: bool = False
) -> tuple[int, str]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rfE",
        "-p",
        "no:cacheprovider",
        "--hypothesis-seed=0",
        *(["-x"] if first_failure else []),
        *tests,
    ]
    try:
        done = subprocess.run(
            command,
            cwd=tree,
            env=_env(tree, rust=rust),
            capture_output=True,
            text=True,
            timeout=MUTANT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return -1, f"no verdict within {MUTANT_TIMEOUT_S} s"
    return done.returncode, done.stdout + done.stderr


def failures(output: str) -> list[str]:
    return sorted({m.group(1) for line in output.splitlines() if (m := FAILED.match(line))})


def _apply(tree: Path, mutant: Mutant) -> dict[Path, str]:
    """Apply the edits in order; returns each touched file's original text."""
    originals: dict[Path, str] = {}
    for edit in mutant.edits:
        path = tree / edit.file
        text = path.read_text()
        originals.setdefault(path, text)
        if text.count(edit.snippet) != 1:
            raise CatalogueError(f"{mutant.id}: snippet not found once in {edit.file}")
        path.write_text(text.replace(edit.snippet, edit.replacement))
    return originals


def _caught(tests: tuple[str, ...], code: int, output: str) -> list[str]:
    found = failures(output)
    if code == -1:
        return found or [f"{' '.join(tests)} (hung: no verdict in time)"]
    if code not in (0, 1) and not found:
        # A collection error or an interrupted run: the mutant broke the import itself.
        return [f"{' '.join(tests)} (pytest exit {code})"]
    return found


def judge(
    tree: Path, mutant: Mutant, *, quick: bool, all_tests: bool = False, enough: int = 0
) -> Verdict:
    """Quick: the quick tests together, up to the first failure. Otherwise each listed file
    on its own (up to its first failure, or in full with `all_tests`), in the listed order
    (cheap files first), until `enough` files have caught it (0: all files)."""
    started = time.monotonic()
    originals = _apply(tree, mutant)
    caught: list[str] = []
    rust = mutant.rust
    try:
        if rust:
            build_rust(tree)
        if quick:
            code, output = run_tests(tree, mutant.quick_tests, first_failure=True, rust=rust)
            caught = _caught(mutant.quick_tests, code, output)
        else:
            files = 0
            for test in mutant.tests:
                if enough and files >= enough:
                    break
                code, output = run_tests(tree, (test,), first_failure=not all_tests, rust=rust)
                found = _caught((test,), code, output)
                caught += found
                files += bool(found)
    finally:
        for path, text in originals.items():
            path.write_text(text)
    return Verdict(mutant, caught, time.monotonic() - started)


def _progress(i: int, n: int, verdict: Verdict, started: float) -> None:
    elapsed = time.monotonic() - started
    eta = elapsed / i * (n - i)
    m = verdict.mutant
    if verdict.caught:
        shown = ", ".join(verdict.caught_by[:3]) + (" ..." if len(verdict.caught_by) > 3 else "")
        outcome = f"caught in {len(verdict.files)} files: {shown}"
    else:
        outcome = "SURVIVED"
    print(
        f"[{i:2}/{n}] {m.id} {m.what}: {outcome} ({verdict.seconds:.0f} s; "
        f"elapsed {elapsed / 60:.1f} min, about {eta / 60:.1f} min left)",
        file=sys.stderr,
        flush=True,
    )


def table(verdicts: list[Verdict]) -> str:
    lines = [
        "| mutant | the bug | promise broken | caught by | files | s |",
        "|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        m = v.mutant
        tests = sorted({t.split("[")[0] for t in v.caught_by})
        shown = "; ".join(f"`{t}`" for t in tests[:4]) + (
            f" +{len(tests) - 4}" if len(tests) > 4 else ""
        )
        lines.append(
            f"| {m.id} | {m.what} | {m.promise} | {shown or '**survived**'} | "
            f"{len(v.files)} | {v.seconds:.0f} |"
        )
    return "\n".join(lines)


def _write(out: Path, verdicts: list[Verdict]) -> None:
    """The results so far (rewritten after every mutant, so a stopped run keeps them)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "caught": sum(v.caught for v in verdicts),
        "mutants": len(verdicts),
        "of": len(CATALOGUE),
        "verdicts": [
            {
                "id": v.mutant.id,
                "what": v.mutant.what,
                "promise": v.mutant.promise,
                "caught_by": v.caught_by,
                "files": v.files,
                "seconds": round(v.seconds, 1),
            }
            for v in verdicts
        ],
    }
    out.write_text(json.dumps(record, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mutation", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the CI subset")
    parser.add_argument("--only", default="", help="comma-separated mutant ids")
    parser.add_argument("--list", action="store_true", help="print the catalogue and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument(
        "--all-tests", action="store_true", help="every test of every file, not the first failure"
    )
    parser.add_argument(
        "--enough",
        type=int,
        default=2,
        help="stop a mutant once this many files caught it (0: run every file; default 2)",
    )
    parser.add_argument("--out", type=Path, default=None, help=f"results file ({RESULTS})")
    args = parser.parse_args(argv)
    problems = check_catalogue(ROOT)
    if problems:
        print("mutation: the catalogue does not match the source:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    chosen = [m for m in CATALOGUE if not args.quick or m.quick_tests]
    if args.only:
        wanted = set(args.only.split(","))
        chosen = [m for m in chosen if m.id in wanted]
    if args.list:
        for m in chosen:
            files = ", ".join(sorted({e.file for e in m.edits}))
            print(f"{m.id:3} {m.what} [{m.promise}] in {files}; tests: {' '.join(m.tests)}")
        return 0
    out = args.out or (None if args.quick or args.only else RESULTS)
    with tempfile.TemporaryDirectory(prefix="nereus-mutation-") as scratch:
        try:
            tree = scratch_copy(Path(scratch))
        except CatalogueError as exc:
            print(f"mutation: {exc}", file=sys.stderr)
            return 2
        if not args.no_baseline:
            union = tuple(
                dict.fromkeys(t for m in chosen for t in (m.quick_tests if args.quick else m.tests))
            )
            print(f"baseline: {len(union)} test files, unmutated", file=sys.stderr, flush=True)
            code, output = run_tests(tree, union, first_failure=True)
            if code == 0 and any(m.rust for m in chosen):
                # The tests of the compiled folds skip without the Rust module: run them
                # unmutated beside it too.
                build_rust(tree)
                beside = tuple(dict.fromkeys(t for m in chosen if m.rust for t in m.tests))
                code, output = run_tests(tree, beside, first_failure=True, rust=True)
            if code != 0:
                print(
                    f"mutation: the tests fail without any mutant:\n{output[-3000:]}",
                    file=sys.stderr,
                )
                return 2
        started = time.monotonic()
        verdicts: list[Verdict] = []
        for i, mutant in enumerate(chosen, start=1):
            verdicts.append(
                judge(tree, mutant, quick=args.quick, all_tests=args.all_tests, enough=args.enough)
            )
            _progress(i, len(chosen), verdicts[-1], started)
            if out is not None:
                _write(out, verdicts)
    print(table(verdicts))
    survived = [v.mutant.id for v in verdicts if not v.caught]
    single = [v.mutant.id for v in verdicts if v.caught and len(v.files) < 2]
    caught = len(verdicts) - len(survived)
    print(f"\nmutation score: {caught}/{len(verdicts)} caught", end="")
    print(f"; survived: {', '.join(survived)}" if survived else "", end="")
    if not args.quick:
        print(f"; caught by one test file only: {', '.join(single)}" if single else "", end="")
    print()
    if survived or (single and not args.quick):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
