#!/bin/sh
# make install / uninstall: the layout under DESTDIR (binaries, units with
# ExecStart under PREFIX, example configs, docs, man pages that man renders),
# the units' users and hardening (User=muster, capabilities only where
# rank_user needs them; sysusers.d and tmpfiles.d applied in a scratch root),
# and `systemd-analyze verify` on the installed units. verify needs the
# ExecStart binaries and the Documentation= man pages where the unit says,
# so it runs on an install with PREFIX inside the test directory (no
# DESTDIR; MANPATH points at its man pages); it must print nothing. A broken
# unit is shown to be caught, so that a silent verify means something.
set -eu
. tests/itest-lib.sh

MAKE="make -s --no-print-directory BUILD=$BUILD"
D="$ITEST_DIR/destdir"
$MAKE install DESTDIR="$D" PREFIX=/usr/local > "$ITEST_DIR/install.log" 2>&1 || fail "make install DESTDIR failed"
P="$D/usr/local"
for f in bin/musterd bin/muster-worker bin/muster-train bin/musterctl \
         lib/systemd/system/musterd.service lib/systemd/system/muster-worker.service \
         share/muster/etc/musterd.json share/muster/etc/worker.json share/muster/etc/conservative.json \
         share/muster/etc/balanced.json share/muster/etc/aggressive.json \
         share/doc/muster/operator-guide.md share/doc/muster/troubleshooting.md share/doc/muster/config.md \
         share/man/man8/musterd.8 share/man/man8/muster-worker.8 share/man/man1/muster-train.1 \
         share/man/man1/musterctl.1 include/muster_rank.h lib/muster/python/muster_rank/__init__.py lib/muster/python/muster_rank/sharded/elastic.py \
         lib/muster/python/muster_spare.py lib/sysusers.d/muster.conf lib/tmpfiles.d/muster.conf; do
    [ -f "$P/$f" ] || fail "make install did not install $f"
done
# With CUDA, muster-train's GPU module, where the installed muster-train finds it.
if [ -e "$BUILD/muster-train-gpu.so" ]; then
    [ -f "$P/lib/muster/muster-train-gpu.so" ] || fail "make install did not install lib/muster/muster-train-gpu.so"
    "$P/bin/muster-train" --standalone --device gpu --model tiny --data README.md --steps 1 \
        > "$ITEST_DIR/gpu.log" 2>&1 || true
    ! grep -Eq 'not installed|cannot load' "$ITEST_DIR/gpu.log" \
        || fail "the installed muster-train does not load its GPU module: $(cat "$ITEST_DIR/gpu.log")"
fi
[ -x "$P/bin/musterd" ] || fail "musterd not executable"
"$P/bin/musterd" --version | grep -q '^musterd ' || fail "installed musterd does not run"
# The rank clients work from where they are installed.
printf '#include <muster_rank.h>\nint main(void) { muster_rank_close(muster_rank_open()); return 0; }\n' > "$ITEST_DIR/client.c"
${CC:-cc} -Wall -Werror -I "$P/include" -o "$ITEST_DIR/client" "$ITEST_DIR/client.c" && "$ITEST_DIR/client" \
    || fail "a program with the installed muster_rank.h does not build and run"
if command -v "${CXX:-c++}" > /dev/null; then
    "${CXX:-c++}" -x c++ -Wall -Werror -I "$P/include" -o "$ITEST_DIR/client++" "$ITEST_DIR/client.c" && "$ITEST_DIR/client++" \
        || fail "a C++ program with the installed muster_rank.h does not build and run"
fi
PYTHONPATH="$P/lib/muster/python" python3 -c 'import muster_rank; assert not muster_rank.connect().active; muster_rank.ShardedElastic' \
    || fail "the installed muster_rank does not import"
grep -qx 'ExecStart=/usr/local/bin/musterd' "$P/lib/systemd/system/musterd.service" || fail "musterd ExecStart"
grep -qx 'ExecStart=/usr/local/bin/muster-worker' "$P/lib/systemd/system/muster-worker.service" \
    || fail "muster-worker ExecStart"
# Both services run as the muster user; only the agent holds capabilities, the ones to start ranks as rank_user.
for u in musterd muster-worker; do
    grep -qx 'User=muster' "$P/lib/systemd/system/$u.service" || fail "$u.service does not run as muster"
    grep -qx 'NoNewPrivileges=yes' "$P/lib/systemd/system/$u.service" || fail "$u.service lacks NoNewPrivileges"
done
grep -qx 'CapabilityBoundingSet=' "$P/lib/systemd/system/musterd.service" || fail "musterd.service keeps capabilities"
grep -qx 'AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_KILL CAP_CHOWN CAP_DAC_OVERRIDE' \
    "$P/lib/systemd/system/muster-worker.service" || fail "muster-worker.service: not the capabilities rank_user needs"
# The sysusers file makes both users (in a scratch root: the host's users are left alone).
if command -v systemd-sysusers > /dev/null; then
    mkdir -p "$ITEST_DIR/sysroot/etc"
    systemd-sysusers --root="$ITEST_DIR/sysroot" "$P/lib/sysusers.d/muster.conf" > "$ITEST_DIR/sysusers.log" 2>&1 \
        || fail "systemd-sysusers refused muster.conf: $(cat "$ITEST_DIR/sysusers.log")"
    for user in muster muster-rank; do
        grep -q "^$user:" "$ITEST_DIR/sysroot/etc/passwd" || fail "systemd-sysusers did not make $user"
    done
    # tmpfiles makes an existing install's token muster's 0600 and /etc/muster root:muster 0750.
    mkdir -p "$ITEST_DIR/sysroot/etc/muster"
    (umask 022; echo secret > "$ITEST_DIR/sysroot/etc/muster/token")
    systemd-tmpfiles --root="$ITEST_DIR/sysroot" --create "$P/lib/tmpfiles.d/muster.conf" \
        > "$ITEST_DIR/tmpfiles.log" 2>&1 || fail "systemd-tmpfiles refused muster.conf: $(cat "$ITEST_DIR/tmpfiles.log")"
    m=$(sed -n 's/^muster:x:\([0-9]*\):\([0-9]*\):.*/\1:\2/p' "$ITEST_DIR/sysroot/etc/passwd")
    [ "$(stat -c %a:%u:%g "$ITEST_DIR/sysroot/etc/muster/token")" = "600:$m" ] \
        || fail "tmpfiles left the token $(stat -c %a:%u:%g "$ITEST_DIR/sysroot/etc/muster/token"), expected 600:$m"
    [ "$(stat -c %a:%u:%g "$ITEST_DIR/sysroot/etc/muster")" = "750:0:${m#*:}" ] \
        || fail "tmpfiles left /etc/muster $(stat -c %a:%u:%g "$ITEST_DIR/sysroot/etc/muster")"
fi
grep -q '^z /etc/muster/token 0600 muster muster' "$P/lib/tmpfiles.d/muster.conf" || fail "tmpfiles: the token is not muster's 0600"
for m in "$P"/share/man/man*/*; do
    out=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$m" 2>&1 > /dev/null) || fail "man -l $m failed"
    [ -z "$out" ] || fail "man -l $m warns: $out"
    LC_ALL=C.UTF-8 MANWIDTH=80 man -l "$m" 2>/dev/null | grep -q 'EXIT STATUS' || fail "$m renders without EXIT STATUS"
done
# Every unit directive has a one-line comment right above it.
for u in "$P"/lib/systemd/system/*.service; do
    awk '/^[A-Za-z]+=/ && prev !~ /^#/ { print FILENAME ": no comment above " $0; bad = 1 } { prev = $0 } END { exit bad }' "$u" \
        || fail "uncommented directive"
done
$MAKE uninstall DESTDIR="$D" PREFIX=/usr/local > /dev/null 2>&1 || fail "make uninstall failed"
left=$(find "$D" -type f)
[ -z "$left" ] || fail "make uninstall left: $left"
echo "install/uninstall under DESTDIR: ok"

if ! command -v systemd-analyze > /dev/null; then
    echo "install: systemd-analyze not found; unit verification skipped"
    exit 0
fi
P="$ITEST_DIR/prefix"
$MAKE install PREFIX="$P" > "$ITEST_DIR/install2.log" 2>&1 || fail "make install PREFIX=$P failed"
grep -qx "ExecStart=$P/bin/musterd" "$P/lib/systemd/system/musterd.service" || fail "ExecStart does not follow PREFIX"
rc=0
MANPATH="$P/share/man" systemd-analyze verify "$P"/lib/systemd/system/musterd.service \
    "$P"/lib/systemd/system/muster-worker.service > "$ITEST_DIR/verify.txt" 2>&1 || rc=$?
cat "$ITEST_DIR/verify.txt"
[ "$rc" -eq 0 ] && [ ! -s "$ITEST_DIR/verify.txt" ] || fail "systemd-analyze verify: exit $rc"
sed 's/^Restart=on-failure/Restart=sometimes/' "$P/lib/systemd/system/musterd.service" > "$ITEST_DIR/broken.service"
MANPATH="$P/share/man" systemd-analyze verify "$ITEST_DIR/broken.service" > "$ITEST_DIR/verify2.txt" 2>&1 || true
grep -q 'sometimes' "$ITEST_DIR/verify2.txt" || fail "verify did not flag a broken unit"
echo "systemd-analyze verify ($(systemd-analyze --version | head -n 1)): both units clean"
$MAKE uninstall PREFIX="$P" > /dev/null 2>&1
echo "install: ok"
