"""Agents started by an rsh agent on the SSH test bed: the OpenSSH client with an
ssh_config away from HOME, and a stand-in for the MPI Operator's ``kubexec.sh``."""

from __future__ import annotations

import os


def hide_ssh_config(home: str) -> str:
    """Move HOME ``home``'s ssh_config beside it (paramiko, which reads
    ``$HOME/.ssh/config``, cannot reach the hosts then; ``ssh -F CFG`` can); return CFG."""
    cfg = cfg_of(home)
    os.rename(os.path.join(home, ".ssh", "config"), cfg)
    return cfg


def cfg_of(home: str) -> str:
    """The ssh_config beside HOME ``home`` (where the ``rsh_home`` fixture puts it)."""
    return os.path.join(os.path.dirname(home), "ssh_config")


def kubexec(bed, directory) -> str:
    """A ``kubexec.sh`` whose ``kubectl exec POD`` enters host POD's namespaces."""
    bed.require_netns("the kubexec stand-in")
    cases = "".join(f"  {h.name}) pid={h.pid};;\n" for h in bed.hosts)
    path = os.path.join(str(directory), "kubexec.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# kubectl exec $POD -- /bin/sh -c \"$*\" (no -i)\n"
                "pod=$1; shift\ncase $pod in\n" + cases +
                "  *) echo \"Error from server (NotFound): pods \\\"$pod\\\" not found\" >&2;"
                " exit 1;;\nesac\n"
                # The remote side outlives a dropped kubectl exec, as in Kubernetes.
                # Neither the environment nor stdin reaches the pod.
                "env -i PATH=\"$PATH\" nsenter -t $pid -n -u -m -- /bin/sh -c \"$*\" "
                "</dev/null &\nwait $!\n")
    os.chmod(path, 0o755)
    return path
