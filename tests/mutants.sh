#!/bin/sh
# make check-mutants (not part of make check): key integration scenarios run
# against a musterd built with one feature broken on purpose, each of which
# the scenario must catch (exit non-zero). A mutant is a build flag,
# MUSTER_MUTANT_<NAME>, read in daemon/ (rdv_fail.c, rdv_hang.c, musterd.c),
# worker/agent/ (agent_spawn.c) and proto/ (channel.c) only; each is built in
# build-mutants/<name> (a copy
# of $BUILD with musterd and muster-worker rebuilt), so
# the release build never holds one. The last line is the tally: a mutant
# every one of whose scenarios passed "survived", and the run fails.
#   HANG_NAMES_RANK0  the hang detector names rank 0, whichever rank hung
#   NO_PARK           a failure stops every rank instead of parking them
#                     (no rank heals in place: fresh processes, state lost)
#   NO_STATE_RESTORE  a musterd elected leader ignores the job's state in
#                     etcd (a failover starts the job afresh)
#   NO_STOPPED_RULE   a stopped rank whose peers stall waits for the progress
#                     timeout (300 s early in a job) instead of HANG_STOPPED_MS
#   NO_FRAME_MAC      a sealed frame's MAC is not checked (a relay can change
#                     or replay frames after the handshake)
#   ONE_DEVICE        the agent gives a user's program one visible GPU, not
#                     torchrun's view (cuda:LOCAL_RANK is "invalid device ordinal")
# MUTANTS="NAME ..." picks some (default: all).
set -u
BUILD=${BUILD:-build}
OUT=build-mutants
MUTANTS=${MUTANTS:-HANG_NAMES_RANK0 NO_PARK NO_STATE_RESTORE NO_STOPPED_RULE ONE_DEVICE NO_FRAME_MAC}

scenarios() { # NAME: the scripts that must catch it (short first)
    case $1 in
    HANG_NAMES_RANK0) echo "torch_hook torch_elastic_world" ;;
    NO_PARK) echo "torch_elastic heal_in_place" ;;
    NO_STATE_RESTORE) echo "failover_etcd" ;;
    NO_STOPPED_RULE) echo "hang_early" ;;
    ONE_DEVICE) echo "device_contract" ;;
    NO_FRAME_MAC) echo "auth_mutual" ;;
    *) echo "" ;;
    esac
}

killed=0
survived=""
for m in $MUTANTS; do
    [ -n "$(scenarios "$m")" ] || { echo "mutants: no mutant $m"; exit 2; }
    dir=$OUT/$(echo "$m" | tr 'A-Z' 'a-z')
    rm -rf "$dir"
    mkdir -p "$dir"
    cp -a "$BUILD/." "$dir/"
    # the objects of the files that read a mutant flag, rebuilt with it
    for f in $(grep -l MUSTER_MUTANT_ daemon/*.c worker/agent/*.c proto/*.c); do rm -f "$dir/obj/${f%.c}.o"; done
    rm -f "$dir/musterd" "$dir/muster-worker"
    make --no-print-directory BUILD="$dir" CFLAGS="-DMUSTER_MUTANT_$m" "$dir/musterd" "$dir/muster-worker" \
        > "$dir/make.log" 2>&1 ||
        { echo "mutants: $m does not build:"; tail -n 20 "$dir/make.log"; exit 2; }
    caught=""
    for s in $(scenarios "$m"); do
        start=$(date +%s)
        if BUILD="$dir" timeout 600 sh "tests/integration/$s.sh" > "$dir/$s.log" 2>&1; then
            echo "-- mutant $m: $s passed ($(($(date +%s) - start)) s): it does not catch the mutant"
        else
            echo "-- mutant $m: $s failed ($(($(date +%s) - start)) s): $(grep -m 1 '^FAIL' "$dir/$s.log")"
            caught="$caught $s"
            break # caught: the longer scenarios need not run
        fi
    done
    if [ -n "$caught" ]; then killed=$((killed + 1)); else survived="$survived $m"; fi
done
[ -n "$survived" ] && echo "survived:$survived"
echo "mutants: $killed killed, $(echo $survived | wc -w) survived"
[ -z "$survived" ]
