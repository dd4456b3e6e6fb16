#!/bin/sh
# The Python rank client as a package: in a fresh virtual environment,
# `pip install clients/python` (offline: the build backend comes from the
# wheel mk/deps.sh keeps in .venv/wheels) installs the package muster_rank
# and nothing else (not the start-up hook, spare or unit tests beside it), at the version of the
# build, and `import muster_rank` works from anywhere.
set -eu
. tests/itest-lib.sh

WHEELS=$PWD/.venv/wheels
if ! ls "$WHEELS"/setuptools-*.whl > /dev/null 2>&1; then
    [ -n "${CI:-}" ] && fail "no build backend wheel in $WHEELS; mk/deps.sh puts it there for make check"
    echo "rank_client_package: skipped: no build backend wheel in $WHEELS; run: sh mk/deps.sh venv"
    exit 0
fi
/usr/bin/python3 -m venv "$ITEST_DIR/venv" || fail "python3 -m venv failed (Debian: python3-venv)"
V=$ITEST_DIR/venv/bin
# From a copy (without what an earlier pip install left), as setuptools builds inside the directory.
cp -r clients/python "$ITEST_DIR/src"
rm -rf "$ITEST_DIR/src/build" "$ITEST_DIR"/src/*.egg-info
"$V/pip" install --no-index --find-links "$WHEELS" "$ITEST_DIR/src" > "$ITEST_DIR/pip.log" 2>&1 \
    || fail "pip install clients/python failed: $(tail -n 5 "$ITEST_DIR/pip.log")"
(cd "$ITEST_DIR" && env -u PYTHONPATH "$V/python" -c '
import muster_rank, sys
assert muster_rank.__file__.startswith(sys.prefix), muster_rank.__file__
assert not muster_rank.connect().active
') || fail "the installed muster_rank does not import from the environment"
version=$(sed -n 's/^VERSION := //p' Makefile)
"$V/pip" show muster-rank | grep -x "Version: $version" > /dev/null || fail "the package's version is not the build's ($version)"
files=$("$V/pip" show --files muster-rank | sed -n 's/^  //p' | grep -v -e '^muster_rank-.*\.dist-info/' -e '/__pycache__/' | sort | tr '\n' ' ')
want=$(cd clients/python && ls muster_rank/*.py muster_rank/sharded/*.py | sort | tr '\n' ' ')
[ "$files" = "$want" ] || fail "the package installs other than $want: $files"
echo "rank_client_package: pip install clients/python -> muster_rank $version, the package alone: ok"
