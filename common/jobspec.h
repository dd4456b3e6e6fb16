/*
 * jobspec: the job specification, one JSON object shared by musterd (which
 * reads it at start and hands it to every rank inside ASSIGN) and
 * muster-train (which reads it from ASSIGN, or from --job in --standalone).
 *
 * Every key is one row of the table in jobspec.c: name, type, bounds,
 * default, and a comment; docs/jobspec.md documents the same keys. Unknown
 * keys and bad values are refused with "origin: key: what was expected".
 */
#ifndef MUSTER_JOBSPEC_H
#define MUSTER_JOBSPEC_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include <jansson.h>

#include "common/cmdline.h"
#include "common/gptcfg.h"

#define JOB_NAME_MAX 64
#define JOB_PATH_MAX 1024
#define JOB_LIST_MAX 2048 /* packed list of strings (common/cmdline.h's packing) */

struct job_spec {
    /* control plane */
    char name[JOB_NAME_MAX];
    int nodes;                 /* agents needed to form a generation */
    int max_restarts;          /* restarts before the job is failed */
    int heartbeat_interval_ms; /* agent -> daemon heartbeat period */
    int heartbeat_timeout_ms;  /* node lost after this much silence */
    int lease_ms;              /* agent fences its ranks after this */
    int stop_grace_ms;         /* SIGTERM -> SIGKILL grace for ranks */
    int progress_timeout_ms;   /* a running rank whose step stalls this long is hung; 0 = off; -1 = auto (daemon/hang.h) */
    int start_timeout_ms;      /* assigned ranks must all run within this; 0 = off */
    int rejoin_timeout_ms;     /* a lost member gets this long to come back */
    int min_nodes;             /* after rejoin_timeout the job may shrink to this many nodes; 0 = nodes */
    int spare_nodes;           /* agents beyond nodes kept as hot spares (daemon/rdv_spare.c) */
    char slow_policy[8];       /* "off", or "swap": a node named slow is replaced by a spare (rdv_spare.c) */
    int slow_swap_after_s;     /* swap: named slow this long first */
    int restart_backoff_ms;    /* wait before the 2nd restart in a row, doubling; 0 = no backoff */
    int restart_backoff_max_ms; /* longest wait; also what disk-full and OOM failures wait */
    int restart_window_s;      /* only restarts this recent count toward max_restarts; 0 = all */
    int python_hook;           /* Python ranks start with muster's start-up hook (1) or not (0) */
    int flight_recorder;       /* hooked Python ranks get TORCH_FR_BUFFER_SIZE=this (torch's flight recorder); 0 = off */
    char visible_devices[8];   /* a rank_cmd rank sees its node's job GPUs ("node") or its own ("own") */
    int warm_spares;           /* each agent keeps a warm Python process to become the next rank (1) or not (0) */
    char warm_imports[512];    /* warm_spares: more modules to import ahead, comma-separated */
    char rank_cmd[CMDLINE_MAX]; /* the program of every rank, packed (common/cmdline.h); unset = the agent's */

    /* what the program needs on every node (the agent's pre-flight, common/preflight.h) */
    char require_readable[JOB_LIST_MAX]; /* packed paths */
    char require_writable[JOB_LIST_MAX]; /* packed directories */
    int require_free_mb;                 /* free space each require_writable directory must have */
    char require_python[JOB_PATH_MAX];   /* interpreter; "" = the rank program's */
    char require_python_modules[JOB_LIST_MAX]; /* packed module names; unset = no import check */
    int require_python_timeout_s;        /* the import check's time bound */
    char checkpoint_latest[256];         /* "file:NAME" or "glob:PATTERN" in checkpoint_dir; "" = not compared */
    int checkpoint_diverged_ok;          /* 1: nodes may start with different latest checkpoints */

    /* a RAM checkpoint directory per node for a program's own saves (worker/agent/memckpt.h) */
    int memory_checkpoint_mb;             /* its size bound; 0 = no such directory */
    char memory_checkpoint_root[256];     /* the tmpfs it is made on (a muster-<job> directory there) */
    char memory_checkpoint_latest[256];   /* "glob:PATTERN" of tag directories, "file:NAME" naming one, or
                                           * "committed:PATTERN": complete by the ranks' checkpoint_committed() */
    int memory_checkpoint_keep;           /* complete checkpoints kept per node */
    int memory_checkpoint_replica_mbps;   /* pace of the copies sent to the buddy node; 0 = none */
    int memory_checkpoint_drain_steps;    /* a complete one copied to checkpoint_dir per this many steps; 0 = none */
    int memory_checkpoint_drain_keep;     /* drained checkpoints kept per node */

    /* training (muster-train) */
    char model[32];            /* preset: tiny, small, gpt2-124m */
    int n_layer, n_head, n_embd, context, vocab; /* override the preset's; 0 = the preset's */
    char data[JOB_PATH_MAX];   /* text file or llm.c token file */
    int steps;                 /* optimizer steps to run */
    int batch;                 /* global batch, sequences per step */
    int micro_batch;           /* sequences per micro-step per rank; 0 = batch/world */
    int seq_len;               /* tokens per sequence; 0 = model's T */
    double lr;                 /* peak learning rate */
    double lr_min;             /* floor of the cosine decay */
    int warmup_steps;
    double weight_decay;
    double grad_clip;          /* global grad-norm clip; 0 = off */
    double val_fraction;       /* tail of the data held out for validation */
    int eval_every;            /* validation every N steps; 0 = off */
    int eval_batches;          /* validation set: eval_batches x batch sequences */
    int64_t seed;
    char checkpoint_dir[JOB_PATH_MAX]; /* "" = no checkpoints */
    int checkpoint_every;      /* steps between checkpoints; 0 = off */
    int checkpoint_keep;       /* committed checkpoints kept; 0 = all */
    int replicate_every;       /* steps between in-memory peer replicas; 0 = off */

    /* what a rank_cmd program does, for its plan (common/plan_prog.h) */
    char parallelism[16];      /* muster-train, ddp, zero1..3, fsdp, fsdp-grad-op */
    char precision[8];         /* fp32, bf16, fp16 */
    int64_t params;            /* the program's parameters; 0 = from the model keys */
    int activation_checkpointing;
    int shape_given;           /* the spec names model or one of its dimensions (not a key) */
};

/* Fills *spec with every key's default (name and data stay empty). */
void job_spec_defaults(struct job_spec *spec);

/*
 * Validates obj against the table and fills *spec. origin names the source
 * in messages (a file path, "ASSIGN"). Returns 0 or -EINVAL with the reason
 * in err ("origin: key: expected ..., got ...").
 */
int job_spec_from_json(const json_t *obj, const char *origin,
                       struct job_spec *spec, char *err, size_t errlen);

/* Reads and validates a file. On success *raw (if not NULL) gets the object. */
int job_spec_load(const char *path, struct job_spec *spec, json_t **raw,
                  char *err, size_t errlen);

/* The model the spec describes: its preset with the dimension keys applied (checked). */
int job_spec_model(const struct job_spec *spec, struct gpt_config *cfg, char *err, size_t errlen);

/* 1 when name is a module name Python can import (dotted identifiers, ASCII,
 * no keyword): what require_python_modules and warm_imports hold, and what
 * the pre-flight (common/preflight.h) imports. */
int job_spec_module_valid(const char *name);

/* Writes the table as Markdown (docs/jobspec.md is generated from it). */
void job_spec_print_doc(FILE *out);

#endif
