/* Preloaded into an intruder (tests/programs/pmix_intruder.py): every uid it
 * asks of the kernel is root's, so a PMIx client claims to be root. */
#include <sys/types.h>
uid_t geteuid(void) { return 0; }
uid_t getuid(void) { return 0; }
gid_t getegid(void) { return 0; }
gid_t getgid(void) { return 0; }
