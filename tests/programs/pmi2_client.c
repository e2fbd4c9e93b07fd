/* A PMI-2 client for tests: the PMI-2 calls MPICH's MPI layer makes
 * (init, job id, job attributes, fence, finalize), built against Slurm's
 * libpmi2, a real third-party implementation of the PMI-2 wire.
 *   argv[1]: "abort"     the last rank calls PMI2_Abort after init
 *            "nodeattr"  also Info_PutNodeAttr / GetNodeAttr(wait)
 *            "multinode" a business-card style put / fence / get exchange
 *            "spawn"     rank 0 spawns two copies of this program ("child"),
 *                        with one pair put into their key-value space
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "pmi2.h"

#define CHK(x) do { int _rc = (x); if (_rc != PMI2_SUCCESS) { \
    fprintf(stderr, "[%d] %s failed rc=%d\n", rank, #x, _rc); exit(3); } } while (0)

static int rank = -1;

static void barrier(const char *jobid)
{
    int out_len;
    char v[8];
    CHK(PMI2_KVS_Fence());
    /* MPICH: "Get a non-existent key, it only returns after every process called fence" */
    PMI2_KVS_Get(jobid, PMI2_ID_NULL, "-NONEXIST-KEY", v, 0, &out_len);
}

int main(int argc, char **argv)
{
    int spawned = -1, size = -1, appnum = -1, found = 0, out_len;
    char jobid[1024], val[1024], key[64];
    const char *mode = argc > 1 ? argv[1] : "";

    CHK(PMI2_Init(&spawned, &size, &rank, &appnum));
    CHK(PMI2_Job_GetId(jobid, sizeof(jobid)));
    if (size > 1) {
        CHK(PMI2_Info_GetJobAttr("PMI_process_mapping", val, sizeof(val), &found));
        printf("[%d] PMI_process_mapping found=%d %s\n", rank, found, found ? val : "");
    }
    CHK(PMI2_Info_GetJobAttr("PMI_hwloc_xmlfile", val, sizeof(val), &found));
    CHK(PMI2_Info_GetJobAttr("PMI_mpi_memory_alloc_kinds", val, sizeof(val), &found));

    if (!strcmp(mode, "abort") && rank == size - 1)
        PMI2_Abort(1, "test abort");

    if (!strcmp(mode, "nodeattr")) {
        /* MPIR_pmi_bcast(DOMAIN_LOCAL): root puts node attr, others get with wait=TRUE */
        if (rank == 0) {
            CHK(PMI2_Info_PutNodeAttr("-bcast-1-0", "2F6465762F73686D"));
        } else {
            CHK(PMI2_Info_GetNodeAttr("-bcast-1-0", val, sizeof(val), &found, 1));
            printf("[%d] nodeattr found=%d %s\n", rank, found, val);
        }
    }
    if (!strcmp(mode, "multinode")) {
        snprintf(key, sizeof key, "-allgather-1-%d", rank);
        snprintf(val, sizeof val, "ADDR%d", rank);
        CHK(PMI2_KVS_Put(key, val));
        barrier(jobid);
        for (int r = 0; r < size; r++) {
            snprintf(key, sizeof key, "-allgather-1-%d", r);
            CHK(PMI2_KVS_Get(jobid, r, key, val, sizeof(val), &out_len));
            printf("[%d] got %s=%s (len %d)\n", rank, key, val, out_len);
        }
    }
    if (!strcmp(mode, "spawn") && rank == 0) {
        const char *cmds[1] = { argv[0] };
        int argcs[1] = { 2 };
        const char *child_args[3] = { "child", "with space", NULL };
        const char **argvs[1] = { child_args };
        int maxprocs[1] = { 2 };
        int info_sizes[1] = { 0 };
        const struct MPID_Info *infos[1] = { NULL };
        struct MPID_Info pre = { 0, 0, 0, NULL, "PARENT_KEY", "from-the-parent" };
        const struct MPID_Info *preput[1] = { &pre };
        char child_job[256];
        int errors[2];
        CHK(PMI2_Job_Spawn(1, cmds, argcs, argvs, maxprocs, info_sizes, infos, 1, preput,
                           child_job, sizeof child_job, errors));
        printf("[%d] spawned job %s\n", rank, child_job);
    }
    if (!strcmp(mode, "child")) {
        CHK(PMI2_KVS_Get(jobid, PMI2_ID_NULL, "PARENT_KEY", val, sizeof(val), &out_len));
        printf("[%d] child of %d spawned=%d args=%s|%s key=%s\n", rank, size, spawned,
               argv[1], argc > 2 ? argv[2] : "", val);
    }
    CHK(PMI2_Info_GetJobAttr("universeSize", val, sizeof(val), &found));
    printf("[%d/%d] spawned=%d appnum=%d jobid=%s universeSize=%s\n", rank, size, spawned,
           appnum, jobid, found ? val : "(none)");
    fflush(stdout);
    barrier(jobid);                      /* MPI_Finalize's PMI barrier */
    CHK(PMI2_Finalize());
    return 0;
}
