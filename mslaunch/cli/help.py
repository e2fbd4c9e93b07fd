"""``mslaunch --help``: both dialects, grouped by topic."""

TEXT = """\
usage: mslaunch [options] program [args...] [: [options] program2 [args...]]
       mslaunch --worker_num=N --local_worker_num=M [msrun options] script [args...]

A drop-in for mpirun (Open MPI 4/5 and MPICH Hydra spellings; one or two dashes)
and for MindSpore's msrun (its --flag=value options; see "msrun dialect" below).
Every option of Open MPI 4.1.4's `mpirun --help all` is implemented, accepted
with a note (-v shows it), or refused with a hint.

Size and hosts:
  -n, -np, -c N            number of ranks (0 or none: one per slot)
  -H, --host, -hosts LIST  hosts as h1:4,h2 (a bare host is one slot)
  --hostfile, --machinefile, -f FILE
                           'host slots=N [max_slots=M]' or 'host[:N]' lines
  --default-hostfile FILE  the hostfile used when no other host list is given
  -rf, --rankfile FILE     'rank N=HOST slot=SPEC' lines: host and cpus of each rank
  --app FILE               one MPMD context per line ('-n 2 prog args')
  -nolocal                 no ranks on this machine
  (no hosts: a Slurm or PBS allocation, else this machine, which runs what -n asks)

Placement and binding:
  --map-by POLICY[:PE=n][:OVERSUBSCRIBE]   slot (default), node, core, hwthread,
                           socket, numa, l1cache, l2cache, l3cache, board, ppr:N:OBJ
  --rank-by POLICY         slot, node, core, hwthread, socket, numa, ... (default: as mapped)
  --bind-to POLICY[:overload-allowed|:ordered]   none (default), hwthread, core,
                           l1cache, l2cache, l3cache, socket, numa, board, cpu-list
  -npernode, -N, -ppn N    N ranks per host     -npersocket N   N ranks per socket
  --ppr N:OBJ              N ranks per object   --cpus-per-proc N   N cpus per rank
  --use-hwthread-cpus      count hardware threads, not cores, as slots and cpus
  --cpu-set LIST           use only these cpus   --cpu-list LIST   bind to these cpus
  --oversubscribe, --nooversubscribe   allow / forbid more ranks than slots
  -bynode, -byslot, -bycore, --bind-to-core, --bind-to-socket   old spellings
  --report-bindings        print each rank's binding as Open MPI does
  --display-map, --display-allocation, --display-diffable-map, --display-topo
  --dry-run, --do-not-launch   print the plan (map, commands, logs), start nothing

Environment and working directory:
  -x NAME[=VAL]            export to the ranks of this context
  -genv NAME VAL, -env NAME VAL, -genvlist A,B, -genvnone, -genvall
  -mca, --mca KEY VAL      export OMPI_MCA_KEY=VAL; 'orte_abort_on_non_zero_status 0'
                           (or --prtemca state_base_error_non_zero_exit 0, or
                           --runtime-options error-nonzero-status=false) keeps going
  -tune FILE, -am FILE     options (-x, -mca) / MCA settings (key = value) from files
  -wdir, --wdir, -wd DIR   working directory of the ranks
  --set-cwd-to-session-dir each rank in a fresh directory of its own
  -path DIR[:DIR]          look for the program in these directories first
  --prefix DIR             put DIR/bin and DIR/lib first in PATH and LD_LIBRARY_PATH
  --index-argv-by-rank     argv[0] of each rank becomes NAME-RANK

Output:
  --output-filename DIR[:nocopy][:nojobid]
                           DIR/1/rank.N/stdout and stderr, also copied to the terminal
  --merge-stderr-to-stdout one stream per rank, merged at the source
  --tag-output             prefix lines with [1,RANK]<stdout>: (also in the files)
  --timestamp-output       prefix lines with the time (also in the files)
  --xml, --xml-file FILE   Open MPI's XML form of the output
  -l, -prepend-rank        prefix lines with [RANK] (Hydra)
  --no-pty                 rank stdout on a pipe, not a pseudo-terminal (as Hydra)
  --stdin all|none|RANK    who reads mslaunch's stdin (default rank 0)

Lifecycle:
  --timeout SECONDS        stop the job after SECONDS (also MPIEXEC_TIMEOUT); exit 110
  --report-state-on-timeout   on timeout, print the state of every rank
  --get-stack-traces       on timeout, print every rank's stacks first
  --grace SECONDS          SIGTERM-to-SIGKILL delay when stopping ranks (default 5)
  -disable-auto-cleanup    keep going when a rank fails (same as the mca setting above)
  --report-pid -|+|FILE    print mslaunch's pid to stdout, stderr or FILE
  --mpi pmi|openmpi|none   MPI support: serve PMI to MPICH-ABI ranks (default),
                           delegate to Open MPI's mpirun, or no MPI support
  -pmi-port                serve PMI over TCP (PMI_PORT/PMI_ID) instead of PMI_FD
  -usize SYSTEM|INFINITE|N MPI_UNIVERSE_SIZE over PMI: the job's slots, unknown
                           (the default, as Hydra's), or N
  --allow-run-as-root      accepted (mslaunch runs as root without it)

Remote hosts (over SSH; hosts that are this machine run without it):
  --ssh-config FILE        read FILE instead of ~/.ssh/config
  --ssh-user USER, --ssh-port N, --ssh-identity FILE
                           override what ~/.ssh/config says for every host
  --ssh-accept-new         add unknown host keys to ~/.ssh/known_hosts (as
                           StrictHostKeyChecking=accept-new); a changed key is refused
  --ssh-timeout SECONDS    connect timeout per host (default 10)
  --remote-python PATH, --launch-agent PATH
                           the Python that runs the agent on the remote hosts
                           (default: this Python's path if it exists there, else python3)
  -s, --preload-binary     copy the program to the remote hosts' working directories
  --preload-files A,B      copy these files there too

Other:
  --                       end of options: the next word is the program
  -q, --quiet              fewer messages    -v, --verbose   more messages
  -V, --version            print the version  -h, --help     this help

msrun dialect (MindSpore's msrun command lines; --name=value or --name value):
  --worker_num N           workers of the whole job (default 8)
  --local_worker_num N     workers on this node (default 8)
  --master_addr ADDR       the master node (default 127.0.0.1); it runs the scheduler
  --master_port N          the scheduler's port (default 8118)
  --node_rank N            this node's rank: its workers are N*local+i (default -1:
                           ranks in the order nodes join)
  --log_dir DIR            scheduler.log and worker_<rank>.log go here (default .)
  --join True|False        wait for the job (default False: return at once and
                           leave a supervisor, see --wait_job / --stop_job)
  --cluster_time_out S     seconds for every worker to join (default 600; <0: for ever)
  --bind_core True|False|MAP   pin workers to CPUs: equal blocks, or
                           '{"device0":["0-3"],"scheduler":["4"]}'
  --bind_numa True|False|MAP|FILE.json   pin workers to NUMA nodes' CPUs
  --sim_level N, --sim_rank_id N, --rank_table_file FILE
  --worker_log_name NAME   log name pattern ({ip}, {hostname} replaced)
  --tail_worker_log IDS    which workers' output --join=True shows (default all)
 mslaunch's own, in this dialect:
  --node_service_port N    the node service of a multi-node job (default master_port+1)
  --secret_file FILE       the job's secret (default: $MSLAUNCH_SECRET, else
                           ~/.mslaunch/secret, made on first use)
  --tls_config FILE        TLS for the node service (msrun's config.json fields)
  --max_restarts N         restarts per worker with MS_ENABLE_RECOVERY=1 (default 3)
  --grace SECONDS          SIGTERM-to-SIGKILL delay (default 5)
  --wait_job=DIR, --stop_job=DIR   wait for / stop the --join=False job of DIR
  --verbose, --quiet       more / fewer messages
"""
