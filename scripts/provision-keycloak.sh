#!/usr/bin/env bash
# Provision the pinned Keycloak (the OpenID Connect provider the identity tests run against) into
# .tools/keycloak-<version> (git-ignored): Maven Central's keycloak-quarkus-dist archive, verified
# against the pinned SHA-512, then built once (`kc.sh build --db=dev-mem`) so that tests start it
# with `start --optimized` and never rewrite the shared install (gateway/dev/keycloak.py gives every
# test session its own home folder for data and logs).
#
# Keycloak 26 needs Java 21 or newer. The machine's default java is 17, so a newer JDK is looked
# for in KEYCLOAK_JAVA_HOME, JAVA_HOME and /usr/lib/jvm/*; the one found is recorded in
# .tools/keycloak-<version>/.java_home for the tests. Idempotent.
set -euo pipefail
KEYCLOAK_VERSION="${KEYCLOAK_VERSION:-26.5.6}"
KEYCLOAK_SHA512="09473578015a4c9a8b74eb7461d114bfd48400544e022a8b8eee1b21f87006cfe0649e14836122c0e81d4daaf8a8e4b43d7ca85198fb9e4419da0426754a4b66"
MAVEN="${MAVEN_REPOSITORY:-https://repo1.maven.org/maven2}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="$ROOT/.tools"
DEST="$TOOLS/keycloak-$KEYCLOAK_VERSION"
STAMP="$DEST/.pvegate-built"

java_major() { # $1=java binary; prints its feature version (17, 21, 25...)
	"$1" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p' | head -1
}

find_java_home() {
	local candidate major
	for candidate in "${KEYCLOAK_JAVA_HOME:-}" "${JAVA_HOME:-}" /usr/lib/jvm/*; do
		[ -n "$candidate" ] && [ -x "$candidate/bin/java" ] || continue
		major="$(java_major "$candidate/bin/java")"
		if [[ "$major" =~ ^[0-9]+$ ]] && [ "$major" -ge 21 ]; then
			echo "$candidate"
			return 0
		fi
	done
	return 1
}

if [ -f "$STAMP" ] && [ -x "$(cat "$DEST/.java_home" 2>/dev/null)/bin/java" ]; then
	echo "keycloak $KEYCLOAK_VERSION: $DEST (cached)"
	exit 0
fi
JAVA_HOME_FOUND="$(find_java_home)" || {
	echo "error: Keycloak $KEYCLOAK_VERSION needs a JDK 21 or newer (none in KEYCLOAK_JAVA_HOME, JAVA_HOME or /usr/lib/jvm)" >&2
	exit 1
}
mkdir -p "$TOOLS"
WORK="$(mktemp -d "$TOOLS/.keycloak-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
ARCHIVE="keycloak-quarkus-dist-$KEYCLOAK_VERSION.tar.gz"
echo "downloading Keycloak $KEYCLOAK_VERSION from Maven Central..."
curl -sSfL --retry 3 -o "$WORK/$ARCHIVE" "$MAVEN/org/keycloak/keycloak-quarkus-dist/$KEYCLOAK_VERSION/$ARCHIVE"
echo "$KEYCLOAK_SHA512  $WORK/$ARCHIVE" | sha512sum --check --quiet - || {
	echo "error: $ARCHIVE does not match the pinned SHA-512" >&2
	exit 1
}
tar -xzf "$WORK/$ARCHIVE" -C "$WORK"
rm -f "$WORK/$ARCHIVE"
echo "building Keycloak once (Quarkus augmentation, ~30 s) with $JAVA_HOME_FOUND..."
(cd "$WORK" && JAVA_HOME="$JAVA_HOME_FOUND" "$WORK/keycloak-$KEYCLOAK_VERSION/bin/kc.sh" build --db=dev-mem >"$WORK/build.log" 2>&1) || {
	cat "$WORK/build.log" >&2
	exit 1
}
rm -rf "$WORK/keycloak-$KEYCLOAK_VERSION/data"
echo "$JAVA_HOME_FOUND" >"$WORK/keycloak-$KEYCLOAK_VERSION/.java_home"
touch "$WORK/keycloak-$KEYCLOAK_VERSION/.pvegate-built"
rm -rf "$DEST"
mv "$WORK/keycloak-$KEYCLOAK_VERSION" "$DEST" # one rename: a concurrent reader sees all or nothing
echo "keycloak $KEYCLOAK_VERSION: $DEST (java: $JAVA_HOME_FOUND)"
