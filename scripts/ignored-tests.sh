#!/usr/bin/env bash
# Lists every `#[ignore = "reason"]` test of the workspace with file:line and
# its reason, loudly, so a test that did not run is never mistaken for one
# that passed. Child process entry points (reason starting "child process
# entry point") are no tests and are listed apart.
#
# usage: scripts/ignored-tests.sh [NAME...]
#   NAME  a test that was run in this run anyway (its precondition held);
#         it is marked "ran" instead of "NOT RUN".
# Exits 1 when an `#[ignore]` has no reason.
set -euo pipefail
cd "$(dirname "$0")/.."

ran=" $* "
listing=$(
    git ls-files -- '*.rs' | grep -v '^shm-protocol/fuzz/' | xargs awk '
        FNR == 1 { pending = "" }
        /^[[:space:]]*#\[ignore[[:space:]]*\]/ {
            printf "BARE\t%s:%d\t-\t-\n", FILENAME, FNR; next
        }
        /^[[:space:]]*#\[ignore[[:space:]]*=/ {
            line = $0
            sub(/^[^"]*"/, "", line); sub(/"[[:space:]]*\][[:space:]]*$/, "", line)
            pending = FILENAME ":" FNR "\t" line; next
        }
        pending != "" && /^[[:space:]]*(pub[^ ]* )?(async )?fn / {
            name = $0
            sub(/^[[:space:]]*(pub[^ ]* )?(async )?fn[[:space:]]+/, "", name)
            sub(/[^A-Za-z0-9_].*$/, "", name)
            split(pending, p, "\t")
            printf "IGNORED\t%s\t%s\t%s\n", p[1], name, p[2]
            pending = ""
        }
    '
)

bare=$(printf '%s\n' "$listing" | awk -F'\t' '$1 == "BARE" { print "  " $2 }')
tests=$(printf '%s\n' "$listing" | awk -F'\t' '$1 == "IGNORED" && $4 !~ /^child process entry point/')
children=$(printf '%s\n' "$listing" | awk -F'\t' '$1 == "IGNORED" && $4 ~ /^child process entry point/ { print $3 }')

n=0
not_run=0
printf '\n!!!!!!!! IGNORED TESTS: each below is #[ignore]d; "NOT RUN" means it did not run here\n'
while IFS=$'\t' read -r _ where name reason; do
    [ -n "$name" ] || continue
    n=$((n + 1))
    if [[ "$ran" == *" $name "* ]]; then
        state="ran    "
    else
        state="NOT RUN"
        not_run=$((not_run + 1))
    fi
    printf '!!!!!!!! %s %s (%s): %s\n' "$state" "$name" "$where" "$reason"
done <<<"$tests"
printf '!!!!!!!! %d ignored tests, %d of them not run in this run\n' "$n" "$not_run"
if [ -n "$children" ]; then
    printf 'child process entry points (not tests; filtered out by .config/nextest.toml): %s\n' \
        "$(printf '%s\n' "$children" | paste -sd' ')"
fi
if [ -n "$bare" ]; then
    printf 'ERROR: #[ignore] without a reason (write #[ignore = "why"]):\n%s\n' "$bare" >&2
    exit 1
fi
