#!/usr/bin/env bash
# Build the Debian package of fencelock, fencelock_VERSION_ARCH.deb, with
# dpkg-deb alone (no cargo-deb, no debhelper): what a fresh Debian machine
# has, plus cargo when it builds the binary itself.
#
#   scripts/package.sh [--binary PATH] [--out DIR] [--compression xz|gzip|none]
#
#   --binary PATH  package this fencelock binary (the tests pass the debug
#                  build they have) instead of building one with
#                  `cargo build --release --locked -p fencelock-cli`
#   --out DIR      where to write the .deb [default: target/debian]
#   --compression  of the .deb's data [default: xz; the tests use gzip]
#
# The package's sources are under packaging/: the unit
# (fencelock.service), the conffile /etc/fencelock/fencelock.toml
# (fencelock.toml), and debian/ (control.in, conffiles, the maintainer
# scripts, copyright, changelog.in, README.Debian). The manual pages and the
# shell completions come from the binary (`fencelock man DIR`, `fencelock
# completions SHELL`). The binary's debug sections are stripped when `strip`
# (binutils) is there, its symbols kept (function names in backtraces).
# Version: the binary's own (`fencelock --version`); architecture: dpkg's.
# Prints the .deb's path as the last line of its output.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pkg=$root/packaging

die() {
    echo "package.sh: $*" >&2
    exit 1
}

binary= out= compression=xz
while [ $# -gt 0 ]; do
    case "$1" in
    --binary) [ $# -ge 2 ] || die "--binary needs a path"; binary=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out=$2; shift 2 ;;
    --compression)
        [ $# -ge 2 ] || die "--compression needs xz, gzip or none"
        case "$2" in xz | gzip | none) compression=$2 ;; *) die "--compression $2: xz, gzip or none" ;; esac
        shift 2
        ;;
    -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (usage: scripts/package.sh [--binary PATH] [--out DIR] [--compression xz|gzip|none])" ;;
    esac
done

for tool in dpkg-deb dpkg gzip md5sum; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (Debian's dpkg, gzip and coreutils)"
done

target=${CARGO_TARGET_DIR:-$root/target}
if [ -z "$binary" ]; then
    echo "package.sh: cargo build --release --locked -p fencelock-cli" >&2
    (cd "$root" && cargo build --release --locked -p fencelock-cli >&2)
    binary=$target/release/fencelock
fi
[ -x "$binary" ] || die "no executable binary at $binary"
out=${out:-$target/debian}
mkdir -p "$out"
out=$(cd "$out" && pwd)

version=$("$binary" --version | sed -n '1s/^fencelock \([0-9][0-9A-Za-z.+~-]*\).*$/\1/p')
[ -n "$version" ] || die "cannot read the version from '$binary --version'"
arch=$(dpkg --print-architecture)

# Reproducible: dates and mtimes from the last commit when there is one.
if [ -z "${SOURCE_DATE_EPOCH:-}" ] && git -C "$root" rev-parse HEAD >/dev/null 2>&1; then
    SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct)
fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(date +%s)}
source_desc=$(git -C "$root" describe --always --dirty 2>/dev/null || echo "a source tree without git")

stage=$(mktemp -d)
scratch=$(mktemp -d)
trap 'rm -rf "$stage" "$scratch"' EXIT
chmod 0755 "$stage"
umask 022

# The binary.
install -d "$stage/usr/bin"
if command -v strip >/dev/null 2>&1; then
    strip --strip-debug --remove-section=.comment -o "$stage/usr/bin/fencelock" "$binary"
else
    echo "package.sh: warning: no strip (binutils): the binary keeps its debug sections" >&2
    cp "$binary" "$stage/usr/bin/fencelock"
fi
chmod 0755 "$stage/usr/bin/fencelock"

# The unit, the conffile, the documentation.
install -D -m 0644 "$pkg/fencelock.service" "$stage/lib/systemd/system/fencelock.service"
install -D -m 0644 "$pkg/fencelock.toml" "$stage/etc/fencelock/fencelock.toml"
doc=$stage/usr/share/doc/fencelock
install -D -m 0644 "$pkg/debian/copyright" "$doc/copyright"
install -m 0644 "$pkg/debian/README.Debian" "$doc/README.Debian"
sed -e "s|@VERSION@|$version|" -e "s|@SOURCE@|$source_desc|" \
    -e "s|@DATE@|$(date -u -R -d "@$SOURCE_DATE_EPOCH")|" "$pkg/debian/changelog.in" |
    gzip -9n >"$doc/changelog.Debian.gz"
chmod 0644 "$doc/changelog.Debian.gz"

# Manual pages and completions, from the binary.
"$binary" man "$scratch" >&2 || die "'fencelock man DIR' failed"
man1=$stage/usr/share/man/man1
install -d "$man1"
pages=0
for page in "$scratch"/*.1; do
    [ -f "$page" ] || continue
    gzip -9n -c "$page" >"$man1/$(basename "$page").gz"
    chmod 0644 "$man1/$(basename "$page").gz"
    pages=$((pages + 1))
done
[ "$pages" -gt 0 ] || die "'fencelock man $scratch' wrote no *.1 page"
completion() { # SHELL DEST
    install -d "$(dirname "$2")"
    "$binary" completions "$1" >"$2" || die "'fencelock completions $1' failed"
    [ -s "$2" ] || die "'fencelock completions $1' printed nothing"
    chmod 0644 "$2"
}
completion bash "$stage/usr/share/bash-completion/completions/fencelock"
completion zsh "$stage/usr/share/zsh/vendor-completions/_fencelock"
completion fish "$stage/usr/share/fish/vendor_completions.d/fencelock.fish"

# DEBIAN/: control, conffiles, maintainer scripts, md5sums.
# Depends: the newest glibc symbol version the binary asks for (from its
# version-needs strings), libgcc_s if it links it (Rust's unwinder), and
# passwd for the postinst's useradd and groupadd.
glibc=$(grep -aoE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' "$binary" | sed 's/^GLIBC_//' | sort -uV | tail -n1 || true)
depends="libc6${glibc:+ (>= $glibc)}"
if grep -aq 'libgcc_s\.so\.1' "$binary"; then
    depends="$depends, libgcc-s1"
fi
depends="$depends, passwd"
install -d -m 0755 "$stage/DEBIAN"
size=$(du -sk --apparent-size "$stage" | cut -f1)
sed -e "s|@VERSION@|$version|" -e "s|@ARCH@|$arch|" -e "s|@INSTALLED_SIZE@|$size|" \
    -e "s|@DEPENDS@|$depends|" "$pkg/debian/control.in" >"$stage/DEBIAN/control"
install -m 0644 "$pkg/debian/conffiles" "$stage/DEBIAN/conffiles"
for script in postinst prerm postrm; do
    install -m 0755 "$pkg/debian/$script" "$stage/DEBIAN/$script"
done
(cd "$stage" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -print |
    sed 's|^\./||' | LC_ALL=C sort | xargs md5sum >DEBIAN/md5sums)
chmod 0644 "$stage/DEBIAN/md5sums"

deb=$out/fencelock_${version}_${arch}.deb
dpkg-deb --build --root-owner-group -Z"$compression" "$stage" "$deb" >&2
echo "$deb"
