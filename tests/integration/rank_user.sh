#!/bin/sh
# Ranks without the agent's privileges (worker.json rank_user, rank_group):
# an agent run as root with --rank-user starts a Python rank (with muster's
# start-up hook) that finds (a) its uid, gid and groups are the rank user's,
# (b) the cluster token file refuses it (EACCES), it writes the node's memory
# checkpoint directory, (c) no muster secret in its
# environment (the agent's has MUSTER_TOKEN_FILE, MUSTER_ADMIN_TOKEN,
# ETCDCTL_PASSWORD) and no MUSTER_CTL_FD (the hook took it), (d) setuid(0)
# fails; it reports steps through the client, writes into its rank directory,
# and the job completes, its log kept by the agent. The pre-flight's import
# check runs as the rank user too (its interpreter is one the rank user can
# run). Twice: the agent as root, and as the shipped unit runs it, a user of
# its own holding exactly the unit's AmbientCapabilities= (setpriv). Then the errors: an unknown rank_user in
# worker.json and on the command line, a rank_group without a rank_user, and
# an agent that is not root and has no CAP_SETUID: each stops start-up naming
# the key. Needs root (to switch users): skipped otherwise.
set -eu
. tests/itest-lib.sh

if [ "$(id -u)" != 0 ]; then
    cannot_run rank_user "needs root to run ranks as another user"
    exit 0
fi
U=muster-itest-rank
id -u "$U" > /dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin "$U" \
    || fail "cannot create the throwaway user $U"
UID_R=$(id -u "$U"); GID_R=$(id -g "$U")
# The rank user must reach its program and rank directory under the test directory (mktemp's is 0700).
chmod 0711 "$ITEST_DIR"
abs=$(pwd)
ls -ld "$abs/$BUILD/python/startup" > /dev/null || fail "no Python client in $BUILD/python"
runuser -u "$U" -- test -r "$abs/$BUILD/python/startup/sitecustomize.py" \
    || { cannot_run rank_user "$U cannot read $abs/$BUILD/python (a private checkout)"; exit 0; }
# An interpreter the rank user can run (root's own, a pyenv shim under /root say, it cannot).
PY=/usr/bin/python3
runuser -u "$U" -- "$PY" -c 'import json' || { cannot_run rank_user "$U cannot run $PY"; exit 0; }

cat > "$ITEST_DIR/rank.py" <<'PY'
import json, os, sys, time
import muster_rank

out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "egid": os.getegid(),
       "groups": sorted(os.getgroups())}
try:
    open(sys.argv[1]).read()
    out["token"] = "read it"
except OSError as e:
    out["token"] = "EACCES" if e.errno == 13 else str(e)
out["secret_env"] = sorted(k for k in os.environ
                           if k.startswith(("MUSTER_TOKEN", "MUSTER_ADMIN", "ETCDCTL_", "CONFIGURATION_DIRECTORY")))
out["ctl_fd_env"] = "MUSTER_CTL_FD" in os.environ
try:
    os.setuid(0)
    out["setuid0"] = "succeeded"
except PermissionError:
    out["setuid0"] = "EPERM"
with open(os.path.join(os.environ["MUSTER_RANK_DIR"], "mine.txt"), "w") as f:
    f.write("the rank writes its own directory\n")
try:  # the node's memory checkpoint directory (memory_checkpoint_mb) is the rank user's to write
    os.makedirs(os.path.join(os.environ["MUSTER_CHECKPOINT_DIR"], "step1"), exist_ok=True)
    with open(os.path.join(os.environ["MUSTER_CHECKPOINT_DIR"], "step1", "shard.pt"), "w") as f:
        f.write("a shard\n")
    out["memckpt"] = "written"
except (KeyError, OSError) as e:
    out["memckpt"] = repr(e)
rank = muster_rank.connect()
out["active"] = rank.active
print("RANKREPORT " + json.dumps(out), flush=True)
for step in range(1, 11):
    rank.beat(step, loss=1.0 / step)
    time.sleep(0.05)
time.sleep(0.3)
PY
chmod 0644 "$ITEST_DIR/rank.py"
make_token "$ITEST_DIR/token"
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "rankuser", "nodes": 1, "max_restarts": 0, "heartbeat_interval_ms": 100, "memory_checkpoint_mb": 16,
 "require_python": "$PY", "require_python_modules": ["json"]}
JSON

# run_job CASE OWNER TOKEN [PREFIX...]: the job under an agent started through PREFIX (nothing:
# as root) whose files are OWNER's (uid), with token file TOKEN; checks what its rank saw.
run_job() {
    case_=$1; owner=$2; tok=$3; shift 3
    rm -rf "$ITEST_DIR/state"
    start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
    st="$ITEST_DIR/agent-state-$case_"
    mkdir -p "$st" && chown "$owner" "$st"
    MUSTER_TOKEN_FILE="$tok" MUSTER_ADMIN_TOKEN=admin-secret ETCDCTL_PASSWORD=etcd-secret \
        "$@" "$abs/$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node a --devices cpu:1 --token-file "$tok" \
        --state-dir "$st" --rank-user "$U" \
        --rank-cmd "$PY $ITEST_DIR/rank.py $tok" >> "$ITEST_DIR/agent-$case_.log" 2>&1 &
    AGENT_PID=$!
    ITEST_PIDS="$ITEST_PIDS $AGENT_PID"
    wait_for 30 'd["state"] in ("completed", "failed")' && check 'd["state"] == "completed"' \
        || { show_status; fail "$case_: the rank user's job did not complete"; }
    grep -q "ranks run as $U (uid $UID_R, gid $GID_R)" "$ITEST_DIR/agent-$case_.log" \
        || fail "$case_: the agent does not say who ranks run as"
    RD="$st/a/gen-1/rank-0"
    [ -f "$RD/output.log" ] || fail "$case_: no output.log in $RD"
    line=$(sed -n 's/^RANKREPORT //p' "$RD/output.log")
    [ -n "$line" ] || fail "$case_: the rank printed no report: $(head -c 500 "$RD/output.log")"
    echo "$case_: rank: $line"
    want_groups=$(id -G "$U" | tr ' ' '\n' | sort -n | tr '\n' ',' | sed 's/,$//')
    python3 - "$line" "$UID_R" "$GID_R" "$want_groups" <<'PY' || fail "$case_: the rank's report is not what a rank user's must be"
import json, sys
got, uid, gid, groups = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
want = {"uid": uid, "euid": uid, "gid": gid, "egid": gid, "groups": sorted(int(g) for g in groups.split(",")),
        "token": "EACCES", "secret_env": [], "ctl_fd_env": False, "setuid0": "EPERM", "active": True,
        "memckpt": "written"}
bad = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
for k, (g, w) in bad.items():
    print("rank report %s: got %r, expected %r" % (k, g, w), file=sys.stderr)
sys.exit(1 if bad else 0)
PY
    [ "$(stat -c %u "$RD/mine.txt")" = "$UID_R" ] || fail "$case_: the rank's own file is not the rank user's"
    [ "$(stat -c %u:%g:%a "$RD")" = "$owner:$GID_R:770" ] \
        || fail "$case_: rank directory is $(stat -c %u:%g:%a "$RD"), expected $owner:$GID_R:770"
    [ "$(stat -c %a "$tok")" = 600 ] || fail "$case_: the token file's mode changed"
    # The steps reported through the client reached musterd.
    check 'd["ranks"] and all(r["step"] == 10 for r in d["ranks"])' \
        || { show_status; fail "$case_: the rank's steps (10, through muster_rank) did not reach musterd"; }
    kill "$AGENT_PID" 2>/dev/null || true
    kill "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
}

# 1. The agent as root.
run_job root 0 "$ITEST_DIR/token"
# 2. As the shipped unit runs it: a user of its own holding exactly the unit's ambient capabilities.
A=muster-itest-agent
id -u "$A" > /dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin "$A" || fail "cannot create the throwaway user $A"
caps=$(sed -n 's/^AmbientCapabilities=//p' systemd/muster-worker.service | tr 'A-Z ' 'a-z,' | sed 's/cap_/+/g')
[ -n "$caps" ] || fail "muster-worker.service has no AmbientCapabilities="
install -o "$A" -m 0600 "$ITEST_DIR/token" "$ITEST_DIR/token-agent"
run_job unit "$(id -u "$A")" "$ITEST_DIR/token-agent" setpriv --reuid="$A" --regid="$A" --clear-groups \
    --inh-caps="$caps" --ambient-caps="$caps" --
echo "rank_user: as root and with the unit's capabilities, the rank ran as $U, could not read the token, saw no secret, could not become root; job completed"

# Errors at start-up, each naming what was wrong.
printf '{"daemon": "127.0.0.1:1", "devices": "cpu:1", "token_file": "%s", "rank_user": "no-such-user-zz"}\n' \
    "$ITEST_DIR/token" > "$ITEST_DIR/bad.json"
set +e
"$BUILD/muster-worker" --config "$ITEST_DIR/bad.json" > "$ITEST_DIR/bad.out" 2>&1; rc=$?
set -e
[ "$rc" -eq 1 ] || fail "an unknown rank_user in worker.json: exit $rc, expected 1"
grep -q "bad.json: rank_user: expected a user of this machine (name or uid), not root, got \"no-such-user-zz\"" \
    "$ITEST_DIR/bad.out" || fail "unknown rank_user in worker.json: $(cat "$ITEST_DIR/bad.out")"
set +e
"$BUILD/muster-worker" --daemon 127.0.0.1:1 --devices cpu:1 --token-file "$ITEST_DIR/token" \
    --rank-user no-such-user-zz > "$ITEST_DIR/bad2.out" 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || fail "--rank-user of an unknown user: exit $rc, expected 2"
grep -q 'rank_user: no user "no-such-user-zz" on this machine' "$ITEST_DIR/bad2.out" \
    || fail "--rank-user of an unknown user: $(cat "$ITEST_DIR/bad2.out")"
set +e
"$BUILD/muster-worker" --daemon 127.0.0.1:1 --devices cpu:1 --token-file "$ITEST_DIR/token" \
    --rank-group root > "$ITEST_DIR/bad3.out" 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q 'rank_group: needs rank_user' "$ITEST_DIR/bad3.out" \
    || fail "--rank-group alone: exit $rc: $(cat "$ITEST_DIR/bad3.out")"
# Not root and no CAP_SETUID: the agent (run as the rank user, with a token of its own) cannot switch users.
cp "$ITEST_DIR/token" "$ITEST_DIR/token-u"
chown "$U" "$ITEST_DIR/token-u"
set +e
runuser -u "$U" -- "$abs/$BUILD/muster-worker" --daemon 127.0.0.1:1 --devices cpu:1 \
    --token-file "$ITEST_DIR/token-u" --rank-user nobody > "$ITEST_DIR/bad4.out" 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "rank_user: the agent runs as uid $UID_R without CAP_SETUID and CAP_SETGID" \
    "$ITEST_DIR/bad4.out" || fail "a non-root agent with rank_user: exit $rc: $(cat "$ITEST_DIR/bad4.out")"
echo "rank_user: bad names and an unprivileged agent stop start-up with the key named"
echo "rank_user: ok"
