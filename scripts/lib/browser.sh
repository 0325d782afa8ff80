# Shared by scripts/test: the operator console's browser tests drive Debian's Chromium and its
# driver (/usr/bin/chromium, /usr/bin/chromedriver) through Selenium. Nothing else may bring a
# browser (CI reaches Debian's packages, not a browser vendor's downloads), so apt installs
# them here once; a run that finds both does nothing. When they cannot be installed this says
# so in one line and carries on: the browser tests then fail with the same advice
# (tests/support/browser.py), so a missing browser fails the run instead of hiding in it.
BROWSER_BINARIES=(/usr/bin/chromium /usr/bin/chromedriver)
BROWSER_PACKAGES=(chromium chromium-driver)

ensure_browser() {
    _browser_present && return 0
    local how="install Debian's packages: sudo apt-get install ${BROWSER_PACKAGES[*]}"
    local as=()
    if [ "$(id -u)" != 0 ]; then
        # -n: no password prompt, since CI and scripted runs have no one to answer it.
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            as=(sudo -n)
        else
            echo "browser: chromium or chromedriver missing, not root and no sudo;" \
                "the browser tests will fail: $how" >&2
            return 0
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "browser: chromium or chromedriver missing and no apt-get; $how" >&2
        return 0
    fi
    if ! _browser_apt_install "${as[@]}" || ! _browser_present; then
        echo "browser: the install failed; $how" >&2
    fi
}

_browser_present() {
    local bin
    for bin in "${BROWSER_BINARIES[@]}"; do
        [ -x "$bin" ] || return 1
    done
}

# The install, with `apt-get update` only when it fails without one (a fresh image's package
# lists may be missing or stale; an update costs time and a round of downloads otherwise).
# apt's own output goes to a log, shown only when the install fails.
_browser_apt_install() {
    local log start
    log="$(mktemp)"
    start=$SECONDS
    # Lock::Timeout: wait for another apt (an unattended upgrade) instead of failing at once.
    local apt=("$@" env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300)
    local install=("${apt[@]}" install -y --no-install-recommends "${BROWSER_PACKAGES[@]}")
    echo "browser: installing ${BROWSER_PACKAGES[*]} with apt-get (once)" >&2
    if ! "${install[@]}" >"$log" 2>&1; then
        echo "browser: the install failed; refreshing the package lists and trying again" >&2
        if ! "${apt[@]}" update >>"$log" 2>&1 || ! "${install[@]}" >>"$log" 2>&1; then
            tail -n 20 "$log" >&2
            rm -f "$log"
            return 1
        fi
    fi
    rm -f "$log"
    echo "browser: installed $("${BROWSER_BINARIES[0]}" --version 2>/dev/null) and its driver" \
        "in $((SECONDS - start)) s" >&2
}
