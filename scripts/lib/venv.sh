# Shared by scripts/*: create .venv with the interpreter in $PYTHON (default python3) and
# install the project with its dev extras. pip's cache outside the clone keeps reruns fast.
ensure_venv() {
    local py="${PYTHON:-python3}"
    if ! command -v "$py" >/dev/null 2>&1; then
        echo "error: $py not found; Nereus needs Python >= 3.11" >&2
        exit 1
    fi
    if [ ! -x .venv/bin/python ]; then
        "$py" -m venv .venv
    fi
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
}
