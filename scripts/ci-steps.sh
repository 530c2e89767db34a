# Sourced by scripts/ci-shm.sh and scripts/ci-peer.sh: their log lines and
# their named, timed steps, every line naming the script (CI_NAME).

log() { printf '%s\n' "$*" >&2; }

# step NAME CMD...: runs CMD as the step NAME and reports its wall time
# (under `set -e`, a failing step ends the script before the report).
step() {
    local name=$1
    shift
    local t0=$SECONDS
    log "==> $CI_NAME: $name"
    "$@"
    log "<== $CI_NAME: $name passed in $((SECONDS - t0)) s"
}
