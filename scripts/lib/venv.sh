# Shared by scripts/*: create .venv with the interpreter in $PYTHON (default python3) and
# install the project with its dev extras. pip's cache outside the clone keeps reruns fast.
# Installing compiles the hot modules (setup.py, ~40 s), so it is skipped when nothing that
# goes into the install has changed since the last one: the stamp is a hash of the project
# metadata, the build hook, the compiled packages' sources and the build choice.
ensure_venv() {
    local py="${PYTHON:-python3}"
    if ! command -v "$py" >/dev/null 2>&1; then
        echo "error: $py not found; Nereus needs Python >= 3.11" >&2
        exit 1
    fi
    if [ ! -x .venv/bin/python ]; then
        "$py" -m venv .venv
    fi
    local stamp=.venv/.nereus-install want
    want="$( (echo "pure=${NEREUS_PURE_PYTHON:-}"; cat pyproject.toml setup.py nereus/*.py kernel/*.py storage/*.py runtime/*.py native/Cargo.toml native/Cargo.lock native/src/*.rs) | sha256sum | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
        && .venv/bin/python -c 'from nereus.runtime import compiled; compiled.check()' 2>/dev/null; then
        return
    fi
    rm -f "$stamp"
    # No stamp after a failed install (a caller without `set -e` would otherwise skip the
    # next attempt and run against a half-built environment).
    # The Rust crate's build outside the clone: a fresh clone compiles only what changed.
    CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nereus/cargo-target}" \
        .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' || return 1
    # pip -q hides setup.py's notice when the compiled build falls back to Python source, so
    # say which build was installed; CI, which tests the compiled build, stops here on one.
    local build
    build="$(.venv/bin/python -m nereus --version)" || return 1
    echo "installed: $build" >&2
    if [ -n "${CI:-}" ] && [ -z "${NEREUS_PURE_PYTHON:-}" ] \
        && { [[ "$build" != *compiled* ]] || [[ "$build" != *rust* ]]; }; then
        echo "error: the compiled build failed; \`.venv/bin/pip install -v -e .\` shows why" \
            "(a line starting with 'nereus:')" >&2
        return 1
    fi
    echo "$want" > "$stamp"
}
