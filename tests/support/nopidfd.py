"""Run a command where ``pidfd_open`` fails, as on a kernel before 5.3 (ENOSYS)
or in a container whose system-call filter predates the call (EPERM):
``python nopidfd.py ERRNO PROGRAM [ARGS...]``.

A seccomp filter, inherited by every process the command starts, answers
``pidfd_open`` with ``ERRNO`` and lets every other call through; the
command is then exec'd.  ``PR_SET_NO_NEW_PRIVS`` comes with it (the kernel
asks for it before an unprivileged filter), so setuid programs the command
runs do not gain privileges.  Only the architectures whose call number is
the generic 434 (x86-64, arm64) are known here: on another, this exits with
status 3 rather than run the command unfiltered.
"""

import ctypes
import os
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
PIDFD_OPEN = 434
# classic BPF: load the word at offset k, jump if equal to k, return k
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def install(errno: int) -> None:
    """The filter, on this process and every process it starts from now on."""
    if platform.machine() not in ("x86_64", "aarch64"):
        sys.stderr.write(f"nopidfd: pidfd_open's number on {platform.machine()} "
                         f"is not known here\n")
        sys.exit(3)
    program = [(BPF_LD_W_ABS, 0, 0, 0),               # seccomp_data.nr
               (BPF_JEQ_K, 0, 1, PIDFD_OPEN),
               (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno),
               (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)]
    code = b"".join(struct.pack("=HBBI", *insn) for insn in program)
    prog = _Prog(len(program), code)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p,
                           ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0 or \
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        sys.stderr.write(f"nopidfd: cannot install the filter: {os.strerror(err)}\n")
        sys.exit(3)


if __name__ == "__main__":
    install(int(sys.argv[1]))
    os.execvp(sys.argv[2], sys.argv[2:])
