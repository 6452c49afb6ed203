/* mpi_check: a plain MPI program for railrun's MPI tests (tests/tests/mpich.rs), compiled there
 * with mpicc.mpich (MPICH: runs under railrun through its PMI-1 server) or Open MPI's mpicc
 * (refused by railrun before the start).
 *
 *   mpi_check check N   every rank prints "rank R size S host H pmi_rank P allreduce N ok"
 *                       after an MPI_Allreduce of N doubles checked element by element
 *                       (integer-valued, exact), or "... WRONG ..." and exits 1
 *   mpi_check abort C   rank 1 calls MPI_Abort(MPI_COMM_WORLD, C); the others wait 60 s
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double value(int rank, long i) { return (double)((rank * 7 + i) % 1000); }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc > 1 ? argv[1] : "check";
    if (strcmp(mode, "abort") == 0) {
        int code = argc > 2 ? atoi(argv[2]) : 3;
        if (rank == 1) MPI_Abort(MPI_COMM_WORLD, code);
        sleep(60);
        MPI_Finalize();
        return 0;
    }
    long n = argc > 2 ? atol(argv[2]) : 1000;
    if (n < 1) n = 1;
    double *in = malloc(n * sizeof(double)), *out = malloc(n * sizeof(double));
    if (!in || !out) MPI_Abort(MPI_COMM_WORLD, 2);
    for (long i = 0; i < n; i++) in[i] = value(rank, i);
    MPI_Allreduce(in, out, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    const char *pmi = getenv("PMI_RANK");
    for (long i = 0; i < n; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += value(r, i);
        if (out[i] != want) {
            printf("rank %d size %d host %s pmi_rank %s allreduce %ld WRONG at %ld: got %.1f want %.1f\n",
                   rank, size, host, pmi ? pmi : "-", n, i, out[i], want);
            fflush(stdout);
            MPI_Finalize();
            return 1;
        }
    }
    printf("rank %d size %d host %s pmi_rank %s allreduce %ld ok\n", rank, size, host,
           pmi ? pmi : "-", n);
    fflush(stdout);
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
