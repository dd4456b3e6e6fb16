"""A rank that saves to MUSTER_CHECKPOINT_DIR as a program's own save call would (tests/integration/memckpt_buddy.sh).

Every EVERY steps each rank writes stepN/rankR.bin (MIB MiB, a function of R and N) and
stepN/meta/rankR.json (a nested path); rank 0 writes `latest` = stepN, DeepSpeed's
convention. At start it loads the checkpoint `latest` names, checks its bytes, and says
"resumed at step N (intact)" or "(corrupt)". --barrier DIR: after each save a rank waits
(60 s at most) for every rank's, as a collective save would. --half R:N: rank R writes half of its step-N
file and sleeps there until it is killed (a save cut short), unless it resumed.
"""
import argparse
import hashlib
import json
import os
import time

import muster_rank

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--sleep", type=float, default=0.1)
ap.add_argument("--half", default="")
ap.add_argument("--mib", type=int, default=1, help="MiB each rank saves a step")
ap.add_argument("--barrier", default="", help="a directory all ranks see: each save ends when every rank made it")
args = ap.parse_args()

rank = int(os.environ["RANK"])
root = os.environ["MUSTER_CHECKPOINT_DIR"]
link = muster_rank.connect()


def payload(step: int) -> bytes:
    return hashlib.sha256(b"%d:%d" % (rank, step)).digest() * (32768 * args.mib)


start = 0
try:
    with open(os.path.join(root, "latest")) as f:
        tag = f.read().strip()
except FileNotFoundError:
    tag = ""
if tag:
    start = int(tag[len("step"):])
    with open(os.path.join(root, tag, "rank%d.bin" % rank), "rb") as f:
        data = f.read()
    with open(os.path.join(root, tag, "meta", "rank%d.json" % rank)) as f:
        meta = json.load(f)
    good = data == payload(start) and meta == {"rank": rank, "step": start}
    print("resumed at step %d (%s)" % (start, "intact" if good else "corrupt"), flush=True)
half_rank, _, half_step = args.half.partition(":")
for step in range(start + 1, args.steps + 1):
    time.sleep(args.sleep)
    if step % args.every == 0:
        tag = os.path.join(root, "step%d" % step)
        os.makedirs(os.path.join(tag, "meta"), exist_ok=True)
        with open(os.path.join(tag, "rank%d.bin" % rank), "wb") as f:
            if not start and half_rank and int(half_rank) == rank and int(half_step) == step:
                f.write(payload(step)[: len(payload(step)) // 2])
                f.flush()
                print("half of step %d written; stalled" % step, flush=True)
                time.sleep(3600)
            f.write(payload(step))
        with open(os.path.join(tag, "meta", "rank%d.json" % rank), "w") as f:
            json.dump({"rank": rank, "step": step}, f)
        if rank == 0:
            with open(os.path.join(root, "latest.tmp"), "w") as f:
                f.write("step%d" % step)
            os.replace(os.path.join(root, "latest.tmp"), os.path.join(root, "latest"))
        if args.barrier:
            open(os.path.join(args.barrier, "rank%d.step%d" % (rank, step)), "w").close()
            world = int(os.environ["WORLD_SIZE"])
            for _ in range(600):
                if all(os.path.exists(os.path.join(args.barrier, "rank%d.step%d" % (r, step))) for r in range(world)):
                    break
                time.sleep(0.1)
    link.beat(step, loss=1.0 / step)
    print("step %d" % step, flush=True)
