#!/usr/bin/env bash
# Runs scripts/wheel-check.sh on a wheel under another distribution's own
# python3, inside a chroot made with debootstrap (--variant=minbase):
#   trixie  Debian 13:    CPython 3.13, glibc 2.41
#   jammy   Ubuntu 22.04: CPython 3.10, glibc 2.35
# (Debian 11's CPython 3.9 is out of reach: its glibc 2.31 is older than the
# wheel's manylinux_2_34 tag, so pip would not install it there.)
# The chroot is made once and kept in ~/.cache/granary/chroot-SUITE (made in
# a side folder and moved there only when debootstrap succeeds, so a broken
# one is never reused). /proc, /dev, /dev/shm and /sys are bind-mounted for
# granaryd and unmounted on exit. Exits non-zero when the check fails.
# Not run by CI (a debootstrap per suite is minutes); see docs/python.md.
#
#   scripts/wheel-check-chroot.sh SUITE WHEEL     (as root; needs debootstrap,
#                                                  and ubuntu-keyring for jammy)
set -euo pipefail
suite="${1:?usage: $0 trixie|jammy WHEEL}"
wheel="$(realpath "${2:?usage: $0 trixie|jammy WHEEL}")"
check="$(cd "$(dirname "$0")" && pwd)/wheel-check.sh"
log() { printf '[wheel-check-chroot] %s\n' "$*" >&2; }
case "$suite" in
    trixie) mirror=http://deb.debian.org/debian keyring=/usr/share/keyrings/debian-archive-keyring.gpg
        components=main ;;
    # Ubuntu's python3-venv is in universe.
    jammy) mirror=http://archive.ubuntu.com/ubuntu keyring=/usr/share/keyrings/ubuntu-archive-keyring.gpg
        components=main,universe ;;
    *) log "unknown suite $suite (trixie or jammy)"; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { log "needs root (debootstrap, chroot, mount)"; exit 2; }
root="${HOME}/.cache/granary/chroot-$suite"

if [ ! -x "$root/usr/bin/python3" ]; then
    [ -f "$keyring" ] || { log "missing $keyring (install ubuntu-keyring for jammy)"; exit 2; }
    t=$SECONDS
    rm -rf "$root.new"
    mkdir -p "$(dirname "$root")"
    log "debootstrap $suite into $root"
    debootstrap --variant=minbase --keyring="$keyring" --components="$components" \
        --include=python3,python3-venv "$suite" "$root.new" "$mirror" >&2
    rm -rf "$root"
    mv "$root.new" "$root"
    log "debootstrap $suite: $((SECONDS - t)) s"
fi

mounted=()
cleanup() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount "${mounted[i]}" || umount -l "${mounted[i]}" || log "could not unmount ${mounted[i]}"
    done
}
trap cleanup EXIT
for m in /proc /dev /dev/shm /sys; do
    mkdir -p "$root$m"
    mount --bind "$m" "$root$m"
    mounted+=("$root$m")
done

rm -rf "$root/tmp/wheel-check"
mkdir -p "$root/tmp/wheel-check"
cp "$wheel" "$check" "$root/tmp/wheel-check/"
log "$suite: $(chroot "$root" python3 --version), $(chroot "$root" ldd --version | head -n 1)"
t=$SECONDS
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    ${GRANARY_COMMIT:+GRANARY_COMMIT="$GRANARY_COMMIT"} ${WHEEL_CHECK_FILES:+WHEEL_CHECK_FILES="$WHEEL_CHECK_FILES"} \
    bash /tmp/wheel-check/wheel-check.sh "/tmp/wheel-check/$(basename "$wheel")" python3
log "$suite: passed in $((SECONDS - t)) s"
