"""muster_rank: tell muster how a training program is doing (standard library only).

Under muster-worker every rank inherits a control socket, named by the
environment variable MUSTER_CTL_FD. This module speaks the rank's side of it
as "The rank contract" in proto/PROTOCOL.md describes: HEARTBEAT frames with
the step, loss and throughput, so that muster shows progress and can tell a
hung rank from a slow one. Without it a rank is still supervised (its exit
drives recovery); with it the step is known and hang detection works.

    import muster_rank
    rank = muster_rank.connect()
    for step in range(start, steps):
        loss = train_step()
        rank.beat(step + 1, loss=loss.item(), tokens_per_s=tps)
        if rank.stop_requested:
            break

Outside muster (MUSTER_CTL_FD unset) connect() returns an object whose calls
do nothing, so the same script runs anywhere. No call raises because the
agent went away: the first failure is logged once on stderr and the object
then does nothing (stop_requested turns True, as the agent is gone).

Two daemon threads do the I/O, so beat() never waits on the socket: a reader
takes in what the agent sends (ASSIGN, UNIQUE_ID, COMMAND) so that the
agent's writes never back up, and a writer sends at most one HEARTBEAT per
BEAT_INTERVAL seconds, always the latest, within BEAT_INTERVAL of the call
that made it. Every method may be called from any thread. Python 3.9+.

Once a rank has reported, the writer also sends a keepalive every
KEEPALIVE_INTERVAL seconds while the program is busy (in a long collective,
say), so that a quiet rank means one that cannot run (stopped, frozen, or
its interpreter held by native code), not one that waits. Each heartbeat
says where the program's main thread is (`where`, its innermost frame of
the program's own code) and, when it is inside a collective or a backward
pass, what it waits in (`waiting`): when every rank stands still, musterd
names the one that is not waiting on the others.

Programs that do not use this package are seen too: under muster-worker a
Python rank starts with muster's start-up hook (startup/sitecustomize.py
beside this package), which calls hook.startup(). It arms a thread (and
faulthandler behind it) so that the agent can ask for every thread's stack, and once the program
imports torch (2.0 or later), it counts optimizer steps through torch's
global optimizer step hook and reports them here, as beat() would (a
program that calls beat() itself keeps its own figures).

The package, one idea per module:

    wire       the control socket's frames (pure: bytes in, frames out)
    link       Rank and connect(): the rank's link to its agent
    where      where the program's main thread is, and what it waits in
    hook       the start-up hook (sitecustomize imports only link, where, hook)
    log        a line on stderr; the phases of a heal (MUSTER_RANK_TRACE)
    elastic    Elastic: healing a data-parallel program in place
    state      walking a state_dict: tensors out, and back in
    snapshot   a state in host memory: one flat buffer and a pickled layout
    transport  snapshots between ranks: broadcast, send, receive
    pg         torch's process groups, as a process that outlives them needs
    sharded/   ShardedElastic: pure plans, shard state, buddy replicas, re-slicing

Elastic and ShardedElastic (which import the rest) are loaded on first use.
"""

from .link import BEAT_INTERVAL, KEEPALIVE_INTERVAL, Rank, connect

__all__ = ["connect", "Rank", "Elastic", "ShardedElastic", "BEAT_INTERVAL", "KEEPALIVE_INTERVAL"]

_LAZY = {"Elastic": "elastic", "ShardedElastic": "sharded.elastic", "Action": "elastic",
         "PARK_INTERRUPT_S": "elastic", "PARK_EXIT_S": "elastic", "VOTE_EVERY_S": "elastic",
         "VOTE_MAX_STEPS": "elastic"}


def __getattr__(name):
    """The healing classes and their constants, imported when first named, so
    that the start-up hook, which every Python process of a rank runs, loads
    only the link to the agent."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    import importlib
    value = getattr(importlib.import_module("." + module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
