/* A C MPI program for tests/system/openmpi/test_ompi_source.py, built with the mpicc of an Open MPI
 * compiled from source: MODE is "show" (print "rank R of N SUM LIBRARY" after an
 * allreduce, and "host R HOSTNAME") or "abort" (rank 1 calls MPI_Abort(7) while the
 * others wait in a barrier). */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, size, sum, len;
    char version[MPI_MAX_LIBRARY_VERSION_STRING], host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 1 && strcmp(argv[1], "abort") == 0) {
        if (rank == 1)
            MPI_Abort(MPI_COMM_WORLD, 7);
        MPI_Barrier(MPI_COMM_WORLD);
    } else {
        MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Get_library_version(version, &len);
        version[strcspn(version, "\n")] = '\0';
        gethostname(host, sizeof host);
        printf("rank %d of %d %d %s\nhost %d %s\n", rank, size, sum, version, rank, host);
    }
    MPI_Finalize();
    return 0;
}
