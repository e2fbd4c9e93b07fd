"""Run a command where ptrace and process_vm_readv are refused (EPERM), as under
a container's seccomp profile without CAP_SYS_PTRACE: python no_ptrace.py CMD...

x86_64 only (the filter checks the architecture and lets others through)."""
import ctypes
import os
import struct
import sys

PTRACE, PROCESS_VM_READV, AUDIT_ARCH_X86_64 = 101, 310, 0xC000003E
LD_W_ABS, JEQ_K, RET_K = 0x20, 0x15, 0x06
program = [
    (LD_W_ABS, 0, 0, 4),                  # the architecture
    (JEQ_K, 0, 4, AUDIT_ARCH_X86_64),
    (LD_W_ABS, 0, 0, 0),                  # the system call's number
    (JEQ_K, 1, 0, PTRACE),
    (JEQ_K, 0, 1, PROCESS_VM_READV),
    (RET_K, 0, 0, 0x00050000 | 1),        # SECCOMP_RET_ERRNO | EPERM
    (RET_K, 0, 0, 0x7FFF0000),            # SECCOMP_RET_ALLOW
]
code = b"".join(struct.pack("HBBI", *ins) for ins in program)
buf = ctypes.create_string_buffer(code)


class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


prog = Prog(len(program), ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, 1, 0, 0, 0) != 0 or \
        libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:   # NO_NEW_PRIVS, SECCOMP filter
    sys.exit(f"no_ptrace: cannot install the filter: {os.strerror(ctypes.get_errno())}")
os.execvp(sys.argv[1], sys.argv[1:])
