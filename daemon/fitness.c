#include "daemon/fitness.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/plan_prog.h"

#define MiB (1024.0 * 1024.0)
#define GiB (1024.0 * 1024.0 * 1024.0)

int fitness_ready(const struct rdv_node *nd)
{
    return nd->state == RDV_NODE_JOINED && (nd->fitness == RDV_FIT_UNCHECKED || nd->fitness == RDV_FIT_OK) &&
           nd->plan_unfit[0] == '\0';
}

const char *fitness_name(const struct rdv_node *nd)
{
    if (nd->fitness == RDV_FIT_CHECKING)
        return "checking";
    return nd->fitness == RDV_FIT_UNFIT || nd->plan_unfit[0] ? "unfit" : "fit";
}

const char *fitness_reason(const struct rdv_node *nd)
{
    return nd->fitness == RDV_FIT_UNFIT ? nd->unfit_reason : nd->plan_unfit;
}

static int picked(const struct rdv_node *nd, int candidates)
{
    if (!candidates)
        return nd->member;
    return nd->state == RDV_NODE_JOINED && (nd->fitness == RDV_FIT_UNCHECKED || nd->fitness == RDV_FIT_OK);
}

/* Memory one device of the node has for its rank, bytes (CPU: the node's, shared); 0 = unknown. */
static uint64_t node_memory(const struct rdv_node *nd)
{
    uint64_t mb = nd->kind == PROTO_DEV_CPU ? nd->host_mem_mb : nd->gpu_total_mb ? nd->gpu_total_mb : nd->device_mem_mb;
    return mb > (UINT64_MAX >> 21) ? UINT64_MAX >> 1 : mb << 20; /* an agent's absurd figure saturates */
}

/* The plan applies to the node: muster-train ranks (or an agent that said nothing). */
static int planned(const struct rdv_node *nd)
{
    return nd->fitness == RDV_FIT_UNCHECKED || nd->fitness == RDV_FIT_CHECKING || nd->trainer;
}

/* The nodes picked, as a plan sees them. */
struct picked_set {
    uint32_t nodes, world;
    int plan_nodes, per_node; /* mixed device counts: planned rank by rank (the fit is checked node by node) */
    int gpu, cpu;             /* some node offers GPUs, CPUs */
    uint64_t mem;             /* the least memory of a device; UINT64_MAX: none known */
};

static struct picked_set pick(const struct rdv *r, int candidates)
{
    struct picked_set ps = {.mem = UINT64_MAX};
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (!picked(nd, candidates))
            continue;
        ps.nodes++;
        ps.world += nd->ndevices;
        ps.gpu |= nd->kind == PROTO_DEV_GPU;
        ps.cpu |= nd->kind != PROTO_DEV_GPU;
        uint64_t m = node_memory(nd);
        if (m < ps.mem)
            ps.mem = m;
    }
    if (ps.nodes) {
        ps.plan_nodes = ps.world % ps.nodes ? (int)ps.world : (int)ps.nodes;
        ps.per_node = ps.world % ps.nodes ? 1 : (int)(ps.world / ps.nodes);
    }
    return ps;
}

int fitness_plan(const struct rdv *r, int candidates, struct plan *p, char *why, size_t len)
{
    if (strcmp(r->spec->parallelism, "muster-train") != 0) {
        snprintf(why, len, "the job's program is %s, not muster-train", r->spec->parallelism);
        return -ENOTSUP;
    }
    if (r->spec->rank_cmd[0]) {
        snprintf(why, len, "the job runs its own rank program (rank_cmd): describe it with parallelism and params "
                 "(or the model keys) in the job spec to plan it (docs/plan.md)");
        return -ENOTSUP;
    }
    struct plan_input in;
    if (plan_input_from_spec(&in, r->spec, why, len))
        return -EINVAL;
    struct picked_set ps = pick(r, candidates);
    if (ps.nodes == 0) {
        snprintf(why, len, "no node has joined yet");
        return -ENOENT;
    }
    in.nodes = ps.plan_nodes;
    in.devices_per_node = ps.per_node;
    in.device = ps.gpu ? PLAN_GPU : PLAN_CPU;
    in.tflops = ps.gpu ? PLAN_DEFAULT_TFLOPS_GPU : PLAN_DEFAULT_TFLOPS_CPU;
    in.device_mem = ps.mem == UINT64_MAX ? 0 : ps.mem;
    return plan_compute(&in, p, why, len) ? -EINVAL : 0;
}

int fitness_check(struct rdv *r, int candidates)
{
    struct plan p;
    char why[PROTO_REASON_MAX];
    int rc = fitness_plan(r, candidates, &p, why, sizeof(why)), unfit = 0;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        struct rdv_node *nd = &r->nodes[i];
        if (!picked(nd, candidates))
            continue;
        nd->plan_unfit[0] = '\0';
        uint64_t mem = node_memory(nd);
        if (rc || !planned(nd) || !mem)
            continue;
        uint64_t need = nd->kind == PROTO_DEV_CPU ? p.peak * nd->ndevices : p.peak;
        if (need <= mem)
            continue;
        unfit++;
        char dev[PROTO_NAME_MAX + 32];
        if (nd->kind == PROTO_DEV_GPU)
            snprintf(dev, sizeof(dev), "gpu %s has %.2f GiB", nd->gpu_name[0] ? nd->gpu_name : "(unnamed)",
                     (double)mem / GiB);
        else
            snprintf(dev, sizeof(dev), "its %u cpu ranks share %.2f GiB of host memory", nd->ndevices,
                     (double)mem / GiB);
        snprintf(nd->plan_unfit, sizeof(nd->plan_unfit),
                 "the plan does not fit: a rank needs %.2f GiB (model state %.1f MiB, gathered units %.1f MiB, "
                 "activations %.1f MiB for micro_batch %d x seq_len %d) at world size %d, %s; use more nodes, a "
                 "smaller micro_batch or model (musterctl plan)",
                 (double)p.peak / GiB, (double)p.state / MiB, (double)p.transient / MiB, (double)p.acts / MiB,
                 p.micro_batch, p.seq_len, p.world, dev);
    }
    return unfit;
}

/* The plan of a rank_cmd program the spec describes (parallelism, params...),
 * on the picked nodes' GPUs, its compute time the job's median step. */
static json_t *program_plan_json(const struct rdv *r, char *why, size_t len)
{
    struct picked_set ps = pick(r, 0);
    if (ps.nodes == 0)
        ps = pick(r, 1);
    if (ps.nodes == 0) {
        snprintf(why, len, "no node has joined yet");
        return NULL;
    }
    struct plan_prog_input in;
    struct plan_prog p;
    if (plan_prog_input_from_spec(&in, r->spec, ps.plan_nodes, ps.per_node, why, len))
        return NULL;
    in.gpu_mem = ps.cpu || ps.mem == UINT64_MAX ? 0 : ps.mem; /* GPU memory, when every node has GPUs */
    const double step = hang_median_step_s(&r->steps);
    in.step_time = r->state == RDV_RUNNING && step > 0 && step <= 1e6 ? step : 0;
    if (plan_prog_compute(&in, &p, why, len))
        return NULL;
    json_t *doc = plan_prog_json(&p);
    json_object_set_new(doc, "step_time_measured", json_boolean(in.step_time > 0));
    return doc;
}

json_t *fitness_plan_json(const struct rdv *r)
{
    struct plan p;
    char why[PROTO_REASON_MAX];
    json_t *prog = NULL;
    int rc = fitness_plan(r, 0, &p, why, sizeof(why));
    if (rc == -ENOENT)
        rc = fitness_plan(r, 1, &p, why, sizeof(why));
    if (rc == -ENOTSUP && strcmp(r->spec->parallelism, "muster-train") != 0)
        rc = (prog = program_plan_json(r, why, sizeof(why))) ? 0 : -EINVAL;
    /* measured: the largest figure over the running ranks */
    double comm = -1;
    uint64_t sent = 0, peak = 0;
    for (uint32_t i = 0; i < r->world_size; i++) {
        const struct rdv_rank *rk = &r->ranks[i];
        if (rk->state != RDV_RANK_RUNNING)
            continue;
        if (rk->comm_frac > comm)
            comm = rk->comm_frac;
        sent = rk->step_bytes > sent ? rk->step_bytes : sent;
        peak = rk->peak_mem > peak ? rk->peak_mem : peak;
    }
    json_t *measured = json_pack("{s:o, s:o, s:o}", "comm_frac", comm >= 0 ? json_real(comm) : json_null(),
                                 "sent_per_step", sent ? json_integer((json_int_t)sent) : json_null(), "peak_mem",
                                 peak ? json_integer((json_int_t)peak) : json_null());
    return json_pack("{s:o, s:o, s:o}", "plan", rc ? json_null() : prog ? prog : plan_json(&p, r->spec->model),
                     "plan_note",
                     rc ? json_string(why) : json_null(), "measured", measured);
}
