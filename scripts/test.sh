#!/usr/bin/env bash
# Runs every test of the project on a fresh machine (CI runs exactly this).
# Installs what it needs first (scripts/setup.sh test). Steps:
#   1. lint: cargo fmt --check, no import cycles between modules
#      (scripts/module-cycles.py), clippy -D warnings on every target (and on
#      granary-shm with its loom feature)
#   2. workspace tests (unit, integration, cross-process, C example), release
#      profile; the Kubernetes manifests' offline check (scripts/k8s-check.py);
#      then the #[ignore]d tests whose precondition holds here
#   3. the RDMA backend built and tested with its feature (fake NIC: there
#      is no RDMA device here), its device probe included (the conformance
#      suite over TCP runs with the workspace tests); loom models of the
#      ring and header publication
#   4. Miri over the ring / validation / lease logic with heap-backed memory
#   5. fuzz smoke runs (scripts/fuzz.sh: regression inputs replayed, then
#      fuzzing from the committed seeds) of the validation and handshake
#      targets and the peer frame, handshake and records targets (the
#      agent's targets' inputs are replayed by step 2); the soak loops with CI
#      counts (scripts/soak.sh --ci)
#   6. Python package: pip install torch & co. and ./client-c/python, pytest
#   7. every #[ignore]d test with its reason, and whether it ran
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# The commit `granaryd --version` and `granary --version` print.
export GRANARY_COMMIT="${GRANARY_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || true)}"
step() { printf '\n==== %s [%s]\n' "$1" "$(date +%T)"; }

step "setup"
scripts/setup.sh test

step "lint"
cargo fmt --all --check
# No import cycles between modules (parents and their children aside).
python3 scripts/module-cycles.py
cargo clippy --release --workspace --all-targets -- -D warnings
cargo clippy --release -p granary-shm --features loom --all-targets -- -D warnings

step "workspace tests"
# Every later cargo command selects the whole workspace (and filters with
# nextest's -E) or builds with other features anyway: a `-p` subset
# resolves other features and compiles crates again.
cargo build --release --workspace --all-targets
# The neighbours test runs in the soak step, where its figures are printed.
cargo nextest run --release --workspace --no-fail-fast -E 'not binary(neighbours)'
cargo test --release --workspace --doc

step "systemd (granaryd under systemd-run where systemd runs this machine, else SKIPPED loudly)"
cargo nextest run --release --workspace --no-capture -E 'package(granary-agent) & binary(systemd_units) & test(/systemd_run/)'

step "kubernetes manifests (kubectl kustomize, the API's types, granaryd validate; the Helm chart statically and rendered by helm)"
python3 scripts/k8s-check.py --granaryd target/release/granaryd --granary target/release/granary \
    --kubectl "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/kubectl"

# #[ignore]d tests that can run here after all.
ran_ignored=()
# ignored_test FILTER NAME: runs the #[ignore]d tests FILTER selects; NAME
# counts as run.
ignored_test() {
    cargo nextest run --release --workspace --run-ignored only -E "$1"
    ran_ignored+=("$2")
}
if [ "$(id -u)" -eq 0 ]; then
    step "tests that need root"
    ignored_test 'package(granary-agent) & binary(bad_input) & test(=a_uid_outside_the_allowlist_gets_no_fds)' \
        a_uid_outside_the_allowlist_gets_no_fds
    ignored_test 'package(granary-agent) & binary(view_owner) & test(=another_uid_joins_the_view_but_cannot_replace_it)' \
        another_uid_joins_the_view_but_cannot_replace_it
    # membership = "dns": three granaryd, each in a mount namespace whose
    # resolv.conf names the test's DNS responder.
    ignored_test 'package(granary-agent) & binary(dns_membership) & test(=agents_find_each_other_through_a_dns_responder_and_follow_its_records)' \
        agents_find_each_other_through_a_dns_responder_and_follow_its_records
    # A ramfs, whose files refuse O_DIRECT: the reader falls back to the page cache.
    ignored_test 'package(granary-agent) & kind(lib) & test(=source::fs::reader::tests::a_filesystem_that_refuses_direct_io_is_read_through_the_page_cache)' \
        a_filesystem_that_refuses_direct_io_is_read_through_the_page_cache
    # The cluster benchmark's smoke variant: network namespaces, tc, two
    # granaryd (built by the workspace build above) over a SeaweedFS.
    ignored_test 'package(granary-bench) & binary(cluster_smoke)' two_nodes_lose_nothing_and_read_the_store_once
fi
if [ -n "${GRANARY_TEST_SCYLLA:-}" ]; then
    step "tests against a real ScyllaDB/Cassandra ($GRANARY_TEST_SCYLLA)"
    cargo nextest run --release -p granary-tools --test cql_real --run-ignored only
    ran_ignored+=(cql_real_ingest_serve_verify_and_resume
        cql_real_missing_rows_wrong_sizes_and_a_table_without_size)
fi

step "rdma backend (feature rdma: rdma-sys over libibverbs; no device here, so the conformance suite runs on the fake NIC)"
# The agent's `rdma` feature is granary-rdma's: the device probe and the
# opening of a device behind peers.transport live in granary-rdma's
# `device` module, so building that crate with the feature checks every
# line the feature switches (the agent is not compiled a second time).
cargo clippy --release -p granary-rdma --features rdma --all-targets -- -D warnings
cargo nextest run --release -p granary-rdma --features rdma

step "loom"
scripts/ci-shm.sh loom

step "miri"
scripts/ci-shm.sh miri

step "fuzz smoke"
scripts/ci-shm.sh fuzz
scripts/ci-peer.sh
# The agent's targets (agent/config, agent/session) are not fuzzed here:
# their sanitizer build of the agent's whole dependency tree costs about 6
# minutes of two cores. The workspace tests replay their committed seeds and
# regressions (docs/testing.md); scripts/soak.sh fuzzes them.
echo "fuzz: agent/config and agent/session NOT fuzzed in CI (their committed inputs were replayed by the workspace tests; scripts/soak.sh fuzzes them)"

step "soak (CI counts: 1,000 kill-loop rounds, 100,000 configuration files of each kind, 200 loader scripts, 3 s next to each misbehaving loader)"
scripts/soak.sh --ci

step "python"
client-c/python/ci.sh

step "ignored tests"
scripts/ignored-tests.sh "${ran_ignored[@]}"

step "done"
