"""Another user of a host crowding a job's listeners (tests/system/remote/test_shared_node.py).

``crowd.py SECONDS COUNT ADDRESS...``: opens COUNT connections to each ADDRESS
(``HOST:PORT`` over TCP, or the path of a Unix socket), all at once and
non-blocking, says ``holding``, sends a line of junk on every tenth once it
is connected, and holds them all.  Once a line comes on stdin and SECONDS
have passed, it takes in what is still on its way (until nothing has come
for half a second) and prints one JSON object: per address, how many
connections were tried, how many it saw completed (with SYN cookies, a
connection the listener's full queue never took also looks completed), and
how many the far end closed again (or refused); it goes on holding them
until stdin ends.  Run as another user, with a descriptor limit of its own
above COUNT times the addresses.
"""

import json
import os
import select
import socket
import sys
import time

JUNK = b"\x00\xffjunk from another user\r\n" * 4


def main() -> None:
    seconds, count = float(sys.argv[1]), int(sys.argv[2])
    addresses = sys.argv[3:]
    socks = {}          # fd -> (socket, address, index)
    tally = {a: {"tried": 0, "completed": 0, "closed": 0} for a in addresses}
    waiting = select.poll()
    for address in addresses:
        for i in range(count):
            if address.startswith("/"):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                target = address
            else:
                host, _, port = address.rpartition(":")
                s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
                target = (host.strip("[]"), int(port))
            s.setblocking(False)
            tally[address]["tried"] += 1
            err = s.connect_ex(target)
            if err not in (0, 115):             # EINPROGRESS
                tally[address]["closed"] += 1
                s.close()
                continue
            socks[s.fileno()] = (s, address, i)
            waiting.register(s.fileno(), select.POLLOUT)
    connected = set()
    end = time.monotonic() + seconds
    waiting.register(0, select.POLLIN)
    asked = False
    quiet_since = time.monotonic()
    print("holding", flush=True)
    while not (asked and time.monotonic() >= end and time.monotonic() - quiet_since >= 0.5):
        events = waiting.poll(100)
        if any(fd != 0 for fd, _ in events):
            quiet_since = time.monotonic()
        for fd, _events in events:
            if fd == 0:
                asked = True
                waiting.unregister(0)
                continue
            s, address, i = socks[fd]
            if fd not in connected:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    tally[address]["closed"] += 1
                    waiting.unregister(fd)
                    continue
                connected.add(fd)
                tally[address]["completed"] += 1
                if i % 10 == 0:
                    try:
                        s.send(JUNK)
                    except OSError:
                        pass
                waiting.modify(fd, select.POLLIN)
                continue
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:
                tally[address]["closed"] += 1
                waiting.unregister(fd)
    print(json.dumps(tally))
    sys.stdout.flush()
    sys.stdin.buffer.read()         # still holding, until stdin ends
    os._exit(0)


if __name__ == "__main__":
    main()
