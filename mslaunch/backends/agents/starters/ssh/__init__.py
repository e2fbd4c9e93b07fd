"""Agents started over SSH with paramiko: the starter, the connections, the
user's OpenSSH files, and the helper processes that take the handshakes off
the launcher at many hosts."""
